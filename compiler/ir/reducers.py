"""The one definition of every aggregation reducer: `gather a = sum(m)`, `sync s = sum(t)`.

A reducer is a `ReducerDef` registered with `define_reducer`: the statements
it may appear in, the traits passes ask (`linear`), how partial aggregates of
disjoint sets of edges combine (the parts of a split exchange, gnnc.runtime.parts)
and what it costs beyond a sum (the cost model). Elaboration, lowering,
reorder-gemm, the kernels and the runtime read these fields instead of lists
of names. The runtime registers how to finalise a reducer's partials
(gnnc.runtime.kernels.reducers), so a new reducer is one `define_reducer(...)`
here plus its implementation there. Reducer names are part of the plan format
(the `reduce` attribute of `gather`, `spmm` and `sync`).
"""
from __future__ import annotations

from dataclasses import dataclass

COMBINES = ("add", "max", "min", "whole")


@dataclass(frozen=True)
class ReducerCost:
    """What a reducer costs, in units of a sum's aggregation (one multiply-add per edge and feature).

    edge: multiply-adds per edge and feature, forward and backward (a sum's 1; std's 2: x and x*x);
    row: elementwise operations per output row and feature after the edges (std's finalise: mean, square,
        difference, clamp, square root, mask), priced at the elementwise rate on the rows it outputs;
    state: extra elements per output row and feature kept until the backward (std's sums).
    """

    edge: float = 1.0
    row: float = 0.0
    state: float = 0.0


@dataclass(frozen=True)
class ReducerDef:
    """Everything the compiler knows about one reducer.

    gather / sync: the statements it may be called in (`gather a = r(m)`, `sync s = r(t)`);
    emits: the IR op a gather elaborates to: `gather[reduce=r]`, or `edge_softmax` (softmax: one
        value per edge, normalised over the destination's in-edges, not one row per vertex);
    linear: r(a*x + b*y) = a*r(x) + b*r(y) over the messages (sum, mean): the aggregation distributes over a
        matmul and over partial sums, so reorder-gemm may move a dense map across it, lowering may fold an
        edge weight into the SpMM, P3's legality lets it run on feature slices, and its backward never
        reads its own result;
    combine: how the partial aggregates of disjoint sets of a row's in-edges combine into the whole:
        "add": each partial is, per row, the sum over its edges of message**k for each k in `powers`
        (sum and mean: (1,), std: (1, 2)); partials add, and the runtime's finalise turns the total and
        the whole in-degree into the result (mean divides by it);
        "max" / "min": the larger / smaller of the partials, a part without an edge at a row left out;
        "whole": no partial form, every edge at once (softmax);
    powers: see `combine` ("add" only);
    cost: see ReducerCost.
    A row without in-edges aggregates to 0 for every reducer.
    """

    name: str
    gather: bool = True
    sync: bool = False
    emits: str = "gather"
    linear: bool = False
    combine: str = "add"
    powers: tuple[int, ...] = (1,)
    cost: ReducerCost = ReducerCost()

    @property
    def per_edge(self) -> bool:
        """The result is an edge value (softmax), not a row per vertex."""
        return self.emits != "gather"


REDUCERS: dict[str, ReducerDef] = {}


def define_reducer(r: ReducerDef) -> ReducerDef:
    """Register a reducer; a name is defined once."""
    if r.name in REDUCERS:
        raise ValueError(f"reducer '{r.name}' is already defined")
    if r.combine not in COMBINES:
        raise ValueError(f"reducer '{r.name}': unknown combine {r.combine!r} (known: {', '.join(COMBINES)})")
    if r.combine == "add" and (not r.powers or any(k < 1 for k in r.powers)):
        raise ValueError(f"reducer '{r.name}': an additive reducer's powers are positive integers")
    REDUCERS[r.name] = r
    return r


def reducer(name: str) -> ReducerDef:
    """The definition of a reducer the IR holds; a missing one is a compiler bug."""
    r = REDUCERS.get(name)
    if r is None:
        raise KeyError(f"internal: reducer '{name}' is not defined in gnnc.ir.reducers")
    return r


def gather_reducers() -> tuple[str, ...]:
    """The reducers a gather statement may call, in definition order."""
    return tuple(name for name, r in REDUCERS.items() if r.gather)


def sync_reducers() -> tuple[str, ...]:
    """The reducers a sync statement may call, in definition order."""
    return tuple(name for name, r in REDUCERS.items() if r.sync)


def is_linear(name: str | None) -> bool:
    """Whether the reducer named by an equation's `reduce` attribute is linear (False for none)."""
    return name is not None and reducer(name).linear


define_reducer(ReducerDef("sum", sync=True, linear=True))
define_reducer(ReducerDef("mean", sync=True, linear=True))  # partial: the sum; the count is the in-degree
define_reducer(ReducerDef("max", sync=True, combine="max"))
define_reducer(ReducerDef("min", combine="min"))
define_reducer(ReducerDef("softmax", emits="edge_softmax", combine="whole"))
# PyG's StdAggregation: sqrt(E[m^2] - E[m]^2) where that variance exceeds 1e-5, else 0
define_reducer(ReducerDef("std", powers=(1, 2), cost=ReducerCost(edge=2.0, row=6.0, state=2.0)))
