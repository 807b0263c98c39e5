"""Every code block in docs/ runs: python blocks execute (sharing state within a page),
sh blocks run in bash and must exit as stated (`exit=N`, default 0), gnn blocks must
type-check (and are written to `file=NAME` when given). Each page runs in a fresh
directory where `examples/` is the repository's."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, dict[str, str], str, int]]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        opts = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
        out.append((m.group(1), opts, m.group(3), text[: m.start()].count("\n") + 1))
    return out


def test_docs_exist() -> None:
    assert {p.name for p in DOCS} >= {"tutorial.md", "language.md", "ir.md", "passes.md"}


@pytest.mark.parametrize("page", DOCS, ids=[p.stem for p in DOCS])
def test_every_block_runs(page: Path, tmp_path: Path, monkeypatch) -> None:
    from gnnc import api
    from gnnc.passes.manager import run_pipeline

    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    found = blocks(page)
    assert found, f"{page.name} has no code blocks"
    for lang, opts, code, line in found:
        where = f"{page.name}:{line}"
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
