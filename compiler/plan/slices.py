"""P3's feature slices: which columns of the input features each worker holds in a pushpull layer.

The planner prices them, the shard writer slices the features with them and
the runtime's layout changes (vertex <-> feature) follow them: one
definition, in the plan layer below all three.
"""
from __future__ import annotations

from gnnc.errors import GnncError
from gnnc.ir import Program

FEATURES = "x"  # the input features, the value P3 splits by columns


def feature_slices(num_features: int, parts: int) -> list[tuple[int, int]]:
    """P3's split of the feature dimension: `parts` contiguous [start, stop) column ranges.

    Bounds are F*k//parts, so widths differ by at most one and F need not
    divide by the part count (the wider slices come where the rounding puts
    them; with F < parts some slices are empty). The runtime's shards
    (gnnc.plan.shards) slice the features with it.
    """
    if parts < 1:
        raise GnncError(f"parts must be a positive integer, got {parts!r}")
    if num_features < 0:
        raise GnncError(f"the feature count must be non-negative, got {num_features}")
    bounds = [num_features * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)]


def split_weights(program: Program, pushpull: bool | None = None) -> frozenset[str]:
    """The weights P3 keeps split (section 3.2.2): each worker holds, updates and differentiates only the rows
    of its feature slice, so they are never all-reduced.

    They are the weights of the dense maps that read a value still on a feature slice: from the input
    features `x` through the first graph layer up to its pull (its `sync`, `reduce_scatter` once insert-comm
    has run), the values the distributed runtime computes on a slice (gnnc.runtime.distributed). A weight
    also read anywhere else stays whole (and replicated). `pushpull`: whether the first graph layer runs
    pushpull (None: as its `strategy` attribute says); without it nothing is split.
    """
    graph = program.graph_layers()
    if not graph or not (graph[0].attr("strategy") == "pushpull" if pushpull is None else pushpull):
        return frozenset()
    sliced: set[str] = {FEATURES}
    split: set[str] = set()
    other: set[str] = set()  # weights read where they are whole
    in_phase = True
    for layer in program.layers:
        for e in layer.eqns:
            reads = [v.name for v in e.ins]
            if in_phase and e.op == "linear" and reads and reads[0] in sliced:
                split.update(reads[1:2])
                other.update(reads[2:])
            else:
                other.update(reads)
                if in_phase and any(r in sliced for r in reads):
                    sliced.update(o.name for o in e.outs)
            if in_phase and layer.name == graph[0].name and e.op in ("sync", "reduce_scatter"):
                in_phase = False
    params = {p.value.name for p in program.params()}
    return frozenset((split & params) - other)
