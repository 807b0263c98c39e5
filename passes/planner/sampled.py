"""Planning sampled minibatch training: the strategy of the first layer, the schedule, the bytes per epoch.

Why this module exists: with `--fanout` the choice is P3's question, push
the layer-1 structure and pull H-wide partial sums (`pushpull`), or pull
the F-wide features of the sampled remote vertices (`dp-sample`, DistDGL);
the layers after the first run data-parallel on each worker's own seeds
either way. choose-strategy asks `choose_sampled` when the compile samples:
every candidate assignment (and, with `--approximate`, P3's 2F2B schedule)
is priced with the sampled formulas (gnnc.passes.cost.sampled) on the seeded
dry run (gnnc.passes.analysis.sampled_stats), and the crossover in the hidden width
is solved with sympy, in bytes and in time. predict-bytes asks
`predict_sampled` for the exact bytes of the dry-run epoch per op.
"""
from __future__ import annotations

import functools

from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph.sampling import index_bytes
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.analysis.layers import layer_dims, param_dependent
from gnnc.passes.analysis.legality import pushpull_blocker
from gnnc.passes.analysis.sampled_stats import SampledStats
from gnnc.passes.context import PassContext
from gnnc.passes.cost.crossovers import bytes_crossover, crossover
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.registry import sampled_formula
from gnnc.passes.cost.sampled import sampled_values, steps_allreduce
from gnnc.passes.cost.symbols import Cost, CostInputs, d, layer_shape
from gnnc.passes.planner.report import PlannerReport
from gnnc.plan.approximation import approximations, is_exact
from gnnc.plan.pipeline import value_width
from gnnc.plan.precision import GRAD_BYTES, element_bytes
from gnnc.plan.schedules import SCHEDULES
from gnnc.plan.slices import split_weights
from gnnc.plan.strategies import names as strategy_names


def candidates(program: Program, allow: list[str] | None, approximate: bool) -> list[tuple[list[str], str]]:
    """(per-layer strategies, schedule) pairs the planner prices: dp-sample everywhere, push-pull on the first
    layer (where legal) with dp-sample after it, and P3's 2F2B schedule of the latter with --approximate."""
    layers = program.graph_layers()
    plannable = strategy_names(plannable=True, batching="sampled")
    for s in allow or ():
        if s not in plannable:
            raise GnncError(f"--allow {s}: for sampled minibatches the planner chooses among {', '.join(plannable)}")
    allowed = set(allow or plannable)
    out: list[tuple[list[str], str]] = []
    if "dp-sample" in allowed:
        out.append((["dp-sample"] * len(layers), "sequential"))
    if "pushpull" in allowed and pushpull_blocker(layers[0]) is None \
            and (len(layers) == 1 or "dp-sample" in allowed):
        pp = ["pushpull"] + ["dp-sample"] * (len(layers) - 1)
        out += [(pp, name) for name, sd in SCHEDULES.items() if sd.exact or approximate]
    return [(s, k) for s, k in out if approximate or is_exact(s, k)]


def _inputs(program: Program, ctx: PassContext) -> tuple[CostInputs, dict, list[Any], SampledStats]:
    stats = ctx.analyses.get(SampledStats, program)
    dims, heads = layer_dims(program)
    parts = np.asarray(ctx.parts)
    p = ctx.workers
    owned = np.bincount(parts, minlength=p).astype(np.float64)
    zeros = np.zeros(p)
    needs = param_dependent(program)
    shapes = [layer_shape(layer, needs) for layer in program.graph_layers()]
    inputs = CostInputs(owned, zeros, zeros, zeros, owned[:, None], zeros[:, None], tuple(dims),
                        ctx.cluster.for_workers(p), tuple(heads),
                        index_bytes=index_bytes(ctx.graph.num_nodes, ctx.graph.num_edges), shapes=tuple(shapes))
    return inputs, sampled_values(stats), shapes, stats


def price(strategies: list[str], schedule: str, shapes: list[Any], param_elements: float) -> Cost:
    """The epoch of one candidate: every layer's formula, then the per-minibatch gradient all-reduce."""
    overlap = SCHEDULES[schedule].staleness > 0
    total = None
    for layer, (name, shape) in enumerate(zip(strategies, shapes)):
        cost = sampled_formula(name)(layer, shape, overlap=overlap)
        total = cost if total is None else total + cost
    return total + steps_allreduce(param_elements)


def choose_sampled(program: Program, ctx: PassContext, allow: list[str] | None):
    """The planner's report for a sampled compile, and the chosen schedule."""
    inputs, extra, shapes, stats = _inputs(program, ctx)
    cfg = program.config_dict()
    priced = []
    for strategies, schedule in candidates(program, allow, ctx.approximate):
        split = split_weights(program, pushpull=strategies[0] == "pushpull")  # P3's W1: never all-reduced
        params = float(sum(np.prod([eval_dim(x, cfg) for x in p.value.type.shape]) for p in program.params()
                           if p.value.name not in split))
        cost = price(strategies, schedule, shapes, params)
        priced.append((strategies, schedule, cost, evaluate_cost(cost, inputs, extra)))
    if not priced:
        raise ValueError("no sampled strategy to plan (check --allow)")
    best = min(priced, key=lambda c: (c[3].time, not is_exact(c[0], c[1])))
    alternatives = [{"strategies": s, "schedule": k, "time_s": v.time, "bytes": v.bytes, "memory_bytes": v.memory,
                     "formulas": {f"{'+'.join(s)} ({k})": c.describe()}, "user_costs": [],
                     "approximate": approximations(s, k)} for s, k, c, v in priced]
    report = PlannerReport(list(best[0]), best[3].time, best[3].memory, alternatives,
                           None, [(i, i + 1, s) for i, s in enumerate(best[0])])
    report.find_crossovers = functools.partial(_crossovers, shapes, inputs, extra)  # for --explain only
    report.segment_costs = [{"layers": [0, 1], "strategy": name, "time_s": v.time, "bytes": v.bytes,
                             "memory_bytes": v.memory}
                            for name, v in ((n, evaluate_cost(sampled_formula(n)(0, shapes[0]), inputs, extra))
                                            for n in {s[0] for s, _, _, _ in priced})]
    return report, best[1]


def _crossovers(shapes: list[Any], inputs: CostInputs, extra: dict) -> list[str]:
    """Where push-pull and dp-sample swap on the first layer, in its output width (P3's F >> H question)."""
    pp, dp = sampled_formula("pushpull")(0, shapes[0]), sampled_formula("dp-sample")(0, shapes[0])
    out = []
    for c in bytes_crossover(pp, dp, d(1), inputs, extra):
        side = "while" if not c.first_faster_above else "once"
        out.append(f"pushpull sends fewer bytes than dp-sample on layer 1 {side} its output width (hidden) "
                   f"{'<' if side == 'while' else '>'} {c.value:.4g} (dp-sample pulls d_0 = {inputs.dims[0]:g}-wide "
                   f"feature rows)")
    for c in crossover([pp], [dp], d(1), inputs, 1.0, 65536.0, extra_first=extra, extra_second=extra):
        side = "once" if c.first_faster_above else "while"
        out.append(f"pushpull beats dp-sample on layer 1 {side} its output width (hidden) "
                   f"{'>' if c.first_faster_above else '<'} {c.value:.4g}")
    return out


def predict_sampled(program: Program, ctx: PassContext) -> tuple[Program, dict[str, int]]:
    """Bytes of the dry-run epoch per op, as the runtime labels them; the first layer's sync annotated."""
    stats = ctx.analyses.get(SampledStats, program)
    world = ctx.workers
    first = program.graph_layers()[0]
    ids = index_bytes(ctx.graph.num_nodes, ctx.graph.num_edges)
    totals: dict[str, int] = {}
    layers = []
    for layer in program.layers:
        eqns = []
        for e in layer.eqns:
            if e.op == "reduce_scatter":
                w = value_width(program, e.ins[0]) * element_bytes(ctx.precision)
                fwd = int((world - 1) * stats.destinations[:, 0].sum()) * w
                bwd = fwd if e.ins[0].name in param_dependent(program) else 0
                totals["reduce_scatter"], totals["all_gather"] = fwd, bwd
                totals["structure"] = int((world - 1) * stats.packed.sum()) * ids
                e = e.with_attrs(bytes_fwd=fwd, bytes_bwd=bwd)
            eqns.append(e)
        layers.append(layer.replace(eqns=tuple(eqns)))
    if first.attr("strategy") == "dp-sample":
        width = value_width(program, program.inputs[0])
        totals["pull_ids"] = int(stats.pulled.sum()) * ids
        totals["halo"] = int(stats.served.sum()) * width * element_bytes(ctx.precision)
    split = split_weights(program)  # P3's W1, split under push-pull: never all-reduced
    numel = sum(value_width(program, p.value) for p in program.params() if p.value.name not in split)
    totals["allreduce"] = stats.batches * 2 * (world - 1) * numel * GRAD_BYTES
    return program.replace(layers=tuple(layers)), totals
