"""Shard writing takes the row sets compile's predict-bytes built, and writes what building them again writes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import EXAMPLES
from gnnc import api
from gnnc.graph.loaders import load_graph
from gnnc.plan import shards


@pytest.mark.parametrize("strategy", ["depcomm", "hybrid", "bcast1d,depcomm"])
def test_shards_reuse_compiles_row_sets(strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, workers=2, strategy=strategy)
    assert plan.row_sets is not None
    built = []
    real = shards.all_row_sets
    monkeypatch.setattr(shards, "all_row_sets", lambda *a, **k: built.append(1) or real(*a, **k))
    plan.write_shards(tmp_path / "reused")
    assert not built  # compile's sets were taken
    dataclasses.replace(plan, row_sets=None).write_shards(tmp_path / "built")
    assert built == [1]
    for rank in range(2):
        name = f"rank-{rank:05d}.npz"
        assert (tmp_path / "reused" / name).read_bytes() == (tmp_path / "built" / name).read_bytes(), name
