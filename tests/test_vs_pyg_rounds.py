"""benchmarks/vs_pyg.py --rounds: each system's runs become one row of medians, and a failed run is reported."""
from __future__ import annotations

import importlib
import sys

from conftest import ROOT


def _vs_pyg(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # vs_pyg imports its neighbour floor.py
    sys.modules.pop("vs_pyg", None)
    return importlib.import_module("vs_pyg")


def test_rounds_take_the_median_of_each_figure(monkeypatch) -> None:
    vs_pyg = _vs_pyg(monkeypatch)
    runs = [{"system": "gnnc", "epoch_s": t, "peak_bytes": m, "epoch_bytes": e}
            for t, m, e in ((0.5, 100, 10), (0.9, 300, 30), (0.6, 200, 20))]
    row = vs_pyg._median_row(runs)
    assert (row["epoch_s"], row["peak_bytes"], row["epoch_bytes"]) == (0.6, 200, 20)
    assert row["runs"] == [0.5, 0.9, 0.6] and row["system"] == "gnnc"


def test_a_failed_round_is_the_row(monkeypatch) -> None:
    vs_pyg = _vs_pyg(monkeypatch)
    row = vs_pyg._median_row([{"epoch_s": 0.5}, {"error": "out of memory"}, {"epoch_s": 0.7}])
    assert row == {"error": "out of memory"}
