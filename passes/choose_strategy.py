"""choose-strategy: pick each graph layer's strategy by predicted cost (docs/design.md section 5, step 6).

For the partition the plan is compiled for, the statistics pass gives the
per-worker counts (|V_i|, |E_i|, |B_i|, send sets, L-hop sets); the IR gives
each layer's shape (how many dense maps, whether they run before the
aggregation, attention, heads). The cost formulas (gnnc.passes.cost)
price every candidate segment on the cluster profile, and the segment DP
(passes/segment_dp.py) picks the cheapest assignment under the memory cap,
transitions between layouts included. The cap is the cluster's memory per
worker less what every assignment holds alike: the weights, their gradients
and Adam's two moments (a model whose weights alone do not fit is refused);
a choice above WARN_FRACTION of a worker's memory is warned of
(`memory_warning`). The planner only offers what the runtime executes: depcomm and bcast1d per layer, pushpull on the first layer
where it is legal, depcache and hybrid as segments of consecutive layers
(hybrid priced with the selection select-hybrid will make: Algorithm 4's,
or communicate-all / cache-all when they predict less), and, with
`--approximate` only, GNNPipe's pipeline over every layer (priced with the
stages, chunks and groups stage-pipeline will run: gnnc.passes.pipeline_plan;
its choice goes to `ctx.results.pipeline`); `--allow` narrows
that (`choose-strategy{allow=depcomm,depcache}`); `strategy=S1,S2` fixes
the choice instead (`--strategy`). The choice goes to assign-strategy in
`ctx.results.strategy` and `ctx.results.segments`; the choice and every
alternative's predicted time, bytes and memory go into `ctx.results.planner`
for the plan and `--explain`. The planning inputs (partition statistics,
cost inputs, layer shapes) are the `PlanningInputs` analysis, computed once
per compile and reused by select-hybrid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph import input_density
from gnnc.ir import Layer, Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.cost.collectives import grad_allreduce
from gnnc.passes.cost.crossovers import crossover
from gnnc.passes.cost.epoch import optimizer_cost
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.layouts import boundary
from gnnc.passes.cost.memory import OPTIMIZER_COPIES, WARN_FRACTION, parameter_sizes
from gnnc.passes.cost.ops import optimizer_work, program_op_work, sparse_values
from gnnc.passes.cost.registry import planner_cost, user_cost
from gnnc.passes.cost.schedule import predicted_schedule
from gnnc.passes.cost.symbols import CostInputs, LayerShape, bw, d
from gnnc.passes.legality import pushpull_blocker
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.pipeline_plan import price as price_pipeline
from gnnc.passes.pipeline_text import option
from gnnc.passes.predict_bytes import param_dependent
from gnnc.passes.segment_dp import solve
from gnnc.plan.approximation import approximations, require_exact
from gnnc.plan.precision import DEFAULT_PRECISION
from gnnc.plan.strategies import STRATEGIES, names as strategy_names


@dataclass
class PlannerReport:
    """What the planner decided and what it compared."""

    strategies: list[str]
    predicted_time_s: float
    predicted_memory_bytes: float
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    crossovers: list[str] = field(default_factory=list)
    segments: list[tuple[int, int, str]] = field(default_factory=list)  # the chosen (start, end, strategy)
    # every segment priced: {"layers": [start, end], "strategy", "time_s", "bytes", "memory_bytes"}
    segment_costs: list[dict[str, Any]] = field(default_factory=list)
    # the chosen assignment's epoch, stage by stage and worker by worker (`predicted_schedule`); the
    # schedule pass redraws it from the schedule it annotates (gnnc.passes.cost.scheduled)
    schedule: dict[str, Any] = field(default_factory=dict)
    priced: Any = field(default=None, repr=False)  # the PricedPlan behind it (not saved with the plan)
    pipeline: Any = None  # the chosen pipeline (a pipeline_plan.PipelineChoice), when one was chosen
    # bytes every worker holds whatever the assignment: the weights, their gradients and Adam's two moments
    weights_bytes: float = 0.0
    memory_warning: str = ""  # set when the choice takes more than WARN_FRACTION of a worker's memory


def layer_shape(layer: Layer, needs_grad: set[str], sparse: set[str] = frozenset()):
    """The cost model's view of one lowered graph layer (`sparse`: the values held as sparse input features,
    gnnc.passes.cost.ops.sparse_values, when the graph's are)."""
    ops = [e.op for e in layer.eqns]
    first_linear = next((i for i, o in enumerate(ops) if o == "linear"), None)
    first_agg = next((i for i, o in enumerate(ops) if o in ("spmm", "gather")), None)
    gemm_first = first_linear is not None and (first_agg is None or first_linear < first_agg)
    sparse_gemms = sum(1 for e in layer.eqns if e.op == "linear" and e.ins[0].name in sparse)
    return LayerShape(gemms=max(1, ops.count("linear")), gemm_first=gemm_first,
                      attention="sddmm" in ops or "edge_softmax" in ops, mean_heads="mean_heads" in ops,
                      input_grad=layer.inputs[0].name in needs_grad, sparse_gemms=sparse_gemms)


def layer_dims(program: Program) -> tuple[list[float], list[float]]:
    """d_0..d_L (input width of each graph layer, then the last output) and heads per layer."""

    cfg = program.config_dict()
    layers = program.graph_layers()
    dims = [float(eval_dim(layers[0].inputs[0].type.shape[0], cfg))]
    heads = []
    for layer in layers:
        dims.append(float(eval_dim(layer.outputs[0].type.shape[0], cfg)))
        h = next((e.attr("heads") for e in layer.eqns if e.op == "linear" and e.attr("heads") is not None), None)
        heads.append(float(eval_dim(h, cfg)) if h is not None else 1.0)
    return dims, heads


def candidates(program: Program, allow: list[str] | None, approximate: bool = False) -> list[str]:
    """The strategies the planner prices: `allow` (default every plannable one), exact ones only unless
    `approximate` (naming an approximate one without it is an error that says what it approximates)."""
    plannable = strategy_names(plannable=True, batching="full")
    allowed = list(allow) if allow else [s for s in plannable if approximate or STRATEGIES[s].exact]
    for s in allowed:
        if s not in plannable:
            raise GnncError(f"--allow {s}: the planner chooses among {', '.join(plannable)}")
        if not (approximate or STRATEGIES[s].exact):
            raise GnncError(f"--allow {s}: '{s}' is approximate ({STRATEGIES[s].approximates}); "
                            f"pass --approximate to allow it")
    first = program.graph_layers()[0]
    # a strategy that splits the input features needs a first layer linear in them (P3's legality)
    return [s for s in allowed if STRATEGIES[s].layout_in != "feature" or pushpull_blocker(first) is None]


def planning_inputs(program: Program, graph, parts: np.ndarray, profile, workers: int | None = None,
                    precision: str = "fp32"):
    """What every cost formula is evaluated on: partition statistics, cost inputs (at the run's
    precision), each graph layer's shape.

    `workers`: the plan's worker count, when its last parts may be empty (the largest part id + 1 otherwise).
    """
    layers = program.graph_layers()
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers) else "plain"
    stats = compute_stats(graph, parts, len(layers), view, num_parts=workers)
    dims, heads = layer_dims(program)
    density = input_density(graph.x)
    needs_grad = param_dependent(program)
    sparse = sparse_values(program) if density < 1.0 else set()
    shapes = [layer_shape(layer, needs_grad, sparse) for layer in layers]
    inputs = CostInputs.from_stats(stats, dims, profile.for_workers(stats.parts), heads=heads, precision=precision,
                                   op_work=program_op_work(program, input_density=density), input_density=density,
                                   shapes=shapes)
    return stats, inputs, shapes


@dataclass(frozen=True)
class PlanningInputs:
    """The `planning_inputs` of the compile's program, partition and cluster, as a cached analysis."""

    stats: Any
    inputs: Any
    shapes: list[Any]

    @classmethod
    def compute(cls, program: Program, ctx: PassContext) -> "PlanningInputs":
        return cls(*planning_inputs(program, ctx.graph, ctx.parts, ctx.cluster, ctx.workers, ctx.precision))


@dataclass
class PricedPlan:
    """Everything `plan_costs` priced: the DP's tables, and what the schedule of the choice needs.

    seg_cost, trans: the DP's inputs (time, memory) per segment and time per transition.
    formulas, values, extras: per segment key (start, end, strategy) its Cost, its evaluated
        CostValue and the extra symbol values it was evaluated with (a Hybrid selection, else None).
    allreduce: the gradient all-reduce (Cost and CostValue), paid once per step after the backward.
    epoch: what every assignment pays besides its segments, transitions and all-reduce (Cost and
        CostValue, gnnc.passes.cost.epoch): the optimizer step.
    """

    seg_cost: dict[tuple[int, int, str], tuple[float, float]]
    trans: dict[tuple[str, str, int], float]
    formulas: dict[tuple[int, int, str], Any]
    values: dict[tuple[int, int, str], Any]
    extras: dict[tuple[int, int, str], Any]
    inputs: Any
    shapes: list[Any]
    allreduce_cost: Any
    allreduce: Any
    allowed: list[str]
    grad_ready: tuple[int, ...] = ()
    grad_overlap: bool = False
    pipelines: list[Any] = field(default_factory=list)
    epoch_cost: Any = None
    epoch: Any = None


def epoch_costs(program: Program, inputs: CostInputs) -> tuple[Any, Any]:
    """The optimizer step of one epoch of `program` (gnnc.passes.cost.epoch), and its value."""
    cost = optimizer_cost(*optimizer_work(program))
    return cost, evaluate_cost(cost, inputs)


def plan_costs(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
               planned: PlanningInputs | None = None, approximate: bool = False,
               pipeline_groups: int = 0) -> PricedPlan:
    """Segment costs (time, memory) for the DP, and the compiled formulas behind them.

    `planned`: the planning inputs when the caller has them already (the pass's analysis cache).
    `approximate`: price the approximate strategies too; `pipeline_groups`: the pipeline's group
    size when the user fixed it (0: every size, the cheapest kept).

    The DP's table holds every assignment's time before the all-reduce of replicated weights,
    which `choose` adds to each; a pipeline replicates no weight across its stages (its groups
    reduce their stage's weights inside its own cost), so its entry is its time minus that
    all-reduce, and the sum comes out as its own time.
    """
    # cycle: assign-strategy reads choose-strategy's PlanningInputs
    from gnnc.passes.assign_strategy import segment_can_start_at

    L = len(program.graph_layers())
    if planned is None:
        planned = PlanningInputs(*planning_inputs(program, graph, parts, profile))
    stats, inputs, shapes = planned.stats, planned.inputs, planned.shapes
    allowed = candidates(program, allow, approximate)
    params = sum(float(np.prod([float(x) for x in _shape(p, program)])) for p in program.params())
    allreduce_cost = grad_allreduce(params)
    allreduce = evaluate_cost(allreduce_cost, inputs)
    pipelines: list[Any] = []
    seg_cost: dict[tuple[int, int, str], tuple[float, float]] = {}
    formulas: dict[tuple[int, int, str], Any] = {}
    values: dict[tuple[int, int, str], Any] = {}
    extras: dict[tuple[int, int, str], Any] = {}
    for s in allowed:
        sd = STRATEGIES[s]
        if sd.whole_model:
            if inputs.precision != DEFAULT_PRECISION:
                continue  # the pipeline runs in fp32 (predict-bytes refuses it at 16 bits): not a candidate
            pipelines = price_pipeline(program, graph, inputs, shapes, profile, int(parts.max()) + 1, pipeline_groups)
            if pipelines:
                best = pipelines[0]
                key = (0, L, s)
                seg_cost[key] = (best.value.time - allreduce.time, best.value.memory)
                formulas[key], values[key], extras[key] = best.cost, best.value, best.extra
            continue
        if sd.span == "segment":  # every span a segment may hold (GCNII's only from layer 0)
            spans = [(start, end) for start in range(L) for end in range(start + 1, L + 1)
                     if segment_can_start_at(program, start, end)]
        elif sd.first_layer_only:
            spans = [(0, 1)]
        else:
            spans = [(i, i + 1) for i in range(L)]
        for start, end in spans:
            cost = planner_cost(s, start, end, shapes[start:end])
            extra = None
            if sd.rows == "selected" and user_cost(s) is None:  # priced with the selection select-hybrid makes
                # cycle: select-hybrid reads choose-strategy's PlanningInputs
                from gnnc.passes.select_hybrid import select

                chosen = select(stats, inputs, shapes, profile.memory_per_worker, start, end, cost)
                extra, value, cost = chosen.values, chosen.value, chosen.formula
            else:
                value = evaluate_cost(cost, inputs, extra)
            seg_cost[(start, end, s)] = (value.time, value.memory)
            formulas[(start, end, s)] = cost
            values[(start, end, s)] = value
            extras[(start, end, s)] = extra
    trans: dict[tuple[str, str, int], float] = {}
    for a in allowed:
        for b_ in allowed:
            for layer in range(1, L):
                if a != b_:
                    trans[(a, b_, layer)] = evaluate_cost(boundary(a, b_, layer), inputs).time
    epoch_cost, epoch = epoch_costs(program, inputs)
    return PricedPlan(seg_cost, trans, formulas, values, extras, inputs, shapes, allreduce_cost, allreduce, allowed,
                      pipelines=pipelines, epoch_cost=epoch_cost, epoch=epoch)


def _shape(param, program: Program) -> list[int]:

    return [eval_dim(d, program.config_dict()) for d in param.value.type.shape]


def choose(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
           planned: PlanningInputs | None = None, approximate: bool = False,
           pipeline_groups: int = 0) -> PlannerReport:
    priced = plan_costs(program, graph, parts, profile, allow, planned, approximate, pipeline_groups)
    formulas, values, inputs, allreduce, allowed = (priced.formulas, priced.values, priced.inputs, priced.allreduce,
                                                    priced.allowed)
    fixed = allreduce.time + priced.epoch.time  # what every assignment pays besides its segments
    L = len(program.graph_layers())
    # a worker's memory holds the weights, their gradients and Adam's moments besides what the segments keep
    weights = (1 + OPTIMIZER_COPIES) * sum(s.bytes for s in parameter_sizes(program))
    room = profile.memory_per_worker - weights
    if room <= 0:
        raise GnncError(f"the weights, their gradients and Adam's moments take {weights:.6g} bytes per worker, more "
                        f"than the {profile.memory_per_worker:.6g} bytes cluster '{profile.name}' has; make the model "
                        f"smaller (--set)")
    result = solve(L, allowed, priced.seg_cost, priced.trans, memory_cap=room)
    best = result.best
    alternatives = []
    for alt in result.alternatives:
        segs = [(s.start, s.end, s.strategy) for s in alt.segments]
        alternatives.append({
            "strategies": list(alt.strategies),
            "time_s": alt.time + fixed,
            "bytes": sum(values[k].bytes for k in segs) + (0.0 if _own_allreduce(segs) else allreduce.bytes),
            "memory_bytes": alt.memory,
            "formulas": {f"{k[2]}[{k[0]}:{k[1]}]": formulas[k].describe() for k in segs},
            "user_costs": sorted({f"{k[2]}: {user_cost(k[2]).__module__}.{user_cost(k[2]).__name__}"
                                  for k in segs if user_cost(k[2]) is not None}),
            **({"approximate": notes} if (notes := approximations(alt.strategies)) else {}),
        })
    crossovers = []
    # whole-model formulas: a segment strategy's span over every layer, a per-layer one's every layer
    pure = {s: [formulas[k] for k in formulas if k[2] == s and (STRATEGIES[s].span == "layer" or k[:2] == (0, L))]
            for s in allowed}
    if "depcomm" in pure and "depcache" in pure and pure["depcomm"] and pure["depcache"]:
        for c in crossover(pure["depcomm"], pure["depcache"], bw, inputs, 1e6, 1e12):
            faster = "depcomm" if c.first_faster_above else "depcache"
            crossovers.append(f"{faster} overtakes {'depcache' if faster == 'depcomm' else 'depcomm'} "
                              f"above {c.value * 8 / 1e9:.3g} Gb/s of bandwidth per worker")
    crossovers += _pushpull_crossovers(priced)
    segment_costs = [{"layers": [k[0], k[1]], "strategy": k[2], "time_s": v.time, "bytes": v.bytes,
                      "memory_bytes": v.memory} for k, v in sorted(values.items())]
    segment_costs += [{"layers": [0, L], "strategy": "pipeline", "groups": c.groups, "stages": c.stages,
                       "chunks": c.chunks, "time_s": c.value.time, "bytes": c.value.bytes,
                       "memory_bytes": c.value.memory} for c in priced.pipelines[1:]]
    report = PlannerReport(list(best.strategies), best.time + fixed, best.memory, alternatives, crossovers,
                           [(seg.start, seg.end, seg.strategy) for seg in best.segments], segment_costs,
                           predicted_schedule(best.segments, priced), priced)
    if _own_allreduce([(seg.start, seg.end, seg.strategy) for seg in best.segments]):
        report.pipeline = priced.pipelines[0]
    report.weights_bytes = weights
    if best.memory + weights > WARN_FRACTION * profile.memory_per_worker:
        report.memory_warning = (f"the chosen plan is predicted to take {best.memory + weights:.6g} bytes per "
                                 f"worker ({best.memory:.6g} kept by its layers, {weights:.6g} for the weights and "
                                 f"Adam's state), {(best.memory + weights) / profile.memory_per_worker:.0%} of the "
                                 f"memory per worker of cluster '{profile.name}'")
    return report


def _own_allreduce(segments) -> bool:
    """Whether an assignment reduces its weights in its own cost (a pipeline: no weight is replicated)."""
    return any(STRATEGIES[k[2]].whole_model for k in segments)


def _pushpull_crossovers(priced: PricedPlan) -> list[str]:
    """P3's question: up to which output width of the first layer (d_1, the hidden size) push-pull beats
    the best other way to run that layer. Layer against layer, as P3 section 3.2 weighs them."""
    key = (0, 1, "pushpull")
    rivals = [k for k in priced.formulas if k[:2] == (0, 1) and k[2] != "pushpull"]
    if key not in priced.formulas or not rivals:
        return []
    rival = min(rivals, key=lambda k: (priced.values[k].time, k[2]))
    out = []
    for c in crossover([priced.formulas[key]], [priced.formulas[rival]], d(1), priced.inputs, 1.0, 65536.0,
                          extra_second=priced.extras.get(rival)):
        side = "once" if c.first_faster_above else "while"
        sign = ">" if c.first_faster_above else "<"
        out.append(f"pushpull beats {rival[2]} on layer 1 {side} its output width (hidden) {sign} {c.value:.4g}")
    return out


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
        # cycle: plan_sampled reads this module's layer shapes and report
        from gnnc.passes.plan_sampled import choose_sampled

        report, ctx.results.schedule = choose_sampled(program, ctx, list(opts.allow) or None)
        ctx.results.strategy = ",".join(report.strategies)
        ctx.results.segments = report.segments
        ctx.results.planner = report
        return program
    planned = ctx.analyses.get(PlanningInputs, program)
    report = choose(program, ctx.graph, ctx.parts, ctx.cluster, list(opts.allow) or None, planned,
                    ctx.approximate, opts.pipeline_groups)
    ctx.results.strategy = ",".join(report.strategies)
    ctx.results.segments = report.segments
    ctx.results.planner = report
    ctx.results.pipeline = report.pipeline
    return program
