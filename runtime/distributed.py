"""Training on several workers: one process per rank, each running the plan on its rows.

Every rank interprets the same IR (with the communication `insert-comm`
made explicit) over its LocalGraph; the communication ops are the autograd
Functions of gnnc.runtime.comm, so `loss.backward()` runs the distributed
backward pass. The loss of each rank is the sum over its owned training
vertices divided by the global training count, so the ranks' losses add up to
the single-process loss; parameter gradients are summed over ranks
(GradAllReduce) and every rank takes the same optimizer step.
"""
from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.ir import Eqn, Program
from gnnc.ir_text import parse_ir
from gnnc.runtime import comm, rng
from gnnc.runtime.executor import ExecContext, Interpreter, check_graph_fits, forward, init_params
from gnnc.runtime.graph import Graph
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.partitioned import LocalGraph, replicated_lhop, vertex_partitioned
from gnnc.runtime.train import TrainConfig, make_optimizer


@dataclass(frozen=True)
class DistJob:
    """Everything a rank needs, decided before any process starts (picklable)."""

    ir: str  # the plan's IR text, strategies annotated and communication inserted
    graph_spec: Any  # a spec string each rank loads, or a Graph (pickled to every rank)
    parts: np.ndarray  # part of every vertex (the partition the plan was compiled for)
    train: TrainConfig
    metrics_path: str | None = None
    want_logits: bool = False


def strategy_of(program: Program) -> set[str]:
    return {layer.attr("strategy") for layer in program.graph_layers()}


def local_graph(program: Program, graph: Graph, parts: np.ndarray, rank: int, world: int) -> LocalGraph:
    views = sorted({layer.edges for layer in program.graph_layers()})
    strategies = strategy_of(program) - {"pushpull"}
    if strategies == {"depcache"}:
        return replicated_lhop(graph, parts, rank, len(program.graph_layers()), views)
    columns = "blocks" if strategies == {"bcast1d"} else "halo"
    lg = vertex_partitioned(graph, parts, rank, world, views, columns)
    if "bcast1d" in strategies and columns == "halo":
        # mixed depcomm/bcast1d: bcast1d layers need block columns of their own
        blocks = vertex_partitioned(graph, parts, rank, world, views, "blocks")
        lg.block_rows = blocks.block_rows
        lg.block_views = blocks.views
    return lg


class Exchange:
    """The communication ops of the IR, bound to this rank's LocalGraph and byte counters."""

    def __init__(self, lg: LocalGraph, stats: comm.CommStats, parts: np.ndarray, world: int):
        self.lg = lg
        self.stats = stats
        # P3's pull: rows regrouped by owner (block order) so a reduce-scatter lands them at their owners
        self.block_order = torch.as_tensor(np.argsort(parts, kind="stable"), dtype=torch.int64)
        self.block_sizes = [int(c) for c in np.bincount(parts, minlength=world)]

    def exchange(self, op: str, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        label = e.outs[0].name.split(".")[0]
        if op == "reduce_scatter":
            return comm.reduce_scatter(x[self.block_order], self.block_sizes, self.stats, dim=0, label=label)
        if op == "halo":
            assert self.lg.halo is not None
            return torch.cat([x, comm.halo_exchange(x, self.lg.halo, self.stats, label=label)], dim=0)
        blocks = [h for _, h in comm.staged_broadcast(x, self.lg.block_rows, self.stats, label=label)]
        return torch.cat(blocks, dim=0)


@dataclass
class FeaturePhase:
    """P3's layout before its pull: every vertex's row, this worker's slice of the input features."""

    views: dict[str, Any]  # the whole graph's edge views (the layer-1 structure, replicated)
    ids: torch.Tensor  # arange(N)
    cols: tuple[int, int]  # this worker's feature slice [start, stop)
    last_layer: str  # the pushpull layer; its reduce_scatter ends the phase


def feature_slice(width: int, rank: int, world: int) -> tuple[int, int]:
    """Near-equal contiguous slices; the first width % world get one more column."""
    bounds = [width * k // world for k in range(world + 1)]
    return bounds[rank], bounds[rank + 1]


class DistInterpreter(Interpreter):
    """Runs each layer in its strategy's layout: feature-sliced up to P3's pull, rows elsewhere."""

    def __init__(self, program: Program, lg: LocalGraph, phase: FeaturePhase | None = None):
        super().__init__(program)
        self.lg = lg
        self.phase = phase
        self.in_phase = phase is not None
        self.sliced: set[str] = {"x"} if phase is not None else set()

    def run_layer(self, layer, env, params, ctx):
        if self.phase is not None and layer.name == self.program.layers[0].name:
            self.in_phase = True  # a new forward pass starts in the feature layout
        if layer.kind == "graph" and layer.attr("strategy") == "bcast1d" and self.lg.block_views is not None:
            ctx = _with(ctx, views=self.lg.block_views)
        if not self.in_phase:
            return super().run_layer(layer, env, params, ctx)
        p = self.phase
        fctx = _with(ctx, views=p.views, vertex_ids=p.ids, col_offset=p.cols[0])
        for e in layer.eqns:
            ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
            sliced_in = any(v.name in self.sliced for v in e.ins)
            if e.op == "linear" and sliced_in:
                ins[1] = ins[1][p.cols[0]:p.cols[1]]  # this slice's rows of W: a partial product
            elif sliced_in:
                self.sliced.update(o.name for o in e.outs)
            view = fctx.views.get(layer.edges) if layer.kind == "graph" else None
            env[e.outs[0].name] = self.eqn(e, ins, view, fctx if self.in_phase else ctx)
            if e.op == "reduce_scatter":
                self.in_phase = False  # the pull: owned rows from here on
                fctx = ctx


def _with(ctx: ExecContext, **changes: Any) -> ExecContext:
    import dataclasses

    return dataclasses.replace(ctx, **changes)


def _local_inputs(graph: Graph, lg: LocalGraph) -> dict[str, torch.Tensor]:
    rows = lg.rows
    owned = torch.zeros(len(rows), dtype=torch.bool)
    owned[: lg.n_owned] = True
    return {"x": graph.x[rows], "y": graph.y[rows], "train": graph.train_mask[rows] & owned,
            "val": graph.val_mask[rows] & owned, "test": graph.test_mask[rows] & owned}


def _correct(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return [float((logits[mask].argmax(-1) == y[mask]).sum()), float(mask.sum())]


@dataclass
class _Rank:
    """What one rank builds before it trains: its rows, comm, interpreter, params, inputs."""

    program: Program
    graph: Graph
    lg: LocalGraph
    stats: comm.CommStats
    exchange: Exchange
    interp: DistInterpreter
    params: dict[str, torch.nn.Parameter]
    inputs: dict[str, torch.Tensor]
    count: float
    config: dict[str, Any]

    def context(self, training: bool, seed: int, epoch: int, use_kernels: bool) -> ExecContext:
        key_base = rng.stream_key(seed, epoch)
        return ExecContext(self.lg.views, self.lg.rows, self.config, training,
                           lambda i, kb=key_base: rng.stream_key(kb, i), self.count, use_kernels, self.exchange)


def _setup(cfg: DistConfig, job: DistJob) -> _Rank:
    torch.set_num_threads(1)
    program = parse_ir(job.ir)
    if isinstance(job.graph_spec, Graph):
        graph = job.graph_spec
    else:
        from gnnc.runtime.graph_io import load_graph

        graph = load_graph(job.graph_spec)
    check_graph_fits(program, graph)
    lg = local_graph(program, graph, job.parts, cfg.rank, cfg.world_size)
    stats = comm.CommStats()
    if lg.halo is not None:
        comm.check_halo_plan(lg.halo, lg.n_owned)
    inputs = _local_inputs(graph, lg)
    phase = None
    pushpull = [layer for layer in program.graph_layers() if layer.attr("strategy") == "pushpull"]
    if pushpull:
        from gnnc.runtime.executor import GraphView

        cols = feature_slice(graph.num_features, cfg.rank, cfg.world_size)
        phase = FeaturePhase({v: GraphView.build(graph, v) for v in {layer.edges for layer in pushpull}},
                             torch.arange(graph.num_nodes), cols, pushpull[0].name)
        inputs["x"] = graph.x[:, cols[0]:cols[1]]
    return _Rank(program, graph, lg, stats, Exchange(lg, stats, job.parts, cfg.world_size),
                 DistInterpreter(program, lg, phase), init_params(program, job.train.seed), inputs,
                 max(float(graph.train_mask.sum()), 1.0), program.config_dict())


def one_step(cfg: DistConfig, job: DistJob) -> dict[str, Any] | None:
    """Forward (training mode, dropout on) and backward once; rank 0 returns logits and summed grads.

    The exactness tests compare this with one process.
    """
    r = _setup(cfg, job)
    reducer = comm.GradAllReduce(list(r.params.values()), r.stats)
    logits, loss = forward(r.interp, r.params, r.inputs, r.context(True, job.train.seed, 0, job.train.use_kernels))
    loss.backward()
    reducer.finish()
    total = loss.detach().clone()
    dist.all_reduce(total)
    gathered = _gather_rows(logits.detach()[: r.lg.n_owned], r.lg.owned, r.graph.num_nodes, cfg.rank,
                            cfg.world_size)
    if cfg.rank != 0:
        return None
    return {"logits": gathered, "loss": float(total),
            "grads": {k: p.grad.detach().clone() for k, p in r.params.items()},
            "bytes": r.stats.as_dict()}


def worker(cfg: DistConfig, job: DistJob) -> dict[str, Any] | None:
    """One rank's training run; rank 0 returns the summary (and the logits in global order)."""
    r = _setup(cfg, job)
    rank, world = cfg.rank, cfg.world_size
    program, graph, lg, stats, exchange, interp, params, inputs, count, config = (
        r.program, r.graph, r.lg, r.stats, r.exchange, r.interp, r.params, r.inputs, r.count, r.config)
    tc = job.train
    opt = make_optimizer(program, params, tc)
    reducer = comm.GradAllReduce(list(params.values()), stats)
    eval_ctx = r.context(False, tc.seed, 0, tc.use_kernels)
    bar = None
    if tc.progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=tc.epochs, desc=f"train x{world}", unit="epoch", leave=False)
    metrics = open(job.metrics_path, "a") if job.metrics_path and rank == 0 else None
    history: list[dict[str, float]] = []
    times: list[float] = []
    best_val, best = -1.0, None
    logits = None
    try:
        for epoch in range(tc.epochs):
            stats.reset()
            ctx = r.context(True, tc.seed, epoch, tc.use_kernels)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            _, loss = forward(interp, params, inputs, ctx)
            loss.backward()
            t_ar = time.perf_counter()
            reducer.finish()
            t_ar = time.perf_counter() - t_ar
            opt.step()
            elapsed = time.perf_counter() - t0
            comm_s = stats.total_seconds() - stats.total_seconds("allreduce")
            sent = stats.total_bytes()
            with torch.no_grad():
                logits, _ = forward(interp, params, inputs, eval_ctx)
            local = logits[: lg.n_owned]
            own = {k: v[: lg.n_owned] for k, v in inputs.items()}
            counts = torch.tensor([float(loss.detach())] + _correct(local, own["y"], own["train"])
                                  + _correct(local, own["y"], own["val"]) + _correct(local, own["y"], own["test"])
                                  + [float(sent), elapsed])
            totals = counts.clone()
            dist.all_reduce(totals)
            slowest = counts[-1:].clone()
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            rec = {"epoch": epoch, "loss": float(totals[0]),
                   "train_acc": float(totals[1] / max(totals[2], 1)), "val_acc": float(totals[3] / max(totals[4], 1)),
                   "test_acc": float(totals[5] / max(totals[6], 1)), "time_s": float(slowest[0]),
                   "bytes_sent": int(totals[7])}
            times.append(rec["time_s"])
            history.append(rec)
            if rec["val_acc"] > best_val:
                best_val, best = rec["val_acc"], rec
            if metrics is not None:
                metrics.write(json.dumps({**rec, "rank": rank, "comm_s": comm_s, "allreduce_s": t_ar,
                                          "compute_s": elapsed - comm_s - t_ar,
                                          "bytes_by_op": stats.bytes_by("op")}) + "\n")
                metrics.flush()
            if bar is not None:
                bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{rec['val_acc']:.3f}")
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
    peak = torch.tensor([float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    gathered = None
    if job.want_logits:
        gathered = _gather_rows(logits[: lg.n_owned], lg.owned, graph.num_nodes, rank, world)
    if rank != 0:
        return None
    assert best is not None
    steady = times[1:] or times
    return {"test_acc": best["test_acc"], "val_acc": best["val_acc"], "final_test_acc": history[-1]["test_acc"],
            "train_loss": history[-1]["loss"], "epoch_time_s": statistics.median(steady),
            "bytes_sent_per_epoch": history[-1]["bytes_sent"], "world_size": world,
            "peak_rss_bytes": int(peak[0]), "best_epoch": int(best["epoch"]),
            "strategies": [layer.attr("strategy") for layer in program.graph_layers()],
            "logits": gathered, "history": history}


def _gather_rows(rows: torch.Tensor, ids: torch.Tensor, n: int, rank: int, world: int) -> torch.Tensor | None:
    """Assemble every rank's owned rows into one [n, ...] tensor on rank 0 (global order)."""
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, (ids, rows.detach()))
    if rank != 0:
        return None
    out = torch.zeros((n,) + tuple(rows.shape[1:]), dtype=rows.dtype)
    for ids_p, rows_p in objs:
        out[ids_p] = rows_p
    return out


def one_step_each(cfg: DistConfig, jobs: list[DistJob]) -> list[dict[str, Any] | None]:
    """`one_step` for several jobs in one launch (the process start is the expensive part)."""
    return [one_step(cfg, job) for job in jobs]
