"""The Python API: load a model, compile it for a graph, run it. The CLI calls these.

    model = gnnc.load_model("examples/gcn.gnn", hidden=32)
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(model, graph)
    result = gnnc.run(plan, graph, epochs=200)

A plan is a directory (`plan.json`) that holds the model's source, its
configuration and the compiled IR, so `gnnc run PLAN` needs nothing else but
the graph; loading a plan re-derives the IR and refuses a plan whose IR does
not match what it states.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import sympy
import torch

from gnnc.cluster import ClusterProfile, KernelRate, default_probe_file, load_profile, resolve_cluster
from gnnc.errors import GnncError, GnncWarning, PlanError
from gnnc.frontend.syntax import parse
from gnnc.graph import Graph
from gnnc.graph.in_memory import as_graph
from gnnc.graph.tu_dataset import is_graph_dataset_spec
from gnnc.graph_classification import refuse_flags as refuse_graph_flags
from gnnc.graph_classification import run as run_graph_classification
from gnnc.graph.edge_split import message_graph
from gnnc.graph.loaders import load_graph as _load
from gnnc.graph.sampling import SamplingConfig
from gnnc.graph.storage import input_density
from gnnc.host import SMALL_EPOCH_ELEMENTS, choose_threads
from gnnc.ir import Program
from gnnc.ir.expr import as_expr
from gnnc.ir.ops import is_graph_classification, is_link_prediction
from gnnc.memory_check import (check_ranks_before_loading, check_run_memory, evaluation_chunk, graph_counts,
                                stand_in_graph)
from gnnc.model_file import (Model, ModelErrors, check, edge_shapes, graph_dims, load_model,  # noqa: F401
                             load_model_source)  # (the API's names)
from gnnc.passes.analysis.layers import layer_dims
from gnnc.passes.cost.epoch import epoch_costs
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.fit import fit_op_rates, fit_profile
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.registry import segment_cost
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE, PassContext, as_spec, run_pipeline
from gnnc.passes.partition import partition_graph
from gnnc.passes.partition.core import load_partition
from gnnc.passes.pipeline_text import PassSpec, with_values
from gnnc.passes.predict_bytes import predict_pair_bytes
from gnnc.passes.planner.pipeline import pipeline_summary
from gnnc.plan.pipeline import is_pipeline
from gnnc.plan.plan_file import Plan
from gnnc.plan.plan_meta import Partition, PlanMeta, PlannerRecord, WorkersTried
from gnnc.plan.precision import DEFAULT_PRECISION, check_precision
from gnnc.plan.shard_files import verify_shards
from gnnc.plan.slices import split_weights
from gnnc.plan.approximation import approximations, require_exact
from gnnc.plan.schedules import SCHEDULES
from gnnc.plan.strategies import STRATEGIES
from gnnc.runtime.device import check_gpu_count, resolve_device
from gnnc.runtime.distributed import DistJob, let_go_of_graph
from gnnc.runtime.link_task import draw_negatives, split_for
from gnnc.runtime.launch import DEFAULT_TIMEOUT_S, join_torchrun, launch, started_by_torchrun
from gnnc.runtime.main_guard import check_main_guard
from gnnc.runtime.minibatch import train_minibatch
from gnnc.runtime.minibatch_dist import SampledJob, sampled_worker
from gnnc.runtime.probe import (PROBE_MODEL, PROBE_OPS_MODEL, PROBE_OPS_WIDTHS, PROBE_WIDTHS, across_ranks,
                                kernel_rate_samples, machine_fields, probe as probe_machine, probe_layer_samples,
                                probe_op_samples, size_rate_samples, timing_together)
from gnnc.runtime.probe_network import links_then_machines, network_probe, profile_fields
from gnnc.runtime.pair_exchange import LinkJob, link_worker
from gnnc.runtime.rank_worker import worker
from gnnc.runtime.train import RunResult, TrainConfig, check_graph_inputs, train
from gnnc.graph.storage import check_class_labels
from gnnc.runtime.executor import loss_op
from gnnc.saved_model import load_weights
from gnnc.torch_module import GnncModule


def load_graph(spec: Any):
    """A graph from a spec string (planetoid:cora, rmat:..., a file), a PyG Data, a networkx graph or a
    dict of arrays (gnnc.graph.in_memory)."""
    if not isinstance(spec, (str, os.PathLike)):
        return as_graph(spec)
    return _load(str(spec))


def compile(model: Model, graph: Any = None, workers: int | str = 1, passes: list[str] | list[PassSpec] | None = None,
            graph_spec: str | None = None, after=None, strategy: str | list[str] | None = None,
            partition: str | None = None, seed: int = 0, cluster: Any = None,
            allow: list[str] | None = None, hybrid_cached: dict[int, list[Any]] | None = None,
            sampling: SamplingConfig | None = None, schedule: str | None = None, approximate: bool = False,
            memory_cap: int | None = None, pipeline_groups: int = 0, precision: str = DEFAULT_PRECISION,
            device: str = "cpu", explain: bool = False,
            partition_from: str | os.PathLike | None = None, threads: int | None = None) -> Plan:
    """Elaborate and run the pass pipeline; `after(name, program)` sees each pass's output.

    With `workers > 1` the layers get their strategies (`strategy`, one name
    or one per graph layer), communication is inserted, and the graph is
    partitioned (`partition`: a method of gnnc.passes.partition.METHODS;
    bcast1d defaults to MG-GCN's random permutation, the others to metis).
    `partition_from` reads the split a `gnnc partition -o DIR` wrote instead (its method and seed).
    `strategy` and `allow` become the options of the passes that take them
    (choose-strategy), unless the pipeline text set them already.
    `hybrid_cached` ({graph layer: [global ids per worker]}) replaces
    Algorithm 4's choice of the dependencies a hybrid segment caches.
    `sampling` (fan-outs and batch size) compiles for sampled minibatch training: the planner prices
    the sampled strategies (dp-sample, pushpull) on a dry run of the sampler with `seed`. `schedule`
    (gnnc.plan.schedules) orders the steps; an approximate strategy or schedule needs `approximate`.
    `memory_cap` (bytes of activation memory per worker) goes to the schedule pass, which runs layers in
    G3's bins to meet it (full-graph training).
    GNNPipe's `pipeline` runs `pipeline_groups` workers per stage (0: the planner chooses).
    `precision` (gnnc.plan.precision) sets the bytes predicted per exchanged
    element and the rates the planner prices; the plan records it, and a run
    of the plan uses it. `device` picks which of this machine's probes
    (`gnnc probe --device`) the `local` cluster is. `explain` finds the planner's crossovers (where its choice
    flips) and keeps them in the plan (`--explain`; not otherwise: they cost more than the choice).
    `threads` (`--threads`): the processes the compile splits its per-worker steps over (gnnc.parallel), and
    the plan's `save` after it; None: the CPUs this process may use (gnnc.host.choose_threads).
    """
    check_precision(precision)
    if sampling is not None and precision != DEFAULT_PRECISION:
        raise GnncError(f"--precision {precision}: sampled minibatch training (--fanout) runs in fp32 for now")
    if schedule is not None and schedule not in SCHEDULES:
        raise GnncError(f"unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    if schedule is not None and SCHEDULES[schedule].sampled_only and sampling is None:
        raise GnncError(f"schedule '{schedule}' pipelines sampled minibatches: give --fanout and --batch-size")
    named = [] if strategy is None else strategy.split(",") if isinstance(strategy, str) else list(strategy)
    require_exact(named, schedule, approximate)
    if partition_from is not None and (workers == "auto" or int(workers) < 2):
        raise GnncError("--partition-from DIR gives the split for a worker count: compile for --workers N > 1")
    if workers == "auto":
        if sampling is not None:
            raise GnncError("--workers auto plans full-graph training; give a worker count with --fanout")
        return _compile_auto(model, graph, passes, graph_spec, after, strategy, partition, seed, cluster, allow,
                             precision, device, memory_cap)
    workers = int(workers)
    if workers < 1:
        raise GnncError(f"--workers must be at least 1, not {workers}")
    if memory_cap and (workers == 1 or sampling is not None):
        raise GnncError("--memory-cap bounds a worker's activations by running layers in bins, which the "
                        "distributed runtime does for full-graph training: compile for --workers N > 1 "
                        "(run with --nproc N), without --fanout")
    program = model.program(graph)
    if is_graph_classification(program):
        raise GnncError("a model that reads out graph rows (global_*_pool) classifies graphs: run it with "
                        "`gnnc run MODEL.gnn --graph tu:DIR` (or graphs:n=600,seed=0), a dataset of many graphs")
    link_split = None
    if is_link_prediction(program):
        if sampling is not None:
            raise GnncError("link prediction (a model that scores src./dst. pairs) trains on the full graph for "
                            "now: compile and run it without --fanout")
        if workers > 1 and graph is not None:  # the encoder's graph is the split's message-passing graph
            link_split = split_for(program, graph, seed)
            graph = message_graph(graph, link_split)
    if not program.graph_layers() and (workers > 1 or sampling is not None):
        raise GnncError("a model without a graph layer (dense layers only, an MLP) has nothing to split over a "
                        "graph's vertices: compile it for --workers 1 (run it without --nproc) and without --fanout")
    pipeline = [as_spec(p) for p in (DEFAULT_PIPELINE if passes is None else passes)]
    if workers > 1 and passes is None:
        pipeline += [as_spec(p) for p in DISTRIBUTED_PIPELINE]
    if workers > 1:
        pipeline = _with_compile_options(pipeline, strategy=strategy, allow=allow, memory_cap=memory_cap,
                                         pipeline_groups=pipeline_groups)
    ctx = PassContext(graph=graph, workers=workers, hybrid_cached=hybrid_cached, sampling=sampling, seed=seed,
                      approximate=approximate, precision=precision, threads=choose_threads(threads).threads)
    partitioned = None
    if workers > 1:
        if graph is None:
            raise GnncError("compiling for several workers needs the graph (--graph G)")
        if partition_from is not None:  # partitioned once before (`gnnc partition -o DIR`), read here
            if partition is not None:
                raise GnncError("give --partition METHOD or --partition-from DIR, not both")
            ctx.partition = load_partition(partition_from, graph, workers)
        else:
            method = partition or (SAMPLED_PARTITION if sampling is not None else _default_partition(strategy))
            ctx.partition = partition_graph(graph, workers, method, seed=seed)
        ctx.cluster = resolve_cluster(cluster, device)  # once, for every pass that prices
        partitioned = Partition(ctx.partition.method, workers, ctx.partition.seed)
    program = run_pipeline(program, pipeline, ctx, verify_each=True, after=after)  # a broken invariant is a gnnc bug
    if graph is not None:
        _warn_unused_logits(program, graph, model)
    results = ctx.results
    if link_split is not None:
        _predict_link_bytes(program, link_split, ctx.parts, workers, precision, results)
    if sampling is not None:
        sampling.layer_fanouts(len(program.graph_layers()))  # one fan-out per graph layer, or exit 2
    step_schedule = (results.schedule or schedule or "sequential") if sampling is not None else None
    chosen = [layer.attr("strategy", "local") for layer in program.graph_layers()]
    parts, pipe = ctx.parts, None
    if results.pipeline is not None and is_pipeline(program):  # a pipeline's partition is its chunking
        parts = results.pipeline.parts
        partitioned = Partition("metis", int(parts.max()) + 1, 0,  # planner.pipeline's
                                "pipeline chunks: part k*G+g is member g's share of chunk k")
        pipe = pipeline_summary(results.pipeline, results.pipeline_bytes)
    report = results.planner
    meta = PlanMeta(
        partition=partitioned, precision=precision, sampling=sampling, schedule=step_schedule,
        predicted_bytes_per_step=results.predicted_bytes if sampling is None else None,
        predicted_bytes_per_epoch=results.predicted_bytes if sampling is not None else None,
        predicted_eval_bytes_per_epoch=results.predicted_eval_bytes,
        approximations=tuple(approximations(chosen, step_schedule)), hybrid=results.hybrid_selection,
        schedule_report=results.schedule_report, pipeline=pipe,
        # `gnnc run PLAN` refuses or states them without the graph
        graph_stand_ins=dict(graph.stand_ins) if getattr(graph, "stand_ins", None) else None,
        planner=None if report is None else PlannerRecord(
            cluster=cluster if isinstance(cluster, str) else ctx.cluster.name, strategies=report.strategies,
            predicted_time_s=report.predicted_time_s, predicted_memory_bytes=report.predicted_memory_bytes,
            alternatives=report.alternatives, crossovers=report.explained() if explain else None,
            segments=[list(seg) for seg in report.segments], segment_costs=report.segment_costs,
            schedule=report.schedule or None))  # a sampled plan's planner predicts no stages (its report's {})
    if report is not None and report.memory_warning:
        warnings.warn(GnncWarning(report.memory_warning), stacklevel=2)
    return Plan(program, model.source(), graph_spec, [str(spec) for spec in pipeline], workers, meta, parts,
                results.hybrid_cached, graph if workers > 1 else None, row_sets=results.row_sets,
                threads=ctx.threads)


def _predict_link_bytes(program: Program, split: Any, parts: Any, workers: int, precision: str, results: Any) -> None:
    """A link plan's pair exchange (gnnc.runtime.pair_exchange) beside its encoder's bytes: `pairs` in a training
    step, the positives' fetch and its gradients (the epoch's negatives add `predict_negative_bytes(plan,
    epoch)`), and in an evaluation the validation and test pairs' fetch."""
    if is_pipeline(program) or split_weights(program):
        raise GnncError("link prediction on several workers runs the data-parallel strategies (not GNNPipe's "
                        "pipeline nor P3's push-pull) for now: choose others with --strategy")
    fwd, bwd = predict_pair_bytes(program, split.train_pos, parts, workers, precision)
    results.predicted_bytes = {**results.predicted_bytes, "pairs": fwd + bwd}
    evaluated = np.concatenate([split.val_pos, split.val_neg, split.test_pos, split.test_neg], axis=1)
    results.predicted_eval_bytes = {**(results.predicted_eval_bytes or {}),
                                    "pairs": predict_pair_bytes(program, evaluated, parts, workers, precision)[0]}


def predict_negative_bytes(plan: Plan, graph: Graph, epoch: int) -> int:
    """The bytes of the pair exchange of epoch `epoch`'s training negatives under `plan` (forward and backward),
    `graph` the graph the run splits: exact for a run on the CPU, whose ranks draw the same negatives from
    (seed, epoch) as this replay does (a CUDA generator draws others)."""
    assert plan.parts is not None and plan.meta.partition is not None
    split = split_for(plan.program, graph, plan.meta.partition.seed)
    keys = torch.as_tensor(split.message_keys, dtype=torch.int64)
    neg = draw_negatives(plan.meta.partition.seed, epoch, graph.num_nodes, split.train_negatives(), keys)
    fwd, bwd = predict_pair_bytes(plan.program, neg.numpy(), plan.parts, plan.workers, plan.meta.precision)
    return fwd + bwd


def _warn_unused_logits(program: Program, graph: Any, model: Model) -> None:
    """More logits than the graph has classes: legal (the extra ones are never a label), but rarely meant."""
    t = program.logits.type
    if t is None or len(t.shape) != 1:
        return
    loss = next((e for layer in program.layers for e in layer.eqns if e.outs[0].name == program.loss.name), None)
    if loss is not None and loss.op != "cross_entropy":
        return  # a loss of float targets compares one output per target: a mismatch is refused at the run
    width = as_expr(t.shape[0]).subs({sympy.Symbol(k): v for k, v in program.config if isinstance(v, int)})
    if width.is_Integer and int(width) > graph.num_classes:
        warnings.warn(GnncWarning(f"the logits are {int(width)} wide but graph '{graph.name}' has "
                                  f"{graph.num_classes} classes: {int(width) - graph.num_classes} of them never "
                                  f"match a label", loss.loc if loss else None, model.module.source), stacklevel=3)


def _with_compile_options(pipeline: list[PassSpec], strategy: str | list[str] | None,
                          allow: list[str] | None, memory_cap: int | None = None,
                          pipeline_groups: int = 0) -> list[PassSpec]:
    """The pipeline with the compile's `strategy`, `allow`, `memory_cap` and `pipeline_groups` given to the
    passes that take them.

    A value no pass in the pipeline takes is an error, not a silently ignored request.
    """
    given = {"strategy": strategy if strategy is None or isinstance(strategy, str) else ",".join(strategy),
             "allow": None if allow is None else tuple(allow), "memory_cap": memory_cap,
             "pipeline_groups": pipeline_groups}
    given = {k: v for k, v in given.items() if v}
    for key in given:
        if not any(spec.options is not None and hasattr(spec.options, key) for spec in pipeline):
            raise GnncError(f"--{key}: no pass of the pipeline ({', '.join(s.name for s in pipeline)}) takes it")
    return [with_values(spec, given) for spec in pipeline]


# P3 and its comparison with DGL hash-partition the vertices (P3 section 3.1, and section 5 for DGL)
SAMPLED_PARTITION = "hash"


def _default_partition(strategy: str | None) -> str:
    """The partition method for `--strategy S` when the user names none: the strategy's (bcast1d wants the
    random permutation MG-GCN balances its blocks with), else METIS."""
    sd = STRATEGIES.get(strategy) if strategy else None
    return (sd.default_partition if sd is not None else None) or "metis"


def _compile_auto(model, graph, passes, graph_spec, after, strategy, partition, seed, cluster, allow,
                  precision: str, device: str, memory_cap=None) -> Plan:
    """--workers auto: the worker count (1, 2, 4, ... up to the cluster's) with the least predicted time."""
    profile = resolve_cluster(cluster, device)
    best = compile(model, graph, 1, passes, graph_spec, after, precision=precision)
    best_time = _single_time(best, graph, profile, precision)
    considered = [WorkersTried(1, best_time)]
    n = 2
    while n <= profile.workers:
        plan = compile(model, graph, n, passes, graph_spec, None, strategy, partition, seed, profile, allow,
                       memory_cap=memory_cap, precision=precision)
        t = plan.meta.planner.predicted_time_s if plan.meta.planner is not None else None
        considered.append(WorkersTried(n, t))
        if t is not None and t < best_time:
            best, best_time = plan, t
        n *= 2
    best.meta = dataclasses.replace(best.meta, workers_considered=tuple(considered))
    return best


def _single_time(plan: Plan, graph: Any, profile, precision: str = DEFAULT_PRECISION) -> float:
    """Predicted epoch time on one worker of `profile`: the `local` formula of every graph layer (its evaluation
    pass included), and the optimizer step (gnnc.passes.cost.epoch), as a plan for several workers is priced."""
    import numpy as np

    parts = np.zeros(graph.num_nodes, dtype=np.int64)
    _, inputs, shapes = planning_inputs(plan.program, graph, parts, profile, workers=1, precision=precision)
    layers = [evaluate_cost(segment_cost("local", i, i + 1, shapes[i:i + 1]), inputs).time for i in range(len(shapes))]
    return sum(layers) + epoch_costs(plan.program, inputs)[1].time


def probe(output: str | os.PathLike | None = None, threads: int | None = None, device: str = "cpu",
          network: bool = False, base: str | os.PathLike | None = None,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[ClusterProfile, Path] | None:
    """`gnnc probe`: measure this machine (gnnc.runtime.probe), fit the cost model's figures to it
    (gnnc.passes.cost.fit) and write the profile to `output` (by default the file `--cluster local` reads for
    `device`); returns the profile and where it went.

    `threads` per worker to measure with (by default what a one-process run uses). With `network`, this
    process is one rank of a torchrun job and the profile is the job's machines' (`_probe_network`): rank 0
    writes it and returns it, the others return None.
    """
    resolved = resolve_device(device)
    threads = choose_threads(threads).threads  # what a one-process run would use
    if network:
        if resolved != "cpu":
            raise GnncError(f"--network measures the links between CPU ranks with gloo, not --device {device}'s "
                            "GPUs; to price GPUs on the measured network, run `gnnc probe --device cuda -o GPU.json` "
                            "on one machine and pass --base GPU.json")
        return _probe_network(output, threads, base, timeout_s)
    measured = probe_machine(threads, resolved)
    fitted = _fit_samples(_machine_samples(threads, resolved), measured["intra_bandwidth"])
    profile = ClusterProfile.from_dict({**measured, **fitted}, "probe")
    return profile, _save_profile(profile, Path(output) if output else default_probe_file(resolved))


def _save_profile(profile: ClusterProfile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    return path


def _machine_samples(threads: int, device: str = "cpu", together: Callable[[], None] | None = None) -> dict:
    """Every timing `_fit_samples` fits: each op class's (`probe_op_samples`), PROBE_MODEL's layers', the
    kernels' at several widths. `together`: a barrier of the job's ranks, which then start each timing of a
    layer at once (gnnc.runtime.probe.timing_together): those timings set the level of t_v and t_e, and a
    job's ranks run the same layer at once. The kernels and single ops are timed without it: ranks in step
    on every kernel overstate what sharing costs (2 emulated hosts: GAT's aggregation of 8 heads of 32 at
    1.6 G/s against 3.5 G/s unsynchronised, a DepCache GAT epoch then predicted at 186 ms for 138
    measured), as a run's ranks are in step on a layer but not on each of its kernels."""
    features, hidden, classes = PROBE_OPS_WIDTHS
    ops_model = load_model_source(PROBE_OPS_MODEL, "<gnnc probe>", features=features, hidden=hidden, classes=classes)
    ops = probe_op_samples(lambda graph: compile(ops_model, graph).program, threads, device=device)
    features, hidden, classes = PROBE_WIDTHS
    model = load_model_source(PROBE_MODEL, "<gnnc probe>", features=features, hidden=hidden, classes=classes)
    with timing_together(together) if together is not None else contextlib.nullcontext():
        program, samples, forward = probe_layer_samples(lambda graph: compile(model, graph).program, threads,
                                                        device=device)
    return {"ops": ops, "program": program, "layers": samples, "forward": forward,
            "kernels": kernel_rate_samples(threads, device), "sizes": size_rate_samples(threads, device)}


def _fit_samples(timed: dict, bandwidth: float) -> dict:
    """The cost model's rates fitted to `_machine_samples`' timings, the links at `bandwidth` (ClusterProfile
    fields): op_rates, kernel_rates, size_rates, NeutronStar's unit costs and t_v, t_e, t_c."""
    return fit_profile(timed["program"], timed["layers"], PROBE_WIDTHS, bandwidth, fit_op_rates(timed["ops"]),
                       timed["forward"], [KernelRate(**r) for r in timed["kernels"]], timed.get("sizes", ()))


def _probe_network(output: str | os.PathLike | None, threads: int, base: str | os.PathLike | None,
                   timeout_s: float) -> tuple[ClusterProfile, Path] | None:
    """`gnnc probe --network`: one rank of a torchrun job; rank 0 writes the profile of the job's machines.

    The links come from every rank (gnnc.runtime.probe_network); this host's own figures from `base`
    (a profile `gnnc probe` wrote) or, without it, from measuring the machines in the same job once the
    links are done: every rank measures at once, as a job's ranks compute at once (ranks sharing cores or
    memory see the rates a share gives), each timing of the probe's layers starting on every rank at the
    same moment (`_machine_samples`), and the fit takes every rank's timings (`across_ranks`: each layer
    the slowest rank's, each single op and kernel the median over the ranks); rank 0 writes the profile.
    """
    def time_machine(barrier: Callable[[], None]) -> tuple[dict, tuple[dict, Any]]:
        machine, timed = machine_fields(threads), _machine_samples(threads, together=barrier)
        return {k: v for k, v in timed.items() if k != "program"}, (machine, timed["program"])

    if not started_by_torchrun():
        raise GnncError("gnnc probe --network measures the links between the ranks of a torchrun job: start it "
                        "with torchrun on every host (benchmarks/cluster/emulated.py probe does so for the "
                        "emulated cluster)")
    if not output:
        raise GnncError("gnnc probe --network needs -o PROFILE.json (the profile of the job's machines, not of this one)")
    known = load_profile(base) if base else None  # read before the job: a bad file fails fast
    result = join_torchrun(network_probe if known is not None else partial(links_then_machines,
                                                                            time_machine=time_machine),
                           timeout_s=timeout_s)
    if result is None:
        return None  # a rank other than 0: rank 0 writes the profile
    if known is not None:
        network = profile_fields(result)
        profile = ClusterProfile.from_dict({**known.to_dict(), **network, "name": "measured", "t_c": None,
                                            "unit_costs": []}, "probe")
    else:
        measured, (machine, program), every = result  # rank 0's kernel rates (machine), every rank's timings
        network = profile_fields(measured)
        profile = ClusterProfile.from_dict({**machine, **network, "name": "measured", "t_c": None}, "probe")
        # NeutronStar's T_c is a row's time on the links the ranks share, as the planner prices them
        fitted = _fit_samples({**across_ranks(every), "program": program}, profile.worker_bandwidth(network["workers"]))
        profile = ClusterProfile.from_dict({**profile.to_dict(), **fitted}, "probe")
    return profile, _save_profile(profile, Path(output))


def partition(graph: Any, parts: int, method: str = "metis", seed: int = 0, **options: Any):
    """Partition a graph (anything `load_graph` takes) with one of gnnc.passes.partition's methods."""
    return partition_graph(load_graph(graph), parts, method, seed=seed, **options)


def partition_vertices(graph: Any, parts: int, method: str, seed: int = 0):
    """The part of every vertex (numpy int array), from gnnc.passes.partition."""
    return partition_graph(graph, parts, method, seed=seed).assignment


def run(target: Plan | Model, graph: Any = None, epochs: int | None = None, seed: int = 0, lr: float | None = None,
        weight_decay: float | None = None, progress: bool = False, on_epoch=None, nproc: int | None = None,
        strategy: str | None = None, partition: str | None = None, metrics: str | None = None,
        want_logits: bool = True, sampling: SamplingConfig | None = None, schedule: str | None = None,
        approximate: bool = False, pipeline_groups: int = 0, device: str = "cpu", precision: str | None = None,
        threads: int | str | None = None, memory_cap: int | None = None, checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None, resume: bool = False,
        timeout_s: float | None = None, optimizer: str | None = None, momentum: float | None = None,
        lr_schedule: str | None = None, warmup: int | None = None, clip: float | None = None,
        lr_step_size: int | None = None, lr_gamma: float | None = None, lr_patience: int | None = None,
        lr_factor: float | None = None, eval_every: int | None = None, eval_chunk: int | None = None,
        recompute: bool | None = None) -> RunResult | None:
    """Train a plan (or a model, compiled first for `nproc` workers) on `graph`: in this process, or on the
    plan's workers. This is `gnnc run`: the CLI parses its flags into these arguments and prints the result.

    `graph`: a spec, a Graph or anything `load_graph` takes; for a plan, by default the one it was compiled on
    (a plan of several workers with its shards needs none). `device`: cpu, cuda or auto
    (gnnc.runtime.device.resolve_device); `precision`: fp32, bf16 or fp16, by default the plan's; `threads`
    per process: a count, "auto" for each process its share of the CPUs this one may use (`thread_settings`),
    or None for this process's torch count in one process and "auto" on several. `checkpoint_dir`,
    `checkpoint_every` and `resume` checkpoint the run; `timeout_s` bounds every collective of a distributed
    one. `optimizer` (sgd, adam, adamw), `momentum` (sgd's), `lr_schedule` (none, step, cosine, plateau, with
    `lr_step_size` and `lr_gamma` for step, `lr_patience` and `lr_factor` for plateau), `warmup` (epochs) and
    `clip` (the largest gradient norm) override the model's `training(...)` (gnnc.runtime.train.TrainConfig);
    `eval_every` K evaluates after every K-th epoch only (and the first and the last), `eval_chunk` ROWS layer by
    layer in chunks of that many rows (0: whole layers; None: as gnnc.memory_check.evaluation_chunk decides);
    `recompute` keeps only the graph layers' inputs for the backward and runs each layer again there (one process,
    full-graph).
    Returns a RunResult either way (logits in global vertex order, on the host), None on a rank other
    than 0 of a torchrun job.
    With several workers they are new processes started with 'spawn', which
    imports the caller's main module again in each: a script must call this
    under `if __name__ == "__main__":` (gnnc refuses it otherwise, naming the line). `sampling` trains sampled minibatches.
    """
    device = resolve_device(device)  # before anything is loaded: no GPU is a one-line exit 2
    if isinstance(target, Plan):
        plan, spec = target, graph if graph is not None else target.graph_spec
        if plan.workers > 1:
            check_main_guard(plan.workers)
        g = None
        if plan.shard_dir is None or plan.workers == 1:  # saved shards hold a distributed plan's graph
            if spec is None:
                raise GnncError("the plan names no graph; pass --graph G")
            g = load_graph(spec)
    else:
        if nproc is not None and nproc > 1:
            check_main_guard(nproc)  # before the compile: a script without `if __name__ == "__main__":` fails fast
        if graph is None:
            raise GnncError("gnnc run MODEL.gnn needs --graph G")
        if is_graph_dataset_spec(graph):  # many small graphs: graph classification (gnnc.graph_classification)
            refuse_graph_flags(metrics=metrics, checkpoint=checkpoint_dir, strategy=strategy, partition=partition,
                               fanout=sampling, schedule=schedule, memory_cap=memory_cap, pipeline_groups=pipeline_groups)
            result = run_graph_classification(target, graph, dict(
                epochs=epochs, lr=lr, weight_decay=weight_decay, seed=seed, progress=progress, device=device,
                optimizer=optimizer, momentum=momentum, clip=clip, schedule=lr_schedule, warmup=warmup,
                precision=precision, **thread_settings(
                    None if threads == "auto" else threads, nproc or 1)), nproc or 1, timeout_s=timeout_s)
            result.epochs, result.device = len(result.history), device
            return result
        counts = graph_counts(graph) if (nproc or 1) > 1 and sampling is None and device == "cpu" else None
        if counts is not None:  # refused in seconds, not after the launcher has loaded and partitioned the graph
            check_ranks_before_loading(compile(target, stand_in_graph(counts)).program, counts, nproc)
        spec, g = graph, load_graph(graph)
        if nproc is not None and nproc > g.num_nodes:  # every worker owns at least one vertex
            raise GnncError(f"--nproc {nproc}: more workers than the graph's {g.num_nodes} vertices")
        plan = compile(target, g, workers=nproc or 1, strategy=strategy, partition=partition, seed=seed,
                       graph_spec=graph if isinstance(graph, str) else None, sampling=sampling, schedule=schedule,
                       approximate=approximate, pipeline_groups=pipeline_groups, memory_cap=memory_cap,
                       precision=precision or DEFAULT_PRECISION, device=device)
    cfg = TrainConfig.resolve(plan.program, epochs=epochs, lr=lr, weight_decay=weight_decay, seed=seed,
                              progress=progress, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                              resume=resume, device=device, precision=plan_precision(plan, precision),
                              optimizer=optimizer, momentum=momentum, schedule=lr_schedule, warmup=warmup, clip=clip,
                              lr_step_size=lr_step_size, lr_gamma=lr_gamma, lr_patience=lr_patience,
                              lr_factor=lr_factor, eval_every=eval_every, eval_chunk=eval_chunk, recompute=recompute,
                              # in this process without `threads`, the caller's torch count stands (a program or a
                              # benchmark may have set it); workers get their share
                              **(thread_settings(None if threads == "auto" else threads, plan.workers,
                                                 epoch_elements(plan, g))
                                 if threads or plan.workers > 1 else {}))
    if cfg.recompute and (plan.workers > 1 or plan.sampling is not None):
        raise GnncError("--recompute runs one process's full-graph training for now (a rank's layers exchange rows "
                        "with the others; a sampled minibatch keeps one batch's layers): drop --nproc or the sampling")
    if plan.workers == 1:
        # before the run allocates: refused if it cannot fit
        predicted = check_run_memory(plan, graph=g, device=cfg.device, recompute=cfg.recompute)
        cfg = dataclasses.replace(cfg, eval_chunk=evaluation_chunk(predicted, cfg.eval_chunk, cfg.device))
        result = train_local(plan, g, cfg, metrics, on_epoch)
        result.predicted_peak_rss_bytes = int(predicted.peak)
    else:
        result = run_plan(plan, g if g is not None else spec, cfg, metrics, want_logits, timeout_s)
        if result is None:
            return None  # a rank other than 0 of a torchrun job: rank 0 reports
    result.epochs, result.device, result.precision = cfg.epochs, cfg.device, cfg.precision
    result.model = plan.program.name
    return result


def thread_settings(asked: int | None, workers: int, elements: int | None = None) -> dict[str, Any]:
    """TrainConfig's `threads` and `threads_reason`: `asked` (--threads), or each of the `workers` processes its
    share of the CPUs this one may use (gnnc.host.choose_threads), one thread where a worker's share of the epoch's
    widest vertex tensor (`elements`, `epoch_elements`) is too small to split. Under torchrun the plan's workers
    may span several machines: sharing among all of them gives each rank fewer threads than its machine has, never
    more."""
    choice = choose_threads(asked, workers, elements=None if elements is None else elements // workers)
    return {"threads": choice.threads, "threads_reason": choice.reason}


def epoch_elements(plan: Plan, graph: Graph | None) -> int | None:
    """The elements of a full-graph epoch's widest vertex tensor: vertices x the widest of the graph layers'
    outputs and the input features' nonzeros per vertex (Cora's 1433 bag-of-words columns are 18 a vertex,
    multiplied as sparse: gnnc.graph.storage.input_density). None where the epoch is not that: no graph in this
    process (saved shards), sampled minibatches, no graph layer."""
    dims, _ = layer_dims(plan.program)
    if graph is None or plan.sampling is not None or len(dims) < 2:
        return None
    hidden = int(graph.num_nodes * max(dims[1:]))
    if hidden >= SMALL_EPOCH_ELEMENTS or not isinstance(graph.x, torch.Tensor):
        return hidden  # wide enough to share without counting the features (a large graph's are read once more)
    return max(hidden, int(graph.num_nodes * dims[0] * input_density(graph.x)))


def plan_precision(plan: Plan, asked: str | None) -> str:
    """The precision a run of `plan` uses: the one it was compiled for (its bytes were predicted for it);
    asking for another is refused rather than run with predictions that do not hold."""
    compiled = plan.meta.precision
    if asked is not None and check_precision(asked) != compiled:
        raise GnncError(f"--precision {asked}: the plan was compiled for {compiled}; recompile it with "
                        f"`gnnc compile ... --precision {asked}`")
    return compiled


def train_local(plan: Plan, graph: Graph, cfg: TrainConfig, metrics: str | None = None, on_epoch=None):
    """Train a one-worker plan in this process: full-graph steps, or sampled minibatches when it samples."""
    if plan.sampling is not None:
        return train_minibatch(plan.program, graph, cfg, plan.sampling, plan.schedule, metrics, on_epoch)
    if is_link_prediction(plan.program):
        from gnnc.runtime.link_task import train_link  # deferred: as the runtime's other entry points

        if metrics is not None:
            raise GnncError("--metrics: link-prediction runs report their metrics with --json, not per rank yet")
        return train_link(plan.program, graph, cfg, on_epoch=on_epoch)
    return train(plan.program, graph, cfg, metrics_path=metrics, on_epoch=on_epoch)


def run_plan(plan: Plan, graph: Any, cfg, metrics: str | None = None, want_logits: bool = True,
             timeout_s: float | None = None) -> RunResult | None:
    """Train a plan compiled for several workers: one process per worker, each loading its own shard.

    Returns rank 0's RunResult (None on the other ranks of a torchrun job).

    A saved plan brings its shards; otherwise they are written to a
    temporary directory first, from `graph` (or the graph the plan was
    compiled on), and the graph is dropped before the workers start.
    `timeout_s` bounds every collective: a rank silent for longer is named as hung.
    """
    import tempfile


    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if plan.sampling is not None and cfg.device != "cpu":  # its control messages and blocks stay on the host
        raise GnncError(f"--device {cfg.device}: sampled minibatch training on several workers (--fanout with "
                        f"--nproc {plan.workers}) runs on the CPU for now; one process runs it on the device")
    if cfg.device == "cuda" and not started_by_torchrun():
        check_gpu_count(plan.workers)  # each local rank takes its own GPU
    link_split = _link_split(plan, graph, cfg.seed) if is_link_prediction(plan.program) else None
    if plan.shard_dir is None and plan.graph is None and not started_by_torchrun():
        if graph is None:
            raise PlanError("the plan has no shards and no graph was given to write them from")
        plan.graph = load_graph(graph)
    if plan.graph is not None:
        check_graph_inputs(plan.graph.name, plan.graph.stand_ins)
        if link_split is None:  # link prediction reads no vertex labels
            check_class_labels(plan.graph.y, plan.graph.name, loss_op(plan.program))  # before any worker starts
    else:  # saved shards: what the plan recorded of the graph it was compiled on
        check_graph_inputs(str(plan.graph_spec), plan.meta.graph_stand_ins or {})

    def job_for(shard_dir: str):
        if plan.sampling is not None:
            return sampled_worker, SampledJob(str(plan.program), shard_dir, cfg, plan.sampling, plan.schedule,
                                              metrics, want_logits)
        if link_split is not None:
            if metrics is not None:
                raise GnncError("--metrics: link-prediction runs report their metrics with --json, not per rank yet")
            return link_worker, LinkJob(str(plan.program), shard_dir, cfg, split=link_split)
        return worker, DistJob(str(plan.program), shard_dir, cfg, metrics, want_logits)

    if plan.shard_dir is not None:
        if not started_by_torchrun():
            verify_shards(plan.shard_dir)  # refuse a damaged plan before any process starts
        fn, job = job_for(str(plan.shard_dir))
        if started_by_torchrun():
            # one rank of a torchrun job (possibly across machines): rank 0 returns the summary
            return _result(join_torchrun(fn, job, device=cfg.device, timeout_s=timeout))
        predicted = check_run_memory(plan, shard_dir=plan.shard_dir, device=cfg.device)  # before any worker starts
        cfg = dataclasses.replace(cfg, eval_chunk=evaluation_chunk(predicted, cfg.eval_chunk, cfg.device))
        fn, job = job_for(str(plan.shard_dir))
        return _result(launch(fn, plan.workers, job, device=cfg.device, timeout_s=timeout)[0], predicted)
    if started_by_torchrun():
        raise PlanError("under torchrun every rank reads its shard from the plan: compile it with "
                        "`gnnc compile ... --workers N -o PLAN` and run PLAN")
    if plan.parts is None:
        plan.parts = partition_vertices(plan.graph, plan.workers, plan.meta.partition.method, cfg.seed)
    with tempfile.TemporaryDirectory(prefix="gnnc-shards-") as tmp:
        plan.write_shards(tmp)
        let_go_of_graph(plan.graph)
        plan.graph = None  # the workers read their shards; this process lets go of the whole graph
        predicted = check_run_memory(plan, shard_dir=tmp, device=cfg.device)  # before any worker starts
        cfg = dataclasses.replace(cfg, eval_chunk=evaluation_chunk(predicted, cfg.eval_chunk, cfg.device))
        fn, job = job_for(tmp)
        try:
            return _result(launch(fn, plan.workers, job, device=cfg.device, timeout_s=timeout)[0], predicted)
        finally:
            plan.shard_dir = None


def _link_split(plan: Plan, graph: Any, seed: int) -> Any:
    """The edge split a distributed link-prediction run scores, from the graph the plan was compiled for: its
    encoder's graph (the plan's shards, or the graph they are written from, set here) is that split's
    message-passing graph, so the run's seed must be the compile's."""
    compiled = plan.meta.partition.seed if plan.meta.partition is not None else seed
    if seed != compiled:
        raise GnncError(f"--seed {seed}: this link-prediction plan was compiled on the edge split of seed {compiled} "
                        f"(its encoder passes messages over that split's edges): run it with --seed {compiled} or "
                        f"compile it with --seed {seed}")
    spec = graph if graph is not None else plan.graph_spec
    if spec is None:
        raise GnncError("link prediction on several workers splits the plan's graph's edges: pass --graph G")
    original = load_graph(spec)
    split = split_for(plan.program, original, compiled)
    if plan.shard_dir is None and plan.graph is None and not started_by_torchrun():
        plan.graph = message_graph(original, split)  # the shards are written from it
    return split


def _result(result: RunResult | None, predicted=None) -> RunResult | None:
    """Rank 0's result, with the memory check's estimate of the largest process beside its peak."""
    if result is not None and predicted is not None:
        result.predicted_peak_rss_bytes = int(predicted.peak)
    return result


# ----- a trained model in PyTorch


def one_process_program(target: Plan | Model | Program, graph: Any = None) -> Program:
    """The program one gnnc process runs for `target`: a one-worker plan's own, a distributed plan's model
    compiled again for one worker (its weights are the same), a model compiled (on `graph`, or with its
    dims set), a program as it is."""
    if isinstance(target, Program):
        return target
    if isinstance(target, Plan):
        if target.workers == 1:
            return target.program
        program = target.program  # every parameter bound, features and classes included
        target = Model(parse(target.model.source, target.model.file),
                       tuple((k, str(v)) for k, v in program.config), target.model.name)
        graph = None
    if isinstance(target, Model):
        return compile(target, None if graph is None else load_graph(graph)).program
    raise GnncError(f"to_torch: expected a model, a plan or a program, not a {type(target).__name__}")


def to_torch(model: Plan | Model | Program, weights: Any, graph: Any = None, seed: int = 0) -> GnncModule:
    """`model` (a plan, a model, or a compiled program) with trained `weights` as a torch.nn.Module whose
    `forward(x, edge_index, edge_weight=None)` returns gnnc's logits. A model whose `features` and `classes`
    are not set (`load_model(path, features=..., classes=...)`) takes them from `graph`. `seed` keys the
    dropout masks in training mode, as `gnnc run --seed`."""
    program = one_process_program(model, graph)
    return GnncModule(program, load_weights(weights, program), seed)
