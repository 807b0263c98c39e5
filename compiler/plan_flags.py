"""`gnnc run PLAN` refuses flags that contradict the plan, instead of ignoring them.

Why this module exists: a compiled plan fixes the graph (its shards hold it),
the partition, every layer's strategy, the worker count, the sampled
minibatches' fan-outs and batch size, the step schedule and the pipeline's
groups. `--graph`, `--partition`, `--strategy`, `--nproc`, `--fanout`,
`--batch-size`, `--schedule` and `--pipeline-groups` used to be dropped
silently when the target was a plan, so `gnnc run PLAN --graph other` trained on the
plan's graph and reported success. A flag that agrees with the plan is
harmless and accepted; one that differs is an error naming the flag, what
the plan says and how to get what was asked (recompile).
"""
from __future__ import annotations

import os
from pathlib import Path

from gnnc.errors import GnncError
from gnnc.plan.plan_file import Plan


def check_run_flags(plan: Plan, *, graph: str | None, strategy: str | None, partition: str | None,
                    nproc: int | None, fanout: str | None = None, batch_size: int | None = None,
                    schedule: str | None = None, pipeline_groups: int = 0) -> None:
    """Raise GnncError for the first flag given to `gnnc run PLAN` that contradicts `plan`.

    `pipeline_groups` 0 is the flag's default (not given)."""
    recompile = "recompile the plan (gnnc compile ... -o PLAN) to change it"
    if graph is not None:
        if plan.graph_spec is not None and not same_graph(graph, plan.graph_spec):
            raise GnncError(f"--graph {graph}: the plan was compiled for graph '{plan.graph_spec}'; {recompile}")
        if plan.graph_spec is None and plan.workers > 1 and plan.shard_dir is not None:
            raise GnncError(f"--graph {graph}: the plan's shards hold the graph it was compiled for; {recompile}")
    if nproc is not None and nproc != plan.workers:
        raise GnncError(f"--nproc {nproc}: the plan was compiled for {plan.workers} worker"
                        f"{'s' if plan.workers != 1 else ''}; {recompile}")
    planned = [layer.attr("strategy", "local") for layer in plan.program.graph_layers()]
    if strategy is not None:
        asked = strategy.split(",")
        if len(asked) == 1:
            asked = asked * len(planned)
        if asked != planned:
            raise GnncError(f"--strategy {strategy}: the plan runs {','.join(planned)}; {recompile}")
    sampling = plan.sampling
    if fanout is not None and (sampling is None or _fanouts(fanout) != sampling.fanouts):
        said = f"fan-outs {sampling.text}" if sampling else "full-graph training (no --fanout)"
        raise GnncError(f"--fanout {fanout}: the plan was compiled for {said}; {recompile}")
    if batch_size is not None and (sampling is None or batch_size != sampling.batch_size):
        said = f"batches of {sampling.batch_size} seeds" if sampling else "full-graph training (no batches)"
        raise GnncError(f"--batch-size {batch_size}: the plan was compiled for {said}; {recompile}")
    if schedule is not None and schedule != plan.schedule:
        raise GnncError(f"--schedule {schedule}: the plan was compiled for the {plan.schedule} schedule; {recompile}")
    if pipeline_groups:
        groups = (plan.meta.pipeline or {}).get("groups")
        if groups != pipeline_groups:
            said = f"{groups} workers per stage" if groups else "no pipeline"
            raise GnncError(f"--pipeline-groups {pipeline_groups}: the plan was compiled with {said}; {recompile}")
    if partition is not None:
        method = plan.meta.partition.method if plan.meta.partition else None
        if method != partition:
            said = f"a {method} partition" if method else "no partition (one worker)"
            raise GnncError(f"--partition {partition}: the plan was compiled with {said}; {recompile}")


def _fanouts(text: str) -> tuple[int, ...] | None:
    """`--fanout`'s numbers, or None for text that is not comma-separated integers (then no plan matches)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        return None


def same_graph(a: str, b: str) -> bool:
    """Whether two graph specs name the same graph: the same text, or paths to the same file."""
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    try:
        return pa.exists() and pb.exists() and os.path.samefile(pa, pb)
    except OSError:
        return False
