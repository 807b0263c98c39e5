"""The statistics' serial steps around the row pass on both cores (issue 34, the products compile's parent process).

At ogbn-products' size the parent spent ~3.5 s in `gnnc.plan.distances.part_distances` (3 levels of a segmented OR
over the store's out-CSR) and ~1.5 s in compute_stats' per-part dependency lists, L-hop counts and dependency
trees while the second core idled. Each level's OR now splits by row range over processes (a row's OR reads only
the frontier, so any split gives the same words), and the dependency lists are made part by part from the table's
columns. These tests check that the table and every statistic are the same with any number of processes and
against the formulation they replace, that the levels do fork on a big graph (the thresholds forced to 0) and that
a small one does not.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import fork_spy, random_graph
from test_part_distances import _graph, _reference
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition import stats as st
from gnnc.plan import distances


def _stored(tmp_path: Path, n: int = 600, seed: int = 0):
    write_store(_graph(n, seed), tmp_path / "s")
    return open_store(tmp_path / "s")


def _spy(monkeypatch) -> list[int]:
    """distances' map_processes recorded: the item count of each call that forks."""
    return fork_spy(monkeypatch, distances)


@pytest.mark.parametrize("num_parts", [1, 3, 8, 13, 70])
def test_levels_in_processes_equal_the_levels_here(monkeypatch, tmp_path: Path, num_parts: int) -> None:
    """The table with each level's OR split over 2 and 3 processes equals the one made here and a BFS per part,
    for words of one byte, two and several uint64 (70 parts); one fork per level stepped."""
    g = _stored(tmp_path)
    parts = np.random.default_rng(num_parts).integers(0, num_parts, g.num_nodes)
    monkeypatch.setattr(distances, "PARALLEL_EDGES", 0)
    forks = _spy(monkeypatch)
    for levels in (0, 1, 2, 4):
        want = _reference(g, parts, num_parts, levels)
        for processes in (1, 2, 3):
            g._views.pop(distances._digest(parts, num_parts), None)
            before, forked = distances.WORK["levels"], len(forks)
            table = distances.part_distances(g, parts, num_parts, levels, processes=processes)
            np.testing.assert_array_equal(table, want)
            assert table.dtype == np.int8
            stepped = distances.WORK["levels"] - before
            assert forks[forked:] == [processes] * (stepped if processes > 1 else 0)
    assert forks


def test_small_graphs_do_not_fork_the_levels(monkeypatch, tmp_path: Path) -> None:
    """Below distances.PARALLEL_EDGES the levels run here whatever the count asked (a fork per level costs more)."""
    g = _stored(tmp_path)
    assert g.num_edges < distances.PARALLEL_EDGES

    def refuse(*args, **kwargs):
        raise AssertionError("forked for a small graph")

    monkeypatch.setattr(distances, "map_processes", refuse)
    parts = np.arange(g.num_nodes) % 4
    np.testing.assert_array_equal(distances.part_distances(g, parts, 4, 3, processes=8), _reference(g, parts, 4, 3))


def _old_dependencies(depth: np.ndarray, marked: np.ndarray | None, part: np.ndarray, parts: int, layers: int,
                      in_degree: np.ndarray, tree_edges: np.ndarray) -> dict[str, np.ndarray]:
    """compute_stats' dependency lists, L-hop counts and trees as 705b2d6 made them: every (receiver, source)
    pair's int64 key, divmod, a stable sort by (receiver, owner), the [vertex, depth] table gathered."""
    n = len(part)
    keys = np.flatnonzero((depth == 1).T if marked is None else marked)
    receiver, dep = np.divmod(keys, n)
    owner = part[dep]
    pair = receiver * parts + owner
    order = np.argsort(pair.astype(np.uint16) if parts * parts <= 2**16 else pair, kind="stable")
    lhop_vertices = np.zeros((parts, layers + 1), dtype=np.int64)
    lhop_edges = np.zeros((parts, layers + 1), dtype=np.int64)
    for i in range(parts):
        level = depth[:, i].astype(np.intp) + 1
        lhop_vertices[i] = np.bincount(level, minlength=layers + 2)[1:]
        lhop_edges[i] = np.bincount(level, weights=in_degree.astype(np.float64), minlength=layers + 2)[1:].astype(
            np.int64)
    dep_ids = dep[order]
    return {"remote": np.bincount(receiver, minlength=parts),
            "send_matrix": np.bincount(owner * parts + receiver, minlength=parts * parts).reshape(parts, parts),
            "dep_ids": dep_ids, "lhop_vertices": lhop_vertices, "lhop_edges": lhop_edges,
            "dep_subtree_edges": tree_edges[dep_ids]}


@pytest.mark.parametrize("seed,n,e,parts,layers,view", [(0, 600, 9000, 4, 3, "plain"), (1, 3000, 40000, 8, 2, "plain"),
                                                       (2, 2000, 30000, 3, 4, "self_loops"),
                                                       (3, 500, 5000, 5, 1, "plain"), (4, 800, 6000, 300, 2, "plain"),
                                                       (5, 400, 3000, 6, 0, "plain")])
def test_dependencies_by_receiver_equal_the_sorted_pairs(seed, n, e, parts, layers, view) -> None:
    """remote, send_matrix, dep_ids, the L-hop counts and the dependency trees made part by part from the table's
    columns equal the formulation they replace (every pair's key sorted; the [vertex, depth] table gathered),
    values and dtypes: over 256 parts (uint16 owners) and without levels (the marked pairs) too."""
    graph = random_graph(n, e, seed=seed)
    part = np.random.default_rng(seed).integers(0, parts, graph.num_nodes)
    got = st.compute_stats(graph, part, layers, view, num_parts=parts)
    csr = graph.csr(view)
    indptr, indices = csr.indptr.numpy(), csr.indices.numpy()
    in_degree = np.diff(indptr)
    marked = None
    if layers == 0:
        marked = np.zeros((parts, graph.num_nodes), dtype=bool)
        st._cross_in(indptr, indices, part, 0, graph.num_nodes, marked)
    tree = np.zeros((graph.num_nodes, layers))
    walks = in_degree.astype(np.float64)
    for k in range(1, layers):
        if k > 1:
            walks = st._in_sums(indptr, indices, walks)
        tree[:, k] = tree[:, k - 1] + walks
    depth = distances.part_distances(graph, part, parts, layers, view)
    want = _old_dependencies(depth, marked, part, parts, layers, in_degree, tree)
    for name, value in want.items():
        have = getattr(got, name)
        assert np.array_equal(have, value) and have.dtype == value.dtype, name
    assert np.array_equal(got.dep_subtree_vertices, want["dep_subtree_edges"] + 1.0)


def test_statistics_on_a_store_fork_the_levels_and_equal_one_process(monkeypatch, tmp_path: Path) -> None:
    """On a store (out-CSR held) compute_stats hands its processes to the distance levels: the same PartStats."""
    g = _stored(tmp_path, 900, 3)
    part = np.random.default_rng(3).integers(0, 8, g.num_nodes)
    want = st.compute_stats(g, part, 3, num_parts=8)
    g._views.pop(distances._digest(part, 8), None)
    monkeypatch.setattr(distances, "PARALLEL_EDGES", 0)
    monkeypatch.setattr(st, "PARALLEL_EDGES", 0)
    forks = _spy(monkeypatch)
    got = st.compute_stats(g, part, 3, num_parts=8, processes=2)
    assert forks == [2, 2, 2]
    for f in want.__dataclass_fields__:
        a, b = getattr(got, f), getattr(want, f)
        assert (np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype) if isinstance(b, np.ndarray) \
            else a == b, f


@pytest.mark.parametrize("parts", [2, 128, 129, 300])
def test_cut_counts_with_narrow_part_ids(parts: int) -> None:
    """The row pass gathers the parts as int8 up to 128 parts, int16 above: edge_cut, remote_edges and
    inner_edges equal counts made straight off the edge list, at the dtypes' edges too."""
    graph = random_graph(1500, 20000, seed=parts)
    part = np.random.default_rng(parts).integers(0, parts, graph.num_nodes)
    part[:2] = [0, parts - 1]
    got = st.compute_stats(graph, part, 2, num_parts=parts)
    src, dst = np.asarray(graph.src, dtype=np.int64), np.asarray(graph.dst, dtype=np.int64)
    cut = part[src] != part[dst]
    assert got.edge_cut == int(cut.sum())
    assert np.array_equal(got.remote_edges, np.bincount(part[dst[cut]], minlength=parts))
    boundary = np.zeros(graph.num_nodes, dtype=bool)
    boundary[dst[cut]] = True
    in_degree = np.bincount(dst, minlength=graph.num_nodes)
    assert np.array_equal(got.inner_edges, np.bincount(part[~boundary], weights=in_degree[~boundary],
                                                       minlength=parts).astype(np.int64))
