"""Sampled minibatch training: every step runs the program's IR on one minibatch's blocks.

Why this module exists: the IR does not change for minibatches. A block
(gnnc.graph.sampling) becomes a GraphView with n_src != n_dst, each graph
layer runs on its own block, and because a block's destinations are the first
of its sources every row set of a step is a prefix of the first block's
sources, which `PrefixRowsInterpreter` already handles (as it does for the
distributed row sets). The loss of a step averages over the batch's seeds.

Evaluation runs on the labelled vertices only (those of the train, val or test
mask; `EVALUATION` says so in a run's --json), in batches of the batch size
(at least `EVAL_SEEDS`), each on sampled blocks with the run's fan-outs,
without dropout. Every vertex
of a large graph would not fit: papers100M's 98.6% unlabelled vertices would
need whole [N, hidden] layers (11 GB each at one tenth of it), and a full
neighbourhood of a few thousand seeds is most of such a graph. Its sampling
draws from one stream per epoch (`EVAL_INDEX`, not a batch's): sampling is
counter-based, so each vertex gets the same blocks whichever batch or rank
evaluates it, and one process and N ranks evaluate alike.

A step is four phases, so that P3's pipeline can interleave minibatches:
the model-parallel forward (the equations up to the first graph layer's
sync), the exchange at that sync, the data-parallel forward and backward of
the rest, the exchange of the sync's gradient, and the model-parallel
backward. `SEQUENTIAL` runs them in that order, one minibatch at a time, on
the current weights (exact). `P3_2F2B` (approximate, `--approximate`) keeps
three minibatches in flight, two forward and two backward phases per tick,
each minibatch on the weights it was given (weight stashing) and those lag
the optimizer by `staleness` steps: w_{t+1} = w_t - lr * grad f(w_{t-3}), as
P3's equation (3). One process has nothing to overlap, but it trains with
the same weights, so its accuracy is that of the distributed pipeline
(gnnc.runtime.minibatch_dist supplies the exchanges there).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.graph import CSR, Graph, GraphView, sparse_if_sparse
from gnnc.graph.storage import view_edge_data
from gnnc.graph.store import mapped_files, release_pages
from gnnc.graph.sampling import Block, MiniBatch, NeighbourSampler, SamplingConfig, SamplingView, take
from gnnc.ir import Program
from gnnc.plan.comm_ops import exchange_of
from gnnc.plan.schedules import SCHEDULES
from gnnc.runtime import device as devices
from gnnc.runtime.executor import ExecContext, PrefixRowsInterpreter, check_graph_fits, init_state
from gnnc.runtime.metrics import MinibatchRecord
from gnnc.runtime.train import RunResult, TrainConfig, Worker, optimizer_step, train

# what a sampled run's evaluation runs on (RunResult.evaluation, its --json): the module docstring says why
EVALUATION = "labelled vertices only (train, val and test masks), sampled neighbourhoods at the run's fan-outs"
EVAL_INDEX = 1 << 40  # the evaluation's sampling stream (a training batch's index is its position in the epoch)
# seeds per evaluation batch at least: a batch costs an interpreter pass, which a few dozen vertices (Cora's batches
# of 64) do not repay, and without autograd a batch holds less than a training step of the same seeds
EVAL_SEEDS = 1024


def block_view(block: Block, sview: SamplingView, graph: Graph) -> GraphView:
    """A block as the GraphView a layer runs on: its CSR (local ids), global edge ids, edge data, degrees.

    The edge data are the whole graph's for those edges (gcn_norm scaled by deg/k on sampled edges:
    gnnc.graph.sampling says why). A graph without edge data has its gcn_norm from the block's endpoints
    (`SamplingView.edge_norm`: the same coefficient to the bit, and no per-edge array of the whole graph, which
    a pushed block without edge ids could not index anyway).
    """
    indices = torch.from_numpy(block.indices)
    csr = CSR(torch.from_numpy(block.indptr), indices, torch.arange(block.nnz), block.n_dst, block.n_src)
    eids = torch.from_numpy(block.eids)
    if not graph.edge_data:
        data = {"gcn_norm": torch.from_numpy(sview.edge_norm(block))}
    elif block.nnz and int(eids.min()) < 0:
        raise AssertionError("a block without edge ids on a graph with edge data")
    else:
        data = view_edge_data(graph, sview.view, eids)
        data["gcn_norm"] = data["gcn_norm"] * torch.from_numpy(sview.edge_scale(block)).to(torch.float32)
    return GraphView(csr, indices, csr.dst_index(), eids, data, csr.in_degree().to(torch.float32))


def combines_partials(op: str) -> bool:
    """Whether the first graph layer's partial results are combined here: its `sync` (before insert-comm), or
    the exchange that combines partial sums (gnnc.plan.comm_ops: P3's pull)."""
    d = exchange_of(op)
    return op == "sync" or d is not None and d.combines_partials


class BlockRunner(PrefixRowsInterpreter):
    """Runs a range of the program's equations, each graph layer on the view given for it."""

    def __init__(self, program: Program):
        super().__init__(program)
        self.eqns = [(layer, e) for layer in program.layers for e in layer.eqns]
        first = program.graph_layers()[0].name
        self.split = next((k for k, (layer, e) in enumerate(self.eqns)
                           if layer.name == first and combines_partials(e.op)), None)

    def run(self, env: dict[str, torch.Tensor], params: dict[str, torch.Tensor], ctx: ExecContext,
            views: dict[str, GraphView], start: int = 0, stop: int | None = None) -> None:
        for layer, e in self.eqns[start:stop]:
            view = views.get(layer.name) if layer.kind == "graph" else None
            ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
            env[e.outs[0].name] = self.eqn(e, self.inputs_of(e, ins, ctx), view, ctx)

    def inputs_of(self, e, ins: list[torch.Tensor], ctx: ExecContext) -> list[torch.Tensor]:
        """The inputs an equation runs on (a distributed runner slices weights here)."""
        return ins


@dataclass
class Flight:
    """One minibatch in flight: its blocks, its stashed weights and what each phase leaves for the next."""

    batch: MiniBatch
    step: int
    count: float  # seeds of the whole batch (the loss averages over them)
    weights: dict[str, torch.Tensor] | None  # None until P3's pipeline hands the stashed weights over
    views: dict[str, GraphView] = field(default_factory=dict)
    env: dict[str, torch.Tensor] = field(default_factory=dict)
    ctx: Any = None
    partial: torch.Tensor | None = None  # the first layer's value before its sync
    combined: torch.Tensor | None = None  # after the sync: a leaf of the data-parallel phase
    pending: Any = None  # an exchange in flight (distributed), else the value itself
    loss: torch.Tensor | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    bytes_before: dict[str, int] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # push-pull: each worker's first-layer destinations
    m_ctx: Any = None  # push-pull: the model-parallel phase's context (every block's rows, a feature slice)
    pushed: Any = None  # push-pull: the structure push in flight (`start_prepare` posts, `finish_prepare` waits)


class MinibatchWorker(Worker):
    """One process, sampled minibatches; the distributed worker (minibatch_dist) overrides the exchanges."""

    def __init__(self, program: Program, graph: Graph, cfg: TrainConfig, sampling: SamplingConfig,
                 schedule: str = "sequential"):
        # Worker's fields, without its whole-graph views and inputs: those (the in-edge CSR's destination index,
        # gcn_norm of every edge, x read through for its density) are what a full-graph step needs, and at a
        # graph store's size they are gigabytes a sampled run never reads
        from gnnc.runtime.comm import CommStats  # deferred, as in Worker
        from gnnc.runtime.memory import set_up_allocator

        set_up_allocator()
        check_graph_fits(program, graph)
        self.device = devices.rank_device(cfg.device)
        devices.check_precision_on(self.device, cfg.precision)
        self.graph_name, self.num_nodes, self.stats, self.program, self.cfg = (graph.name, graph.num_nodes,
                                                                               CommStats(), program, cfg)
        self.count = max(float(graph.train_mask.sum()), 1.0)
        self.views, self.ids = {}, torch.zeros(0, dtype=torch.int64)
        self.state, self.hoisted = init_state(program, self.device), {}
        self.inputs = {"y": graph.y, "train": graph.train_mask, "val": graph.val_mask, "test": graph.test_mask}
        self._setup_sampling(program, graph, sampling, schedule)
        self.features = graph.x
        self.labels = graph.y
        self.train_ids = np.nonzero(graph.train_mask.numpy())[0]
        self.eval_ids = labelled_ids(graph.train_mask, graph.val_mask, graph.test_mask)
        move = devices.mover(self.device)
        self.eval_inputs = {k: move(v[torch.from_numpy(self.eval_ids)]) for k, v in self.inputs.items()}

    def _setup_sampling(self, program: Program, graph: Graph, sampling: SamplingConfig, schedule: str) -> None:
        layers = program.graph_layers()
        self.structure = graph  # edge views, edge data and gcn_norm of the whole graph
        self.sampling = sampling
        self.sampler = NeighbourSampler(graph, [layer.edges for layer in layers],
                                        sampling.layer_fanouts(len(layers)), self.cfg.seed)
        self.runner = BlockRunner(program)
        self.m_runner = self.runner  # the model-parallel phase's (push-pull: a feature-sliced one)
        if schedule not in SCHEDULES:
            raise GnncError(f"unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
        self.schedule = SCHEDULES[schedule]
        if self.schedule.staleness and self.runner.split is None:
            raise GnncError(f"schedule '{schedule}' pipelines the phases around the first graph layer's sync, "
                            f"and layer {layers[0].name} has none")
        self.records: list[MinibatchRecord] = []
        # the pipelined schedule's weight versions: (optimizer steps taken, weights), the newest last
        self.versions: collections.deque = collections.deque(maxlen=self.schedule.staleness + 2)
        self.updates = 0
        self.move = devices.mover(self.device)  # a minibatch's blocks and inputs to the device

    # --- the pieces a distributed worker replaces -------------------------------------------------------

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The global minibatches of an epoch (every rank computes the same list)."""
        return self.sampler.epoch_batches(epoch, self.train_ids, self.sampling.batch_size)

    def my_seeds(self, seeds: np.ndarray) -> np.ndarray:
        """The seeds of a global batch this worker trains on (all of them in one process)."""
        return seeds

    def batch_inputs(self, mb: MiniBatch) -> dict[str, torch.Tensor]:
        """The program's inputs on a minibatch: features of the first block's sources, labels of the seeds;
        gathered on the host, where the features are, and copied to the device once."""
        seeds = torch.from_numpy(mb.seeds)
        x = sparse_if_sparse(gather_rows(self.features, mb.blocks[0].src_ids, self.structure))  # bag of words sparse
        n = len(mb.seeds)
        return {"x": self.move(x), "y": self.move(self.labels[seeds]),
                "train": torch.ones(n, dtype=torch.bool, device=self.device),
                "val": torch.zeros(n, dtype=torch.bool, device=self.device),
                "test": torch.zeros(n, dtype=torch.bool, device=self.device)}

    def views_of(self, mb: MiniBatch) -> dict[str, GraphView]:
        """Each graph layer's block as a view on the device (sampled and built on the host, copied once)."""
        layers = self.program.graph_layers()
        return {layer.name: devices.place(block_view(block, self.sampler.views[layer.edges], self.structure),
                                          self.device)
                for layer, block in zip(layers, mb.blocks)}

    def start_sync(self, f: Flight) -> None:
        """Post the exchange of the first layer's sync (one process: the partial result is the whole)."""
        f.pending = f.partial

    def finish_sync(self, f: Flight) -> torch.Tensor:
        return f.pending

    def start_sync_grad(self, f: Flight) -> None:
        f.pending = f.combined.grad if f.combined.grad is not None else torch.zeros_like(f.combined)

    def finish_sync_grad(self, f: Flight) -> torch.Tensor:
        return f.pending

    # --- the four phases ----------------------------------------------------------------------------------

    def prepare(self, epoch: int, index: int, seeds: np.ndarray, step: int, weights: dict[str, torch.Tensor],
                fanouts: list[int] | None = None, training: bool = True) -> Flight:
        """Sample this worker's seeds of a global batch and gather the step's inputs (`start_prepare`, then
        `finish_prepare` at once). `fanouts` overrides the sampler's (all FULL: full-neighbourhood inference)."""
        f = self.start_prepare(epoch, index, seeds, step, weights, fanouts, training)
        self.finish_prepare(f)
        return f

    def finish_prepare(self, f: Flight) -> None:
        """Wait for what `start_prepare` posted and finish the step's inputs (one process posts nothing; push-pull
        waits here for the pushed structure, so P3's pipeline can post it a tick before its use)."""

    def start_prepare(self, epoch: int, index: int, seeds: np.ndarray, step: int,
                      weights: dict[str, torch.Tensor] | None, fanouts: list[int] | None = None,
                      training: bool = True) -> Flight:
        """Sample and gather what needs no peer's answer, and post what does. `weights` may be given later
        (P3's pipeline samples a minibatch a tick before the stashed weights it runs on exist)."""
        t0 = time.perf_counter()
        mb = self.sampler.sample(self.my_seeds(seeds), epoch, index, fanouts)
        release_pages(self.structure)  # the CSR's pages the sampling read (a store's, a rank's shards'), before x's
        t1 = time.perf_counter()
        f = Flight(mb, step, float(len(seeds)), weights,
                   bytes_before={"/".join(k): c.bytes for k, c in self.stats.counts.items()})
        f.views = self.views_of(mb)
        f.env = dict(self.batch_inputs(mb))
        # no hoist cache: a value computed once per run on the whole graph does not fit a minibatch's blocks
        f.ctx = dataclasses.replace(self.context(training, step), views={}, hoist_cache=None,
                                    vertex_ids=self.move(torch.from_numpy(mb.blocks[0].src_ids)), loss_count=f.count)
        f.phase_s = {"sample": t1 - t0, "gather": time.perf_counter() - t1}
        return f

    def forward_m(self, f: Flight) -> None:
        """Model-parallel forward: the equations before the first layer's sync; then post the sync."""
        t0 = time.perf_counter()
        split = self.runner.split
        if split is not None:
            self.m_runner.run(f.env, f.weights, self.m_context(f), f.views, 0, split)
            f.partial = f.env[self.runner.eqns[split][1].ins[0].name]
            self.start_sync(f)
        f.phase_s["forward_m"] = time.perf_counter() - t0

    def m_context(self, f: Flight) -> ExecContext:
        return f.ctx

    def forward_d(self, f: Flight) -> None:
        """Data-parallel forward: the sync's result (a leaf, so the phases can be separated), then the rest."""
        t0 = time.perf_counter()
        split = self.runner.split
        start = 0
        if split is not None:
            f.combined = self.finish_sync(f).detach().requires_grad_(True)
            f.env[self.runner.eqns[split][1].outs[0].name] = f.combined
            start = split + 1
        self.runner.run(f.env, f.weights, f.ctx, f.views, start)
        f.loss = f.env[self.program.loss.name]
        f.phase_s["forward_d"] = time.perf_counter() - t0

    def backward_d(self, f: Flight) -> None:
        t0 = time.perf_counter()
        f.loss.backward()
        if f.combined is not None:
            self.start_sync_grad(f)
        f.phase_s["backward_d"] = time.perf_counter() - t0

    def backward_m(self, f: Flight) -> None:
        t0 = time.perf_counter()
        if f.combined is not None:
            grad = self.finish_sync_grad(f)
            if f.partial.requires_grad:
                f.partial.backward(grad)
        f.phase_s["backward_m"] = time.perf_counter() - t0

    def apply(self, f: Flight, params: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer) -> None:
        """The flight's gradients into the parameters, summed over workers, and one optimizer step."""
        t0 = time.perf_counter()
        if f.weights is not params:
            for name, p in params.items():
                g = f.weights[name].grad
                p.grad = None if g is None else g
        self.reduce_grads(params)
        t1 = time.perf_counter()
        optimizer_step(self, params, opt)
        opt.zero_grad(set_to_none=True)
        f.phase_s.update(allreduce=t1 - t0, step=time.perf_counter() - t1)
        self.record(f)

    def record(self, f: Flight) -> None:
        now = {"/".join(k): c.bytes for k, c in self.stats.counts.items()}
        sent = {k: v - f.bytes_before.get(k, 0) for k, v in now.items() if v - f.bytes_before.get(k, 0)}
        blocks = f.batch.blocks
        self.records.append(MinibatchRecord(
            f.batch.epoch, f.batch.index, self.rank, self.world_size, len(f.batch.seeds),
            [b.n_src for b in blocks], [b.n_dst for b in blocks], [b.nnz for b in blocks],
            f.loss.detach(), dict(f.phase_s), sent))  # the loss is read on the host with the epoch's records

    # --- evaluation ---------------------------------------------------------------------------------------

    def forward(self, params, training: bool, epoch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The evaluation: the logits of `eval_batches`' vertices in their order (the module docstring says which
        and how); its exchanges' bytes are not counted."""
        if training:
            raise AssertionError("sampled training runs through train_epoch")
        saved = copy.deepcopy(self.stats.counts)
        outs = []
        with torch.no_grad():
            for seeds in self.eval_batches():
                f = self.prepare(epoch, EVAL_INDEX, seeds, epoch, params, training=False)
                self.forward_m(f)
                self.forward_d(f)
                outs.append(f.env[self.program.logits.name])
        self.stats.counts = saved
        return torch.cat(outs), None

    def eval_batches(self) -> list[np.ndarray]:
        """The vertices this worker evaluates, in batches of the batch size (a collective's count: every rank
        runs as many as the rank with the most)."""
        size = eval_batch_size(self.sampling)
        return [self.eval_ids[lo:lo + size] for lo in range(0, max(len(self.eval_ids), 1), size)]

    def owned(self, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return logits, self.eval_inputs

    def graph_tensors(self) -> list[torch.Tensor]:
        views = [self.sampler.views[name] for name in sorted(self.sampler.views)]
        return [*self.inputs.values(), *(torch.from_numpy(a) for v in views for a in (v.indptr, v.indices))]

    def run_settings(self) -> dict[str, Any]:
        return {"sampling": f"fan-out {self.sampling.text}, batch {self.sampling.batch_size}",
                "schedule": self.schedule.name}

    def take_records(self) -> list[Any]:
        out, self.records = self.records, []
        if out:  # every minibatch's loss in one read of the device
            for r, loss in zip(out, torch.stack([r.loss for r in out]).tolist()):
                r.loss = loss
        return out

    # --- an epoch -----------------------------------------------------------------------------------------

    def train_epoch(self, params, opt: torch.optim.Optimizer, epoch: int,
                    scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
        if scaler is not None:
            raise AssertionError("sampled minibatch training runs in fp32 (gnnc.compile refuses 16 bits with it)")
        batches = self.epoch_batches(epoch)
        first_step = epoch * len(batches)
        opt.zero_grad(set_to_none=True)
        if self.schedule.staleness:
            losses = self._pipelined(params, opt, epoch, batches, first_step)
        else:
            losses = []
            for index, seeds in enumerate(batches):
                f = self.prepare(epoch, index, seeds, first_step + index, params)
                self.forward_m(f)
                self.forward_d(f)
                self.backward_d(f)
                self.backward_m(f)
                self.apply(f, params, opt)
                losses.append(f.loss.detach())
        # the epoch's loss: each step's loss is a mean over its batch; weight them by their sizes (host numbers)
        weighted = torch.stack([loss.to(torch.float64) * float(len(s)) for loss, s in zip(losses, batches)])
        return weighted.sum() / float(sum(len(s) for s in batches))

    def _pipelined(self, params, opt, epoch: int, batches: list[np.ndarray], first_step: int) -> list[torch.Tensor]:
        """P3's 2F2B: at tick t the model-parallel forward of minibatch t, then minibatch t+1 sampled and its
        structure push posted, the data-parallel forward and backward of t-1, the model-parallel backward of t-2
        and its optimizer step; each exchange is waited on just before its result is used. Each minibatch runs
        on the weights of `staleness` optimizer steps before it (kept in `self.versions`, weight stashing).
        Posting the push early changes no value (sampling is counter-based): only the stashed weights are stale."""
        lag = self.schedule.staleness
        if not self.versions:  # the first epoch of this process (a resumed run starts at its checkpoint)
            self.updates = first_step
            self.versions.append((first_step, _snapshot(params)))
        flights: dict[int, Flight] = {}
        losses: list[torch.Tensor] = []
        n = len(batches)
        ahead: Flight | None = None  # the next minibatch, sampled and its structure posted (P3 section 3.3)
        for tick in range(n + 2):
            if tick < n:
                f = ahead or self.start_prepare(epoch, tick, batches[tick], first_step + tick, None)
                f.weights = self._stashed(f.step - lag)
                self.finish_prepare(f)
                flights[tick] = f
                self.forward_m(f)
                # minibatch tick+1's structure push travels while this tick's other phases compute
                ahead = self.start_prepare(epoch, tick + 1, batches[tick + 1], first_step + tick + 1, None) \
                    if tick + 1 < n else None
            if 0 <= tick - 1 < n:
                self.forward_d(flights[tick - 1])
                self.backward_d(flights[tick - 1])
            if 0 <= tick - 2 < n:
                done = flights.pop(tick - 2)
                self.backward_m(done)
                self.apply(done, params, opt)
                self.updates += 1
                self.versions.append((self.updates, _snapshot(params)))
                losses.append(done.loss.detach())
        return losses

    def _stashed(self, version: int) -> dict[str, torch.Tensor]:
        """Leaves holding the weights after `version` optimizer steps (the first kept, before it)."""
        version = max(version, self.versions[0][0])
        for v, weights in self.versions:
            if v == version:
                return {k: w.clone().requires_grad_(True) for k, w in weights.items()}
        raise AssertionError(f"weights of step {version} are not stashed (kept: {[v for v, _ in self.versions]})")


def gather_rows(x: torch.Tensor, ids: np.ndarray, graph: Graph) -> torch.Tensor:
    """x[ids] for rows `ids` of `graph`'s features; x memory-mapped (a store's, a rank's shard's: a mapping among
    the graph's, gnnc.graph.store.release_pages) is read a region at a time, each region's pages let go once its
    rows are copied (gnnc.graph.sampling.take says why: a minibatch's plain gather of a few hundred thousand rows
    held the whole matrix resident, 5.7 GB at papers100M/10)."""
    maps = mapped_files(graph)
    if not maps or x.is_sparse or x.dim() != 2 or not x.is_contiguous() or x.device.type != "cpu":
        return x[torch.from_numpy(ids)]
    return torch.from_numpy(take(x.numpy(), ids, maps))


def eval_batch_size(sampling: SamplingConfig) -> int:
    """Seeds per batch of a sampled run's evaluation."""
    return max(sampling.batch_size, EVAL_SEEDS)


def labelled_ids(*masks: torch.Tensor) -> np.ndarray:
    """The vertices of any of `masks`, increasing: what a sampled run evaluates (unlabelled ones are in none)."""
    union = torch.zeros_like(masks[0])
    for m in masks:
        union |= m
    return np.nonzero(union.numpy())[0]


def _snapshot(params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in params.items()}


def train_minibatch(program: Program, graph: Graph, cfg: TrainConfig, sampling: SamplingConfig,
                    schedule: str = "sequential", metrics_path: str | None = None, on_epoch=None) -> RunResult:
    """Train `program` on sampled minibatches of `graph` in this process; the evaluation and the logits are the
    labelled vertices' (`EVALUATION`), in increasing id order."""
    result = train(program, graph, cfg, metrics_path, on_epoch,
                   MinibatchWorker(program, graph, cfg, sampling, schedule))
    result.evaluation = EVALUATION
    return result
