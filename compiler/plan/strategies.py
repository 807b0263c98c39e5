"""Strategies as descriptors: one `StrategyDef` per way of splitting a graph layer's work.

Why this module exists: a strategy's facts (does it span several layers, which
layouts it reads and leaves, what communication insert-comm inserts for it,
whether the runtime executes it, which rows a worker holds under it) used to
be name tuples copied into the planner, the cost model, insert-comm and the
runtime's row sets. Each consumer now asks the registry below; what varies
by more than a fact registers against a descriptor's name in its own layer:
its cost formula (`gnnc.passes.cost.registry.cost_formula`); the comm ops it
names are described in gnnc.plan.comm_ops and run by the exchanges the
runtime registers with `@implements_exchange` (gnnc.runtime.implementations). This
module sits in the bottom layer: it imports nothing above it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

LAYOUTS = ("vertex", "feature", "replicated")  # how a value's N x width rows are split over workers

# Which rows of a layer's input a worker holds (gnnc.plan.rows reads this):
# "owned": its own rows, the remote in-neighbours through a halo;
# "neighbourhood": the whole L-hop in-neighbourhood of the segment, recomputed (no halo rows);
# "selected": its own rows plus the cached remote dependencies' subtrees, the rest through a halo;
# "blocks": every row, in block order (a staged broadcast);
# "all": every vertex's row (a feature slice of it, or the whole graph on one worker).
RowRule = Literal["owned", "neighbourhood", "selected", "blocks", "all"]

# How a strategy trains: "full" (every step on the whole graph) and/or "sampled" (`--fanout`: every step on
# a minibatch's sampled blocks, gnnc.graph.sampling). P3's push-pull is one strategy in both: the same
# layer-1 split (a feature slice per worker, partial sums pulled to the owners), on the whole graph or on
# the pushed layer-1 block of each minibatch.
BATCHING = ("full", "sampled")


@dataclass(frozen=True)
class StrategyDef:
    """Everything gnnc knows about one strategy, apart from its cost formula and runtime exchange.

    span: "layer" (a segment of one layer) or "segment" (consecutive layers as one unit).
    layout_in, layout_out: the layout (LAYOUTS) the strategy reads at its entry and leaves at its exit.
    exact: computes the single-process function (else the planner considers it only with --approximate).
    approximates: what an approximate strategy changes (for --explain and the refusal without --approximate).
    comm_op: the op insert-comm puts before each read of neighbours' rows, None when none is needed.
    sync_op: the op a `sync` becomes (P3's pull), None when a sync stays a no-op.
    entry_op: the op that fetches the input's rows when a segment starts after the first graph layer.
    runnable: the runtime executes it; plannable: the planner may choose it.
    first_layer_only: legal on the first graph layer only (P3 splits the input features).
    single_worker: the strategy of one worker (every other strategy needs several).
    rows: the row rule (RowRule above).
    halo: reads remote rows through a halo (possibly empty, as under DepCache).
    default_partition: the partition method compile uses for it when the user names none.
    approximates: what an approximate strategy changes (for --explain and the refusal without --approximate).
    whole_model: its one segment spans every graph layer (the planner prices only the span 0..L).
    batching: the ways of training it runs in (BATCHING).
    bins: its graph layers may run in G3's bins (its rows are its own and it aggregates over a structure it
        holds; not P3's feature slices nor MG-GCN's blocks); `bins` is then a schedule option of its formula.
    """

    name: str
    summary: str
    span: Literal["layer", "segment"]
    layout_in: str
    layout_out: str
    exact: bool = True
    comm_op: str | None = None
    sync_op: str | None = None
    entry_op: str | None = None
    runnable: bool = True
    plannable: bool = True
    first_layer_only: bool = False
    single_worker: bool = False
    rows: RowRule = "owned"
    halo: bool = False
    default_partition: str | None = None
    approximates: str = ""
    whole_model: bool = False
    batching: tuple[str, ...] = ("full",)
    bins: bool = False

    def __post_init__(self) -> None:
        for layout in (self.layout_in, self.layout_out):
            if layout not in LAYOUTS:
                raise ValueError(f"strategy {self.name}: layout {layout!r} is not one of {LAYOUTS}")
        if not self.batching or not set(self.batching) <= set(BATCHING):
            raise ValueError(f"strategy {self.name}: batching {self.batching!r} is not a subset of {BATCHING}")
        if self.exact == bool(self.approximates):
            raise ValueError(f"strategy {self.name}: an approximate strategy says what it approximates, "
                             f"an exact one does not")

    @property
    def nested_rows(self) -> bool:
        """Whether its row sets grow below the last layer of its segment (one row order per segment)."""
        return self.span == "segment"

    @property
    def comm_ops(self) -> tuple[str, ...]:
        """Every communication op the IR of this strategy may hold (the runtime needs an exchange for each)."""
        return tuple(op for op in (self.comm_op, self.sync_op, self.entry_op) if op is not None)


def _registry(*defs: StrategyDef) -> Mapping[str, StrategyDef]:
    return MappingProxyType({s.name: s for s in defs})


# The order is the planner's: candidates, the DP's tables and the plan's alternatives follow it.
STRATEGIES: Mapping[str, StrategyDef] = _registry(
    StrategyDef("depcomm", "NeutronStar's DepComm / G3: fetch remote in-neighbours' rows every layer",
                "layer", "vertex", "vertex", comm_op="halo", rows="owned", halo=True, bins=True),
    StrategyDef("depcache", "NeutronStar's DepCache: replicate and recompute the L-hop neighbourhood",
                "segment", "vertex", "vertex", entry_op="fetch", rows="neighbourhood", halo=True, bins=True),
    StrategyDef("hybrid", "NeutronStar's Hybrid: cache or communicate each remote dependency (Algorithm 4)",
                "segment", "vertex", "vertex", comm_op="halo", entry_op="fetch", rows="selected", halo=True, bins=True),
    StrategyDef("bcast1d", "MG-GCN's 1D SpMM: every row block broadcast in P stages",
                "layer", "vertex", "vertex", comm_op="bcast_rows", rows="blocks", default_partition="random"),
    StrategyDef("pushpull", "P3's push-pull: the first layer on a feature slice, partial sums pulled to owners",
                "layer", "feature", "vertex", sync_op="reduce_scatter", first_layer_only=True, rows="all",
                batching=("full", "sampled")),
    # DistDGL: every worker trains the seeds it owns on their sampled blocks (sampled: no exchange inside a
    # layer); the first block's input features of remote vertices are pulled from their owners
    StrategyDef("dp-sample", "DistDGL's data-parallel minibatches: each worker samples the seeds it owns and "
                "pulls the features of sampled remote vertices", "layer", "vertex", "vertex",
                rows="owned", default_partition="hash", batching=("sampled",)),
    # GNNPipe: each stage (a group of workers) a contiguous range of layers over the whole graph, chunks
    # pipelined; a neighbour outside the chunk is read from the history (gnnc.plan.pipeline)
    StrategyDef("pipeline", "GNNPipe's layer pipeline with historical embeddings (approximate)",
                "segment", "replicated", "replicated", exact=False, comm_op="history", rows="all",
                approximates="a layer reads the historical embeddings of neighbours not yet computed this epoch "
                             "(an earlier epoch's), and every neighbour outside its chunk without gradient",
                whole_model=True),
    StrategyDef("local", "one worker runs every layer on the whole graph",
                "layer", "replicated", "replicated", plannable=False, single_worker=True, rows="all",
                batching=("full", "sampled")),
)


def strategy(name: str) -> StrategyDef:
    """The descriptor of `name`; a KeyError names the known strategies."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None


def names(*, runnable: bool | None = None, plannable: bool | None = None,
          single_worker: bool | None = None, batching: str | None = None,
          exact: bool | None = None) -> tuple[str, ...]:
    """The registered strategies' names, in registry order, filtered by the given facts."""
    return tuple(s.name for s in STRATEGIES.values()
                 if (runnable is None or s.runnable == runnable)
                 and (plannable is None or s.plannable == plannable)
                 and (single_worker is None or s.single_worker == single_worker)
                 and (batching is None or batching in s.batching)
                 and (exact is None or s.exact == exact))


def describe_assignment(per_layer: list[str] | tuple[str, ...]) -> str:
    """Per-layer strategies with repeats folded: a 64-layer GCNII reads `depcache x64`, not 64 names."""
    runs: list[tuple[str, int]] = []
    for name in per_layer:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return ",".join(name if n == 1 else f"{name} x{n}" for name, n in runs)
