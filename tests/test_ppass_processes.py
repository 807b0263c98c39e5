"""Algorithm 4's workers and the statistics' edge passes spread over processes (issue 34, the products compile).

At ogbn-products' full size the compile for 8 workers spent 24 CPU s in Algorithm 4's 24 runs (3 starts x 8
workers, `hybrid_greedy.paper_run`) and ~6 in the statistics, on one of two cores. Each worker's run is its own
(its V_rep, budget and queue), so `hybrid_greedy.paper_runs` hands them to `gnnc.parallel.map_processes`; the
statistics' per-destination passes over the in-edges split by row range (`stats.compute_stats`). These tests check
that any number of processes gives the same runs, selections, statistics and plans (the thresholds forced to 0 so
that small graphs take the forked path), that a failure in a child surfaces, and that small graphs do not fork.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from conftest import EXAMPLES, fork_spy, random_graph
from test_pcomp2_algorithm4 import random_costs, random_split
from gnnc.errors import InternalError
from gnnc.passes.partition import stats as st
from gnnc.passes.planner import hybrid as hy
from gnnc.passes.planner import hybrid_greedy as hg


class _Deps:
    """The two fields `paper_runs` reads of a worker's Dependencies."""

    def __init__(self, layer: np.ndarray, vertex: np.ndarray) -> None:
        self.layer, self.vertex = layer, vertex


def _workers(n: int, e: int, world: int, seed: int, layers: int
             ) -> tuple[list[hg.InTrees], list[_Deps], hg.UnitCosts]:
    """Every worker's InTrees and dependencies (each remote in-neighbour at each layer) and unit costs on
    tests/test_pcomp2_algorithm4.py's random graph."""
    rng, src, dst, indptr, indices, part = random_split(n, e, world, seed)
    trees, deps = [], []
    for r in range(world):
        owned = part == r
        trees.append(hg.InTrees(indptr, indices, owned))
        remote = np.unique(src[owned[dst] & ~owned[src]])
        deps.append(_Deps(np.repeat(np.arange(layers), len(remote)), np.tile(remote, layers)))
    return trees, deps, random_costs(rng, n, e, layers)


def _same_run(a: hg.PaperRun, b: hg.PaperRun) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
               for f in ("rep_when", "added_rows", "added_edges", "used_after", "t_v", "t_e")) and a.t_x == b.t_x


def _forked(monkeypatch) -> list[int]:
    """Every threshold at 0 (small graphs take the processes' path); returns the list each map's item count is
    appended to where it forks."""
    monkeypatch.setattr(hg, "PARALLEL_ENTRIES", 0)
    monkeypatch.setattr(st, "PARALLEL_EDGES", 0)
    return fork_spy(monkeypatch, hg, st)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,e,world,layers", [(300, 3000, 3, 2), (2000, 24000, 4, 3), (5000, 30000, 8, 3)])
def test_runs_in_processes_equal_the_runs_here(monkeypatch, seed, n, e, world, layers) -> None:
    """Every worker's run (V_rep's levels and when each row entered, rows and edges added per layer, line 14's
    sizes), made in 2 or 3 child processes, equals the one made in this process: with no memory stop, one midway
    and one at once."""
    forks = _forked(monkeypatch)
    trees, deps, costs = _workers(n, e, world, seed, layers)
    free = hg.paper_runs(trees, deps, costs, float("inf"), layers, 1)
    assert forks == [] and any(run.used_after[-1] > 0 for run in free)
    used = max(float(run.used_after[-1]) for run in free)
    for budget in (float("inf"), used / 2, 0.0):
        here = [hg.paper_run(t, d.layer, d.vertex, costs, budget, layers) for t, d in zip(trees, deps)]
        for processes in (2, 3):
            there = hg.paper_runs(trees, deps, costs, budget, layers, processes)
            assert len(there) == world and all(_same_run(a, b) for a, b in zip(there, here)), (budget, processes)
    assert forks == [world] * 6


def test_a_packed_run_is_the_run() -> None:
    """What a child sends back (rep_when's entries below L, not the table) rebuilds the same arrays."""
    trees, deps, costs = _workers(2000, 24000, 4, 3, 3)
    for t, d in zip(trees, deps):
        run = hg.paper_run(t, d.layer, d.vertex, costs, float("inf"), 3)
        assert _same_run(hg.PaperRun.unpacked(run.packed()), run)
        assert run.rep_when.min() < 3 and len(run.packed()[2]) == int(np.count_nonzero(run.rep_when < 3))


def test_small_graphs_do_not_fork(monkeypatch) -> None:
    """Below the thresholds (PARALLEL_ENTRIES, PARALLEL_EDGES) nothing is handed to processes, whatever the count
    asked: a fork and the runs sent back cost more than they save there."""
    def refuse(*args, **kwargs):
        raise AssertionError("forked for a small graph")

    monkeypatch.setattr(hg, "map_processes", refuse)
    trees, deps, costs = _workers(2000, 24000, 4, 1, 3)
    assert sum(len(d.layer) for d in deps) < hg.PARALLEL_ENTRIES
    hg.paper_runs(trees, deps, costs, float("inf"), 3, 8)
    graph = random_graph(2000, 24000, seed=2)
    real = st.map_processes
    monkeypatch.setattr(st, "map_processes", lambda fn, items, processes: real(fn, items, 1) if len(list(items)) == 1
                        else refuse())
    st.compute_stats(graph, np.arange(graph.num_nodes) % 4, 3, processes=8)


def test_an_error_in_a_child_is_raised_here(monkeypatch) -> None:
    """A worker's run failing in a child raises its exception in the caller (the other children stopped)."""
    _forked(monkeypatch)
    trees, deps, costs = _workers(300, 3000, 4, 0, 2)
    real = hg.paper_run

    def failing(tree, layer, vertex, *args):
        if tree is trees[2]:
            raise ValueError("worker 2 failed")
        return real(tree, layer, vertex, *args)

    monkeypatch.setattr(hg, "paper_run", failing)
    with pytest.raises(ValueError, match="worker 2 failed"):
        hg.paper_runs(trees, deps, costs, float("inf"), 2, 2)


def test_a_child_killed_raises_an_internal_error(monkeypatch) -> None:
    """A child ended by a signal (the out-of-memory killer) while running a worker: gnnc's internal error."""
    _forked(monkeypatch)
    trees, deps, costs = _workers(300, 3000, 4, 0, 2)
    real = hg.paper_run
    parent = os.getpid()

    def killed(tree, layer, vertex, *args):
        if tree is trees[1] and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(tree, layer, vertex, *args)

    monkeypatch.setattr(hg, "paper_run", killed)
    with pytest.raises(InternalError, match="SIGKILL"):
        hg.paper_runs(trees, deps, costs, float("inf"), 2, 2)


@pytest.mark.parametrize("seed,n,e,parts,layers,view", [(0, 600, 9000, 4, 3, "plain"), (1, 3000, 40000, 8, 2, "plain"),
                                                       (2, 2000, 30000, 3, 4, "self_loops"),
                                                       (3, 500, 5000, 5, 1, "plain")])
def test_statistics_in_processes_equal_the_statistics_here(monkeypatch, seed, n, e, parts, layers, view) -> None:
    """Every field of PartStats, with the edge passes split by row range over 2 and 3 processes, equals the one
    computed here (each row's sums are of its own edges in their order, whatever the range). One fork for the cut
    counts and the walks of length 2 together (forking costs ~0.1 s LOADED), one more per longer walk."""
    graph = random_graph(n, e, seed=seed)
    assign = np.random.default_rng(seed).integers(0, parts, graph.num_nodes)
    want = st.compute_stats(graph, assign, layers, view, num_parts=parts)
    forks = _forked(monkeypatch)
    for processes in (2, 3):
        got = st.compute_stats(graph, assign, layers, view, num_parts=parts, processes=processes)
        for f in want.__dataclass_fields__:
            a, b = getattr(got, f), getattr(want, f)
            assert (np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype) if isinstance(b, np.ndarray) \
                else a == b, f
    assert forks == [2] * max(1, layers - 2) + [3] * max(1, layers - 2)


def test_row_ranges_cover_the_rows_once() -> None:
    """The row ranges handed to the processes: consecutive, every row once, about as many entries each."""
    indptr = np.concatenate(([0], np.cumsum(np.random.default_rng(0).integers(0, 50, 1000))))
    for pieces in (1, 2, 3, 7):
        ranges = st._row_ranges(indptr, pieces)
        assert ranges[0][0] == 0 and ranges[-1][1] == 1000 and len(ranges) == pieces
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [int(indptr[b] - indptr[a]) for a, b in ranges]
        assert max(sizes) - min(sizes) <= 100
    assert st._row_ranges(np.array([0, 5]), 4) == [(0, 1)]


@pytest.mark.parametrize("model,workers,seed", [("sage.gnn", 4, 11), ("gcn.gnn", 3, 5), ("sage.gnn", 8, 7)])
def test_hybrid_compiles_with_processes_equal_one_process(monkeypatch, model, workers, seed) -> None:
    """A hybrid compile's selection (select-hybrid's cached ids, its record) and the planner's report are the same
    with threads=2 (every worker's run and the statistics in child processes) as with threads=1."""
    import gnnc

    graph = random_graph(800, 12000, seed=seed)
    loaded = gnnc.load_model(EXAMPLES / model)
    hy._last_runs.clear()
    want = gnnc.compile(loaded, graph, workers=workers, strategy="hybrid", threads=1)
    want_planner = gnnc.compile(loaded, graph, workers=workers, threads=1)
    forks = _forked(monkeypatch)
    hy._last_runs.clear()
    got = gnnc.compile(loaded, graph, workers=workers, strategy="hybrid", threads=2)
    hy._last_runs.clear()
    got_planner = gnnc.compile(loaded, graph, workers=workers, threads=2)
    assert forks  # the runs and the statistics went to child processes
    assert got.meta.hybrid and got.meta.hybrid == want.meta.hybrid
    assert got.cached.keys() == want.cached.keys()
    for k in want.cached:
        assert all(np.array_equal(a, b) for a, b in zip(got.cached[k], want.cached[k]))
    assert got_planner.meta.planner == want_planner.meta.planner
