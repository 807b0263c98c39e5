"""Running an equation once per source part: the overlap of a split exchange with the work it feeds.

Why this module exists: the schedule pass marks a layer's exchange `split`
(an overlapped halo, a staged broadcast; gnnc.plan.schedule_attrs) and the
equations that read it `split=true`. Such an exchange delivers its rows as a
`PartStream`, part after part (the held rows at once and the halo rows
after the wait, or with `chunked=true` each peer's rows as they arrive, in
ring order; rank j's block at stage j), and each split equation runs on
the edges of one part at a time (`gnnc.plan.rows.SourceParts`), so the work
on the parts that have arrived runs while the others are in flight. Edge
values stay as one tensor per part (`Parts`); an equation that turns edges
into vertex rows combines its parts exactly, as its reducer's `combine` says
(gnnc.ir.reducers):

* add (sum, mean, std): each part's sums of powers of its messages added, then
  the reducer's finalise on the totals and the whole in-degree (mean divides
  the sum by it; gnnc.runtime.kernels.reducers);
* max / min: the larger / smaller of the parts' results, a part without an
  edge at a row left out; the gradient of a row is shared among the parts
  in proportion to how many of their edges reach the extreme value, so each
  such edge gets what one process gives it (an even share of the ties, the
  reference's counting of its zero start included);
* edge softmax: the maximum and the denominator over every part, so each
  part's coefficients are the ones one process computes (this equation
  needs every part of its input: it waits for the score rows, which are
  `heads` wide, while the feature rows stay in flight).

Only the order of the floating-point sums changes; the result equals one
process within rounding.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gnnc.ir import Eqn
from gnnc.ir.ops import reads_neighbours
from gnnc.ir.reducers import reducer
from gnnc.plan.rows import SourceParts
from gnnc.runtime.kernels import reducers, spmm_add_


class PartStream:
    """An exchange's rows, part by part: `part(p)` waits for part p; `whole()` for all of them.

    `later` yields the parts after `first` in the order they arrive, `arrival` (part indices; by default
    1, 2, ...): a chunked halo's peers come in ring order, not in the order their rows are held (by rank).
    """

    def __init__(self, first: torch.Tensor | None, later: Iterator[torch.Tensor], count: int,
                 arrival: Sequence[int] | None = None):
        self._got: dict[int, torch.Tensor] = {} if first is None else {0: first}
        self._later = later
        self.count = count
        start = 0 if first is None else 1
        self.arrival = list(range(start, count)) if arrival is None else list(arrival)
        self._next = 0
        self._whole: torch.Tensor | None = None

    def part(self, p: int) -> torch.Tensor:
        while p not in self._got:
            self._got[self.arrival[self._next]] = next(self._later)
            self._next += 1
        return self._got[p]

    def set_part(self, p: int, value: torch.Tensor) -> None:
        """Replace part p (already waited for) by `value`, the same rows through another autograd node."""
        self._got[p] = value
        self._whole = None

    def taken(self, p: int) -> bool:
        """Whether part p has been waited for."""
        return p in self._got

    def whole(self) -> torch.Tensor:
        if self._whole is None:
            for p in self.arrival:  # waited for in their order of arrival, then held in part order
                self.part(p)
            self._whole = torch.cat([self._got[p] for p in range(self.count)], dim=0)
        return self._whole

    def release(self, p: int) -> None:
        """Let go of part p once its only reader has used it (a staged broadcast's block)."""
        self._got[p] = torch.empty(0)


class Parts(list):
    """An edge value held as one tensor per source part."""


@dataclass
class PartRun:
    """What running a layer's split equations needs: its parts' edges and whether streams free their parts."""

    parts: SourceParts
    release: bool = False  # a staged broadcast: every part is read once, then dropped
    order: tuple[int, ...] | None = None  # the parts in the order they arrive (None: 0, 1, ...)

    @property
    def count(self) -> int:
        return len(self.parts)

    def in_order(self) -> tuple[int, ...]:
        """The parts in the order they are run: the order they arrive in."""
        return tuple(range(self.count)) if self.order is None else self.order


Runner = Callable[[Eqn, list[Any], Any], torch.Tensor]


def _part_input(x: Any, k: int, p: int, e: Eqn, run: PartRun) -> Any:
    """Input k of `e` for part p."""
    if isinstance(x, PartStream):
        if k not in reads_neighbours(e):
            raise AssertionError(f"{e.op} reads a split exchange's rows other than through edges")
        return x.part(p)
    if isinstance(x, Parts):
        return x[p]
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return x
    if k in reads_neighbours(e):  # rows of the sources, exchanged whole
        lo, hi = run.parts.bounds[p], run.parts.bounds[p + 1]
        return x[lo:hi]
    if e.ins[k].type is not None and e.ins[k].type.domain == "edge":  # an edge value computed whole
        return x[run.parts.pos[p]]
    return x


def run_split(e: Eqn, ins: list[Any], run: PartRun, eval_eqn: Runner, use_kernels: bool = False) -> Any:
    """Run `e` once per part (eval_eqn(eqn, inputs, view)) and combine as its op requires.

    With `use_kernels`, an spmm's sums add each part's product into one buffer in place
    (gnnc.runtime.kernels.spmm_add_), so a staged broadcast's layer holds one sum, not two.
    """
    if e.op == "edge_softmax":
        return _edge_softmax(ins[0], run)
    out_domain = e.outs[0].type.domain if e.outs[0].type is not None else "edge"
    if out_domain != "vertex":
        got: dict[int, Any] = {}
        for p in run.in_order():
            got[p] = eval_eqn(e, [_part_input(x, k, p, e, run) for k, x in enumerate(ins)], run.parts.views[p])
            _release(ins, p, run)
        return Parts(got[p] for p in range(run.count))
    if e.op not in ("spmm", "gather"):
        raise AssertionError(f"{e.op} turns a split edge value into vertex rows without reducing it")
    r = reducer(e.attr("reduce"))
    if r.combine == "add":
        part_eqn = e.with_attrs(reduce="sum")
        totals: list[Any] = [None] * len(r.powers)
        for p in run.in_order():
            xs = [_part_input(x, k, p, e, run) for k, x in enumerate(ins)]
            view = run.parts.views[p]
            for i, power in enumerate(r.powers):
                # every tensor input of a gather or spmm is a factor of the message: (w x)^k = w^k x^k
                ys = xs if power == 1 else [reducers.power(x, power) if isinstance(x, torch.Tensor) else x
                                            for x in xs]
                if use_kernels and e.op == "spmm" and ys[0].dim() > 0:
                    if totals[i] is None:
                        totals[i] = ys[0].new_zeros((view.csr.n_dst, *ys[0].shape[1:]))
                    totals[i] = spmm_add_(totals[i], view.csr, ys[0], ys[1] if len(ys) > 1 else None)
                else:
                    y = eval_eqn(part_eqn, ys, view)
                    totals[i] = y if totals[i] is None else totals[i] + y
            _release(ins, p, run)
        return reducers.finalise(r.name)(tuple(totals), run.parts.views[0].deg)  # the whole in-degree
    if r.combine in ("max", "min"):
        return _extreme(e, ins, run, eval_eqn)
    raise AssertionError(f"no rule to combine the parts of a {r.name} aggregation")


def _release(ins: list[Any], p: int, run: PartRun) -> None:
    if run.release:
        for x in ins:
            if isinstance(x, PartStream):
                x.release(p)


def _messages(e: Eqn, ins: list[Any], p: int, run: PartRun) -> torch.Tensor:
    """Part p's per-edge messages of an extreme aggregation (only to count the edges that reach the extreme)."""
    view = run.parts.views[p]
    with torch.no_grad():
        if e.op == "gather":
            return _part_input(ins[0], 0, p, e, run).detach()
        x = _part_input(ins[0], 0, p, e, run).detach()[view.src]
        if len(ins) > 1:
            w = _part_input(ins[1], 1, p, e, run).detach()
            while w.dim() < x.dim():
                w = w.unsqueeze(-1)
            x = w * x
        return x


def _extreme(e: Eqn, ins: list[Any], run: PartRun, eval_eqn: Runner) -> torch.Tensor:
    """max/min over parts; the gradient of a row shared by the parts' counts of edges at the extreme."""
    largest = reducer(e.attr("reduce")).combine == "max"
    fill = -math.inf if largest else math.inf
    pick = torch.maximum if largest else torch.minimum
    got = {p: eval_eqn(e, [_part_input(x, k, p, e, run) for k, x in enumerate(ins)], run.parts.views[p])
           for p in run.in_order()}
    ys = [got[p] for p in range(run.count)]
    has = [run.parts.views[p].csr.in_degree() > 0 for p in range(run.count)]
    shape = (-1,) + (1,) * (ys[0].dim() - 1)
    with torch.no_grad():
        best = None
        for y, h in zip(ys, has):
            cand = torch.where(h.view(shape), y.detach(), torch.full_like(y, fill))
            best = cand if best is None else pick(best, cand)
        best = torch.where(torch.isinf(best), torch.zeros_like(best), best)
        counts = []
        for p in range(run.count):
            view = run.parts.views[p]
            m = _messages(e, ins, p, run)
            hit = (m == best[view.dst]).to(best.dtype)
            counts.append(torch.zeros_like(best).index_add_(0, view.dst, hit))
            _release(ins, p, run)
        # One process shares a row's gradient evenly over its edges at the extreme, and (torch's
        # scatter_reduce without `include_self`) counts the zero it starts from when the extreme is 0;
        # each part's own backward divides by its count the same way, so part p takes that share.
        zero = ((best == 0) & (sum(counts) > 0)).to(best.dtype)
        own = [c + zero * (y.detach() == 0).to(best.dtype) * (c > 0).to(best.dtype) for c, y in zip(counts, ys)]
        total = sum(counts) + zero
        shares = [torch.where(total > 0, c / total.clamp(min=1), torch.zeros_like(c)) for c in own]
    out = sum(s * y for s, y in zip(shares, ys))
    # the shares add up to 1 where a row has edges; the value is the extreme itself, the rest is its gradient
    return out + (best - out).detach()


def _edge_softmax(scores: Any, run: PartRun) -> Parts:
    """Softmax over each destination's in-edges of every part: maximum and denominator over all parts."""
    parts = scores if isinstance(scores, Parts) else Parts(scores[p] for p in run.parts.pos)
    return Parts(_PartsSoftmax.apply(run.parts.views, *parts))


class _PartsSoftmax(torch.autograd.Function):
    """The edge softmax of scores held part by part (each part's edges grouped by destination, as its
    view's CSR holds them): segment reductions per part, combined; backward s * (g - sum_row(s * g))
    with the row sums over every part, as the one-piece kernel (gnnc.runtime.kernels.cpu.EdgeSoftmax)."""

    @staticmethod
    def forward(ctx: Any, views: list, *scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = views[0].csr.n_dst
        shape = (n,) + tuple(scores[0].shape[1:])
        mx = torch.full(shape, -math.inf, dtype=scores[0].dtype, device=scores[0].device)
        for s, view in zip(scores, views):
            if s.shape[0]:  # rows without an edge in this part reduce to -inf: never gathered
                mx = torch.maximum(mx, torch.segment_reduce(s, "max", offsets=view.csr.indptr, unsafe=True))
        outs = [torch.exp(s - mx.index_select(0, view.dst)) for s, view in zip(scores, views)]
        den = torch.zeros(shape, dtype=scores[0].dtype, device=scores[0].device)
        for o, view in zip(outs, views):
            if o.shape[0]:
                den += torch.segment_reduce(o, "sum", offsets=view.csr.indptr, unsafe=True)
        for o, view in zip(outs, views):
            o.div_(den.index_select(0, view.dst))
        ctx.views = views
        ctx.save_for_backward(*outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        outs, views = ctx.saved_tensors, ctx.views
        grads = tuple(torch.zeros_like(o) if g is None else g.contiguous() for o, g in zip(outs, grads))
        sg = [o * g for o, g in zip(outs, grads)]
        dot = torch.zeros((views[0].csr.n_dst,) + tuple(outs[0].shape[1:]), dtype=outs[0].dtype, device=outs[0].device)
        for x, view in zip(sg, views):
            if x.shape[0]:
                dot += torch.segment_reduce(x, "sum", offsets=view.csr.indptr, unsafe=True)
        return (None, *(x.sub_(o * dot.index_select(0, view.dst)) for x, o, view in zip(sg, outs, views)))
