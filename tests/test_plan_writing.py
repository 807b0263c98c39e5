"""Plan writing (issue 36): each rank's layer structures built once per distinct row set, gathered from the
graph's CSR, and equal to what sorting each layer's in-edges builds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_graph
from gnnc.graph import CSR
from gnnc.plan import rows
from gnnc.plan.rows import LayerSpec, all_row_sets, build_local_graph


def _specs(strategy: str, layers: int, view: str = "self_loops") -> list[LayerSpec]:
    nested = strategy in ("depcache", "hybrid")
    return [LayerSpec(f"l{k}", view, strategy, 0 if nested else k) for k in range(layers)]


def _sorted_view(graph, parts, rank, world, spec_list, sets, lyr):
    """Layer `lyr`'s local CSR as a stable sort of its in-edges by local row builds it (the reference)."""
    mine = sets[rank]
    s = spec_list[lyr]
    order = mine.orders[s.segment if s.strategy in ("depcache", "hybrid") else -1]
    pos = np.full(graph.num_nodes, -1, dtype=np.int64)
    pos[order] = np.arange(len(order))
    src, dst = graph.edges(s.view)
    sel = np.nonzero(mine.held_out[lyr][dst])[0]
    if s.strategy == "bcast1d":
        col = np.empty(graph.num_nodes, dtype=np.int64)
        col[np.argsort(parts, kind="stable")] = np.arange(graph.num_nodes)
    else:
        col = np.where(mine.held_in[lyr], pos, -1)
        h = mine.halos[lyr]
        if h is not None:
            col[h] = int(np.count_nonzero(mine.held_in[lyr])) + np.arange(len(h))
    csr = CSR.from_edges(col[src[sel]], pos[dst[sel]], int(np.count_nonzero(mine.held_out[lyr])))
    return csr, torch.as_tensor(sel, dtype=torch.int64)[csr.eids]


@pytest.mark.parametrize("strategy", ["depcomm", "depcache", "hybrid", "bcast1d"])
def test_gathered_structure_equals_sorted_in_edges(strategy: str) -> None:
    g = random_graph(60, 300, seed=4)
    world = 3
    parts = np.random.default_rng(1).integers(0, world, g.num_nodes)
    spec_list = _specs(strategy, 3)
    cached = {k: [np.arange(r, g.num_nodes, 7) for r in range(world)] for k in range(3)} \
        if strategy == "hybrid" else None
    sets = all_row_sets(g, parts, world, spec_list, cached)
    for rank in range(world):
        lg = build_local_graph(g, parts, rank, world, spec_list, sets)
        for lyr, s in enumerate(spec_list):
            view = lg.layers[s.name].views[s.view]
            ref, ref_eids = _sorted_view(g, parts, rank, world, spec_list, sets, lyr)
            for got, want in ((view.csr.indptr, ref.indptr), (view.csr.indices, ref.indices),
                              (view.csr.eids, ref.eids), (view.dst, ref.dst_index()), (view.edge_ids, ref_eids),
                              (view.deg, ref.in_degree().to(torch.float32)),
                              (view.edge_data["gcn_norm"], g.gcn_norm(s.view)[ref_eids])):
                assert got.dtype == want.dtype and torch.equal(got, want), (strategy, rank, lyr)


def test_deep_segment_builds_each_distinct_row_set_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 12-layer DepCache segment on a small graph: the hop neighbourhood saturates after a few layers, so
    most layers hold the same rows; each of those is built once, yet keeps a LayerGraph of its own (a plan's
    shards give each nested layer its own structure) with what building it apiece gives."""
    g = random_graph(50, 200, seed=2)
    world = 2
    parts = np.random.default_rng(0).integers(0, world, g.num_nodes)
    spec_list = _specs("depcache", 12)
    sets = all_row_sets(g, parts, world, spec_list)
    calls = []
    real = rows._view
    monkeypatch.setattr(rows, "_view", lambda *a, **k: calls.append(1) or real(*a, **k))
    for rank in range(world):
        calls.clear()
        lg = build_local_graph(g, parts, rank, world, spec_list, sets)
        distinct = {(np.packbits(sets[rank].held_in[k]).tobytes(), np.packbits(sets[rank].held_out[k]).tobytes())
                    for k in range(12)}
        assert len(calls) == len(distinct) < 12
        assert len({id(x) for x in lg.layers.values()}) == 12
        for lyr, s in enumerate(spec_list):
            view = lg.layers[s.name].views[s.view]
            ref, ref_eids = _sorted_view(g, parts, rank, world, spec_list, sets, lyr)
            assert torch.equal(view.csr.indices, ref.indices) and torch.equal(view.edge_ids, ref_eids)


def test_select_hybrid_reuses_the_planners_algorithm4_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """choose-strategy runs Algorithm 4 once per span start for every span from it (select_spans); select-hybrid,
    selecting a span from that start next, reads its selection off those runs (Algorithm 4 decides layer by
    layer) instead of running it again, and selects what running it again selects."""
    from conftest import EXAMPLES
    from gnnc import api
    from gnnc.cluster import preset
    from gnnc.graph.loaders import load_graph
    from gnnc.passes.cost.inputs import planning_inputs
    from gnnc.passes.planner import hybrid, hybrid_greedy

    graph = load_graph("planetoid:cora")
    parts = np.random.default_rng(0).integers(0, 4, graph.num_nodes)
    profile = preset("neutronstar-ecs")
    program = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph).program
    stats, inputs, shapes = planning_inputs(program, graph, parts, profile)
    runs = []
    real = hybrid_greedy.paper_run
    monkeypatch.setattr(hybrid_greedy, "paper_run", lambda *a, **k: runs.append(1) or real(*a, **k))
    cap = profile.memory_per_worker
    hybrid.select_spans(stats, inputs, shapes, cap, [(0, 1), (0, 2)], graph=graph, parts=parts)
    assert len(runs) == 4  # one per worker
    reused = [hybrid.select(stats, inputs, shapes, cap, 0, end, graph=graph, parts=parts) for end in (1, 2)]
    assert len(runs) == 4
    fresh = []
    for end in (1, 2):
        hybrid._last_runs.clear()
        fresh.append(hybrid.select(stats, inputs, shapes, cap, 0, end, graph=graph, parts=parts))
    assert len(runs) == 12
    for a, b in zip(reused, fresh):
        assert (a.source, a.time) == (b.source, b.time) and np.array_equal(a.received, b.received)
        assert a.cached.keys() == b.cached.keys()
        assert all(np.array_equal(x, y) for k in a.cached for x, y in zip(a.cached[k], b.cached[k]))
