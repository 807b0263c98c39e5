"""The in-distance table of every part (gnnc.plan.distances): exact, computed once per (graph, partition), shared by
the statistics pass and a depcache segment's row sets, and read off the store's out-CSR instead of a transpose
built again (issue 34: the products-size compile's statistics and row sets)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from gnnc.graph import Graph
from gnnc.graph.generators import rmat
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition import stats as stats_mod
from gnnc.passes.partition.stats import compute_stats
from gnnc.plan import distances, rows
from gnnc.plan.rows import LayerSpec, all_row_sets, rank_row_sets


def _graph(n: int = 600, seed: int = 0) -> Graph:
    g = rmat(n, 6.0, seed=seed)
    # a few self-loops and duplicates: the views differ in them, the distances must not
    src = np.concatenate([g.src, np.arange(0, n, 7, dtype=g.src.dtype), g.src[:50]])
    dst = np.concatenate([g.dst, np.arange(0, n, 7, dtype=g.dst.dtype), g.dst[:50]])
    return Graph(n, src, dst, g.x, g.y, g.train_mask, g.val_mask, g.test_mask, name="t")


def _reference(g: Graph, parts: np.ndarray, num_parts: int, levels: int) -> np.ndarray:
    """Per part, a BFS over the in-edges by scipy: dist[v, i] (-1 beyond `levels`)."""
    n = g.num_nodes
    adj = sp.csr_matrix((np.ones(g.num_edges), (np.asarray(g.src), np.asarray(g.dst))), shape=(n, n))  # u -> v
    out = np.full((n, num_parts), -1, dtype=np.int64)
    for i in range(num_parts):
        seen = parts == i
        out[seen, i] = 0
        front = seen.astype(np.float64)
        for level in range(1, levels + 1):
            new = (adj @ front > 0) & ~seen
            out[new, i] = level
            seen |= new
            front = new.astype(np.float64)
    return out


@pytest.mark.parametrize("num_parts", [1, 3, 8, 13, 70])
@pytest.mark.parametrize("stored", [False, True])
def test_table_equals_a_bfs_per_part(num_parts: int, stored: bool, tmp_path: Path) -> None:
    g = _graph()
    if stored:
        write_store(g, tmp_path / "s")
        g = open_store(tmp_path / "s")
    parts = np.random.default_rng(1).integers(0, num_parts, g.num_nodes)
    for levels in (0, 1, 2, 4):
        table = distances.part_distances(g, parts, num_parts, levels)
        assert table.shape == (g.num_nodes, num_parts)
        np.testing.assert_array_equal(table, _reference(g, parts, num_parts, levels))


def test_views_give_one_table() -> None:
    g = _graph()
    parts = np.random.default_rng(2).integers(0, 4, g.num_nodes)
    plain = distances._compute(g, parts, 4, 3, "plain")[0]
    loops = distances._compute(g, parts, 4, 3, "self_loops")[0]
    np.testing.assert_array_equal(plain, loops)


def _walked(g: Graph, parts: np.ndarray, rank: int, specs: list[LayerSpec]) -> rows.RowSets:
    return rank_row_sets(g, parts, rank, specs)  # no distance: the walk


@pytest.mark.parametrize("layout", [
    ["depcache"] * 3,
    ["depcomm", "depcache", "depcache"],
    ["depcache", "depcache", "depcomm", "depcache"],
    ["hybrid", "hybrid", "depcache"],
])
def test_row_sets_off_the_table_equal_the_walk(layout: list[str]) -> None:
    g = _graph(700, seed=5)
    parts = np.random.default_rng(6).integers(0, 5, g.num_nodes)
    specs: list[LayerSpec] = []
    for k, strategy in enumerate(layout):
        nested = strategy in ("depcache", "hybrid")
        seg = specs[-1].segment if nested and specs and specs[-1].strategy == strategy else k
        specs.append(LayerSpec(f"l{k}", "self_loops" if k % 2 else "plain", strategy, seg))
    shared = all_row_sets(g, parts, 5, specs)
    for rank in range(5):
        walked = _walked(g, parts, rank, specs)
        got = shared[rank]
        for a, b in zip(got.held_in, walked.held_in):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(got.held_out, walked.held_out):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(got.halos, walked.halos):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)
        assert got.orders.keys() == walked.orders.keys() and got.entries.keys() == walked.entries.keys()
        for k in got.orders:
            np.testing.assert_array_equal(got.orders[k], walked.orders[k])
        for k in got.entries:
            np.testing.assert_array_equal(got.entries[k], walked.entries[k])


def test_lhop_statistics_equal_the_tables_levels() -> None:
    """lhop_vertices / lhop_edges: per part and level, the vertices at that in-distance and their in-edges."""
    g = _graph(500, seed=7)
    parts = np.random.default_rng(8).integers(0, 6, g.num_nodes)
    for view in ("plain", "self_loops"):
        s = compute_stats(g, parts, 3, view, num_parts=6)
        ref = _reference(g, parts, 6, 3)
        deg = np.diff(g.csr(view).indptr.numpy())
        for i in range(6):
            for level in range(4):
                at = ref[:, i] == level
                assert s.lhop_vertices[i, level] == at.sum()
                assert s.lhop_edges[i, level] == deg[at].sum()
    assert stats_mod.PartStats is not None


def test_a_cached_deeper_table_answers_a_shallower_question() -> None:
    g = _graph(400, seed=9)
    parts = np.random.default_rng(10).integers(0, 3, g.num_nodes)
    deep = distances.part_distances(g, parts, 3, 4)
    before = dict(distances.WORK)
    shallow = distances.part_distances(g, parts, 3, 1)
    assert distances.WORK == before  # read off the deeper one
    np.testing.assert_array_equal(shallow, np.where(deep > 1, -1, deep))
    other = parts.copy()
    other[0] = (other[0] + 1) % 3
    distances.part_distances(g, other, 3, 1)
    assert distances.WORK["tables"] == before["tables"] + 1  # another assignment: another table
