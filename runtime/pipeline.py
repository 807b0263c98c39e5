"""GNNPipe's pipeline at run time: each rank runs its stage's layers on its chunks, chunks flowing between stages.

A rank is member g of stage s (gnnc.plan.pipeline). Each epoch:

1. every `history_every` epochs (and at a process's first epoch, which has
   no history yet), a full pass refreshes the history: layer by layer, no
   gradient, every value a layer reads through the history computed for
   every vertex with the epoch's dropout masks, stage after stage;
2. the pipelined step (GPipe): the chunks in a seeded order, new each
   epoch (GNNPipe's trick 1; in id order with `shuffle_chunks=false`); for each, receive its boundary rows from stage s-1 (member g),
   run the stage's layers on its rows, send the rows stage s+1 needs; then
   every chunk's backward in the reverse order, gradients flowing back the
   same way. A `history` op gives a layer the chunk's current rows (its own,
   and with G > 1 its group peers', exchanged with their gradients) and,
   for every other neighbour, the history row, detached: historical
   embeddings carry no gradient (GNNPipe's trick 2). As a chunk passes, its
   rows overwrite the history, so later chunks of the epoch read them current
   (GNNPipe's Algorithm 1; with G > 1 a member also hands the peers its chunk
   rows they read from their history elsewhere: a group's history follows
   the chunks as one worker's). The rows not yet processed in an epoch come
   from the last refresh (GNNPipe's trick 3, `history_update=refresh`, the
   default: each epoch starts from the refresh's history); with
   `history_update=chunk` from the previous epoch (its most recent rows);
3. one optimizer step: with G > 1 the group first sums its stage's weight
   gradients; stages share no weight, so nothing else is reduced.

Evaluation runs the full pass without dropout, reading current rows only (the
model's exact function, no history), and its traffic is not counted as
training's. The communication is gnnc.runtime.comm's: `pipe_send`/`pipe_recv`
between stages (label "pipe" in the training step, "refresh" in a refresh),
`halo_exchange` inside a group (labelled by layer in the step, by the pass in a refresh), the bucketed
all-reduce.
Every rank of a stage runs the same ops in the same order, as they require.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.errors import GnncError, PlanError
from gnnc.ir import Eqn, Layer
from gnnc.ir.dims import eval_dim
from gnnc.plan import pipeline as plan_pipeline
from gnnc.plan.comm_ops import exchange_of
from gnnc.plan.pipeline_shards import load_pipeline_rank
from gnnc.runtime import comm, rng
from gnnc.runtime import device as devices
from gnnc.runtime.distributed import DistJob, DistWorker, _gather_rows
from gnnc.runtime.executor import ExecContext, Interpreter, check_dims_fit, init_params
from gnnc.runtime.implementations import exchange_implementation, implements_exchange
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.train import Worker, optimizer_step

F32 = torch.float32


def chunk_order(seed: int, epoch: int, chunks: int, shuffle: bool = True) -> list[int]:
    """The chunks' order in epoch `epoch` (GNNPipe's trick 1: shuffled every epoch), the same on every rank;
    without `shuffle` (the trick measured off) every epoch takes them in id order."""
    if not shuffle:
        return list(range(chunks))
    return [int(k) for k in np.random.default_rng([seed, epoch, 0x617E]).permutation(chunks)]


def refresh_due(epoch: int, history_every: int, refreshed: int | None) -> bool:
    """Whether epoch `epoch` starts with a full pass: every `history_every` epochs, and whenever this
    process has no history yet (its first epoch, also after a resume)."""
    return refreshed is None or epoch % history_every == 0


class PipelineWorker(Worker):
    """One rank of a pipeline plan: its stage, its member's chunks, the history of its layers' inputs."""

    # P3's split weights (a rank holding a slice of W1, gnnc.plan.slices): none, a pipeline runs no push-pull;
    # train_and_report asks every full-graph worker
    split: frozenset[str] = frozenset()

    def __init__(self, cfg: DistConfig, job: DistJob, device: torch.device | None = None):
        """`device`: where this rank's tensors live; by default its GPU (`local_rank`) on CUDA, else the CPU."""
        self.device = devices.start_rank(job.train.device, job.train.precision, cfg.local_rank, device)
        program = job.program
        sched = plan_pipeline.schedule_of(program)
        if sched is None or sched.workers != cfg.world_size:
            raise PlanError(f"the plan's pipeline does not run on {cfg.world_size} ranks")
        data = load_pipeline_rank(job.shard_dir, cfg.rank, cfg.world_size, sched)
        check_dims_fit(program, data.num_features, data.num_classes, data.graph_name)
        self.rank, self.world_size = cfg.rank, cfg.world_size
        self.program, self.sched, self.data, self.cfg = program, sched, data, job.train
        self.stage, self.member = data.stage, data.member
        self.last = self.stage == sched.stages - 1
        self.layers = sched.layers(program, self.stage)
        self.recv_values = plan_pipeline.boundary_values(program, sched.stage_of, self.stage) if self.stage else []
        self.send_values = [] if self.last else plan_pipeline.boundary_values(program, sched.stage_of,
                                                                               self.stage + 1)
        self.recv_grad = bool(self.stage) and sched.pipe_grad[self.stage - 1]
        self.widths = {v.name: plan_pipeline.value_width(program, v) for v in self.recv_values + self.send_values}
        self.prev = self.rank - sched.groups if self.stage else None
        self.next = None if self.last else self.rank + sched.groups
        self.group = _stage_group(sched, self.stage)
        self.stats = comm.CommStats()
        self.eval_stats = comm.CommStats()  # evaluation's traffic, kept out of the training's
        self.interp = Interpreter(program)
        self.config = program.config_dict()
        self.inputs = data.inputs
        self.ids = data.rows
        self.num_nodes = data.num_nodes
        self.graph_name = data.graph_name
        self.count = data.train_count
        # the ops' running state (gnnc.runtime.train.fit saves it with the weights): none, since the pipeline
        # refuses the ops that keep one (stage-pipeline: statistics over every vertex cannot run chunk by chunk)
        self.state: dict[str, torch.Tensor] = {}
        self.history: dict[str, torch.Tensor] = {}  # value name -> [N, width], by global id
        self.snapshot: dict[str, torch.Tensor] = {}  # the last refresh's history (history_update=refresh)
        self.refreshed: int | None = None  # the epoch of this process's last refresh
        self.last_bubble: dict[str, float] = {}
        self._reducer: comm.GradAllReduce | None = None
        self._inputs_of: dict[int, dict[str, torch.Tensor]] = {}
        for structures in data.structures.values():
            for chunk in structures.chunks:
                for plan in (chunk.halo, chunk.later):
                    if plan is not None:
                        comm.check_halo_plan(plan, int(chunk.view.csr.n_dst), self.group)
            if structures.refresh is not None:
                comm.check_halo_plan(structures.refresh, len(self.ids), self.group)
        # The shard goes to the device once, checked first on the host (on CPU this changes nothing)
        move = devices.mover(self.device)
        data.structures = {v: devices.place(s, self.device) for v, s in data.structures.items()}
        self.inputs = data.inputs = {k: move(t) for k, t in data.inputs.items()}
        self.ids = data.rows = move(data.rows)

    # --- what a chunk runs on ----------------------------------------------------------------------

    def _rows(self, k: int) -> tuple[int, int]:
        return self.data.chunk_ptr[k], self.data.chunk_ptr[k + 1]

    def _chunk_ctx(self, base: ExecContext, k: int) -> ExecContext:
        a, b = self._rows(k)
        return dataclasses.replace(base, vertex_ids=self.ids[a:b])

    def _chunk_inputs(self, k: int) -> dict[str, torch.Tensor]:
        """The program inputs on chunk k's rows (a fresh dict over tensors sliced once)."""
        if k not in self._inputs_of:
            a, b = self._rows(k)
            self._inputs_of[k] = {name: _row_slice(t, a, b) for name, t in self.inputs.items()}
        return dict(self._inputs_of[k])

    def _nonempty(self) -> list[int]:
        return [k for k in range(self.sched.chunks) if self._rows(k)[1] > self._rows(k)[0]]

    # --- the layers of the stage -------------------------------------------------------------------

    def _run_stage(self, params, envs: dict[int, dict[str, Any]], base: ExecContext, stats: comm.CommStats,
                   store: dict[str, torch.Tensor] | None, label: str) -> None:
        """Run the stage's layers on `envs` (chunk -> its values). One chunk: the pipelined step, whose
        history ops read the history and update it. Every chunk (`store` given): a full pass, whose
        history ops first gather every row of their value into `store` (the history in a refresh, a
        scratch buffer in evaluation) and read current rows only."""
        ctxs = {k: self._chunk_ctx(base, k) for k in envs}
        for layer in self.layers:
            for e in layer.eqns:
                if exchange_of(e.op) is not None:  # its registered exchange (the pipeline's: history)
                    if store is None:
                        run = exchange_implementation(e.op)
                        for k, env in envs.items():
                            env[e.outs[0].name] = run(self, e, layer, k, env[e.ins[0].name], stats)
                    else:
                        exchange_implementation(e.op, "refresh")(self, e, layer, envs, stats, store, label)
                    continue
                for k, env in envs.items():
                    ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
                    view = self.data.structures[layer.edges].chunks[k].view if layer.kind == "graph" else None
                    env[e.outs[0].name] = self.interp.eqn(e, ins, view, ctxs[k])

    @implements_exchange("history")
    def _history_chunk(self, e: Eqn, layer: Layer, k: int, x: torch.Tensor, stats: comm.CommStats) -> torch.Tensor:
        """Chunk k's rows of the value, then its peers' (current), then the history's (no gradient)."""
        chunk = self.data.structures[layer.edges].chunks[k]
        hist = self._history_of(e.ins[0].name)
        a, b = self._rows(k)
        parts = [x]
        if chunk.halo is not None:
            peer = comm.halo_exchange(x, chunk.halo, stats, label=layer.name, group=self.group)
            hist[chunk.ext_ids[:chunk.n_peer]] = peer.detach()
            parts.append(peer)
            with torch.no_grad():  # the chunk's rows the peers read from their history later, current now
                hist[chunk.later_ids] = comm.halo_exchange(x.detach(), chunk.later, stats, label=layer.name,
                                                           group=self.group)
        # GNNPipe's Algorithm 1 (line 15): a neighbour processed this epoch is read current, so as the chunk
        # passes its rows overwrite the history for the chunks after it
        hist[self.ids[a:b]] = x.detach()
        parts.append(hist[chunk.ext_ids[chunk.n_peer:]])
        return torch.cat(parts, dim=0)

    @implements_exchange("history", "refresh")
    def _history_full(self, e: Eqn, layer: Layer, envs: dict[int, dict[str, Any]], stats: comm.CommStats,
                      store: dict[str, torch.Tensor], label: str) -> None:
        """Every chunk's rows of the value into `store`, the peers' rows fetched; each chunk then reads
        current rows only."""
        structures = self.data.structures[layer.edges]
        name = e.ins[0].name
        ks = sorted(envs)
        own = torch.cat([envs[k][name] for k in ks], dim=0)
        hist = store.setdefault(name, own.new_zeros((self.num_nodes, *own.shape[1:])))
        ids = torch.cat([self.ids[slice(*self._rows(k))] for k in ks])
        hist[ids] = own
        if structures.refresh is not None:
            # the refresh plan indexes the member's rows in member order, which `own` follows (an empty
            # chunk adds no row)
            hist[structures.refresh_ids] = comm.halo_exchange(own, structures.refresh, stats, label=label,
                                                              group=self.group)
        for k in ks:
            chunk = structures.chunks[k]
            envs[k][e.outs[0].name] = torch.cat([envs[k][name], hist[chunk.ext_ids]], dim=0)

    def _history_of(self, name: str) -> torch.Tensor:
        if name not in self.history:
            raise PlanError(f"rank {self.rank}: no history of %{name}: a refresh must come first")
        return self.history[name]

    # --- the passes --------------------------------------------------------------------------------

    def _full_pass(self, params, base: ExecContext, stats: comm.CommStats, store: dict[str, torch.Tensor],
                   label: str) -> dict[int, dict[str, Any]]:
        """Every chunk through the stage layer by layer (receiving and sending every row at once)."""
        ks = self._nonempty()
        envs = {k: self._chunk_inputs(k) for k in ks}
        n = len(self.ids)
        if self.prev is not None:
            width = sum(self.widths[v.name] for v in self.recv_values)
            got = comm.pipe_recv((n, width), F32, self.prev, stats, label=label, requires_grad=False,
                                 device=self.device)
            for k in ks:
                envs[k].update(self._split(got[slice(*self._rows(k))]))
        self._run_stage(params, envs, base, stats, store, label)
        if self.next is not None:
            comm.pipe_send(torch.cat([self._joined(envs[k]) for k in ks], dim=0), self.next, stats, label=label)
        return envs

    def _split(self, joined: torch.Tensor) -> dict[str, torch.Tensor]:
        out, col = {}, 0
        for v in self.recv_values:
            w = self.widths[v.name]
            out[v.name] = joined[:, col:col + w].reshape(joined.shape[0], *_feature_shape(v, self.config))
            col += w
        return out

    def _joined(self, env: dict[str, Any]) -> torch.Tensor:
        return torch.cat([env[v.name].reshape(env[v.name].shape[0], -1) for v in self.send_values], dim=1)

    def refresh(self, params, epoch: int) -> None:
        """GNNPipe's history refresh: the epoch's full pass (dropout on, no gradient) into the history, kept
        as the window's rows (`self.snapshot`)."""
        with torch.no_grad():
            self._full_pass(params, self.context(True, epoch), self.stats, self.history, "refresh")
        self.refreshed = epoch
        self.snapshot = {name: rows.clone() for name, rows in self.history.items()}

    def begin_epoch(self, params, epoch: int) -> None:
        """A refresh when due; then, with the published history (`history_update=refresh`, GNNPipe's trick 3),
        the history the chunks start from is the refresh's, whatever the chunks wrote into it last epoch: the
        neighbours not yet processed read the same rows every epoch of the window. With `chunk` they read
        what the last epoch left (its most recent rows)."""
        if refresh_due(epoch, self.sched.history_every, self.refreshed):
            self.refresh(params, epoch)
        elif self.sched.history_update == "refresh":
            self.history = {name: rows.clone() for name, rows in self.snapshot.items()}

    def train_epoch(self, params, opt: torch.optim.Optimizer, epoch: int,
                    scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
        """A refresh when due, the pipelined step, the group's gradient sum, one optimizer step."""
        if scaler is not None:
            raise AssertionError("the pipeline runs in fp32 (predict-bytes refuses 16 bits with it)")
        opt.zero_grad(set_to_none=True)
        self.begin_epoch(params, epoch)
        loss = self.pipelined_step(params, epoch)
        self.reduce_grads(params)
        optimizer_step(self, params, opt)
        return loss

    def pipelined_step(self, params, epoch: int, logits: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Every chunk's forward through the stages, then every chunk's backward (GPipe); the loss of this
        rank's rows (on the last stage), detached. `logits` (a dict) receives the last stage's per chunk."""
        base = self.context(True, epoch)
        pending: list[torch.Tensor] = []
        total = torch.zeros((), dtype=F32, device=self.device)
        in_width = sum(self.widths[v.name] for v in self.recv_values)
        for k in chunk_order(self.cfg.seed, epoch, self.sched.chunks, self.sched.shuffle_chunks):
            a, b = self._rows(k)
            if a == b:
                continue  # no row of this member in the chunk, on any stage
            env = self._chunk_inputs(k)
            if self.prev is not None:
                env.update(self._split(comm.pipe_recv((b - a, in_width), F32, self.prev, self.stats, label="pipe",
                                                      requires_grad=self.recv_grad, device=self.device)))
            self._run_stage(params, {k: env}, base, self.stats, None, "pipe")
            if self.next is not None:
                token = comm.pipe_send(self._joined(env), self.next, self.stats, label="pipe")
                if token.requires_grad:
                    pending.append(token)
            else:
                loss = env[self.program.loss.name]
                total = total + loss.detach()
                pending.append(loss)
                if logits is not None:
                    logits[k] = env[self.program.logits.name].detach()
        for out in reversed(pending):
            if out.dim() == 0:
                out.backward()
            else:
                torch.autograd.backward([out], [torch.zeros_like(out)])
        return total

    def forward(self, params, training: bool, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Evaluation: the full pass on current rows (no history); the last stage's logits of its rows."""
        envs = self._full_pass(params, self.context(training, epoch), self.eval_stats, {}, "eval")
        classes = self.data.num_classes
        none = torch.zeros((0, classes), device=self.device)
        if not self.last:
            return none, torch.zeros((), device=self.device)
        ks = sorted(envs)
        logits = torch.cat([envs[k][self.program.logits.name] for k in ks], dim=0) if ks else none
        loss = sum((envs[k][self.program.loss.name] for k in ks), torch.zeros((), device=self.device))
        return logits, loss

    # --- what fit asks of a worker -----------------------------------------------------------------

    def context(self, training: bool, epoch: int) -> ExecContext:
        # No hoist cache (a chunk's values are not the whole graph's: hoisted equations are computed every time)
        # and no running state (stage-pipeline refuses the ops that keep one).
        kb = rng.stream_key(self.cfg.seed, epoch)
        return ExecContext({}, self.ids, self.config, training, lambda i, kb=kb: rng.stream_key(kb, i), self.count,
                           self.cfg.use_kernels)

    def owned(self, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.last:
            return logits, self.inputs
        return logits, {k: v[:0] for k, v in self.inputs.items() if k != "x"}

    def stage_params(self, params) -> list[torch.nn.Parameter]:
        names = {p.value.name for layer in self.layers for p in layer.params}
        return [p for name, p in params.items() if name in names]

    def clip_grads(self, params, max_norm: float) -> None:
        """The model's gradient norm spans the stages, each of which holds its own layers' gradients: not summed
        across stages yet, so refused rather than clipped by one stage's part."""
        raise GnncError("--clip-grad or training(clip=...): not supported with a pipeline schedule yet (each stage "
                        "holds only its layers' gradients); train without the pipeline to clip")

    def reduce_grads(self, params) -> None:
        if self.sched.groups == 1:
            return  # no other worker holds this stage's weights
        if self._reducer is None:
            self._reducer = comm.GradAllReduce(self.stage_params(params), self.stats, group=self.group)
        self._reducer.finish()

    sum = DistWorker.sum  # over every rank, as the other strategies' workers
    max = DistWorker.max

    def train_vertices(self) -> int:
        mine = self.inputs["train"].sum() if self.last else torch.zeros((), dtype=torch.int64, device=self.device)
        return int(self.sum(mine.reshape(1).to(torch.int64))[0])

    def graph_tensors(self) -> list[torch.Tensor]:
        out = [self.ids, *self.inputs.values()]
        for view in sorted(self.data.structures):
            for chunk in self.data.structures[view].chunks:
                out += [chunk.view.csr.indptr, chunk.view.csr.indices, chunk.ext_ids]
        return out

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor | None:
        ids = self.ids if self.last else self.ids[:0]
        return _gather_rows(logits.detach().cpu(), ids.cpu(), self.num_nodes, self.rank, self.world_size)



def _stage_group(sched: plan_pipeline.PipelineSchedule, stage: int) -> dist.ProcessGroup | None:
    """This stage's process group (every rank creates every group, in order, as torch requires)."""
    if sched.groups == 1:
        return None
    mine = None
    for s in range(sched.stages):
        group = dist.new_group(list(range(s * sched.groups, (s + 1) * sched.groups)))
        if s == stage:
            mine = group
    return mine


def _row_slice(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
    return t.index_select(0, torch.arange(a, b, device=t.device)).coalesce() if t.is_sparse else t[a:b]


def _feature_shape(v, config: dict[str, Any]) -> tuple[int, ...]:
    return tuple(eval_dim(d, config) for d in v.type.shape)


def pipeline_worker(cfg: DistConfig, job: DistJob) -> PipelineWorker:
    return PipelineWorker(cfg, job)


def one_step(cfg: DistConfig, job: DistJob, epoch: int = 0, before: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """A refresh in epoch 0 and one pipelined step in `epoch` (no optimizer step), after the steps of the
    epochs `before` (each started as training starts an epoch, their gradients dropped): rank 0 gets the
    logits of the step's forward pass in global order (the last stage's), the summed loss, every parameter's
    gradient and the bytes by "label/op/direction" summed over ranks, of the step and of the refresh.
    Tests compare it with one process."""
    w = PipelineWorker(cfg, job)
    params = init_params(w.program, job.train.seed, w.device)
    w.refresh(params, 0)
    refreshed = {"/".join(key): c.bytes for key, c in w.stats.counts.items()}
    for earlier in before:
        w.begin_epoch(params, earlier)
        w.pipelined_step(params, earlier)
        for p in params.values():
            p.grad = None
    if before:
        w.begin_epoch(params, epoch)
    w.stats.reset()
    captured: dict[int, torch.Tensor] = {}
    loss = w.pipelined_step(params, epoch, captured)
    w.reduce_grads(params)
    ks = sorted(captured)
    logits = torch.cat([captured[k] for k in ks]) if ks else torch.zeros((0, w.data.num_classes), device=w.device)
    gathered = w.gather_logits(logits)
    total = w.sum(loss.reshape(1))
    every: list[Any] = [None] * cfg.world_size
    dist.all_gather_object(every, ({k: p.grad.detach().cpu() for k, p in params.items() if p.grad is not None},
                                   {"/".join(key): c.bytes for key, c in w.stats.counts.items()}, refreshed))
    if cfg.rank != 0:
        return None
    grads: dict[str, torch.Tensor] = {}
    sent: dict[str, int] = {}
    refresh: dict[str, int] = {}
    for g, b, r in every:
        for k, v in g.items():
            grads.setdefault(k, v)  # a stage's members hold the same (reduced) gradients
        for into, counts in ((sent, b), (refresh, r)):
            for k, v in counts.items():
                into[k] = into.get(k, 0) + v
    return {"logits": gathered, "loss": float(total[0]), "grads": grads, "bytes": sent, "refresh_bytes": refresh}


def one_step_each(cfg: DistConfig, jobs: list[DistJob], epochs: list[int | tuple[int, ...]]) -> \
        list[dict[str, Any] | None]:
    """`one_step` for several jobs (job i's step in `epochs[i]`; a tuple: the steps of those epochs in turn,
    the last one's reported) in one launch: starting processes is the expensive part."""
    return [one_step(cfg, job, e[-1], tuple(e[:-1])) if isinstance(e, tuple) else one_step(cfg, job, e)
            for job, e in zip(jobs, epochs)]
