"""The planner's report: what it chose, what it compared, and why.

Why this module exists: the full-graph search (gnnc.passes.planner.search) and
the sampled one (gnnc.passes.planner.sampled) answer with the same record,
which choose-strategy puts in `ctx.results.planner` and the plan, `--explain`
and `gnnc inspect` read.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlannerReport:
    """What the planner decided and what it compared."""

    strategies: list[str]
    predicted_time_s: float
    predicted_memory_bytes: float
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    # where a choice flips (`explained`): None until asked for (`--explain`), as finding them costs more than
    # choosing on a deep model
    crossovers: list[str] | None = None
    segments: list[tuple[int, int, str]] = field(default_factory=list)  # the chosen (start, end, strategy)
    # every segment priced: {"layers": [start, end], "strategy", "time_s", "bytes", "memory_bytes"}
    segment_costs: list[dict[str, Any]] = field(default_factory=list)
    priced: Any = field(default=None, repr=False)  # the PricedPlan behind it (not saved with the plan)
    pipeline: Any = None  # the chosen pipeline (a gnnc.passes.planner.pipeline.PipelineChoice), when one was chosen
    # bytes every worker holds whatever the assignment: the weights, their gradients and Adam's two moments
    weights_bytes: float = 0.0
    memory_warning: str = ""  # set when the choice takes more than WARN_FRACTION of a worker's memory
    find_crossovers: Callable[[], list[str]] | None = field(default=None, repr=False)
    # the chosen assignment's epoch, stage by stage and worker by worker (`schedule`), once drawn or set; and
    # what draws it when read (`predicted_schedule` on the priced plan)
    drawn_schedule: dict[str, Any] | None = field(default=None, repr=False)
    draw_schedule: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def schedule(self) -> dict[str, Any]:
        """The chosen assignment's epoch, stage by stage and worker by worker (`predicted_schedule`; {} for a
        planner that predicts no stages). Drawn when first read: the schedule pass redraws it from the
        schedule it annotates (gnnc.passes.cost.scheduled) and sets it, so the planner's own drawing is read
        only where no schedule pass runs (a pipeline plan, a pipeline without the pass)."""
        if self.drawn_schedule is None:
            self.drawn_schedule = self.draw_schedule() if self.draw_schedule is not None else {}
        return self.drawn_schedule

    @schedule.setter
    def schedule(self, value: dict[str, Any]) -> None:
        self.drawn_schedule = value

    def explained(self) -> list[str]:
        """The crossovers, found now if they were not yet."""
        if self.crossovers is None:
            self.crossovers = self.find_crossovers() if self.find_crossovers is not None else []
        return self.crossovers
