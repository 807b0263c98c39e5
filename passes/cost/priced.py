"""The priced tables of one plan: every candidate segment's cost, the transitions, what every assignment pays.

Why this module exists: the planner (gnnc.passes.planner.search.plan_costs)
fills a `PricedPlan` and the segment DP chooses from it; the predicted
schedule (gnnc.passes.cost.schedule) and the schedule pass then read the
chosen segments' costs back from it. It is a record of cost-model values, so
it sits in the cost model, below the planner that fills it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class Formulas(Mapping):
    """Segment key -> its `Cost`, each built when first read and kept.

    Why: the planner prices a deep model's spans numerically, without their formulas (building a span's sympy
    sums took most of its compile); a formula is needed only where it is read: the chosen segments' schedule,
    the alternatives' printed formulas, `--explain`'s crossovers. `builders` maps a key to its Cost or to a
    function building it."""

    def __init__(self, builders: Mapping[Any, Any] = ()):
        self._builders: dict[Any, Any] = {}
        self._built: dict[Any, Any] = {}
        if isinstance(builders, Formulas):
            self._builders.update(builders._builders)
            self._built.update(builders._built)
        else:
            for key, cost in dict(builders).items():
                self[key] = cost

    def __setitem__(self, key: Any, cost: Any) -> None:
        """`cost`: a Cost, or a function of no argument building it."""
        self._built.pop(key, None)
        if callable(cost):
            self._builders[key] = cost
        else:
            self._builders[key] = None
            self._built[key] = cost

    def __getitem__(self, key: Any) -> Any:
        if key not in self._built:
            build: Callable[[], Any] | None = self._builders[key]  # KeyError for a key never priced
            assert build is not None
            self._built[key] = build()
        return self._built[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)


@dataclass
class PricedPlan:
    """Everything `plan_costs` priced: the DP's tables, and what the schedule of the choice needs.

    seg_cost, trans: the DP's inputs (time, memory) per segment and time per transition.
    formulas, values, extras: per segment key (start, end, strategy) its Cost (`Formulas`: built when read), its evaluated
        CostValue and the extra symbol values it was evaluated with (a Hybrid selection, else None).
    allreduce: the gradient all-reduce (Cost and CostValue), paid once per step after the backward.
    epoch: what every assignment pays besides its segments, transitions and all-reduce (Cost and
        CostValue, gnnc.passes.cost.epoch): the optimizer step.
    """

    seg_cost: dict[tuple[int, int, str], tuple[float, float]]
    trans: dict[tuple[str, str, int], float]
    formulas: Mapping[tuple[int, int, str], Any]
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
