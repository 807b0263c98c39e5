"""Interpret an IR program in one process with torch autograd.

This is the reference every strategy is compared with, so it stays simple
and exact. It runs both forms of the IR: graph ops before lowering (`src`,
`gather`, `edge_softmax` over index tensors) and kernel ops after it
(`spmm`, `sddmm`, through gnnc.runtime.kernels). Vertex tensors are
[N, *shape]; edge tensors are [nnz, *shape] in the CSR order of the layer's
edge view. Dropout masks come from the counter-based RNG keyed by global
vertex / edge ids, so a distributed run draws the same masks.

In one process, chains of equations a compiled kernel computes at once (GAT's attention, a layer's
bias, activation and dropout) run as that kernel (gnnc.runtime.fusion).

Equations the `hoist` pass marks (`hoisted=true`: computed from the graph's
inputs alone, no parameter, no dropout) are computed once per run when the
context holds a cache (`ExecContext.hoist_cache`, one per worker and run):
later forward passes read them from it. An op's running state (batch_norm's
statistics) lives in `ExecContext.state`, keyed by the equation's result.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gnnc.errors import GnncError
from gnnc.ir import Eqn, Layer, Program
from gnnc.graph import CSR, Graph, GraphView, edge_data, sparse_if_sparse
from gnnc.graph.storage import check_class_labels
from gnnc.graph.store import release_pages
from gnnc.ir.dims import eval_dim, eval_number
from gnnc.ir.ops import op_def
from gnnc.runtime import kernels as _kernels  # noqa: F401  (registers the kernel variants)
from gnnc.runtime import fusion, layerwise, recompute, rng
from gnnc.runtime.kernels import reducers
from gnnc.runtime.kernels.sparse_features import sparse_features_mm
from gnnc.runtime.implementations import implementation, implements


@dataclass
class ExecContext:
    """What one forward pass needs besides parameters and inputs."""

    views: dict[str, GraphView]
    vertex_ids: torch.Tensor  # global ids of the rows held here
    config: dict[str, Any]
    training: bool
    dropout_key: Callable[[int], int]  # dropout stream id -> key for this step
    loss_count: float  # the global number of labelled vertices the loss averages over
    use_kernels: bool = True
    comm: Any = None  # the distributed runtime's communication (halo, bcast_rows); None in one process
    col_offset: int = 0  # global column of this worker's first feature, when features are sliced (P3)
    state: dict[str, torch.Tensor] | None = None  # running state of ops (init_state); None: nothing kept
    hoist_cache: dict[str, torch.Tensor] | None = None  # hoisted values of this run; None: computed every time
    fuse: bool = True  # one process runs fused chains (gnnc.runtime.fusion); False: each equation, as a rank does
    # the caller runs one backward over this forward and reads none of its values after it but the logits: a fused
    # kernel may write a gradient over what it kept for that backward (gnnc.runtime.fusion's epilogue)
    overwrite_saved: bool = False
    recompute: bool = False  # --recompute: a training forward keeps graph layers' inputs only (gnnc.runtime.recompute)
    protected: tuple[torch.Tensor, ...] = ()  # tensors no fused chain may write over (a recomputed layer's inputs)
    # an evaluation's graph layers run in chunks of this many destination rows (gnnc.runtime.layerwise); None: whole
    eval_chunk: int | None = None
    # graph classification (gnnc.runtime.graph_task): the graph row of every vertex row of the batch, and the
    # dataset ids of the batch's graphs (the graph rows: they key dropout of graph values)
    batch: torch.Tensor | None = None
    graph_ids: torch.Tensor | None = None
    pairs: tuple[torch.Tensor, torch.Tensor] | None = None  # link prediction: the (src, dst) rows pair_src/pair_dst read


def chunked_evaluation(ctx: ExecContext) -> bool:
    """Whether `ctx` runs its graph layers layer-wise in row chunks (an evaluation given a chunk size)."""
    return not ctx.training and bool(ctx.eval_chunk)


def _align(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head broadcast: [R, H] with [R, H, D] -> append trailing unit dims to the shorter."""
    if a.dim() == 0 or b.dim() == 0 or a.dim() == b.dim():
        return a, b
    while a.dim() < b.dim():
        a = a.unsqueeze(-1)
    while b.dim() < a.dim():
        b = b.unsqueeze(-1)
    return a, b


def _segment_softmax(e: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    shape = (n,) + tuple(e.shape[1:])
    idx = dst.view(-1, *([1] * (e.dim() - 1))).expand_as(e)
    mx = torch.full(shape, -math.inf, dtype=e.dtype, device=e.device).scatter_reduce(0, idx, e.detach(), "amax",
                                                                                     include_self=True)
    ex = torch.exp(e - mx[dst])
    den = torch.zeros(shape, dtype=e.dtype, device=e.device).index_add(0, dst, ex)
    return ex / den[dst]


def dying_values(program: Program) -> dict[tuple[str, int], list[str]]:
    """(layer, equation index) -> the values it is the last reader of (never the logits or the loss)."""
    last: dict[str, tuple[str, int]] = {}
    for layer in program.layers:
        for k, e in enumerate(layer.eqns):
            for v in e.ins:
                last[v.name] = (layer.name, k)
    out: dict[tuple[str, int], list[str]] = {}
    for name, at in last.items():
        if name not in (program.logits.name, program.loss.name):
            out.setdefault(at, []).append(name)
    return out


class Interpreter:
    """Runs the equations of a program; `run_layer` is the unit distributed executors reuse.

    A value leaves `env` after its last reader has run (`drop_dead`): what backward needs autograd
    keeps, and the rest is freed as the forward pass goes, not at its end.
    """

    def __init__(self, program: Program):
        self.program = program
        self.config = program.config_dict()
        self.kept = kept_hoisted(program)
        self._dying = dying_values(program)
        self.chains = fusion.find_chains(program)  # run by one compiled kernel each, in one process
        self.in_chains = fusion.inner_results(self.chains)

    def run_layer(self, layer: Layer, env: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
                  ctx: ExecContext, skip: frozenset[tuple[str, int]] = frozenset()) -> None:
        """Run `layer`'s equations into `env`; `skip`: (layer, equation index) whose results are in `env` already
        (gnnc.runtime.recompute computes a first layer and the next layer's product at once)."""
        if layer.kind == "graph" and not skip and chunked_evaluation(ctx) and layerwise.run_layer_chunked(
                self, layer, env, params, ctx, ctx.eval_chunk):
            return
        view = ctx.views.get(layer.edges) if layer.kind == "graph" else None
        fuse = ctx.use_kernels and ctx.fuse and ctx.comm is None
        for k, e in enumerate(layer.eqns):
            name = e.outs[0].name
            if (layer.name, k) in skip:
                pass
            elif fuse and name in self.chains and fusion.run(self.chains[name], env, params, ctx):
                pass
            elif fuse and name in self.in_chains and name in env:
                pass  # computed when its chain ran
            else:
                ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
                env[name] = self.eqn(e, ins, view, ctx)
            self.drop_dead(env, layer, k)

    def drop_dead(self, env: dict[str, Any], layer: Layer, k: int | None = None) -> None:
        """Forget the values whose last reader is equation k of `layer` (every equation of it: k None)."""
        for j in range(len(layer.eqns)) if k is None else (k,):
            for name in self._dying.get((layer.name, j), ()):
                env.pop(name, None)

    def eqn(self, e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
        """One equation's result: from the run's cache if it is hoisted and computed already, else `compute`d."""
        cache = ctx.hoist_cache if e.attr("hoisted") else None
        if cache is not None and e.outs[0].name in cache:
            return cache[e.outs[0].name]
        out = self.compute(e, ins, view, ctx)
        if cache is not None:
            # A value only hoisted equations read is not kept: they are served from the cache themselves.
            cache[e.outs[0].name] = out.detach() if e.outs[0].name in self.kept else _NOT_KEPT
        return out

    def compute(self, e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
        impl = implementation(e.op, ctx.use_kernels)
        if not impl.sparse_input and any(t.is_sparse for t in ins):
            ins = [t.to_dense() if t.is_sparse else t for t in ins]
        return impl.fn(e, ins, view, ctx)


class PrefixRowsInterpreter(Interpreter):
    """An interpreter for values whose row sets are prefixes of one order, as distributed layers' rows
    (gnnc.plan.rows) and a minibatch's blocks (a block's destinations are the first of its sources) are:
    a vertex-wise op meeting two of them keeps the shorter prefix, and an `sddmm` reads its
    destination side from the layer's output rows."""

    def compute(self, e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
        if op_def(e.op).row_wise:
            vertex = [k for k, v in enumerate(e.ins) if v.type is not None and v.type.domain == "vertex"]
            n = min((ins[k].shape[0] for k in vertex), default=0)
            ins = [_dense(t)[:n] if k in vertex and t.shape[0] != n else t for k, t in enumerate(ins)]
        elif e.op == "sddmm" and view is not None:
            ins = [ins[0], ins[1][: view.csr.n_dst]]  # destination side: the layer's output rows
        return super().compute(e, ins, view, ctx)


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x.to_dense() if x.is_sparse else x

_NOT_KEPT = torch.empty(0)


def kept_hoisted(program: Program) -> frozenset[str]:
    """The hoisted values later forward passes read from the cache: those an equation computed every
    step reads, and the program's results."""
    hoisted = {o.name for layer in program.layers for e in layer.eqns if e.attr("hoisted") for o in e.outs}
    kept = {v.name for layer in program.layers for e in layer.eqns if not e.attr("hoisted") for v in e.ins
            if v.name in hoisted}
    kept.update(v.name for v in (program.logits, program.loss) if v.name in hoisted)
    return frozenset(kept)


# ----- the reference implementation of every op (gnnc.runtime.kernels registers the kernel ops' others)

_UNARY: dict[str, Callable[[torch.Tensor, Eqn], torch.Tensor]] = {
    "relu": lambda x, e: F.relu(x),
    "elu": lambda x, e: F.elu(x, e.attr("alpha", 1.0)),
    "leaky_relu": lambda x, e: F.leaky_relu(x, e.attr("slope", 0.01)),
    "sigmoid": lambda x, e: torch.sigmoid(x),
    "tanh": lambda x, e: torch.tanh(x),
    "exp": lambda x, e: torch.exp(x),
    "log": lambda x, e: torch.log(x),
    "softplus": lambda x, e: F.softplus(x),
    "gelu": lambda x, e: F.gelu(x),
    "abs": lambda x, e: torch.abs(x),
    "identity": lambda x, e: x,
    "silu": lambda x, e: F.silu(x),
    "neg": lambda x, e: -x,
    "l2_normalize": lambda x, e: F.normalize(x, dim=-1),
    "mean_heads": lambda x, e: x.mean(1),
    "sync": lambda x, e: x,  # whole rows are held where they are computed: nothing to reduce
}


@implements(*_UNARY)
def _unary(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    return _UNARY[e.op](ins[0], e)


_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
           "maximum": torch.maximum, "minimum": torch.minimum}


@implements(*_BINARY)
def _binary(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    out = _with_rows(e, 0, ins[0])
    for k in range(1, len(ins)):  # maximum / minimum take two or more
        a, b = _align(out, _with_rows(e, k, ins[k]))
        out = _BINARY[e.op](a, b)
    return out


def _with_rows(e: Eqn, k: int, t: torch.Tensor) -> torch.Tensor:
    """A learnable tensor ([d] or [heads]) meeting vertex or edge rows gets a leading row axis to broadcast on."""
    v, out = e.ins[k].type, e.outs[0].type
    if v is not None and v.domain == "param" and t.dim() > 0 and out is not None and out.domain in ("vertex", "edge", "pair", "graph"):
        return t.unsqueeze(0)
    return t


@implements("const")
def _const(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    return torch.tensor(eval_number(e.attr("value"), ctx.config), dtype=torch.float32)


@implements("dropout", sparse_input=True)
def _dropout(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    x = ins[0]
    if not ctx.training:
        return x
    p = float(e.attr("p"))
    if x.is_sparse:  # draws only at the nonzeros (the mask elsewhere does not matter)
        idx = x.indices()
        values = rng.dropout_at(x.values(), ctx.dropout_key(rng.dropout_stream(e)), idx[0], ctx.vertex_ids,
                                idx[1] + ctx.col_offset, p)
        return torch.sparse_coo_tensor(idx, values, x.shape, is_coalesced=True, check_invariants=False)
    domain = e.outs[0].type.domain
    if domain == "pair":  # link prediction: one mask row per pair of the set in use, keyed by its place in it
        rows = torch.arange(x.shape[0], device=x.device)
    else:
        rows = view.edge_ids if domain == "edge" else ctx.graph_ids if domain == "graph" else ctx.vertex_ids[: x.shape[0]]
    if rows.shape[0] != x.shape[0]:
        raise AssertionError(f"dropout of {x.shape[0]} rows with ids for {rows.shape[0]}")
    return rng.dropout(x, ctx.dropout_key(rng.dropout_stream(e)), rows, p, ctx.col_offset)


@implements("src")
def _src(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    return ins[0][view.src]


@implements("dst")
def _dst(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    return ins[0][view.dst]


@implements("edata")
def _edata(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    return view.edge_data[e.attr("name")]


@implements("pair_src", "pair_dst")
def _pair_end(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    if ctx.pairs is None:
        raise AssertionError(f"{e.op} without a pair set: a link-prediction program runs under gnnc.runtime.link_task")
    return ins[0][ctx.pairs[0] if e.op == "pair_src" else ctx.pairs[1]]


@implements("inner")
def _inner(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    return (ins[0] * ins[1]).sum(-1)


@implements("global_sum_pool", "global_mean_pool", "global_max_pool")
def _readout(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    """Every vertex row into its graph's row (ctx.batch), as PyG's global_*_pool: a graph without vertices gets 0;
    max is scatter_reduce's amax without the zeros it starts from (its gradient shared evenly between ties)."""
    x, batch = ins[0], ctx.batch
    if batch is None or ctx.graph_ids is None:
        raise AssertionError(f"{e.op} without a batch of graphs: a graph-classification program runs under "
                             "gnnc.runtime.graph_task")
    out = x.new_zeros((ctx.graph_ids.shape[0],) + tuple(x.shape[1:]))
    if e.op == "global_max_pool":
        idx = batch.view(-1, *([1] * (x.dim() - 1))).expand_as(x)
        return out.scatter_reduce(0, idx, x, "amax", include_self=False)
    out = out.index_add(0, batch, x)
    if e.op == "global_mean_pool":
        count = torch.bincount(batch, minlength=out.shape[0]).clamp(min=1).to(x.dtype)
        out = out / count.view(-1, *([1] * (x.dim() - 1)))
    return out


@implements("gather")
def _gather(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    return reducers.aggregate(e.attr("reduce"), ins[0], view.dst, view.csr.n_dst, view.deg)


@implements("edge_softmax")
def _edge_softmax(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    return _segment_softmax(ins[0], view.dst, view.csr.n_dst)


@implements("spmm")
def _spmm(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    m = ins[0][view.src]
    if len(ins) > 1:
        w, m = _align(ins[1], m)
        m = w * m
    return reducers.aggregate(e.attr("reduce"), m, view.dst, view.csr.n_dst, view.deg)


@implements("sddmm")
def _sddmm(e: Eqn, ins: list[torch.Tensor], view: GraphView, ctx: ExecContext) -> torch.Tensor:
    a, b = _align(ins[0][view.src], ins[1][view.dst])
    return {"add": torch.add, "mul": torch.mul}[e.attr("op")](a, b)


@implements("linear", sparse_input=True)
def _linear(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    x, w = ins[0], ins[1]
    if x.is_sparse:
        # Sparse input features (bag of words) multiply in fp32 at every precision: autocast would cast
        # them to 16 bits, whose sparse backward torch 2.13 lacks on the CPU ("expected scalar type Float").
        off = torch.autocast(x.device.type, enabled=False) if x.device.type in ("cpu", "cuda") else nullcontext()
        with off:
            out = sparse_features_mm(x, w)
    else:
        out = rng.matmul_redrawn(x, w)  # a dropout of the features is drawn again in the backward, not kept
    if len(ins) > 2:
        out = out + ins[2]
    heads = e.attr("heads")
    if heads is not None:
        h = eval_dim(heads, ctx.config)  # not -1: a rank may hold no row (an empty part)
        out = out.reshape(out.shape[0], h, out.shape[-1] // h)
    return out


@implements("bias")
def _bias(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    return ins[0] + ins[1]


@implements("dot")
def _dot(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    x, a = ins
    return (x * a).sum(-1)


@implements("concat")
def _concat(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    if len(ins) == 1:
        return ins[0].reshape(ins[0].shape[0], math.prod(ins[0].shape[1:]))  # not -1: a part may be empty
    return torch.cat(ins, dim=-1)


@implements("layer_norm")
def _layer_norm(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    x, w, b = ins
    return F.layer_norm(x, (x.shape[-1],), w, b)


@implements("batch_norm")
def _batch_norm(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    """BatchNorm1d over the vertices: batch statistics of every (owned) row in training, running ones in evaluation.

    The sums and sums of squares are taken in float64 over the rows this worker owns (the first
    rows of any vertex value, gnnc.plan.rows) and summed over workers by an all-reduce whose backward
    sums the gradients, so every worker normalises with the statistics of the whole graph.
    """
    x, weight, bias = ins
    eps, momentum = float(e.attr("eps")), float(e.attr("momentum"))
    # the running mean and variance (OpDef.state), when the run keeps them
    running = [(ctx.state or {}).get(f"{e.outs[0].name}.{s.suffix}") for s in op_def(e.op).state]
    if not ctx.training:
        mean, var = running
        if mean is None:  # no state kept: a fresh layer's statistics
            mean, var = torch.zeros_like(weight), torch.ones_like(weight)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias
    n_own = x.shape[0] if ctx.comm is None else ctx.comm.owned_rows()
    own = x[:n_own].double()
    stats = torch.cat([own.sum(0), (own * own).sum(0), own.new_tensor([float(n_own)])])
    if ctx.comm is not None:
        stats = ctx.comm.all_reduce(stats, e)
    d = x.shape[1]
    n = stats[-1].detach()
    mean = stats[:d] / n
    var = (stats[d:2 * d] / n - mean * mean).clamp(min=0.0)
    if running[0] is not None:
        with torch.no_grad():
            running[0].mul_(1 - momentum).add_(momentum * mean.float())
            running[1].mul_(1 - momentum).add_(momentum * (var * n / (n - 1).clamp(min=1)).float())
    return (x - mean.float()) / torch.sqrt(var.float() + eps) * weight + bias


@implements("cross_entropy")
def _cross_entropy(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    logits, y, mask = ins
    # Every row's loss, then the sum over the mask: selecting the rows first (logits[mask]) has a size only
    # the mask's values give, which a GPU would have to read back to the host. Labels outside the mask
    # may be anything (unlabelled vertices); they are replaced, and their rows weigh nothing. The loss is
    # computed in fp32 whatever the precision of the logits.
    per_row = F.cross_entropy(logits.float(), torch.where(mask, y, 0), reduction="none")
    return torch.where(mask, per_row, 0.0).sum() / ctx.loss_count


def float_targets(y: torch.Tensor) -> torch.Tensor:
    """y as the float [rows, T] targets mse and bce read: a multi-label or regression matrix as it is, one class
    per vertex as a one-column number (what a PyG user's `y.float()` gives; check_class_labels says which
    graphs a loss accepts)."""
    return (y if y.dim() == 2 else y.unsqueeze(1)).float()


def _per_target(e: Eqn, ins: list[torch.Tensor], ctx: ExecContext,
                loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The mean of `loss` per (row, target) over the mask's rows and every target, a row at a time as
    cross_entropy's: every row's term, then the sum over the mask, divided by the global count of mask rows
    times the targets (a distributed run sums the ranks' parts to the same mean). An unknown target (NaN)
    adds nothing."""
    out, y, mask = ins
    y = float_targets(y)
    known = mask.unsqueeze(1) & ~torch.isnan(y)
    terms = loss(out.float(), torch.where(known, y, 0.0))
    return torch.where(known, terms, 0.0).sum() / (ctx.loss_count * out.shape[1])


@implements("mse")
def _mse(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    return _per_target(e, ins, ctx, lambda out, y: (out - y) ** 2)  # F.mse_loss over the mask's rows


@implements("bce")
def _bce(e: Eqn, ins: list[torch.Tensor], view: GraphView | None, ctx: ExecContext) -> torch.Tensor:
    if len(ins) == 2:  # link prediction's bce(score, label): the mean over the pair set (gnnc.runtime.link_task)
        return F.binary_cross_entropy_with_logits(ins[0].float().reshape(-1), ins[1].float())
    # BCEWithLogitsLoss over the mask's rows (the logits' sigmoid is in the loss, stable for large logits)
    return _per_target(e, ins, ctx, lambda out, y: F.binary_cross_entropy_with_logits(out, y, reduction="none"))


def init_params(program: Program, seed: int,
                device: torch.device | str = "cpu") -> dict[str, torch.nn.Parameter]:
    """Parameters in program order from one seeded generator (the same on every rank and device):
    drawn on the host, then copied to `device` once."""
    gen = torch.Generator().manual_seed(seed)
    cfg = program.config_dict()
    out: dict[str, torch.nn.Parameter] = {}
    for p in program.params():
        shape = tuple(eval_dim(d, cfg) for d in p.value.type.shape)
        out[p.value.name] = torch.nn.Parameter(_init(p.init, shape, gen).to(device))
    return out


def init_state(program: Program, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The running state of every op that keeps one (OpDef.state), keyed `<result>.<suffix>`, in program order,
    on `device`."""
    cfg = program.config_dict()
    out: dict[str, torch.Tensor] = {}
    for layer in program.layers:
        for e in layer.eqns:
            for spec in op_def(e.op).state:
                shape = tuple(eval_dim(d, cfg) for d in spec.shape(e, e.ins[0].type))
                out[f"{e.outs[0].name}.{spec.suffix}"] = _init(spec.init, shape, None).to(device)
    return out


def _init(init: str | float, shape: tuple[int, ...], gen: torch.Generator | None) -> torch.Tensor:
    if isinstance(init, float):
        return torch.full(shape, init)
    if init == "zeros":
        return torch.zeros(shape)
    if init == "ones":
        return torch.ones(shape)
    if init == "glorot":
        fan = (shape[-2] + shape[-1]) if len(shape) >= 2 else 2 * shape[-1] if shape else 2
        a = math.sqrt(6.0 / fan)
        return (torch.rand(shape, generator=gen) * 2 - 1) * a
    raise GnncError(f"unknown initialiser '{init}'")


def drop_edge_order_copies(graph: Graph) -> None:
    """Forget what building the views left in `graph`'s caches in the graph's edge order, and the store pages read
    for it: a view holds its edges and edge data in CSR order (GraphView), and the graph's own copies (a self-loop
    view's edge list, its gcn_norm and edge data: 12 bytes per edge and more, 1.4 GiB at ogbn-products' size) and
    the store's edge pages would otherwise stay resident through training (issue 35). Whatever asks the graph
    again builds or maps them anew."""
    for key in list(graph._views):
        if key == "self_loops_edges" or (isinstance(key, tuple) and key[0] in ("gcn_norm", "edge_data")):
            del graph._views[key]
    release_pages(graph)


def graph_inputs(graph: Graph) -> dict[str, torch.Tensor]:
    return {"x": sparse_if_sparse(graph.x), "y": graph.y, "train": graph.train_mask, "val": graph.val_mask,
            "test": graph.test_mask}


def check_graph_fits(program: Program, graph: Graph) -> None:
    """The program's bound dims, and the edge data it reads, must match the graph it runs on."""
    check_dims_fit(program, graph.num_features, graph.num_classes, graph.name, graph.y)
    edge_data.check_fits(program, graph.edge_data, graph.name, program.config_dict())


def loss_op(program: Program) -> str:
    """The op that defines the program's loss (cross_entropy, mse, bce, ...)."""
    return next(e.op for layer in program.layers for e in layer.eqns if e.outs[0].name == program.loss.name)


def check_dims_fit(program: Program, num_features: int, num_classes: int, name: str,
                   y: torch.Tensor | None = None) -> None:
    """The model's input width is the graph's; its logits cover the classes, or as many outputs as targets for a
    loss of float targets. With the graph's (or a shard's) labels `y`, whether the loss can read them
    (gnnc.graph.storage.check_class_labels)."""
    cfg = program.config_dict()
    feats = program.inputs[0].type.shape[0]
    if eval_dim(feats, cfg) != num_features:
        raise GnncError(f"the model expects {eval_dim(feats, cfg)} input features but graph "
                        f"'{name}' has {num_features}")
    if program.logits.type.domain == "pair":  # link prediction scores pairs: it reads no vertex labels
        return
    width = eval_dim(program.logits.type.shape[0], cfg)
    loss = loss_op(program)
    if op_def(loss).loss == "targets":
        if y is not None:
            check_class_labels(y, name, loss)
            targets = int(y.shape[1]) if y.dim() == 2 else 1
            if width != targets:
                raise GnncError(f"the model outputs {width} values per vertex but graph '{name}' has {targets} "
                                f"target{'s' if targets != 1 else ''} per vertex ({loss} compares one output with "
                                "each target)")
        return
    if y is not None:
        check_class_labels(y, name, loss)
    if width < num_classes:
        raise GnncError(f"the model outputs {width} logits but graph '{name}' has {num_classes} classes")


def forward(interp: Interpreter, params: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
            ctx: ExecContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Run every layer; return (logits, loss)."""
    env = dict(inputs)
    if ctx.recompute and ctx.comm is None:
        recompute.forward(interp, env, params, ctx)
        return env[interp.program.logits.name], env[interp.program.loss.name]
    for layer in interp.program.layers:
        interp.run_layer(layer, env, params, ctx)
    return env[interp.program.logits.name], env[interp.program.loss.name]
