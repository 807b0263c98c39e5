"""The hub start for G3's swaps: hub groups against brute force, the levelling fill, and its effect on R-MAT."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnc.errors import GnncError
from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.partition.hub_split import _deal_hubs, _fill_evenly, hub_split
from gnnc.passes.partition.core import PartitionInput, partition_graph
from gnnc.graph.generators import rmat

from tests.test_partitioning import make_graph

# hub 0 with leaves 2-6, hub 1 with leaves 7-9, the hubs joined; 10 is isolated
STARS = make_graph(11, [(0, 1)] + [(0, v) for v in range(2, 7)] + [(1, v) for v in range(7, 10)], undirected=True)


def _remote(indptr: np.ndarray, indices: np.ndarray, group: set[int]) -> int:
    """|N(group) \\ group| by brute force."""
    nbrs = {int(u) for v in group for u in indices[indptr[v]:indptr[v + 1]]}
    return len(nbrs - group)


def _order(indptr: np.ndarray) -> np.ndarray:
    deg = np.diff(indptr)
    return np.argsort(-deg, kind="stable")[:int(np.count_nonzero(deg))]


def test_a_hub_group_closes_once_its_remote_set_reaches_the_target() -> None:
    indptr, indices = PartitionInput(STARS).undirected
    order = _order(indptr)
    assert order[:2].tolist() == [0, 1]
    # hub 0 alone: neighbours 1-6, six remote vertices
    a, dealt = _deal_hubs(indptr, indices, order, 1, 5)
    assert dealt == 1 and np.flatnonzero(a == 0).tolist() == [0]
    # target 8: hub 1 joins (no longer remote: 6 - 1 = 5) and brings leaves 7-9: 8 remote
    a, dealt = _deal_hubs(indptr, indices, order, 1, 8)
    assert dealt == 2 and np.flatnonzero(a == 0).tolist() == [0, 1]
    assert _remote(indptr, indices, {0, 1}) == 8
    # two groups of target 4: {0} (6 remote), then {1} (remote 0, 7, 8, 9)
    a, _ = _deal_hubs(indptr, indices, order, 2, 4)
    assert a[0] == 0 and a[1] == 1 and (a[2:] == -1).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(5, 40), st.integers(1, 150), st.integers(1, 4), st.integers(1, 30), st.integers(0, 10_000))
def test_every_closed_hub_group_is_the_shortest_degree_prefix_reaching_the_target(
        n: int, m: int, groups: int, target: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = make_graph(n, rng.integers(0, n, size=(m, 2)).tolist(), undirected=True)
    indptr, indices = PartitionInput(g).undirected
    order = _order(indptr)
    a, dealt = _deal_hubs(indptr, indices, order, groups, target)
    assert sorted(np.flatnonzero(a >= 0).tolist()) == sorted(order[:dealt].tolist())
    pos = 0
    for k in range(groups):
        members = [int(v) for v in order[pos:dealt] if a[v] == k]
        assert members == order[pos:pos + len(members)].tolist()  # consecutive in degree order
        pos += len(members)
        if not members:
            break
        closed = _remote(indptr, indices, set(members)) >= target
        # a closed group reached the target only with its last member; an open one is the last group
        assert closed or pos == len(order)
        if closed:
            assert _remote(indptr, indices, set(members[:-1])) < target


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 4), min_size=1, max_size=60), st.integers(1, 5))
def test_the_fill_levels_the_part_sizes(labels: list[int], parts: int) -> None:
    a = np.array([min(x, parts - 1) for x in labels], dtype=np.int64)
    before = np.bincount(a[a >= 0], minlength=parts)
    free = int(np.count_nonzero(a < 0))
    _fill_evenly(a, parts)
    after = np.bincount(a, minlength=parts)
    assert (a >= 0).all() and after.sum() == before.sum() + free
    got = after > before
    # every part that got vertices ends at most one above the smallest part, and no part was skipped
    # while it was more than one below a part that got some
    if got.any():
        assert after[got].max() <= after.min() + 1


def test_hub_parts_hold_the_highest_degree_vertices_and_the_best_round() -> None:
    g = rmat(6000, deg=8, seed=0)
    inp = PartitionInput(g)
    assignment, stats = hub_split(inp, 8, seed=0)
    indptr, indices = inp.undirected
    deg = np.diff(indptr)
    hub_parts = stats["hub_parts"]
    assert hub_parts == 6 and stats["core_parts"] == 2
    hubs = (assignment < hub_parts) & (deg > 0)
    assert int(hubs.sum()) == stats["hubs"]
    assert deg[hubs].min() >= deg[~hubs].max()  # dealt in degree order
    sizes = compute_stats(g, assignment, 1).remote
    best = min(stats["rounds"], key=lambda r: (r["max_remote"], r["sum_remote"]))
    assert (int(sizes.max()), int(sizes.sum())) == (best["max_remote"], best["sum_remote"])
    counts = np.bincount(assignment, minlength=8)
    isolated_in = np.unique(assignment[deg == 0])
    assert len(isolated_in) and counts[isolated_in].max() <= counts.min() + 1  # isolated ones level the counts


@pytest.mark.parametrize("parts", [4, 8])
def test_g3_from_the_hub_start_beats_the_metis_starts_on_rmat(parts: int) -> None:
    g = rmat(20000, deg=10, seed=0)

    def remote(**opts: object) -> np.ndarray:
        return compute_stats(g, partition_graph(g, parts, opts.pop("method", "g3"), **opts), 1).remote

    hubs, mc, cut = remote(start="hubs"), remote(), remote(method="metis")
    assert hubs.max() / hubs.min() <= 1.10
    assert hubs.max() < mc.max() and hubs.max() < cut.max()
    assert hubs.sum() < mc.sum()


def test_core_parts_must_be_a_positive_integer() -> None:
    with pytest.raises(GnncError, match="core_parts must be a positive integer"):
        partition_graph(rmat(500, deg=4, seed=0), 4, "g3", start="hubs", core_parts=0)


def test_without_hub_parts_the_start_is_the_metis_split() -> None:
    g = rmat(2000, deg=6, seed=1)
    assignment, stats = hub_split(PartitionInput(g), 3, seed=0, core_parts=3)
    assert stats["hub_parts"] == 0 and stats["rounds"] == [] and stats["hubs"] == 0
    assert sorted(np.unique(assignment).tolist()) == [0, 1, 2]
