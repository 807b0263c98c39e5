"""Every code block in docs/ runs: python blocks execute (sharing state within a page),
sh blocks run in bash and must exit as stated (`exit=N`, default 0), gnn blocks must
type-check (and are written to `file=NAME` when given). Each page runs in a fresh
directory where `examples/` is the repository's.

A long page may be cut into parts that run as tests of their own (pytest-xdist spreads them over its
workers): a `## N.` section whose heading is followed by the line
`<!-- docs test: apart, after sections 1, 4 -->` starts a part, which first runs the blocks of the sections
it names (what it reads from them: files, python names) and then its own; the sections below it without
such a line belong to it. Every block is a part's own block exactly once."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
SECTION = re.compile(r"^## (\d+)\.", re.M)
APART = re.compile(r"^<!-- docs test: apart, after sections? ([\d, ]+) -->$")

Block = tuple[str, dict[str, str], str, int]  # language, options, code, line


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        opts = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
        out.append((m.group(1), opts, m.group(3), text[: m.start()].count("\n") + 1))
    return out


@dataclass(frozen=True)
class Part:
    page: Path
    id: str
    setup: list[Block]  # the blocks of the earlier sections the part reads from, run first
    own: list[Block]


def parts(page: Path) -> list[Part]:
    """The page cut at its `apart` sections (the whole page as one part where it has none)."""
    text = page.read_text()
    lines = text.splitlines()
    starts = {int(m.group(1)): text[: m.start()].count("\n") + 1 for m in SECTION.finditer(text)}
    found = blocks(page)

    def section_of(line: int) -> int:
        return max((n for n, at in starts.items() if at <= line), default=0)

    cuts: dict[int, list[int]] = {}  # section -> the sections its part runs first
    for i, line in enumerate(lines):
        if line.startswith("<!-- docs test"):
            m, heading = APART.match(line), SECTION.match(lines[i - 1]) if i else None
            assert m and heading, f"{page.name}:{i + 1}: not `<!-- docs test: apart, after sections N, M -->` " \
                                  f"on the line below a `## N.` heading"
            n, after = int(heading.group(1)), [int(s) for s in m.group(1).replace(",", " ").split()]
            assert all(a < n and a in starts for a in after), f"{page.name}:{i + 1}: after {after} is not above"
            cuts[n] = after
    if not cuts:
        return [Part(page, page.stem, [], found)]
    first = section_of(found[0][3])
    out: dict[int, Part] = {}
    for block in found:
        cut = max((c for c in cuts if c <= section_of(block[3])), default=first)
        if cut not in out:
            setup = [b for b in found if section_of(b[3]) in cuts.get(cut, [])]
            out[cut] = Part(page, f"{page.stem}-{cut}", setup, [])
        out[cut].own.append(block)
    return list(out.values())


PARTS = [part for page in DOCS for part in parts(page)]


def test_docs_exist() -> None:
    assert {p.name for p in DOCS} >= {"tutorial.md", "language.md", "ir.md", "passes.md"}


def test_every_block_is_one_parts_own() -> None:
    """Cutting a page into parts checks the same blocks: each block is exactly one part's own, in page order."""
    for page in DOCS:
        own = [b for part in PARTS if part.page == page for b in part.own]
        assert [b[3] for b in own] == [b[3] for b in blocks(page)], page.name
    assert len([p for p in PARTS if p.id.startswith("tutorial-")]) > 1  # the tutorial is cut (its markers parse)


def test_a_part_runs_the_sections_it_names_first(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("## 1. a\n```sh\ntrue 1\n```\n## 2. b\n```sh\ntrue 2\n```\n## 3. c\n"
                    "<!-- docs test: apart, after sections 1 -->\n```sh\ntrue 3\n```\n## 4. d\n```sh\ntrue 4\n```\n")
    first, second = parts(page)
    assert (first.id, [b[2] for b in first.setup], [b[2] for b in first.own]) == ("p-1", [], ["true 1\n", "true 2\n"])
    assert (second.id, [b[2] for b in second.setup], [b[2] for b in second.own]) == \
        ("p-3", ["true 1\n"], ["true 3\n", "true 4\n"])
    page.write_text("## 1. a\n```sh\ntrue\n```\n## 2. b\n<!-- docs test: apart, after section 3 -->\n")
    with pytest.raises(AssertionError, match="is not above"):
        parts(page)
    page.write_text("## 1. a\n```sh\ntrue\n```\n## 2. b\n\n<!-- docs test: apart, after section 1 -->\n")
    with pytest.raises(AssertionError, match="below a `## N.` heading"):  # a marker that cuts nothing is refused
        parts(page)


def run_block(block: Block, page: str, namespace: dict, env: dict[str, str]) -> None:
    from gnnc import api
    from gnnc.passes.manager import run_pipeline

    lang, opts, code, line = block
    where = f"{page}:{line}"
    if lang == "python":
        exec(compile(code, where, "exec"), namespace)
    elif lang == "sh":
        r = subprocess.run(["bash", "-o", "pipefail", "-c", code], capture_output=True, text=True, env=env,
                           timeout=600)
        want = int(opts.get("exit", 0))
        assert r.returncode == want, f"{where}: exit {r.returncode} (want {want})\n{r.stdout}\n{r.stderr}"
        if want == 2:
            assert "Traceback" not in r.stderr and re.search(r":\d+:\d+: ", r.stderr), r.stderr
    elif lang == "gnn":
        if "file" in opts:
            Path(opts["file"]).write_text(code)
        run_pipeline(api.load_model_source(code, where).program(), ["infer-shapes", "check"])
    else:
        raise AssertionError(f"{where}: unknown block language {lang!r}")


@pytest.mark.parametrize("part", PARTS, ids=[p.id for p in PARTS])
def test_every_block_runs(part: Part, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    namespace: dict = {"__name__": f"docs_{part.page.stem}"}
    assert part.own, f"{part.page.name} has no code blocks"
    for block in [*part.setup, *part.own]:
        run_block(block, part.page.name, namespace, env)
