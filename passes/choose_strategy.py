"""choose-strategy: pick each graph layer's strategy by predicted cost (docs/design.md section 5, step 6).

For the partition the plan is compiled for, the statistics pass gives the
per-worker counts (|V_i|, |E_i|, |B_i|, send sets, L-hop sets); the IR gives
each layer's shape (how many dense maps, whether they run before the
aggregation, attention, heads). The cost formulas (gnnc.passes.cost)
price every candidate segment on the cluster profile, and the segment DP
(gnnc.passes.planner.segment_dp) picks the cheapest assignment under the memory cap,
transitions between layouts included. The cap is the cluster's memory per
worker less what every assignment holds alike: the weights, their gradients
and Adam's two moments (a model whose weights alone do not fit is refused);
a choice above WARN_FRACTION of a worker's memory is warned of
(`memory_warning`). The planner only offers what the runtime executes: depcomm and bcast1d per layer, pushpull on the first layer
where it is legal, depcache and hybrid as segments of consecutive layers
(hybrid priced with the selection select-hybrid will make: Algorithm 4's,
or communicate-all / cache-all when they predict less), and, with
`--approximate` only, GNNPipe's pipeline over every layer (priced with the
stages, chunks and groups stage-pipeline will run: gnnc.passes.planner.pipeline;
its choice goes to `ctx.results.pipeline`); `--allow` narrows
that (`choose-strategy{allow=depcomm,depcache}`); `strategy=S1,S2` fixes
the choice instead (`--strategy`). The choice goes to assign-strategy in
`ctx.results.strategy` and `ctx.results.segments`; the choice and every
alternative's predicted time, bytes and memory go into `ctx.results.planner`
for the plan and `--explain`. The planning inputs (partition statistics,
cost inputs, layer shapes) are the `PlanningInputs` analysis
(gnnc.passes.cost.inputs), computed once per compile and reused by
select-hybrid. The search itself is gnnc.passes.planner.search (full-graph
steps) and gnnc.passes.planner.sampled (`--fanout`); this module is the pass.
"""
from __future__ import annotations

from dataclasses import dataclass

from gnnc.ir import Program
from gnnc.passes.cost.inputs import PlanningInputs
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.pipeline_text import option
from gnnc.passes.planner.sampled import choose_sampled
from gnnc.passes.planner.search import choose
from gnnc.plan.approximation import require_exact


@dataclass(frozen=True)
class ChooseStrategyOptions:
    allow: tuple[str, ...] = option((), "strategies the planner may choose (empty: every plannable one)")
    strategy: str = option("", "fix the strategies instead of planning: one, or one per graph layer (S1,S2)")
    pipeline_groups: int = option(0, "the pipeline's workers per stage, when it is priced (0: every size)")


@register_pass("choose-strategy", "pick per-layer strategies by predicted cost: segment DP over the cost model",
               options=ChooseStrategyOptions, requires=("typed", "partition"))
def choose_strategy(program: Program, ctx: PassContext, opts: ChooseStrategyOptions) -> Program:
    if opts.strategy:
        require_exact(opts.strategy.split(","), None, ctx.approximate)  # the pipeline text's too, not only the API's
        ctx.results.strategy = opts.strategy
        return program
    if ctx.workers == 1:
        return program
    if ctx.sampling is not None:  # sampled minibatches: P3's question on a dry run of the sampler
        report, ctx.results.schedule = choose_sampled(program, ctx, list(opts.allow) or None)
        ctx.results.strategy = ",".join(report.strategies)
        ctx.results.segments = report.segments
        ctx.results.planner = report
        return program
    planned = ctx.analyses.get(PlanningInputs, program)
    report = choose(program, ctx.graph, ctx.parts, ctx.cluster, list(opts.allow) or None, planned,
                    ctx.approximate, opts.pipeline_groups, ctx.threads)
    ctx.results.strategy = ",".join(report.strategies)
    ctx.results.segments = report.segments
    ctx.results.planner = report
    ctx.results.pipeline = report.pipeline
    return program
