"""The statistics pass: a hand-computed example, and brute force on random graphs."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.partition.core import partition_graph
from tests.test_partitioning import make_graph

# directed, with a duplicate (2->1 twice) and a self-loop (3->3); parts {0,1}, {2,3}, {4}
HAND = make_graph(5, [(0, 1), (2, 1), (3, 0), (4, 0), (4, 2), (1, 3), (2, 3), (3, 3), (2, 1)])
HAND_PARTS = np.array([0, 0, 1, 1, 2])


def test_hand_computed_example() -> None:
    s = compute_stats(HAND, HAND_PARTS, layers=2)
    assert s.vertices.tolist() == [2, 2, 1]
    assert s.edges.tolist() == [5, 4, 0]  # in-edges of the owned vertices, duplicate included
    assert s.remote.tolist() == [3, 2, 0]
    assert s.deps(0)[0].tolist() == [2, 3, 4]  # by (owner, id)
    assert s.deps(1)[0].tolist() == [1, 4]
    assert s.send_matrix.tolist() == [[0, 1, 0], [2, 0, 0], [1, 1, 0]]
    assert s.send.tolist() == [1, 2, 2]
    assert s.edge_cut == 6
    assert s.lhop_vertices.tolist() == [[2, 3, 0], [2, 2, 1], [1, 0, 0]]
    assert s.lhop_edges.tolist() == [[5, 4, 0], [4, 3, 2], [0, 0, 0]]
    # depth-1 trees: a dependency's in-edges
    assert s.deps(0)[2][:, 1].tolist() == [1, 3, 0] and s.deps(1)[2][:, 1].tolist() == [3, 0]
    assert s.deps(0)[1][:, 0].tolist() == [1, 1, 1]  # depth 0: the vertex alone
    assert s.replication_factor == 2.0 and math.isinf(s.remote_balance)
    three = compute_stats(HAND, HAND_PARTS, layers=3)
    # vertex 3's depth-2 tree: 3 in-edges (from 1, 2, 3) plus theirs, 3 + 1 + 3
    assert three.deps(0)[2][1].tolist() == [0, 3, 10]


def test_self_loops_view_changes_edges_not_dependencies() -> None:
    plain = compute_stats(HAND, HAND_PARTS, layers=1)
    loops = compute_stats(HAND, HAND_PARTS, layers=1, view="self_loops")
    assert loops.remote.tolist() == plain.remote.tolist()
    assert loops.edges.tolist() == [7, 5, 1]  # one loop per vertex, the given one at 3 replaced


def _brute(n: int, edges: list[tuple[int, int]], part: np.ndarray, parts: int, layers: int):
    ins = [[s for s, d in edges if d == v] for v in range(n)]
    remote = [sorted({s for s, d in edges if part[d] == i and part[s] != i}) for i in range(parts)]
    levels = []
    for i in range(parts):
        seen = {v for v in range(n) if part[v] == i}
        frontier, per_level = set(seen), [len(seen)]
        per_edges = [sum(len(ins[v]) for v in frontier)]
        for _ in range(layers):
            new = {s for v in frontier for s in ins[v]} - seen
            seen |= new
            frontier = new
            per_level.append(len(new))
            per_edges.append(sum(len(ins[v]) for v in new))
        levels.append((per_level, per_edges))

    def tree_edges(u: int, depth: int) -> int:
        return 0 if depth == 0 else sum(1 + tree_edges(s, depth - 1) for s in ins[u])

    return remote, levels, tree_edges


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 25), st.integers(0, 80), st.integers(1, 4), st.integers(0, 3), st.integers(0, 10_000))
def test_matches_brute_force(n: int, e: int, parts: int, layers: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    edges = list(zip(rng.integers(0, n, e).tolist(), rng.integers(0, n, e).tolist()))
    g = make_graph(n, edges)
    part = rng.integers(0, parts, n)
    s = compute_stats(g, part, layers)
    parts = int(part.max()) + 1
    remote, levels, tree_edges = _brute(n, edges, part, parts, layers)
    for i in range(parts):
        ids = s.deps(i)[0]
        assert sorted(ids.tolist()) == remote[i]
        assert list(zip(part[ids].tolist(), ids.tolist())) == sorted(zip(part[ids].tolist(), ids.tolist()))
        assert s.lhop_vertices[i].tolist() == levels[i][0]
        assert s.lhop_edges[i].tolist() == levels[i][1]
        for row, u in enumerate(ids.tolist()):
            assert s.deps(i)[2][row].tolist() == [tree_edges(u, k) for k in range(layers)]
    assert s.remote.sum() == s.send.sum() == s.send_matrix.sum()
    assert s.edges.sum() == e and s.vertices.sum() == n


def test_partition_object_and_summary() -> None:
    g = make_graph(6, [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (2, 3)], undirected=True)
    p = partition_graph(g, 2, "metis")
    s = compute_stats(g, p, layers=2)
    summary = s.summary()
    assert summary["remote"] == [1, 1] and summary["edge_cut"] == 2
    assert summary["lhop_vertices"][0] == [3, 1, 2]  # own triangle, the bridge's far end, its two neighbours
