"""Which strategies a layer may legally run with.

`pushpull` (P3) splits the layer's input along the feature dim: each worker
computes the layer on its feature slice for every vertex and `sync` sums the
partial results. That is exact only when everything between the input and
the sync is linear in the input: linear maps without bias, aggregations by
sum or mean with weights that do not depend on the input, scaling by
constants or edge data, sums of such terms; and when a dense map has summed
over each worker's feature slice before the sync (a worker's partial is then
a whole row; without one it is a slice of other columns, not addable). A bias, a non-linearity, an
attention softmax or a max before the sync forbids it; this module names the
equation that does (each op's `linear_in` trait and `nonlinear_why`, in
gnnc.ir.ops). Attention is the exception P3 makes (section 3.2.2: the tensors
that need a global sync inside the model-parallel phase): in full-graph steps
the scores' dot products of a dense map's partial are summed over the workers
before the softmax reads them (`synced_scores`; insert-comm's `sync_scores`),
so GAT's first layer may run pushpull. The default pipeline's `sink-bias` pass runs first and
moves a bias past sums and the sync wherever that is exact (SAGE's lin_l
bias), so a bias found here is one that cannot move.

A depcache or hybrid segment entered after the first graph layer fetches its
input's rows on entry, and only those (`segment_can_start_at`): the planner
prices only the segments assign-strategy accepts.
"""
from __future__ import annotations

from gnnc.ir import Eqn, Layer, Program
from gnnc.ir.ops import op_def


def pushpull_blocker(layer: Layer, sync_scores: bool = False) -> tuple[Eqn | None, str] | None:
    """None if the layer may run pushpull; else (equation, reason). `sync_scores`: the runtime sums attention
    scores over the workers before they are used (full-graph steps do, `synced_scores`; sampled ones do not)."""
    return _walk(layer, sync_scores)[0]


def synced_scores(layer: Layer) -> list[Eqn]:
    """The equations of a pushpull layer whose results insert-comm sums over the workers (`sync_scores`) before
    any use: P3's sync of GAT's attention scores (section 3.2.2). Each is a `dot` of a dense map's partial
    result (a whole row on each worker, its partial sum over the worker's features) with a weight: linear in
    that partial, so the sum over the workers of their dot products is the score one process computes, and
    what reads it (the softmax, its dropout) runs on every vertex's whole score, the same on every worker."""
    return _walk(layer, True)[1]


def _walk(layer: Layer, sync_scores: bool) -> tuple[tuple[Eqn | None, str] | None, list[Eqn]]:
    syncs = [i for i, e in enumerate(layer.eqns) if e.op == "sync"]
    if len(syncs) != 1:
        why = "has no sync statement" if not syncs else "has more than one sync"
        return (None, f"the layer {why}: pushpull sums partial results at exactly one sync"), []
    k = syncs[0]
    if layer.eqns[k].attr("reduce") != "sum":
        return (layer.eqns[k], "pushpull needs sync = sum(...) (partials are added)"), []
    h = layer.inputs[0].name
    dep: set[str] = {h}  # values that depend on the layer input (partial results on each worker)
    # values on a worker's feature slice: its columns only, until a dense map sums over them (the partials the
    # sync adds are then whole rows); a slice reaching the sync, or meeting a summed partial, is not addable
    sliced: set[str] = {h}
    scores: list[Eqn] = []
    for e in layer.eqns[:k]:
        reads = [v.name in dep for v in e.ins]
        if not any(reads):
            continue
        op = op_def(e.op)
        if sync_scores and e.op == "dot" and reads[0] and not any(reads[1:]) and e.ins[0].name not in sliced:
            scores.append(e)  # summed over the workers before use: a whole value, no longer a partial
            continue
        if not op.linear_in(e, reads):
            return (e, f"'{e.op}' {op.nonlinear_why}"), scores
        dep.update(o.name for o in e.outs)
        slices = [v.name in sliced for v in e.ins]
        if e.op == "linear" and slices[0]:
            continue  # x W over a slice of x's columns: a whole-row partial sum
        if any(slices):
            if any(r and not c for r, c in zip(reads, slices)):
                return (e, f"'{e.op}' combines a feature slice with a partial sum of a dense map"), scores
            sliced.update(o.name for o in e.outs)
    if layer.eqns[k].ins[0].name in sliced:
        return (layer.eqns[k], ("no dense map before the sync: each worker's partial would be its own slice of "
                                "the features, which the sync cannot add")), scores
    for e in layer.eqns[k + 1:]:
        for v in e.ins:
            if v.name in dep and v.name != layer.eqns[k].outs[0].name:
                return (e, f"'{e.op}' reads %{v.name}, a partial result from before the sync"), scores
    return None, scores


def vertex_inputs(layer) -> list:
    """The vertex values a graph layer reads."""
    return [v for v in layer.inputs if v.type is not None and v.type.domain == "vertex"]


def fetchable(layer) -> bool:
    """Whether `layer` may sit in a depcache/hybrid segment entered after graph layer 0.

    Such a segment fetches its input's rows on entry, and only those, so its
    layers may read no other vertex value from before it (GCNII's h0 would be
    held for the owned rows only).
    """
    return len(vertex_inputs(layer)) <= 1


def segment_can_start_at(program: Program, start: int, end: int) -> bool:
    """Whether a depcache/hybrid segment may hold graph layers [start, end)."""
    return start == 0 or all(fetchable(layer) for layer in program.graph_layers()[start:end])
