"""An exchange's layer pays for its halo's buffers whatever rows it moves (issue 36 item 5).

A Hybrid selection that caches every dependency exchanges no row, yet its layers run the halo and the aggregation
split around it (gnnc.runtime.parts, gnnc.runtime.comm): the output summed part by part into a zero-filled buffer,
and in backward the held rows' gradient zero-filled and added to their other gradient. DepCache runs none of it.
Priced as equal, Hybrid won near-ties against DepCache and measured slower (GIN on the emulated cluster); the
formulas now carry `compute.halo_buffers` over the rows each layer computes, for DepComm and Hybrid alike.
"""
from __future__ import annotations

import random

import pytest
import sympy

from gnnc.passes.cost.compute import halo_buffers
from gnnc.passes.cost.neutronstar import depcache, depcomm, hybrid
from gnnc.passes.cost.symbols import (B, S, T_copy_b, T_copy_f, V, LayerShape, comm_rows, comm_sent, d,
                                      recompute_edges, recompute_rows)


def _numeric(expr: sympy.Expr, fixed: dict) -> float:
    rng = random.Random(0)
    values = {s: fixed.get(s, rng.uniform(1.0, 2.0) if s not in (T_copy_b, T_copy_f) else 1e-9)
              for s in expr.free_symbols}
    for s, v in fixed.items():
        values[s] = v
    return float(expr.xreplace(values))


def _copy_share(expr: sympy.Expr, fixed: dict, rate: sympy.Symbol) -> float:
    """Seconds of `expr` at the copy rate `rate` (its value at 1 ns per element less its value at 0)."""
    return _numeric(expr, {**fixed, rate: 1e-9}) - _numeric(expr, {**fixed, rate: 0.0})


def test_an_empty_hybrid_halo_still_costs_its_buffers() -> None:
    shape = LayerShape(gemm_first=False)  # aggregation first (GIN's, SAGE's); its input needs a gradient
    cost = hybrid(1, 2, [shape])
    fwd, bwd = cost.stages[0], cost.stages[-1]
    rows, width = 5000.0, 64.0
    nothing_moves = {comm_rows(1): 0.0, comm_sent(1): 0.0, recompute_rows(1): 1000.0, recompute_edges(1): 0.0,
                     V: rows, d(1): width}
    # forward: the split aggregation's output buffer over the rows the layer computes (own and recomputed)
    assert _copy_share(fwd, nothing_moves, T_copy_f) == pytest.approx(1e-9 * (rows + 1000.0) * width, rel=1e-6)
    # backward: the held rows' gradient zero-filled, then added to their other gradient
    assert _copy_share(bwd, nothing_moves, T_copy_b) == pytest.approx(1e-9 * 2 * (rows + 1000.0) * width, rel=1e-6)
    assert _numeric(halo_buffers(V, d(1), True, "b"), {V: rows, d(1): width, T_copy_b: 1e-9}) == pytest.approx(
        2 * rows * width * 1e-9)
    assert halo_buffers(V, d(1), False, "b") == 0  # a layer reading the inputs sends no gradient back


def test_depcomm_pays_the_same_buffers_beside_its_rows_moved_and_depcache_none() -> None:
    shape = LayerShape(gemm_first=False)
    cost = depcomm(1, shape)
    rows, width = 5000.0, 64.0
    fixed = {S: 0.0, B: 0.0, V: rows, d(1): width}
    assert _copy_share(cost.stages[0], fixed, T_copy_f) == pytest.approx(1e-9 * rows * width, rel=1e-6)
    assert _copy_share(cost.stages[-1], fixed, T_copy_b) == pytest.approx(1e-9 * 2 * rows * width, rel=1e-6)
    # DepCache has no halo inside a segment: no copy at all
    assert T_copy_f not in depcache(0, 2, [LayerShape(gemm_first=False, input_grad=False), shape]).free_symbols


def test_a_cache_all_hybrid_is_depcache_with_its_empty_halo() -> None:
    """Hybrid caching every dependency runs DepCache's rows and each layer's halo, empty (session 25): priced as
    DepCache plus `halo_buffers` over the rows each layer computes (HV_{k-1-m}); the old model priced it as
    DepCache exactly (the difference below was 0), and on the extended grid it measured slower than DepCache in
    11 of 12 pairs (benchmarks/RESULTS-planner-extended.md, "Session 25 (PRICE)")."""
    from gnnc.passes.cost.symbols import hop_vertices

    shapes = [LayerShape(gemm_first=False, input_grad=False), LayerShape(gemm_first=False)]
    plain, with_halo = depcache(0, 2, shapes), depcache(0, 2, shapes, halo=True)
    rows = {hop_vertices(1): 3000.0, hop_vertices(0): 1000.0, d(0): 32.0, d(1): 16.0}  # HV_0: the owned rows
    # layer 0 (reads x: no gradient back) forward over its HV_1 output rows, layer 1 forward and backward over V
    fwd = _copy_share(with_halo.stages[0], rows, T_copy_f) - _copy_share(plain.stages[0], rows, T_copy_f)
    bwd = _copy_share(with_halo.stages[1], rows, T_copy_b) - _copy_share(plain.stages[1], rows, T_copy_b)
    assert fwd == pytest.approx(1e-9 * (3000.0 * 32.0 + 1000.0 * 16.0), rel=1e-4)
    assert bwd == pytest.approx(1e-9 * 2 * 1000.0 * 16.0, rel=1e-4)  # a difference of sums: rounding


def test_the_planner_and_the_schedule_price_a_cache_all_selection_with_its_halo() -> None:
    """hybrid.select's cache-all candidate (its value, `DepcacheSpans(halo=True)`, and its formula) and the schedule
    pass's formula of such a segment (scheduled.segment_formula) are `depcache(halo=True)`, above DepCache's."""
    import numpy as np

    from conftest import EXAMPLES, random_graph
    from gnnc import api
    from gnnc.cluster import preset
    from gnnc.passes.cost.evaluation import compile_cost
    from gnnc.passes.cost.inputs import planning_inputs
    from gnnc.passes.cost.neutronstar import DepcacheSpans
    from gnnc.passes.cost.registry import segment_cost
    from gnnc.passes.cost.scheduled import CACHE_ALL, Segment, segment_formula
    from gnnc.passes.planner.hybrid import Selection

    graph = random_graph(300, 2400, f=32, c=4, seed=2)
    program = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=16), graph).program
    parts = np.arange(graph.num_nodes) % 2
    _, inputs, shapes = planning_inputs(program, graph, parts, preset("neutronstar-ecs"), 2)
    plain, with_halo = DepcacheSpans(inputs, shapes).value(0, 2), DepcacheSpans(inputs, shapes, halo=True).value(0, 2)
    assert with_halo.time > plain.time
    formula = segment_cost("depcache", 0, 2, shapes, halo=True)
    assert compile_cost(formula)(inputs).time == pytest.approx(with_halo.time, rel=1e-9)
    sel = Selection(None, "cache-all", None, with_halo.time, np.zeros((2, 2)), with_halo, 0, 2, tuple(shapes))
    assert sel.formula == formula
    assert segment_formula(program, Segment(0, 2, "hybrid"), shapes, CACHE_ALL) == formula
