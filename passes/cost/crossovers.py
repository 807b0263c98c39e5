"""Crossovers: where two predictions are equal (the bandwidth, the hidden width at which a choice flips).

Why this module exists: `--explain` says why the planner chose, by finding
the point where the alternative would win. The time difference is piecewise
(maxima over workers and over overlapped terms): it is found numerically, on
the formulas compiled once to numpy (gnnc.passes.cost.evaluation), and the
piece of the difference active there, with every max resolved, is built as a
sympy equation only when it is read (`Crossover.equation`): sympy deciding
which of a deep model's terms dominate took seconds per compile.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import sympy
from sympy import Symbol

from gnnc.ir.expr import as_expr
from gnnc.passes.cost.evaluation import Values, numeric_function, table
from gnnc.passes.cost.symbols import CostInputs, Cost, ZERO


@dataclass(frozen=True)
class Crossover:
    """A value of `symbol` where two predictions are equal, and the equation that holds there.

    `equation` is the piece of the (piecewise) time difference that is active
    at the crossover, with every max resolved (built when first read).
    `first_faster_above` says which side of the crossover favours the first
    sequence of costs.
    """

    symbol: Symbol
    value: float
    first_faster_above: bool
    solved: Callable[[], sympy.Eq] = field(repr=False, compare=False)

    @property
    def equation(self) -> sympy.Eq:
        return self.solved()


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
            # which leaves the piecewise difference small
            total += sympy.Max(*[stage.xreplace(sub) for sub in subs_per_worker])
    return total


def time_curve(costs: Sequence[Cost], inputs: CostInputs, symbol: Symbol,
               extra: Values | None = None) -> tuple[Callable[[np.ndarray], np.ndarray], bool]:
    """The time of `costs` as a function of `symbol`'s value (every other symbol at its value on `inputs`):
    it takes an array of values and gives the time at each, each stage's slowest worker summed, in one numpy
    call per stage; and whether the time depends on `symbol` at all."""
    p = inputs.workers
    stages = [numeric_function(as_expr(stage)) for cost in costs for stage in cost.stages]
    grid = {s.name: np.asarray(v, np.float64).reshape(p, 1) for s, v in table(inputs, extra).items() if s != symbol}

    def at(xs: np.ndarray) -> np.ndarray:
        xs = np.asarray(xs, np.float64)
        grid[symbol.name] = xs.reshape(1, -1)
        total = np.zeros(xs.shape)
        for fn, _ in stages:
            total += np.broadcast_to(np.asarray(fn(grid), np.float64), (p, xs.size)).max(axis=0)
        return total

    return at, any(symbol in syms for _, syms in stages)


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
    change, and each bracket is narrowed by bisection down to adjacent floats
    (the formulas compiled once, every sample numeric).
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")
    time_first, depends_first = time_curve(first, inputs, symbol, extra_first)
    time_second, depends_second = time_curve(second, inputs, symbol, extra_second)
    if not (depends_first or depends_second):
        return []

    def diff(xs: np.ndarray) -> np.ndarray:
        return time_first(xs) - time_second(xs)

    def at(x: float) -> float:
        return float(diff(np.array([x]))[0])

    grid = np.geomspace(lo, hi, samples)
    vals = diff(grid)
    if not vals.any():  # the same time everywhere (the symbol cancels): no point where one overtakes
        return []
    roots: list[float] = []
    for i in range(samples):
        if vals[i] == 0.0:
            roots.append(float(grid[i]))
        elif i + 1 < samples and vals[i] * vals[i + 1] < 0:
            roots.append(_bisect(at, float(grid[i]), float(grid[i + 1]), float(vals[i])))
    out: list[Crossover] = []
    for root in roots:
        below, above = at(max(lo, root * (1 - 1e-6))), at(min(hi, root * (1 + 1e-6)))
        out.append(Crossover(symbol, root, above < 0 or (above == 0 and below > 0),
                             _equation(first, second, symbol, inputs, extra_first, extra_second, root)))
    return out


def _bisect(f: Callable[[float], float], x0: float, x1: float, f0: float) -> float:
    """The root of `f` in [x0, x1] (f changes sign there; f(x0) = f0), to adjacent floats."""
    for _ in range(200):
        mid = 0.5 * (x0 + x1)
        if not x0 < mid < x1:
            break
        f_mid = f(mid)
        if f_mid == 0.0:
            return mid
        if (f_mid > 0) == (f0 > 0):
            x0, f0 = mid, f_mid
        else:
            x1 = mid
    return x0 if abs(f(x0)) <= abs(f(x1)) else x1


def _equation(first: Sequence[Cost], second: Sequence[Cost], symbol: Symbol, inputs: CostInputs,
              extra_first: Values | None, extra_second: Values | None, root: float) -> Callable[[], sympy.Eq]:
    """The equation that holds at `root`, built symbolically when it is first read."""

    @functools.cache
    def solved() -> sympy.Eq:
        diff = (total_time_expr(first, inputs, symbol, extra_first)
                - total_time_expr(second, inputs, symbol, extra_second))
        return sympy.Eq(_active_piece(diff, {symbol: root}), 0)

    return solved


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
        equation = sympy.Eq(diff, 0)
        out.append(Crossover(symbol, value.real, above < 0, lambda equation=equation: equation))
    return out
