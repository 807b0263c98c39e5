"""Alpha-beta costs of the collectives: bytes / bandwidth plus a latency per message start.

Why this module exists: every strategy and layout transition communicates
through these few collectives; each has one small formula here, and
`grad_allreduce` prices the weight all-reduce every multi-worker step pays.
Compute and communication that overlap take the max, not the sum (`Max`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from gnnc.passes.cost.symbols import Max, P, b_grad, bw, alpha, Cost, ZERO


def all_to_all_time(send_bytes: sympy.Expr, recv_bytes: sympy.Expr, starts: sympy.Expr | None = None) -> sympy.Expr:
    """Personalised exchange with every peer (NeutronStar's ring order: P-1 steps).

    Full-duplex links: a worker's sends and receives proceed together, so the
    larger of the two sets the time; one message start per step, or `starts`
    of them where the caller knows how many messages a worker really starts.
    """
    return Max(send_bytes, recv_bytes) / bw + (P - 1 if starts is None else starts) * alpha


def any_moved(rows: sympy.Expr) -> sympy.Expr:
    """1 when a worker moves at least one row (`rows`, a count, is positive), else 0.

    The runtime's ring exchange posts no message for an empty chunk
    (gnnc.runtime.comm), so an exchange that carries nothing starts none.
    """
    return sympy.Min(1, rows, evaluate=False)


def all_reduce_time(nbytes: sympy.Expr) -> sympy.Expr:
    """Ring all-reduce of `nbytes` (reduce-scatter then all-gather): 2(P-1)/P·bytes/bw + 2(P-1)·alpha."""
    return 2 * (P - 1) / P * nbytes / bw + 2 * (P - 1) * alpha


def reduce_scatter_time(send_bytes: sympy.Expr) -> sympy.Expr:
    """Reduce-scatter where this worker must send `send_bytes` (the other workers' blocks).

    For equal blocks of a buffer of n bytes this is the ring's (P-1)/P·n/bw.
    """
    return send_bytes / bw + (P - 1) * alpha


def all_gather_time(recv_bytes: sympy.Expr, starts: sympy.Expr | None = None) -> sympy.Expr:
    """All-gather where this worker must receive `recv_bytes` (every other block); ring: P-1 steps
    (message starts), or `starts` where the caller knows how many a worker really starts."""
    return recv_bytes / bw + (P - 1 if starts is None else starts) * alpha


def broadcast_time(nbytes: sympy.Expr) -> sympy.Expr:
    """Pipelined tree broadcast of `nbytes`: the block crosses each link once, ceil(log2 P) message starts."""
    return nbytes / bw + sympy.ceiling(sympy.log(P, 2)) * alpha


def grad_allreduce(param_elements: sympy.Expr, buckets: int = 1, name: str = "grad_allreduce") -> Cost:
    """Sum the gradients of replicated weights over workers (ring all-reduce, `buckets` calls).

    Time: 2(P-1)/P·n·b_grad/bw + 2(P-1)·alpha per bucket (the textbook ring).
    Bytes: the logical payload as gnnc.runtime.comm counts it (reduce-scatter
    then all-gather): 2(P-1)·n·b_grad over all workers, 2(P-1)/P·n·b_grad per
    worker on average; `allreduce_payload` gives each rank's exact share.
    b_grad, not b: gradients are of the fp32 master weights at every
    precision. Weights a strategy does not replicate (P3's W1 under pushpull:
    each worker holds, differentiates and updates only its feature slice's
    rows, gnnc.plan.slices.split_weights) are left out by the caller: the
    planner (gnnc.passes.planner.search), the schedule pass's buckets and
    predict-bytes, as the runtime leaves them out of its all-reduce.
    """
    nbytes = param_elements * b_grad
    time = 2 * (P - 1) / P * nbytes / bw + 2 * (P - 1) * alpha * buckets
    return Cost(name, (time,), 2 * (P - 1) / P * nbytes, ZERO)


def allreduce_payload(bucket_elements: Sequence[int], world: int) -> np.ndarray:
    """Elements each rank sends for all-reduces of these bucket sizes, exactly as the runtime counts.

    Rank r's chunk c_r of a bucket of n elements follows torch.tensor_split
    (the first n mod world chunks are one longer); it sends the other chunks
    (n - c_r) in the reduce-scatter and its reduced chunk to world-1 ranks.
    """
    out = np.zeros(world, dtype=np.int64)
    if world <= 1:
        return out
    for n in bucket_elements:
        chunk = np.full(world, n // world, dtype=np.int64)
        chunk[: n % world] += 1
        out += (n - chunk) + (world - 1) * chunk
    return out
