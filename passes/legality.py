"""Which strategies a layer may legally run with.

`pushpull` (P3) splits the layer's input along the feature dim: each worker
computes the layer on its feature slice for every vertex and `sync` sums the
partial results. That is exact only when everything between the input and
the sync is linear in the input: linear maps without bias, aggregations by
sum or mean with weights that do not depend on the input, scaling by
constants or edge data, sums of such terms. A bias, a non-linearity, an
attention softmax or a max before the sync forbids it; this module names the
equation that does. The default pipeline's `sink-bias` pass runs first and
moves a bias past sums and the sync wherever that is exact (SAGE's lin_l
bias), so a bias found here is one that cannot move.
"""
from __future__ import annotations

from gnnc.ir import Eqn, Layer

_LINEAR_ALWAYS = {"src", "dst", "neg", "concat", "mean_heads", "dropout"}
_SUM_LIKE = {"add", "sub"}


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
        ok = (
            e.op in _LINEAR_ALWAYS - {"dropout"}
            or (e.op == "linear" and not e.attr("bias") and reads[0] and not any(reads[1:]))
            or (e.op == "spmm" and e.attr("reduce") in ("sum", "mean") and reads[0] and not any(reads[1:]))
            or (e.op == "gather" and e.attr("reduce") in ("sum", "mean"))
            or (e.op in ("mul", "div") and sum(reads) == 1 and (e.op == "mul" or reads[0]))
            or (e.op in _SUM_LIKE and all(reads))
        )
        if e.op == "sddmm" or e.op == "edge_softmax" or e.op == "dot":
            return e, f"'{e.op}' computes attention from the input before the sync (not linear in it)"
        if not ok:
            if e.op == "dropout":
                why = "inside the layer before the sync is not supported with pushpull"
            elif e.op in ("linear", "bias"):
                # sink-bias already moved every bias it could prove exact to move; this one it could not
                why = ("adds a bias before the sync (the bias must come once, after it; sink-bias moves it there "
                       "only across sums, not across an aggregation, a product or a non-linearity)")
            elif e.op in _SUM_LIKE:
                why = "adds a term that does not depend on the input before the sync (it would be added once per worker)"
            else:
                why = "is not linear in the layer's input"
            return e, f"'{e.op}' {why}"
        dep.update(o.name for o in e.outs)
    for e in layer.eqns[k + 1:]:
        for v in e.ins:
            if v.name in dep and v.name != layer.eqns[k].outs[0].name:
                return e, f"'{e.op}' reads %{v.name}, a partial result from before the sync"
    return None
