"""The rest of a training epoch around the strategies' steps: the evaluation pass and the optimizer.

Why this module exists: a run (gnnc.runtime.train.fit) does more per epoch
than forward, backward and the gradient all-reduce. After the step, Adam
updates every parameter; then the run evaluates: one more forward pass in
evaluation mode (dropout is the identity, nothing is kept for backward; the
exchanges move their forward rows again). The planner prices them here so
the predicted epoch is what a run measures: its step and its evaluation (the
all-reduce of the epoch's counts that follows, 2(P-1) message start-ups, is
in neither).

* `with_evaluation`: a segment's (or a layout change's) cost with its
  evaluation stages appended, its forward stages with the other ops' training
  seconds (`op_time(l, side, "f")`) replaced by their evaluation ones ("e")
  and the dense maps' and aggregations' rates by those measured forward alone
  (R_gemm_e, R_spmm_e: a dense map's backward products run at another rate,
  and the training rates are fitted to forward plus backward);
  `Cost.evaluation` counts them, so the schedule draws them after the step;
* `optimizer_cost`: Adam's step, per parameter element and per parameter
  tensor, at the profile's measured rates (`epoch_costs`: a program's, evaluated).

Which of a cost's stages are forward follows its shape, as the schedule
reads it (gnnc.passes.cost.schedule): one forward and one backward stage per
layer, or one of each for the segment; a cost of another shape (a user's
formula, a pipeline with its own stages) gets no evaluation stages.
"""
from __future__ import annotations

import sympy

from gnnc.ir import Program
from gnnc.ir.expr import as_expr
from gnnc.passes.cost.evaluation import CostValue, evaluate_cost
from gnnc.passes.cost.ops import optimizer_work
from gnnc.passes.cost.symbols import (R_gemm, R_gemm_e, R_spmm, R_spmm_e, T_opt, T_opt_call, Cost, CostInputs, ZERO,
                                      op_time, OP_SIDES)

def forward_stages(cost: Cost, layers: int) -> tuple[sympy.Expr, ...]:
    """The forward stages of a training cost over `layers` graph layers: the first half when it has one
    forward and one backward stage per layer, or the first of two; none for another shape."""
    n = len(cost.training_stages)
    if n == 2 * layers:
        return cost.training_stages[:layers]
    if n == 2:
        return cost.training_stages[:1]
    return ()


def evaluation_of(stages: tuple[sympy.Expr, ...], layers: range) -> tuple[sympy.Expr, ...]:
    """Forward stages as the evaluation pass runs them: each layer's other ops at their evaluation seconds, the
    kernels at their forward rates."""
    swap = {op_time(layer, side, "f"): op_time(layer, side, "e") for layer in layers for side in OP_SIDES}
    swap.update({R_gemm: R_gemm_e, R_spmm: R_spmm_e})
    memo: dict[sympy.Basic, sympy.Basic] = {}
    return tuple(_renamed(as_expr(s), swap, memo) for s in stages)


def _renamed(expr: sympy.Basic, swap: dict[sympy.Basic, sympy.Basic],
             memo: dict[sympy.Basic, sympy.Basic]) -> sympy.Basic:
    """`expr.xreplace(swap)` for a renaming of symbols, with every max and min rebuilt as the formulas write them
    (unevaluated, `symbols.Max`): xreplace rebuilds them evaluated, and sympy's evaluating Max asks its
    assumption system whether each argument dominates another, which took most of a deep model's planning
    time and, the formulas' terms being incomparable, dropped nothing. Sums and products are rebuilt as
    xreplace rebuilds them, so the stage and its value are xreplace's. `memo`: the subtrees done already."""
    if expr in swap:
        return swap[expr]
    if not expr.args:
        return expr
    done = memo.get(expr)
    if done is not None:
        return done
    args = tuple(_renamed(a, swap, memo) for a in expr.args)
    if args == expr.args:
        out = expr
    elif isinstance(expr, (sympy.Max, sympy.Min)):
        out = type(expr)(*args, evaluate=False)
    else:
        out = expr.func(*args)
    memo[expr] = out
    return out


def with_evaluation(cost: Cost, start: int, end: int) -> Cost:
    """`cost` (graph layers [start, end)) with the evaluation forward pass's stages appended (module docstring)."""
    if cost.evaluation:
        return cost
    stages = evaluation_of(forward_stages(cost, end - start), range(start, end))
    return Cost(cost.name, cost.stages + stages, cost.bytes, cost.memory, len(stages))


def optimizer_cost(elements: float, tensors: int) -> Cost:
    """One Adam step: every parameter element, and the per-tensor work of the step (its dispatch)."""
    return Cost("optimizer", (elements * T_opt + tensors * T_opt_call,), ZERO, ZERO)


def epoch_costs(program: Program, inputs: CostInputs) -> tuple[Cost, CostValue]:
    """The optimizer step of one epoch of `program`, and its value on `inputs`."""
    cost = optimizer_cost(*optimizer_work(program))
    return cost, evaluate_cost(cost, inputs)
