"""The products-size compile's two largest gathers read most edges through masks, with the same results (issue 34).

A depcache rank's structure (gnnc.plan.rows._view) takes the in-edges of rows holding nearly every edge of the
graph, and Algorithm 4's first hop from a worker's dependencies (gnnc.passes.planner.hybrid_greedy._expand) reads
most of the graph's in-edges to keep a few percent: both built int64/int32 positions of every entry they read.
They now read runs of ascending rows through a mask over the entries (`rows._entry_pieces`) and join only the kept
in-neighbours to their pairs. The differential tests compare with the positions (or the code before, copied here
as the reference); the work tests fail on 85302cb (`_entries` given a rank's whole rows; `_expand`'s peak 26 bytes
per entry read, 12 now)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph


def _csr(n: int, e: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random in-CSR of n rows and e entries, some rows empty, a few heavy (R-MAT-like)."""
    rng = np.random.default_rng(seed)
    dst = np.minimum(rng.zipf(1.6, e) - 1, n - 1) if seed % 2 else rng.integers(0, n, e)
    dst = np.sort(dst)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, rng.integers(0, n, int(indptr[-1])).astype(np.int64)


def _segment_rows(n: int, rng: np.random.Generator, runs: int, share: float) -> np.ndarray:
    """Rows as a segment's order lays them: `runs` groups (owned, then each depth), each ascending by id."""
    held = np.flatnonzero(rng.random(n) < share)
    group = rng.integers(0, runs, len(held))
    return held[np.lexsort((held, group))]


@pytest.mark.parametrize("seed", range(6))
def test_entry_pieces_equal_the_positions(seed) -> None:
    from gnnc.plan.rows import _entries, _entry_pieces

    n = 300
    indptr, indices = _csr(n, 5000, seed)
    values = np.arange(len(indices)) * 7 + 3
    rng = np.random.default_rng(100 + seed)
    cases = [_segment_rows(n, rng, runs, share) for runs in (1, 2, 4) for share in (0.05, 0.5, 0.95, 1.0)]
    cases += [np.zeros(0, np.int64), rng.permutation(n), np.arange(n)[::-1].copy(), np.array([5, 5, 5, 2])]
    for rows in cases:
        want = values[_entries(indptr, rows)]
        got = np.full(len(want), -1)
        pieces = _entry_pieces(indptr, rows)
        covered = 0
        for lo, hi, at in pieces:
            assert at.dtype == bool or at.dtype.kind == "i"
            got[lo:hi] = values[:len(at)][at] if at.dtype == bool else values[at]
            covered += hi - lo
        assert covered == len(want) and np.array_equal(got, want)


def test_a_depcache_rank_builds_no_positions_for_its_wide_rows(monkeypatch) -> None:
    """A depcache rank of GraphSAGE on a dense random graph holds (nearly) every row: its structure's
    entries are read through masks, `_entries` only for runs of rows holding few edges (before: given the whole
    rows, positions of every edge, per rank)."""
    import gnnc
    from gnnc.plan import rows as rows_mod
    from gnnc.plan import shards

    graph = random_graph(600, 12000, seed=5)
    world = 4
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "sage.gnn"), graph, workers=world,
                        strategy="depcache")
    parts = np.asarray(plan.parts)
    specs = rows_mod.layer_specs(plan.program)
    sets = rows_mod.all_row_sets(graph, parts, world, specs)
    entries = rows_mod._entries
    given: list[int] = []
    monkeypatch.setattr(rows_mod, "_entries", lambda p, r: given.append(len(r)) or entries(p, r))
    arrays = shards.rank_arrays(graph, parts, 0, world, specs, sets, False, False, False, narrow=True)[0]
    widest = max(int(np.count_nonzero(held)) for held in sets[0].held_out)
    assert widest > 0.9 * graph.num_nodes
    assert max(given, default=0) < 0.5 * graph.num_nodes, (given, widest)
    # and the same arrays as the positions give (no run read through a mask)
    monkeypatch.setattr(rows_mod, "MASK_WALK", 2.0)
    again = shards.rank_arrays(graph, parts, 0, world, specs, sets, False, False, False, narrow=True)[0]
    assert arrays.keys() == again.keys()
    for k in arrays:
        assert arrays[k].dtype == again[k].dtype and np.array_equal(arrays[k], again[k]), k


@pytest.mark.parametrize("model,strategy", [("sage", "depcache"), ("gcn", "hybrid"), ("gat", "depcomm")])
def test_rank_arrays_through_masks_equal_through_positions(monkeypatch, model, strategy) -> None:
    import gnnc
    from gnnc.graph.sampling import reads_edge_ids
    from gnnc.plan import rows as rows_mod
    from gnnc.plan import shards

    graph = random_graph(400, 8000, seed=2)
    world = 3
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / f"{model}.gnn"), graph, workers=world, strategy=strategy)
    parts = np.asarray(plan.parts)
    specs = rows_mod.layer_specs(plan.program)
    sets = rows_mod.all_row_sets(graph, parts, world, specs, plan.cached if strategy == "hybrid" else None)
    ids = any(reads_edge_ids(layer) for layer in plan.program.graph_layers())
    for narrow in (False, True):
        got = [shards.rank_arrays(graph, parts, r, world, specs, sets, False, ids, True, narrow=narrow)
               for r in range(world)]
        with monkeypatch.context() as m:
            m.setattr(rows_mod, "MASK_WALK", 2.0)
            want = [shards.rank_arrays(graph, parts, r, world, specs, sets, False, ids, True, narrow=narrow)
                    for r in range(world)]
        for (a, la), (b, lb) in zip(got, want):
            assert la == lb and a.keys() == b.keys()
            for k in a:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _expand_reference(trees, dep: np.ndarray, vtx: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """hybrid_greedy._expand as 85302cb wrote it (positions of every entry read, every pair joined)."""
    from gnnc.graph import sorted_unique

    n = trees.num_nodes
    lo = trees.indptr[vtx]
    counts = trees.indptr[vtx + 1] - lo
    total = int(counts.sum())
    keys = [(dep * n + vtx)[~excluded[vtx]]]
    if total:
        starts = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        src = trees.indices[starts + np.arange(total)]
        keys.append((np.repeat(dep * n, counts) + src)[~excluded[src]])
    return sorted_unique(np.concatenate(keys))


@pytest.mark.parametrize("seed", range(8))
def test_expand_equals_the_reference(seed) -> None:
    from gnnc.passes.planner import hybrid_greedy as hg

    n = 400
    indptr, indices = _csr(n, 8000, seed)
    rng = np.random.default_rng(seed)
    trees = hg.InTrees(indptr, indices, rng.random(n) < 0.25)
    _expand_matches_the_reference(trees, rng, (0.02, 0.3, 0.9), (0.0, 0.5, 0.97), empty=True)


def _expand_matches_the_reference(trees, rng: np.random.Generator, shares: tuple[float, ...],
                                  excluded_shares: tuple[float, ...], empty: bool) -> None:
    """`_expand` equals `_expand_reference` for pairs of distinct, repeated (and, with `empty`, no) vertices taking
    each of `shares` of the vertices, with each of `excluded_shares` of the vertices (and the owned) excluded."""
    from gnnc.passes.planner import hybrid_greedy as hg

    n = trees.num_nodes
    for share in shares:
        distinct = np.flatnonzero(rng.random(n) < share)
        rng.shuffle(distinct)
        repeated = rng.choice(distinct, 2 * len(distinct)) if len(distinct) else distinct
        for vtx in (distinct, repeated) + ((np.zeros(0, np.int64),) if empty else ()):
            dep = np.sort(rng.integers(0, max(len(vtx), 1), len(vtx))).astype(np.int64)
            for p_excluded in excluded_shares:
                excluded = (rng.random(n) < p_excluded) | trees.owned
                want = _expand_reference(trees, dep, vtx, excluded)
                got = hg._expand(trees, dep, vtx, excluded)
                assert got.dtype == want.dtype and np.array_equal(got, want), (share, p_excluded)


def test_expand_of_most_edges_holds_no_positions() -> None:
    """The first hop from a worker's distinct dependencies reading most in-edges and keeping few: its peak is a
    mask byte and the sources read per entry (85302cb: positions, sources and joined keys, 26 bytes per entry; 12 now)."""
    per_read = _expand_peak_per_read(seed=0, excluded_share=0.9, transpose=False)
    assert per_read < 16, per_read


def _expand_peak_per_read(seed: int, excluded_share: float, transpose: bool) -> float:
    """The traced peak of one `_expand` per in-edge its pairs hold, for distinct dependencies holding most in-edges
    of a 2M-edge graph (the first hop on the products-like R-MAT), after checking its keys against the reference;
    `transpose`: the trees hold the in-CSR's transpose (a store's)."""
    from gnnc.passes.planner import hybrid_greedy as hg

    n, e = 20_000, 2_000_000
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    trees = hg.InTrees(indptr, rng.integers(0, n, e).astype(np.int64), rng.random(n) < 0.125)
    if transpose:
        trees = _with_transpose(trees)
    vtx = np.flatnonzero(rng.random(n) < 0.7)
    dep = np.arange(len(vtx), dtype=np.int64)
    excluded = trees.owned | (rng.random(n) < excluded_share)
    read = int((indptr[vtx + 1] - indptr[vtx]).sum())
    tracemalloc.start()
    got = hg._expand(trees, dep, vtx, excluded)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(got, _expand_reference(trees, dep, vtx, excluded))
    return peak / read


def test_paper_runs_through_masks_equal_through_positions(monkeypatch) -> None:
    """Algorithm 4's runs (select-hybrid's selection and prediction) on a compile where the first hop reads most
    edges: the same with every expansion by positions."""
    import gnnc
    from gnnc.passes.planner import hybrid_greedy as hg

    graph = random_graph(500, 10000, seed=7)
    model = gnnc.load_model(EXAMPLES / "sage.gnn")
    got = gnnc.compile(model, graph, workers=4, strategy="hybrid")
    monkeypatch.setattr(hg, "MASK_WALK", 2.0)
    from gnnc.passes.planner import hybrid as hy
    hy._last_runs.clear()
    want = gnnc.compile(model, graph, workers=4, strategy="hybrid")
    assert got.meta.hybrid and got.meta.hybrid == want.meta.hybrid
    assert got.cached.keys() == want.cached.keys()
    for k in want.cached:
        assert all(np.array_equal(a, b) for a, b in zip(got.cached[k], want.cached[k]))


def _with_transpose(trees):
    """`trees` with its in-CSR's transpose (the edges by source), as `in_trees` takes a store's."""
    from gnnc.passes.planner import hybrid_greedy as hg

    n = trees.num_nodes
    dst = np.repeat(np.arange(n), np.diff(trees.indptr))
    order = np.argsort(trees.indices, kind="stable")
    out_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(trees.indices, minlength=n), out=out_indptr[1:])
    return hg.InTrees(trees.indptr, trees.indices, trees.owned, out_indptr, dst[order].astype(np.int64))


@pytest.mark.parametrize("seed", range(8))
def test_expand_from_the_sources_equals_the_reference(seed) -> None:
    """With the transpose, a hop whose free vertices hold fewer out-edges than its pairs' in-edges is read from
    the sources' side: the same keys as 85302cb's `_expand`, for distinct and repeated pair vertices."""
    from gnnc.passes.planner import hybrid_greedy as hg

    n = 400
    indptr, indices = _csr(n, 8000, seed)
    rng = np.random.default_rng(50 + seed)
    trees = _with_transpose(hg.InTrees(indptr, indices, rng.random(n) < 0.25))
    _expand_matches_the_reference(trees, rng, (0.05, 0.4, 0.95), (0.0, 0.6, 0.98), empty=False)


def test_expand_from_the_sources_reads_their_few_edges() -> None:
    """Dependencies holding most in-edges and few free vertices left (the first hop on the products-like R-MAT):
    read from the sources' side, the peak is the free vertices' out-edges, not the dependencies' in-edges
    (85302cb: 26 bytes per in-edge; InTrees held no transpose)."""
    per_read = _expand_peak_per_read(seed=1, excluded_share=0.98, transpose=True)
    assert per_read < 4, per_read  # 1.3 here; 12 through the mask, 26 on 85302cb


def test_a_store_gives_algorithm_4_its_transpose(tmp_path) -> None:
    """`in_trees` on a store (which maps the plain CSR's transpose) holds it; on the self_loops view, none."""
    from gnnc.graph.store import open_store, write_store
    from gnnc.passes.planner import hybrid_greedy as hg

    graph = random_graph(300, 3000, seed=4)
    write_store(graph, tmp_path / "store")
    stored = open_store(tmp_path / "store")
    parts = np.arange(stored.num_nodes) % 3
    trees = hg.in_trees(stored, "plain", parts, 1)
    assert trees.out_indptr is not None and trees.out_indices is not None
    back = _with_transpose(hg.InTrees(trees.indptr, trees.indices, trees.owned))
    assert np.array_equal(trees.out_indptr, back.out_indptr)
    for v in range(stored.num_nodes):  # the same sources' out-neighbours (each row's order may differ)
        a, b = trees.out_indptr[v], trees.out_indptr[v + 1]
        assert sorted(trees.out_indices[a:b]) == sorted(back.out_indices[a:b])
    assert hg.in_trees(stored, "self_loops", parts, 1).out_indptr is None


def test_the_queue_sorts_the_roots_by_vertex_once_per_run(monkeypatch) -> None:
    """Algorithm 4's queue (line 9) pops by (t_r, vertex id): each layer's roots are the same vertices, so they are
    sorted by id once per run and each layer's keys stably on that order, no np.lexsort per layer (85302cb: one
    per layer and run); the same selection as before (tests/test_reference_plans.py, and the order itself below)."""
    import gnnc
    from gnnc.passes.planner import hybrid as hy

    graph = random_graph(500, 6000, seed=9)
    from gnnc.passes.planner import hybrid_greedy as hg

    calls = {"lexsort": 0, "inside": False}
    lexsort = np.lexsort
    runs = []
    real_run = hg.paper_run

    def run(*a):
        runs.append(1)
        calls["inside"] = True
        try:
            return real_run(*a)
        finally:
            calls["inside"] = False

    def counted(keys, *a, **k):
        calls["lexsort"] += calls["inside"]
        return lexsort(keys, *a, **k)

    monkeypatch.setattr(hg, "paper_run", run)
    monkeypatch.setattr(np, "lexsort", counted)
    hy._last_runs.clear()
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4, strategy="hybrid")
    assert runs and calls["lexsort"] == 0, (len(runs), calls)  # in Algorithm 4's runs
    rng = np.random.default_rng(0)
    for ties in (1, 5, 1000):
        roots = rng.permutation(5000)[:3000]
        key = rng.integers(0, ties, 3000) * 0.25
        by_vertex = np.argsort(roots, kind="stable")
        assert np.array_equal(by_vertex[np.argsort(key[by_vertex], kind="stable")], lexsort((roots, key)))
