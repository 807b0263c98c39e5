"""reorder-gemm: run the dense map before the aggregation when that narrows it (MG-GCN 4.4).

`linear(spmm[r](x, w), W, b)` with a linear r (sum, mean: gnnc.ir.reducers) equals
`bias(spmm[r](linear(x, W), w), b)`: aggregation is linear in its input, and
the bias is added after the aggregation exactly where it was before, so it
never passes through the edge weights (where it would not commute). The rewrite
fires when the aggregated value has no other use and d_out <= d_in under the
program's configuration, so the SpMM (and, distributed, every exchanged row)
gets narrower. Symbolic dims whose values are unknown leave the layer alone.
"""
from __future__ import annotations

from collections import Counter

import sympy

from gnnc.ir import Eqn, Layer, Program, Value, attrs_of, dim
from gnnc.ir.reducers import is_linear
from gnnc.passes.manager import PassContext, register_pass


def _value(d, config: dict) -> float | None:
    expr = dim(d).subs({sympy.Symbol(k): v for k, v in config.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return None if expr.free_symbols else float(expr)


def _rewrite(layer: Layer, config: dict) -> Layer | None:
    eqns = list(layer.eqns)
    uses: Counter = Counter(v.name for e in eqns for v in e.ins)
    uses.update(v.name for v in layer.outputs)
    defs = {o.name: i for i, e in enumerate(eqns) for o in e.outs}
    for j, lin in enumerate(eqns):
        if lin.op != "linear" or lin.attr("heads") is not None:
            continue
        a = lin.ins[0]
        i = defs.get(a.name)
        if i is None or uses[a.name] != 1:
            continue
        agg = eqns[i]
        if agg.op != "spmm" or not is_linear(agg.attr("reduce")) or len(agg.outs[0].type.shape) != 1:
            continue
        if len(agg.ins) > 1 and agg.ins[1].type.shape:  # per-head weights: the map must stay per head
            continue
        d_in, d_out = (_value(a.type.shape[0], config), _value(lin.outs[0].type.shape[0], config))
        if d_in is None or d_out is None or d_out > d_in:
            continue
        out = lin.outs[0]
        x = agg.ins[0]
        mapped = Value(out.name + "^g", out.type)
        aggregated = Value(out.name + "^a", out.type) if len(lin.ins) > 2 else out
        new = [Eqn("linear", (x, lin.ins[1]), (mapped,), attrs_of(bias=False, out=lin.attr("out")), lin.prim,
                   lin.loc),
               Eqn("spmm", (mapped,) + agg.ins[1:], (aggregated,), agg.attrs, agg.prim, agg.loc)]
        if len(lin.ins) > 2:
            new.append(Eqn("bias", (aggregated, lin.ins[2]), (out,), (), lin.prim, lin.loc))
        # the new chain needs x (defined before the spmm) and replaces both equations at the linear's place
        eqns = eqns[:i] + eqns[i + 1:j] + new + eqns[j + 1:]
        return layer.replace(eqns=tuple(eqns))
    return None


@register_pass("reorder-gemm", "move a dense map before the aggregation when d_out <= d_in (exact)")
def reorder_gemm(program: Program, ctx: PassContext) -> Program:
    config = program.config_dict()
    layers = []
    for layer in program.layers:
        while layer.kind == "graph":
            new = _rewrite(layer, config)
            if new is None:
                break
            layer = new
        layers.append(layer)
    return program.replace(layers=tuple(layers))
