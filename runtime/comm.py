"""Communication ops of gnnc's distributed executor, as autograd functions with dual backwards.

Why this module exists: the executor interprets a plan's ops with torch, and
the ops that move data between ranks must take part in autograd so that one
`loss.backward()` drives the distributed backward pass. Every op here is paired
with its dual, which autograd runs in the backward pass:

  halo exchange (fetch remote rows)       <->  send the row gradients back, summed at the owner
  vertex_to_feature (P3: rows -> columns) <->  feature_to_vertex
  all_gather along a dim                  <->  reduce_scatter along that dim
  broadcast_block (MG-GCN stage j)        <->  reduce of the gradient to rank j
  all_reduce_sum (batch_norm's statistics) <->  all_reduce_sum of the gradient
  pipe_send                               <->  pipe_recv

plus a bucketed all-reduce of replicated parameter gradients that can overlap
with the backward pass. Only `gnnc.runtime` touches torch.distributed.

Bytes: each op adds to a `CommStats` the *logical payload* this rank sends
to other ranks (what the op must carry, not what a ring algorithm relays; a
rank's data for itself is not counted), so the sum over ranks is the job's
traffic and can be compared exactly with the cost model:

  halo exchange  fwd: rows sent x F;            bwd: halo rows x F (gradients sent back)
  vertex_to_feature: own rows x other ranks' feature slices (feature_to_vertex: the mirror)
  all_gather:    own block x (world - 1);       reduce_scatter: the blocks of the other ranks
  broadcast_block: block x (world - 1) at the root; its backward: block at every other rank
  all-reduce of B elements, split into world chunks c_r as torch.tensor_split does:
                 (B - c_r) + (world - 1) c_r at rank r (reduce-scatter then all-gather);
                 over all ranks, 2 (world - 1) B, whatever the bucketing
  pipe_send:     the tensor;                    its backward: nothing (the receiver sends)
  pipe_recv:     nothing;                       its backward: the gradient

Times: `CommStats` also sums the seconds each op blocked the caller (posting
plus waiting), i.e. the communication time not hidden behind computation.

What gloo offers (measured, torch 2.13): all_to_all_single with uneven
splits works (the halo exchange's `all_to_all` method and the layout
transitions use it); the list form all_to_all and all_gather refuse blocks of
different sizes, so uneven all_gather/reduce_scatter pad every block to the
largest; isend/irecv are asynchronous, so the ring posts all its steps at
once. A collective waiting on a peer raises after the process group's timeout
("Timed out waiting 3000ms for recv operation") and one whose peer died
raises at once ("Connection closed by peer").

Ordering rule (gloo and NCCL both need it): every rank must run the same ops in
the same order, forward and backward; with the same program on every rank
autograd visits the dual ops in the same order everywhere. Rows exchanged
between ranks are grouped by rank (rank 0's block first) unless a plan says
otherwise; the executor permutes before and after.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gnnc.errors import PlanError
from gnnc.plan.halo import HaloPlan

Group = dist.ProcessGroup | None


# --- byte and time accounting ------------------------------------------------------------------


@dataclass
class OpCount:
    """Totals for one (label, op, direction)."""

    bytes: int = 0
    calls: int = 0
    seconds: float = 0.0


@dataclass
class CommStats:
    """Bytes and blocked time of the communication ops one rank ran; passed to every op.

    Keys are (label, op, direction): the label is the caller's (a layer name,
    "grads"), the op one of this module's names, the direction "fwd" or "bwd".
    """

    counts: dict[tuple[str, str, str], OpCount] = field(default_factory=dict)

    def _entry(self, label: str, op: str, direction: str) -> OpCount:
        return self.counts.setdefault((label, op, direction), OpCount())

    def add_bytes(self, label: str, op: str, direction: str, nbytes: int) -> None:
        entry = self._entry(label, op, direction)
        entry.bytes += int(nbytes)
        entry.calls += 1

    def add_time(self, label: str, op: str, direction: str, seconds: float) -> None:
        self._entry(label, op, direction).seconds += seconds

    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.counts.values())

    def total_seconds(self, op: str | None = None) -> float:
        return sum(c.seconds for (_, o, _), c in self.counts.items() if op is None or o == op)

    def bytes_by(self, part: str = "op") -> dict[str, int]:
        """Bytes summed by 'label', 'op' or 'direction'."""
        index = {"label": 0, "op": 1, "direction": 2}[part]
        out: dict[str, int] = {}
        for key, c in self.counts.items():
            out[key[index]] = out.get(key[index], 0) + c.bytes
        return out

    def as_dict(self) -> dict[str, dict[str, float]]:
        """JSON-ready: {"label/op/direction": {"bytes", "calls", "seconds"}}, keys sorted."""
        return {"/".join(k): {"bytes": c.bytes, "calls": c.calls, "seconds": c.seconds}
                for k, c in sorted(self.counts.items())}

    def reset(self) -> None:
        self.counts.clear()


def _nbytes(numel: int, dtype: torch.dtype) -> int:
    return int(numel) * torch.empty((), dtype=dtype).element_size()


def collective_device(group: Group = None) -> torch.device:
    """Where a tensor handed to a collective of `group` must live: this rank's GPU under NCCL, else the host."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_world(group: Group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group: Group, rank: int) -> int:
    """The global rank of `rank` in `group` (point-to-point calls take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _all_gather_flat(out: Tensor, inp: Tensor, group: Group) -> Any:
    # torch 2.13 renamed all_gather_into_tensor (now deprecated); older releases lack the new name.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=True)


def _reduce_scatter_flat(out: Tensor, inp: Tensor, group: Group) -> Any:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, op=dist.ReduceOp.SUM, group=group, async_op=True)


def _wait_all(works: Iterable[Any]) -> None:
    for w in works:
        if w is not None:
            w.wait()


# --- autograd plumbing shared by every op ------------------------------------------------------


class _Op:
    """A communication op split into start and finish halves, for forward and for backward.

    Splitting lets a caller post an exchange, compute meanwhile, then wait
    (`CommHandle`); in the backward pass autograd runs other nodes between
    `backward_start` (in `_Finish.backward`) and `backward_finish` (in
    `_Start.backward`), which overlaps the dual op with the rest of backward.
    """

    name = "op"

    def __init__(self, stats: CommStats, label: str, group: Group):
        self.stats = stats
        self.label = label
        self.group = group
        self.rank, self.world = _rank_world(group)

    def forward_start(self, x: Tensor) -> None:
        raise NotImplementedError

    def forward_finish(self) -> Tensor:
        raise NotImplementedError

    def backward_start(self, grad: Tensor) -> None:
        raise NotImplementedError

    def backward_finish(self) -> Tensor | None:
        raise NotImplementedError

    def _timed(self, direction: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.stats.add_time(self.label, self.name, direction, time.perf_counter() - t0)

    def _count(self, direction: str, nbytes: int) -> None:
        self.stats.add_bytes(self.label, self.name, direction, nbytes)


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, op: _Op) -> Tensor:
        ctx.op = op
        op._timed("fwd", op.forward_start, x)
        # An empty token carries the autograd edge from x to the finish half.
        return x.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _grad_token: Tensor) -> tuple[Tensor | None, None]:
        op: _Op = ctx.op
        return op._timed("bwd", op.backward_finish), None


class _Finish(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, token: Tensor, op: _Op) -> Tensor:
        ctx.op = op
        ctx.token_meta = (token.dtype, token.device)
        return op._timed("fwd", op.forward_finish)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        op: _Op = ctx.op
        op._timed("bwd", op.backward_start, grad.contiguous())
        dtype, device = ctx.token_meta
        return torch.zeros(0, dtype=dtype, device=device), None


class CommHandle:
    """An op in flight; `wait()` returns its result (once) and links it into autograd."""

    def __init__(self, op: _Op, token: Tensor):
        self._op: _Op | None = op
        self._token = token

    def wait(self) -> Tensor:
        if self._op is None:
            raise RuntimeError("CommHandle.wait() called twice")
        op, self._op = self._op, None
        return _Finish.apply(self._token, op)


def _start(op: _Op, x: Tensor) -> CommHandle:
    return CommHandle(op, _Start.apply(x, op))


def _run(op: _Op, x: Tensor) -> Tensor:
    return _start(op, x).wait()


# --- halo exchange -----------------------------------------------------------------------------


def check_halo_plan(plan: HaloPlan, n_local: int, group: Group = None) -> None:
    """Check a halo plan against the peers' plans (a collective: every rank calls it).

    Call it once before the first exchange: besides catching bad plans, it is
    a collective over the whole group, which NCCL wants before batched p2p.

    Raises PlanError when sizes disagree with the world, an index is out of
    range, a rank sends to itself, or a receive count differs from the
    peer's send count (which would otherwise hang or corrupt the exchange).
    """
    rank, world = _rank_world(group)
    if len(plan.send_idx) != world or len(plan.recv_counts) != world:
        raise PlanError(f"rank {rank}: halo plan has {len(plan.send_idx)} send lists and "
                        f"{len(plan.recv_counts)} receive counts for a world of {world}")
    if plan.send_counts[rank] or plan.recv_counts[rank]:
        raise PlanError(f"rank {rank}: halo plan sends rows to itself")
    for p, idx in enumerate(plan.send_idx):
        if idx.dtype != torch.int64 or idx.dim() != 1:
            raise PlanError(f"rank {rank}: send list for rank {p} must be a 1-D int64 tensor")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n_local):
            raise PlanError(f"rank {rank}: send list for rank {p} indexes outside its {n_local} rows")
    device = collective_device(group)
    sent = torch.tensor(plan.send_counts, dtype=torch.int64, device=device)
    told = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_to_all_single(told, sent, group=group)  # told[p] = rows p will send here
    told = told.cpu()
    expected = torch.tensor(plan.recv_counts, dtype=torch.int64)
    if not torch.equal(told, expected):
        bad = [p for p in range(world) if int(told[p]) != int(expected[p])]
        raise PlanError(f"rank {rank}: halo plan expects {[int(expected[p]) for p in bad]} rows from "
                        f"ranks {bad}, which send {[int(told[p]) for p in bad]}")


HALO_METHODS = ("ring", "ring_paced", "all_to_all")


def ring_schedule(rank: int, world: int) -> list[tuple[int, int]]:
    """NeutronStar's ring order: at step j, send to (rank+j+1) mod m, receive from (rank-j-1) mod m."""
    return [((rank + j + 1) % world, (rank - j - 1) % world) for j in range(world - 1)]


class _HaloExchange(_Op):
    name = "halo"

    def __init__(self, plan: HaloPlan, stats: CommStats, label: str, group: Group, method: str,
                 into: Tensor | None = None):
        super().__init__(stats, label, group)
        if method not in HALO_METHODS:
            raise ValueError(f"halo exchange method must be one of {HALO_METHODS}, not {method!r}")
        self.plan = plan
        self.method = method
        self.into = into  # where the received rows go ([n_halo, ...]), else a new buffer
        self.works: list[Any] = []
        self.keep: list[Tensor] = []  # send buffers must live until their sends complete
        self.recv_works: dict[int, Any] = {}  # the ring's receive from each peer (a chunk is waited alone)
        self.grads: dict[int, Tensor] = {}  # a chunked exchange's backward: the row gradients of each peer's chunk
        self.grads_sent: set[int] = set()

    def _exchange(self, send: list[Tensor], recv: list[Tensor], joined: Tensor | None = None) -> None:
        """Post sends of send[p] to p and receives of recv[p] from p (one entry per rank); `joined`: the buffer
        whose consecutive rows the recv[p] are (forward_start's), which all_to_all receives into."""
        if self.method == "all_to_all":
            flat_in = torch.cat(send)
            rows = sum(r.shape[0] for r in recv)
            self._a2a_out = joined if joined is not None else flat_in.new_empty((rows, *flat_in.shape[1:]))
            self.keep = [flat_in]
            self.works = [dist.all_to_all_single(
                self._a2a_out, flat_in, output_split_sizes=[r.shape[0] for r in recv],
                input_split_sizes=[s.shape[0] for s in send], group=self.group, async_op=True)]
            return
        self.keep = send
        steps = []
        for dst, src in ring_schedule(self.rank, self.world):
            ops = []
            # Each step's receive is posted before its send: over gloo, with the send posted first, two
            # ranks that post a few ms apart moved their blocks almost one after the other instead of both
            # ways at once (emulated cluster, 2 hosts at 1.2 Gb/s, 6.7 MB each way, the second rank 3 ms
            # late: 85 ms send-first, 50 ms receive-first; 47 ms either way when they post together).
            if recv[src].shape[0]:  # empty chunks are not sent; the peer expects none
                ops.append(dist.P2POp(dist.irecv, recv[src], _global(self.group, src), self.group))
            if send[dst].shape[0]:
                ops.append(dist.P2POp(dist.isend, send[dst], _global(self.group, dst), self.group))
            steps.append(ops)
        if self.method == "ring_paced":
            # One step at a time: no rank has two chunks in flight, at the
            # price of no overlap (the exchange completes inside start).
            for ops in steps:
                _wait_all(self._post_p2p(ops))
            self.works = []
        else:
            # every step's receive before any send, for the reason above
            ops = [op for ops in steps for op in ops]
            recvs = [op for op in ops if op.op is dist.irecv]
            self.works = self._post_p2p(recvs + [op for op in ops if op.op is dist.isend])
            peers = [src for _, src in ring_schedule(self.rank, self.world) if recv[src].shape[0]]
            self.recv_works = dict(zip(peers, self.works[:len(recvs)]))

    def _post_p2p(self, ops: list[Any]) -> list[Any]:
        if not ops:
            return []
        if dist.get_backend(self.group) == "nccl":
            # NCCL runs p2p calls one after another on a stream, so a ring of
            # plain isends would wait on each other; a batch posts them together.
            return list(dist.batch_isend_irecv(ops))
        # gloo's isend/irecv are truly asynchronous: post them in ring order.
        return [op.op(op.tensor, op.peer, op.group) for op in ops]

    def _received(self, recv: list[Tensor]) -> list[Tensor]:
        _wait_all(self.works)
        self.works, self.keep, self.recv_works = [], [], {}
        if self.method == "all_to_all":
            out, self._a2a_out = self._a2a_out, None  # held by what it is split into only, not until backward
            return list(torch.split(out, [r.shape[0] for r in recv]))
        return recv

    def _received_from(self, peer: int, recv: list[Tensor], last: bool) -> Tensor:
        """Peer's rows once its receive alone has completed (the ring's chunks; another method completes
        all at once); `last`: the exchange's last chunk, after which its sends are waited for too."""
        if last or self.method != "ring":
            return self._received(recv)[peer]
        work = self.recv_works.pop(peer, None)
        if work is not None:
            work.wait()
            # waited once only: a gloo receive waited for again waits for another message (and times out)
            self.works = [w for w in self.works if w is not work]
        return recv[peer]

    def forward_start(self, x: Tensor) -> None:
        width = tuple(x.shape[1:])
        self.meta = (x.shape[0], width, x.dtype, x.device)
        self.row_numel = int(torch.Size(width).numel())
        send = [x.index_select(0, idx.to(x.device)).contiguous() for idx in self.plan.send_idx]
        # every peer's rows received in place into one buffer, in peer order: the exchange's result as it is, not
        # joined by a copy (two [halo, width] at once: 0.9 GiB of a GCN rank's hidden layer at products' size,
        # issue 35)
        self.recv_rows = x.new_empty((self.plan.n_halo, *width)) if self.into is None else self.into
        self.into = None
        self.recv = list(torch.split(self.recv_rows, list(self.plan.recv_counts)))
        self._count("fwd", _nbytes(sum(self.plan.send_counts) * self.row_numel, x.dtype))
        self._exchange(send, self.recv, self.recv_rows)

    def forward_finish(self) -> Tensor:
        self._received(self.recv)
        out = self.recv_rows
        self.recv, self.recv_rows = [], None
        return out

    def backward_start(self, grad: Tensor) -> None:
        send = list(torch.split(grad, list(self.plan.recv_counts)))
        send = [s.contiguous() for s in send]
        width = tuple(grad.shape[1:])
        self.grad_recv = [grad.new_empty((c, *width)) for c in self.plan.send_counts]
        self._count("bwd", _nbytes(self.plan.n_halo * self.row_numel, grad.dtype))
        self._exchange(send, self.grad_recv)

    # --- chunked: each peer's rows a value of their own (NeutronStar's chunks, in ring order) ---------------

    def forward_chunk(self, peer: int, last: bool) -> Tensor:
        """Forward: the rows from `peer`, waited for alone (`last`: every receive and send of the exchange)."""
        out = self._received_from(peer, self.recv, last)
        if last:
            self.recv = []
        return out

    def backward_chunk(self, peer: int, grad: Tensor) -> None:
        """Backward of `peer`'s chunk: under the ring, its gradients go back to `peer` at once (every
        receive of the exchange's gradients posted with the first chunk's), so a chunk's message is in flight
        while backward computes the others; another method sends them together with the last chunk's."""
        self.grads[peer] = grad
        if self.method != "ring":
            if len(self.grads) == self.world - 1:
                self._backward_post_rest()
            return
        if not self.grads_sent:
            width, dtype = tuple(grad.shape[1:]), grad.dtype
            self.grad_recv = [grad.new_empty((c, *width)) for c in self.plan.send_counts]
            self._count("bwd", _nbytes(self.plan.n_halo * self.row_numel, dtype))
            recvs = [dist.P2POp(dist.irecv, self.grad_recv[src], _global(self.group, src), self.group)
                     for _, src in ring_schedule(self.rank, self.world) if self.grad_recv[src].shape[0]]
            self.works = self._post_p2p(recvs)
        self.grads_sent.add(peer)
        if grad.shape[0]:
            self.keep.append(grad)
            self.works += self._post_p2p([dist.P2POp(dist.isend, grad, _global(self.group, peer), self.group)])

    def _backward_post_rest(self) -> None:
        """Send the gradients of every chunk not sent yet: zeros for one whose rows nothing read (autograd
        never reached it), so that its peer's receive completes."""
        n_local, width, dtype, device = self.meta
        if self.method != "ring":
            grads = [self.grads.get(p, torch.zeros((c, *width), dtype=dtype, device=device))
                     for p, c in enumerate(self.plan.recv_counts)]
            self.backward_start(torch.cat(grads))
            self.grads_sent = set(range(self.world)) - {self.rank}
            return
        for _, src in ring_schedule(self.rank, self.world):
            if src not in self.grads_sent:
                zero = torch.zeros((self.plan.recv_counts[src], *width), dtype=dtype, device=device)
                self.backward_chunk(src, self.grads.get(src, zero))

    def backward_finish(self) -> Tensor:
        if self.grads or self.grads_sent:  # a chunked exchange
            if len(self.grads_sent) < self.world - 1:
                self._backward_post_rest()
            self.grads, self.grads_sent = {}, set()
        parts = self._received(self.grad_recv)
        self.grad_recv = []
        n_local, width, dtype, device = self.meta
        grad_x = torch.zeros((n_local, *width), dtype=dtype, device=device)
        # Mirror gradients summed at the owner, peers in a fixed order so the
        # sum is deterministic.
        for p, part in enumerate(parts):
            if part.shape[0]:
                grad_x.index_add_(0, self.plan.send_idx[p].to(device), part)
        return grad_x


def halo_exchange(x: Tensor, plan: HaloPlan, stats: CommStats, *, label: str = "halo",
                  method: str = "ring", group: Group = None, into: Tensor | None = None) -> Tensor:
    """Fetch the remote rows this rank needs: [plan.n_halo, *x.shape[1:]], ordered by (peer, position).

    `method="ring"` posts every isend/irecv at once, in NeutronStar's ring
    order (step j: to rank+j+1, from rank-j-1), so the caller can overlap;
    `"ring_paced"` waits for each step before the next, so each rank has one
    chunk in flight, as NeutronStar schedules them, but nothing overlaps;
    `"all_to_all"` uses one all_to_all_single with uneven splits (gloo and
    NCCL both support it). Backward sends the gradients of the received rows
    back the same way and sums them into the owner's rows (index_add). `into`: a [plan.n_halo, ...] buffer the
    rows are received in (and returned), for a caller that wants them beside others without a copy; without
    autograd only (its backward would not know the buffer's other rows).
    """
    if into is not None and torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("halo_exchange(into=...) receives into a caller's buffer: without autograd only")
    return _run(_HaloExchange(plan, stats, label, group, method, into), x)


def start_halo_exchange(x: Tensor, plan: HaloPlan, stats: CommStats, *, label: str = "halo",
                        method: str = "ring", group: Group = None) -> CommHandle:
    """Post a halo exchange and return at once; compute local work, then `handle.wait()`."""
    return _start(_HaloExchange(plan, stats, label, group, method), x)


class _FinishChunk(torch.autograd.Function):
    """One peer's rows of a chunked halo exchange; backward sends their gradients back (`backward_chunk`)."""

    @staticmethod
    def forward(ctx: Any, token: Tensor, op: _HaloExchange, peer: int, last: bool) -> Tensor:
        ctx.op, ctx.peer = op, peer
        ctx.token_meta = (token.dtype, token.device)
        return op._timed("fwd", op.forward_chunk, peer, last)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        op: _HaloExchange = ctx.op
        op._timed("bwd", op.backward_chunk, ctx.peer, grad.contiguous())
        dtype, device = ctx.token_meta
        return torch.zeros(0, dtype=dtype, device=device), None, None, None


class ChunkedHalo:
    """A halo exchange in flight whose rows are waited for peer by peer (NeutronStar's chunks, section 4.3).

    `peers` is the order the chunks come in: the ring's (step j receives from rank-j-1), every other rank
    once, those that send nothing included (an empty chunk), so that every rank builds the same autograd
    graph and runs the exchange's backward messages in the same order. `chunks()` yields each peer's rows
    [recv_counts[peer], ...] as its receive completes (the last one also waits for this rank's sends).
    In backward each chunk's gradients go back to its peer as soon as autograd has them.
    """

    def __init__(self, op: _HaloExchange, token: Tensor):
        self._op, self._token = op, token
        self.peers = [src for _, src in ring_schedule(op.rank, op.world)]

    def chunks(self) -> Iterator[Tensor]:
        for k, peer in enumerate(self.peers):
            yield _FinishChunk.apply(self._token, self._op, peer, k == len(self.peers) - 1)


def start_chunked_halo_exchange(x: Tensor, plan: HaloPlan, stats: CommStats, *, label: str = "halo",
                                method: str = "ring", group: Group = None) -> ChunkedHalo:
    """Post a halo exchange whose rows are taken peer by peer, in ring order, as each peer's arrive
    (`ChunkedHalo`); the rows are those of `halo_exchange`, its chunk from peer p at offset
    plan.recv_offsets()[p]."""
    op = _HaloExchange(plan, stats, label, group, method)
    return ChunkedHalo(op, _Start.apply(x, op))


# --- G3's inter-layer pipeline: a halo's rows posted bin by bin ------------------------------------------------

PIPE_TAG = 1 << 20  # p2p tags of a pipeline's messages: PIPE_TAG + bin forward, + BINS_TAGS + bin backward
BINS_TAGS = 1 << 13


class BinPipe(_Op):
    """The halos of a graph layer whose rows the previous layer's bins post as each bin ends (G3 section 5.2).

    Sender half: `post(b, values)` sends bin b's rows of each halo input (`values`, one tensor per halo, the
    bin's rows) to every peer that needs some, as one message per peer (the halos' columns side by side);
    `sel[b][p]` are those rows' positions in the bin, in the order the peer holds them. Receiver half: one
    message per (peer, that peer's bin), every receive posted when the pipeline starts; `arrived(key)` says
    whether one is in, `take(key)` waits for it. `recv_pos[s][b]` are the positions in peer s's block of the
    rows its bin b carries. Backward is the dual: each received message's gradients go back to its sender as
    soon as autograd has them (`_BinRecv`), and a bin's gradients are waited for once every message of this
    rank has sent its own (`_BinJoin`), then summed into the bin's rows (`_BinPost`).

    Bytes and blocked time are counted as the halo exchange counts them (op "halo", per halo's label): the same
    rows move, in more messages.
    """

    name = "halo"

    def __init__(self, sel: list[list[Tensor]], recv_pos: list[list[Tensor]], widths: list[tuple[int, ...]],
                 labels: list[str], stats: CommStats, group: Group, dtype: torch.dtype, device: torch.device):
        super().__init__(stats, labels[0], group)
        self.sel, self.recv_pos, self.widths, self.labels = sel, recv_pos, widths, labels
        self.numels = [int(torch.Size(w).numel()) for w in widths]
        self.dtype, self.device = dtype, device
        self.keys = [(s, b) for _, s in ring_schedule(self.rank, self.world)
                     for b in range(len(recv_pos[s])) if len(recv_pos[s][b])]
        self.sent_rows = [sum(len(sel[b][p]) for b in range(len(sel))) for p in range(self.world)]
        self.recv_rows = sum(len(pos) for per in recv_pos for pos in per)
        self.bufs = {k: torch.empty((len(recv_pos[k[0]][k[1]]), sum(self.numels)), dtype=dtype, device=device)
                     for k in self.keys}
        self.recv_works = self._timed("fwd", self._post_all, "recv", self.bufs, PIPE_TAG)
        self.send_works: list[Any] = []
        self.keep: list[Tensor] = []
        self.grads_sent: set[tuple[int, int]] = set()
        self.grad_bufs: dict[tuple[int, int], Tensor] = {}
        self.grad_works: dict[tuple[int, int], Any] = {}
        self.bwd_works: list[Any] = []
        for label, n in zip(labels, self.numels):
            self.stats.add_bytes(label, self.name, "fwd", _nbytes(sum(self.sent_rows) * n, dtype))

    def _post_all(self, kind: str, bufs: dict[tuple[int, int], Tensor], tag: int) -> dict[tuple[int, int], Any]:
        fn = dist.irecv if kind == "recv" else dist.isend
        return {(p, b): fn(t, _global(self.group, p), self.group, tag + b) for (p, b), t in bufs.items()}

    # forward, sender
    def post(self, b: int, values: Sequence[Tensor]) -> None:
        """Send bin b's rows of every halo input to the peers that need them."""
        flat = torch.cat([v.detach().reshape(v.shape[0], -1).to(self.dtype) for v in values], dim=1) \
            if values else None
        for _, p in ring_schedule(self.rank, self.world):
            if flat is None or not len(self.sel[b][p]):
                continue
            msg = flat.index_select(0, self.sel[b][p]).contiguous()
            self.keep.append(msg)
            self.send_works.append(dist.isend(msg, _global(self.group, p), self.group, PIPE_TAG + b))

    # forward, receiver
    def arrived(self, key: tuple[int, int]) -> bool:
        work = self.recv_works.get(key)
        return work is None or work.is_completed()

    def take(self, key: tuple[int, int]) -> Tensor:
        work = self.recv_works.pop(key, None)
        if work is not None:
            work.wait()
        return self.bufs.pop(key)

    def finish_forward(self) -> None:
        """Every message received; wait for this rank's sends too (their buffers are then free)."""
        _wait_all(self.recv_works.values())
        _wait_all(self.send_works)
        self.recv_works, self.send_works, self.keep = {}, [], []

    # backward
    def _post_grad_receives(self) -> None:
        want = {(p, b): torch.empty((len(self.sel[b][p]), sum(self.numels)), dtype=self.dtype, device=self.device)
                for b in range(len(self.sel)) for _, p in ring_schedule(self.rank, self.world) if len(self.sel[b][p])}
        self.grad_bufs = want
        self.grad_works = self._post_all("recv", want, PIPE_TAG + BINS_TAGS)
        for label, n in zip(self.labels, self.numels):
            self.stats.add_bytes(label, self.name, "bwd", _nbytes(self.recv_rows * n, self.dtype))

    def send_grad(self, key: tuple[int, int], grad: Tensor) -> None:
        """The gradients of message `key`'s rows, back to its sender at once."""
        if not self.grad_works and not self.grads_sent:
            self._post_grad_receives()
        self.grads_sent.add(key)
        grad = grad.to(self.dtype).contiguous()
        self.keep.append(grad)
        self.bwd_works.append(dist.isend(grad, _global(self.group, key[0]), self.group, PIPE_TAG + BINS_TAGS + key[1]))

    def finish_backward(self) -> None:
        """Send zeros for the messages autograd never reached (their peer waits for them), then wait for every
        gradient of this rank's bins."""
        if not self.grad_works and not self.grads_sent:
            self._post_grad_receives()
        for key in self.keys:
            if key not in self.grads_sent:
                self.send_grad(key, torch.zeros((len(self.recv_pos[key[0]][key[1]]), sum(self.numels)),
                                                dtype=self.dtype, device=self.device))
        _wait_all(self.grad_works.values())
        _wait_all(self.bwd_works)
        self.grad_works, self.bwd_works, self.keep, self.grads_sent = {}, [], [], set()

    def bin_grads(self, b: int, rows: int) -> list[Tensor]:
        """Bin b's gradients of each halo input: what every peer sent back for the rows it got, summed."""
        total = torch.zeros((rows, sum(self.numels)), dtype=self.dtype, device=self.device)
        for _, p in ring_schedule(self.rank, self.world):
            got = self.grad_bufs.pop((p, b), None)
            if got is not None and got.shape[0]:
                total.index_add_(0, self.sel[b][p], got)
        return [t.reshape(rows, *w) for t, w in zip(torch.split(total, self.numels, dim=1), self.widths)]


def swap_bin_ids(mine: Sequence[Tensor], counts: Sequence[int], group: Group = None) -> list[Tensor]:
    """Send mine[p] (an int64 per row this rank sends p) to each peer p; return, per peer s, what s sent here
    (`counts[s]` of them). Once per pipeline, before its first message: not counted as the run's traffic."""
    rank, world = _rank_world(group)
    theirs = [torch.empty(int(counts[s]), dtype=torch.int64) for s in range(world)]
    works = [dist.irecv(theirs[s], _global(group, s), group, PIPE_TAG - 1) for s in range(world)
             if s != rank and counts[s]]
    works += [dist.isend(mine[p].contiguous(), _global(group, p), group, PIPE_TAG - 1) for p in range(world)
              if p != rank and len(mine[p])]
    _wait_all(works)
    return theirs

class _BinPost(torch.autograd.Function):
    """Forward: post bin b's rows (BinPipe.post); a token. Backward: the bin's gradients the peers sent back."""

    @staticmethod
    def forward(ctx: Any, op: BinPipe, b: int, *values: Tensor) -> Tensor:
        ctx.op, ctx.b = op, b
        ctx.meta = [(v.shape[0], v.dtype) for v in values]
        op._timed("fwd", op.post, b, values)
        return torch.empty(0, dtype=op.dtype, device=op.device)

    @staticmethod
    def backward(ctx: Any, _grad: Tensor) -> tuple[Any, ...]:
        op: BinPipe = ctx.op
        rows = ctx.meta[0][0] if ctx.meta else 0
        grads = op.bin_grads(ctx.b, rows)
        return (None, None, *(g.to(dtype) for g, (_, dtype) in zip(grads, ctx.meta)))


class _BinJoin(torch.autograd.Function):
    """Every bin's token in one: its backward runs once every message's gradients have been sent (this rank's
    receive nodes all read it), and waits for the gradients of this rank's own bins."""

    @staticmethod
    def forward(ctx: Any, op: BinPipe, *tokens: Tensor) -> Tensor:
        ctx.op, ctx.count = op, len(tokens)
        return torch.empty(0, dtype=op.dtype, device=op.device)

    @staticmethod
    def backward(ctx: Any, _grad: Tensor) -> tuple[Any, ...]:
        op: BinPipe = ctx.op
        op._timed("bwd", op.finish_backward)
        return (None, *(torch.empty(0, dtype=op.dtype, device=op.device) for _ in range(ctx.count)))


class _BinRecv(torch.autograd.Function):
    """One received message (a peer's bin); backward sends its gradients back to that peer at once."""

    @staticmethod
    def forward(ctx: Any, token: Tensor, op: BinPipe, key: tuple[int, int]) -> Tensor:
        ctx.op, ctx.key = op, key
        return op._timed("fwd", op.take, key)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        op: BinPipe = ctx.op
        op._timed("bwd", op.send_grad, ctx.key, grad)
        return torch.empty(0, dtype=op.dtype, device=op.device), None, None


class PipedHalos:
    """A BinPipe as both its halves use it: `post` each bin of the sender, `close` after the last (the token
    the receiver's messages hang from), then `receive(key)`: message `key`'s rows of each halo."""

    def __init__(self, op: BinPipe):
        self.op = op
        self.tokens: list[Tensor] = []
        self.token: Tensor | None = None

    def post(self, b: int, values: Sequence[Tensor]) -> None:
        self.tokens.append(_BinPost.apply(self.op, b, *values))

    def close(self) -> None:
        self.token = _BinJoin.apply(self.op, *self.tokens)
        self.tokens = []

    def receive(self, key: tuple[int, int]) -> list[Tensor]:
        assert self.token is not None
        flat = _BinRecv.apply(self.token, self.op, key)
        rows = flat.shape[0]
        return [t.reshape(rows, *w) for t, w in zip(torch.split(flat, self.op.numels, dim=1), self.op.widths)]


# --- layout transitions: vertex-partitioned <-> feature-partitioned (P3) -----------------------


def _offsets(sizes: Sequence[int]) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


class _VertexFeature(_Op):
    """All-to-all between [n_r, F] (rows of rank r, all features) and [N, f_r] (all rows, slice r).

    `to_feature=True` goes rows -> columns (vertex_to_feature); False is the
    mirror. Each is the other's backward.
    """

    def __init__(self, row_counts: Sequence[int], col_sizes: Sequence[int], to_feature: bool,
                 stats: CommStats, label: str, group: Group):
        super().__init__(stats, label, group)
        if len(row_counts) != self.world or len(col_sizes) != self.world:
            raise PlanError(f"layout transition needs one row count and one feature slice per rank "
                            f"(world {self.world}), got {len(row_counts)} and {len(col_sizes)}")
        self.rows = [int(r) for r in row_counts]
        self.cols = [int(c) for c in col_sizes]
        self.to_feature = to_feature
        self.name = "vertex_to_feature" if to_feature else "feature_to_vertex"

    def _post(self, x: Tensor, to_feature: bool, direction: str) -> None:
        r, rows, cols = self.rank, self.rows, self.cols
        col_off, row_off = _offsets(cols), _offsets(rows)
        if to_feature:  # x: [rows[r], F]; send x[:, slice k] to k, receive [rows[k], cols[r]] from k
            if tuple(x.shape) != (rows[r], col_off[-1]):
                raise PlanError(f"rank {r}: vertex-partitioned input has shape {tuple(x.shape)}, "
                                f"expected ({rows[r]}, {col_off[-1]})")
            send = [x[:, col_off[k]:col_off[k + 1]].reshape(-1) for k in range(self.world)]
            recv_sizes = [rows[k] * cols[r] for k in range(self.world)]
        else:  # x: [N, cols[r]]; send rows of k to k, receive [rows[r], cols[k]] from k
            if tuple(x.shape) != (row_off[-1], cols[r]):
                raise PlanError(f"rank {r}: feature-partitioned input has shape {tuple(x.shape)}, "
                                f"expected ({row_off[-1]}, {cols[r]})")
            send = [x[row_off[k]:row_off[k + 1]].reshape(-1) for k in range(self.world)]
            recv_sizes = [rows[r] * cols[k] for k in range(self.world)]
        send_sizes = [s.numel() for s in send]
        self._count(direction, _nbytes(sum(send_sizes) - send_sizes[r], x.dtype))
        self.flat_in = torch.cat(send)
        self.flat_out = x.new_empty(sum(recv_sizes))
        self.recv_sizes = recv_sizes
        self.out_to_feature = to_feature
        self.work = dist.all_to_all_single(self.flat_out, self.flat_in, output_split_sizes=recv_sizes,
                                           input_split_sizes=send_sizes, group=self.group, async_op=True)

    def _assemble(self) -> Tensor:
        self.work.wait()
        self.work = None  # a finished Work still holds the tensors it moved; the op lives until backward
        r, rows, cols = self.rank, self.rows, self.cols
        parts = torch.split(self.flat_out, self.recv_sizes)
        self.flat_in = self.flat_out = None  # type: ignore[assignment]
        if self.out_to_feature:  # blocks [rows[k], cols[r]] stacked by rows
            return torch.cat([parts[k].view(rows[k], cols[r]) for k in range(self.world)], dim=0)
        return torch.cat([parts[k].view(rows[r], cols[k]) for k in range(self.world)], dim=1)

    def forward_start(self, x: Tensor) -> None:
        self._post(x.contiguous(), self.to_feature, "fwd")

    def forward_finish(self) -> Tensor:
        return self._assemble()

    def backward_start(self, grad: Tensor) -> None:
        self._post(grad, not self.to_feature, "bwd")

    def backward_finish(self) -> Tensor:
        return self._assemble()


def vertex_to_feature(x: Tensor, row_counts: Sequence[int], col_sizes: Sequence[int],
                      stats: CommStats, *, label: str = "layout", group: Group = None) -> Tensor:
    """[n_r, F] rows owned by rank r -> [N, f_r]: every row, this rank's feature slice.

    Rows come grouped by rank (rank 0's n_0 rows first); slice k is
    col_sizes[k] wide (F need not divide by the world size; see
    gnnc.plan.slices.feature_slices). Backward is feature_to_vertex.
    """
    return _run(_VertexFeature(row_counts, col_sizes, True, stats, label, group), x)


def feature_to_vertex(x: Tensor, row_counts: Sequence[int], col_sizes: Sequence[int],
                      stats: CommStats, *, label: str = "layout", group: Group = None) -> Tensor:
    """[N, f_r] (all rows, this rank's feature slice) -> [n_r, F] (own rows, all features)."""
    return _run(_VertexFeature(row_counts, col_sizes, False, stats, label, group), x)


# --- all-gather / reduce-scatter along one dimension, uneven blocks ----------------------------


class _GatherScatter(_Op):
    """all_gather of blocks along `dim` (gather=True) or reduce_scatter (sum, keep own block).

    gloo's all_gather and reduce_scatter need equal blocks, so blocks are padded
    to the largest along `dim` (moved to the front); padding is not counted.
    """

    def __init__(self, sizes: Sequence[int], dim: int, gather: bool, stats: CommStats,
                 label: str, group: Group):
        super().__init__(stats, label, group)
        if len(sizes) != self.world:
            raise PlanError(f"need one block size per rank (world {self.world}), got {len(sizes)}")
        self.sizes = [int(s) for s in sizes]
        self.dim = dim
        self.gather = gather
        self.name = "all_gather" if gather else "reduce_scatter"

    def _post_gather(self, x: Tensor, direction: str) -> None:
        r, big = self.rank, max(self.sizes)
        front = x.movedim(self.dim, 0)
        if front.shape[0] != self.sizes[r]:
            raise PlanError(f"rank {r}: block has {front.shape[0]} entries along dim {self.dim}, "
                            f"the plan says {self.sizes[r]}")
        self.rest = tuple(front.shape[1:])
        padded = front.new_zeros((big, *self.rest))
        padded[: self.sizes[r]] = front
        self._count(direction, _nbytes(front.numel() * (self.world - 1), x.dtype))
        self.buf_in = padded
        self.buf_out = front.new_empty((big * self.world, *self.rest))
        self.work = _all_gather_flat(self.buf_out, padded, self.group) if padded.numel() else None
        self.mode = "gather"

    def _post_scatter(self, x: Tensor, direction: str) -> None:
        r, big = self.rank, max(self.sizes)
        front = x.movedim(self.dim, 0)
        if front.shape[0] != sum(self.sizes):
            raise PlanError(f"rank {r}: input has {front.shape[0]} entries along dim {self.dim}, "
                            f"the blocks add up to {sum(self.sizes)}")
        self.rest = tuple(front.shape[1:])
        per = int(torch.Size(self.rest).numel())
        padded = front.new_zeros((big * self.world, *self.rest))
        off = _offsets(self.sizes)
        for k in range(self.world):
            padded[k * big: k * big + self.sizes[k]] = front[off[k]:off[k + 1]]
        self._count(direction, _nbytes((sum(self.sizes) - self.sizes[r]) * per, x.dtype))
        self.buf_in = padded
        self.buf_out = front.new_empty((big, *self.rest))
        self.work = _reduce_scatter_flat(self.buf_out, padded, self.group) if padded.numel() else None
        self.mode = "scatter"

    def _finish(self) -> Tensor:
        if self.work is not None:  # None: every block is empty, nothing was sent
            self.work.wait()
            self.work = None  # a finished Work still holds the tensors it moved
        big = max(self.sizes)
        if self.mode == "gather":
            blocks = [self.buf_out[k * big: k * big + self.sizes[k]] for k in range(self.world)]
            out = torch.cat(blocks)
        else:
            out = self.buf_out[: self.sizes[self.rank]]
        self.buf_in = self.buf_out = None  # type: ignore[assignment]
        return out.movedim(0, self.dim).contiguous()

    def forward_start(self, x: Tensor) -> None:
        (self._post_gather if self.gather else self._post_scatter)(x, "fwd")

    def forward_finish(self) -> Tensor:
        return self._finish()

    def backward_start(self, grad: Tensor) -> None:
        (self._post_scatter if self.gather else self._post_gather)(grad, "bwd")

    def backward_finish(self) -> Tensor:
        return self._finish()


def all_gather(x: Tensor, sizes: Sequence[int], stats: CommStats, *, dim: int = 0,
               label: str = "all_gather", group: Group = None) -> Tensor:
    """Concatenate every rank's block along `dim` (block k is sizes[k] long); the result is replicated.

    Backward: reduce_scatter of the gradient (each rank's gradient of the
    replicated result is summed, and the owner keeps its block).
    """
    return _run(_GatherScatter(sizes, dim, True, stats, label, group), x)


def reduce_scatter(x: Tensor, sizes: Sequence[int], stats: CommStats, *, dim: int = 0,
                   label: str = "reduce_scatter", group: Group = None) -> Tensor:
    """Sum `x` over ranks and keep this rank's block along `dim` ("sum partials at the owner").

    With dim=0 and sizes = rows per rank this is pushpull's sync of P3's
    layer-1 partial results. Backward: all_gather of the gradient.
    """
    return _run(_GatherScatter(sizes, dim, False, stats, label, group), x)


class Posted:
    """A gather or reduce-scatter posted outside autograd; `wait()` returns its result.

    For callers that schedule the phases of several steps themselves (P3's pipeline in
    gnnc.runtime.minibatch): they post a phase's exchange, run other steps' phases, then wait.
    `direction` is the byte counters' ("bwd" for the gradient a backward phase sends).
    """

    def __init__(self, op: _GatherScatter, direction: str, post: Any, x: Tensor):
        self.op = op
        self.direction = direction
        op._timed(direction, post, x, direction)

    def wait(self) -> Tensor:
        return self.op._timed(self.direction, self.op._finish)


def post_all_gather(x: Tensor, sizes: Sequence[int], stats: CommStats, *, label: str, direction: str = "fwd",
                    group: Group = None) -> Posted:
    """`all_gather` along dim 0, posted; no autograd (the caller sends gradients itself)."""
    op = _GatherScatter(sizes, 0, True, stats, label, group)
    return Posted(op, direction, op._post_gather, x.detach().contiguous())


def post_reduce_scatter(x: Tensor, sizes: Sequence[int], stats: CommStats, *, label: str, direction: str = "fwd",
                        group: Group = None) -> Posted:
    """`reduce_scatter` along dim 0, posted; no autograd."""
    op = _GatherScatter(sizes, 0, False, stats, label, group)
    return Posted(op, direction, op._post_scatter, x.detach().contiguous())


# --- staged broadcast (MG-GCN bcast1d) ---------------------------------------------------------


class _BroadcastBlock(_Op):
    name = "broadcast"

    def __init__(self, root: int, shape: Sequence[int], stats: CommStats, label: str, group: Group,
                 owns_grad: bool = False):
        super().__init__(stats, label, group)
        self.root = root
        self.shape = tuple(int(s) for s in shape)
        self.owns_grad = owns_grad  # the block's one reader hands over a fresh gradient: reduce in it

    def forward_start(self, x: Tensor) -> None:
        if self.rank == self.root:
            if tuple(x.shape) != self.shape:
                raise PlanError(f"rank {self.rank}: broadcast block has shape {tuple(x.shape)}, "
                                f"the plan says {self.shape}")
            # sent from the rows as they are: nothing writes into a broadcast block (its readers only
            # multiply it), so the root's output may share them instead of copying a block per stage
            self.buf = x.detach().contiguous()
            self._count("fwd", _nbytes(self.buf.numel() * (self.world - 1), x.dtype))
        else:
            self.buf = x.new_empty(self.shape)
        self.work = dist.broadcast(self.buf, _global(self.group, self.root), group=self.group,
                                   async_op=True)

    def forward_finish(self) -> Tensor:
        self.work.wait()
        self.work = None
        out, self.buf = self.buf, None
        return out

    def backward_start(self, grad: Tensor) -> None:
        # reduce writes into its input on some backends: a gradient autograd may share is copied first
        self.gbuf = grad if self.owns_grad else grad.clone()
        if self.rank != self.root:
            self._count("bwd", _nbytes(grad.numel(), grad.dtype))
        self.work = dist.reduce(self.gbuf, _global(self.group, self.root), op=dist.ReduceOp.SUM,
                                group=self.group, async_op=True)

    def backward_finish(self) -> Tensor | None:
        self.work.wait()
        self.work = None
        g, self.gbuf = self.gbuf, None
        # Only the root's block fed the broadcast; the others' inputs get no gradient.
        return g if self.rank == self.root else None


def broadcast_block(x_local: Tensor, root: int, shape: Sequence[int], stats: CommStats, *,
                    label: str = "bcast", group: Group = None) -> Tensor:
    """Rank `root`'s block (of `shape`) on every rank; backward reduces the gradient to `root`."""
    return _run(_BroadcastBlock(root, shape, stats, label, group), x_local)


def start_broadcast_block(x_local: Tensor, root: int, shape: Sequence[int], stats: CommStats, *,
                          label: str = "bcast", group: Group = None, owns_grad: bool = False) -> CommHandle:
    """`broadcast_block`, posted: `wait()` on the handle gives the block. `owns_grad`: the block has one
    reader whose backward makes a fresh gradient for it, which the backward reduce may then overwrite."""
    return _start(_BroadcastBlock(root, shape, stats, label, group, owns_grad), x_local)


def staged_broadcast(x_local: Tensor, row_counts: Sequence[int], stats: CommStats, *,
                     label: str = "bcast", group: Group = None) -> Iterator[tuple[int, Tensor]]:
    """MG-GCN's bcast1d: yield (j, H_j) for j = 0..m-1, H_j being rank j's row block.

    Stage j+1's broadcast is posted before stage j is yielded, so the caller's
    multiply with A_ij overlaps the next broadcast. Consume the whole iterator
    on every rank (the broadcasts are collectives).
    """
    world = dist.get_world_size(group)
    width = tuple(x_local.shape[1:])
    handle = start_broadcast_block(x_local, 0, (row_counts[0], *width), stats, label=label, group=group)
    for j in range(world):
        nxt = (start_broadcast_block(x_local, j + 1, (row_counts[j + 1], *width), stats,
                                     label=label, group=group) if j + 1 < world else None)
        yield j, handle.wait()
        if nxt is not None:
            handle = nxt


# --- point to point between pipeline stages ----------------------------------------------------


class _PipeSend(_Op):
    name = "pipe"

    def __init__(self, peer: int, stats: CommStats, label: str, group: Group):
        super().__init__(stats, label, group)
        self.peer = peer

    def forward_start(self, x: Tensor) -> None:
        self.meta = (tuple(x.shape), x.dtype, x.device)
        self.buf = x.detach().contiguous()
        self._count("fwd", _nbytes(self.buf.numel(), x.dtype))
        self.work = dist.isend(self.buf, _global(self.group, self.peer), group=self.group)

    def forward_finish(self) -> Tensor:
        self.work.wait()
        self.work = None
        self.buf = None
        _, dtype, device = self.meta
        return torch.zeros(0, dtype=dtype, device=device)

    def backward_start(self, grad: Tensor) -> None:
        shape, dtype, device = self.meta
        self.buf = torch.empty(shape, dtype=dtype, device=device)
        self.work = dist.irecv(self.buf, _global(self.group, self.peer), group=self.group)

    def backward_finish(self) -> Tensor:
        self.work.wait()
        self.work = None
        g, self.buf = self.buf, None
        return g


class _PipeRecv(_Op):
    name = "pipe"

    def __init__(self, peer: int, shape: Sequence[int], dtype: torch.dtype, stats: CommStats,
                 label: str, group: Group):
        super().__init__(stats, label, group)
        self.peer = peer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype

    def forward_start(self, anchor: Tensor) -> None:
        self.device = anchor.device
        self.buf = torch.empty(self.shape, dtype=self.dtype, device=anchor.device)
        self.work = dist.irecv(self.buf, _global(self.group, self.peer), group=self.group)

    def forward_finish(self) -> Tensor:
        self.work.wait()
        self.work = None
        out, self.buf = self.buf, None
        return out

    def backward_start(self, grad: Tensor) -> None:
        self.buf = grad.contiguous()
        self._count("bwd", _nbytes(self.buf.numel(), grad.dtype))
        self.work = dist.isend(self.buf, _global(self.group, self.peer), group=self.group)

    def backward_finish(self) -> Tensor:
        self.work.wait()
        self.work = None
        self.buf = None
        return torch.zeros(0, dtype=self.dtype, device=self.device)


def pipe_send(x: Tensor, dst: int, stats: CommStats, *, label: str = "pipe",
              group: Group = None) -> Tensor:
    """Send `x` to the next stage; returns an empty token whose backward receives x's gradient.

    Include the token in this stage's backward (for example
    `torch.autograd.backward([token], [token.new_zeros(0)])` or `(loss + token.sum())`)
    so that autograd waits for the gradient from `dst`.
    """
    return _run(_PipeSend(dst, stats, label, group), x)


def pipe_recv(shape: Sequence[int], dtype: torch.dtype, src: int, stats: CommStats, *,
              label: str = "pipe", requires_grad: bool = True, device: torch.device | str = "cpu",
              group: Group = None) -> Tensor:
    """Receive a tensor of `shape` from the previous stage; backward sends its gradient back to `src`."""
    anchor = torch.zeros(0, dtype=dtype, device=device, requires_grad=requires_grad)
    return _run(_PipeRecv(src, shape, dtype, stats, label, group), anchor)


# --- all-reduce of replicated parameter gradients, bucketed ------------------------------------


def allreduce_payload_bytes(numel: int, element_size: int, rank: int, world: int) -> int:
    """Logical bytes rank `rank` sends to all-reduce `numel` elements (see the module docstring)."""
    # torch.tensor_split's chunks: the first numel % world are one element longer.
    mine = numel // world + (1 if rank < numel % world else 0)
    return (numel - mine + (world - 1) * mine) * element_size


# --- all-reduce of a value computed from every rank's rows (batch_norm's statistics) -------------


class _AllReduceSum(_Op):
    """y = sum over ranks of x, on every rank. Every rank's loss reads y, so the gradient of x is the
    sum over ranks of the gradients of y: the backward is the same all-reduce."""

    name = "allreduce"

    def _post(self, t: Tensor, direction: str) -> None:
        self.buf = t.detach().clone()  # a fresh tensor: the all-reduce writes into it
        self._count(direction, allreduce_payload_bytes(self.buf.numel(), self.buf.element_size(), self.rank,
                                                       self.world))
        self.work = dist.all_reduce(self.buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _wait(self) -> Tensor:
        self.work.wait()
        out, self.buf = self.buf, None
        return out

    def forward_start(self, x: Tensor) -> None:
        self._post(x, "fwd")

    def forward_finish(self) -> Tensor:
        return self._wait()

    def backward_start(self, grad: Tensor) -> None:
        self._post(grad, "bwd")

    def backward_finish(self) -> Tensor:
        return self._wait()


def all_reduce_sum(x: Tensor, stats: CommStats, *, label: str = "allreduce", group: Group = None) -> Tensor:
    """The sum of `x` over ranks, differentiable: its backward all-reduces the gradient (batch_norm's
    synchronised statistics)."""
    return _run(_AllReduceSum(stats, label, group), x)


class GradAllReduce:
    """Sum the gradients of replicated parameters over ranks, a few flat buckets at a time.

    Buckets hold parameters in reverse order (the order backward usually
    produces their gradients), each up to `bucket_bytes`, unless `buckets`
    gives them (lists of indices into `params`). `reduce()` runs after
    backward. With `overlap=True`, a hook on every parameter
    (`register_post_accumulate_grad_hook`) posts a bucket's all-reduce as soon
    as all its gradients exist, while backward continues; call `finish()`
    after `loss.backward()`. Buckets are always posted in index order, the
    same on every rank, as the collectives require. A parameter without a
    gradient contributes zeros (and receives the sum). Gradients are summed,
    not averaged: gnnc's loss is normalised by the global training count.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], stats: CommStats, *,
                 bucket_bytes: int = 4 << 20, overlap: bool = False, label: str = "grads",
                 group: Group = None, buckets: Sequence[Sequence[int]] | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.stats = stats
        self.label = label
        self.group = group
        self.rank, self.world = _rank_world(group)
        self.buckets: list[list[int]] = []
        if buckets is not None:  # given (a plan's schedule): indices into `params`, posted in this order
            self.buckets = [list(b) for b in buckets if len(b)]
            if sorted(i for b in self.buckets for i in b) != list(range(len(self.params))):
                raise PlanError(f"gradient buckets {self.buckets} do not hold each of the "
                                f"{len(self.params)} parameters once")
        size = 0
        for i in reversed(range(len(self.params)) if buckets is None else ()):
            p = self.params[i]
            nbytes = p.numel() * p.element_size()
            if not self.buckets or (size + nbytes > bucket_bytes and self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += nbytes
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self._hooks: list[Any] = []
        self._reset()
        if overlap:
            for i, p in enumerate(self.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _reset(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._next = 0
        self._inflight: list[tuple[int, Tensor, Any]] = []

    def _make_hook(self, i: int) -> Any:
        def hook(_param: Tensor) -> None:
            b = self.bucket_of[i]
            self._ready[b] += 1
            # Post in bucket order only, the same order on every rank.
            while (self._next < len(self.buckets)
                   and self._ready[self._next] == len(self.buckets[self._next])):
                self._post(self._next)
                self._next += 1
        return hook

    def _post(self, b: int) -> None:
        t0 = time.perf_counter()
        members = [self.params[i] for i in self.buckets[b]]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in members])
        if any(p.grad is not None and p.grad.is_sparse for p in members):
            raise PlanError("bucketed all-reduce supports dense gradients only")
        nbytes = allreduce_payload_bytes(flat.numel(), flat.element_size(), self.rank, self.world)
        self.stats.add_bytes(self.label, "allreduce", "bwd", nbytes)
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self._inflight.append((b, flat, work))
        self.stats.add_time(self.label, "allreduce", "bwd", time.perf_counter() - t0)

    def finish(self) -> None:
        """Post the buckets not posted yet, wait for all, and write the sums into `.grad`."""
        t0 = time.perf_counter()
        while self._next < len(self.buckets):
            self._post(self._next)
            self._next += 1
        for b, flat, work in self._inflight:
            work.wait()
            off = 0
            for i in self.buckets[b]:
                p = self.params[i]
                n = p.numel()
                summed = flat[off:off + n].view_as(p)
                if p.grad is None:
                    p.grad = summed.clone()
                else:
                    p.grad.copy_(summed)
                off += n
        self._reset()
        self.stats.add_time(self.label, "allreduce", "bwd", time.perf_counter() - t0)

    def reduce(self) -> None:
        """All-reduce every gradient now (no overlap); the same as `finish()` without hooks."""
        self.finish()

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
