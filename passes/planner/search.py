"""choose-strategy's search: price every candidate segment with the cost model, then run the segment DP.

For the partition the plan is compiled for, the planning inputs
(gnnc.passes.cost.inputs: the partition's per-worker counts, each layer's
shape) price every candidate segment on the cluster profile, and the segment
DP (gnnc.passes.planner.segment_dp) picks the cheapest assignment under the
memory cap, transitions between layouts included. The cap is the cluster's
memory per worker less what every assignment holds alike: the weights, their
gradients and Adam's two moments (a model whose weights alone do not fit is
refused); a choice above WARN_FRACTION of a worker's memory is warned of
(`memory_warning`). The candidates are what the runtime executes: depcomm and
bcast1d per layer, pushpull on the first layer where it is legal, depcache and
hybrid as segments of consecutive layers (hybrid priced with the selection
select-hybrid will make, gnnc.passes.planner.hybrid), and, with `approximate`
only, GNNPipe's pipeline over every layer (priced with the stages, chunks and
groups stage-pipeline will run: gnnc.passes.planner.pipeline).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.analysis.legality import pushpull_blocker, segment_can_start_at
from gnnc.passes.cost.collectives import grad_allreduce
from gnnc.passes.cost.crossovers import crossover
from gnnc.passes.cost.epoch import epoch_costs
from gnnc.passes.cost.evaluation import evaluate_cost, evaluate_costs
from gnnc.passes.cost.inputs import PlanningInputs, planning_inputs
from gnnc.passes.cost.layouts import boundary
from gnnc.passes.cost.memory import OPTIMIZER_COPIES, WARN_FRACTION, parameter_sizes
from gnnc.passes.cost.neutronstar import DepcacheSpans
from gnnc.passes.cost.priced import Formulas, PricedPlan
from gnnc.passes.cost.registry import planner_cost, user_cost
from gnnc.passes.cost.schedule import predicted_schedule
from gnnc.passes.cost.symbols import bw, d
from gnnc.passes.planner.hybrid import select_spans
from gnnc.passes.planner.pipeline import price as price_pipeline
from gnnc.passes.planner.report import PlannerReport
from gnnc.passes.planner.segment_dp import solve
from gnnc.plan.approximation import approximations
from gnnc.plan.precision import DEFAULT_PRECISION
from gnnc.plan.slices import split_weights
from gnnc.plan.strategies import STRATEGIES, names as strategy_names


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
    return [s for s in allowed if STRATEGIES[s].layout_in != "feature" or pushpull_blocker(first, True) is None]


def plan_costs(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
               planned: PlanningInputs | None = None, approximate: bool = False,
               pipeline_groups: int = 0, processes: int = 1) -> PricedPlan:
    """Segment costs (time, memory) for the DP, and the compiled formulas behind them.

    `planned`: the planning inputs when the caller has them already (the pass's analysis cache).
    `approximate`: price the approximate strategies too; `pipeline_groups`: the pipeline's group
    size when the user fixed it (0: every size, the cheapest kept). `processes`: what Algorithm 4's per-worker
    runs may spread over (hybrid.select_spans; the compile's `ctx.threads`).

    The DP's table holds every assignment's time before the all-reduce of replicated weights,
    which `choose` adds to each; a pipeline replicates no weight across its stages (its groups
    reduce their stage's weights inside its own cost), so its entry is its time minus that
    all-reduce, and the sum comes out as its own time. Likewise pushpull keeps P3's split weights
    (W1's rows of each worker's feature slice, gnnc.plan.slices) out of the all-reduce: its entry
    is its time minus what all-reducing them would take (`split_allreduce_saving`).
    """
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
    formulas = Formulas()  # each built when read (the plan's printed formulas, the chosen segments' schedule)
    values: dict[tuple[int, int, str], Any] = {}
    extras: dict[tuple[int, int, str], Any] = {}
    depcache = DepcacheSpans(inputs, shapes)  # every DepCache span, priced without its formula
    segment_spans: list[tuple[int, int]] = []  # found once for every segment strategy
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
            spans = segment_spans = segment_spans or _segment_spans(program, L)
        elif sd.first_layer_only:
            spans = [(0, 1)]
        else:
            spans = [(i, i + 1) for i in range(L)]
        selected = []
        if sd.rows == "selected" and user_cost(s) is None:  # priced with the selections select-hybrid makes
            # cache-all is DepCache's rows with its empty halo (hybrid.select), DepCache's value only for a user's
            # DepCache formula (which prices it as it is)
            known = {k[:2]: v for k, v in values.items() if k[2] == "depcache"} if user_cost("depcache") else {}
            selected = select_spans(stats, inputs, shapes, profile.memory_per_worker, spans, known, graph=graph,
                                    parts=parts, processes=processes)
        built: list[Any] = []  # the spans' formulas, built and evaluated together (a deep model's layers: alike)
        if not selected and not (s == "depcache" and user_cost(s) is None):
            built = [planner_cost(s, start, end, shapes[start:end]) for start, end in spans]
            built = list(zip(built, evaluate_costs(built, inputs)))
        for n, (start, end) in enumerate(spans):
            key = (start, end, s)
            extra = None
            if selected:
                chosen = selected[n]
                extra, value = chosen.values, chosen.value
                formulas[key] = functools.partial(getattr, chosen, "formula")
            elif s == "depcache" and user_cost(s) is None:
                value = depcache.value(start, end)
                formulas[key] = functools.partial(planner_cost, s, start, end, shapes[start:end])
            else:  # its formula, built and evaluated
                formulas[key], value = built[n]
            saved = split_allreduce_saving(program, inputs, allreduce)[0] if sd.layout_in == "feature" else 0.0
            seg_cost[key] = (value.time - saved, value.memory)
            values[key] = value
            extras[key] = extra
    trans: dict[tuple[str, str, int], float] = {}
    # a transition's formula is the layouts' (`boundary`: the one strategy's output layout, the other's input
    # layout): priced once per layout pair and layer, not per strategy pair (S(S-1)(L-1) evaluations)
    by_layouts: dict[tuple[str, str, int], float] = {}
    for a in allowed:
        for b_ in allowed:
            for layer in range(1, L):
                if a != b_:
                    key = (STRATEGIES[a].layout_out, STRATEGIES[b_].layout_in, layer)
                    if key not in by_layouts:
                        by_layouts[key] = evaluate_cost(boundary(a, b_, layer), inputs).time
                    trans[(a, b_, layer)] = by_layouts[key]
    epoch_cost, epoch = epoch_costs(program, inputs)
    return PricedPlan(seg_cost, trans, formulas, values, extras, inputs, shapes, allreduce_cost, allreduce, allowed,
                      pipelines=pipelines, epoch_cost=epoch_cost, epoch=epoch)


def _segment_spans(program: Program, L: int) -> list[tuple[int, int]]:
    """Every span [start, end) a depcache/hybrid segment may hold, by start then end. The spans a start allows
    end before the first layer it may not hold, so the ends are tried up to the first refusal: O(L) refusals,
    not a legality check of each of the L(L+1)/2 spans (each O(L): 4,160 for the 64-layer GCNII example's two
    segment strategies, ~8% of its search)."""
    spans = []
    for start in range(L):
        for end in range(start + 1, L + 1):
            if not segment_can_start_at(program, start, end):
                break
            spans.append((start, end))
    return spans


def split_allreduce_saving(program: Program, inputs, allreduce) -> tuple[float, float]:
    """What the gradient all-reduce (`allreduce`, of every weight) costs beyond the one a plan with pushpull on
    its first layer runs, which leaves P3's split weights out: (seconds, bytes)."""
    split = split_weights(program, pushpull=True)
    kept = sum(float(np.prod([float(x) for x in _shape(p, program)])) for p in program.params()
               if p.value.name not in split)
    smaller = evaluate_cost(grad_allreduce(kept), inputs)
    return allreduce.time - smaller.time, allreduce.bytes - smaller.bytes


def _shape(param, program: Program) -> list[int]:

    return [eval_dim(d, program.config_dict()) for d in param.value.type.shape]


def choose(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
           planned: PlanningInputs | None = None, approximate: bool = False,
           pipeline_groups: int = 0, processes: int = 1) -> PlannerReport:
    priced = plan_costs(program, graph, parts, profile, allow, planned, approximate, pipeline_groups, processes)
    formulas, values, inputs, allreduce, allowed = (priced.formulas, priced.values, priced.inputs, priced.allreduce,
                                                    priced.allowed)
    fixed = allreduce.time + priced.epoch.time  # what every assignment pays besides its segments
    saving = split_allreduce_saving(program, inputs, allreduce)  # a pushpull plan all-reduces less
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
    alternatives, alternative_segments = [], []
    for alt in result.alternatives:
        segs = [(s.start, s.end, s.strategy) for s in alt.segments]
        alternative_segments.append(segs)
        alternatives.append({
            "strategies": list(alt.strategies),
            "time_s": alt.time + fixed,
            "bytes": sum(values[k].bytes for k in segs) + (0.0 if _own_allreduce(segs) else allreduce.bytes)
            - (saving[1] if any(STRATEGIES[k[2]].layout_in == "feature" for k in segs) else 0.0),
            "memory_bytes": alt.memory,  # and "formulas" here, printed when asked for (`_explain`)
            "user_costs": sorted({f"{k[2]}: {user_cost(k[2]).__module__}.{user_cost(k[2]).__name__}"
                                  for k in segs if user_cost(k[2]) is not None}),
            **({"approximate": notes} if (notes := approximations(alt.strategies)) else {}),
        })
    segment_costs = [{"layers": [k[0], k[1]], "strategy": k[2], "time_s": v.time, "bytes": v.bytes,
                      "memory_bytes": v.memory} for k, v in sorted(values.items())]
    segment_costs += [{"layers": [0, L], "strategy": "pipeline", "groups": c.groups, "stages": c.stages,
                       "chunks": c.chunks, "time_s": c.value.time, "bytes": c.value.bytes,
                       "memory_bytes": c.value.memory} for c in priced.pipelines[1:]]
    report = PlannerReport(list(best.strategies), best.time + fixed, best.memory, alternatives, None,
                           [(seg.start, seg.end, seg.strategy) for seg in best.segments], segment_costs, priced,
                           draw_schedule=functools.partial(predicted_schedule, best.segments, priced))
    if _own_allreduce([(seg.start, seg.end, seg.strategy) for seg in best.segments]):
        report.pipeline = priced.pipelines[0]
    report.weights_bytes = weights
    report.find_crossovers = functools.partial(_explain, priced, L, alternatives, alternative_segments)
    if best.memory + weights > WARN_FRACTION * profile.memory_per_worker:
        report.memory_warning = (f"the chosen plan is predicted to take {best.memory + weights:.6g} bytes per "
                                 f"worker ({best.memory:.6g} kept by its layers, {weights:.6g} for the weights and "
                                 f"Adam's state), {(best.memory + weights) / profile.memory_per_worker:.0%} of the "
                                 f"memory per worker of cluster '{profile.name}'")
    return report


def _explain(priced: PricedPlan, L: int, alternatives: list[dict[str, Any]],
             segments: list[list[tuple[int, int, str]]]) -> list[str]:
    """For `--explain` (PlannerReport.explained): each alternative's formulas, printed segment by segment, and
    the crossovers. Printing a deep model's formulas (sympy sorting the terms of every sum) and finding the
    crossovers cost more than choosing: done only when asked for."""
    for i, (alt, segs) in enumerate(zip(alternatives, segments)):
        if "formulas" not in alt:
            items = list(alt.items())
            at = [key for key, _ in items].index("memory_bytes") + 1  # where the plan has always kept them
            printed = {f"{s}[{a}:{b}]": priced.formulas[(a, b, s)].describe() for a, b, s in segs}
            alternatives[i] = dict(items[:at] + [("formulas", printed)] + items[at:])
    return crossovers(priced, L)


def crossovers(priced: PricedPlan, L: int) -> list[str]:
    """Where a choice flips, for `--explain` (PlannerReport.explained: computed only when asked for): the
    bandwidth at which DepComm and DepCache over the whole model take the same time, and P3's width
    question (`_pushpull_crossovers`)."""
    formulas, allowed = priced.formulas, priced.allowed
    out = []
    # whole-model formulas: a segment strategy's span over every layer, a per-layer one's every layer
    pure = {s: [formulas[k] for k in formulas if k[2] == s and (STRATEGIES[s].span == "layer" or k[:2] == (0, L))]
            for s in allowed if s in ("depcomm", "depcache")}
    if "depcomm" in pure and "depcache" in pure and pure["depcomm"] and pure["depcache"]:
        for c in crossover(pure["depcomm"], pure["depcache"], bw, priced.inputs, 1e6, 1e12):
            faster = "depcomm" if c.first_faster_above else "depcache"
            out.append(f"{faster} overtakes {'depcache' if faster == 'depcomm' else 'depcomm'} "
                       f"above {c.value * 8 / 1e9:.3g} Gb/s of bandwidth per worker")
    return out + _pushpull_crossovers(priced)


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
