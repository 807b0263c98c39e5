"""choose-strategy: pick each graph layer's strategy by predicted cost (DESIGN.md section 5, step 6).

For the partition the plan is compiled for, the statistics pass gives the
per-worker counts (|V_i|, |E_i|, |B_i|, send sets, L-hop sets); the IR gives
each layer's shape (how many dense maps, whether they run before the
aggregation, attention, heads). The cost formulas (passes/cost_model.py)
price every candidate segment on the cluster profile, and the segment DP
(passes/segment_dp.py) picks the cheapest assignment under the memory cap,
transitions between layouts included. The planner only offers what the
runtime executes: depcomm and bcast1d per layer, pushpull on the first layer
where it is legal, depcache and hybrid as segments of consecutive layers
(hybrid priced with the selection select-hybrid will make: Algorithm 4's,
or communicate-all / cache-all when they predict less); `--allow` narrows
that. The chosen segments go to assign-strategy in `ctx.options["segments"]`.
The choice and every alternative's predicted time, bytes and memory go into
`ctx.options["planner"]` for the plan and `--explain`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Layer, Program
from gnnc.pass_manager import PassContext, register_pass

PLANNABLE = ("depcomm", "depcache", "hybrid", "bcast1d", "pushpull")
# User cost functions (gnnc.register_cost), used instead of the built-in formula of their strategy.
_USER_COSTS: dict[str, Any] = {}


def register_cost(strategy: str):
    """Decorator: `fn(start, end, shapes) -> cost_model.Cost` prices `strategy` for the planner.

    It replaces the built-in formula of that strategy (one of the plannable
    ones) wherever the planner evaluates it; `--explain` names the function.
    """
    if strategy not in PLANNABLE:
        raise GnncError(f"register_cost: '{strategy}' is not a strategy the planner chooses ({', '.join(PLANNABLE)})")

    def deco(fn):
        _USER_COSTS[strategy] = fn
        return fn

    return deco


def _segment_cost(strategy: str, start: int, end: int, shapes):
    from gnnc.passes import cost_model as cm

    user = _USER_COSTS.get(strategy)
    if user is not None:
        return user(start, end, shapes)
    return cm.segment_cost(strategy, start, end, shapes)


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


def layer_shape(layer: Layer, needs_grad: set[str]):
    """The cost model's view of one lowered graph layer."""
    from gnnc.passes.cost_model import LayerShape

    ops = [e.op for e in layer.eqns]
    first_linear = next((i for i, o in enumerate(ops) if o == "linear"), None)
    first_agg = next((i for i, o in enumerate(ops) if o in ("spmm", "gather")), None)
    gemm_first = first_linear is not None and (first_agg is None or first_linear < first_agg)
    return LayerShape(gemms=max(1, ops.count("linear")), gemm_first=gemm_first,
                      attention="sddmm" in ops or "edge_softmax" in ops, mean_heads="mean_heads" in ops,
                      input_grad=layer.inputs[0].name in needs_grad)


def layer_dims(program: Program) -> tuple[list[float], list[float]]:
    """d_0..d_L (input width of each graph layer, then the last output) and heads per layer."""
    from gnnc.runtime.executor import eval_dim

    cfg = program.config_dict()
    layers = program.graph_layers()
    dims = [float(eval_dim(layers[0].inputs[0].type.shape[0], cfg))]
    heads = []
    for layer in layers:
        dims.append(float(eval_dim(layer.outputs[0].type.shape[0], cfg)))
        h = next((e.attr("heads") for e in layer.eqns if e.op == "linear" and e.attr("heads") is not None), None)
        heads.append(float(eval_dim(h, cfg)) if h is not None else 1.0)
    return dims, heads


def candidates(program: Program, allow: list[str] | None) -> list[str]:
    from gnnc.passes.legality import pushpull_blocker

    allowed = list(allow) if allow else list(PLANNABLE)
    for s in allowed:
        if s not in PLANNABLE:
            raise GnncError(f"--allow {s}: the planner chooses among {', '.join(PLANNABLE)}")
    layers = program.graph_layers()
    if "pushpull" in allowed and pushpull_blocker(layers[0]) is not None:
        allowed.remove("pushpull")
    return allowed


def planning_inputs(program: Program, graph, parts: np.ndarray, profile):
    """What every cost formula is evaluated on: partition statistics, cost inputs, each graph layer's shape."""
    from gnnc.passes import cost_model as cm
    from gnnc.passes.graph_stats import compute_stats
    from gnnc.passes.predict_bytes import param_dependent

    layers = program.graph_layers()
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers) else "plain"
    stats = compute_stats(graph, parts, len(layers), view)
    dims, heads = layer_dims(program)
    inputs = cm.CostInputs.from_stats(stats, dims, profile.for_workers(int(parts.max()) + 1), heads=heads)
    needs_grad = param_dependent(program)
    return stats, inputs, [layer_shape(layer, needs_grad) for layer in layers]


def plan_costs(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None):
    """Segment costs (time, memory) for the DP, and the compiled formulas behind them."""
    from gnnc.passes import cost_model as cm

    L = len(program.graph_layers())
    stats, inputs, shapes = planning_inputs(program, graph, parts, profile)
    allowed = candidates(program, allow)
    seg_cost: dict[tuple[int, int, str], tuple[float, float]] = {}
    formulas: dict[tuple[int, int, str], Any] = {}
    values: dict[tuple[int, int, str], Any] = {}
    for s in allowed:
        if s in ("depcache", "hybrid"):
            spans = [(start, end) for start in range(L) for end in range(start + 1, L + 1)]
        elif s == "pushpull":
            spans = [(0, 1)]
        else:
            spans = [(i, i + 1) for i in range(L)]
        for start, end in spans:
            cost = _segment_cost(s, start, end, shapes[start:end])
            extra = None
            if s == "hybrid" and s not in _USER_COSTS:
                from gnnc.passes.select_hybrid import select

                extra = select(stats, inputs, shapes, profile.memory_per_worker, start, end).values
            value = cm.evaluate_cost(cost, inputs, extra)
            seg_cost[(start, end, s)] = (value.time, value.memory)
            formulas[(start, end, s)] = cost
            values[(start, end, s)] = value
    trans: dict[tuple[str, str, int], float] = {}
    for a in allowed:
        for b_ in allowed:
            for layer in range(1, L):
                if a != b_:
                    trans[(a, b_, layer)] = cm.evaluate_cost(cm.boundary(a, b_, layer), inputs).time
    params = sum(float(np.prod([float(x) for x in _shape(p, program)])) for p in program.params())
    allreduce = cm.evaluate_cost(cm.grad_allreduce(params), inputs)
    return seg_cost, trans, formulas, values, inputs, allreduce, allowed


def _shape(param, program: Program) -> list[int]:
    from gnnc.runtime.executor import eval_dim

    return [eval_dim(d, program.config_dict()) for d in param.value.type.shape]


def choose(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None) -> PlannerReport:
    from gnnc.passes import cost_model as cm
    from gnnc.passes.segment_dp import solve

    seg_cost, trans, formulas, values, inputs, allreduce, allowed = plan_costs(program, graph, parts, profile, allow)
    L = len(program.graph_layers())
    result = solve(L, allowed, seg_cost, trans, memory_cap=profile.memory_per_worker)
    best = result.best
    alternatives = []
    for alt in result.alternatives:
        segs = [(s.start, s.end, s.strategy) for s in alt.segments]
        alternatives.append({
            "strategies": list(alt.strategies),
            "time_s": alt.time + allreduce.time,
            "bytes": sum(values[k].bytes for k in segs) + allreduce.bytes,
            "memory_bytes": alt.memory,
            "formulas": {f"{k[2]}[{k[0]}:{k[1]}]": formulas[k].describe() for k in segs},
            "user_costs": sorted({f"{k[2]}: {_USER_COSTS[k[2]].__module__}.{_USER_COSTS[k[2]].__name__}"
                                  for k in segs if k[2] in _USER_COSTS}),
        })
    crossovers = []
    # whole-model formulas: a segment strategy's span over every layer, a per-layer one's every layer
    pure = {s: [formulas[k] for k in formulas if k[2] == s and (k[2] not in ("depcache", "hybrid") or k[:2] == (0, L))]
            for s in allowed}
    if "depcomm" in pure and "depcache" in pure and pure["depcomm"] and pure["depcache"]:
        for c in cm.crossover(pure["depcomm"], pure["depcache"], cm.bw, inputs, 1e6, 1e12):
            faster = "depcomm" if c.first_faster_above else "depcache"
            crossovers.append(f"{faster} overtakes {'depcache' if faster == 'depcomm' else 'depcomm'} "
                              f"above {c.value * 8 / 1e9:.3g} Gb/s of bandwidth per worker")
    priced = [{"layers": [k[0], k[1]], "strategy": k[2], "time_s": v.time, "bytes": v.bytes,
               "memory_bytes": v.memory} for k, v in sorted(values.items())]
    return PlannerReport(list(best.strategies), best.time + allreduce.time, best.memory, alternatives, crossovers,
                         [(seg.start, seg.end, seg.strategy) for seg in best.segments], priced)


@register_pass("choose-strategy", "pick per-layer strategies by predicted cost: segment DP over the cost model")
def choose_strategy(program: Program, ctx: PassContext) -> Program:
    workers = int(ctx.options.get("workers", 1))
    if workers == 1 or ctx.options.get("strategy") or ctx.options.get("parts") is None:
        return program
    from gnnc.cluster import load_cluster, preset

    spec = ctx.options.get("cluster")
    profile = (load_cluster(spec) if isinstance(spec, str) else spec) if spec else preset("neutronstar-ecs")
    report = choose(program, ctx.graph, ctx.options["parts"], profile, ctx.options.get("allow"))
    ctx.options["strategy"] = ",".join(report.strategies)
    ctx.options["segments"] = report.segments
    ctx.options["planner"] = report
    return program
