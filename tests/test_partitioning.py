"""Partitioners: hand-computed parts on small graphs, properties on random ones, G3's bookkeeping."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnc.errors import GnncError
from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.partition.g3 import Limits, RemoteSets, Swapper
from gnnc.passes.partition.hash import hash_parts
from gnnc.passes.partition.core import (METHODS, PartitionInput, chunks_for_pipeline, estimate_peak_memory,
                                      partition_graph, tile_nnz)
from gnnc.plan.slices import feature_slices
from gnnc.graph.generators import rmat
from gnnc.graph import Graph


def make_graph(n: int, edges: list[tuple[int, int]], undirected: bool = False, f: int = 3) -> Graph:
    e = np.array(edges, dtype=np.int64).reshape(-1, 2)
    if undirected:
        e = np.concatenate([e, e[:, ::-1]])
    x = torch.arange(n * f, dtype=torch.float32).reshape(n, f)
    y = torch.arange(n) % 2
    m = torch.ones(n, dtype=torch.bool)
    return Graph(n, e[:, 0].copy(), e[:, 1].copy(), x, y, m, ~m, ~m, name="hand")


TWO_TRIANGLES = make_graph(6, [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (2, 3)], undirected=True)


def test_metis_splits_two_triangles_at_the_bridge() -> None:
    for kwargs in ({}, {"objective": "vol", "constraints": "vertices+degree"}):
        p = partition_graph(TWO_TRIANGLES, 2, "metis", **kwargs)
        a = p.assignment
        assert a[0] == a[1] == a[2] != a[3] == a[4] == a[5]
        assert p.stats["edge_cut"] == 1 and p.stats["volume"] == 2
        s = compute_stats(TWO_TRIANGLES, p, layers=1)
        first = int(a[0])
        assert s.deps(first)[0].tolist() == [3] and s.deps(1 - first)[0].tolist() == [2]  # B_i by hand


def test_chunk_balances_vertices_plus_in_edges() -> None:
    # in-degrees 3,0,0,1,1,1: weights 4,1,1,2,2,2 (total 12), so ids 0-2 weigh 6 and ids 3-5 weigh 6
    g = make_graph(6, [(1, 0), (2, 0), (3, 0), (4, 3), (5, 4), (0, 5)])
    p = partition_graph(g, 2, "chunk")
    assert p.assignment.tolist() == [0, 0, 0, 1, 1, 1]
    assert p.stats["bounds"] == [0, 3, 6] and p.stats["work_balance"] == 1.0
    # with more parts than heavy ranges, every part still gets a vertex
    assert partition_graph(g, 6, "chunk").assignment.tolist() == [0, 1, 2, 3, 4, 5]


def test_hash_is_a_seeded_function_of_the_id() -> None:
    g = rmat(5000, deg=4, seed=0)
    p = partition_graph(g, 7, "hash", seed=3)
    ids = np.array([0, 17, 4999])
    assert p.assignment[ids].tolist() == hash_parts(ids, 7, 3).tolist()  # no table: any worker computes it
    assert not np.array_equal(p.assignment, partition_graph(g, 7, "hash", seed=4).assignment)
    assert p.stats["vertex_balance"] < 1.1
    # ids with a stride do not pile onto one part (as id % parts would for stride 7)
    assert len(np.unique(hash_parts(np.arange(0, 7000, 7), 7, 0))) == 7


def test_random_blocks_and_tiles() -> None:
    g = make_graph(4, [(0, 1), (1, 0), (2, 3), (0, 3), (3, 3)])
    p = partition_graph(g, 2, "random", permute=False)
    assert p.assignment.tolist() == [0, 0, 1, 1]
    # tile (i, j): edges into part i from part j
    assert p.stats["tile_nnz"] == [[2, 0], [1, 2]]
    q = partition_graph(g, 2, "random", seed=5)
    assert np.bincount(q.assignment).tolist() == [2, 2]  # uniform row blocks of the permuted order


def test_random_permutation_spreads_rmat_hubs() -> None:
    g = rmat(20000, deg=8, seed=0)
    identity = partition_graph(g, 8, "random", permute=False).stats["max_mean_tile_nnz"]
    permuted = partition_graph(g, 8, "random", seed=0).stats["max_mean_tile_nnz"]
    assert permuted < 1.3 < 5 < identity  # measured about 1.1 vs 20 on this graph
    tiles = tile_nnz(g, partition_graph(g, 8, "random", seed=0).assignment, 8)
    assert tiles.sum() == g.num_edges


def test_metis_multi_constraint_balances_degree() -> None:
    g = rmat(4000, deg=6, seed=1)
    cut = partition_graph(g, 4, "metis").stats
    mc = partition_graph(g, 4, "metis", objective="vol", constraints="vertices+degree").stats
    assert mc["degree_balance"] <= 1.05 and mc["vertex_balance"] <= 1.05
    assert cut["degree_balance"] > mc["degree_balance"]
    # METIS's volume objective is sum |B_i| on a symmetric graph
    p = partition_graph(g, 4, "metis", objective="vol", constraints="vertices+degree")
    assert p.stats["volume"] == int(compute_stats(g, p, 1).remote.sum()) == p.stats["objective_value"]


@pytest.mark.parametrize("start", ["metis", "hubs"])
def test_g3_incremental_counts_equal_a_recount_after_every_swap(start: str) -> None:
    g = rmat(3000, deg=5, seed=2)
    for select in ("gain", "paper"):
        checked = []

        def check(rs: RemoteSets) -> None:
            assert rs.size.tolist() == rs.recount().tolist()
            if len(checked) < 5:  # the set-based brute force is slower: the first swaps
                assert rs.size.tolist() == [len(b) for b in rs.brute_force()]
            checked.append(int(rs.size.max()))

        p = partition_graph(g, 4, "g3", start=start, select=select, on_swap=check, max_swaps=300)
        assert len(checked) == p.stats["swaps"] > 0
        s = compute_stats(g, p, 1)
        assert s.remote.tolist() == p.stats["remote"]  # symmetric graph: same B_i as the stats pass
        assert p.stats["remote_ratio"] <= p.stats["remote_ratio_start"]
        assert p.stats["remote_sum"] <= p.stats["remote_sum_bound"] == int(1.2 * p.stats["remote_sum_start"])
        assert p.stats["stop"].split(":")[0] in ("balanced", "cycle", "time limit", "max_swaps", "stalled")


def test_g3_from_multi_constraint_metis_balances_remote_sets() -> None:
    g = rmat(6000, deg=8, seed=0)
    p = partition_graph(g, 4, "g3")
    assert p.stats["remote_ratio"] <= 1.10
    assert p.stats["degree_balance"] <= 1.05 + 1e-9  # the default degree tolerance
    assert "degree balance" in p.stats["beyond_paper"]


def test_g3_sum_bound_holds_and_rejections_are_counted() -> None:
    g = rmat(3000, deg=5, seed=2)
    sums = []
    # from edge-cut METIS the swaps must grow sum |B_i| to balance it, so a tight bound binds
    p = partition_graph(g, 4, "g3", start="metis", sum_factor=1.05,
                        on_swap=lambda rs: sums.append(int(rs.size.sum())))
    bound = p.stats["remote_sum_bound"]
    assert bound == int(1.05 * p.stats["remote_sum_start"])
    assert sums and max(sums) <= bound  # after every accepted swap, not only at the end
    assert p.stats["remote_sum"] == int(compute_stats(g, p, 1).remote.sum()) <= bound
    assert p.stats["rejected"]["sum"] > 0 and set(p.stats["rejected"]) == {"no_progress", "sum", "degree"}
    loose = partition_graph(g, 4, "g3", start="metis", sum_factor=3.0).stats
    assert loose["remote_ratio"] < p.stats["remote_ratio"]  # the bound is what held it back
    with pytest.raises(GnncError, match="sum_factor must be at least 1.0"):
        partition_graph(g, 4, "g3", sum_factor=0.9)


def _state(rs: RemoteSets) -> tuple[list[int], list[int], list[float], bytes]:
    return rs.part.tolist(), rs.size.tolist(), rs.load.tolist(), rs.cnt.tobytes()


@pytest.mark.parametrize("limits", [Limits(degree=float("inf"), remote_sum=0.0),  # every sum too large
                                    Limits(degree=1.0, remote_sum=float("inf"))])  # every imbalance too large
def test_g3_rejected_swap_leaves_the_state_unchanged(limits: Limits) -> None:
    g = rmat(2000, deg=5, seed=3)
    indptr, indices = PartitionInput(g).undirected
    rng = np.random.default_rng(0)
    weights = PartitionInput(g).in_degree.astype(np.float64)
    rs = RemoteSets(indptr, indices, rng.integers(0, 4, g.num_nodes), 4, weights)
    swapper = Swapper(rs, limits, salt=1)
    for _ in range(300):
        a, b = int(np.argmax(rs.size)), int(np.argmin(rs.size))
        v = int(rng.choice(np.nonzero(rs.part == a)[0]))
        w = int(rng.choice(np.nonzero(rs.part == b)[0]))
        before = _state(rs)
        assert not swapper.try_swap(v, w, a, b)  # the limits admit no swap at all
        assert _state(rs) == before
    assert rs.size.tolist() == rs.recount().tolist() and swapper.swaps == 0
    reason = "sum" if limits.remote_sum == 0.0 else "degree"
    assert swapper.rejected[reason] > 0 and sum(swapper.rejected.values()) == 300
    assert swapper.rejected["no_progress"] > 0  # checked first: random pairs rarely help


@settings(max_examples=30, deadline=None)
@given(st.integers(4, 30), st.integers(0, 120), st.integers(2, 5), st.integers(0, 10_000))
def test_remote_sets_stay_exact_under_random_moves(n: int, e: int, parts: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = make_graph(n, list(zip(rng.integers(0, n, e).tolist(), rng.integers(0, n, e).tolist())))
    indptr, indices = PartitionInput(g).undirected
    rs = RemoteSets(indptr, indices, rng.integers(0, parts, n), parts, np.ones(n))
    for _ in range(20):
        rs.move(int(rng.integers(n)), int(rng.integers(parts)))
        assert rs.size.tolist() == [len(b) for b in rs.brute_force()] == rs.recount().tolist()
    assert rs.load.tolist() == np.bincount(rs.part, minlength=parts).astype(float).tolist()


@settings(max_examples=25, deadline=None)
@given(st.integers(4, 40), st.integers(0, 150), st.integers(1, 4), st.sampled_from(sorted(METHODS)),
       st.integers(0, 1000))
def test_every_vertex_in_exactly_one_part(n: int, e: int, parts: int, method: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = make_graph(n, list(zip(rng.integers(0, n, e).tolist(), rng.integers(0, n, e).tolist())))
    p = partition_graph(g, parts, method, seed=seed, **({"time_limit": 5.0} if method == "g3" else {}))
    assert p.assignment.shape == (n,) and p.assignment.dtype == np.int64
    assert p.assignment.min() >= 0 and p.assignment.max() < parts
    assert p.sizes().sum() == n
    assert sorted(np.concatenate([p.members(i) for i in range(parts)]).tolist()) == list(range(n))


@pytest.mark.parametrize("f, parts", [(7, 4), (16, 8), (3, 5), (10, 1), (0, 2)])
def test_feature_slices_cover_the_feature_dim(f: int, parts: int) -> None:
    slices = feature_slices(f, parts)
    assert len(slices) == parts and slices[0][0] == 0 and slices[-1][1] == f
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # contiguous, no overlap
    widths = [b - a for a, b in slices]
    assert max(widths) - min(widths) <= 1
    assert feature_slices(7, 4) == [(0, 1), (1, 3), (3, 5), (5, 7)]


def test_pipeline_chunks_cover_one_part() -> None:
    g = rmat(3000, deg=5, seed=1)
    p = partition_graph(g, 2, "metis")
    chunks = chunks_for_pipeline(g, 4, p, part=1)
    assert len(chunks) == 4
    joined = np.sort(np.concatenate(chunks))
    assert np.array_equal(joined, p.members(1))
    whole = chunks_for_pipeline(g, 8)
    assert sum(len(c) for c in whole) == g.num_nodes


def test_errors_name_the_problem() -> None:
    with pytest.raises(GnncError, match="unknown partitioning method 'kl'"):
        partition_graph(TWO_TRIANGLES, 2, "kl")
    with pytest.raises(GnncError, match="unknown option 'colour' for partitioning method 'hash'"):
        partition_graph(TWO_TRIANGLES, 2, "hash", colour=1)
    with pytest.raises(GnncError, match=r"parts \(7\) exceeds the number of vertices \(6\)"):
        partition_graph(TWO_TRIANGLES, 7, "metis")
    with pytest.raises(GnncError, match="positive integer"):
        partition_graph(TWO_TRIANGLES, 0, "hash")
    with pytest.raises(GnncError, match="objective must be one of"):
        partition_graph(TWO_TRIANGLES, 2, "metis", objective="speed")


def test_memory_estimate_orders_the_methods() -> None:
    g = rmat(2000, deg=5, seed=0)
    est = {m: estimate_peak_memory(g, 8, m) for m in METHODS}
    assert 0 < est["hash"] <= est["random"] < est["metis"] < est["g3"]
    assert estimate_peak_memory(g, 8, "hash", baseline_bytes=10**9) > 10**9
