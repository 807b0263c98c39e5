"""Shards built on threads ahead of the one being written (gnnc.plan.shards.BUILD_AHEAD, issue 34) are the same
files, written in rank order, as built one after another."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import EXAMPLES
from gnnc import api
from gnnc.graph.loaders import load_graph
from gnnc.plan import shards


@pytest.mark.parametrize("strategy", ["depcache", "hybrid"])
def test_built_ahead_equals_one_by_one(strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = load_graph("rmat:n=2000,deg=8,features=8,classes=4,seed=2")
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy=strategy)
    files = {}
    real = shards.rank_arrays
    for ahead in (0, 1, 3):
        monkeypatch.setattr(shards, "BUILD_AHEAD", ahead)
        order: list[int] = []
        monkeypatch.setattr(shards, "rank_arrays", lambda g, p, rank, *a, **k: order.append(rank) or real(g, p, rank, *a, **k))
        out = tmp_path / f"ahead{ahead}"
        dataclasses.replace(plan).save(out)
        assert sorted(order) == [0, 1, 2, 3]
        files[ahead] = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}
    assert files[1] == files[0] and files[3] == files[0]
