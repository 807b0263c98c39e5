"""The window of an overlapped halo: the exchange beside the work on the rows it does not wait for.

Why this module exists: DepComm's and Hybrid's formulas (gnnc.passes.cost.neutronstar) price a layer's
exchange overlapped with its computation the same way, and the schedule pass chooses between the two
runtime schedules of that overlap (gnnc.plan.schedule_attrs: `halo[overlap=true]` with or without
`chunked=true`); both are priced here, once.

* Whole halo (`chunked=false`): the edges of held sources (`held`) run while the exchange (`exch`) is in
  flight, the edges of remote sources (`remote`) once every peer's rows are in:
  max(exch, held) + remote.
* Chunked (NeutronStar section 4.3, ring order): the remote rows arrive in n = P - 1 chunks, one per peer,
  priced as equal (the link is shared by them: chunk k is in after k * exch / n), and the edges of chunk k
  run once it is in and the previous chunk's are done. With held work h, chunk work r = remote / n and
  c = exch / n, the last chunk ends at max over k of (k c + (n - k + 1) r) and h + remote; that is linear
  in k, so its maximum is at k = 1 or k = n:

      max(h + remote, c + remote, exch + r)

  the exposed communication being that less h + remote: max(0, c - h, exch - h - remote + r), the per-chunk
  form max(0, comm - overlappable compute). Chunked, a layer runs its per-part equations P times (the held
  rows, one part per peer: gnnc.runtime.distributed.part_bounds), P - 2 more than the whole halo's two (the
  held rows, the halo); each extra part is charged `calls`, the dispatch of those equations once
  (gnnc.passes.cost.compute.part_calls: the equations on edges and the readers of the exchanged rows, those the
  schedule pass marks `split`; SAGE 1, GAT 5, GCN 2 forward), at the profile's measured dispatch (`call`).

  Checked against the runtime (`python benchmarks/chunk_parts.py --repeat 60`, benchmarks/RESULTS-seeds.md): on
  the loaded 2-core box an extra part cost SAGE 1.1-1.8 ms and GAT 3.4-3.6 ms forward and backward, and the
  probe's dispatch there was 127 us an equation forward, 282 us backward: the count times it, SAGE 0.41 ms and GAT
  2.0 ms, is 1.7-4.3x below a part's cost (a part's equations also pass over every destination row); the layer's
  every op, charged before (SAGE 9, GAT 14 forward), was 1.5-3x above it. What the model still lacks is the
  gain: it prices every rank starting its exchange together (exposed communication max(0, exch - held)), while
  the blocked time measured on the emulated cluster was 2-6x what it predicts, mostly ranks waiting for ranks
  behind (two to a core); chunks hide part of that wait.

* The ranks' arrival spread (`exposed_communication`'s `late`): a rank that posts its exchange `late` seconds
  before the last of its peers waits for exch + late, less the work it overlaps. Measured per rank and exchange
  on the emulated cluster (benchmarks/cluster/arrival_spread.py, benchmarks/RESULTS-seeds.md), it closes 38% to
  all of the gap above (four cases, loaded); the schedule pass prices 0 (every rank at once): no cluster profile measures the spread
  yet, and on a shared machine it is the load's, not the plan's.

* G3's inter-layer pipeline (`halo[pipelined=true]`, G3 section 5.2; gnnc.runtime.bins): the sending layer's k bins
  each post their rows of the next layer's halo as they end, so the exchange is in flight while the sender's later
  bins compute. With the sender's binned forward work `sent` (its per-bin equations and the chain run per bin up to
  the halo, the next dense map included) in k equal bins, each carrying exch / k of the exchange on a link that
  carries one message at a time, bin j's message is in by max over i <= j of (i sent / k + (j - i + 1) exch / k);
  linear in i, the last is in max(sent / k + exch, sent + exch / k) after the sender's first bin starts, that is

      max(exch - (k - 1) sent / k, exch / k)

  after its last bin ends (`pipelined_window`), where the whole halo took exch. Equal bins are conservative:
  G3's priority order puts the rows with remote readers first, so the early messages carry more. Backward gains
  nothing priced: a message's gradients are complete only once every receiving bin reading its rows has run its
  backward, which for boundary rows is most of them. What it costs (`pipeline_dispatch`): k messages per peer and
  direction where the whole halo posts one, each `alpha` to start on the calling thread (gloo posts a send there),
  and the chain's equations dispatched once per bin instead of once.
"""
from __future__ import annotations

import sympy

from gnnc.passes.cost.symbols import Max, P, T_call_b, T_call_f, alpha


def overlap_window(exch: sympy.Expr, held: sympy.Expr, remote: sympy.Expr, chunked: bool,
                   calls: sympy.Expr) -> sympy.Expr:
    """Seconds of an overlapped halo's window (module docstring): written as a Max of lanes plus the last
    chunk's work, so the predicted schedule draws the lanes side by side (gnnc.passes.cost.schedule)."""
    if not chunked:
        return Max(exch, held) + remote
    n = Max(P - 1, 1)
    before_last = remote * (n - 1) / n
    return Max(held + before_last, exch / n + before_last, exch) + remote / n + Max(P - 2, 0) * calls


def exposed_communication(exch: sympy.Expr, held: sympy.Expr, remote: sympy.Expr, chunked: bool,
                           late: sympy.Expr = sympy.Integer(0)) -> sympy.Expr:
    """Seconds of an overlapped halo's window that a worker waits for the exchange (module docstring): the window
    less its work, dispatch apart; what a rank's blocked halo time measures (benchmarks/cluster/chunk_overlap.py).

    `late`: how long before the last of its peers this worker posts the exchange (the ranks' arrival spread,
    issue 38 item 4): its window runs from its own post, the rows come `exch` after the last peer's, so the
    exchange it waits for is exch + late. 0 (every rank at once) is what the schedule pass prices; the spread is
    measured, not predicted (benchmarks/cluster/arrival_spread.py: no cluster profile carries it yet)."""
    if not chunked:
        return Max(exch + late - held, 0)
    n = Max(P - 1, 1)
    return Max(0, exch / n + late - held, exch + late - held - remote * (n - 1) / n)


def pipelined_window(exch: sympy.Expr, sent: sympy.Expr, held: sympy.Expr, remote: sympy.Expr,
                     bins: int) -> sympy.Expr:
    """Seconds of a pipelined halo's window (module docstring: G3's inter-layer pipeline): from the sending layer's
    last bin, the last of the rows in (an exchange of `exch` seconds fed by `sent` seconds of the sender's k bins)
    beside the receiver's bins that read held rows only (`held`), then the others (`remote`). One Max of lanes, as
    `overlap_window`'s, for the predicted schedule's drawing."""
    k = sympy.Integer(bins)
    return Max(exch - sent * (k - 1) / k, exch / k, held) + remote


def pipeline_dispatch(bins: int, chain_calls: int, phase: str, messages: bool = True) -> sympy.Expr:
    """Seconds a pipelined halo costs beyond the whole halo's, in one direction (`phase` f or b): k - 1 more messages
    to each peer (when `messages`: backward sends none when the exchanged value has no gradient) and the chain's
    `chain_calls` equations dispatched k - 1 more times."""
    extra = sympy.Integer(bins - 1)
    posts = Max(P - 1, 0) * alpha if messages else sympy.Integer(0)
    return extra * (posts + chain_calls * (T_call_b if phase == "b" else T_call_f))
