"""The compile's own per-edge work after partitioning (issue 34: the products-size compile for 8 workers after
partitioning, <= 30 s): what each rank's structures and the planner's statistics do per edge."""
from __future__ import annotations

import numpy as np


def test_statistics_take_the_graphs_csr_without_sorting_the_edges_again(monkeypatch) -> None:
    """The planner's statistics read the graph's in-CSR as the matrix of in-edges: building it from the edge list
    (scipy's COO conversion) sorted every edge again, a third of the pass at products' size."""
    import scipy.sparse as sp

    from conftest import random_graph
    from gnnc.passes.partition import stats

    graph = random_graph(300, 2400, seed=4)
    parts = np.random.default_rng(0).integers(0, 4, graph.num_nodes)
    want = stats.compute_stats(graph, parts, 3, "self_loops", num_parts=4)
    built = []
    original = sp.csr_matrix

    def csr_matrix(arg, *args, **kwargs):
        built.append(isinstance(arg, tuple) and len(arg) == 2)  # (data, (row, col)): from the edge list
        return original(arg, *args, **kwargs)

    monkeypatch.setattr(stats.sp, "csr_matrix", csr_matrix)
    got = stats.compute_stats(graph, parts, 3, "self_loops", num_parts=4)
    # (since 6251e41 the statistics build no matrix at all: the part distances walk the CSR the graph holds)
    assert not any(built), "the in-edge matrix was built from the edge list"
    for name in ("lhop_vertices", "lhop_edges", "dep_ids", "dep_subtree_edges", "send_matrix", "remote"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


def test_edge_data_is_gathered_by_numpy_not_torch_indexing() -> None:
    """A plan's structures gather gcn_norm and the edge data of most of the graph's edges per rank and layer;
    torch's indexing of a 1-D CPU tensor by a long index took twice numpy's time for the same gather (2-D: the same)."""
    import time

    import torch

    from gnnc.graph import Graph
    from gnnc.graph.storage import view_edge_data

    n, e = 200_000, 2_000_000
    rng = np.random.default_rng(0)
    graph = Graph(n, rng.integers(0, n, e), rng.integers(0, n, e), torch.zeros(n, 1), torch.zeros(n, dtype=torch.long),
                  *(torch.zeros(n, dtype=torch.bool) for _ in range(3)), name="g",
                  edge_data={"w": torch.rand(e)})
    eids = torch.from_numpy(rng.permutation(e)[: e - 1000])
    norm = graph.gcn_norm("plain")

    def best(fn) -> float:
        times = []
        for _ in range(3):
            t = time.process_time()
            fn()
            times.append(time.process_time() - t)
        return min(times)

    got = view_edge_data(graph, "plain", eids)
    assert torch.equal(got["gcn_norm"], norm[eids]) and torch.equal(got["w"], graph.edge_data["w"][eids])
    ours = best(lambda: view_edge_data(graph, "plain", eids))
    torch_indexing = best(lambda: (norm[eids], graph.edge_data["w"][eids]))
    assert ours < 0.8 * torch_indexing, f"view_edge_data {ours:.3f} s CPU, torch's indexing {torch_indexing:.3f} s"


def test_edge_data_is_gathered_by_edge_id_once_per_view_not_per_rank_and_layer(tmp_path, monkeypatch) -> None:
    """Each rank's structures take gcn_norm by CSR position from one array per view, computed in the CSR's order
    (Graph.gcn_norm_in_csr_order), with no gather by edge id: by edge id per rank and layer it was a random gather
    over most of the graph's edges each time (a third of a depcache plan's structures at products' size)."""
    import gnnc
    from conftest import EXAMPLES
    from gnnc.graph import Graph
    from gnnc.plan import rows

    gathers, norms = [], []
    gather, norm = rows._csr_ordered, Graph.gcn_norm_in_csr_order
    monkeypatch.setattr(rows, "_csr_ordered", lambda g, view, values: gathers.append(view) or gather(g, view, values))
    monkeypatch.setattr(Graph, "gcn_norm_in_csr_order", lambda g, view: norms.append(view) or norm(g, view))
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4, strategy="depcache")
    plan.save(tmp_path / "plan")
    assert norms == ["self_loops"] and gathers == [], (norms, gathers)  # gcn's one view, once for 4 ranks x 2 layers


def test_statistics_gather_each_edges_parts_once_as_int32(monkeypatch) -> None:
    """The statistics' per-edge counts run over the edges' parts gathered once as int32 and the in-degrees come
    off the CSR: the int64 parts were gathered per edge five times over, and the in-degrees counted again."""
    from conftest import random_graph
    from gnnc.passes.partition import stats

    graph = random_graph(300, 2400, seed=5)
    parts = np.random.default_rng(1).integers(0, 4, graph.num_nodes)
    want = stats.compute_stats(graph, parts, 2, "plain", num_parts=4)
    wide = []
    bincount = np.bincount

    class Numpy:  # the stats module's numpy, with its bincount watched
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def bincount(x, *args, **kwargs):
            if len(x) == graph.num_edges and np.asarray(x).dtype == np.int64:
                wide.append(len(x))
            return bincount(x, *args, **kwargs)

    monkeypatch.setattr(stats, "np", Numpy())
    got = stats.compute_stats(graph, parts, 2, "plain", num_parts=4)
    assert not wide, "an int64 array over every edge was counted"
    for name in ("edges", "remote_edges", "inner_edges", "max_in_degree", "lhop_edges", "send_matrix"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


def test_row_sets_read_the_rows_in_edges_not_every_edge(monkeypatch) -> None:
    """A rank's row sets find in-neighbours from the CSR rows of the rows asked about (a rank's owned rows: an
    eighth of the edges for 8 workers), not by a pass over every edge of the graph per layer."""
    import gnnc
    from conftest import EXAMPLES
    from gnnc.plan import rows

    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4, strategy="depcache")
    specs = rows.layer_specs(plan.program)
    want = [rows.rank_row_sets(graph, plan.parts, r, specs) for r in range(4)]
    for view in ("plain", "self_loops"):
        graph.csr(view)  # built before: what the row sets may read

    def every_edge(view: str = "plain"):
        raise AssertionError("the row sets walked every edge")

    monkeypatch.setattr(graph, "edges", every_edge)
    for rank in range(4):
        got = rows.rank_row_sets(graph, plan.parts, rank, specs)
        assert all(np.array_equal(a, b) for a, b in zip(got.held_in, want[rank].held_in))
        assert all(np.array_equal(got.orders[k], want[rank].orders[k]) for k in want[rank].orders)
