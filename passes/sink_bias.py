"""sink-bias: move a layer's bias past its sums and its sync, so it is added once after the sync.

Why: P3's push-pull (`pushpull`) runs a layer on feature slices and its
`sync` sums the slices' partial results at each vertex's owner. A bias
before the sync would be added once per worker, so passes/analysis/legality.py
rejects it. SAGE's `linear(a, out) + linear(h, out, bias = false)` puts its
bias before the sync, although the bias could just as well come after it:
`(u + b) + v = (u + v) + b`, and the sync is the identity on whole rows
(what the single-process reference computes). This pass rewrites

    y = bias(u, b)        (or y = linear[bias=true](x, W, b), first split
    z = add(y, v)          into linear[bias=false] + bias)
    s = sync[sum](z)

into `z' = add(u, v); s' = sync[sum](z'); s = bias(s', b)`, one exact step
at a time. The value names after the sync (`s`) are unchanged.

A bias moves past its reader only when all of these hold (each step is an
identity, forward and backward, for every graph, isolated vertices
included):

* the reader is the only use of the biased value `y` (not a layer output),
  so nothing else sees the value without its bias;
* the reader is `add` with `y` as exactly one operand, `sub` with `y` as the
  minuend only, or `sync[reduce=sum]`: each adds `y` exactly once to its
  result, so `b` is still added once. Never a `mul`/`div` (would scale `b`),
  a subtrahend (would negate it), a `sync` that is not a sum, an `spmm` or
  `gather` (a sum over the in-edges adds `b` once per edge, or deg·b, and a
  mean adds it to every vertex but one without in-edges, whose mean is 0),
  a non-linearity, dropout or a softmax (they do not commute with a shift);
* the reader's result has the same type (domain and feature shape) as `y`,
  so broadcasting cannot replicate `b` across a wider result;
* the chain of such readers from `y` reaches the layer's sync: a bias is
  moved all the way past the sync or not at all (moving it past an `add`
  that feeds a non-linearity gains nothing).

A `linear` with a bias is split only when its bias then moves, and not
with `heads` (its bias is added before the heads are split off).
"""
from __future__ import annotations

from collections import Counter

from gnnc.ir import Eqn, Layer, Program, Value, all_values, attrs_of
from gnnc.passes.manager import PassContext, register_pass


def _is_biased(e: Eqn) -> bool:
    """`bias(u, b)`, or a `linear` that adds its bias operand (and has no heads)."""
    if e.op == "bias":
        return True
    return e.op == "linear" and len(e.ins) == 3 and e.attr("heads") is None


def _passes_through(reader: Eqn, y: Value) -> bool:
    """Whether `reader` adds `y` exactly once to a result of y's type (so `+ b` commutes with it)."""
    if reader.outs[0].type != y.type:
        return False
    names = [v.name for v in reader.ins]
    if reader.op == "sync":
        return reader.attr("reduce") == "sum"
    if reader.op == "add":
        return names.count(y.name) == 1
    if reader.op == "sub":
        return names[0] == y.name and names[1] != y.name
    return False


class _Uses:
    """Who reads each value of one layer (layer outputs count as readers that block a move)."""

    def __init__(self, layer: Layer):
        self.count: Counter = Counter(v.name for e in layer.eqns for v in e.ins)
        self.count.update(v.name for v in layer.outputs)
        self.reader: dict[str, int] = {v.name: i for i, e in enumerate(layer.eqns) for v in e.ins}

    def only_reader(self, v: Value) -> int | None:
        """Index of the equation that is v's only use, if there is one."""
        return self.reader.get(v.name) if self.count[v.name] == 1 else None


def _reaches_sync(eqns: list[Eqn], uses: _Uses, y: Value) -> bool:
    """Whether a bias on `y` can move, reader by reader, past a `sync[sum]`."""
    while True:
        i = uses.only_reader(y)
        if i is None or not _passes_through(eqns[i], y):
            return False
        if eqns[i].op == "sync":
            return True
        y = eqns[i].outs[0]


class _Names:
    """Fresh value names, unique in the whole program."""

    def __init__(self, program: Program):
        self.taken = {v.name for v in all_values(program)}

    def fresh(self, base: str, suffix: str) -> str:
        name = base + suffix
        while name in self.taken:
            name += suffix
        self.taken.add(name)
        return name


def _split_linear(lin: Eqn, names: _Names) -> list[Eqn]:
    """`y = linear[bias](x, W, b)` -> `y^g = linear[bias=false](x, W); y = bias(y^g, b)` (exact)."""
    out = lin.outs[0]
    mapped = Value(names.fresh(out.name, "^g"), out.type)
    return [lin.replace(ins=lin.ins[:2], outs=(mapped,), attrs=attrs_of(**{**dict(lin.attrs), "bias": False})),
            Eqn("bias", (mapped, lin.ins[2]), (out,), (), lin.prim, lin.loc)]


def _sink_once(layer: Layer, names: _Names) -> Layer | None:
    """One exact step: split a linear's bias off, or move one bias past its reader; None if none applies."""
    eqns = list(layer.eqns)
    uses = _Uses(layer)
    for j, e in enumerate(eqns):
        if not _is_biased(e) or not _reaches_sync(eqns, uses, e.outs[0]):
            continue
        if e.op == "linear":
            eqns[j:j + 1] = _split_linear(e, names)
            return layer.replace(eqns=tuple(eqns))
        y, (u, b) = e.outs[0], e.ins
        i = uses.only_reader(y)
        reader = eqns[i]
        z = reader.outs[0]
        unbiased = Value(names.fresh(z.name, "^u"), z.type)
        moved = [reader.replace(ins=tuple(u if v.name == y.name else v for v in reader.ins), outs=(unbiased,)),
                 Eqn("bias", (unbiased, b), (z,), (), e.prim, e.loc)]
        # u is defined before the bias, hence before its reader: dropping the bias keeps every use after its def
        eqns[i:i + 1] = moved
        del eqns[j]
        return layer.replace(eqns=tuple(eqns))
    return None


def sink_layer(layer: Layer, names: _Names) -> Layer:
    if layer.kind != "graph":
        return layer
    while True:
        new = _sink_once(layer, names)
        if new is None:
            return layer
        layer = new


@register_pass("sink-bias", "move a bias past add/sub and sync[sum] so it is added once after the sync (exact)")
def sink_bias(program: Program, ctx: PassContext) -> Program:
    names = _Names(program)
    return program.replace(layers=tuple(sink_layer(layer, names) for layer in program.layers))
