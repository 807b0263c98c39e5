"""Which strategies a layer may legally run with.

`pushpull` (P3) splits the layer's input along the feature dim: each worker
computes the layer on its feature slice for every vertex and `sync` sums the
partial results. That is exact only when everything between the input and
the sync is linear in the input: linear maps without bias, aggregations by
sum or mean with weights that do not depend on the input, scaling by
constants or edge data, sums of such terms. A bias, a non-linearity, an
attention softmax or a max before the sync forbids it; this module names the
equation that does (each op's `linear_in` trait and `nonlinear_why`, in
gnnc.ir.ops). The default pipeline's `sink-bias` pass runs first and
moves a bias past sums and the sync wherever that is exact (SAGE's lin_l
bias), so a bias found here is one that cannot move.
"""
from __future__ import annotations

from gnnc.ir import Eqn, Layer
from gnnc.ir.ops import op_def


def pushpull_blocker(layer: Layer) -> tuple[Eqn | None, str] | None:
    """None if the layer may run pushpull; else (equation, reason)."""
    syncs = [i for i, e in enumerate(layer.eqns) if e.op == "sync"]
    if len(syncs) != 1:
        why = "has no sync statement" if not syncs else "has more than one sync"
        return None, f"the layer {why}: pushpull sums partial results at exactly one sync"
    k = syncs[0]
    if layer.eqns[k].attr("reduce") != "sum":
        return layer.eqns[k], "pushpull needs sync = sum(...) (partials are added)"
    h = layer.inputs[0].name
    dep: set[str] = {h}  # values that depend on the layer input
    for e in layer.eqns[:k]:
        reads = [v.name in dep for v in e.ins]
        if not any(reads):
            continue
        op = op_def(e.op)
        if not op.linear_in(e, reads):
            return e, f"'{e.op}' {op.nonlinear_why}"
        dep.update(o.name for o in e.outs)
    for e in layer.eqns[k + 1:]:
        for v in e.ins:
            if v.name in dep and v.name != layer.eqns[k].outs[0].name:
                return e, f"'{e.op}' reads %{v.name}, a partial result from before the sync"
    return None
