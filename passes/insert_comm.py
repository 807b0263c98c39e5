"""insert-comm: make the communication each strategy needs explicit in the IR.

In a vertex-partitioned layer a worker holds the rows of its own vertices;
an op that reads neighbours' rows (its OpDef's `reads_neighbours` operands:
`src`, `spmm`'s input, `sddmm`'s source side) needs remote rows too:

* `depcomm` inserts `halo(v)`: the owned rows followed by the remote
  in-neighbours' rows, fetched once per (vertex, remote worker) pair
  (NeutronStar's DepComm; backward sums the gradients at the owner);
* `hybrid` inserts `halo(v)` too: the rows held (owned and cached) followed
  by the remote dependencies the selection communicates;
* `bcast1d` inserts `bcast_rows(v)`: every worker's row block broadcast in P
  stages (MG-GCN), giving all rows in block order.

One communication per value and layer, placed just before its first use.
In a `pushpull` layer (P3) the rows are all vertices, the features a slice;
its `sync` becomes `reduce_scatter`: the partial results are summed at each
vertex's owner (P3's pull; backward pushes the gradient to every worker), and
each attention score computed from a partial result is followed by
`sync_scores`, its sum over the workers, before the softmax reads it (P3's
sync of GAT's scores; gnnc.passes.analysis.legality.synced_scores).
`depcache` and `local` layers read only rows they hold: nothing is inserted,
except where a depcache or hybrid segment starts after the first graph
layer: `fetch(v)` on its input brings the rows of its replicated
neighbourhood from their owners (the vertex-partitioned -> replicated
transition; backward sums the gradients at the owners).
Which rows a halo carries is decided per worker and layer by the row sets
of gnnc.plan.rows, from the partition and the hybrid selection.
"""
from __future__ import annotations

from gnnc.ir import Eqn, Layer, Program, Value, attrs_of
from gnnc.ir.ops import reads_neighbours
from gnnc.passes.analysis.legality import synced_scores
from gnnc.passes.manager import PassContext, register_pass
from gnnc.plan.strategies import STRATEGIES, StrategyDef


def _strategy(layer: Layer) -> StrategyDef | None:
    """The descriptor of the strategy a graph layer runs (None for other layers)."""
    name = layer.attr("strategy")
    return None if name is None else STRATEGIES[name]


def _fetch_on_entry(layer: Layer, index: int) -> Layer:
    """A depcache/hybrid segment entered after layer 0: fetch its input's rows of C^s first."""
    sd = _strategy(layer)
    if sd is None or sd.entry_op is None or layer.attr("segment") != index or index == 0:
        return layer
    v = next(v for v in layer.inputs if v.type is not None and v.type.domain == "vertex")
    ext = Value(f"{v.name}^{sd.entry_op}", v.type)
    first = layer.eqns[0]
    eqns = [Eqn(sd.entry_op, (v,), (ext,), attrs_of(), first.prim, first.loc)]
    eqns += [e.replace(ins=tuple(ext if i.name == v.name else i for i in e.ins)) for e in layer.eqns]
    return layer.replace(eqns=tuple(eqns))


def _insert(layer: Layer) -> Layer:
    sd = _strategy(layer)
    if sd is not None and sd.sync_op is not None:
        return _sync_scores(layer.replace(eqns=tuple(
            Eqn(sd.sync_op, e.ins, e.outs, attrs_of(reduce="sum"), e.prim, e.loc) if e.op == "sync" else e
            for e in layer.eqns)), synced_scores(layer))
    op = sd.comm_op if sd is not None else None
    if op is None:
        return layer
    replaced: dict[str, Value] = {}
    eqns: list[Eqn] = []
    for e in layer.eqns:
        ins = list(e.ins)
        for k in reads_neighbours(e):  # the inputs whose rows are read through edges
            v = ins[k]
            if v.name not in replaced:
                ext = Value(f"{v.name}^{op}", v.type)
                eqns.append(Eqn(op, (v,), (ext,), attrs_of(), e.prim, e.loc))
                replaced[v.name] = ext
            ins[k] = replaced[v.name]
        eqns.append(e.replace(ins=tuple(ins)))
    return layer.replace(eqns=tuple(eqns))


def _sync_scores(layer: Layer, scores: list[Eqn]) -> Layer:
    """After each attention score of a pushpull layer (legality.synced_scores): `sync_scores`, the sum over the
    workers of their partial dot products (P3's sync of GAT's scores); its readers read the sum."""
    outs = {e.outs[0].name for e in scores}
    replaced: dict[str, Value] = {}
    eqns: list[Eqn] = []
    for e in layer.eqns:
        eqns.append(e.replace(ins=tuple(replaced.get(v.name, v) for v in e.ins)))
        if e.outs[0].name in outs:
            v = e.outs[0]
            replaced[v.name] = Value(f"{v.name}^sync", v.type)
            eqns.append(Eqn("sync_scores", (v,), (replaced[v.name],), attrs_of(), e.prim, e.loc))
    return layer.replace(eqns=tuple(eqns))


@register_pass("insert-comm", "insert halo exchanges (depcomm, hybrid), staged broadcasts (bcast1d), P3's pull",
               requires=("strategies",))
def insert_comm(program: Program, ctx: PassContext) -> Program:
    index = {layer.name: k for k, layer in enumerate(program.graph_layers())}
    return program.replace(layers=tuple(_insert(_fetch_on_entry(layer, index.get(layer.name, -1)))
                                         for layer in program.layers))
