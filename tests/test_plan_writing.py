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
    real, prefix = rows._view, rows._prefix_view
    monkeypatch.setattr(rows, "_view", lambda *a, **k: calls.append("gathered") or real(*a, **k))
    monkeypatch.setattr(rows, "_prefix_view", lambda *a, **k: calls.append("prefix") or prefix(*a, **k))
    for rank in range(world):
        calls.clear()
        lg = build_local_graph(g, parts, rank, world, spec_list, sets)
        distinct = {(np.packbits(sets[rank].held_in[k]).tobytes(), np.packbits(sets[rank].held_out[k]).tobytes())
                    for k in range(12)}
        assert len(calls) == len(distinct) < 12 and calls.count("gathered") == 1  # the others read off the first
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


def test_a_depcache_segment_gathers_its_in_edges_once(monkeypatch) -> None:
    """A deeper layer of a depcache segment computes a prefix of the rows its first layer computes, from the same
    in-edges: its structure is read off the first's (issue 34: each layer of a segment that reaches most of the
    graph gathered the graph again), and equals what gathering it apiece builds."""
    g = random_graph(3000, 6000, seed=2)
    world = 4
    parts = np.random.default_rng(3).integers(0, world, g.num_nodes)
    spec_list = _specs("depcache", 3)
    sets = all_row_sets(g, parts, world, spec_list)
    apiece = [build_local_graph(g, parts, rank, world, spec_list, sets) for rank in range(world)]
    gathered = []
    view = rows._view
    monkeypatch.setattr(rows, "_view", lambda *a, **k: gathered.append(len(a[2])) or view(*a, **k))
    for rank in range(world):
        gathered.clear()
        lg = build_local_graph(g, parts, rank, world, spec_list, sets)
        assert len({lg.layers[s.name].n_out for s in spec_list}) == 3  # three different row sets
        assert len(gathered) == 1, f"rank {rank}: the graph's in-edges gathered {len(gathered)} times"
        for s in spec_list:
            got, want = lg.layers[s.name].views[s.view], apiece[rank].layers[s.name].views[s.view]
            for a, b in ((got.csr.indptr, want.csr.indptr), (got.csr.indices, want.csr.indices),
                         (got.csr.eids, want.csr.eids), (got.dst, want.dst), (got.edge_ids, want.edge_ids),
                         (got.deg, want.deg), (got.edge_data["gcn_norm"], want.edge_data["gcn_norm"])):
                assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("strategy", ["depcomm", "depcache", "hybrid", "bcast1d"])
def test_shards_are_built_without_edge_positions(monkeypatch, strategy: str) -> None:
    """A shard holds no CSR `eids` (a loaded structure numbers its edges 0..nnz-1): the writer does not compute
    them (half of building a depcache layer), and its arrays are the ones a structure with them gives."""
    from gnnc.plan import shards

    g = random_graph(500, 2500, seed=5)
    world = 3
    parts = np.random.default_rng(1).integers(0, world, g.num_nodes)
    spec_list = _specs(strategy, 3)
    cached = {k: [np.arange(r, g.num_nodes, 7) for r in range(world)] for k in range(3)} \
        if strategy == "hybrid" else None
    sets = all_row_sets(g, parts, world, spec_list, cached)
    with monkeypatch.context() as m:  # the structures with their edge positions, as before
        m.setattr(shards, "build_local_graph", lambda *a, **k: build_local_graph(*a))
        with_positions = [shards.rank_arrays(g, parts, r, world, spec_list, sets) for r in range(world)]
    counted = []
    local_eids = rows._local_eids
    monkeypatch.setattr(rows, "_local_eids", lambda *a: counted.append(1) or local_eids(*a))
    for r in range(world):
        arrays, layout = shards.rank_arrays(g, parts, r, world, spec_list, sets)
        want_arrays, want_layout = with_positions[r]
        assert layout == want_layout and arrays.keys() == want_arrays.keys()
        assert all(np.array_equal(arrays[k], want_arrays[k]) and arrays[k].dtype == want_arrays[k].dtype
                   for k in arrays)
    assert counted == []
