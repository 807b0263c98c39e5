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
that needs no remote row.

G3's inter-layer pipeline (section 5.2), where the schedule marks the next
layer's halos `pipelined=true` (`schedule{pipeline=on}`; gnnc.plan.bins.
PipeChain): each bin of the sending layer is its own autograd node, and as it
ends its rows go through the chain of row-wise equations up to the next
layer's halos (the activation, the dropout, the next dense map: gnnc exchanges
that map's output, not the layer's) and are posted at once, one message per
peer that needs some of them (`_Sending`; gnnc.runtime.comm.BinPipe). The
receiving layer runs its bins that read held rows only first, then each bin as
soon as every (peer, peer's bin) message its sources come in has arrived
(`_run_eager`). Deviations from the paper: G3 packs *ready nodes* into a new
bin once their memory passes a threshold; gnnc's bins are cut before the run
(gnnc.plan.bins) and a bin runs when all of it is ready, so a bin with one late
source waits whole. When no bin is ready, the first waiting bin's next message
is waited for (no busy polling on a shared core). The chain's values are
computed per bin and concatenated, so the layers after take them instead of
computing them (`Exchange.ahead`).

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

import numpy as np
import torch
import torch.distributed as dist

from gnnc.errors import PlanError
from gnnc.ir.dims import eval_dim
from gnnc.plan.bins import EDGES, ROWS, SOURCES, WHOLE, Bins, bin_inputs, bins_of, pipelines, taken_as
from gnnc.plan.schedule_attrs import bin_eqn, exchange_schedule
from gnnc.runtime import comm
from gnnc.runtime.parts import PartStream


def run_binned(interp: Any, layer: Any, env: dict[str, Any], params: dict[str, torch.Tensor], ctx: Any) -> None:
    """Run `layer` (a binned graph layer) into `env`: whole equations first, then the bins (module docstring)."""
    bins = bins_of(ctx.comm.layer, layer, ctx.config)
    view = ctx.views.get(layer.edges)
    per_bin = [e for e in layer.eqns if bin_eqn(e)]
    made = {o.name for e in per_bin for o in e.outs}
    streams: list[PartStream] = []
    piped: dict[str, Any] = {}  # this layer's pipelined halos: their rows come bin by bin (`_Receiving`)
    ahead = getattr(ctx.comm, "ahead", {})
    for e in layer.eqns:
        if bin_eqn(e):
            continue
        name = e.outs[0].name
        if name in ahead:  # computed bin by bin by the previous graph layer (G3's inter-layer pipeline)
            got = ahead.pop(name)
            if isinstance(got, _Receiving):
                piped[name] = got
            elif got is not None:
                env[name] = got
            continue
        ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
        if exchange_schedule(e).split:  # (a halo: the only split a binned layer holds, gnnc.plan.schedule_attrs)
            env[name] = ctx.comm.start_parts(e, ins[0])
            streams.append(env[name])
        else:
            env[name] = interp.eqn(e, [x.whole() if isinstance(x, PartStream) else x for x in ins], view, ctx)
    outputs = [v.name for v in layer.outputs if v.name in made]
    if not outputs:
        return
    uses = [(v.name, how) for v, how in bin_inputs(layer)]
    sender = _Sending.start(interp, layer, bins, params, ctx)
    runs: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []

    def run(order: list[int], sources_held: bool) -> None:
        if sender is None:
            runs.append((order, _apply(interp, per_bin, outputs, uses, env, params, ctx, bins, order, sources_held)))
            return
        for b in order:  # one autograd node per bin, so that each bin's rows leave as it ends
            out = _apply(interp, per_bin, outputs, uses, env, params, ctx, bins, [b], sources_held)
            sender.post(b, out)
            runs.append(([b], out))

    if piped:
        _run_eager(interp, per_bin, outputs, uses, env, params, ctx, bins, piped, runs, sender)
    else:
        held = [b for b in range(len(bins)) if bins.held[b]] if streams else []
        rest = [b for b in range(len(bins)) if b not in held]
        if held:  # eager: these read held rows only, while the halo is in flight
            run(held, True)
        if rest:
            if streams:
                _arrived(streams)
            run(rest, False)
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
    if piped:
        # the pipeline's backward (its gradients waited for, then this rank's bins') must run on every worker,
        # whatever rows of it the loss reads
        env[outputs[0]] = _Join.apply(env[outputs[0]], next(iter(piped.values())).halos.token)
    if sender is not None:
        sender.finish(env, [b for order, _ in runs for b in order], back)


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



# --- G3's inter-layer pipeline (section 5.2): a bin's rows sent as it ends, the next layer's bins run as they arrive


@dataclass
class _Receiving:
    """A pipelined halo of the next graph layer, as its sender left it: the messages (`halos`, shared by every
    halo of the layer), this halo's place among their columns and the value whose held rows it extends."""

    halos: comm.PipedHalos
    index: int
    source: str


class _Sending:
    """The sender's half of a pipeline (gnnc.plan.bins.PipeChain): after each bin, the chain's equations on the
    bin's rows, and the rows of the next layer's halos posted to the peers that need them."""

    def __init__(self, interp: Any, chain: Any, layer: Any, bins: Bins, params: dict[str, torch.Tensor], ctx: Any):
        self.interp, self.chain, self.layer, self.bins, self.params, self.ctx = interp, chain, layer, bins, params, ctx
        program = interp.program
        by_name = {lay.name: lay for lay in program.layers}
        self.eqns = [by_name[name].eqns[k] for name, k in chain.eqns]
        self.receiver = by_name[chain.receiver]
        halos = [self.receiver.eqns[k] for k in chain.halos]
        self.sources = [e.ins[0].name for e in halos]
        self.halo_outs = [e.outs[0].name for e in halos]
        inside = {(name, k) for name, k in chain.eqns}
        read = {v.name for lay in program.layers for k, e in enumerate(lay.eqns) if (lay.name, k) not in inside
                and e.op != "halo" for v in e.ins}
        read |= {program.logits.name, program.loss.name} | set(self.sources)
        self.kept = [e.outs[0].name for e in self.eqns if e.outs[0].name in read]
        self.per_bin: dict[int, dict[str, torch.Tensor]] = {}
        recv_lg = ctx.comm.lg.layers[chain.receiver]
        sel, recv_pos = _send_layout(ctx.comm.layer, recv_lg, bins, chain.sender)
        widths = [tuple(int(eval_dim(d, ctx.config)) for d in e.ins[0].type.shape) for e in halos]
        device = ctx.vertex_ids.device
        op = comm.BinPipe(sel, recv_pos, widths, [e.outs[0].name.split(".")[0] for e in halos], ctx.comm.stats,
                          None, ctx.comm.dtype, device)
        self.halos = comm.PipedHalos(op)

    @staticmethod
    def start(interp: Any, layer: Any, bins: Bins, params: dict[str, torch.Tensor], ctx: Any) -> "_Sending | None":
        """The pipeline `layer`'s bins feed, posting its receives; None when its next layer's halos are not
        pipelined (gnnc.plan.bins.pipelines)."""
        if getattr(ctx.comm, "ahead", None) is None:
            return None
        if ctx.comm.pipes is None:
            ctx.comm.pipes = pipelines(interp.program)
        chain = ctx.comm.pipes.get(layer.name)
        if chain is None:
            return None
        if dist.get_backend() != "gloo":
            raise PlanError("G3's inter-layer pipeline (halo pipelined=true) runs on gloo only: its messages are "
                            "tagged point-to-point sends, which NCCL would need batched")
        return _Sending(interp, chain, layer, bins, params, ctx)

    def post(self, b: int, out: tuple[torch.Tensor, ...]) -> None:
        """Bin b has ended (`out`: its rows of the layer's outputs): run the chain on them and post the halos' rows."""
        rows = self.bins.rows[b]
        local: dict[str, Any] = {v.name: x for v, x in zip([v for v in self.layer.outputs if v.name in
                                                             _made(self.layer)], out)}
        ctx = dataclasses.replace(self.ctx, vertex_ids=self.ctx.vertex_ids[rows])
        for e in self.eqns:
            ins = [local[v.name] if v.name in local else self.params[v.name] for v in e.ins]
            local[e.outs[0].name] = self.interp.compute(e, ins, None, ctx)
        self.halos.post(b, [local[name] for name in self.sources])
        self.per_bin[b] = {name: local[name] for name in self.kept}

    def finish(self, env: dict[str, Any], order: list[int], back: torch.Tensor) -> None:
        """After the last bin: the chain's values the rest of the program reads, whole (`ctx.comm.ahead`: the
        interpreter takes them instead of computing them), and the receiver's halos as messages."""
        self.halos.close()
        ahead = self.ctx.comm.ahead
        for e in self.eqns:
            ahead[e.outs[0].name] = None
        for name in self.kept:
            parts = [self.per_bin[b][name] for b in order]
            ahead[name] = parts[0] if parts[0].dim() == 0 else torch.cat(parts).index_select(0, back)
        for k, (out, source) in enumerate(zip(self.halo_outs, self.sources)):
            ahead[out] = _Receiving(self.halos, k, source)
        self.per_bin = {}


def _made(layer: Any) -> set[str]:
    return {o.name for e in layer.eqns if bin_eqn(e) for o in e.outs}


def _send_layout(send_lg: Any, recv_lg: Any, bins: Bins, sender: str) -> tuple[list[list[torch.Tensor]],
                                                                               list[list[torch.Tensor]]]:
    """Which rows each (bin, peer) message carries: sel[b][p], positions in bin b of the rows peer p receives
    (in the order p holds them); and recv_pos[s][b], the positions in peer s's block of the rows its bin b
    carries (each rank's bins are cut from its own structure: the peers swap the bin of every row they send,
    once)."""
    key = ("pipe", sender, len(bins))
    if key in recv_lg._cache:
        return recv_lg._cache[key]
    halo, n_in = recv_lg.halo, recv_lg.n_in
    if n_in > send_lg.n_out or not torch.equal(recv_lg.ids[:n_in], send_lg.ids[:n_in]):
        raise PlanError(f"a pipelined halo's held rows are not the first output rows of layer {sender}")
    bin_of = torch.empty(send_lg.n_out, dtype=torch.int64)
    pos_in = torch.empty(send_lg.n_out, dtype=torch.int64)
    for b, rows in enumerate(bins.rows):
        bin_of[rows] = b
        pos_in[rows] = torch.arange(len(rows))
    world = len(halo.send_idx)
    mine = [bin_of[idx] for idx in halo.send_idx]
    sel = [[pos_in[idx[m == b]] for idx, m in zip(halo.send_idx, mine)] for b in range(len(bins))]
    theirs = comm.swap_bin_ids(mine, halo.recv_counts)
    recv_pos = [[torch.nonzero(theirs[s] == b).flatten() for b in range(len(bins))] for s in range(world)]
    recv_lg._cache[key] = (sel, recv_pos)
    return sel, recv_pos


@dataclass
class _RecvLayout:
    """Per bin of the receiving layer: the messages its sources arrive in (keys), its held sources, and where
    each of its sources sits in [held sources; those messages' rows, in that order]."""

    needs: list[list[tuple[int, int]]]
    held_src: list[torch.Tensor]
    compact: list[torch.Tensor]


def _recv_layout(lg: Any, bins: Bins, op: comm.BinPipe) -> _RecvLayout:
    key = ("pipe-recv", len(bins), len(op.recv_pos[0]) if op.recv_pos else 0)
    if key in lg._cache:
        return lg._cache[key]
    n_in = lg.n_in
    counts = [len(x) for x in lg.halo.send_idx]  # (only its length: the world)
    offs = np.concatenate([[0], np.cumsum(lg.halo.recv_counts)])
    world = len(counts)
    sender_bin = [np.zeros(int(lg.halo.recv_counts[s]), dtype=np.int64) for s in range(world)]
    msg_pos = [np.zeros(int(lg.halo.recv_counts[s]), dtype=np.int64) for s in range(world)]
    for s in range(world):
        for b, pos in enumerate(op.recv_pos[s]):
            sender_bin[s][pos.numpy()] = b
            msg_pos[s][pos.numpy()] = np.arange(len(pos))
    rank_of_key = {k: i for i, k in enumerate(op.keys)}
    out = _RecvLayout([], [], [])
    for c in range(len(bins)):
        src = bins.sources[c].numpy()
        held = src[src < n_in]
        h = src[src >= n_in] - n_in
        peer = np.searchsorted(offs, h, side="right") - 1
        k = h - offs[peer]
        sb = np.array([sender_bin[s][i] for s, i in zip(peer, k)], dtype=np.int64)
        mp = np.array([msg_pos[s][i] for s, i in zip(peer, k)], dtype=np.int64)
        keys = sorted({(int(s), int(b)) for s, b in zip(peer, sb)}, key=rank_of_key.__getitem__)
        base, at = {}, len(held)
        for key_ in keys:
            base[key_] = at
            at += len(op.recv_pos[key_[0]][key_[1]])
        compact = np.concatenate([np.arange(len(held)),
                                  np.array([base[(int(s), int(b))] + m for s, b, m in zip(peer, sb, mp)],
                                           dtype=np.int64)])
        out.needs.append(keys)
        out.held_src.append(torch.from_numpy(held.astype(np.int64)))
        out.compact.append(torch.from_numpy(compact.astype(np.int64)))
    lg._cache[key] = out
    return out


def _run_eager(interp: Any, eqns: list, outputs: list[str], uses: list[tuple[str, str]], env: dict[str, Any],
               params: dict[str, torch.Tensor], ctx: Any, bins: Bins, piped: dict[str, _Receiving],
               runs: list, sender: "_Sending | None") -> None:
    """G3's eager computation on pipelined halos: the bins that read held rows only first, then, as the peers'
    bins arrive, every bin whose messages are all in (ready bins in priority order; when none is ready, the
    first waiting bin's next message is waited for)."""
    halos = next(iter(piped.values())).halos
    op = halos.op
    lg = ctx.comm.layer
    layout = _recv_layout(lg, bins, op)
    held = {name: ctx.comm.wire(_dense(env[r.source])[: lg.n_in]) for name, r in piped.items()}
    got: dict[tuple[int, int], list[torch.Tensor]] = {}

    def run_bin(c: int) -> None:
        values = []
        for name, how in uses:
            if name in piped:
                parts = [held[name].index_select(0, layout.held_src[c])]
                parts += [got[key][piped[name].index] for key in layout.needs[c]]
                values.append(torch.cat(parts).index_select(0, layout.compact[c]))
            else:
                values.append(env[name] if name in env else params[name])
        one = Bins([bins.rows[c]], [bins.views[c]], [torch.arange(len(bins.sources[c]))], [bins.pos[c]],
                   [bins.held[c]])
        out = _Bins.apply(_BinRun(interp, eqns, outputs, uses, ctx, one, [0]), *values)
        if sender is not None:
            sender.post(c, out)
        runs.append(([c], out))

    pending = []
    for c in range(len(bins)):
        if layout.needs[c]:
            pending.append(c)
        else:
            run_bin(c)
    while pending:
        for key in op.keys:
            if key not in got and op.arrived(key):
                got[key] = halos.receive(key)
        ready = [c for c in pending if all(key in got for key in layout.needs[c])]
        if not ready:
            key = next(k for k in layout.needs[pending[0]] if k not in got)
            got[key] = halos.receive(key)
            continue
        for c in ready:
            run_bin(c)
            pending.remove(c)
    for key in op.keys:  # rows no bin reads still come (and their zero gradients go back)
        if key not in got:
            got[key] = halos.receive(key)
    op._timed("fwd", op.finish_forward)


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x.to_dense() if x.is_sparse else x

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
