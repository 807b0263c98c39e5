"""The priced tables of one plan: every candidate segment's cost, the transitions, what every assignment pays.

Why this module exists: the planner (gnnc.passes.planner.search.plan_costs)
fills a `PricedPlan` and the segment DP chooses from it; the predicted
schedule (gnnc.passes.cost.schedule) and the schedule pass then read the
chosen segments' costs back from it. It is a record of cost-model values, so
it sits in the cost model, below the planner that fills it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PricedPlan:
    """Everything `plan_costs` priced: the DP's tables, and what the schedule of the choice needs.

    seg_cost, trans: the DP's inputs (time, memory) per segment and time per transition.
    formulas, values, extras: per segment key (start, end, strategy) its Cost, its evaluated
        CostValue and the extra symbol values it was evaluated with (a Hybrid selection, else None).
    allreduce: the gradient all-reduce (Cost and CostValue), paid once per step after the backward.
    epoch: what every assignment pays besides its segments, transitions and all-reduce (Cost and
        CostValue, gnnc.passes.cost.epoch): the optimizer step.
    """

    seg_cost: dict[tuple[int, int, str], tuple[float, float]]
    trans: dict[tuple[str, str, int], float]
    formulas: dict[tuple[int, int, str], Any]
    values: dict[tuple[int, int, str], Any]
    extras: dict[tuple[int, int, str], Any]
    inputs: Any
    shapes: list[Any]
    allreduce_cost: Any
    allreduce: Any
    allowed: list[str]
    grad_ready: tuple[int, ...] = ()
    grad_overlap: bool = False
    pipelines: list[Any] = field(default_factory=list)
    epoch_cost: Any = None
    epoch: Any = None
