"""The one definition of every IR op: where it may appear, how it binds, types and behaves.

An op is an `OpDef` registered with `define_op`: its call signature (tensor
inputs, constant arguments with their defaults, the parameters it creates and
how they are initialised), the primitives it may appear in, its type rule, and
the traits passes ask about (`reads_neighbours`, `linear_in`, `row_wise`, ...).
Elaboration binds calls from the signature, `infer-shapes` and `verify` run
the type rules, insert-comm, legality and the distributed runtime read the
traits, and the runtime registers one implementation per op name (see
gnnc.runtime.implementations). Op names are part of the plan format. Adding
an op is one `define_op(...)` here plus its implementation(s).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import sympy

from gnnc.errors import GnncTypeError, Loc
from gnnc.ir.core import Eqn, Type, fmt_dim
from gnnc.ir.reducers import REDUCERS, gather_reducers, is_linear

ELEMENTWISE_PRIMS = frozenset({"scatter", "gather", "transform", "apply", "model"})
DENSE_PRIMS = frozenset({"transform", "apply", "model"})
NOT_GATHER = frozenset({"scatter", "transform", "apply", "model"})
EDGE_DATA = ("gcn_norm",)  # edge data gnnc computes; the graph brings the rest (edge.weight, edge.attr, ...)
# edge data a model may read when no graph is at hand to say what it holds (PyG's field names)
EDGE_DATA_WITHOUT_GRAPH = ("weight", "attr")
INITIALISERS = ("zeros", "ones", "glorot")  # a learnable parameter's named initialisers (or a number)


def same_dim(a: sympy.Expr, b: sympy.Expr) -> bool:
    # equal expressions first: the verifier asks this of every value of every pass's program, and expanding a
    # sympy difference of equal dims cost the 64-layer GCNII example's compile ~0.2 of its 3.1 CPU-s after load
    return a == b or sympy.expand(a - b) == 0


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def fmt_shape(shape: tuple) -> str:
    return "[" + ", ".join(fmt_dim(d) for d in shape) + "]"


def _err(eqn: Eqn, msg: str) -> GnncTypeError:
    return GnncTypeError(msg, eqn.loc)


# values that are the same for every vertex and edge: they combine with either
_UNIFORM = ("scalar", "param")


def _combine_domain(eqn: Eqn, a: Type, b: Type) -> str:
    if a.domain == b.domain:
        return a.domain
    if a.domain in _UNIFORM and b.domain in _UNIFORM:
        return "param"
    if a.domain in _UNIFORM:
        return b.domain
    if b.domain in _UNIFORM:
        return a.domain
    if "graph" in (a.domain, b.domain):
        other = b.domain if a.domain == "graph" else a.domain
        raise _err(eqn, f"cannot combine a graph value (one row per graph) with a {other} value in '{eqn.op}'; "
                        f"pool vertex values first: {', '.join(READOUTS)}(h)")
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
    width = eqn.attr("width")  # a graph's [E, d] edge data; one number per edge without it
    return [Type("edge", () if width is None else (width,))]


def _need_reducer(eqn: Eqn) -> None:
    """An aggregation's `reduce` names a reducer with a row per vertex (plans are data: read, not trusted)."""
    r = REDUCERS.get(eqn.attr("reduce"))
    if r is None or r.per_edge:
        known = [name for name, d in REDUCERS.items() if not d.per_edge]
        raise _err(eqn, f"'{eqn.op}' has reduce={eqn.attr('reduce')!r}; expected one of {', '.join(known)}")


def _gather(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("edge",), "an edge value (a message from scatter)")
    _need_reducer(eqn)
    return [Type("vertex", ts[0].shape)]


def _edge_softmax(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("edge",), "an edge value (a message from scatter)")
    return [Type("edge", ts[0].shape)]


def _linear(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    _need(eqn, x, ("vertex", "edge", "pair", "graph"), "a vertex value")
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
    _need(eqn, ts[0], ("vertex", "edge", "pair", "graph"), "a vertex value")
    return [ts[0]]


def _dot(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    _need(eqn, x, ("vertex", "edge", "graph"), "a vertex or edge value")
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


def _elementwise_of_many(eqn: Eqn, ts: list[Type]) -> list[Type]:
    """maximum / minimum of several values: they combine as `a + b` does, pairwise."""
    out = ts[0]
    for t in ts[1:]:
        out = Type(_combine_domain(eqn, out, t), broadcast(eqn, out.shape, t.shape))
    return [out]


def _batch_norm(eqn: Eqn, ts: list[Type]) -> list[Type]:
    x = ts[0]
    _need(eqn, x, ("vertex",), "a vertex value")
    if len(x.shape) != 1:
        raise _err(eqn, f"batch_norm normalises each feature over the vertices and needs one feature dim, "
                        f"got {fmt_shape(x.shape)}")
    return [x]


def _cross_entropy(eqn: Eqn, ts: list[Type]) -> list[Type]:
    logits, y, mask = ts
    # over vertices (node classification) or over graphs (graph classification: logits after a readout, the
    # graph labels and a mask of graphs); the three on the same rows
    _need(eqn, logits, ("vertex", "graph"), "vertex logits")
    rows = logits.domain
    if len(logits.shape) != 1:
        raise _err(eqn, f"cross_entropy expects logits with one feature dim, got {fmt_shape(logits.shape)}")
    if y.dtype != "i64" or y.domain != rows:
        raise _err(eqn, f"cross_entropy expects integer {rows} labels (y) as its second argument"
                        + (f", got {y.domain} labels" if y.dtype == "i64" else ""))
    if mask.dtype != "bool" or mask.domain != rows:
        raise _err(eqn, f"cross_entropy expects a {rows} mask (train, val, test) as mask")
    return [Type("scalar", ())]


def _readout(eqn: Eqn, ts: list[Type]) -> list[Type]:
    """vertex rows -> graph rows: one row per graph of the batch, of the same feature shape."""
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    _last(eqn, ts[0])
    return [Type("graph", ts[0].shape)]


def _target_loss(eqn: Eqn, ts: list[Type]) -> list[Type]:
    """mse / bce: one output per target column against a float vertex matrix y; the widths are compared with the
    graph's number of targets when the program meets a graph (gnnc.runtime.executor.check_dims_fit), since a
    `linear(h, 1)` and the graph-bound `targets` are different symbols here."""
    if len(ts) == 2:  # link prediction's bce(score, label): one logit and one 0/1 label per pair, no mask
        return _pair_loss(eqn, ts)
    h, y, mask = ts
    _need(eqn, h, ("vertex",), "vertex outputs (one per target)")
    if len(h.shape) != 1:
        raise _err(eqn, f"{eqn.op} expects outputs with one feature dim (one per target), got {fmt_shape(h.shape)}")
    if y.dtype != "f32" or y.domain != "vertex" or len(y.shape) != 1:
        raise _err(eqn, f"{eqn.op} expects float vertex targets (y, one column per target) as its second argument")
    if mask.dtype != "bool" or mask.domain != "vertex":
        raise _err(eqn, f"{eqn.op} expects a vertex mask (train, val, test) as mask")
    return [Type("scalar", ())]


def _spmm(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    _need_reducer(eqn)
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


# ----- op definitions ---------------------------------------------------------------------------

ARG_KINDS = ("number", "probability", "dim", "flag")


@dataclass(frozen=True)
class Arg:
    """A constant argument after an op's tensor inputs: `leaky_relu(x, 0.2)`, `linear(h, heads, out)`.

    Given arguments (and defaults that are not None) become the equation's attributes.
    """

    name: str
    kind: str  # one of ARG_KINDS: how the value is checked
    default: Any = None  # the attribute's value when the argument is left out; None: no attribute
    required: bool = False
    positional: bool = True
    keyword: bool = True
    missing: str = ""  # the message when a required keyword-capable argument is left out


@dataclass(frozen=True)
class ParamSpec:
    """A learnable parameter an op creates: `<layer>.<op><k>.<suffix>`, its initialiser and shape."""

    suffix: str
    init: str  # glorot | zeros | ones (gnnc.runtime.executor's initialisers)
    shape: Callable[[Eqn, Type], tuple]  # from the equation and its first input's type
    when: Callable[[Mapping[str, Any]], bool] = lambda attrs: True  # from the equation's attributes


def _never(*_: Any) -> bool:
    return False


def _always(*_: Any) -> bool:
    return True


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one op.

    Traits (what passes ask instead of lists of names):
    elementwise: the result is computed element by element from one input of the same type;
    row_wise: combines several vertex operands row by row (the distributed runtime trims
        operands that carry extra halo rows to the rows they share);
    reads_neighbours: positions of the inputs whose rows are read through edges (source side):
        insert-comm brings remote rows for them;
    reads_structure: whether the equation needs its layer view's CSR;
    linear_in: given which inputs depend on a layer's input, whether the result is linear in it
        (P3/pushpull legality); nonlinear_why says why not, as legality reports it;
    needs_whole_rows: mixes the feature dim, so it cannot run on a feature slice before pushpull;
    comm: a communication op insert-comm inserts;
    varies_per_step: the result may differ between training steps for the same inputs (dropout draws new
        masks, batch_norm switches statistics between training and evaluation): never computed once;
    state: non-trainable tensors the op keeps between steps (batch_norm's running statistics), as
        ParamSpecs, held by the runtime under `<result name>.<suffix>` and saved in checkpoints;
    allreduce_elements: in a distributed run, the elements it all-reduces per call (batch_norm's
        statistics over every rank's rows), from the equation; predict-bytes counts them;
    loss: the op defines a model's loss (`loss = OP(h, y, mask = train)`) and y is typed by it: "classes" (an
        integer class per vertex) or "targets" (a float matrix, a column per target).
    """

    name: str
    type_rule: TypeRule | None  # None: a call-only alias (`emits` names the IR op)
    prims: frozenset[str] = frozenset()  # statements a user may call it in; empty: not callable
    tensors: int | None = 1  # tensor inputs of a call; None: one or more
    args: tuple[Arg, ...] = ()
    params: tuple[ParamSpec, ...] = ()
    emits: str = ""  # the IR op a call elaborates to, when not `name` (matmul -> linear)
    activation: bool = False  # an elementwise function: constant inputs fold through `fold` or are refused
    fold: Callable[[Any], Any] | None = None
    elide: Callable[[Mapping[str, Any]], bool] = _never  # the call is its input (identity, dropout p=0)
    elementwise: bool = False
    row_wise: bool = False
    reads_neighbours: tuple[int, ...] = ()
    reads_structure: Callable[[Eqn], bool] = _never
    linear_in: Callable[[Eqn, list[bool]], bool] = _never
    nonlinear_why: str = "is not linear in the layer's input"
    needs_whole_rows: bool = False
    comm: bool = False
    varies_per_step: bool = False
    state: tuple[ParamSpec, ...] = ()
    allreduce_elements: Callable[[Eqn], Any] | None = None
    loss: str = ""  # a model's loss: what it reads from y ("classes": one class per vertex; "targets": floats)

    @property
    def ir_op(self) -> str:
        return self.emits or self.name


OPS: dict[str, OpDef] = {}


def define_op(op: OpDef) -> OpDef:
    """Register an op; a name is defined once."""
    if op.name in OPS:
        raise ValueError(f"op '{op.name}' is already defined")
    bad = [a.kind for a in op.args if a.kind not in ARG_KINDS]
    if bad:
        raise ValueError(f"op '{op.name}': unknown argument kind {bad[0]!r} (known: {', '.join(ARG_KINDS)})")
    OPS[op.name] = op
    return op


def op_def(name: str) -> OpDef:
    """The definition of an op the IR holds; a missing one is a compiler bug."""
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"internal: op '{name}' is not defined in gnnc.ir.ops")
    return op


def loss_ops() -> list[str]:
    """The ops that may define a model's loss, in definition order."""
    return [name for name, op in OPS.items() if op.loss]


def callable_ops() -> list[str]:
    """The ops a user may call by name, in definition order."""
    return [name for name, op in OPS.items() if op.prims]


def reads_neighbours(e: Eqn) -> tuple[int, ...]:
    return op_def(e.op).reads_neighbours


def reads_structure(e: Eqn) -> bool:
    return op_def(e.op).reads_structure(e)


def _reads_first_only(e: Eqn, reads: list[bool]) -> bool:
    return reads[0] and not any(reads[1:])


def _linear_reducer(e: Eqn) -> bool:
    return is_linear(e.attr("reduce"))


def _on_edges(e: Eqn) -> bool:
    return e.outs[0].type is not None and e.outs[0].type.domain == "edge"


_BIAS_WHY = ("adds a bias before the sync (the bias must come once, after it; sink-bias moves it there "
             "only across sums, not across an aggregation, a product or a non-linearity)")
_ATTENTION_WHY = "computes attention from the input before the sync (not linear in it)"


def define_activation(name: str, *args: Arg, fold: Callable[[Any], Any] | None = None,
                      elide: Callable[[Mapping[str, Any]], bool] = _never) -> None:
    """Define an elementwise activation callable in every statement: one line per new activation."""
    define_op(OpDef(name, _elementwise, ELEMENTWISE_PRIMS, args=args, activation=True, fold=fold, elide=elide,
                    elementwise=True))


define_activation("relu")
define_activation("elu", Arg("alpha", "number", default=1.0))
define_activation("leaky_relu", Arg("slope", "number", default=0.01))
define_activation("sigmoid")
define_activation("tanh", fold=sympy.tanh)
define_activation("exp", fold=sympy.exp)
define_activation("log", fold=sympy.log)
define_activation("softplus")
define_activation("gelu")
define_activation("abs", fold=sympy.Abs)
define_activation("identity", elide=_always)
define_activation("silu")
define_op(OpDef("dropout", _elementwise, NOT_GATHER,
                args=(Arg("p", "probability", required=True, missing="dropout needs a probability: dropout(x, 0.5)"),),
                elide=lambda attrs: attrs["p"] == 0.0, elementwise=True, reads_structure=_on_edges,
                nonlinear_why="inside the layer before the sync is not supported with pushpull", varies_per_step=True))


def _linear_width(e: Eqn) -> Any:
    heads, out = e.attr("heads"), e.attr("out")
    return heads * out if heads is not None else out


_LINEAR_ARGS = (Arg("heads", "dim", keyword=False), Arg("out", "dim", required=True, keyword=False))
define_op(OpDef(
    "linear", _linear, DENSE_PRIMS, args=_LINEAR_ARGS + (Arg("bias", "flag", default=True, positional=False),),
    params=(ParamSpec("weight", "glorot",
                      lambda e, x: (x.shape[-1] if x.shape else sympy.Integer(1), _linear_width(e))),
            ParamSpec("bias", "zeros", lambda e, x: (_linear_width(e),), when=lambda attrs: attrs.get("bias", False))),
    linear_in=lambda e, reads: not e.attr("bias") and _reads_first_only(e, reads), nonlinear_why=_BIAS_WHY,
    needs_whole_rows=True))
define_op(OpDef("matmul", None, DENSE_PRIMS, emits="linear",
                args=_LINEAR_ARGS + (Arg("bias", "flag", default=False, positional=False),), needs_whole_rows=True))
define_op(OpDef("bias", _bias, DENSE_PRIMS, params=(ParamSpec("bias", "zeros", lambda e, x: x.shape),),
                nonlinear_why=_BIAS_WHY, needs_whole_rows=True))
define_op(OpDef("dot", _dot, NOT_GATHER, params=(ParamSpec("att", "glorot", lambda e, x: x.shape),),
                nonlinear_why=_ATTENTION_WHY, needs_whole_rows=True))
define_op(OpDef("concat", _concat, NOT_GATHER, tensors=None, row_wise=True, linear_in=_always,
                needs_whole_rows=True))
define_op(OpDef("mean_heads", _mean_heads, NOT_GATHER, linear_in=_always, needs_whole_rows=True))
define_op(OpDef("layer_norm", _elementwise, DENSE_PRIMS,
                params=(ParamSpec("weight", "ones", lambda e, x: x.shape[-1:]),
                        ParamSpec("bias", "zeros", lambda e, x: x.shape[-1:])), needs_whole_rows=True))
define_op(OpDef("l2_normalize", _elementwise, DENSE_PRIMS, needs_whole_rows=True))
# BatchNorm1d over the vertices (every rank's owned rows together in a distributed run): batch statistics in
# training (biased variance), running statistics (momentum, unbiased variance) in evaluation
define_op(OpDef(
    "batch_norm", _batch_norm, DENSE_PRIMS,
    args=(Arg("eps", "number", default=1e-5, positional=False),
          Arg("momentum", "number", default=0.1, positional=False)),
    params=(ParamSpec("weight", "ones", lambda e, x: x.shape[-1:]),
            ParamSpec("bias", "zeros", lambda e, x: x.shape[-1:])),
    state=(ParamSpec("running_mean", "zeros", lambda e, x: x.shape[-1:]),
           ParamSpec("running_var", "ones", lambda e, x: x.shape[-1:])),
    allreduce_elements=lambda e: 2 * e.ins[0].type.shape[-1] + 1,  # sums, sums of squares, the row count
    needs_whole_rows=True, varies_per_step=True, nonlinear_why="normalises with statistics of the input"))
# elementwise maximum / minimum of two or more values (jumping knowledge's max over layer outputs): `max(a, b)`;
# with one argument `max` is the gather (or sync) reducer
define_op(OpDef("maximum", _elementwise_of_many, tensors=None, row_wise=True))
define_op(OpDef("minimum", _elementwise_of_many, tensors=None, row_wise=True))
define_op(OpDef("max", None, ELEMENTWISE_PRIMS, tensors=None, emits="maximum"))
define_op(OpDef("min", None, ELEMENTWISE_PRIMS, tensors=None, emits="minimum"))
define_op(OpDef("cross_entropy", _cross_entropy, frozenset({"model"}), tensors=3, row_wise=True, loss="classes"))
# readouts (PyG's global_*_pool): every vertex's row reduced into its graph's row, over a batch of many graphs
# (gnnc.runtime.graph_task); max's gradient goes to the maxima as torch's scatter_reduce amax sends it
READOUTS = ("global_sum_pool", "global_mean_pool", "global_max_pool")
for _readout_op in READOUTS:
    define_op(OpDef(_readout_op, _readout, frozenset({"model"})))


def is_graph_classification(program: Any) -> bool:
    """Whether a program reads out graph rows (graph classification over a batch of many graphs)."""
    return any(e.op in READOUTS for layer in program.layers for e in layer.eqns)
# node regression (mean squared error over the mask's rows and every target) and multi-label binary targets
# (binary cross-entropy on logits, ogbn-proteins' 112 tasks); the metrics each reports are the runtime's
# (gnnc.runtime.task_metrics)
define_op(OpDef("mse", _target_loss, frozenset({"model"}), tensors=3, row_wise=True, loss="targets"))
define_op(OpDef("bce", _target_loss, frozenset({"model"}), tensors=3, row_wise=True, loss="targets"))

# binary arithmetic (`a + b`): operands broadcast per head; P3 may add partial sums, scale by a constant
_TERM_WHY = "adds a term that does not depend on the input before the sync (it would be added once per worker)"
define_op(OpDef("add", _binary, tensors=2, row_wise=True, linear_in=lambda e, reads: all(reads),
                nonlinear_why=_TERM_WHY))
define_op(OpDef("sub", _binary, tensors=2, row_wise=True, linear_in=lambda e, reads: all(reads),
                nonlinear_why=_TERM_WHY))
define_op(OpDef("mul", _binary, tensors=2, row_wise=True, linear_in=lambda e, reads: sum(reads) == 1))
define_op(OpDef("div", _binary, tensors=2, row_wise=True, linear_in=lambda e, reads: sum(reads) == 1 and reads[0]))
define_op(OpDef("pow", _binary, tensors=2, row_wise=True))
define_op(OpDef("neg", _elementwise, elementwise=True, linear_in=_always))
define_op(OpDef("const", _const, tensors=0))

# graph ops, before lowering
define_op(OpDef("src", _src_dst, reads_neighbours=(0,), reads_structure=_always, linear_in=_always))
define_op(OpDef("dst", _src_dst, reads_structure=_always, linear_in=_always))
define_op(OpDef("edata", _edata, tensors=0))
define_op(OpDef("gather", _gather, reads_structure=_always, linear_in=lambda e, reads: _linear_reducer(e)))
define_op(OpDef("edge_softmax", _edge_softmax, reads_structure=_always, nonlinear_why=_ATTENTION_WHY))
define_op(OpDef("sync", _sync))

# communication, after insert-comm: same feature shape, more rows
for _comm in ("halo", "fetch", "bcast_rows", "reduce_scatter", "sync_scores", "history"):
    define_op(OpDef(_comm, _elementwise, comm=True))

# kernel ops, after lowering
define_op(OpDef("spmm", _spmm, reads_neighbours=(0,), reads_structure=_always,
                linear_in=lambda e, reads: _linear_reducer(e) and _reads_first_only(e, reads)))
define_op(OpDef("sddmm", _sddmm, tensors=2, reads_neighbours=(0,), reads_structure=_always,
                nonlinear_why=_ATTENTION_WHY))

# link prediction: a model-level `src.z` / `dst.z` reads z at the sources / destinations of the pair set in
# use (the split's positive and negative pairs, gnnc.graph.edge_split); `dot(a, b)` of two values is `inner`
def _pair_end(eqn: Eqn, ts: list[Type]) -> list[Type]:
    _need(eqn, ts[0], ("vertex",), "a vertex value")
    return [Type("pair", ts[0].shape)]


def _inner(eqn: Eqn, ts: list[Type]) -> list[Type]:
    a, b = ts
    if a.domain != b.domain or a.domain not in ("vertex", "edge", "pair"):
        raise _err(eqn, f"dot of two values needs two vertex, edge or pair values of one kind, "
                        f"got a {a.domain} and a {b.domain} value")
    if not same_shape(a.shape, b.shape):
        raise _err(eqn, f"dim mismatch in 'dot': {fmt_shape(a.shape)} vs {fmt_shape(b.shape)}")
    _last(eqn, a)
    return [Type(a.domain, a.shape[:-1])]


def _pair_loss(eqn: Eqn, ts: list[Type]) -> list[Type]:
    score, label = ts
    if score.domain != "pair" or not (not score.shape or (len(score.shape) == 1 and same_dim(score.shape[0], 1))):
        raise _err(eqn, f"{eqn.op}(score, label) scores pairs: score must be one number per pair "
                        f"(dot(src.z, dst.z)), got a {score.domain} value of shape {fmt_shape(score.shape)}")
    if label.domain != "pair" or label.shape or label.dtype != "f32":
        raise _err(eqn, f"{eqn.op}(score, label) expects the pairs' labels (label) as its second argument")
    return [Type("scalar", ())]


PAIR_OPS = ("pair_src", "pair_dst")
# the pair set changes between steps (each epoch's negatives, the evaluation's pairs): never hoisted
define_op(OpDef("pair_src", _pair_end, varies_per_step=True))
define_op(OpDef("pair_dst", _pair_end, varies_per_step=True))
define_op(OpDef("inner", _inner, tensors=2, row_wise=True, needs_whole_rows=True))


def is_link_prediction(program: Any) -> bool:
    """Whether a program scores vertex pairs (link prediction) rather than vertices."""
    return any(e.op in PAIR_OPS for layer in program.layers for e in layer.eqns)


# the communication ops insert-comm inserts (see passes/insert_comm.py for what each carries)
COMM_OPS = tuple(name for name, op in OPS.items() if op.comm)


def param_shapes(eqn: Eqn, x: Type) -> list[tuple]:
    """Shapes of the params an op creates, given its input's type."""
    op = OPS.get(eqn.op)
    if op is None:
        return []
    attrs = dict(eqn.attrs)
    return [p.shape(eqn, x) for p in op.params if p.when(attrs)]


def infer(eqn: Eqn, ts: list[Type]) -> list[Type]:
    op = OPS.get(eqn.op)
    if op is None or op.type_rule is None:
        raise GnncTypeError(f"internal: no type rule for op '{eqn.op}'", eqn.loc)
    return op.type_rule(eqn, ts)


def suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_op(name: str, loc: Loc) -> GnncTypeError:
    known = callable_ops() + list(gather_reducers())
    return GnncTypeError(f"unknown op '{name}'{suggest(name, known)}", loc)
