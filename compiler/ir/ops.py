"""The one table of IR ops: where each may appear and how it types its result.

Elaboration asks it which names are ops and which statements may use them;
`infer-shapes` asks it for result types; the executors implement the same
names (runtime/ops are keyed by these strings, which are part of the plan
format). Keeping all of it here means a new op is added in one place.
"""
from __future__ import annotations

from typing import Callable

import sympy

from gnnc.errors import GnncTypeError, Loc
from gnnc.ir import Eqn, Type, fmt_dim

ELEMENTWISE_PRIMS = frozenset({"scatter", "gather", "transform", "apply", "model"})
DENSE_PRIMS = frozenset({"transform", "apply", "model"})

# name -> number of optional positional constants after x (e.g. leaky_relu's slope)
ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "relu": (), "elu": ("alpha",), "leaky_relu": ("slope",), "sigmoid": (), "tanh": (), "exp": (),
    "log": (), "softplus": (), "gelu": (), "abs": (), "identity": (),
}
ACTIVATION_DEFAULTS = {"elu": {"alpha": 1.0}, "leaky_relu": {"slope": 0.01}}
BINARY = ("add", "sub", "mul", "div", "pow")
GATHER_REDUCERS = ("sum", "mean", "max", "min", "softmax")
SYNC_REDUCERS = ("sum", "mean", "max")
# ops a user may call by name, and the statements they may appear in
CALLABLE: dict[str, frozenset[str]] = {
    **{a: ELEMENTWISE_PRIMS for a in ACTIVATIONS},
    "dropout": frozenset({"scatter", "transform", "apply", "model"}),
    "linear": DENSE_PRIMS,
    "matmul": DENSE_PRIMS,
    "bias": DENSE_PRIMS,
    "dot": frozenset({"scatter", "transform", "apply", "model"}),
    "concat": frozenset({"scatter", "transform", "apply", "model"}),
    "mean_heads": frozenset({"scatter", "transform", "apply", "model"}),
    "layer_norm": DENSE_PRIMS,
    "l2_normalize": DENSE_PRIMS,
    "cross_entropy": frozenset({"model"}),
}
EDGE_DATA = ("gcn_norm",)


def same_dim(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def fmt_shape(shape: tuple) -> str:
    return "[" + ", ".join(fmt_dim(d) for d in shape) + "]"


def _err(eqn: Eqn, msg: str) -> GnncTypeError:
    return GnncTypeError(msg, eqn.loc)


def _combine_domain(eqn: Eqn, a: Type, b: Type) -> str:
    if a.domain == "scalar":
        return b.domain
    if b.domain == "scalar" or a.domain == b.domain:
        return a.domain
    v, e = (eqn.ins[0], eqn.ins[1]) if a.domain == "vertex" else (eqn.ins[1], eqn.ins[0])
    raise _err(eqn, f"cannot combine a vertex value with an edge value in '{eqn.op}'; "
                    f"in scatter, read vertex values through src.X or dst.X")


def broadcast(eqn: Eqn, a: tuple, b: tuple) -> tuple:
    """Equal shapes, a scalar, or a per-head prefix ([heads] with [heads, out])."""
    if same_shape(a, b):
        return a
    if not a:
        return b
    if not b:
        return a
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    if len(short) < len(long_) and same_shape(short, long_[: len(short)]):
        return long_
    raise _err(eqn, f"dim mismatch in '{eqn.op}': {fmt_shape(a)} vs {fmt_shape(b)}")


def _need(eqn: Eqn, t: Type, domains: tuple[str, ...], what: str) -> None:
    if t.domain not in domains:
        raise _err(eqn, f"'{eqn.op}' expects {what}, got a {t.domain} value")


def _last(eqn: Eqn, t: Type) -> sympy.Expr:
    if not t.shape:
        raise _err(eqn, f"'{eqn.op}' needs a value with a feature dim, got a scalar per {t.domain}")
    return t.shape[-1]


TypeRule = Callable[[Eqn, list[Type]], list[Type]]


def _elementwise(eqn: Eqn, ts: list[Type]) -> list[Type]:
    return [ts[0]]


def _binary(eqn: Eqn, ts: list[Type]) -> list[Type]:
    a, b = ts
    dom = _combine_domain(eqn, a, b)
    return [Type(dom, broadcast(eqn, a.shape, b.shape))]


def _const(eqn: Eqn, ts: list[Type]) -> list[Type]:
    return [Type("scalar", ())]


def _src_dst(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    return [Type("edge", ts[0].shape)]


def _edata(eqn: Eqn, ts: list[Type]) -> list[Type]:
    return [Type("edge", ())]


def _gather(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("edge",), "an edge value (a message from scatter)")
    return [Type("vertex", ts[0].shape)]


def _edge_softmax(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("edge",), "an edge value (a message from scatter)")
    return [Type("edge", ts[0].shape)]


def _linear(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    _need(eqn, x, ("vertex", "edge"), "a vertex value")
    d_in = _last(eqn, x)
    if len(x.shape) != 1:
        raise _err(eqn, f"'{eqn.op}' expects one feature dim, got {fmt_shape(x.shape)}; "
                        f"use concat(...) or mean_heads(...) first")
    out = eqn.attr("out")
    heads = eqn.attr("heads")
    shape = (heads, out) if heads is not None else (out,)
    want = [Type("param", (d_in, sympy.Mul(heads, out) if heads is not None else out))]
    if eqn.attr("bias", False):
        want.append(Type("param", (want[0].shape[1],)))
    for p, w in zip(ts[1:], want):
        if not same_shape(p.shape, w.shape):
            raise _err(eqn, f"parameter shape {fmt_shape(p.shape)} does not match {fmt_shape(w.shape)}")
    return [Type(x.domain, shape)]


def _bias(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex", "edge"), "a vertex value")
    return [ts[0]]


def _dot(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    _need(eqn, x, ("vertex", "edge"), "a vertex or edge value")
    _last(eqn, x)
    return [Type(x.domain, x.shape[:-1])]


def _concat(eqn: Eqn, ts: list[Type]) -> list[Type]:
    if len(ts) == 1:
        x = ts[0]
        if len(x.shape) != 2:
            raise _err(eqn, f"concat of one value joins its heads and needs shape [heads, out], "
                            f"got {fmt_shape(x.shape)}")
        return [Type(x.domain, (x.shape[0] * x.shape[1],))]
    dom = ts[0].domain
    for t in ts[1:]:
        if t.domain != dom:
            raise _err(eqn, f"concat of a {dom} value and a {t.domain} value")
        if len(t.shape) != len(ts[0].shape) or not same_shape(t.shape[:-1], ts[0].shape[:-1]):
            raise _err(eqn, f"dim mismatch in 'concat': {fmt_shape(ts[0].shape)} vs {fmt_shape(t.shape)}")
        _last(eqn, t)
    return [Type(dom, ts[0].shape[:-1] + (sympy.Add(*[t.shape[-1] for t in ts]),))]


def _mean_heads(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    if len(x.shape) != 2:
        raise _err(eqn, f"mean_heads needs shape [heads, out], got {fmt_shape(x.shape)}")
    return [Type(x.domain, x.shape[1:])]


def _sync(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    return [ts[0]]


def _cross_entropy(eqn: Eqn, ts: list[Type]) -> list[Type]:
    logits, y, mask = ts
    _need(eqn, logits, ("vertex",), "vertex logits")
    if len(logits.shape) != 1:
        raise _err(eqn, f"cross_entropy expects logits with one feature dim, got {fmt_shape(logits.shape)}")
    if y.dtype != "i64" or y.domain != "vertex":
        raise _err(eqn, "cross_entropy expects integer vertex labels (y) as its second argument")
    if mask.dtype != "bool" or mask.domain != "vertex":
        raise _err(eqn, "cross_entropy expects a vertex mask (train, val, test) as mask")
    return [Type("scalar", ())]


def _spmm(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    if len(ts) > 1:
        _need(eqn, ts[1], ("edge",), "edge weights")
        broadcast(eqn, ts[1].shape, ts[0].shape)
    return [Type("vertex", ts[0].shape)]


def _sddmm(eqn: Eqn, ts: list[Type]) -> list[Type]:
    a, b = ts
    _need(eqn, a, ("vertex",), "a vertex value")
    _need(eqn, b, ("vertex",), "a vertex value")
    shape = broadcast(eqn, a.shape, b.shape)
    if eqn.attr("op") == "dot":
        shape = shape[:-1]
    return [Type("edge", shape)]


TYPE_RULES: dict[str, TypeRule] = {
    **{a: _elementwise for a in ACTIVATIONS},
    **{b: _binary for b in BINARY},
    "neg": _elementwise,
    "dropout": _elementwise,
    "const": _const,
    "src": _src_dst,
    "dst": _src_dst,
    "edata": _edata,
    "gather": _gather,
    "edge_softmax": _edge_softmax,
    "linear": _linear,
    "bias": _bias,
    "dot": _dot,
    "concat": _concat,
    "mean_heads": _mean_heads,
    "layer_norm": _elementwise,
    "l2_normalize": _elementwise,
    "sync": _sync,
    "cross_entropy": _cross_entropy,
    # communication, after insert-comm: same feature shape, more rows
    "halo": _elementwise,
    "fetch": _elementwise,
    "bcast_rows": _elementwise,
    "reduce_scatter": _elementwise,
    # kernel ops, after lowering
    "spmm": _spmm,
    "sddmm": _sddmm,
}


def param_shapes(eqn: Eqn, x: Type) -> list[tuple]:
    """Shapes of the params an op creates, given its input's type."""
    if eqn.op == "linear":
        d_in = x.shape[-1] if x.shape else sympy.Integer(1)
        heads, out = eqn.attr("heads"), eqn.attr("out")
        width = heads * out if heads is not None else out
        shapes = [(d_in, width)]
        if eqn.attr("bias", False):
            shapes.append((width,))
        return shapes
    if eqn.op in ("bias", "dot"):
        return [x.shape]
    if eqn.op == "layer_norm":
        return [x.shape[-1:], x.shape[-1:]]
    return []


def infer(eqn: Eqn, ts: list[Type]) -> list[Type]:
    rule = TYPE_RULES.get(eqn.op)
    if rule is None:
        raise GnncTypeError(f"internal: no type rule for op '{eqn.op}'", eqn.loc)
    return rule(eqn, ts)


def suggest(name: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_op(name: str, loc: Loc) -> GnncTypeError:
    known = list(CALLABLE) + list(GATHER_REDUCERS)
    return GnncTypeError(f"unknown op '{name}'{suggest(name, known)}", loc)


# the communication ops insert-comm inserts (see passes/insert_comm.py for what each carries)
COMM_OPS = ("halo", "fetch", "bcast_rows", "reduce_scatter")
