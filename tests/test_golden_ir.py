"""Golden IR: the printed IR of every example after each pass, compared as text.

Regenerate after an intended change with `GNNC_UPDATE_GOLDEN=1 pytest tests/test_golden_ir.py`
and review the diff.
"""
from __future__ import annotations

import pytest

from conftest import EXAMPLES, check_golden
from gnnc import api
from gnnc.frontend.elaborate import elaborate
from gnnc.ir import verify
from gnnc.passes.manager import run_pipeline

CORA = {"features": 1433, "classes": 7}
PASSES = ["infer-shapes", "check", "lower", "reorder-gemm", "sink-bias"]
EXAMPLE_NAMES = ["gcn", "sage", "gin", "gat", "gcnii"]


def stages(name: str) -> dict[str, str]:
    # a path relative to the repository, so the printed `source` line is the same on every machine
    model = api.load_model_source((EXAMPLES / f"{name}.gnn").read_text(), f"examples/{name}.gnn")
    program = elaborate(model.module, {}, CORA)
    out = {"elaborate": str(program)}
    run_pipeline(program, PASSES, verify_each=True, after=lambda n, p: out.__setitem__(n, str(p)))
    return out


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_golden(name: str) -> None:
    got = stages(name)
    check_golden(got, name)


def test_printer_is_deterministic() -> None:
    assert stages("gat") == stages("gat")


def test_passes_verify_typed() -> None:
    model = api.load_model(EXAMPLES / "gcn.gnn")
    program = run_pipeline(elaborate(model.module, {}, CORA), PASSES)
    verify(program, typed=True)
