"""Golden IR of the distributed passes: assign-strategy, insert-comm and predict-bytes, as text.

Each case compiles an example for Cora on several workers with given
strategies and compares the IR printed after each of the three passes with
`tests/golden/<case>.<pass>.ir`. Together the cases cover every strategy,
P3's first layer, a segment entered after the first layer (its `fetch`) and
a mixed assignment. Regenerate after an intended change with
`GNNC_UPDATE_GOLDEN=1 pytest tests/test_golden_distributed_ir.py` and review the diff.
"""
from __future__ import annotations

import pytest

from conftest import EXAMPLES, check_golden

import gnnc

PASSES = ("assign-strategy", "insert-comm", "predict-bytes")
# case name -> (example, workers, strategies, overrides)
CASES = {
    "gcn-depcomm": ("gcn", 2, "depcomm", {}),
    "gcn-pushpull": ("gcn", 2, "pushpull,depcomm", {}),
    "gcn-late-depcache": ("gcn", 4, "depcomm,depcache", {}),
    "sage-bcast1d": ("sage", 2, "bcast1d", {}),
    "gin-depcache": ("gin", 2, "depcache", {}),
    "gat-hybrid": ("gat", 2, "hybrid", {}),
    "gcnii-mixed": ("gcnii", 2, "hybrid,hybrid,bcast1d", {"layers": 3}),
}


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


def stages(case: str, graph) -> dict[str, str]:
    name, workers, strategy, overrides = CASES[case]
    # a path relative to the repository, so the printed `source` line is the same on every machine
    model = gnnc.load_model_source((EXAMPLES / f"{name}.gnn").read_text(), f"examples/{name}.gnn", **overrides)
    out: dict[str, str] = {}
    gnnc.compile(model, graph, workers=workers, strategy=strategy,
                 after=lambda n, p: out.__setitem__(n, str(p)) if n in PASSES else None)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, cora) -> None:
    got = stages(case, cora)
    assert set(got) == set(PASSES)
    check_golden(got, case)
