"""Chains of lowered equations that one compiled kernel runs, in one process.

The IR keeps one op per equation: that is what passes reason about and what a plan shows. Run one
by one, every equation writes its result to memory and the next reads it back, and autograd keeps
what each backward needs: GAT's attention builds six [edges, heads] tensors, and a layer's tail
(bias, relu, dropout) three passes over [vertices, width] forward and three backward. Where a compiled
kernel (gnnc.runtime.kernels.native) computes a whole chain and the chain's intermediate values are
read nowhere else, the interpreter runs the kernel instead: the same function (checked against the
equations in the tests) in fewer passes, keeping less for the backward.

Chains found (`find_chains`, from the IR alone, once per program):

* attention: [dot(z, a), dot(z, b)] -> sddmm[op=add](s, t) -> [leaky_relu] -> edge_softmax -> [dropout]
  -> spmm[reduce=sum](z, .) in one graph layer: per edge and head the score, the softmax over the
  destination's in-edges, the dropout of the coefficient and the weighted sum of source rows of z; with
  the dots (GAT's scores of z itself) their forward and backward too, so that z's gradient is formed
  once instead of summed from three [vertices, heads, width] tensors. Kept for the backward: z, s, t
  and each destination's softmax maximum and sum; the backward draws the mask again.
* epilogue: [add(x, y)] -> [bias(., b)] -> [relu | elu | leaky_relu] -> [dropout], at least two of them
  (a `sync` between them is the identity in one process), on vertex values: one pass forward, one
  backward, which reads only the chain's result (the activation's derivative and the dropout mask
  follow from it and from the draws). Where x is read by nothing else and was computed at this step (in
  the layer, or the graph layer's output a dense layer's relu reads) by an op whose backward does not
  read its result (`_OVERWRITABLE`: the SpMM before a bias; not a chain that keeps its result for its
  backward), looking through the ops that may return their input or a view of it (`_aliases`: a sync, a
  dropout in evaluation, a concat of one value), the chain writes its result over x, and a single stage is
  worth a chain: no new [vertices, width] tensor to allocate and page-fault (200K x 128 floats, 2 threads:
  x + b 48 ms, the bias added in place 8 ms). At run time it does so only where torch allows writing over
  that tensor (`_overwritable`: not a view a custom Function made, as SpMM's head-shaped result).

A chain lies within one layer: a layer's output is computed whenever the layer runs, as the probe
(gnnc.runtime.probe) and the cost model's fit need when they run and time one layer alone. So a graph
layer's bias is fused with what precedes it in the layer (SAGE's add), and the model's relu and
dropout after it with each other, not the bias with the relu (though the relu's chain writes over the
bias's result: no one-layer timing runs chains, `ExecContext.fuse`).

A chain runs when its first equation is reached (every input of the chain is defined by then, which
`find_chains` checks) and its tensors are CPU float tensors the compiled library takes, outside autocast
(a 16-bit run's products are autocast's); otherwise its equations run one by one as before. Only the one-process interpreter fuses: a distributed rank runs the
equations, whose exchanges may sit inside a chain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from gnnc.ir import Eqn, Program
from gnnc.ir.reducers import is_linear
from gnnc.runtime import rng
from gnnc.runtime.kernels import cpu, native

# the activation codes of native.c's epilogue, and the attribute holding each one's parameter
ACTIVATIONS: dict[str, tuple[int, str | None, float]] = {
    "relu": (1, None, 0.0), "elu": (2, "alpha", 1.0), "leaky_relu": (3, "slope", 0.01)}
IDENTITY = 0

_ABSORBED = torch.empty(0)  # what the environment holds for a value a chain computed without writing it


@dataclass(frozen=True)
class Chain:
    """Equations one kernel runs; keyed in `find_chains` by the first equation's result."""

    kind: str  # "attention" or "epilogue"
    eqns: tuple[Eqn, ...]  # in program order; the last one's result is the chain's result
    edges: str | None = None  # the graph layer's edge view (attention)
    inplace: bool = False  # the epilogue may write its result over its input x (see `find_chains`)
    escapes: bool = False  # its result is the program's logits, or an alias of them: read after the backward

    @property
    def result(self) -> str:
        return self.eqns[-1].outs[0].name

    def op(self, name: str) -> Eqn | None:
        return next((e for e in self.eqns if e.op == name), None)


def _readers(program: Program) -> dict[str, int]:
    count: dict[str, int] = {}
    for layer in program.layers:
        for e in layer.eqns:
            for v in e.ins:
                count[v.name] = count.get(v.name, 0) + 1
    for v in (program.logits, program.loss):
        count[v.name] = count.get(v.name, 0) + 1
    return count


def find_chains(program: Program) -> dict[str, Chain]:
    """The chains of `program` a kernel can run, keyed by the result of each chain's first equation."""
    eqns = [(layer, e) for layer in program.layers for e in layer.eqns]
    producer = {e.outs[0].name: (i, layer, e) for i, (layer, e) in enumerate(eqns)}
    readers = _readers(program)
    chains: dict[str, Chain] = {}
    taken: set[str] = set()

    def single(e: Eqn) -> bool:
        return readers.get(e.outs[0].name, 0) == 1 and not e.attr("hoisted")

    def feeding(v_name: str, op: str) -> tuple[Any, Eqn] | None:
        hit = producer.get(v_name)
        if hit is None or hit[2].op != op or not single(hit[2]) or hit[2].outs[0].name in taken:
            return None
        return hit[1], hit[2]

    def inputs_ready(chain: tuple[Eqn, ...]) -> bool:
        first = producer[chain[0].outs[0].name][0]
        inside = {e.outs[0].name for e in chain}
        return all(v.name not in producer or producer[v.name][0] < first
                   for e in chain for v in e.ins if v.name not in inside)

    def add(chain: tuple[Eqn, ...], kind: str, edges: str | None = None, inplace: bool = False) -> None:
        if inputs_ready(chain):
            chains[chain[0].outs[0].name] = Chain(kind, chain, edges, inplace)
            taken.update(e.outs[0].name for e in chain)

    def saves_result(name: str) -> bool:
        """Whether `name` is the result of a chain found already whose backward reads it (an epilogue with an
        activation or a dropout: `_Epilogue` saves its result), which writing over it would corrupt."""
        chain = next((c for c in chains.values() if c.result == name), None)
        return chain is not None and chain.kind == "epilogue" and any(
            e.op in ACTIVATIONS or e.op == "dropout" for e in chain.eqns)

    def overwritable(name: str) -> bool:
        """Whether a chain reading `name` may overwrite it: computed at every step (not hoisted), in this layer
        or an earlier one (a graph layer's output that a dense layer's activation reads), by an op whose
        backward does not read its result, and read by nothing else, through the ops that may return their
        input itself or a view of it (`_aliases`), whose input must then be all that too."""
        while True:
            hit = producer.get(name)
            if readers.get(name, 0) != 1 or hit is None or hit[2].attr("hoisted") or saves_result(name):
                return False
            if not _aliases(hit[2]):
                # an aggregation's backward leaves its result alone when its reducer is linear (ReducerDef)
                reduce = hit[2].attr("reduce")
                return hit[2].op in _OVERWRITABLE and (reduce is None or is_linear(reduce))
            name = hit[2].ins[0].name

    for layer, e in eqns:
        if e.op == "spmm" and e.attr("reduce") == "sum" and len(e.ins) == 2 and not e.attr("hoisted"):
            chain = [e]
            cur = e.ins[1].name
            for op, optional in (("dropout", True), ("edge_softmax", False), ("leaky_relu", True), ("sddmm", False)):
                hit = feeding(cur, op)
                if hit is None:
                    if optional:
                        continue
                    chain = []
                    break
                if hit[0] is not layer:
                    chain = []
                    break
                chain.insert(0, hit[1])
                cur = hit[1].ins[0].name
            if chain and chain[0].attr("op") == "add":  # the kernel adds the two sides' scores
                # the scores as dots of the aggregated rows themselves with parameters (GAT): computed in
                # the kernel too
                z = e.ins[0].name
                dots = [feeding(v.name, "dot") for v in chain[0].ins]
                if all(d is not None and d[0] is layer and d[1].ins[0].name == z and d[1].ins[1].type is not None
                       and d[1].ins[1].type.domain == "param" for d in dots):
                    chain = sorted((d[1] for d in dots), key=lambda d: producer[d.outs[0].name][0]) + chain
                add(tuple(chain), "attention", layer.edges)
    for layer in program.layers:
        own = [(layer, e) for e in layer.eqns]
        for _, e in own:
            if e.outs[0].name in taken or e.attr("hoisted"):
                continue
            chain = _epilogue_from(e, feeding_next=lambda name, own=own: _only_reader(own, name, readers, taken))
            if chain is None:
                continue
            inplace = overwritable(chain[0].ins[0].name)
            # two stages or more save passes; one saves its output's allocation when it can overwrite its input
            if sum(x.op != "sync" for x in chain) >= (1 if inplace else 2):
                add(chain, "epilogue", inplace=inplace)
    logits = _alias_names(program.logits.name, producer)
    return {k: replace(c, escapes=True) if c.result in logits else c for k, c in chains.items()}


def _alias_names(name: str, producer: dict) -> set[str]:
    """`name` and the values it may be (a view of) in one process, through the ops `_aliases` names."""
    out = {name}
    while name in producer and _aliases(producer[name][2]):
        name = producer[name][2].ins[0].name
        out.add(name)
    return out


# ops whose backward does not read their own result (spmm: with a linear reducer), so that the next
# equation may overwrite it
_OVERWRITABLE = frozenset({"spmm", "linear", "add", "sub", "mul", "bias", "dropout", "concat", "mean_heads"})


def _aliases(e: Eqn) -> bool:
    """Whether `e` may return its input itself or a view of it, so that writing over its result writes over its
    input: a sync in one process, a dropout in evaluation, a concat of one value (a reshape)."""
    return e.op in ("sync", "dropout", "identity") or (e.op == "concat" and len(e.ins) == 1)


_EPILOGUE_ORDER = ("add", "bias", "act", "dropout")


def _stage(e: Eqn) -> str | None:
    """Which stage of an epilogue `e` can be; "sync" (the identity in one process) may sit anywhere."""
    if e.op in ACTIVATIONS:
        _, attr, default = ACTIVATIONS[e.op]
        if attr is not None and float(e.attr(attr, default)) < 0:
            return None  # the output's sign no longer tells which side of 0 the input was on (the backward's test)
        return "act"
    return e.op if e.op in ("add", "bias", "dropout", "sync") else None


def _only_reader(eqns: list, name: str, readers: dict[str, int], taken: set[str]) -> Eqn | None:
    if readers.get(name, 0) != 1:
        return None
    for _, e in eqns:
        if any(v.name == name for v in e.ins):
            return None if e.outs[0].name in taken or e.attr("hoisted") else e
    return None


def _epilogue_from(first: Eqn, feeding_next) -> tuple[Eqn, ...] | None:
    """The longest epilogue chain starting at `first` (stages in order, each reading the previous result)."""
    stage = _stage(first)
    if stage is None or first.outs[0].type is None or first.outs[0].type.domain != "vertex":
        return None
    if stage == "add" and not all(v.type is not None and v.type.domain == "vertex" for v in first.ins):
        return None
    chain = [first]
    at = -1 if stage == "sync" else _EPILOGUE_ORDER.index(stage)
    while True:
        nxt = feeding_next(chain[-1].outs[0].name)
        if nxt is None or nxt.ins[0].name != chain[-1].outs[0].name:
            break
        s = _stage(nxt)
        if s is None or s == "add" or (s != "sync" and _EPILOGUE_ORDER.index(s) <= at):
            break
        chain.append(nxt)
        if s != "sync":
            at = _EPILOGUE_ORDER.index(s)
    while chain and chain[-1].op == "sync":  # a trailing sync is left to run (it returns its input)
        chain.pop()
    return tuple(chain) if chain else None


def inner_results(chains: dict[str, Chain]) -> frozenset[str]:
    """The results of the chains' equations after their first: a chain that ran has computed them."""
    return frozenset(e.outs[0].name for c in chains.values() for e in c.eqns[1:])


# ----- running a chain

def run(chain: Chain, env: dict[str, torch.Tensor], params: dict[str, torch.Tensor], ctx: Any) -> bool:
    """Compute `chain` into `env` with its kernel; False (nothing done) when the kernel cannot take its tensors."""
    def value(name: str) -> torch.Tensor:
        return env[name] if name in env else params[name]

    if torch.is_autocast_enabled("cpu"):
        return False  # --precision bf16|fp16: the equations' products run in 16 bits as autocast casts them
    if chain.kind == "attention":
        out = _run_attention(chain, value, ctx)
    else:
        out = _run_epilogue(chain, value, ctx)
    if out is None:
        return False
    for e in chain.eqns[:-1]:
        env[e.outs[0].name] = _ABSORBED
    env[chain.result] = out
    return True


def _dropout_of(chain: Chain, ctx: Any) -> tuple[Eqn | None, float]:
    e = chain.op("dropout")
    if e is None or not ctx.training:
        return None, 0.0
    return e, float(e.attr("p"))


def _run_epilogue(chain: Chain, value, ctx: Any) -> torch.Tensor | None:

    head = next(e for e in chain.eqns if e.op != "sync")
    x = value(chain.eqns[0].ins[0].name)
    y = value(head.ins[1].name) if head.op == "add" else None
    b_eqn = chain.op("bias")
    bias = value(b_eqn.ins[1].name) if b_eqn is not None else None
    tensors = [t for t in (x, y, bias) if t is not None]
    if any(t.is_sparse for t in tensors) or native.usable(*tensors) is None or x.dim() < 1 or len(x) == 0:
        return None
    width = math.prod(x.shape[1:])
    if (y is not None and y.shape != x.shape) or (bias is not None and bias.numel() != width):
        return None
    act_eqn = next((e for e in chain.eqns if e.op in ACTIVATIONS), None)
    act, act_param = IDENTITY, 0.0
    if act_eqn is not None:
        act, attr, default = ACTIVATIONS[act_eqn.op]
        act_param = float(act_eqn.attr(attr, default)) if attr else 0.0
    drop, p = _dropout_of(chain, ctx)
    rows, key = None, 0
    if drop is not None:
        rows = native.int64(ctx.vertex_ids[: x.shape[0]])
        key = ctx.dropout_key(rng.dropout_stream(drop))
    spec = (act, act_param, rows, key, ctx.col_offset, rng.threshold(p), 1.0 / (1.0 - p))
    overwrite_saved = ctx.overwrite_saved and not chain.escapes
    inplace = chain.inplace and _overwritable(x) and not _shares_memory(x, ctx.protected)
    return _Epilogue.apply(x, y, bias, spec, inplace, overwrite_saved)


def _shares_memory(x: torch.Tensor, tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether x lies in the memory of one of `tensors` (ExecContext.protected: a recomputed layer's inputs)."""
    return any(x.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in tensors)


def _overwritable(x: torch.Tensor) -> bool:
    """Whether autograd lets a kernel write over x (contiguous, as the kernel writes it): not a leaf that needs a
    gradient, and a view only where torch lets a view be written in place: one made by an ordinary op with
    autograd on (not inside a custom Function, as cpu.SpMM's head-shaped result is, nor under no_grad nor as
    one of several outputs) of a base that is not a leaf needing a gradient; or any view while autograd is off
    (an evaluation), which records nothing to contradict."""
    if not x.is_contiguous() or (x.is_leaf and x.requires_grad):
        return False
    if not x._is_view():
        return True
    if x._base.is_leaf and x._base.requires_grad:
        return False
    if not torch.is_grad_enabled():
        return True
    if x.requires_grad:
        # autograd turns a write over a view into CopySlices, whose backward clones the base's whole gradient and
        # copies the view's part into it: two or three base-sized tensors at the backward's peak where a new
        # result costs one while the forward passes (GAT's concat of its heads: +2 [vertices, width] at the peak)
        return False
    # torch's own rule, through a private accessor (in the pinned 2.13; not a public API): a torch without
    # it gets no in-place write over a view, the same values through a new tensor
    creation_meta = getattr(torch._C._autograd, "_get_creation_meta", None)
    return creation_meta is not None and creation_meta(x) == torch._C._autograd.CreationMeta.DEFAULT


def _epilogue_args(spec: tuple) -> list:
    act, act_param, rows, key, col_offset, thresh, scale = spec
    return [act, act_param, 0 if rows is None else native.ptr(rows), key, col_offset, thresh, scale, native.threads()]


class _Epilogue(torch.autograd.Function):
    """drop(act(x [+ y] [+ bias])); the backward reads only the result (and draws the mask again).

    With `overwrite_saved` the backward writes x's gradient over the result it kept: every reader of the result
    has run its backward by then (they come after the chain), so the step holds two [vertices, width] tensors
    there (the incoming gradient and the result turned gradient) instead of three. Only for a caller that runs
    one backward and reads the result no more (ExecContext.overwrite_saved); the version bump makes a second
    backward over the same graph (retain_graph) fail in torch's words instead of reading a gradient as a result.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor | None, bias: torch.Tensor | None,
                spec: tuple, inplace: bool = False, overwrite_saved: bool = False) -> torch.Tensor:
        """`inplace`: the result is written over x (contiguous), which nothing else reads."""
        x = x.contiguous()
        y = None if y is None else y.contiguous()
        bias = None if bias is None else bias.contiguous()
        out = x if inplace else torch.empty_like(x)
        lib = native.usable(x)
        n, width = x.shape[0], math.prod(x.shape[1:])
        status = native.fn(lib, "epilogue", x.dtype)(
            native.ptr(x), 0 if y is None else native.ptr(y), 0 if bias is None else native.ptr(bias),
            native.ptr(out), n, width, *_epilogue_args(spec))
        if status != 0:
            raise MemoryError("epilogue: out of memory")
        ctx.spec, ctx.has_y, ctx.bias_shape = spec, y is not None, None if bias is None else bias.shape
        ctx.passes_grad = spec[0] == IDENTITY and spec[2] is None  # d out / d x is 1: nothing to compute
        ctx.overwrite_saved = overwrite_saved
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(None if ctx.passes_grad else out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (out,) = ctx.saved_tensors
        grad = grad.contiguous()
        if ctx.passes_grad:
            gx = grad
        else:
            gx = out if ctx.overwrite_saved else torch.empty_like(out)
            n, width = out.shape[0], math.prod(out.shape[1:])
            status = native.fn(native.usable(out), "epilogue_backward", out.dtype)(
                native.ptr(grad), native.ptr(out), native.ptr(gx), n, width, *_epilogue_args(ctx.spec))
            if status != 0:
                raise MemoryError("epilogue backward: out of memory")
            if ctx.overwrite_saved:
                torch.autograd.graph.increment_version(out)
        # the bias's gradient as autograd forms it for `x + bias` (torch's sum, in torch's order)
        gb = None if ctx.bias_shape is None else gx.sum(0).reshape(ctx.bias_shape)
        return gx, (gx if ctx.has_y else None), gb, None, None, None


def _run_attention(chain: Chain, value, ctx: Any) -> torch.Tensor | None:

    dots = [e for e in chain.eqns if e.op == "dot"]
    sddmm, spmm = chain.eqns[len(dots)], chain.eqns[-1]
    z = value(spmm.ins[0].name)
    view = ctx.views.get(chain.edges)
    if view is None:
        return None
    csr = view.csr
    n_src, n_dst = csr.n_src, csr.n_dst
    if dots:  # s = dot(z, a_src), t = dot(z, a_dst): the order of sddmm's operands
        by_name = {d.outs[0].name: d for d in dots}
        a_src, a_dst = (value(by_name[v.name].ins[1].name) for v in sddmm.ins)
        if n_src != n_dst or a_src.shape != a_dst.shape or tuple(a_src.shape) != tuple(z.shape[1:]):
            return None
        lead = tuple(a_src.shape[:-1])
        s = t = None
        tensors = [z, a_src, a_dst]
    else:
        s, t = value(sddmm.ins[0].name), value(sddmm.ins[1].name)
        if s.shape[0] != n_src or t.shape[0] != n_dst or t.shape[1:] != s.shape[1:]:
            return None
        a_src = a_dst = None
        lead = tuple(s.shape[1:])
        tensors = [z, s, t]
    if native.usable(*tensors) is None or z.dim() < 2 or z.shape[0] != n_src:
        return None
    heads = math.prod(lead)
    if tuple(z.shape[1:-1]) != lead:
        return None
    depth = z.shape[-1]
    lrelu = chain.op("leaky_relu")
    slope = float(lrelu.attr("slope", 0.01)) if lrelu is not None else 1.0
    drop, p = _dropout_of(chain, ctx)
    edge_ids, key = None, 0
    if drop is not None:
        edge_ids = native.int64(view.edge_ids)
        key = ctx.dropout_key(rng.dropout_stream(drop))
    spec = (csr, n_src, n_dst, heads, depth, slope, edge_ids, key, ctx.col_offset, rng.threshold(p), 1.0 / (1.0 - p))
    if dots:
        return _Attention.apply(z, None, None, a_src.reshape(heads, depth), a_dst.reshape(heads, depth), spec)
    return _Attention.apply(z, s.reshape(n_src, heads), t.reshape(n_dst, heads), None, None, spec)


def _attention_tail(spec: tuple) -> list:
    _, _, _, _, _, slope, edge_ids, key, col_offset, thresh, scale = spec
    return [slope, 0 if edge_ids is None else native.ptr(edge_ids), key, col_offset, thresh, scale, native.threads()]


def _ptr_or_null(t: torch.Tensor | None) -> int:
    return 0 if t is None else native.ptr(t)


class _Attention(torch.autograd.Function):
    """GAT's aggregation in one pass over the edges (native.c); the backward recomputes the coefficients.

    Scores given either as s [n_src, H] and t [n_dst, H], or as the per-head vectors a_src, a_dst [H, D]
    whose dots with z's rows they are (then computed here, and z's gradient includes theirs).
    """

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, s: torch.Tensor | None, t: torch.Tensor | None,
                a_src: torch.Tensor | None, a_dst: torch.Tensor | None, spec: tuple) -> torch.Tensor:
        csr, n_src, n_dst, heads, depth = spec[:5]
        z = z.contiguous()
        lib = native.usable(z)
        if a_src is not None:
            a_src, a_dst = a_src.contiguous(), a_dst.contiguous()
            s, t = z.new_empty(n_src, heads), z.new_empty(n_dst, heads)
            native.fn(lib, "head_dots", z.dtype)(native.ptr(z), native.ptr(a_src), native.ptr(a_dst), native.ptr(s),
                                                 native.ptr(t), n_src, heads, depth, native.threads())
        else:
            s, t = s.contiguous(), t.contiguous()
        out = z.new_empty((n_dst,) + tuple(z.shape[1:]))  # [n_dst, heads, depth] in z's own dims, not a view
        mx, den = z.new_empty(n_dst, heads), z.new_empty(n_dst, heads)
        dev = z.device
        indptr, indices = cpu.structure(csr, "indptr", dev), cpu.structure(csr, "indices", dev)
        status = native.fn(lib, "attention", z.dtype)(
            native.ptr(indptr), native.ptr(indices), native.ptr(z), native.ptr(s), native.ptr(t), native.ptr(out),
            native.ptr(mx), native.ptr(den), n_dst, heads, depth, *_attention_tail(spec))
        if status != 0:
            raise MemoryError("attention: out of memory")
        ctx.spec, ctx.dots = spec, a_src is not None
        ctx.save_for_backward(z, s, t, mx, den, a_src, a_dst)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        z, s, t, mx, den, a_src, a_dst = ctx.saved_tensors
        csr, n_src, n_dst, heads, depth = ctx.spec[:5]
        grad = grad.contiguous()
        gz, gs, gt = torch.empty_like(z), torch.empty_like(s), torch.empty_like(t)
        ga_src = ga_dst = None
        if ctx.dots:
            ga_src, ga_dst = torch.empty_like(a_src), torch.empty_like(a_dst)
        dev = z.device
        st = [cpu.structure(csr, name, dev) for name in ("indptr", "indices", "t_indptr", "t_indices", "t_place")]
        lib = native.usable(z)
        # the kernel's [edges, 2 heads] of coefficients between its two passes (`room` holds it through the call),
        # kept by the block cache from one epoch to the next: the kernel's own aligned_alloc was mapped afresh and
        # faulted in every epoch (E x 64 bytes at 8 heads of floats)
        room, gw_t = native.scratch(csr.nnz * 2 * heads, z)
        status = native.fn(lib, "attention_backward", z.dtype)(
            *(native.ptr(a) for a in st), native.ptr(z), native.ptr(s), native.ptr(t), native.ptr(mx),
            native.ptr(den), native.ptr(grad), native.ptr(gz), native.ptr(gs), native.ptr(gt), _ptr_or_null(a_src),
            _ptr_or_null(a_dst), _ptr_or_null(ga_src), _ptr_or_null(ga_dst), gw_t, n_dst, n_src, heads, depth,
            *_attention_tail(ctx.spec))
        if status != 0:
            raise MemoryError("attention backward: out of memory")
        if ctx.dots:
            return gz, None, None, ga_src, ga_dst, None
        return gz, gs, gt, None, None, None
