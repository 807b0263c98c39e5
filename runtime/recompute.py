"""`--recompute`: a training forward keeps each graph layer's inputs only, and runs the layer again in the backward.

Why: between the passes a layer keeps what its backward reads (its aggregated rows, GAT's z and scores, an
activation's result), a few [vertices, width] tensors per layer. Under torch.utils.checkpoint (use_reentrant=False)
a graph layer, with the dense layers after it (`regions`), keeps nothing but its inputs (which the region before
produced, or the graph's features), and its backward first runs its forward again, keeping for that layer alone what it keeps without recomputation: one layer's
worth at a time instead of every layer's, for one more forward pass per step.

The recomputation computes the same values: dropout's masks are keyed by (seed, epoch, op, global id)
(gnnc.runtime.rng), not by a generator's state, and hoisted values come from the run's cache. Two things a forward
does besides computing are kept from happening twice: an op's running state (batch_norm's statistics) is updated in
the first run only, and a fused chain never writes over one of the layer's inputs (ExecContext.protected), which
its recomputation reads again. One process only: a rank's layers exchange rows with the other ranks.

The first region of a GCN-like model (`first_layer`: [dropout of the features] -> linear -> SpMM sum over constant
edge weights -> fused bias / activation / dropout epilogues, whose result only the next graph layer's linear reads)
runs as one function in bounded blocks (`_FirstLayer`), so that neither pass holds two [vertices, width] tensors:
its forward computes the layer's output a block of columns at a time (each column's product, aggregation and
epilogue depend on that column alone) and keeps that output alone, the next layer's input; its backward forms the
next linear's weight gradient from it, then writes the output's gradient over it a block of rows at a time, and
aggregates that gradient over the transposed CSR a block of source rows at a time into the first weight's gradient.
Without it the step held the product beside the aggregation in the forward, and the output beside its gradient,
then the aggregation's gradient beside the product's, in the backward: two [vertices, 256] tensors at each of those
moments (2.3 GiB each at ogbn-products' size, issue 35). The values are the interpreter's: the same kernels, on
columns or rows each output depends on alone, except the first weight's gradient, summed over row blocks instead of
in one product (its rounding, within 1e-6 relative).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from gnnc.ir import Eqn, Layer, Program
from gnnc.runtime import fusion, rng
from gnnc.runtime.kernels import cpu, native

# the first layer's forward computes this many output columns at a time: its product's block [vertices, 32] is the
# most it holds beside the output (an eighth of [vertices, 256]; a multiple of the kernels' vector width, so that
# each column is summed as in the whole product)
COLUMN_BLOCK = 32
# bytes of one row block's temporaries ([rows, width] floats) in `_FirstLayer` (about 300 blocks of [rows, 256] at
# ogbn-products' size), and the fewest blocks a pass takes (`_row_blocks`)
BLOCK_BYTES = 8 << 20
ROW_SPLIT = 8


def regions(layers: Sequence[Layer]) -> list[tuple[Layer, ...]]:
    """The layers in the runs one checkpoint each takes: a graph layer with the dense layers after it, up to the next
    graph layer (and the first with those before it). A region's input is then what a graph layer's first product
    reads anyway (the previous region's activation and dropout, written over the aggregation as without
    recomputation).

    The first region (the one reading the graph's features) runs once, without a checkpoint (gnnc.runtime.executor's
    forward): its backward is the step's last, and run again there its forward holds its product and its aggregation
    beside its output's gradient, three [vertices, width] tensors where its backward without recomputation holds
    two (that gradient and its input's); what it keeps besides its output, which the next region keeps anyway as
    its input, is one layer's worth. Measured on the products-sized R-MAT at 0.05 (GCN, hidden 256): recomputing it
    raised the step's peak by one [vertices, 256] tensor above the run without --recompute (issue 35)."""
    out: list[tuple[Layer, ...]] = []
    current: list[Layer] = []
    for layer in layers:
        if layer.kind == "graph" and any(x.kind == "graph" for x in current):
            out.append(tuple(current))
            current = []
        current.append(layer)
    return out + [tuple(current)] if current else out


def forward(interp: Any, env: dict[str, torch.Tensor], params: dict[str, torch.Tensor], ctx: Any) -> None:
    """A forward under --recompute into `env`. Training: the first region once (by `_FirstLayer` where
    `first_layer` matches, and then the rest of the next region as it runs without recomputation: its product,
    which it recomputed from the first region's result, is computed already), every other region under a
    checkpoint. Evaluation: `_evaluate` where `first_layer` matches (the first region's output a block of rows at a
    time, not its product beside its aggregation), the rest as without --recompute."""
    first = first_layer(interp.program, interp.chains)
    done = first is not None and run_first_layer(first, interp, env, params, ctx)
    skip = frozenset({(first.next_layer.name, 0)}) if first is not None and done else frozenset()
    for k, layers in enumerate(regions(interp.program.layers)):
        if k == 0 and done:
            continue
        if k <= int(done) or not ctx.training:
            for layer in layers:
                interp.run_layer(layer, env, params, ctx, skip=skip)
        else:
            run_recomputed(interp, layers, env, params, ctx)


def run_recomputed(interp: Any, layers: tuple[Layer, ...], env: dict[str, torch.Tensor],
                   params: dict[str, torch.Tensor], ctx: Any) -> None:
    """`interp.run_layer` of each of `layers` under one checkpoint: the same values into `env`, the same values
    forgotten after (`interp.drop_dead`)."""
    eqns = [(layer, k, e) for layer in layers for k, e in enumerate(layer.eqns)]
    inside = {e.outs[0].name for _, _, e in eqns}
    names = list(dict.fromkeys(v.name for _, _, e in eqns for v in e.ins if v.name not in inside and v.name in env))
    dying = {n for layer, k, _ in eqns for n in interp._dying.get((layer.name, k), ())}
    outs = [e.outs[0].name for _, _, e in eqns if e.outs[0].name not in dying]
    runs = [0]

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        local = dict(zip(names, tensors))
        first = runs[0] == 0
        runs[0] += 1
        # the recomputation leaves the running state alone (updated once, by the first run) and, as the first
        # run, every input as it found it
        run_ctx = dataclasses.replace(ctx, protected=tuple(t for t in tensors if isinstance(t, torch.Tensor)
                                                           and t.layout == torch.strided),
                                      **({} if first else {"state": None}))
        for layer in layers:
            interp.run_layer(layer, local, params, run_ctx)
        return tuple(local[n] for n in outs)

    results = checkpoint(run, *(env[n] for n in names), use_reentrant=False)
    env.update(zip(outs, results))
    for layer in layers:
        interp.drop_dead(env, layer)


@dataclasses.dataclass(frozen=True)
class FirstLayer:
    """The first region's equations that `_FirstLayer` computes, and the next graph layer's linear it ends with."""

    drop: Eqn | None  # the features' dropout, or None
    features: str  # the program input the first linear reads (through `drop`)
    linear: Eqn  # t = linear(features, W1), no bias, no heads
    edata: Eqn  # the constant edge weights the SpMM multiplies by
    spmm: Eqn  # a = spmm[reduce=sum](t, weights)
    chains: tuple[fusion.Chain, ...]  # the epilogues after it, in order; only the last may read its result back
    layers: tuple[Layer, ...]  # the first region
    next_layer: Layer  # the next graph layer, whose first equation is `consumer`
    consumer: Eqn  # linear(the first region's result, W2), no bias, no heads: its only reader


def first_layer(program: Program, chains: dict[str, fusion.Chain]) -> FirstLayer | None:
    """The first region's shape that `_FirstLayer` runs (module docstring), or None: then it runs as before."""
    groups = regions(program.layers)
    if len(groups) < 2:
        return None
    eqns = [e for layer in groups[0] for e in layer.eqns]
    readers = fusion._readers(program)
    for v in (program.logits, program.loss):
        readers[v.name] += 1  # never an intermediate value here: read twice, as no value read once
    inputs = {v.name for v in program.inputs}

    def once(name: str) -> bool:
        return readers.get(name, 0) == 1

    def plain_linear(e: Eqn) -> bool:
        return e.op == "linear" and len(e.ins) == 2 and e.attr("heads") is None and e.ins[1].type is not None \
            and e.ins[1].type.domain == "param" and not e.attr("hoisted")

    k = 0
    drop = None
    if eqns and eqns[0].op == "dropout" and eqns[0].ins[0].name in inputs and once(eqns[0].outs[0].name):
        drop, k = eqns[0], 1
    if len(eqns) < k + 4:
        return None
    linear, edata, spmm = eqns[k:k + 3]
    if not plain_linear(linear):
        return None
    source = drop.outs[0].name if drop is not None else linear.ins[0].name
    if linear.ins[0].name != source or (drop is None and source not in inputs):
        return None
    if edata.op != "edata" or spmm.op != "spmm" or spmm.attr("reduce") != "sum" \
            or [v.name for v in spmm.ins] != [linear.outs[0].name, edata.outs[0].name] \
            or not once(linear.outs[0].name) or not once(edata.outs[0].name):
        return None
    tail: list[fusion.Chain] = []
    value, rest = spmm.outs[0].name, eqns[k + 3:]
    while rest:
        chain = chains.get(rest[0].outs[0].name)
        if chain is None or chain.kind != "epilogue" or chain.escapes or tuple(rest[:len(chain.eqns)]) != chain.eqns \
                or chain.eqns[0].ins[0].name != value or chain.op("add") is not None or not once(value):
            return None
        tail.append(chain)
        value, rest = chain.result, rest[len(chain.eqns):]
    # only the last epilogue's backward reads its result (the others pass the gradient through: a bias)
    if not tail or any(c.op("dropout") or any(e.op in fusion.ACTIVATIONS for e in c.eqns) for c in tail[:-1]):
        return None
    consumer = groups[1][0].eqns[0] if groups[1][0].eqns else None
    if groups[1][0].kind != "graph" or consumer is None or not plain_linear(consumer) \
            or consumer.ins[0].name != value or not once(value):
        return None
    return FirstLayer(drop, drop.ins[0].name if drop is not None else source, linear, edata, spmm, tuple(tail),
                      groups[0], groups[1][0], consumer)


def run_first_layer(first: FirstLayer, interp: Any, env: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
                    ctx: Any) -> bool:
    """The first region and the next layer's product by `_FirstLayer` into `env`; False (nothing done) where its
    kernels cannot take the tensors (then the region runs as its equations)."""
    x = env.get(first.features)
    view = ctx.views.get(next(lay for lay in first.layers if first.spmm in lay.eqns).edges)
    w1, w2 = params.get(first.linear.ins[1].name), params.get(first.consumer.ins[1].name)
    biases = [c.op("bias") for c in first.chains if c.op("bias") is not None]
    if x is None or view is None or w1 is None or w2 is None or len(biases) > 1 or ctx.comm is not None \
            or not ctx.use_kernels or not ctx.fuse or torch.is_autocast_enabled("cpu") or x.is_sparse \
            or x.dim() != 2 or x.requires_grad or w1.dim() != 2 or w2.dim() != 2:
        return False
    bias = params.get(biases[0].ins[1].name) if biases else None
    if biases and (bias is None or bias.dim() != 1):
        return False
    weights = interp.eqn(first.edata, [], view, ctx)
    if weights.requires_grad or weights.dim() != 1 or native.usable(x, w1, w2, weights) is None \
            or (bias is not None and native.usable(bias) is None) or weights.shape[0] != view.csr.nnz:
        return False
    drop = None
    if first.drop is not None and ctx.training:
        drop = (ctx.dropout_key(rng.dropout_stream(first.drop)), float(first.drop.attr("p")), ctx.col_offset)
    rows = native.int64(ctx.vertex_ids[: x.shape[0]])
    specs = [_epilogue_spec(c, ctx) for c in first.chains]
    run = _Run(x, drop, rows, view.csr, weights, specs, ctx.col_offset)
    if not torch.is_grad_enabled():  # an evaluation: nothing to differentiate, so the product may be reassociated
        env[first.consumer.outs[0].name] = _evaluate(run, w1, bias, w2)
        for layer in first.layers:
            interp.drop_dead(env, layer)
        interp.drop_dead(env, first.next_layer, 0)
        return True
    # the backward's transposed pattern, built now rather than in the first backward: building it holds its int64
    # transpose for a moment (24 bytes per edge), beside nothing else of this step here
    cpu.pattern(view.csr, True, 1, x.device)
    env[first.consumer.outs[0].name] = _FirstLayer.apply(w1, bias, w2, run)
    for layer in first.layers:
        interp.drop_dead(env, layer)
    interp.drop_dead(env, first.next_layer, 0)
    return True


def _epilogue_spec(chain: fusion.Chain, ctx: Any) -> tuple[int, float, int, int, float, bool]:
    """(activation, its parameter, whether it drops out, the dropout's key and p, whether it adds the bias) of an
    epilogue as gnnc.runtime.fusion runs it."""
    act_eqn = next((e for e in chain.eqns if e.op in fusion.ACTIVATIONS), None)
    act, act_param = fusion.IDENTITY, 0.0
    if act_eqn is not None:
        act, attr, default = fusion.ACTIVATIONS[act_eqn.op]
        act_param = float(act_eqn.attr(attr, default)) if attr else 0.0
    drop = chain.op("dropout") if ctx.training else None
    p = 0.0 if drop is None else float(drop.attr("p"))
    key = 0 if drop is None else ctx.dropout_key(rng.dropout_stream(drop))
    return act, act_param, (1 if drop is not None else 0), key, p, chain.op("bias") is not None


@dataclasses.dataclass(frozen=True)
class _Run:
    """What `_FirstLayer` reads besides its parameters: the features (and their dropout: key, p, column offset),
    the rows' global ids, the CSR with its constant weights, each epilogue's spec and the run's column offset."""

    x: torch.Tensor
    drop: tuple[int, float, int] | None
    rows: torch.Tensor
    csr: Any
    weights: torch.Tensor
    specs: list
    col_offset: int

    def features(self, r: slice) -> torch.Tensor:
        """Rows r of what the first linear reads: the features' dropout drawn again (keyed by row and column)."""
        if self.drop is None:
            return self.x[r]
        key, p, col_offset = self.drop
        return rng.dropout(self.x[r], key, self.rows[r], p, col_offset)

    def epilogue_args(self, spec: tuple, r: slice, col_offset: int) -> list:
        act, act_param, dropped, key, p, _ = spec
        return fusion._epilogue_args((act, act_param, self.rows[r] if dropped else None, key, col_offset,
                                      rng.threshold(p), 1.0 / (1.0 - p)))


def _row_blocks(n: int, width: int) -> list[slice]:
    """Row blocks of [n, width] floats: BLOCK_BYTES each, and at least ROW_SPLIT of them, so that a block's
    temporaries stay a fraction of a [n, width] tensor on a graph of any size."""
    step = max(1, min(BLOCK_BYTES // (4 * max(width, 1)), -(-n // ROW_SPLIT)))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _rows_of(a: torch.Tensor, r: slice) -> torch.Tensor:
    """Rows r of the sparse CSR matrix a, a sparse CSR matrix over the same columns (views of its arrays)."""
    crow = a.crow_indices()
    lo, hi = int(crow[r.start]), int(crow[r.stop])
    return cpu.sparse_csr(crow[r.start:r.stop + 1] - lo, a.col_indices()[lo:hi], a.values()[lo:hi],
                          (r.stop - r.start, a.shape[1]))


def _aggregate(a: torch.Tensor, x: torch.Tensor, width: int) -> torch.Tensor:
    """a @ x by the kernel gnnc.runtime.kernels.cpu picks for a product `width` wide (the whole layer's), so that
    a block of its columns is summed as the whole product sums them."""
    if width >= cpu._REDUCE_KERNEL_MIN_WIDTH or x.dtype not in cpu.MKL_DTYPES:
        return torch.sparse.mm(a, x, "sum")
    return torch.sparse.mm(a, x)


def _evaluate(run: _Run, w1: torch.Tensor, bias: torch.Tensor | None, w2: torch.Tensor) -> torch.Tensor:
    """The first layer's evaluation (no dropout, no gradient) a block of rows at a time, as (A[rows] x) W1: one
    aggregation of the features (100 wide on products, not the 256-wide product; read where they are, no [N, 256]
    product), then the epilogues, into its output; then the next layer's product. Within float rounding of
    A (x W1) (the reassociation: about 1e-7 relative), and 2.5x faster than the column blocks on products at 0.05."""
    x = run.x.contiguous()
    n, width = x.shape[0], w1.shape[1]
    a = cpu.pattern(run.csr, False, 1, x.device).matrix(run.weights, x.dtype)
    lib = native.usable(x)
    bias = None if bias is None else bias.contiguous()
    h = x.new_empty(n, width)
    for r in _row_blocks(n, max(x.shape[1], width)):
        out = _aggregate(_rows_of(a, r), x, x.shape[1]).mm(w1)
        for spec in run.specs:
            status = native.fn(lib, "epilogue", x.dtype)(
                native.ptr(out), 0, native.ptr(bias) if spec[5] and bias is not None else 0, native.ptr(out),
                out.shape[0], width, *run.epilogue_args(spec, r, run.col_offset))
            if status != 0:
                raise MemoryError("epilogue: out of memory")
        h[r] = out
    return h.mm(w2)


class _FirstLayer(torch.autograd.Function):
    """The first region and the next layer's product in blocks (module docstring): keeps the region's result only."""

    @staticmethod
    def forward(ctx: Any, w1: torch.Tensor, bias: torch.Tensor | None, w2: torch.Tensor, run: _Run) -> torch.Tensor:
        x = run.x
        n, width = x.shape[0], w1.shape[1]
        a = cpu.pattern(run.csr, False, 1, x.device).matrix(run.weights, x.dtype)
        lib = native.usable(x)
        h = x.new_empty(n, width)
        for c0 in range(0, width, COLUMN_BLOCK):
            c = slice(c0, min(c0 + COLUMN_BLOCK, width))
            k = c.stop - c.start
            w1c = w1[:, c].contiguous()
            bc = None if bias is None else bias[c].contiguous()
            t = x.new_empty(n, k)
            for r in _row_blocks(n, max(x.shape[1], k)):
                torch.mm(run.features(r), w1c, out=t[r])
            for r in _row_blocks(n, k):
                out = _aggregate(_rows_of(a, r), t, width)
                for spec in run.specs:
                    status = native.fn(lib, "epilogue", x.dtype)(
                        native.ptr(out), 0, native.ptr(bc) if spec[5] and bc is not None else 0,
                        native.ptr(out), out.shape[0], k, *run.epilogue_args(spec, r, run.col_offset + c0))
                    if status != 0:
                        raise MemoryError("epilogue: out of memory")
                h[r, c] = out
            del t
        ctx.run = run
        ctx.has_bias = bias is not None
        ctx.save_for_backward(h, w2)
        return h.mm(w2)  # as the interpreter's `h @ w2`

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        run: _Run = ctx.run
        h, w2 = ctx.saved_tensors
        grad = grad.contiguous()
        n, width = h.shape
        gw2 = h.t().mm(grad)  # as autograd's mm forms it (mm_mat2_backward)
        lib = native.usable(h)
        last = run.specs[-1]
        passes = last[0] == fusion.IDENTITY and not last[2]  # d out / d in is 1 (gnnc.runtime.fusion._Epilogue)
        w2t = w2.t()
        # the result's gradient, then the epilogue's, over the result itself: nothing reads it after gw2
        for r in _row_blocks(n, width):
            gh = grad[r].mm(w2t)  # as autograd's mm forms it (mm_mat1_backward)
            if passes:
                h[r] = gh
                continue
            status = native.fn(lib, "epilogue_backward", h.dtype)(
                native.ptr(gh), native.ptr(h[r]), native.ptr(h[r]), gh.shape[0], width,
                *run.epilogue_args(last, r, run.col_offset))
            if status != 0:
                raise MemoryError("epilogue backward: out of memory")
        torch.autograd.graph.increment_version(h)
        gb = h.sum(0) if ctx.has_bias else None  # the bias's gradient as autograd forms it for `x + bias`
        at = cpu.pattern(run.csr, True, 1, h.device).matrix(run.weights, h.dtype)
        gw1 = None
        for r in _row_blocks(n, width):
            gt = _aggregate(_rows_of(at, r), h, width)
            xr = run.features(r)
            gw1 = xr.t().mm(gt) if gw1 is None else gw1.addmm_(xr.t(), gt)
        return gw1, gb, gw2, None
