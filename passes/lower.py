"""lower: rewrite graph ops into the kernels the runtime knows.

Patterns, applied inside each graph layer until none matches:

* `gather[r](src(x))` -> `spmm[reduce=r](x)` for every reducer r
  (copy the source row, reduce: no per-edge tensor is built);
* `gather[r](mul(w, src(x)))` -> `spmm[reduce=r](x, w)` for a linear r (sum,
  mean: gnnc.ir.reducers), where `w` is an edge weight (edge data such as gcn_norm, or attention
  coefficients) whose shape is a prefix of x's (per edge, or per head);
* `dot(src(z), a)` -> `src(dot(z, a))`: a per-vertex op computed once per
  vertex instead of once per edge (the attention scores of GAT);
* `add|mul(src(p), dst(q))` -> `sddmm[op](p, q)`.

Each rewrite only fires when the intermediate edge value has no other use;
dead equations are then removed. Results are exact: the rewrites are
algebraic identities (checked numerically in the tests).
"""
from __future__ import annotations

from collections import Counter

from gnnc.ir import Eqn, Layer, Program, Value, attrs_of
from gnnc.ir.reducers import is_linear
from gnnc.passes.manager import PassContext, register_pass


def _uses(layer: Layer) -> Counter:
    c: Counter = Counter()
    for e in layer.eqns:
        for v in e.ins:
            c[v.name] += 1
    for v in layer.outputs:
        c[v.name] += 1
    return c


def _defs(eqns: list[Eqn]) -> dict[str, int]:
    return {o.name: i for i, e in enumerate(eqns) for o in e.outs}


def _is_prefix_shape(w: Value, x: Value) -> bool:
    ws, xs = w.type.shape, x.type.shape
    return len(ws) <= len(xs) and all((a - b) == 0 for a, b in zip(ws, xs[: len(ws)]))


def _rewrite_once(layer: Layer) -> Layer | None:
    eqns = list(layer.eqns)
    defs = _defs(eqns)
    uses = _uses(layer)

    def producer(v: Value) -> Eqn | None:
        i = defs.get(v.name)
        return eqns[i] if i is not None else None

    def single_use(v: Value) -> bool:
        return uses[v.name] == 1

    for i, e in enumerate(eqns):
        if e.op == "gather":
            reduce = e.attr("reduce")
            m = e.ins[0]
            p = producer(m)
            if p is None or not single_use(m):
                continue
            if p.op == "src":
                eqns[i] = Eqn("spmm", (p.ins[0],), e.outs, attrs_of(reduce=reduce), e.prim, e.loc)
                return layer.replace(eqns=tuple(eqns))
            if p.op == "mul" and is_linear(reduce):
                for s_idx, w_idx in ((1, 0), (0, 1)):
                    s, w = p.ins[s_idx], p.ins[w_idx]
                    ps = producer(s)
                    if (ps is not None and ps.op == "src" and single_use(s) and w.type.domain == "edge"
                            and _is_prefix_shape(w, ps.ins[0])):
                        eqns[i] = Eqn("spmm", (ps.ins[0], w), e.outs, attrs_of(reduce=reduce), e.prim, e.loc)
                        return layer.replace(eqns=tuple(eqns))
        if e.op == "dot":
            z = e.ins[0]
            p = producer(z)
            if p is not None and p.op in ("src", "dst") and single_use(z):
                vertex_val = Value(e.outs[0].name + "^v", e.outs[0].type.replace(domain="vertex"))
                new_dot = e.replace(ins=(p.ins[0],) + e.ins[1:], outs=(vertex_val,))
                gather = Eqn(p.op, (vertex_val,), e.outs, (), e.prim, e.loc)
                eqns[i:i + 1] = [new_dot, gather]
                return layer.replace(eqns=tuple(eqns))
        if e.op in ("add", "mul"):
            pa, pb = producer(e.ins[0]), producer(e.ins[1])
            if (pa is not None and pb is not None and single_use(e.ins[0]) and single_use(e.ins[1])
                    and {pa.op, pb.op} == {"src", "dst"}):
                s, d = (pa, pb) if pa.op == "src" else (pb, pa)
                eqns[i] = Eqn("sddmm", (s.ins[0], d.ins[0]), e.outs, attrs_of(op=e.op), e.prim, e.loc)
                return layer.replace(eqns=tuple(eqns))
    return None


def _dce(layer: Layer) -> Layer:
    """Drop equations whose results nobody reads (the fused-away src/mul)."""
    eqns = list(layer.eqns)
    live = {v.name for v in layer.outputs}
    kept: list[Eqn] = []
    for e in reversed(eqns):
        if any(o.name in live for o in e.outs):
            kept.append(e)
            live.update(v.name for v in e.ins)
    return layer.replace(eqns=tuple(reversed(kept)))


def lower_layer(layer: Layer) -> Layer:
    if layer.kind != "graph":
        return layer
    while True:
        new = _rewrite_once(layer)
        if new is None:
            break
        layer = _dce(new)
    return layer


@register_pass("lower", "fuse scatter/gather patterns into spmm, sddmm and edge_softmax kernels")
def lower(program: Program, ctx: PassContext) -> Program:
    return program.replace(layers=tuple(lower_layer(layer) for layer in program.layers))
