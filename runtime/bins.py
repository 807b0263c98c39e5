"""Running a graph layer bin by bin: G3's bins, with eager computation and per-bin recomputation.

Why this module exists: a layer annotated `bins=k` (gnnc.plan.schedule_attrs)
computes its output rows in k bins (gnnc.plan.bins: G3's priority order,
boundary rows first). Its equations not marked `bin` (the dense map before
the aggregation, the halo) run once on every row; those marked `bin` run once
per bin on G3's bin subgraph: the bin's rows, their in-edges and the source
rows those read, gathered from the layer's values. When the halo is
overlapped, the bins whose sources are all held run first, while the halo is
in flight, the others once all of it has arrived; without a halo the bins run
in priority order. That is the part of G3's eager computation (section 5.2)
that needs no remote row: G3 also starts the rows whose remote inputs have
arrived while other peers' are still in flight, and its inter-layer pipeline
sends each bin's output rows as soon as the bin is done; gnnc does neither
(it waits for the whole halo, and a layer's rows leave in one exchange after
the layer).

Memory: forward runs the bins without recording them and keeps only their
output rows; backward (`_Bins.backward`) goes through the bins in reverse
order, recomputes one bin's forward with autograd on, differentiates it and
adds its gradients into the layer's inputs' gradients (an index_add of the
bin's rows), so one bin's activations are alive at a time and a bin costs
what its own rows and edges cost, not the layer's. Recomputation is exact:
dropout masks are keyed by global vertex and edge ids (gnnc.runtime.rng),
not drawn from a generator's state, and a bin runs the same operations in
both passes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from gnnc.plan.bins import EDGES, ROWS, SOURCES, WHOLE, Bins, bin_inputs, bins_of, taken_as
from gnnc.plan.schedule_attrs import bin_eqn, exchange_schedule
from gnnc.runtime.parts import PartStream


def run_binned(interp: Any, layer: Any, env: dict[str, Any], params: dict[str, torch.Tensor], ctx: Any) -> None:
    """Run `layer` (a binned graph layer) into `env`: whole equations first, then the bins (module docstring)."""
    bins = bins_of(ctx.comm.layer, layer, ctx.config)
    view = ctx.views.get(layer.edges)
    per_bin = [e for e in layer.eqns if bin_eqn(e)]
    made = {o.name for e in per_bin for o in e.outs}
    streams: list[PartStream] = []
    for e in layer.eqns:
        if bin_eqn(e):
            continue
        ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
        if exchange_schedule(e).split:  # (a halo: the only split a binned layer holds, gnnc.plan.schedule_attrs)
            env[e.outs[0].name] = ctx.comm.start_parts(e, ins[0])
            streams.append(env[e.outs[0].name])
        else:
            env[e.outs[0].name] = interp.eqn(e, [x.whole() if isinstance(x, PartStream) else x for x in ins],
                                             view, ctx)
    outputs = [v.name for v in layer.outputs if v.name in made]
    if not outputs:
        return
    uses = [(v.name, how) for v, how in bin_inputs(layer)]
    held = [b for b in range(len(bins)) if bins.held[b]] if streams else []
    rest = [b for b in range(len(bins)) if b not in held]
    runs: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []
    if held:  # eager: these read held rows only, while the halo is in flight
        runs.append((held, _apply(interp, per_bin, outputs, uses, env, params, ctx, bins, held, sources_held=True)))
    if rest:
        if streams:
            _arrived(streams)
        runs.append((rest, _apply(interp, per_bin, outputs, uses, env, params, ctx, bins, rest, sources_held=False)))
    rows = torch.cat([bins.rows[b] for order, _ in runs for b in order])
    back = torch.empty_like(rows)
    back[rows] = torch.arange(len(rows), device=rows.device)
    for k, name in enumerate(outputs):
        env[name] = torch.cat([out[k] for _, out in runs]).index_select(0, back)
    if streams and not streams[0].taken(1):
        # A worker whose bins all read held rows still waits for the exchange and joins it to autograd,
        # so that its backward dual runs on every worker (a peer sends back gradients of the rows it
        # received); their gradient here is 0.
        env[outputs[0]] = _Join.apply(env[outputs[0]], *_arrived(streams))


@dataclass
class _BinRun:
    """What `_Bins` needs to run (and rerun) bins: the equations, how each input is taken, the bins."""

    interp: Any
    eqns: list
    outputs: list[str]
    uses: list[tuple[str, str]]
    ctx: Any
    bins: Bins
    order: list[int]

    def take(self, b: int, how: str, x: Any) -> Any:
        """Bin b's share of value x: its source rows, its own rows, its edges' entries, or all of it."""
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or how == WHOLE:
            return x
        index = {SOURCES: self.bins.sources, ROWS: self.bins.rows, EDGES: self.bins.pos}[how][b]
        return x.index_select(0, index)

    def run(self, b: int, taken: list[Any]) -> tuple[torch.Tensor, ...]:
        """Bin b's equations on its shares `taken` (one per use); its rows of the layer's outputs."""
        given = {use: x for use, x in zip(self.uses, taken)}
        view = self.bins.views[b]
        ctx = dataclasses.replace(self.ctx, vertex_ids=self.ctx.vertex_ids[self.bins.rows[b]])
        local: dict[str, Any] = {}
        for e in self.eqns:
            ins = []
            for k, v in enumerate(e.ins):
                if v.name in local:
                    ins.append(local[v.name])
                    continue
                ins.append(given[(v.name, taken_as(e, k))])
            local[e.outs[0].name] = self.interp.compute(e, ins, view, ctx)  # a bin equation is never hoisted
        return tuple(local[name] for name in self.outputs)


def _apply(interp: Any, eqns: list, outputs: list[str], uses: list[tuple[str, str]], env: dict[str, Any],
           params: dict[str, torch.Tensor], ctx: Any, bins: Bins, order: list[int], sources_held: bool
           ) -> tuple[torch.Tensor, ...]:
    """Bins `order` as one autograd node; their output rows, bin after bin."""
    values = []
    for name, how in uses:
        x = env[name] if name in env else params[name]
        if isinstance(x, PartStream):
            x = x.part(0) if sources_held else x.whole()
        if how == SOURCES and isinstance(x, torch.Tensor) and x.is_sparse:
            x = x.to_dense()  # a bag-of-words input: its rows are gathered densely, as a halo sends them
        values.append(x)
    run = _BinRun(interp, eqns, outputs, uses, ctx, bins, order)
    return _Bins.apply(run, *values)


class _Bins(torch.autograd.Function):
    """Forward: the bins without autograd, their output rows concatenated. Backward: per bin, in
    reverse, recompute with autograd and add its gradients into the inputs' (module docstring)."""

    @staticmethod
    def forward(ctx: Any, run: _BinRun, *values: Any) -> tuple[torch.Tensor, ...]:
        ctx.run = run
        ctx.save_for_backward(*[v if isinstance(v, torch.Tensor) else None for v in values])
        ctx.others = [None if isinstance(v, torch.Tensor) else v for v in values]
        with torch.no_grad():
            per_bin = [run.run(b, [run.take(b, how, v) for (_, how), v in zip(run.uses, values)]) for b in run.order]
        ctx.sizes = [len(run.bins.rows[b]) for b in run.order]
        return tuple(torch.cat([pb[k] for pb in per_bin]) for k in range(len(run.outputs)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        run: _BinRun = ctx.run
        values = [s if s is not None else o for s, o in zip(ctx.saved_tensors, ctx.others)]
        need = ctx.needs_input_grad[1:]
        acc: list[torch.Tensor | None] = [None] * len(values)
        ends = torch.cumsum(torch.tensor([0, *ctx.sizes]), 0).tolist()
        for i in reversed(range(len(run.order))):
            b = run.order[i]
            with torch.enable_grad():
                taken = []
                for k, ((_, how), v) in enumerate(zip(run.uses, values)):
                    t = run.take(b, how, v)
                    if isinstance(t, torch.Tensor) and need[k]:
                        t = t.detach().requires_grad_()
                    taken.append(t)
                outs = run.run(b, taken)
                wanted = [k for k, t in enumerate(taken) if isinstance(t, torch.Tensor) and t.requires_grad]
                pairs = [(o, g[ends[i]:ends[i + 1]]) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
                if not pairs or not wanted:
                    continue
                got = torch.autograd.grad([o for o, _ in pairs], [taken[k] for k in wanted], [g for _, g in pairs],
                                          allow_unused=True)
            for k, g in zip(wanted, got):
                if g is None:
                    continue
                how = run.uses[k][1]
                if how == WHOLE:
                    acc[k] = g if acc[k] is None else acc[k] + g
                    continue
                if acc[k] is None:
                    acc[k] = torch.zeros(values[k].shape, dtype=g.dtype, device=g.device)
                index = {SOURCES: run.bins.sources, ROWS: run.bins.rows, EDGES: run.bins.pos}[how][b]
                acc[k].index_add_(0, index, g)
        return (None, *acc)


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
