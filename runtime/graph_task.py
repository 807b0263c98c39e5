"""Graph classification: train a program that reads out graph rows on mini-batches of many graphs.

Each step takes one batch of training graphs (gnnc.graph.graph_batches: shuffled per epoch, seeded) as one
block-diagonal graph and runs the reference interpreter on it with the batch vector in the context (the
readouts reduce vertex rows into graph rows), the loss being the mean cross-entropy over the batch's graphs.
After every epoch the validation and test graphs are evaluated (batch_norm on its running statistics, no
dropout); `test_acc` is the test accuracy at the epoch of best validation accuracy, as for node classification
(gnnc.runtime.train), `final_test_acc` the last epoch's.

Data-parallel on N ranks: every rank draws the same batches, takes its share of each batch's graphs (contiguous,
`np.array_split`), computes the loss of its graphs divided by the batch's whole graph count, and the gradients
are summed over the ranks before the same optimizer step everywhere; batch_norm's statistics are summed over
the ranks' vertices (gnnc.runtime.comm.all_reduce_sum), and dropout masks are keyed by dataset node, edge and graph
ids. So N ranks compute what one process computes (tests/test_graph_classification_dist.py checks logits and
gradients to 1e-5 on 2 gloo processes).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.graph import GraphView
from gnnc.graph.graph_batches import (DEFAULT_BATCH_SIZE, DEFAULT_FOLDS, GraphBatch, epoch_batches, eval_batches,
                                      fold_split, make_batch, stratified_folds)
from gnnc.graph.tu_dataset import GraphDataset, load_graph_dataset
from gnnc.ir import Program
from gnnc.ir.text import parse_ir
from gnnc.runtime import comm, rng
from gnnc.runtime.executor import ExecContext, Interpreter, check_dims_fit, forward, init_params, init_state
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.train import RunResult, TrainConfig, TrainingDiverged, host_weights, make_optimizer


@dataclass(frozen=True)
class GraphSplit:
    """Which graphs train, validate and test: run `fold` of `folds`-fold stratified cross validation, the folds
    drawn with `seed` (gnnc.graph.graph_batches)."""

    folds: int = DEFAULT_FOLDS
    fold: int = 0
    seed: int = 0


@dataclass(frozen=True)
class GraphJob:
    """What a rank of a data-parallel run needs: the compiled program's text, the dataset's spec, the settings.
    `probe`: also return the first step's logits and summed gradients (the exactness test reads them)."""

    program: str
    dataset: str
    cfg: TrainConfig
    split: GraphSplit
    batch_size: int
    probe: bool = False


class _RankComm:
    """What batch_norm asks of a distributed context: the rows this rank owns (all of its batch share's) and a
    differentiable sum over ranks."""

    def __init__(self, stats: comm.CommStats) -> None:
        self.stats, self.rows = stats, 0

    def owned_rows(self) -> int:
        return self.rows

    def all_reduce(self, t: torch.Tensor, e: Any) -> torch.Tensor:
        return comm.all_reduce_sum(t, self.stats, label=e.outs[0].name)


def dataset_edge_ids(view: GraphView, b: GraphBatch, name: str, num_edges: int) -> GraphView:
    """`view` (of batch `b`'s graph) with its edges' ids the dataset's, which key dropout of edge values: a view's
    own ids are places in the batch, so a rank's share of a batch would draw other masks than the whole batch
    in one process. A self-loop the view adds to vertex v is edge `num_edges + v` (v the dataset's id)."""
    keys = b.edge_ids
    if name == "self_loops":  # the view's edges: the graph's other than loops, then one loop per vertex
        keep = torch.from_numpy(b.graph.src != b.graph.dst)
        keys = torch.cat([keys[keep], num_edges + b.node_ids])
    elif name != "plain":
        raise AssertionError(f"edge view {name!r}: graph_task knows the dataset's ids of plain and self_loops only")
    return dataclasses.replace(view, edge_ids=keys[view.edge_ids])


def batch_size_of(program: Program) -> int:
    """The program's `training(batch_size = B)`, PyG's GIN example's 128 without one."""
    return int(dict(program.training).get("batch_size", DEFAULT_BATCH_SIZE))


class GraphTrainer:
    """One process's part of a graph-classification run (rank `rank` of `world`; 0 of 1 alone)."""

    def __init__(self, program: Program, ds: GraphDataset, cfg: TrainConfig, split: GraphSplit, batch_size: int,
                 rank: int = 0, world: int = 1) -> None:
        check_dims_fit(program, ds.num_features, ds.num_classes, ds.name)
        self.program, self.ds, self.cfg, self.batch_size = program, ds, cfg, batch_size
        self.rank, self.world = rank, world
        self.train_ids, self.val_ids, self.test_ids = fold_split(stratified_folds(ds.y, split.folds, split.seed),
                                                                 split.fold)
        self.edge_ptr = ds.edge_ptr()
        self.interp = Interpreter(program)
        self.views = sorted({layer.edges for layer in program.graph_layers()})
        self.config = program.config_dict()
        self.params = init_params(program, cfg.seed)
        self.state = init_state(program)
        self.opt = make_optimizer(program, self.params, cfg)
        self.stats = comm.CommStats()
        self.comm = _RankComm(self.stats) if world > 1 else None
        self.eval_batches: dict[str, list[tuple[GraphBatch, dict[str, GraphView]]]] = {}

    def share(self, ids: np.ndarray) -> np.ndarray:
        """This rank's graphs of a batch: a contiguous share, so the ranks' rows in order are the batch's."""
        return np.array_split(ids, self.world)[self.rank]

    def _forward(self, b: GraphBatch, training: bool, key: int,
                 views: dict[str, GraphView] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        n_graphs = len(b.graph_ids)
        ones = torch.ones(n_graphs, dtype=torch.bool)
        inputs = {"x": b.graph.x, "y": b.y, "train": ones, "val": ones, "test": ones}
        if self.comm is not None:
            self.comm.rows = b.graph.num_nodes
        views = views if views is not None else self._views(b)
        ctx = ExecContext(views, b.node_ids, self.config, training,
                          lambda i, key=key: rng.stream_key(key, i), float(self.loss_count), self.cfg.use_kernels,
                          comm=self.comm, state=self.state, batch=b.batch, graph_ids=b.graph_ids)
        return forward(self.interp, self.params, inputs, ctx)

    def _views(self, b: GraphBatch) -> dict[str, GraphView]:
        return {v: dataset_edge_ids(GraphView.build(b.graph, v), b, v, len(self.ds.src)) for v in self.views}

    def step(self, ids: np.ndarray, epoch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step on batch `ids` (every rank passes the whole batch); returns (this rank's logits, the
        batch's loss summed over ranks)."""
        self.loss_count = max(len(ids), 1)
        b = make_batch(self.ds, self.share(ids), self.edge_ptr)
        self.opt.zero_grad(set_to_none=True)
        logits, loss = self._forward(b, True, rng.stream_key(self.cfg.seed, epoch, k))
        loss.backward()
        self.reduce_grads()
        if self.cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_([p for p in self.params.values() if p.grad is not None], self.cfg.clip)
        self.opt.step()
        return logits.detach(), self.sum(loss.detach().reshape(1))[0]

    def reduce_grads(self) -> None:
        """Sum every gradient over the ranks (one flat all-reduce; a parameter this rank left without one is 0)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params.values()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.stats.add_bytes("grads", "allreduce", "bwd",
                             comm.allreduce_payload_bytes(flat.numel(), flat.element_size(), self.rank, self.world))
        dist.all_reduce(flat)
        offset = 0
        for p in self.params.values():
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            dist.all_reduce(t)
        return t

    @torch.no_grad()
    def accuracy(self, which: str) -> float:
        """The accuracy over the "val" or "test" graphs (every rank evaluates its share of each batch; the counts
        are summed). Their batches and views are built once: they are the same every epoch."""
        correct = torch.zeros(2, dtype=torch.float64)
        if which not in self.eval_batches:
            ids = self.val_ids if which == "val" else self.test_ids
            built = [make_batch(self.ds, self.share(batch), self.edge_ptr) for batch in eval_batches(ids, self.batch_size)]
            self.eval_batches[which] = [(b, self._views(b)) for b in built]
        for b, views in self.eval_batches[which]:
            self.loss_count = max(len(b.graph_ids), 1)  # not read: evaluation computes no gradient
            logits, _ = self._forward(b, False, 0, views)
            correct += torch.tensor([float((logits.argmax(-1) == b.y).sum()), float(len(b.y))], dtype=torch.float64)
        correct = self.sum(correct)
        return float(correct[0] / max(float(correct[1]), 1.0))

    def fit(self, progress: bool = False) -> RunResult:
        best_val, best_test, best_epoch, history, times = -1.0, 0.0, 0, [], []
        test_acc = val_acc = 0.0
        loss_sum = 0.0
        for epoch in range(self.cfg.epochs):
            start = time.perf_counter()
            self.stats.reset()
            batches = epoch_batches(self.train_ids, self.batch_size, self.cfg.seed, epoch)
            losses = [self.step(ids, epoch, k)[1] for k, ids in enumerate(batches)]
            times.append(time.perf_counter() - start)
            # what every rank's training steps sent (gradients, batch_norm's statistics), before the evaluation
            sent = int(self.sum(torch.tensor([float(self.stats.total_bytes())], dtype=torch.float64))[0])
            loss_sum = float(sum(float(l) * len(ids) for l, ids in zip(losses, batches)) / len(self.train_ids))
            if not np.isfinite(loss_sum):
                raise TrainingDiverged(f"the training loss is {loss_sum} at epoch {epoch}: training stopped "
                                       "(lower the learning rate)")
            val_acc, test_acc = self.accuracy("val"), self.accuracy("test")
            history.append({"epoch": epoch, "train_loss": loss_sum, "val_acc": val_acc, "test_acc": test_acc,
                            "bytes_sent": sent})
            if val_acc > best_val:
                best_val, best_test, best_epoch = val_acc, test_acc, epoch
            if progress and self.rank == 0:
                print(f"epoch {epoch:4d} loss {loss_sum:.4f} val {val_acc:.4f} test {test_acc:.4f}", file=sys.stderr,
                      flush=True)
        steady = times[1:] or times
        return RunResult(test_acc=best_test, val_acc=best_val, final_test_acc=test_acc, train_loss=loss_sum,
                         epoch_time_s=statistics.median(steady), logits=None, history=history, best_epoch=best_epoch,
                         graph=self.ds.name, world_size=self.world, strategies=["data-parallel"] if self.world > 1
                         else ["local"], weights=host_weights({**self.params, **self.state}),
                         bytes_sent_per_epoch=history[-1]["bytes_sent"], threads=torch.get_num_threads(),
                         threads_reason=self.cfg.threads_reason)

    def probe(self) -> dict[str, Any]:
        """The first training batch's step: every graph's logits (rows in batch order, summed over ranks into
        place) and the gradients summed over ranks, before the optimizer moves anything."""
        ids = epoch_batches(self.train_ids, self.batch_size, self.cfg.seed, 0)[0]
        self.loss_count = len(ids)
        b = make_batch(self.ds, self.share(ids), self.edge_ptr)
        logits, loss = self._forward(b, True, rng.stream_key(self.cfg.seed, 0, 0))
        loss.backward()
        self.reduce_grads()
        start = sum(len(s) for s in np.array_split(ids, self.world)[:self.rank])
        full = torch.zeros(len(ids), logits.shape[1])
        full[start:start + logits.shape[0]] = logits.detach()
        return {"logits": self.sum(full), "loss": self.sum(loss.detach().reshape(1)),
                "grads": {k: p.grad.clone() for k, p in self.params.items() if p.grad is not None}}


def train_graphs(program: Program, ds: GraphDataset, cfg: TrainConfig, split: GraphSplit,
                 batch_size: int | None = None) -> RunResult:
    """Train in this process (gnnc.graph_classification.run calls it for one process)."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    trainer = GraphTrainer(program, ds, cfg, split, batch_size or batch_size_of(program))
    return trainer.fit(cfg.progress)


def graph_worker(dist_cfg: DistConfig, job: GraphJob) -> Any:
    """A rank of a data-parallel run (gnnc.runtime.launch starts it): rank 0's RunResult (or probe), None elsewhere."""
    if job.cfg.threads is not None:
        torch.set_num_threads(job.cfg.threads)
    program = parse_ir(job.program, "<graph classification plan>")
    trainer = GraphTrainer(program, load_graph_dataset(job.dataset), job.cfg, job.split, job.batch_size,
                           dist_cfg.rank, dist_cfg.world_size)
    out = trainer.probe() if job.probe else trainer.fit(job.cfg.progress)
    return out if dist_cfg.rank == 0 else None
