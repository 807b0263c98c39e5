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
