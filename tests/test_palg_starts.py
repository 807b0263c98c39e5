"""Every span start's Algorithm 4 runs in one pool of processes, the longest first (issue 34, the products compile).

The planner runs Algorithm 4 once per span start and worker (`hybrid_greedy.paper_run`); at ogbn-products' size
the 3 starts x 8 workers took 25 CPU s, each start's 8 runs forked apart, so a core waited at the end of every
start for the other's last run, and the parent counted each start's traffic between the forks. Now
`hybrid_greedy.starts_runs` makes every start's runs in one `map_processes` call, longest predicted first, each
start's StartTraffic counted beside its runs, and the planner keeps only the runs' totals but for the last start's.
These tests check that the runs, the traffic and the planner's selections are the same as one start at a time in
this process, that one fork serves every start, the order the runs are handed out in, and what is kept.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph
from test_ppass_processes import _forked, _same_run, _workers
from gnnc.passes.planner import hybrid as hy
from gnnc.passes.planner import hybrid_greedy as hg

# GraphSAGE of 3 layers: spans from 3 starts
SAGE3 = (EXAMPLES / "sage.gnn").read_text().replace(
    "  h = SAGE(hidden, classes)(h)", "  h = SAGE(hidden, hidden)(h)\n  h = relu(h)\n  h = SAGE(hidden, classes)(h)")


class _Deps:
    """The two fields a run reads of a worker's Dependencies, the first entries of a longer start's."""

    def __init__(self, layer: np.ndarray, vertex: np.ndarray) -> None:
        self.layer, self.vertex = layer, vertex


def _jobs(seed: int, n: int, e: int, world: int) -> tuple[list[hg.InTrees], list[hg.StartJob]]:
    """Three starts on one graph, their longest spans 1, 3 and 2 layers (the shortest first), each its own costs
    and budget."""
    trees, deps, _ = _workers(n, e, world, seed, 3)
    rng = np.random.default_rng(seed)
    from test_pcomp2_algorithm4 import random_costs

    jobs = []
    for layers, budget in ((1, float("inf")), (3, float("inf")), (2, 0.0)):
        costs = random_costs(rng, n, e, layers)
        mine = [_Deps(d.layer[d.layer < layers], d.vertex[d.layer < layers]) for d in deps]
        jobs.append(hg.StartJob(mine, costs, budget, layers))
    return trees, jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n,e,world", [(300, 3000, 3), (3000, 30000, 8)])
def test_every_start_in_one_fork_equals_each_start_here(monkeypatch, seed, n, e, world) -> None:
    """Every start's runs made by one map over 2 or 3 processes (one fork for all the starts, not one per start)
    equal the runs made here one start after another. Fails before this change (no starts_runs; a fork per start)."""
    forks = _forked(monkeypatch)
    trees, jobs = _jobs(seed, n, e, world)
    here = [[hg.paper_run(t, d.layer, d.vertex, job.costs, job.budget, job.layers) for t, d in zip(trees, job.deps)]
            for job in jobs]
    assert any(run.used_after[-1] > 0 for run in here[1])
    for processes in (2, 3):
        got = hg.starts_runs(trees, jobs, processes)
        assert [traffic for _, traffic in got] == [None] * 3
        assert all(_same_run(a, b) for (runs, _), want in zip(got, here) for a, b in zip(runs, want))
    assert forks == [3 * world] * 2
    # one start: paper_runs, the same runs
    assert all(_same_run(a, b) for a, b in zip(hg.paper_runs(trees, jobs[1].deps, jobs[1].costs, float("inf"), 3, 2),
                                               here[1]))


def test_the_longest_runs_are_handed_out_first(monkeypatch) -> None:
    """The runs go to the processes by predicted length, longest first: the runs of more layers first, among
    those the workers of more dependency entries, ties in the jobs' order; the results come back in the jobs' and
    workers' order whatever the order they were made in. Fails before this change (each start's workers in order)."""
    _forked(monkeypatch)
    trees, jobs = _jobs(0, 3000, 30000, 8)
    handed: list[list[int]] = []
    real = hg.map_processes

    def spy(fn, items, processes, threads_each=1):
        handed.append(list(items))
        return real(fn, items, processes, threads_each)

    monkeypatch.setattr(hg, "map_processes", spy)
    got = hg.starts_runs(trees, jobs, 2)
    items = [(j, r) for j, job in enumerate(jobs) for r in range(len(job.deps))]
    [order] = handed
    assert sorted(order) == list(range(len(items)))
    layers = [jobs[items[i][0]].layers for i in order]
    assert layers == sorted(layers, reverse=True) and layers[0] == 3 and layers[-1] == 1
    for a, b in zip(order, order[1:]):
        (ja, ra), (jb, rb) = items[a], items[b]
        if ja == jb:
            assert len(jobs[ja].deps[ra].layer) >= len(jobs[jb].deps[rb].layer)
    for (runs, _), job in zip(got, jobs):
        assert all(run.rep_when.shape[0] == job.layers + 1 for run in runs)
        for t, d, run in zip(trees, job.deps, runs):
            assert _same_run(run, hg.paper_run(t, d.layer, d.vertex, job.costs, job.budget, job.layers))


def _planning(seed: int, workers: int, tmp_path):
    """A 3-layer GraphSAGE's statistics, inputs and shapes on a random graph split at random."""
    from gnnc import api
    from gnnc.cluster import preset
    from gnnc.passes.cost.inputs import planning_inputs

    graph = random_graph(1500, 24000, seed=seed)
    parts = np.random.default_rng(seed).integers(0, workers, graph.num_nodes)
    model = tmp_path / "sage3.gnn"
    model.write_text(SAGE3)
    profile = preset("neutronstar-ecs")
    program = api.compile(api.load_model(model), graph).program
    stats, inputs, shapes = planning_inputs(program, graph, parts, profile)
    return graph, parts, profile, stats, inputs, shapes


@pytest.mark.parametrize("seed,workers", [(3, 4), (5, 8)])
def test_traffic_counted_beside_each_run_equals_the_start_s(monkeypatch, tmp_path, seed, workers) -> None:
    """A start's StartTraffic counted worker by worker where each run is made (in child processes) equals
    `start_traffic` of the start's runs here; the runs' totals give the same V_rep per prefix as the runs.
    Fails before this change (no StartJob, no RunTotals)."""
    graph, parts, _, stats, _, _ = _planning(seed, workers, tmp_path)
    trees = hg.workers_trees(graph, stats.view, parts, workers)
    deps = [hg.dependencies_from_stats(stats, r, 3) for r in range(workers)]
    assert all(d.owner is not None for d in deps)
    rng = np.random.default_rng(seed)
    from test_pcomp2_algorithm4 import random_costs

    jobs = []
    for layers in (3, 2, 1):
        mine = [hg.dependencies_prefix(d, layers) for d in deps]
        jobs.append(hg.StartJob(mine, random_costs(rng, graph.num_nodes, graph.num_edges, layers), float("inf"), layers,
                                whole=False, traffic=True))
    here = [[hg.paper_run(t, d.layer, d.vertex, job.costs, job.budget, job.layers) for t, d in zip(trees, job.deps)]
            for job in jobs]
    forks = _forked(monkeypatch)
    for processes in (1, 2):
        got = hg.starts_runs(trees, jobs, processes)
        for (totals, traffic), runs, job in zip(got, here, jobs):
            want = hg.start_traffic(job.deps, runs)
            assert np.array_equal(traffic.fetched, want.fetched) and traffic.fetched.dtype == want.fetched.dtype
            assert np.array_equal(traffic.sent, want.sent)
            assert all(isinstance(t, hg.RunTotals) for t in totals)
            assert not any(isinstance(t, hg.PaperRun) for t in totals)  # no rep_when table sent back or held
            for t, run in zip(totals, runs):
                assert t.t_x == run.t_x and all(np.array_equal(getattr(t, f), getattr(run, f)) for f in
                                                ("added_rows", "added_edges", "used_after", "t_v", "t_e"))
                for m in range(job.layers + 1):
                    a, b = t.replicated(m), run.replicated(m)
                    assert np.array_equal(a.rows, b.rows) and np.array_equal(a.edges, b.edges)
                    assert (a.memory, a.time) == (b.memory, b.time)
    assert forks == [3 * workers]


def test_the_planner_forks_once_and_keeps_the_last_start_whole(monkeypatch, tmp_path) -> None:
    """select_spans over spans of 3 starts: one fork for every start's runs, the same selections as in one process
    (and as select_spans one start at a time); the next select of the last start's span reads its runs whole off
    `_last_runs` (no run again) and selects what a fresh run selects. Fails before this change (a fork per start)."""
    graph, parts, profile, stats, inputs, shapes = _planning(7, 4, tmp_path)
    cap = profile.memory_per_worker
    spans = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    hy._last_runs.clear()
    want = hy.select_spans(stats, inputs, shapes, cap, spans, graph=graph, parts=parts, processes=1)
    apart = []
    for start in (0, 1, 2):
        hy._last_runs.clear()
        apart += hy.select_spans(stats, inputs, shapes, cap, [s for s in spans if s[0] == start], graph=graph,
                                 parts=parts, processes=1)
    forks = _forked(monkeypatch)
    hy._last_runs.clear()
    got = hy.select_spans(stats, inputs, shapes, cap, spans, graph=graph, parts=parts, processes=2)
    assert forks == [12]
    for a, b, c in zip(got, want, apart):
        for other in (b, c):
            assert (a.source, a.time, a.value.time, a.value.memory) == (other.source, other.time, other.value.time,
                                                                         other.value.memory)
            assert np.array_equal(a.received, other.received)
            assert a.values.keys() == other.values.keys() if a.values else a.values == other.values
    [kept] = hy._last_runs
    assert kept.start == 2 and all(isinstance(run, hg.PaperRun) for run in kept.runs)
    runs = []
    real = hg.paper_run
    monkeypatch.setattr(hg, "paper_run", lambda *a, **k: runs.append(1) or real(*a, **k))
    reused = hy.select(stats, inputs, shapes, cap, 2, 3, graph=graph, parts=parts, processes=2)
    assert runs == [] and forks == [12]
    hy._last_runs.clear()
    fresh = hy.select(stats, inputs, shapes, cap, 2, 3, graph=graph, parts=parts, processes=1)
    assert len(runs) == 4
    assert (reused.source, reused.time) == (fresh.source, fresh.time)
    assert all(np.array_equal(x, y) for k in fresh.cached for x, y in zip(reused.cached[k], fresh.cached[k]))


def test_small_starts_together_do_not_fork(monkeypatch) -> None:
    """Below PARALLEL_ENTRIES dependency entries over every start of the call, nothing is handed to processes."""
    def refuse(*args, **kwargs):
        raise AssertionError("forked for a small graph")

    monkeypatch.setattr(hg, "map_processes", refuse)
    trees, jobs = _jobs(1, 2000, 24000, 4)
    assert sum(len(d.layer) for job in jobs for d in job.deps) < hg.PARALLEL_ENTRIES
    got = hg.starts_runs(trees, jobs, 8)
    assert [len(runs) for runs, _ in got] == [4, 4, 4]


def test_no_spans_select_nothing(tmp_path) -> None:
    """select_spans of no span runs nothing and selects nothing (as before: the starts are found from the spans)."""
    graph, parts, profile, stats, inputs, shapes = _planning(3, 4, tmp_path)
    hy._last_runs.clear()
    assert hy.select_spans(stats, inputs, shapes, profile.memory_per_worker, [], graph=graph, parts=parts,
                           processes=2) == []
    assert hy._last_runs == []
