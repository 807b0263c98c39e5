"""Sampled minibatches on several workers: DistDGL's `dp-sample` and P3's `pushpull` on the pushed layer-1 block.

Why this module exists: with `--fanout` and several workers each rank
trains the seeds of every global minibatch that it owns (the partition
decides), on the blocks it samples for them. Sampling is counter-based
(gnnc.graph.sampling), so a rank draws for its seeds exactly the edges one
process draws for them, the loss is normalised by the global batch size and
the gradients are summed: an exact strategy computes the one-process step.
Evaluation is one process's (gnnc.runtime.minibatch: the labelled vertices on
sampled blocks), each rank evaluating the labelled vertices it owns through
the same exchanges, not counted in the bytes; its sampling does not depend on
which rank evaluates a vertex, so N ranks evaluate what one process does.

Two ways of feeding the first graph layer (the strategy of that layer in the IR):

* `dp-sample` (rows): a rank holds its vertices' feature rows; before a step
  it asks the owners for the rows of the sampled remote sources of its first
  block (op `pull_ids`: the ids, int32 where ids fit) and they send them (op
  `halo`: F floats each). Everything after is local; gradients all-reduced.
* `pushpull` (columns, P3 section 3.2): a rank holds a slice of every
  vertex's features. Each rank pushes its first block's structure to every
  rank (`<layer>.structure/all_gather`: the packed block, gnnc.graph.sampling
  .pack_block, int32 where ids fit, edge ids only when the layer drops edges), every rank runs all ranks' first blocks on its slice (a
  partial sum of the layer), the partials are reduced at the owners
  (`reduce_scatter`), the rest runs data-parallel, and the backward pushes
  the layer's output gradient to every rank (`all_gather`, direction bwd).
  The weights of the dense maps on the slice (W1, gnnc.plan.slices.split_weights)
  stay split: a rank holds and updates its slice's rows, never all-reduced.
  Under P3's 2F2B schedule a minibatch's push is posted a tick before its use
  (`start_prepare`) and waited on just before its model-parallel forward
  (`finish_prepare`); the sequential schedule waits at once.

Control messages (the sizes exchanged before a variable-size collective, P
integers) are not counted; everything else is the logical payload, as
gnnc.runtime.comm counts it, so the planner's dry run predicts it exactly.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.graph import sparse_if_sparse
from gnnc.graph.sampling import (Block, SamplingConfig, index_bytes, merge_blocks, pack_block, reads_edge_ids,
                                 unpack_block)
from gnnc.ir import Program
from gnnc.ir.text import parse_ir
from gnnc.plan.halo import HaloPlan
from gnnc.plan.sampled_shards import load_sampled_rank
from gnnc.plan.slices import split_weights
from gnnc.runtime import comm
from gnnc.runtime.distributed import DistWorker, _gather_rows, train_and_report
from gnnc.runtime.executor import ExecContext, check_dims_fit, init_state
from gnnc.runtime.launch import DistConfig
from gnnc.graph.store import release_pages
from gnnc.runtime.minibatch import (EVALUATION, BlockRunner, Flight, MinibatchWorker, block_view, eval_batch_size,
                                   gather_rows, labelled_ids)
from gnnc.runtime.train import RunResult, TrainConfig


@dataclass(frozen=True)
class SampledJob:
    """Everything a rank of a sampled run needs, decided before any process starts."""

    ir: str
    shard_dir: str
    train: TrainConfig
    sampling: SamplingConfig
    schedule: str = "sequential"
    metrics_path: str | None = None
    want_logits: bool = False


class SlicedRunner(BlockRunner):
    """Push-pull's model-parallel phase: values computed from `x` hold this rank's feature slice, and a
    linear map of one uses the matching rows of its weight (a partial product, summed at the owners). P3's split
    weights (`split`) are held as those rows already; a weight also read elsewhere is whole and sliced here."""

    def __init__(self, program: Program, cols: tuple[int, int], split: frozenset[str]):
        super().__init__(program)
        self.cols, self.split = cols, split
        self.sliced: set[str] = set()

    def run(self, env, params, ctx, views, start=0, stop=None) -> None:
        if start == 0:
            self.sliced = {"x"}
        super().run(env, params, ctx, views, start, stop)

    def inputs_of(self, e, ins, ctx):
        sliced_in = any(v.name in self.sliced for v in e.ins)
        if e.op == "linear" and sliced_in:
            if e.ins[1].name not in self.split:
                ins = [ins[0], ins[1][self.cols[0]:self.cols[1]], *ins[2:]]
        elif sliced_in:
            self.sliced.update(o.name for o in e.outs)
        return ins


class DistMinibatchWorker(MinibatchWorker, DistWorker):
    """One rank of a sampled run: its seeds, its share of the features, and the exchanges of its strategy."""

    def __init__(self, cfg: DistConfig, job: SampledJob):
        from gnnc.runtime.memory import set_up_allocator  # deferred, as in the other workers

        set_up_allocator()
        torch.set_num_threads(1)
        program = parse_ir(job.ir)
        data = load_sampled_rank(job.shard_dir, cfg.rank, cfg.world_size)
        graph = data.graph
        check_dims_fit(program, data.num_features, graph.num_classes, graph.name, graph.y)
        self.rank, self.world_size = cfg.rank, cfg.world_size
        self.device = torch.device("cpu")  # sampled runs on several workers stay on the host (gnnc.api says so)
        self.program, self.cfg, self.stats = program, job.train, comm.CommStats()
        self.graph_name, self.num_nodes = graph.name, graph.num_nodes
        self.parts = data.parts
        self.owned_ids = np.nonzero(self.parts == cfg.rank)[0]
        self.local_row = np.full(graph.num_nodes, -1, dtype=np.int64)
        self.local_row[self.owned_ids] = np.arange(len(self.owned_ids))
        self.layout, self.cols, self.features = data.layout, data.cols, data.features
        self.labels = graph.y
        self.train_mask = graph.train_mask
        self.train_ids = np.nonzero(graph.train_mask.numpy())[0]
        own = torch.from_numpy(self.owned_ids)
        self.inputs = {"y": graph.y[own], "train": graph.train_mask[own], "val": graph.val_mask[own],
                       "test": graph.test_mask[own]}
        self.labelled = labelled_ids(graph.train_mask, graph.val_mask, graph.test_mask)
        self.eval_ids = self.labelled[self.parts[self.labelled] == cfg.rank]  # the ones this rank evaluates
        self.eval_most = int(np.bincount(self.parts[self.labelled], minlength=cfg.world_size).max())
        mine = torch.from_numpy(self.eval_ids)
        self.eval_inputs = {"y": graph.y[mine], "train": graph.train_mask[mine], "val": graph.val_mask[mine],
                            "test": graph.test_mask[mine]}
        self.views, self.ids = {}, torch.zeros(0, dtype=torch.int64)
        self.state, self.hoisted = init_state(program), {}  # as Worker's (a minibatch's context drops the cache)
        self.count = max(float(len(self.train_ids)), 1.0)
        self.exchange = None
        self._reducer = None
        self._setup_sampling(program, graph, job.sampling, job.schedule)
        self.first = program.graph_layers()[0].name
        # ids travel as int32 where every id fits; a pushed block carries edge ids only when its layer drops edges
        self.index_dtype = np.dtype(f"int{8 * index_bytes(graph.num_nodes, graph.num_edges)}")
        self.edge_ids = reads_edge_ids(program.graph_layers()[0])
        if self.layout == "columns":
            # P3's split W1 (section 3.2.2): each rank holds, differentiates and updates its slice's rows only
            # (DistWorker.initial_params cuts them, its all-reduce leaves them out), as full-graph push-pull does
            self.split = split_weights(program)
            self.m_runner = SlicedRunner(program, self.cols, self.split)

    # --- which seeds, which inputs -------------------------------------------------------------------------

    def my_seeds(self, seeds: np.ndarray) -> np.ndarray:
        return seeds[self.parts[seeds] == self.rank]

    def batch_inputs(self, mb) -> dict[str, torch.Tensor]:
        n = len(mb.seeds)
        seeds = torch.from_numpy(mb.seeds)
        x = sparse_if_sparse(self.pull_rows(mb.blocks[0].src_ids)) if self.layout == "rows" else torch.zeros(0)
        release_pages(self.structure)  # the pages of its features this rank's answers to the others read
        # the seeds' own train mask: a training batch's are all True, but the evaluation's seeds are every owned
        # vertex, and an unlabelled one (y = UNLABELLED, papers100M's 98.6%) in the loss's mask is an IndexError
        return {"x": x, "y": self.labels[seeds], "train": self.train_mask[seeds],
                "val": torch.zeros(n, dtype=torch.bool), "test": torch.zeros(n, dtype=torch.bool)}

    def pull_rows(self, ids: np.ndarray) -> torch.Tensor:
        """dp-sample: the feature rows of `ids`, the remote ones fetched from their owners."""
        owner = self.parts[ids]
        remote = np.nonzero(owner != self.rank)[0]
        order = remote[np.argsort(owner[remote], kind="stable")]  # requests grouped by owner
        counts = np.bincount(owner[order], minlength=self.world_size)
        told = torch.empty(self.world_size, dtype=torch.int64)
        dist.all_to_all_single(told, torch.from_numpy(counts))  # sizes: a control message, not counted
        request = torch.from_numpy(ids[order].astype(self.index_dtype))
        asked = torch.empty(int(told.sum()), dtype=request.dtype)
        dist.all_to_all_single(asked, request, output_split_sizes=told.tolist(), input_split_sizes=counts.tolist())
        self.stats.add_bytes(self.first, "pull_ids", "fwd", request.numel() * request.element_size())
        # the asked rows gathered a region of the mapped features at a time (gather_rows): indexed by the exchange,
        # a few thousand scattered rows made this rank's whole feature file resident
        served = gather_rows(self.features, self.local_row[asked.numpy().astype(np.int64)], self.structure)
        send = torch.split(torch.arange(served.shape[0]), told.tolist())
        plan = HaloPlan(tuple(s.contiguous() for s in send), tuple(int(c) for c in counts))
        got = comm.halo_exchange(served, plan, self.stats, label=self.first, method="all_to_all")
        x = torch.empty((len(ids), self.features.shape[1]), dtype=self.features.dtype)
        local = owner == self.rank
        x[torch.from_numpy(np.nonzero(local)[0])] = gather_rows(self.features, self.local_row[ids[local]],
                                                                self.structure)
        x[torch.from_numpy(order)] = got
        return x

    def start_prepare(self, epoch, index, seeds, step, weights, fanouts=None, training=True) -> Flight:
        f = super().start_prepare(epoch, index, seeds, step, weights, fanouts, training)
        if self.layout == "columns":
            f.pushed = self.post_push(f.batch.blocks[0])
        return f

    def finish_prepare(self, f: Flight) -> None:
        if self.layout != "columns":
            return
        t0 = time.perf_counter()
        blocks = self.finish_push(f.batch.blocks[0], f.pushed)
        f.pushed = None
        t1 = time.perf_counter()
        merged = merge_blocks(blocks)
        f.sizes = [b.n_dst for b in blocks]
        layer0 = self.program.graph_layers()[0]
        f.views[self.first] = block_view(merged, self.sampler.views[layer0.edges], self.structure)
        ids = torch.from_numpy(merged.src_ids)
        f.env["x"] = sparse_if_sparse(gather_rows(self.features, merged.src_ids, self.structure))
        f.m_ctx = dataclasses.replace(f.ctx, vertex_ids=ids, col_offset=self.cols[0])
        f.phase_s.update(push_wait=t1 - t0, slice=time.perf_counter() - t1)

    def post_push(self, block: Block) -> comm.Posted:
        """P3's push: every rank's first block to every rank (an all-gather of the packed blocks), posted; the
        sizes travel first and are waited on (a control message of P integers)."""
        flat = torch.from_numpy(pack_block(block, self.index_dtype, self.edge_ids))
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([flat.numel()], dtype=torch.int64))  # control: not counted
        counts = [int(t) for t in sizes]
        return comm.post_all_gather(flat, counts, self.stats, label=f"{self.first}.structure")

    def finish_push(self, block: Block, posted: comm.Posted) -> list[Block]:
        """The pushed blocks of every rank, this rank's own as it is."""
        pieces = torch.split(posted.wait(), posted.op.sizes)
        return [block if r == self.rank else unpack_block(p.numpy(), self.edge_ids) for r, p in enumerate(pieces)]

    # --- push-pull's exchanges around the first layer's sync -----------------------------------------------

    def m_context(self, f: Flight) -> ExecContext:
        return f.m_ctx if self.layout == "columns" else f.ctx

    def start_sync(self, f: Flight) -> None:
        if self.layout != "columns":
            return super().start_sync(f)
        f.pending = comm.post_reduce_scatter(f.partial, f.sizes, self.stats, label=self.first)

    def finish_sync(self, f: Flight) -> torch.Tensor:
        return f.pending.wait() if self.layout == "columns" else super().finish_sync(f)

    def start_sync_grad(self, f: Flight) -> None:
        super().start_sync_grad(f)
        if self.layout == "columns":
            f.pending = comm.post_all_gather(f.pending, f.sizes, self.stats, label=self.first, direction="bwd")

    def finish_sync_grad(self, f: Flight) -> torch.Tensor:
        return f.pending.wait() if self.layout == "columns" else super().finish_sync_grad(f)

    # --- evaluation, reporting ---------------------------------------------------------------------------

    def eval_batches(self) -> list[np.ndarray]:
        """This rank's labelled vertices in batches of its share of one process's evaluation batch (a training
        batch's seeds are shared too), as many batches as the rank with the most has (each batch is a collective:
        a rank with fewer runs empty ones). A whole batch per rank was twice a training step's seeds, and a
        partition that keeps the hubs together (Fennel on R-MAT's, part 0) makes those the largest blocks."""
        size = -(-eval_batch_size(self.sampling) // self.world_size)
        return [self.eval_ids[k * size:(k + 1) * size] for k in range(max(-(-self.eval_most // size), 1))]

    def owned(self, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return logits, self.eval_inputs

    def train_vertices(self) -> int:
        return len(self.train_ids)

    def graph_tensors(self) -> list[torch.Tensor]:
        return [self.features, torch.from_numpy(self.parts), *(torch.from_numpy(v.indptr) for v in
                                                               self.sampler.views.values())]

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Every rank's evaluated rows on rank 0, in increasing vertex id (one process's logits)."""
        every = _gather_rows(logits.detach(), torch.from_numpy(self.eval_ids), self.num_nodes, self.rank,
                             self.world_size)
        if every is None:
            return None
        return every[torch.from_numpy(self.labelled)]


def sampled_worker(cfg: DistConfig, job: SampledJob) -> RunResult | None:
    """One rank's sampled training run; rank 0 returns the run's result (with the logits of the labelled vertices
    in increasing id order, as one process's)."""
    result = train_and_report(DistMinibatchWorker(cfg, job), cfg, job)
    if result is not None:
        result.evaluation = EVALUATION
    return result


def sampled_one_step(cfg: DistConfig, job: SampledJob, epoch: int = 0, index: int = 0) -> dict[str, Any] | None:
    """Minibatch `index` of `epoch` forward and backward once; rank 0 returns the loss, the summed gradients,
    the seeds' logits (global ids and rows) and the bytes every op sent, summed over ranks.
    The exactness tests compare it with one process."""
    w = DistMinibatchWorker(cfg, job)
    params = w.initial_params(job.train.seed)
    seeds = w.epoch_batches(epoch)[index]
    f = w.prepare(epoch, index, seeds, epoch * len(w.epoch_batches(epoch)) + index, params)
    w.forward_m(f)
    w.forward_d(f)
    w.backward_d(f)
    w.backward_m(f)
    w.reduce_grads(params)
    loss = w.sum(f.loss.detach().reshape(1))
    grads = w.whole_weights({k: p.grad.detach().clone() for k, p in params.items()})  # W1's slices assembled
    every: list[Any] = [None] * cfg.world_size
    mine = (f.batch.seeds, f.env[w.program.logits.name].detach(), w.stats.bytes_by("op"), w.stats.as_dict())
    dist.all_gather_object(every, mine)
    if cfg.rank != 0:
        return None
    by_op: dict[str, int] = {}
    by_key: dict[str, int] = {}
    for _, _, ops, keys in every:
        for k, v in ops.items():
            by_op[k] = by_op.get(k, 0) + v
        for k, v in keys.items():
            by_key[k] = by_key.get(k, 0) + int(v["bytes"])
    return {"loss": float(loss[0]), "grads": grads,
            "seeds": torch.from_numpy(np.concatenate([e[0] for e in every])), "logits": torch.cat([e[1] for e in every]),
            "bytes_by_op": by_op, "bytes": by_key}


def sampled_one_step_each(cfg: DistConfig, jobs: list[SampledJob]) -> list[dict[str, Any] | None]:
    """`sampled_one_step` for several jobs in one launch (the process start is the expensive part)."""
    return [sampled_one_step(cfg, job) for job in jobs]
