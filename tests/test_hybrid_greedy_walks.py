"""Algorithm 4's per-dependency subtrees read off the walks, a block at a time (issue 36).

Caching the dependency (m, v) replicates v's unfolded in-tree of depth m, which row v of
`Dependencies.walks` determines: before this change (f7ba317) `dependencies_from_stats` spelled it out as two
[layers x n, layers] tables, 145 MB each per worker for GCNII x32 on the 89,000-vertex SBM (select-hybrid
3.84 s of that compile's 10.14, 2.25 of them the kernel zeroing pages). The tables are now made a block of
rows at a time (`hybrid_greedy.subtree_tables`); what is read off them must be the floats the whole tables gave,
or the walks rule's queue (ties on t_r) and the predicted times could move.
"""
from __future__ import annotations

import dataclasses
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from gnnc.passes.planner import hybrid_greedy as hg


def old_tables(walks: np.ndarray, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The [layers x n, layers] sub_rows and sub_edges and the sub_inputs the code before built (f7ba317's
    `dependencies_from_stats`), from the same walks."""
    n = len(walks)
    rows = np.zeros((layers * n, layers))
    edges = np.zeros((layers * n, layers))
    inputs = np.zeros(layers * n)
    for m in range(layers):
        block = slice(m * n, (m + 1) * n)
        if m:
            rows[block, :m] = walks[:, m - 1::-1]
            edges[block, :m] = walks[:, m:0:-1]
        inputs[block] = walks[:, m]
    return rows, edges, inputs


def fake_stats(rng: np.random.Generator, n: int, layers: int, huge: bool = False) -> SimpleNamespace:
    """What `dependencies_from_stats` reads of a PartStats: part 0's n dependencies (all owned by part 1) and
    their in-trees' edges per depth, walks of up to ~1e30 when `huge` (a deep model's; beyond 2**53, so sums
    round)."""
    walks = rng.integers(0, 12, (n, layers)).astype(np.float64)
    if huge:
        walks = np.cumprod(np.maximum(walks, 1.0), axis=1) * rng.random((n, layers))
    walks[:, 0] = 1.0
    tree = np.zeros((n, layers))
    tree[:, 1:] = np.cumsum(walks[:, 1:], axis=1)
    return SimpleNamespace(dep_ptr=np.array([0, n, n]), dep_ids=np.sort(rng.choice(10 * n, n, replace=False)),
                           dep_subtree_edges=tree, send_matrix=np.array([[0, 0], [n, 0]]))


def random_costs(rng: np.random.Generator, layers: int) -> hg.UnitCosts:
    return hg.UnitCosts(rng.random(layers) * 1e-6, rng.random(layers) * 1e-7, rng.random(layers) * 1e-3,
                        float(rng.random() * 1e-6), rng.random(layers + 1) * 400, float(rng.random() * 8))


def tables(deps: hg.Dependencies) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sub_rows, sub_edges and sub_inputs as whole tables, from their definition (Dependencies)."""
    layers = deps.layers
    w = np.asarray(deps.walks, np.float64)[deps.walk]
    k = np.arange(layers)[None, :]
    below = k < deps.layer[:, None]
    rows = np.where(below, np.take_along_axis(w, np.clip(deps.layer[:, None] - 1 - k, 0, None), 1), 0.0)
    edges = np.where(below, np.take_along_axis(w, np.clip(deps.layer[:, None] - k, 0, None), 1), 0.0)
    return rows, edges, w[np.arange(len(w)), deps.layer]


def assert_whole_tables_floats(deps: hg.Dependencies, rows: np.ndarray, edges: np.ndarray, inputs: np.ndarray,
                               rng: np.random.Generator) -> None:
    """recompute_cost (of all dependencies, and of a mask's only), cache_memory, the masked sums of `predict` and
    `sub_inputs` of deps equal (==) the same formulas on its whole tables."""
    layers = deps.layers
    costs = random_costs(rng, layers)
    t_r = rows @ costs.t_v + edges @ costs.t_e + inputs * costs.t_x
    memory = inputs * costs.row_bytes[0] + rows @ costs.row_bytes[1:] + edges.sum(axis=1) * costs.edge_bytes
    assert np.array_equal(hg.recompute_cost(deps, costs), t_r)
    assert np.array_equal(hg.cache_memory(deps, costs), memory)
    assert np.array_equal(deps.sub_inputs, inputs)
    for mask in (rng.random(len(deps)) < 0.3, np.ones(len(deps), bool), np.arange(len(deps)) < min(len(deps), 70)):
        assert np.array_equal(hg.recompute_cost(deps, costs, where=mask), t_r[mask])  # select_paper's mu: these only
        sums = hg.subtree_sums(deps, mask)
        assert np.array_equal(sums[0], rows[mask].sum(axis=0)) and np.array_equal(sums[1], edges[mask].sum(axis=0))
        result = hg.predict([deps], costs, np.zeros((1, layers)), [mask])
        assert np.array_equal(result.recompute_rows[0], rows[mask].sum(axis=0))
        assert result.replicated_inputs[0] == inputs[mask].sum() and result.memory[0] == memory[mask].sum()


# Sizes whose whole tables' products stay below OpenBLAS's threading threshold (9,216 elements a call): above
# it the rows at the split between threads are rounded by the tail kernel too, in a whole table as in a block.
# Runs of a layer shorter and longer than 64 rows: views, and copies across a run's end.
SIZES = [(1, 1), (5, 3), (37, 5), (61, 11), (23, 19), (100, 3), (150, 7), (130, 8)]


@pytest.mark.parametrize("n,layers", SIZES)
@pytest.mark.parametrize("block_rows", [64, None])
@pytest.mark.parametrize("huge", [False, True])
def test_blocks_give_the_whole_tables_floats(monkeypatch, n: int, layers: int, block_rows: int | None,
                                             huge: bool) -> None:
    """On every prefix of the segment, the floats of f7ba317's whole tables (built by its code), with copied blocks
    of 64 rows (many, the last one short) and of the default size (one)."""
    if block_rows is not None:
        monkeypatch.setattr(hg, "TABLE_ELEMENTS", block_rows * layers)
    rng = np.random.default_rng(n * 1000 + layers)
    deps = hg.dependencies_from_stats(fake_stats(rng, n, layers, huge), 0, layers)
    rows, edges, inputs = old_tables(deps.walks, layers)
    assert np.array_equal(tables(deps)[0], rows) and np.array_equal(tables(deps)[1], edges)
    for m in range(1, layers + 1):
        k = m * n
        assert_whole_tables_floats(hg.dependencies_prefix(deps, m), rows[:k, :m], edges[:k, :m], inputs[:k], rng)


@pytest.mark.parametrize("n,layers", SIZES)
def test_blocks_of_any_walks_give_the_whole_tables_floats(monkeypatch, n: int, layers: int) -> None:
    """Dependencies whose walk rows are not consecutive (shuffled, some shared, layers of any size): copied
    blocks, equal to the whole tables of the definition."""
    monkeypatch.setattr(hg, "TABLE_ELEMENTS", 64 * layers)
    rng = np.random.default_rng(n + layers)
    walks = fake_stats(rng, n, layers, huge=True).dep_subtree_edges
    walks[:, 1:] = np.diff(walks, axis=1)
    walks[:, 0] = 1.0
    count = n * layers
    deps = hg.Dependencies(np.sort(rng.integers(0, layers, count)), rng.integers(0, 10 * n, count), walks,
                           rng.integers(0, n, count))
    assert_whole_tables_floats(deps, *tables(deps), rng)


def test_a_deep_segment_holds_no_subtree_table() -> None:
    """A 32-layer segment of 3,000 dependencies: one [layers x n, layers] table would be 24.6 MB, and the code
    before built two (and kept them for the whole span). Neither the dependencies nor Algorithm 4's costs,
    memories and predictions (the walks rule's `select`, the paper rule's mu) hold one now: the peak of the
    allocations stays under one table (13.9 MB measured; the code before: over two tables, 49 MB)."""
    layers, n = 32, 3000
    table = layers * n * layers
    rng = np.random.default_rng(7)
    stats = fake_stats(rng, n, layers, huge=True)
    costs = random_costs(rng, layers)
    tracemalloc.start()
    try:
        deps = hg.dependencies_from_stats(stats, 0, layers)
        for f in dataclasses.fields(deps):
            assert np.size(getattr(deps, f.name)) <= layers * n, f.name  # one entry per dependency at most
        hg.select([deps], costs, np.zeros((1, layers)), memory_cap=1e9)
        hg.predict([deps], costs, np.zeros((1, layers)), [np.ones(len(deps), bool)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < table * 8, peak
