"""What passes share besides the IR: the compile's inputs, cached analyses and the results the API reads.

Every field is typed and documented here, so a reader sees at a glance what a
pass may consult (the graph, the worker count, the partition, the resolved
cluster profile), what it may compute once and reuse (`analyses`), and what
it hands back to the caller (`results`). Decisions that can be text live in
the IR as attributes (a graph layer's `strategy`); what is data (per-worker
id arrays, the planner's report) lives in `results`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gnnc.plan.precision import DEFAULT_PRECISION

if TYPE_CHECKING:  # annotations only: `gnnc check` loads the context, and a partition would load torch
    from gnnc.cluster import ClusterProfile
    from gnnc.ir import Program
    from gnnc.passes.partition.core import Partition


class Analysis(Protocol):
    """A fact computed from the program and the context, cached in `PassContext.analyses` by its class."""

    @classmethod
    def compute(cls, program: "Program", ctx: "PassContext") -> Any: ...


A = TypeVar("A")


class AnalysisCache:
    """Analyses computed at most once while the program they read stays as it is.

    `get(Kind, program)` computes `Kind.compute(program, ctx)` on first use.
    The pass manager drops every cached analysis a pass does not declare it
    `preserves` once that pass has returned a different program.
    """

    def __init__(self, ctx: "PassContext"):
        self._ctx = ctx
        self._cached: dict[type, Any] = {}

    def get(self, kind: type[A], program: "Program") -> A:
        if kind not in self._cached:
            self._cached[kind] = kind.compute(program, self._ctx)  # type: ignore[attr-defined]
        return self._cached[kind]

    def keep_only(self, preserved: tuple[type, ...]) -> None:
        """Forget every analysis not in `preserved` (the program changed)."""
        self._cached = {k: v for k, v in self._cached.items() if k in preserved}


@dataclass
class PassResults:
    """What the passes decide that the caller (gnnc.api) reads back, each set by one pass.

    strategy: the graph layers' strategies, one name or one per layer (choose-strategy: the
        user's, else the planner's); None leaves assign-strategy's default.
    segments: (start, end, strategy) of the planner's chosen segments (choose-strategy).
    planner: choose-strategy's PlannerReport (choice, alternatives, crossovers, schedule).
    hybrid_cached: {graph layer: [global ids per worker]} each hybrid segment caches (select-hybrid).
    hybrid_selection: select-hybrid's prediction, one entry per hybrid segment.
    predicted_bytes: bytes per training step by communication kind (predict-bytes; per epoch when sampled).
    predicted_eval_bytes: bytes of the evaluation pass after each step, by kind (predict-bytes, full-graph
        strategies but the pipeline).
    schedule: the step schedule (gnnc.plan.schedules) the planner chose, None: the caller's or sequential.
    hybrid_values: {(start, end): the cost model's symbol values of the selection} (select-hybrid), which
        the schedule pass prices the segment's schedule with.
    schedule_report: what the schedule pass compared and chose, and the predicted epoch drawn from it.
    pipeline: the pipeline the graph layers run (a gnnc.passes.planner.pipeline.PipelineChoice: stages,
        groups, chunks, the chunking and its prediction), priced by choose-strategy, fixed by stage-pipeline.
    pipeline_bytes: predict-bytes' count of what a pipeline sends besides the training step (a history
        refresh, once every alpha epochs).
    row_sets: (layer specs, every rank's RowSets) that predict-bytes counted from (gnnc.plan.rows); the
        plan's shard writing takes them instead of building them again, when the final program's specs
        are the same.
    """

    strategy: str | list[str] | None = None
    segments: list[tuple[int, int, str]] | None = None
    planner: Any = None
    hybrid_cached: dict[int, list[Any]] | None = None
    hybrid_selection: list[dict[str, Any]] | None = None
    predicted_bytes: dict[str, int] | None = None
    predicted_eval_bytes: dict[str, int] | None = None
    pipeline: Any = None
    pipeline_bytes: dict[str, int] | None = None
    row_sets: tuple[list[Any], list[Any]] | None = None
    schedule: str | None = None
    hybrid_values: dict[tuple[int, int], Any] | None = None
    schedule_report: dict[str, Any] | None = None


@dataclass
class PassContext:
    """The compile's inputs that passes may consult, its analysis cache and its results.

    graph: the graph compiled for (None: compiling without one).
    workers: the worker count compiled for.
    partition: the split of the graph's vertices over the workers (with workers > 1 and a graph).
    cluster: the cluster profile the cost model prices on, resolved once by the caller.
    hybrid_cached: a hybrid selection fixed by the caller (gnnc.compile(hybrid_cached=...)),
        which select-hybrid checks and uses instead of choosing one.
    sampling: the fan-outs and batch size of sampled minibatch training (`--fanout`), None for
        full-graph steps; the planner then prices the sampled strategies on a seeded dry run.
    seed: the run's seed (the dry run samples what the run will).
    approximate: the planner may choose approximate strategies and schedules (`--approximate`).
    precision: the run's precision (gnnc.plan.precision): the bytes of each exchanged element
        (predict-bytes) and the rates and bytes the cost model prices.
    threads: the processes the compile may keep busy at once (decided once by the caller: `--threads`, else the
        CPUs this process may use): what a pass splits its per-worker steps over (gnnc.parallel).
    """

    graph: Any = None  # a Graph (its module moves below passes and runtime; no import here)
    workers: int = 1
    partition: "Partition | None" = None
    cluster: "ClusterProfile | None" = None
    hybrid_cached: dict[int, list[Any]] | None = None
    sampling: Any = None  # a gnnc.graph.sampling.SamplingConfig
    seed: int = 0
    approximate: bool = False
    precision: str = DEFAULT_PRECISION
    threads: int = 1
    results: PassResults = field(default_factory=PassResults)
    analyses: AnalysisCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.analyses = AnalysisCache(self)

    @property
    def parts(self) -> Any:
        """The part of every vertex (int64 [N]), or None without a partition."""
        return None if self.partition is None else self.partition.assignment
