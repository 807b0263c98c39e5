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
that (`choose-strategy{allow=depcomm,depcache}`); `strategy=S1,S2` fixes
the choice instead (`--strategy`). The choice goes to assign-strategy in
`ctx.results.strategy` and `ctx.results.segments`; the choice and every
alternative's predicted time, bytes and memory go into `ctx.results.planner`
for the plan and `--explain`. The planning inputs (partition statistics,
cost inputs, layer shapes) are the `PlanningInputs` analysis, computed once
per compile and reused by select-hybrid.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Layer, Program
from gnnc.pass_manager import PassContext, register_pass
from gnnc.passes.pipeline_text import option

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
    # the chosen assignment's epoch, stage by stage and worker by worker (`predicted_schedule`)
    schedule: dict[str, Any] = field(default_factory=dict)


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
    from gnnc.passes.partition.stats import compute_stats
    from gnnc.passes.predict_bytes import param_dependent

    layers = program.graph_layers()
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers) else "plain"
    stats = compute_stats(graph, parts, len(layers), view)
    dims, heads = layer_dims(program)
    inputs = cm.CostInputs.from_stats(stats, dims, profile.for_workers(int(parts.max()) + 1), heads=heads)
    needs_grad = param_dependent(program)
    return stats, inputs, [layer_shape(layer, needs_grad) for layer in layers]


@dataclass(frozen=True)
class PlanningInputs:
    """The `planning_inputs` of the compile's program, partition and cluster, as a cached analysis."""

    stats: Any
    inputs: Any
    shapes: list[Any]

    @classmethod
    def compute(cls, program: Program, ctx: PassContext) -> "PlanningInputs":
        return cls(*planning_inputs(program, ctx.graph, ctx.parts, ctx.cluster))


@dataclass
class PricedPlan:
    """Everything `plan_costs` priced: the DP's tables, and what the schedule of the choice needs.

    seg_cost, trans: the DP's inputs (time, memory) per segment and time per transition.
    formulas, values, extras: per segment key (start, end, strategy) its Cost, its evaluated
        CostValue and the extra symbol values it was evaluated with (a Hybrid selection, else None).
    allreduce: the gradient all-reduce (Cost and CostValue), paid once per step after the backward.
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


def plan_costs(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
               planned: PlanningInputs | None = None) -> PricedPlan:
    """Segment costs (time, memory) for the DP, and the compiled formulas behind them.

    `planned`: the planning inputs when the caller has them already (the pass's analysis cache).
    """
    from gnnc.passes import cost_model as cm
    from gnnc.passes.assign_strategy import segment_can_start_at

    L = len(program.graph_layers())
    if planned is None:
        planned = PlanningInputs(*planning_inputs(program, graph, parts, profile))
    stats, inputs, shapes = planned.stats, planned.inputs, planned.shapes
    allowed = candidates(program, allow)
    seg_cost: dict[tuple[int, int, str], tuple[float, float]] = {}
    formulas: dict[tuple[int, int, str], Any] = {}
    values: dict[tuple[int, int, str], Any] = {}
    extras: dict[tuple[int, int, str], Any] = {}
    for s in allowed:
        if s in ("depcache", "hybrid"):  # every span a segment may hold (GCNII's only from layer 0)
            spans = [(start, end) for start in range(L) for end in range(start + 1, L + 1)
                     if segment_can_start_at(program, start, end)]
        elif s == "pushpull":
            spans = [(0, 1)]
        else:
            spans = [(i, i + 1) for i in range(L)]
        for start, end in spans:
            cost = _segment_cost(s, start, end, shapes[start:end])
            extra = None
            if s == "hybrid" and s not in _USER_COSTS:
                from gnnc.passes.select_hybrid import select

                chosen = select(stats, inputs, shapes, profile.memory_per_worker, start, end, cost)
                extra, value = chosen.values, chosen.value
            else:
                value = cm.evaluate_cost(cost, inputs, extra)
            seg_cost[(start, end, s)] = (value.time, value.memory)
            formulas[(start, end, s)] = cost
            values[(start, end, s)] = value
            extras[(start, end, s)] = extra
    trans: dict[tuple[str, str, int], float] = {}
    for a in allowed:
        for b_ in allowed:
            for layer in range(1, L):
                if a != b_:
                    trans[(a, b_, layer)] = cm.evaluate_cost(cm.boundary(a, b_, layer), inputs).time
    params = sum(float(np.prod([float(x) for x in _shape(p, program)])) for p in program.params())
    allreduce_cost = cm.grad_allreduce(params)
    return PricedPlan(seg_cost, trans, formulas, values, extras, inputs, shapes, allreduce_cost,
                      cm.evaluate_cost(allreduce_cost, inputs), allowed)


def _shape(param, program: Program) -> list[int]:
    from gnnc.runtime.executor import eval_dim

    return [eval_dim(d, program.config_dict()) for d in param.value.type.shape]


def choose(program: Program, graph, parts: np.ndarray, profile, allow: list[str] | None,
           planned: PlanningInputs | None = None) -> PlannerReport:
    from gnnc.passes import cost_model as cm
    from gnnc.passes.segment_dp import solve

    priced = plan_costs(program, graph, parts, profile, allow, planned)
    formulas, values, inputs, allreduce, allowed = (priced.formulas, priced.values, priced.inputs, priced.allreduce,
                                                    priced.allowed)
    L = len(program.graph_layers())
    result = solve(L, allowed, priced.seg_cost, priced.trans, memory_cap=profile.memory_per_worker)
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
    crossovers += _pushpull_crossovers(priced)
    segment_costs = [{"layers": [k[0], k[1]], "strategy": k[2], "time_s": v.time, "bytes": v.bytes,
                      "memory_bytes": v.memory} for k, v in sorted(values.items())]
    return PlannerReport(list(best.strategies), best.time + allreduce.time, best.memory, alternatives, crossovers,
                         [(seg.start, seg.end, seg.strategy) for seg in best.segments], segment_costs,
                         predicted_schedule(best.segments, priced))


def _pushpull_crossovers(priced: PricedPlan) -> list[str]:
    """P3's question: up to which output width of the first layer (d_1, the hidden size) push-pull beats
    the best other way to run that layer. Layer against layer, as P3 section 3.2 weighs them."""
    from gnnc.passes import cost_model as cm

    key = (0, 1, "pushpull")
    rivals = [k for k in priced.formulas if k[:2] == (0, 1) and k[2] != "pushpull"]
    if key not in priced.formulas or not rivals:
        return []
    rival = min(rivals, key=lambda k: (priced.values[k].time, k[2]))
    out = []
    for c in cm.crossover([priced.formulas[key]], [priced.formulas[rival]], cm.d(1), priced.inputs, 1.0, 65536.0,
                          extra_second=priced.extras.get(rival)):
        side = "once" if c.first_faster_above else "while"
        sign = ">" if c.first_faster_above else "<"
        out.append(f"pushpull beats {rival[2]} on layer 1 {side} its output width (hidden) {sign} {c.value:.4g}")
    return out


# --- the predicted schedule ---------------------------------------------------------------------
#
# `gnnc inspect --format gantt|trace` draws the epoch the planner predicted. The cost model prices
# a stage as one expression per worker; the chart needs it split into what computes and what
# communicates, and which of those overlap. Each stage expression is a sum of terms: a term that
# is a Max is an overlap window (its arguments run side by side, the stage pays the longest), any
# other term runs on its own. A term reading the link symbols (bw, alpha) is communication, one
# reading the GEMM rate a dense map, one reading the SpMM rate aggregation (attention included).
# The split is checked against the stage's own evaluation, worker by worker; a stage it does not
# reproduce (a user cost function of another shape) is recorded whole, marked unsplit.

# Forward order of a layer's pieces ("overlap": a Max window). The cost model fixes durations and
# what overlaps, not the order inside a stage; this is the order the runtime runs them in when the
# dense map comes first (NeutronStar: fetch at the segment's entry, GeMM, exchange while the local
# edges aggregate, then the remote ones). Backward draws the reverse.
_DEFAULT_ORDER = ("communication", "dense", "overlap", "aggregation", "compute", "mixed")
_FORWARD_ORDER = {
    "bcast1d": ("dense", "communication", "overlap", "aggregation", "compute", "mixed"),  # broadcast W's output
    "pushpull": ("dense", "aggregation", "overlap", "communication", "compute", "mixed"),  # partials, then pull
}
_TRACK = {"dense": "compute", "aggregation": "compute", "compute": "compute", "communication": "communication",
          "mixed": "mixed"}
_HOP_EDGES = re.compile(r"HE_(\d+)_i")
_DIM = re.compile(r"d_(\d+)")


@dataclass
class _Piece:
    """A term (or a merged run of terms) of a stage: the layer it belongs to, what it does, its formula."""

    layer: int | None
    op: str
    expr: Any


@dataclass
class _Window:
    """A Max term: lanes that run side by side, each a sequence of pieces."""

    layer: int | None
    lanes: list[list[_Piece]]


def _op_of(term) -> str:
    """What a term does, read off the rates it divides by (module comment above)."""
    from gnnc.passes import cost_model as cm

    syms = term.free_symbols
    comm = bool(syms & {cm.bw, cm.alpha})
    rates = syms & {cm.R_gemm, cm.R_spmm}
    if comm and rates:
        return "mixed"
    if comm:
        return "communication"
    if cm.R_gemm in rates:
        return "dense" if cm.R_spmm not in rates else "compute"
    return "aggregation" if rates else "compute"


def _term_layer(term, layers: Sequence[int], op: str) -> int | None:
    """The graph layer a term of a stage belongs to.

    A stage of one layer: that layer. A stage spanning layers [start, end) (DepCache: workers meet
    only at the segment's ends) is a sum of every layer's terms: an aggregation reads the in-edges
    within end-1-l hops of the worker's vertices (HE_{end-1-l}), a dense map the widths d_l and
    d_{l+1}, and the communication is the fetch of the segment's input (first layer). None: unknown.
    """
    if len(layers) == 1:
        return layers[0]
    if not layers:
        return None
    names = [s.name for s in term.free_symbols]
    hops = {int(m.group(1)) for n in names if (m := _HOP_EDGES.fullmatch(n))}
    dims = sorted(int(m.group(1)) for n in names if (m := _DIM.fullmatch(n)))
    end = layers[-1] + 1
    if len(hops) == 1 and op != "dense":
        layer = end - 1 - hops.pop()
    elif op == "dense" and len(dims) >= 2:
        layer = dims[0]
    elif op == "communication":
        layer = layers[0]
    else:
        return None
    return layer if layer in layers else None


def _ordered(pieces: list, order: Sequence[str], gemm_first: dict[int, bool], backward: bool) -> list:
    """Pieces (or windows) in the order they run: by layer, then by `order` (dense after the
    aggregation in a layer whose dense map runs last); reversed in backward."""
    def rank(item) -> tuple[int, int]:
        op = "overlap" if isinstance(item, _Window) else item.op
        ops = list(order)
        if item.layer is not None and not gemm_first.get(item.layer, True) and "dense" in ops:
            ops.remove("dense")
            ops.insert(ops.index("aggregation") + 1, "dense")
        return (item.layer if item.layer is not None else 1 << 30, ops.index(op))

    out = sorted(pieces, key=rank)
    return out[::-1] if backward else out


def _merged(pieces: list) -> list:
    """Adjacent pieces of the same layer and op as one (e.g. a message's bytes and its latency)."""
    out: list = []
    for p in pieces:
        if out and isinstance(p, _Piece) and isinstance(out[-1], _Piece) and (out[-1].layer, out[-1].op) == (
                p.layer, p.op):
            out[-1] = _Piece(p.layer, p.op, out[-1].expr + p.expr)
        else:
            out.append(p)
    return out


def _stage_items(expr, layers: Sequence[int], order: Sequence[str], gemm_first: dict[int, bool],
                 backward: bool) -> list:
    """A stage expression as the pieces and overlap windows it runs, in order."""
    import sympy

    items: list = []
    for term in sympy.Add.make_args(sympy.sympify(expr)):
        if isinstance(term, sympy.Max):
            layer = _term_layer(term, layers, "overlap")
            lanes = []
            for arg in term.args:
                lane = [_Piece(layer, _op_of(t), t) for t in sympy.Add.make_args(arg)]
                lanes.append(_merged(_ordered(lane, order, gemm_first, backward)))
            items.append(_Window(layer, lanes))
        else:
            op = _op_of(term)
            items.append(_Piece(_term_layer(term, layers, op), op, term))
    return _merged(_ordered(items, order, gemm_first, backward))


def _place(items: list, start: float, workers: int, evaluate) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Start and duration of every piece, per worker: pieces one after another, a window's lanes side
    by side from the same point, the window as long as its longest lane. Returns (pieces, end)."""
    out: list[dict[str, Any]] = []
    cursor = np.full(workers, start, dtype=np.float64)

    def emit(piece: _Piece, at: np.ndarray, window: int | None) -> np.ndarray:
        t = evaluate(piece.expr)
        out.append({"layer": piece.layer, "op": piece.op, "track": _TRACK[piece.op], "overlap": window,
                    "start_s": [float(x) for x in at], "time_s": [float(x) for x in t]})
        return at + t

    for k, item in enumerate(items):
        if isinstance(item, _Piece):
            cursor = emit(item, cursor, None)
            continue
        ends = []
        for lane in item.lanes:
            at = cursor
            for piece in lane:
                at = emit(piece, at, k)
            ends.append(at)
        cursor = np.max(np.stack(ends), axis=0)
    return out, cursor


def _stage_record(expr, times: np.ndarray, start: float, evaluate, info: dict[str, Any], order: Sequence[str],
                  gemm_first: dict[int, bool]) -> dict[str, Any]:
    """One stage of the schedule; `times` is the stage's own evaluation per worker, which the split
    must reproduce (else the stage is recorded whole, `split` false)."""
    backward = info["direction"] == "backward"
    pieces, end = _place(_stage_items(expr, info["layers"], order, gemm_first, backward), start, len(times),
                         evaluate)
    split = (all(min(p["time_s"]) >= -1e-15 for p in pieces)
             and np.allclose(end - start, times, rtol=1e-9, atol=1e-15))
    if not split:
        layer = info["layers"][0] if len(info["layers"]) == 1 else None
        pieces = [{"layer": layer, "op": "mixed", "track": "mixed", "overlap": None,
                   "start_s": [start] * len(times), "time_s": [float(x) for x in times]}]
    return {**info, "start_s": start, "time_s": float(times.max()), "worker_time_s": [float(x) for x in times],
            "split": bool(split), "pieces": pieces}


def _segment_stages(start: int, end: int, n: int) -> list[tuple[str, list[int]]]:
    """(direction, layers) of each of a segment's n stages: one per layer and direction (DepComm,
    Hybrid: forward layer by layer, then backward in reverse), one per direction spanning every layer
    (DepCache), else (a user cost of another shape) steps over the whole segment."""
    k = end - start
    if n == 2 * k:
        return [("forward", [start + i]) for i in range(k)] + [("backward", [end - 1 - j]) for j in range(k)]
    if n == 2:
        return [("forward", list(range(start, end))), ("backward", list(range(start, end)))]
    return [("step", list(range(start, end)))] * n


# (stage expression, its times per worker, extra symbol values, stage description, drawing order)
_StageSpec = tuple[Any, np.ndarray, Any, dict[str, Any], Sequence[str]]


def predicted_schedule(segments: Sequence[Any], priced: PricedPlan) -> dict[str, Any]:
    """The chosen assignment's epoch as the cost model predicts it, for every worker.

    Stages in the order they run: for each segment its forward stages (after the layout transition
    into it, if any), then the segments' backward stages in reverse (each followed by its
    transition's backward), then the gradient all-reduce. Every stage lasts as long as its slowest
    worker (the cost model's rule), so stage k starts where stage k-1's slowest worker ended; the
    total is the planner's predicted epoch time. Each stage lists its pieces with their start and
    duration per worker (seconds from the epoch's start); pieces sharing an `overlap` id run side
    by side, and the stage pays the longest.
    """
    from gnnc.passes import cost_model as cm

    inputs = priced.inputs
    gemm_first = {i: shape.gemm_first for i, shape in enumerate(priced.shapes)}
    forward: list[_StageSpec] = []
    backward: list[list[_StageSpec]] = []  # per segment: its backward stages, then its transition's
    prev = None
    for seg in segments:
        into_f: list[_StageSpec] = []
        into_b: list[_StageSpec] = []
        if prev is not None and prev != seg.strategy:
            cost = cm.boundary(prev, seg.strategy, seg.start)
            value = cm.evaluate_cost(cost, inputs)
            for (direction, into), expr, times in zip((("forward", into_f), ("backward", into_b)), cost.stages,
                                                      value.stage_times):
                into.append((expr, times, None, {"kind": "transition", "strategy": f"{prev}->{seg.strategy}",
                                                 "segment": None, "direction": direction, "layers": []},
                             _DEFAULT_ORDER))
        key = (seg.start, seg.end, seg.strategy)
        cost, value, extra = priced.formulas[key], priced.values[key], priced.extras[key]
        order = _FORWARD_ORDER.get(seg.strategy, _DEFAULT_ORDER)
        seg_f: list[_StageSpec] = []
        seg_b: list[_StageSpec] = []
        for (direction, layers), expr, times in zip(_segment_stages(seg.start, seg.end, len(cost.stages)),
                                                    cost.stages, value.stage_times):
            info = {"kind": "segment", "strategy": seg.strategy, "segment": [seg.start, seg.end],
                    "direction": direction, "layers": layers}
            (seg_b if direction == "backward" else seg_f).append((expr, times, extra, info, order))
        forward += into_f + seg_f
        backward.append(seg_b + into_b)
        prev = seg.strategy
    ar = priced.allreduce_cost
    stages_in_order = forward + [s for block in reversed(backward) for s in block] + [
        (expr, times, None, {"kind": "allreduce", "strategy": None, "segment": None, "direction": "backward",
                             "layers": []}, _DEFAULT_ORDER)
        for expr, times in zip(ar.stages, priced.allreduce.stage_times)]
    stages, clock = [], 0.0
    for expr, times, extra, info, order in stages_in_order:
        if float(np.max(times)) <= 0.0:
            continue  # nothing happens (e.g. a layout change that is free forward)
        record = _stage_record(expr, times, clock, lambda e, x=extra: cm.evaluate(e, inputs, x), info, order,
                               gemm_first)
        stages.append(record)
        clock += record["time_s"]
    return {"per": "worker", "workers": inputs.workers, "cluster": inputs.profile.name, "time_s": clock,
            "stages": stages}


@dataclass(frozen=True)
class ChooseStrategyOptions:
    allow: tuple[str, ...] = option((), "strategies the planner may choose (empty: every plannable one)")
    strategy: str = option("", "fix the strategies instead of planning: one, or one per graph layer (S1,S2)")


@register_pass("choose-strategy", "pick per-layer strategies by predicted cost: segment DP over the cost model",
               options=ChooseStrategyOptions, requires=("typed", "partition"))
def choose_strategy(program: Program, ctx: PassContext, opts: ChooseStrategyOptions) -> Program:
    if opts.strategy:
        ctx.results.strategy = opts.strategy
        return program
    if ctx.workers == 1:
        return program
    planned = ctx.analyses.get(PlanningInputs, program)
    report = choose(program, ctx.graph, ctx.parts, ctx.cluster, list(opts.allow) or None, planned)
    ctx.results.strategy = ",".join(report.strategies)
    ctx.results.segments = report.segments
    ctx.results.planner = report
    return program
