"""Evaluating cost formulas: a sympy expression compiled once to numpy calls, run on per-worker arrays.

Why this module exists: the planner evaluates thousands of formulas on the
same inputs; `compile_expr` walks each expression once into nested numpy
calls (far cheaper than `sympy.lambdify`) and caches it, and `CompiledCost`
turns a `Cost` into its time (sum over stages of the slowest worker), bytes
(summed over workers) and peak memory.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.ir.expr import as_expr
from gnnc.passes.cost.symbols import CostInputs, Cost, Rows, per_worker


Values = Mapping[Symbol, Any]


def compile_expr(expr: sympy.Expr) -> Callable[..., np.ndarray]:
    """`expr` as a function from a symbol->value table to one value per worker.

    The formula is turned into nested numpy calls once (`_numeric`) and kept
    (the planner meets the same layer terms in many segments). The worker
    count comes from the table's arrays (or `workers=`), so a formula that is
    constant still yields one value per worker.
    """
    return _compiled(as_expr(expr))


# a 64-layer model's spans hold some 12,000 distinct stage expressions: all kept for a second compile
@functools.lru_cache(maxsize=32768)
def numeric_function(expr: sympy.Expr) -> tuple[Callable[[Mapping[str, Any]], Any], tuple[Symbol, ...]]:
    """`expr` walked once into nested numpy calls (`_numeric`), and its free symbols by name: the function reads
    its symbols' values from a table keyed by their names and broadcasts as numpy does (one value per worker,
    or a [workers, points] grid: gnnc.passes.cost.crossovers samples a formula along one symbol in one call)."""
    expr = as_expr(expr)
    return _numeric(expr), tuple(sorted(expr.free_symbols, key=lambda s: s.name))


@functools.lru_cache(maxsize=32768)
def _compiled(expr: sympy.Expr) -> Callable[..., np.ndarray]:
    fn, syms = numeric_function(expr)

    def run(values: Values, workers: int | None = None) -> np.ndarray:
        if workers is None:
            workers = max((np.shape(v)[0] for v in values.values() if np.ndim(v) == 1), default=1)
        missing = [] if isinstance(values, Rows) else [s.name for s in syms if s not in values]
        if missing:
            raise KeyError(f"no value for {', '.join(missing)}")
        try:
            # rows already (the planner's tables) are read as they are, not copied per call
            out = fn(values.by_name if isinstance(values, Rows)
                     else {s.name: _row(values[s], workers) for s in syms})
        except KeyError:
            raise KeyError(f"no value for {', '.join(s.name for s in syms if s not in values)}") from None
        if type(out) is np.ndarray and out.dtype == np.float64 and out.shape == (workers,):
            return out.copy()  # the common case, without a broadcast view (a copy: `out` may be a table's row)
        return np.array(np.broadcast_to(np.asarray(out, dtype=np.float64), (workers,)))

    return run


def _row(value: Any, workers: int) -> np.ndarray:
    """`value` as one float64 entry per worker (as it comes, when it already is)."""
    if isinstance(value, np.ndarray) and value.shape == (workers,) and value.dtype == np.float64:
        return value
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (workers,))


_NARY = {sympy.Add: np.add, sympy.Mul: np.multiply, sympy.Max: np.maximum, sympy.Min: np.minimum}
_UNARY = {sympy.log: np.log, sympy.exp: np.exp, sympy.ceiling: np.ceil, sympy.floor: np.floor}


def _numeric(expr: sympy.Expr) -> Callable[[Mapping[Symbol, np.ndarray]], Any]:
    """`expr` as nested numpy calls on a table of values.

    The formulas are sums, products, powers and maxima of symbols (plus the
    odd log and ceiling; sympy writes log(x, b) as a product): walking them is far cheaper than `sympy.lambdify`,
    which prints and compiles Python source per formula, and the planner
    evaluates thousands of formulas once each.
    """
    if expr.is_Symbol:
        # tables are read by name (`Rows.by_name`); an itemgetter reads it without a Python frame per read (the
        # planner's formulas read ~50,000 symbols per compile of a 64-layer model)
        return operator.itemgetter(expr.name)
    if expr.is_Number:
        value = float(expr)
        return lambda t: value
    for kind, op in _NARY.items():
        if isinstance(expr, kind):
            args = list(expr.args)
            # sympy puts a sum's or product's number first: it starts the fold as a constant, not as a call (the
            # same operations in the same order: op(number, first term), then each next term)
            first = float(args.pop(0)) if args[0].is_Number and len(args) > 1 else None
            parts = [_numeric(a) for a in args]
            if first is not None:
                if len(parts) == 1:
                    [only] = parts
                    return lambda t, op=op: op(first, only(t))

                def nary_from(t, parts=parts, op=op):
                    acc = op(first, parts[0](t))
                    for f in parts[1:]:
                        acc = op(acc, f(t))
                    return acc

                return nary_from
            if len(parts) == 2:
                left, right = parts
                return lambda t, op=op: op(left(t), right(t))

            def nary(t, parts=parts, op=op):
                acc = parts[0](t)
                for f in parts[1:]:
                    acc = op(acc, f(t))
                return acc

            return nary
    if isinstance(expr, sympy.Pow):
        base = _numeric(expr.base)
        if expr.exp.is_Number:  # x**-1, x**2: the exponent as a constant
            power = float(expr.exp)
            return lambda t: np.power(np.asarray(base(t), dtype=np.float64), power)
        exp = _numeric(expr.exp)
        return lambda t: np.power(np.asarray(base(t), dtype=np.float64), exp(t))
    for kind, op in _UNARY.items():
        if isinstance(expr, kind) and len(expr.args) == 1:
            arg = _numeric(expr.args[0])
            return lambda t, op=op: op(arg(t))
    # anything else (a user cost function's exotic term): sympy compiles it
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    fn = sympy.lambdify(syms, expr, modules="numpy")
    return lambda t: fn(*[t[s.name] for s in syms])


class Overlay(dict):
    """A table by name (what `numeric_function`'s functions read) with a few entries over a shared base: the
    entries it holds, else the base's (no copy of the base, which holds every symbol of a deep model)."""

    def __init__(self, base: Mapping[str, Any], entries: Mapping[str, Any]):
        super().__init__(entries)
        self.base = base

    def __missing__(self, name: str) -> Any:
        return self.base[name]


class Columns(dict):
    """A table by name (what `numeric_function`'s functions read) whose values are the base's per-worker rows as
    [workers, 1] columns, each made when first read, with `entries` (placeholders' [workers, n] grids) over them:
    a formula evaluated on it gives [workers, n] values (one column per hop count, selection, ...).

    Why: the inputs hold every symbol of a deep model (some 2,000 for the 64-layer GCNII example), and reshaping
    them all for each grid (DepCache's spans, the Hybrid selections) cost more than the formulas that read a few
    dozen of them. The values are the base's, so what is computed on them is unchanged."""

    def __init__(self, base: Mapping[str, np.ndarray], workers: int, entries: Mapping[str, Any] = ()):
        super().__init__(entries)
        self.base, self.workers = base, workers

    def __missing__(self, name: str) -> np.ndarray:
        # the base's rows are [workers] already (`per_worker`: a scalar's is a broadcast view): a reshape is a view
        # (np.broadcast_to costs more than the formulas' own operations on such small arrays)
        column = self[name] = self.base[name].reshape(self.workers, 1)
        return column


def table(inputs: CostInputs, extra: Values | None) -> Mapping[Symbol, Any]:
    """Every symbol's value per worker: the inputs' (`CostInputs.table`, shared, read-only), then `extra`'s."""
    if not extra:
        return inputs.table
    return Rows({**inputs.table, **per_worker(extra, inputs.workers)})


def evaluate(expr: sympy.Expr, inputs: CostInputs, extra: Values | None = None) -> np.ndarray:
    """`expr` on `inputs` (plus `extra` symbol values, e.g. a Hybrid selection): one value per worker."""
    return compile_expr(expr)(table(inputs, extra), inputs.workers)


@dataclass(frozen=True)
class CostValue:
    """A `Cost` evaluated: the time (sum over stages of the slowest worker), the job's bytes, the peak memory; of
    the time, what its evaluation stages take (`epoch_time`)."""

    name: str
    time: float
    bytes: float
    memory: float
    stage_times: np.ndarray = field(repr=False)  # [stages, workers]
    worker_bytes: np.ndarray = field(repr=False)  # [workers]
    worker_memory: np.ndarray = field(repr=False)  # [workers]
    evaluation_time: float = 0.0  # the evaluation forward pass's stages (Cost.evaluation), slowest worker each

    def epoch_time(self, eval_every: int = 1, recompute: bool = False) -> float:
        """The epoch a run of this cost makes on average under its flags: `--eval-every K` evaluates after one epoch
        in K (gnnc.runtime.train.fit), so the evaluation stages count 1/K; `--recompute` runs every graph layer's
        forward again in its backward (gnnc.runtime.recompute): one more forward pass, priced as the evaluation's
        stages (the forward's own are not told apart from the backward's in a sum of segments' costs). At the
        defaults it is `time`, what the planner compares."""
        return (self.time - self.evaluation_time * (1.0 - 1.0 / eval_every)
                + (self.evaluation_time if recompute else 0.0))


class CompiledCost:
    """A `Cost` with its expressions lambdified once; call it on inputs as often as needed."""

    def __init__(self, cost: Cost):
        self.cost = cost
        self._stages = tuple(compile_expr(s) for s in cost.stages)
        self._bytes = compile_expr(cost.bytes)
        self._memory = compile_expr(cost.memory)

    def __call__(self, inputs: CostInputs, extra: Values | None = None) -> CostValue:
        return self.on_table(table(inputs, extra), inputs.workers)

    def on_table(self, table: Values, workers: int) -> CostValue:
        stage_times = (np.stack([fn(table, workers) for fn in self._stages]) if self._stages
                       else np.zeros((0, workers)))
        return _cost_value(self.cost, stage_times, self._bytes(table, workers), self._memory(table, workers))


def _cost_value(cost: Cost, stage_times: np.ndarray, worker_bytes: np.ndarray,
                worker_memory: np.ndarray) -> CostValue:
    """`cost`'s value from its per-worker stage times [stages, workers], bytes and memory [workers]."""
    slowest = stage_times.max(axis=1).tolist()  # each stage's slowest worker, one reduction for all stages
    k = cost.evaluation  # the last k stages (gnnc.passes.cost.epoch.with_evaluation)
    return CostValue(cost.name, float(sum(slowest)), float(worker_bytes.sum()), float(worker_memory.max()),
                     stage_times, worker_bytes, worker_memory, float(sum(slowest[len(slowest) - k:])))


def compile_cost(cost: Cost) -> CompiledCost:
    return CompiledCost(cost)


_SHAPES: dict[str, int] = {}  # an expression's shape (`alike`) -> its number


@functools.lru_cache(maxsize=32768)
def alike(expr: sympy.Expr) -> tuple[int | None, tuple[str, ...]]:
    """(a number shared by the expressions that differ from `expr` only in the symbols they read, None for one
    `numeric_function` hands to sympy.lambdify; its symbols' names, in the order they first appear).

    Two expressions with the same number are the same tree of the same operations on the same numbers, reading
    their k-th symbol where the other reads its own k-th: one's numeric function computes the other's value when
    given the other's symbols' values under its own symbols' names (`evaluate_alike`). A deep model's layers
    have such formulas: layer l's reads layer l's widths and per-op seconds where layer m's reads layer m's."""
    names: dict[str, int] = {}
    plain = True

    # The shape is written as text (a string is no object the garbage collector tracks; nested tuples of types
    # were ~20,000 more for the 64-layer example, and made a full collection fall inside the next compile):
    # s<k> the k-th symbol, n<hex> a number (hex: -0.0 and 0.0 apart, a NaN equal to itself), Kind(args) an
    # operation `_numeric` evaluates (class names of _NARY, _UNARY and Pow: no two alike); parsed one way only.
    def shape(e: sympy.Basic) -> str:
        nonlocal plain
        if e.is_Symbol:
            return f"s{names.setdefault(e.name, len(names))}"
        if e.is_Number:
            return f"n{float(e).hex()}"
        kind = type(e)
        if kind in _NARY or kind is sympy.Pow or (kind in _UNARY and len(e.args) == 1):
            return f"{kind.__name__}({','.join(shape(a) for a in e.args)})"
        plain = False  # sympy compiles it (`_numeric`): not evaluated with another's symbols
        return "?"

    key = shape(as_expr(expr))
    return (_SHAPES.setdefault(key, len(_SHAPES)) if plain else None), tuple(names)


def evaluate_alike(exprs: Sequence[sympy.Expr], values: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                   shape: tuple[int, ...]) -> list[np.ndarray]:
    """Each of `exprs` on `values` (a table by name whose arrays all have len(shape) dimensions, broadcasting to
    `shape`; or one such table per expression), as its numeric function computes it, broadcast to `shape` (a new
    float64 array each).

    Expressions `alike` are evaluated in one call of the first one's function, their symbols' values side by side
    along a last axis: the same operations on the same numbers, element by element, so the same floats, in one
    numpy call per operation where each expression made its own (a deep model's per-layer formulas: one call
    for all 64 layers of the GCNII example instead of 64)."""
    out: list[np.ndarray | None] = [None] * len(exprs)
    tables = values if isinstance(values, Sequence) else [values] * len(exprs)
    groups: dict[Any, list[int]] = {}
    for i, e in enumerate(exprs):
        number, _ = alike(e)
        groups.setdefault(("alone", i) if number is None else number, []).append(i)
    for members in groups.values():
        if len(members) == 1:
            [i] = members
            value = np.asarray(numeric_function(exprs[i])[0](tables[i]), np.float64)
            out[i] = value.copy() if value.shape == shape else np.array(np.broadcast_to(value, shape))
            continue
        first = alike(exprs[members[0]])[1]
        names = [alike(exprs[i])[1] for i in members]
        shared = all(tables[i] is tables[members[0]] for i in members)  # one table: a name is one value
        batch = {}
        for k, name in enumerate(first):
            column = [n[k] for n in names]
            if shared and all(n == name for n in column):
                batch[name] = tables[members[0]][name][..., None]
            else:
                arrays = [tables[i][n] for i, n in zip(members, column)]
                if any(a.shape != arrays[0].shape for a in arrays):  # (np.broadcast_to is slow: only if needed)
                    arrays = [np.broadcast_to(a, shape) for a in arrays]
                batch[name] = np.stack(arrays, axis=-1)
        got = np.broadcast_to(np.asarray(numeric_function(exprs[members[0]])[0](batch), np.float64),
                              shape + (len(members),))
        for m, i in enumerate(members):
            out[i] = np.ascontiguousarray(got[..., m])
    return out  # type: ignore[return-value]


def evaluate_costs(costs: Sequence[Cost], inputs: CostInputs) -> list[CostValue]:
    """[evaluate_cost(c, inputs) for c in costs], their formulas evaluated together (`evaluate_alike`): the same
    values, in one numpy call per operation for each set of alike stage, bytes or memory formulas."""
    p = inputs.workers
    exprs = [as_expr(e) for c in costs for e in (*c.stages, c.bytes, c.memory)]
    got = iter(evaluate_alike(exprs, inputs.table.by_name, (p,)))
    out = []
    for c in costs:
        stages = [next(got) for _ in c.stages]
        stage_times = np.stack(stages) if stages else np.zeros((0, p))
        worker_bytes, worker_memory = next(got), next(got)
        out.append(_cost_value(c, stage_times, worker_bytes, worker_memory))
    return out


def evaluate_cost(cost: Cost, inputs: CostInputs, extra: Values | None = None) -> CostValue:
    """`cost` on `inputs`; compile it with `compile_cost` instead when evaluating it repeatedly."""
    return CompiledCost(cost)(inputs, extra)


def total_time(costs: Iterable[Cost], inputs: CostInputs, extra: Values | None = None) -> float:
    """Predicted time of a sequence of costs (segments, transitions, all-reduces) run one after another."""
    return sum(evaluate_cost(c, inputs, extra).time for c in costs)
