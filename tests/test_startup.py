"""Start-up cost of the command line: a command imports only what it uses.

`gnnc check` parses and type-checks a .gnn file, which needs the front end
and sympy (the IR's dims) but neither torch, scipy nor networkx, nor the
planner; `gnnc --help` needs nothing beyond argparse and the registries it
lists. Loading torch alone takes a second or more, so these tests pin the
modules each command leaves unloaded (a wall-time bound would be
load-sensitive; the modules are not). The time itself is measured in the
issue's closing note.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT

HEAVY = ("torch", "scipy", "networkx", "numpy", "gnnc.passes.planner.search", "gnnc.runtime", "gnnc.api")


def loaded_after(argv: list[str]) -> tuple[int, list[str], str]:
    """Run `gnnc ARGV` in a fresh interpreter; its exit code, which HEAVY modules it loaded, and its stdout."""
    code = (
        "import json, sys\n"
        "from gnnc.cli import main\n"
        "try:\n"
        f"    rc = main({argv!r})\n"
        "except SystemExit as stop:\n"
        "    rc = stop.code or 0\n"
        f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    *out, last = r.stdout.strip().splitlines()
    rc, heavy = json.loads(last)
    return rc, heavy, "\n".join(out)


def test_check_loads_neither_torch_nor_the_planner() -> None:
    rc, heavy, out = loaded_after(["check", str(EXAMPLES / "gcn.gnn")])
    assert rc == 0 and out.endswith("gcn.gnn: ok")
    assert heavy == [], f"gnnc check imported {heavy}"


def test_check_of_a_bad_model_is_as_light(tmp_path) -> None:
    bad = tmp_path / "bad.gnn"
    bad.write_text((EXAMPLES / "gcn.gnn").read_text().replace("relu(h)", "relu(hh)"))
    rc, heavy, _ = loaded_after(["check", str(bad)])
    assert rc == 2 and heavy == []


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--help"], ["run", "--help"], ["partition", "--help"]])
def test_help_loads_nothing_heavy(argv: list[str]) -> None:
    rc, heavy, out = loaded_after(argv)
    assert rc == 0 and "usage: gnnc" in out
    assert heavy == [] and "sympy" not in heavy


def test_help_does_not_even_load_sympy() -> None:
    code = ("import sys\nfrom gnnc.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in ('sympy', 'lark', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
