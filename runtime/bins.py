"""Running a graph layer bin by bin: G3's bins, with eager computation and per-bin recomputation.

Why this module exists: a layer annotated `bins=k` (gnnc.plan.schedule)
computes its output rows in k bins (gnnc.plan.bins: G3's priority order,
boundary rows first). Its equations not marked `bin` (the dense map before
the aggregation, the halo) run once on every row; those marked `bin` run once
per bin on the bin's rows and in-edges. When the halo is overlapped, the bins
whose sources are all held run first, while the halo is in flight (G3's
eager computation), the others once it has arrived; without a halo the bins
run in priority order.

Each bin runs under activation checkpointing (torch.utils.checkpoint,
non-reentrant): only its inputs and outputs stay alive after it, and
backward recomputes its activations when it reaches it. Autograd reaches the
bins in the reverse of the order they ran, so backward goes in reverse bin
order with one bin's activations alive at a time. Recomputation is exact:
dropout masks are keyed by global vertex and edge ids (gnnc.runtime.rng),
not drawn from a generator's state.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from gnnc.ir.ops import reads_neighbours
from gnnc.plan.bins import layer_bins
from gnnc.plan.schedule import bin_eqn, exchange_schedule, layer_schedule
from gnnc.runtime.parts import PartStream


def run_binned(interp: Any, layer: Any, env: dict[str, Any], params: dict[str, torch.Tensor], ctx: Any) -> None:
    """Run `layer` (a binned graph layer) into `env`: whole equations first, then the bins (module docstring)."""
    sched = layer_schedule(layer)
    lgl = ctx.comm.layer
    bins = layer_bins(lgl, layer.edges, sched.bins, sched.bin_order)
    view = ctx.views.get(layer.edges)
    per_bin = [e for e in layer.eqns if bin_eqn(e)]
    made_in_bins = {o.name for e in per_bin for o in e.outs}
    streams: list[PartStream] = []
    for e in layer.eqns:
        if bin_eqn(e):
            continue
        ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
        if e.op == "halo" and exchange_schedule(e).split:
            env[e.outs[0].name] = ctx.comm.start_parts(e, ins[0])
            streams.append(env[e.outs[0].name])
        else:
            env[e.outs[0].name] = interp.eqn(e, [x.whole() if isinstance(x, PartStream) else x for x in ins],
                                             view, ctx)
    outputs = [v.name for v in layer.outputs if v.name in made_in_bins]
    if not outputs:
        return
    # what the bins read from the rest of the layer, held here: backward recomputes a bin after the
    # forward pass has let go of env's values
    taken = {v.name: env[v.name] for e in per_bin for v in e.ins if v.name not in made_in_bins and v.name in env}
    held = [b for b in range(len(bins)) if bins.held[b]]
    order = held + [b for b in range(len(bins)) if not bins.held[b]] if streams else list(range(len(bins)))
    results = []
    for b in order:
        if streams and not bins.held[b] and not streams[0].taken(1):
            _arrived(streams)
        def run(b: int = b) -> tuple[torch.Tensor, ...]:
            return _run_bin(interp, per_bin, outputs, taken, params, ctx, bins, b)

        results.append(checkpoint(run, use_reentrant=False) if torch.is_grad_enabled() else run())
    rows = torch.cat([bins.rows[b] for b in order])
    back = torch.empty_like(rows)
    back[rows] = torch.arange(len(rows))
    for k, name in enumerate(outputs):
        env[name] = torch.cat([r[k] for r in results]).index_select(0, back)
    if streams and not streams[0].taken(1):
        # A worker whose bins all read held rows still waits for the exchange and joins it to autograd,
        # so that its backward dual runs on every worker (a peer sends back gradients of the rows it
        # received); their gradient here is 0.
        env[outputs[0]] = _Join.apply(env[outputs[0]], *_arrived(streams))


def _arrived(streams: list[PartStream]) -> tuple[torch.Tensor, ...]:
    """Wait for every halo of the layer, in the layer's order, and pass their remote rows through one node.

    Which bins run before the wait differs from worker to worker, and so would the order in which
    autograd reaches the halos' backward duals, whose messages must be posted in the same order on
    every worker. Through `_Together` every halo's gradient is complete at the same point, and the
    duals run in the order the halos were waited for: this one, on every worker.
    """
    remote = _Together.apply(*[s.part(1) for s in streams])
    for s, r in zip(streams, remote):
        s.set_part(1, r)
    return remote


class _Together(torch.autograd.Function):
    """The identity on several tensors; backward hands on all their gradients in one step."""

    @staticmethod
    def forward(ctx, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return grads


class _Join(torch.autograd.Function):
    """`out`, with `unused` joined into autograd: backward gives them zero gradients."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
        ctx.meta = [(u.shape, u.dtype, u.device) for u in unused]
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (grad, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.meta))


def _run_bin(interp: Any, eqns: list, outputs: list[str], env: dict[str, Any], params: dict[str, torch.Tensor],
             ctx: Any, bins: Any, b: int) -> tuple[torch.Tensor, ...]:
    """Bin b's equations on its rows; returns its rows of the layer's outputs."""
    rows, view, pos = bins.rows[b], bins.views[b], bins.pos[b]
    bctx = dataclasses.replace(ctx, vertex_ids=ctx.vertex_ids[rows])
    local: dict[str, torch.Tensor] = {}
    for e in eqns:
        ins = []
        for k, v in enumerate(e.ins):
            if v.name in local:
                ins.append(local[v.name])
                continue
            if v.name in params:
                ins.append(params[v.name])
                continue
            x = env[v.name]
            if k in reads_neighbours(e):  # source rows: every held row, and the halo's once it has arrived
                x = x.part(0) if isinstance(x, PartStream) and bins.held[b] else \
                    x.whole() if isinstance(x, PartStream) else x
                x = (x.to_dense() if x.is_sparse else x)[: view.csr.n_src]
            elif v.type is not None and v.type.domain == "edge":
                x = x[pos]
            elif isinstance(x, torch.Tensor) and x.dim() > 0 and v.type is not None and v.type.domain == "vertex":
                x = x.index_select(0, rows)  # destination rows (sparse inputs too)
            ins.append(x)
        local[e.outs[0].name] = interp.eqn(e, ins, view, bctx)
    return tuple(local[name] for name in outputs)
