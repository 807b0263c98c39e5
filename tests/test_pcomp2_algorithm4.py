"""Algorithm 4's runs without a sort of the cached elements (issue 34, the products compile's passes).

A run of popped dependencies measured below t_c is cached at once, each (level, vertex) charged to its first
popper (`hybrid_greedy.paper_run`). That was a sort of the run's elements by (element, rank), 8.3 of the passes' 35
CPU s at ogbn-products' full size; `_FirstPoppers` finds the same entries with a scratch array of the least rank
per element, where line 14's byte sums are exact in any order (whole bytes, sums below 2**53). These tests compare
whole runs against the sorting path on generated graphs, and count that the fast path sorts nothing.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph
from gnnc.passes.planner import hybrid_greedy as hg


def random_split(n: int, e: int, parts: int, seed: int
                 ) -> tuple[np.random.Generator, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random graph (R-MAT-like hubs for odd seeds) split at random into `parts`: (its generator, to draw on
    from, src, dst, the in-CSR's indptr and indices, each vertex's part)."""
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.zipf(1.7, e) - 1, n - 1) if seed % 2 else rng.integers(0, n, e)
    src = rng.integers(0, n, e)
    order = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return rng, src, dst, indptr, src[order].astype(np.int64), rng.integers(0, parts, n)


def random_costs(rng: np.random.Generator, n: int, e: int, layers: int) -> hg.UnitCosts:
    """Unit costs with t_c near the middle of the measures on a graph of n vertices and e edges."""
    deg = float(e) / n
    return hg.UnitCosts(t_v=rng.uniform(0.5, 1.5, layers), t_e=rng.uniform(0.05, 0.2, layers),
                        t_c=rng.uniform(1.0, 4.0 + deg, layers), t_x=float(rng.uniform(0.2, 1.0)),
                        row_bytes=rng.integers(4, 512, layers + 1).astype(np.float64), edge_bytes=12.0)


def _worker(n: int, e: int, parts: int, seed: int, layers: int
            ) -> tuple[hg.InTrees, np.ndarray, np.ndarray, hg.UnitCosts]:
    """Worker 0's InTrees, dependencies (every remote in-neighbour of its vertices at each layer) and unit costs
    on `random_split`'s graph."""
    rng, src, dst, indptr, indices, part = random_split(n, e, parts, seed)
    owned = part == 0
    trees = hg.InTrees(indptr, indices, owned)
    remote = np.unique(src[owned[dst] & ~owned[src]])
    layer = np.repeat(np.arange(layers), len(remote))
    vertex = np.tile(remote, layers)
    return trees, layer, vertex, random_costs(rng, n, e, layers)


def _same_runs(a: hg.PaperRun, b: hg.PaperRun) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("rep_when", "added_rows", "added_edges",
                                                                      "used_after"))


def _sorting(monkeypatch) -> None:
    """paper_run as before: each run's elements sorted to their first popper (no `_FirstPoppers`)."""
    monkeypatch.setattr(hg, "_FirstPoppers", lambda elements, ranks: None)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n,e,layers", [(300, 3000, 2), (2000, 24000, 3), (5000, 30000, 4)])
def test_a_run_without_the_sort_equals_the_sorting_one(monkeypatch, seed, n, e, layers) -> None:
    """Every field of the run (V_rep's levels and when each row entered, rows and edges added per layer, line 14's
    sizes) equal to the sorting path's, with no memory stop, with one that stops the run midway, and one that
    stops it at once."""
    trees, layer, vertex, costs = _worker(n, e, 4, seed, layers)
    free = hg.paper_run(trees, layer, vertex, costs, float("inf"), layers)
    budgets = [float("inf"), float(free.used_after[-1]) / 2, float(free.used_after[0]) / 3, 0.0]
    got = [hg.paper_run(trees, layer, vertex, costs, b, layers) for b in budgets]
    with monkeypatch.context() as m:
        _sorting(m)
        want = [hg.paper_run(trees, layer, vertex, costs, b, layers) for b in budgets]
    assert free.used_after[-1] > 0  # something was cached: the first poppers were asked for
    for b, g, w in zip(budgets, got, want):
        assert _same_runs(g, w), b


def test_a_run_with_whole_bytes_sorts_no_elements(monkeypatch) -> None:
    """The elements of a cached run are not sorted to their first popper (the sort was 8.3 of 35 CPU s of the
    products compile's passes): `_first_poppers` is not called. Fails before this change (it was, per run)."""
    trees, layer, vertex, costs = _worker(2000, 24000, 4, 3, 3)
    calls = []
    real = hg._first_poppers
    monkeypatch.setattr(hg, "_first_poppers", lambda *a: calls.append(1) or real(*a))
    run = hg.paper_run(trees, layer, vertex, costs, float("inf"), 3)
    assert run.used_after[-1] > 0 and calls == []


@pytest.mark.parametrize("row_bytes", [[4.5, 8.0, 8.0], [4.0, 8.0, 2.0 ** 60]])
def test_bytes_summed_in_order_keep_the_sort(monkeypatch, row_bytes) -> None:
    """A fraction of a byte, or sums that may reach 2**53, make line 14's sums depend on their order: the run
    keeps the sorting path (the elements' order by element), and equals it."""
    trees, layer, vertex, costs = _worker(2000, 24000, 4, 5, 2)
    costs = hg.UnitCosts(costs.t_v, costs.t_e, costs.t_c, costs.t_x, np.array(row_bytes), 12.0)
    calls = []
    real = hg._first_poppers
    monkeypatch.setattr(hg, "_first_poppers", lambda *a: calls.append(1) or real(*a))
    got = hg.paper_run(trees, layer, vertex, costs, float("inf"), 2)
    assert calls
    _sorting(monkeypatch)
    assert _same_runs(got, hg.paper_run(trees, layer, vertex, costs, float("inf"), 2))


def test_first_poppers_equal_the_sort() -> None:
    """`_FirstPoppers` chooses, per element, the entry of least rank, in the entries' order: the set the sort by
    (element, rank) keeps first of each element; its scratch array is reset between calls."""
    rng = np.random.default_rng(1)
    first = hg._FirstPoppers(5000, 3000)
    for size in (0, 1, 50, 20000):
        element = rng.integers(0, 5000, size)
        rank = rng.permutation(3000 * 8)[:size] % 3000  # repeated elements and ranks, each pair once
        pairs = np.unique(element * 3000 + rank)
        element, rank = pairs // 3000, pairs % 3000
        perm = rng.permutation(len(element))
        element, rank = element[perm], rank[perm]
        chosen = first(element, rank)
        order = hg._first_poppers(element, rank, 3000)
        keep = np.ones(len(order), dtype=bool)
        keep[1:] = element[order][1:] != element[order][:-1]
        assert np.array_equal(np.sort(np.flatnonzero(chosen)), np.sort(order[keep]))
        assert np.all(first.least == first.none)


@pytest.mark.parametrize("model,workers", [("sage.gnn", 4), ("gcn.gnn", 3)])
def test_hybrid_compiles_equal_the_sorting_path(monkeypatch, model, workers) -> None:
    """select-hybrid's selection and prediction on a compile: the same through the sorting path."""
    import gnnc
    from gnnc.passes.planner import hybrid as hy

    graph = random_graph(600, 9000, seed=11)
    loaded = gnnc.load_model(EXAMPLES / model)
    hy._last_runs.clear()
    got = gnnc.compile(loaded, graph, workers=workers, strategy="hybrid")
    _sorting(monkeypatch)
    hy._last_runs.clear()
    want = gnnc.compile(loaded, graph, workers=workers, strategy="hybrid")
    assert got.meta.hybrid and got.meta.hybrid == want.meta.hybrid
    assert got.cached.keys() == want.cached.keys()
    for k in want.cached:
        assert all(np.array_equal(a, b) for a, b in zip(got.cached[k], want.cached[k]))


def test_a_worker_s_in_degrees_are_made_once() -> None:
    """Every measure and run of a worker reads the same in-degrees: one read-only array per InTrees, not an
    np.diff of the whole CSR per measure (57 at products' size). Fails before this change (a new array each read)."""
    trees, layer, vertex, costs = _worker(300, 3000, 4, 0, 2)
    deg = trees.in_degree
    assert deg is trees.in_degree and not deg.flags.writeable
    assert np.array_equal(deg, np.diff(trees.indptr))
    hg.paper_run(trees, layer, vertex, costs, float("inf"), 2)
    assert trees.in_degree is deg


def test_the_workers_share_one_in_degree_array() -> None:
    """select-hybrid's workers read one in-degree array (8 per-worker copies were +0.1 GiB on the products
    compile's peak), equal to each one's own."""
    graph = random_graph(400, 5000, seed=2)
    parts = np.arange(400) % 4
    trees = hg.workers_trees(graph, "plain", parts, 4)
    assert len(trees) == 4 and all(t.in_degree is trees[0].in_degree for t in trees)
    for r, t in enumerate(trees):
        alone = hg.in_trees(graph, "plain", parts, r)
        assert np.array_equal(t.in_degree, alone.in_degree) and np.array_equal(t.owned, alone.owned)
        assert all(np.array_equal(getattr(t, f), getattr(alone, f)) for f in ("indptr", "indices"))
