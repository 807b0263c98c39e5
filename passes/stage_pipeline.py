"""stage-pipeline: write GNNPipe's pipeline into the IR: each layer's stage, the chunks, the groups, alpha.

When the graph layers run `pipeline` (the planner's choice under
--approximate, or the user's `--strategy pipeline --approximate`), this pass
decides what the runtime executes (gnnc.passes.planner.pipeline): stages of
consecutive layers balanced by predicted cost, K = 4 x stages METIS chunks
(`chunks=K` overrides), groups of G workers per stage running it
graph-parallel (`pipeline_groups=G`: the planner's choice, else the user's,
else one worker per stage when there are enough graph layers), and the
history refreshed every `history_every` epochs (GNNPipe's alpha, 23); the
neighbours no chunk has processed yet in an epoch are read from the last
refresh as GNNPipe publishes it (`history_update=refresh`) or from the
previous epoch (`history_update=chunk`). The
annotations are gnnc.plan.pipeline's; the chunking (the plan's partition)
and the priced choice go to `ctx.results.pipeline`. Any other program
passes unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir.ops import op_def
from gnnc.passes.cost.inputs import PlanningInputs
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.pipeline_text import option
from gnnc.passes.planner.pipeline import group_options, price
from gnnc.plan import pipeline as plan_pipeline


@dataclass(frozen=True)
class StagePipelineOptions:
    pipeline_groups: int = option(0, "workers per stage, running it graph-parallel (0: the planner's choice, "
                                     "else one per stage)")
    chunks: int = option(0, "chunks of vertices (0: GNNPipe's 4 x stages)")
    history_every: int = option(plan_pipeline.HISTORY_EVERY, "epochs between refreshes of the history "
                                                              "(GNNPipe's alpha)")
    history_update: str = option(plan_pipeline.HISTORY_UPDATE, "where neighbours no chunk has processed this "
                                                                "epoch are read: refresh, the last refresh "
                                                                "(GNNPipe's trick 3); chunk, the previous epoch")
    shuffle_chunks: bool = option(True, "a new chunk order every epoch (GNNPipe's trick 1; false to measure it)")


@register_pass("stage-pipeline", "GNNPipe: stages balanced by predicted cost, METIS chunks, groups, the history "
                                 "refresh", options=StagePipelineOptions, requires=("strategies", "partition"))
def stage_pipeline(program: Program, ctx: PassContext, opts: StagePipelineOptions) -> Program:
    if not plan_pipeline.is_pipeline(program):
        return program
    if any(layer.attr("strategy") != plan_pipeline.STRATEGY for layer in program.graph_layers()):
        raise GnncError("the pipeline runs every graph layer as one segment; it does not mix with other strategies "
                        "(--strategy pipeline)")
    for layer in program.layers:
        for e in layer.eqns:
            if op_def(e.op).state:  # batch_norm: statistics of every vertex, running ones kept between steps
                raise GnncError(f"the pipeline computes chunk by chunk, so '{e.op}' (statistics over every vertex) "
                                f"cannot run in it; use an exact strategy", e.loc)
    if opts.history_every < 1 or opts.chunks < 0:
        raise GnncError("stage-pipeline: history_every must be at least 1 and chunks at least 0")
    if opts.history_update not in plan_pipeline.HISTORY_UPDATES:
        raise GnncError(f"stage-pipeline: history_update must be one of {', '.join(plan_pipeline.HISTORY_UPDATES)}, "
                        f"got {opts.history_update!r}")
    chosen = ctx.results.pipeline
    groups = opts.pipeline_groups or (chosen.groups if chosen is not None else 0) or _default_groups(
        ctx.workers, len(program.graph_layers()))
    if chosen is None or chosen.groups != groups or opts.chunks or opts.history_every != chosen.history_every \
            or opts.history_update != chosen.history_update:
        planned = ctx.analyses.get(PlanningInputs, program)
        chosen = price(program, ctx.graph, planned.inputs, planned.shapes, ctx.cluster, ctx.workers, groups,
                       opts.history_every, chunks=opts.chunks or None, history_update=opts.history_update)[0]
    ctx.results.pipeline = chosen
    return plan_pipeline.annotate(program, chosen.stage_of, chosen.chunks, chosen.groups, chosen.history_every,
                                  chosen.pipe_grad, chosen.history_update, opts.shuffle_chunks)


def _default_groups(workers: int, layers: int) -> int:
    """One worker per stage when the graph layers allow it, else the smallest groups that fit."""
    options = group_options(workers, layers)
    if not options:
        raise GnncError(f"no pipeline of {workers} workers fits {layers} graph layers: every stage needs a graph "
                        f"layer and there must be at least two stages (--pipeline-groups G puts G workers on each)")
    return options[0]
