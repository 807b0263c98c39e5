"""Crossovers: where two predictions are equal (the bandwidth, the hidden width at which a choice flips).

Why this module exists: `--explain` says why the planner chose, by solving
the formulas for the point where the alternative would win. The time
difference is piecewise (maxima over workers and over overlapped terms);
sympy solves the piece active at each sign change exactly.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import sympy
from sympy import Symbol

from gnnc.ir.expr import as_expr
from gnnc.passes.cost.evaluation import Values, table
from gnnc.passes.cost.symbols import CostInputs, Cost, ZERO


@dataclass(frozen=True)
class Crossover:
    """A value of `symbol` where two predictions are equal, and the equation solved there.

    `equation` is the piece of the (piecewise) time difference that is active
    at the crossover, with every max resolved: sympy solved it exactly.
    `first_faster_above` says which side of the crossover favours the first
    sequence of costs.
    """

    symbol: Symbol
    value: float
    equation: sympy.Eq
    first_faster_above: bool


def total_time_expr(costs: Iterable[Cost], inputs: CostInputs, keep: Symbol,
                    extra: Values | None = None) -> sympy.Expr:
    """The time of `costs` as an expression in `keep` alone: every other symbol takes its value,
    worker by worker, and each stage becomes the max over workers."""
    values = {s: v for s, v in table(inputs, extra).items() if s != keep}
    p = inputs.workers
    subs_per_worker = [{s: sympy.Float(float(v[i])) for s, v in values.items()} for i in range(p)]
    total = ZERO
    for cost in costs:
        for stage in cost.stages:
            stage = as_expr(stage)
            # evaluating Max here: with the numbers in, sympy drops the workers that cannot be the slowest,
            # which leaves the piecewise difference `crossover` solves small
            total += sympy.Max(*[stage.xreplace(sub) for sub in subs_per_worker])
    return total


def _active_piece(expr: sympy.Expr, at: Mapping[Symbol, float]) -> sympy.Expr:
    """Replace every Max/Min by the argument that wins at the point `at` (the linear piece there)."""
    if not expr.args:
        return expr
    args = [_active_piece(a, at) for a in expr.args]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        vals = [float(a.evalf(subs=dict(at))) for a in args]
        pick = int(np.argmax(vals)) if isinstance(expr, sympy.Max) else int(np.argmin(vals))
        return args[pick]
    return expr.func(*args)


def crossover(first: Sequence[Cost], second: Sequence[Cost], symbol: Symbol, inputs: CostInputs,
              lo: float, hi: float, *, extra_first: Values | None = None, extra_second: Values | None = None,
              samples: int = 256) -> list[Crossover]:
    """Values of `symbol` in [lo, hi] where the two cost sequences predict the same time.

    For example the bandwidth (`bw`) at which DepComm's time equals
    DepCache's, or the hidden width (`d(1)`) below which pushpull stays
    best. The time difference is piecewise (maxima over workers and over
    overlapped terms): it is sampled on a log grid to bracket each sign
    change, and on each bracket sympy solves the piece active there exactly;
    a root that falls outside its piece is refined by bisection instead.
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")
    diff = (total_time_expr(first, inputs, symbol, extra_first)
            - total_time_expr(second, inputs, symbol, extra_second))
    if symbol not in diff.free_symbols:
        return []
    fn = sympy.lambdify([symbol], diff, modules="numpy")
    grid = np.geomspace(lo, hi, samples)
    vals = np.array([float(fn(x)) for x in grid])
    roots: list[float] = []
    for i in range(samples):
        if vals[i] == 0.0:
            roots.append(float(grid[i]))
        elif i + 1 < samples and vals[i] * vals[i + 1] < 0:
            roots.append(_solve_bracket(diff, fn, symbol, float(grid[i]), float(grid[i + 1])))
    out: list[Crossover] = []
    for root in roots:
        below, above = float(fn(max(lo, root * (1 - 1e-6)))), float(fn(min(hi, root * (1 + 1e-6))))
        piece = _active_piece(diff, {symbol: root})
        out.append(Crossover(symbol, root, sympy.Eq(piece, 0), above < 0 or (above == 0 and below > 0)))
    return out


def _solve_bracket(diff: sympy.Expr, fn: Callable[[float], float], symbol: Symbol, x0: float, x1: float) -> float:
    f0 = float(fn(x0))
    if f0 == 0.0:
        return x0
    mid = math.sqrt(x0 * x1)
    for _ in range(3):
        piece = _active_piece(diff, {symbol: mid})
        roots = [complex(r) for r in sympy.solve(sympy.Eq(piece, 0), symbol)]
        real = [r.real for r in roots if abs(r.imag) < 1e-12 and x0 <= r.real <= x1]
        if real:
            return min(real, key=lambda r: abs(float(fn(r))))
        # the piece changes inside the bracket: bisect once and try the half holding the sign change
        if (float(fn(mid)) > 0) == (f0 > 0):
            x0, f0 = mid, float(fn(mid))
        else:
            x1 = mid
        mid = math.sqrt(x0 * x1)
    lo_x, hi_x = x0, x1
    for _ in range(200):
        mid = 0.5 * (lo_x + hi_x)
        if (float(fn(mid)) > 0) == (f0 > 0):
            lo_x = mid
        else:
            hi_x = mid
    return 0.5 * (lo_x + hi_x)


def bytes_crossover(first: Cost, second: Cost, symbol: Symbol, inputs: CostInputs,
                    extra: Values | None = None) -> list[Crossover]:
    """Values of `symbol` where two costs send the same bytes, summed over workers (positive roots).

    Bytes are sums of products of counts and widths, so the difference is a polynomial in `symbol`
    (linear in a width) that sympy solves exactly. `first_faster_above`: the first sends fewer above it.
    """
    values = {s: v for s, v in table(inputs, extra).items() if s != symbol}
    subs = [{s: sympy.Float(float(v[i])) for s, v in values.items()} for i in range(inputs.workers)]
    diff = sum((as_expr(first.bytes) - as_expr(second.bytes)).xreplace(sub) for sub in subs)
    diff = sympy.expand(diff)
    if symbol not in diff.free_symbols:
        return []
    out = []
    for root in sympy.solve(sympy.Eq(diff, 0), symbol):
        value = complex(root)
        if abs(value.imag) > 1e-12 or value.real <= 0:
            continue
        above = float(diff.subs(symbol, value.real * (1 + 1e-6)))
        out.append(Crossover(symbol, value.real, sympy.Eq(diff, 0), above < 0))
    return out
