"""Communication ops as descriptors: one `CommOpDef` per exchange, beside the strategies that insert them.

Why this module exists: an exchange's facts (which rows it moves and so how
many bytes predict-bytes counts, whether it can deliver its rows in parts and
under which schedule attribute, what rows its output holds in the activation
model, where the Gantt chart draws it) used to be `if op == "halo"` switches
in predict-bytes, the schedule pass, the cost model's schedule tables, the
activation model and the runtime. Each consumer now asks the registry below;
the runtime registers how to run each exchange with `@implements_exchange`
(gnnc.runtime.implementations), as it registers ops with `@implements`. A new
exchange is one `define_comm_op(CommOpDef(...))` and its `@implements_exchange`
implementation. This module sits in the core layer (gnnc.plan): it imports
the IR and the strategies only.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from gnnc.ir.ops import OPS, define_op, op_def
from gnnc.plan.strategies import STRATEGIES, StrategyDef

# A byte rule: the rows one training step's forward exchange moves, summed over the ranks, from every
# rank's row sets (gnnc.plan.rows.RowSets), the exchange's graph layer, the world size and the vertex count.
RowsRule = Callable[[list[Any], int, int, int], int]

# The Gantt chart's forward order of a layer's pieces when its exchange does not come first
# (gnnc.passes.cost.schedule: "overlap" is a Max window of the cost formula).
PIECES = ("communication", "dense", "overlap", "aggregation", "compute", "mixed")


def halo_rows(sets: list[Any], layer: int, world: int, n: int) -> int:
    """A halo: each owner sends each row once per worker needing it (gnnc.plan.rows.halo_rows)."""
    from gnnc.plan.rows import halo_rows as rows  # deferred: gnnc.plan.rows loads torch, which `gnnc check` never needs

    return rows(sets, layer)


def entry_rows(sets: list[Any], layer: int, world: int, n: int) -> int:
    """A segment's entry fetch: the rows of its neighbourhood each worker does not own (gnnc.plan.rows.entry_rows)."""
    from gnnc.plan.rows import entry_rows as rows  # deferred: gnnc.plan.rows loads torch (as above)

    return rows(sets, layer)


def every_row_to_each_other_rank(sets: list[Any], layer: int, world: int, n: int) -> int:
    """A broadcast of every block, or P3's pull: (P - 1) N rows."""
    return (world - 1) * n


def all_reduce_of_every_row(sets: list[Any], layer: int, world: int, n: int) -> int:
    """An all-reduce of N rows, as gnnc.runtime.comm counts it (reduce-scatter, then all-gather): 2 (P - 1) N."""
    return 2 * (world - 1) * n


@dataclass(frozen=True)
class CommOpDef:
    """Everything the compiler knows about one exchange; the runtime's implementation registers apart.

    Byte rule (predict-bytes):
      rows: the rows a training step's forward moves (RowsRule); None: priced by its own planner
        (GNNPipe's `history`: gnnc.passes.predict_bytes.predict_pipeline).
      counted_as: the kind the step's byte totals count it under (a fetch is a halo exchange); default: its name.
      backward: its input's gradient travels back, as many bytes, when that input depends on a parameter.
    Split rule (the schedule pass, gnnc.plan.schedule_attrs):
      split_flag: the equation attribute that makes it deliver its rows in parts, its readers running per
        part while the rest is in flight ("overlap", "staged"); also the schedule option of the formulas
        of the strategies inserting it. None: it delivers whole values only.
      split_in_bins: a binned layer (G3) may post it split, running the bins of held rows while it is in flight.
      parts_read_once: each part is read by one equation and dropped (a worker holds two of them), so a
        split needs a single reader through the edges.
      no_overlap_methods: message orders (`method`) under which its split overlaps nothing.
      chunk_flag: the equation attribute that makes a split exchange deliver its remote rows peer by peer, each
        peer's as they arrive, in ring order (NeutronStar's chunks), its readers running once per peer; also the
        schedule option of the formulas of the strategies inserting it. None: the remote rows come as one part.
      ordered: it takes a message order (`method`, gnnc.plan.schedule_attrs.HALO_METHODS).
    Memory rule (gnnc.passes.cost.activations):
      output_rows: "received": its output holds the rows the layer reads (held and received);
        "owned": the owners' rows, and so does every value after it in its layer (P3's pull).
    Schedule tables:
      draw_order: the Gantt chart's forward order of a strategy inserting it (None: PIECES).
      combines_partials: where a layer's partial results over feature slices are summed at the owners
        (a minibatch runner's model-parallel phase ends here).
    """

    name: str
    summary: str
    rows: RowsRule | None
    counted_as: str = ""
    backward: bool = True
    split_flag: str | None = None
    split_in_bins: bool = False
    parts_read_once: bool = False
    no_overlap_methods: tuple[str, ...] = ()
    chunk_flag: str | None = None
    ordered: bool = False
    output_rows: Literal["received", "owned"] = "received"
    draw_order: tuple[str, ...] | None = None
    combines_partials: bool = False

    def __post_init__(self) -> None:
        if not self.counted_as:
            object.__setattr__(self, "counted_as", self.name)
        if self.draw_order is not None and sorted(self.draw_order) != sorted(PIECES):
            raise ValueError(f"exchange {self.name}: draw_order must order {PIECES}")
        if (self.split_in_bins or self.parts_read_once or self.no_overlap_methods or self.chunk_flag) \
                and self.split_flag is None:
            raise ValueError(f"exchange {self.name}: a split rule without a split_flag")


COMM_OP_DEFS: dict[str, CommOpDef] = {}


def define_comm_op(d: CommOpDef) -> CommOpDef:
    """Register exchange `d`; the IR gets its op (typed as every exchange: the input's shape, more rows) if new."""
    if d.name in COMM_OP_DEFS:
        raise ValueError(f"exchange {d.name!r} is already defined")
    if d.name not in OPS:
        define_op(dataclasses.replace(op_def("halo"), name=d.name))
    elif not op_def(d.name).comm:
        raise ValueError(f"op {d.name!r} is not a communication op")
    COMM_OP_DEFS[d.name] = d
    return d


def comm_op(name: str) -> CommOpDef:
    """The descriptor of exchange `name`; a KeyError names the known ones."""
    try:
        return COMM_OP_DEFS[name]
    except KeyError:
        raise KeyError(f"unknown exchange {name!r} (known: {', '.join(COMM_OP_DEFS)})") from None


def exchange_of(op: str) -> CommOpDef | None:
    """The descriptor of `op` when it is an exchange, else None; a KeyError for a communication op of the IR
    without one (priced as nothing, it would move bytes no prediction counts)."""
    d = COMM_OP_DEFS.get(op)
    if d is None and op in OPS and OPS[op].comm:
        raise KeyError(f"communication op {op!r} has no CommOpDef (gnnc.plan.comm_ops.define_comm_op)")
    return d


def split_flags() -> tuple[str, ...]:
    """Every split attribute, in registry order, once."""
    return tuple(dict.fromkeys(d.split_flag for d in COMM_OP_DEFS.values() if d.split_flag is not None))


def chunk_flags() -> tuple[str, ...]:
    """Every chunk attribute (a split exchange's remote rows peer by peer), in registry order, once."""
    return tuple(dict.fromkeys(d.chunk_flag for d in COMM_OP_DEFS.values() if d.chunk_flag is not None))


def byte_kinds(strategies: Mapping[str, StrategyDef] = STRATEGIES) -> tuple[str, ...]:
    """The kinds a step's byte totals always list (0 when absent): those of the exchanges the strategies insert
    and predict-bytes prices, in strategy order. An exchange no strategy inserts is listed where a plan holds it."""
    ops = (op for s in strategies.values() for op in s.comm_ops)
    return tuple(dict.fromkeys(comm_op(op).counted_as for op in ops if comm_op(op).rows is not None))


def schedule_options(strategy: str) -> tuple[str, ...]:
    """The schedule options a strategy's built-in formula takes: the split flag of each exchange it inserts,
    then their chunk flags, then `bins` when it runs in G3's bins (gnnc.passes.cost.neutronstar, .mggcn)."""
    s = STRATEGIES.get(strategy)
    if s is None:
        return ()
    flags = [comm_op(op).split_flag for op in s.comm_ops] + [comm_op(op).chunk_flag for op in s.comm_ops]
    return tuple(dict.fromkeys(f for f in flags if f is not None)) + (("bins",) if s.bins else ())


def draw_order(strategy: str) -> tuple[str, ...]:
    """The Gantt chart's forward order of a strategy's pieces: its first exchange's that has one, else PIECES."""
    s = STRATEGIES.get(strategy)
    orders = (comm_op(op).draw_order for op in (s.comm_ops if s is not None else ()))
    return next((o for o in orders if o is not None), PIECES)


# The exchanges of gnnc's strategies (gnnc.plan.strategies: comm_op, sync_op, entry_op); their IR ops are defined
# in gnnc.ir.ops, which must parse a plan without this layer.
define_comm_op(CommOpDef("halo", "DepComm / G3: the held rows, then the remote in-neighbours' rows of the layer",
                         halo_rows, split_flag="overlap", split_in_bins=True, no_overlap_methods=("ring_paced",),
                         chunk_flag="chunked", ordered=True))
define_comm_op(CommOpDef("fetch", "entering a DepCache / Hybrid segment: the neighbourhood rows not owned",
                         entry_rows, counted_as="halo", ordered=True))
define_comm_op(CommOpDef("bcast_rows", "MG-GCN's 1D SpMM: every rank's row block to every rank",
                         every_row_to_each_other_rank, split_flag="staged", parts_read_once=True,
                         draw_order=("dense", "communication", "overlap", "aggregation", "compute", "mixed")))
define_comm_op(CommOpDef("reduce_scatter", "P3's pull: every vertex's partial sums, summed at its owner",
                         every_row_to_each_other_rank, output_rows="owned", combines_partials=True,
                         draw_order=("dense", "aggregation", "overlap", "communication", "compute", "mixed")))
define_comm_op(CommOpDef("sync_scores", "P3's sync of attention scores in a pushpull layer: every rank's partial dot "
                         "products of every vertex, summed on every rank", all_reduce_of_every_row,
                         counted_as="allreduce"))
define_comm_op(CommOpDef("history", "GNNPipe: a chunk's rows from the group's peers, the rest from the history",
                         None))
