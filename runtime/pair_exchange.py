"""Link prediction on several ranks: the encoder as any distributed plan runs it, the pairs scored where their
sources live.

The encoder's layers run on each rank's rows exactly as a node model's do (gnnc.runtime.distributed: the plan's
partition, strategies and exchanges). A pair is scored on the rank owning its source (gnnc.plan.pair_rows); the
rows of its destination that other ranks own are fetched in one halo exchange per pair set (gnnc.runtime.comm's
`halo_exchange`, whose backward sends the fetched rows' gradients back and adds them at their owners): the
training positives' and the evaluation pairs' fetch lists are built once, the negatives' once per epoch, from the
negatives every rank draws identically from (seed, epoch). Each rank's loss is the sum of its pairs' losses over
the global pair count, so the ranks' losses add up to one process's mean and the summed parameter gradients are
one process's; a pair value's dropout is keyed by the pair's place in the whole set, as in one process.
Evaluation gathers every rank's scores (all-gather, in the set's order) so that every rank computes the same
metrics, which patience and the plateau schedule read.

Bytes (CommStats, op `halo`): labels `pairs` (the training positives), `negatives` (the epoch's negatives),
`pairs_eval` (validation and test pairs, forward only); predict-bytes' `predict_pair_bytes` counts the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gnnc.errors import GnncError
from gnnc.graph.edge_split import EdgeSplit
from gnnc.ir import Eqn, Program
from gnnc.plan.pair_rows import PairRows, pair_rows
from gnnc.plan.rows import LocalGraph
from gnnc.plan.schedule_attrs import program_schedule
from gnnc.runtime import comm, rng
from gnnc.runtime import device as devices
from gnnc.runtime.distributed import DistInterpreter, DistJob, DistWorker, FeaturePhase, grad_buckets
from gnnc.runtime.executor import ExecContext, forward
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.link_task import LinkSettings, draw_negatives, fit_link, pair_metrics
from gnnc.runtime.train import RunResult

TRAIN_LABEL, NEGATIVES_LABEL, EVAL_LABEL = "pairs", "negatives", "pairs_eval"
HALO_METHOD = "all_to_all"


@dataclass(frozen=True)
class LinkJob(DistJob):
    """A distributed link-prediction rank's job: the plan's (compiled on the message-passing graph) and the
    run's edge split (every rank scores its share of the same pairs)."""

    split: EdgeSplit | None = None


class PairSet:
    """Pieces of one pair set scored together (the training positives, then the epoch's negatives), each with
    its own fetch; `total` pairs in the whole set, across ranks."""

    def __init__(self, pieces: list[tuple[PairRows, str, int]], total: int, n_owned: int):
        """`pieces`: (this rank's rows of a piece, its bytes label, the place of its first pair in the set)."""
        self.pieces, self.total, self.n_owned = pieces, total, n_owned
        self.index = torch.cat([rows.index + start for rows, _, start in pieces])
        self.src = torch.cat([rows.src for rows, _, _ in pieces])
        dst, fetched = [], 0
        for rows, _, _ in pieces:  # a piece's fetched rows follow those of the pieces before it
            dst.append(torch.where(rows.dst >= n_owned, rows.dst + fetched, rows.dst))
            fetched += rows.fetch.n_halo
        self.dst = torch.cat(dst)

    def destinations(self, z: torch.Tensor, stats: comm.CommStats,
                     wire: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The destination rows of this rank's pairs: its own rows of `z`, and the remote ones fetched."""
        own = z[: self.n_owned]
        got = [comm.halo_exchange(wire(own), rows.fetch, stats, label=label, method=HALO_METHOD).to(own.dtype)
               for rows, label, _ in self.pieces]
        return torch.cat([own, *got])[self.dst]


class PairInterpreter(DistInterpreter):
    """The distributed interpreter with the pair ops on this rank's share of the pair set in use (`pairs`, set
    before each forward), its exchanges counted in `stats`, rows sent in the run's precision (`wire`)."""

    def __init__(self, program: Program, lg: LocalGraph, phase: FeaturePhase | None, stats: comm.CommStats,
                 wire: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__(program, lg, phase)
        self.stats, self.wire = stats, wire
        self.pairs: PairSet | None = None

    def compute(self, e: Eqn, ins: list[torch.Tensor], view, ctx: ExecContext) -> torch.Tensor:
        ps = self.pairs
        if e.op == "pair_src":
            assert ps is not None
            return ins[0][ps.src]
        if e.op == "pair_dst":
            assert ps is not None
            return ps.destinations(ins[0], self.stats, self.wire)
        if e.op == "bce" and len(ins) == 2:  # this rank's share of the mean over the whole set
            assert ps is not None
            return F.binary_cross_entropy_with_logits(ins[0].float().reshape(-1), ins[1].float(),
                                                      reduction="sum") / ps.total
        if e.op == "dropout" and e.outs[0].type.domain == "pair" and ctx.training:
            assert ps is not None  # keyed by the pair's place in the whole set, as one process keys it
            return rng.dropout(ins[0], ctx.dropout_key(rng.dropout_stream(e)), ps.index, float(e.attr("p")),
                               ctx.col_offset)
        return super().compute(e, ins, view, ctx)


class DistLinkWorker(DistWorker):
    """One rank of a distributed link-prediction run (module docstring); `fit_link` trains it."""

    def __init__(self, cfg: DistConfig, job: LinkJob):
        super().__init__(cfg, job)
        if job.split is None:
            raise AssertionError("a link-prediction rank needs the run's edge split")
        if self.split:
            raise GnncError("link prediction on several ranks does not run P3's push-pull (split weights) yet")
        self.settings = LinkSettings.of(self.program)
        self.interp = PairInterpreter(self.program, self.lg, self.interp.phase, self.stats, self.exchange.wire)
        # every vertex's owner and its row there: each rank builds every rank's fetch lists from them
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, self.lg.owned.cpu())
        owner = torch.empty(self.num_nodes, dtype=torch.int64)
        local = torch.empty(self.num_nodes, dtype=torch.int64)
        for r, ids in enumerate(every):
            owner[ids], local[ids] = r, torch.arange(ids.shape[0])
        self.owner, self.local = owner.to(self.device), local.to(self.device)
        split = job.split
        as_t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=self.device)  # noqa: E731
        self.message_keys = as_t(split.message_keys)
        self.train_pos = as_t(split.train_pos)
        self.num_negatives = split.train_negatives()
        self.train_rows = self.rows(self.train_pos)
        parts = [split.val_pos, split.val_neg, split.test_pos, split.test_neg]
        self.eval_sizes = [p.shape[1] for p in parts]
        eval_pairs = as_t(torch.cat([torch.as_tensor(p) for p in parts], 1))
        self.eval_set = PairSet([(self.rows(eval_pairs), EVAL_LABEL, 0)], eval_pairs.shape[1], self.lg.n_owned)
        self._step_bytes, self._sent = 0, (0, 0)
        self.eval_labels = torch.cat([torch.full((n,), float(k % 2 == 0)) for k, n in enumerate(self.eval_sizes)]
                                     ).to(self.device)

    def bytes_sent(self) -> tuple[int, int]:
        """The last training step's and evaluation's bytes, every rank's (summed in `evaluate`)."""
        return self._sent

    def rows(self, pairs: torch.Tensor) -> PairRows:
        return pair_rows(pairs[0], pairs[1], self.owner, self.local, self.rank, self.world_size, self.lg.n_owned)

    def negatives(self, epoch: int) -> torch.Tensor:
        return draw_negatives(self.cfg.seed, epoch, self.num_nodes, self.num_negatives, self.message_keys)

    def training_set(self, epoch: int) -> tuple[PairSet, torch.Tensor]:
        """The epoch's training pairs (positives, then its negatives) and their labels, this rank's share."""
        neg = self.negatives(epoch)
        k_pos = self.train_pos.shape[1]
        ps = PairSet([(self.train_rows, TRAIN_LABEL, 0), (self.rows(neg), NEGATIVES_LABEL, k_pos)],
                     k_pos + neg.shape[1], self.lg.n_owned)
        return ps, (ps.index < k_pos).to(torch.float32)

    def score(self, params, training: bool, epoch: int, ps: PairSet,
              labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores of this rank's pairs of `ps`, its share of the loss)."""
        if self._reducer is None:  # as DistWorker.forward: hooked before the first backward
            self._reducer = comm.GradAllReduce(self.replicated(params), self.stats,
                                               buckets=grad_buckets(self.program, self.split),
                                               overlap=program_schedule(self.program).grad_overlap)
        self.interp.pairs = ps
        with devices.autocast(self.device, self.cfg.precision):
            return forward(self.interp, params, {**self.inputs, "label": labels}, self.context(training, epoch))

    def train_step(self, params, opt: torch.optim.Optimizer, epoch: int) -> torch.Tensor:
        """One epoch's step; returns the whole loss (summed over ranks)."""
        self.stats.reset()
        ps, labels = self.training_set(epoch)
        opt.zero_grad(set_to_none=True)
        _, loss = self.score(params, True, epoch, ps, labels)
        loss.backward()
        self.reduce_grads(params)
        if self.cfg.clip is not None:
            self.clip_grads(params, self.cfg.clip)
        opt.step()
        self._step_bytes = self.stats.total_bytes()
        return self.sum(loss.detach().reshape(1))[0]

    def gather_scores(self, scores: torch.Tensor, ps: PairSet) -> torch.Tensor:
        """Every rank's scores of `ps`, in the set's order, on every rank's host."""
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, (ps.index.cpu(), scores.detach().float().reshape(-1).cpu()))
        out = torch.empty(ps.total, dtype=torch.float32)
        for index, got in every:
            out[index] = got
        return out

    def evaluate(self, params, epoch: int) -> list[float]:
        """[val auc, hits, mrr, test auc, hits, mrr], the same on every rank."""
        self.stats.reset()
        with torch.no_grad():
            scores, _ = self.score(params, False, epoch, self.eval_set, self.eval_labels[self.eval_set.index])
        local = torch.tensor([self._step_bytes, self.stats.total_bytes()], dtype=torch.int64, device=self.device)
        self._sent = tuple(int(b) for b in self.sum(local).tolist())
        vp, vn, tp, tn = torch.split(self.gather_scores(scores, self.eval_set), self.eval_sizes)
        k = self.settings.hits_k
        return pair_metrics(vp, vn, k) + pair_metrics(tp, tn, k)


def link_worker(cfg: DistConfig, job: LinkJob) -> RunResult | None:
    """One rank's link-prediction run; rank 0 returns the run's result."""
    from gnnc.runtime.metrics import peak_rss_bytes  # deferred: as train_and_report's

    w = DistLinkWorker(cfg, job)
    result = fit_link(w, job.train)
    peak = w.max(torch.tensor([float(peak_rss_bytes())], dtype=torch.float64, device=w.device)).cpu()
    if cfg.rank != 0:
        return None
    result.graph, result.world_size, result.peak_rss_bytes = w.graph_name, cfg.world_size, int(peak[0])
    result.strategies = [layer.attr("strategy") for layer in w.program.graph_layers()]
    return result


def link_steps(cfg: DistConfig, job: LinkJob, epochs: list[int]) -> list[dict[str, Any]] | None:
    """For each epoch of `epochs`, from the initial parameters: one training step's forward and backward (no
    update) and an evaluation forward; rank 0 returns the scores in the sets' order, the loss, the summed
    gradients and the bytes of the step (by label, every rank's) and of the evaluation. The exactness tests
    compare these with one process."""
    w = DistLinkWorker(cfg, job)
    params = w.initial_params(job.train.seed)
    out = []
    for epoch in epochs:
        for p in params.values():
            p.grad = None
        w.stats.reset()
        ps, labels = w.training_set(epoch)
        scores, loss = w.score(params, True, epoch, ps, labels)
        loss.backward()
        w.reduce_grads(params)
        step_bytes = _bytes_by_label(w)
        w.stats.reset()
        with torch.no_grad():
            eval_scores, _ = w.score(params, False, epoch, w.eval_set, w.eval_labels[w.eval_set.index])
        eval_bytes = _bytes_by_label(w)
        out.append({"scores": w.gather_scores(scores, ps), "loss": float(w.sum(loss.detach().reshape(1))[0]),
                    "eval_scores": w.gather_scores(eval_scores, w.eval_set),
                    "grads": {k: p.grad.detach().to("cpu", copy=True) for k, p in params.items()},
                    "bytes": step_bytes, "eval_bytes": eval_bytes})
    return out if cfg.rank == 0 else None


def _bytes_by_label(w: DistWorker) -> dict[str, int]:
    """Every rank's bytes since the last reset, by (label, direction) `label/dir` keys, summed (a collective)."""
    every: list[Any] = [None] * w.world_size
    dist.all_gather_object(every, {f"{label}/{op}/{d}": c.bytes for (label, op, d), c in w.stats.counts.items()})
    total: dict[str, int] = {}
    for per_rank in every:
        for key, nbytes in per_rank.items():
            total[key] = total.get(key, 0) + nbytes
    return total
