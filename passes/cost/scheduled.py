"""The cost of a program as its schedule annotations say: where the cost model reads them.

Why this module exists: the schedule pass writes every execution decision
into the IR (gnnc.plan.schedule_attrs) and the runtime follows them; the
prediction must follow the same annotations, or it would drift from what
runs. This module turns a segment's annotations into the options of its
strategy's formula (`segment_options`), groups the graph layers into the
segments the IR assigns (`program_segments`), reads the gradient buckets
(`grad_buckets`), and re-prices the chosen assignment with all of them
(`scheduled_plan`), which `predicted_schedule` then draws.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from gnnc.ir import Layer, Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.cost.collectives import grad_allreduce
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.priced import Formulas
from gnnc.passes.cost.registry import planner_cost, segment_cost, user_cost
from gnnc.passes.cost.symbols import Cost
from gnnc.plan.bins import PipeChain, pipeline_chain, pipelined
from gnnc.plan.comm_ops import exchange_of, schedule_options
from gnnc.plan.schedule_attrs import exchange_schedule, layer_schedule, program_schedule
from gnnc.plan.slices import split_weights
from gnnc.plan.strategies import STRATEGIES


@dataclass(frozen=True)
class Segment:
    """Graph layers [start, end) run by one strategy (what the planner's DP returns, read off the IR)."""

    start: int
    end: int
    strategy: str


def program_segments(program: Program) -> list[Segment]:
    """The segments of an annotated program: runs of one depcache/hybrid segment (`segment` attribute),
    every other graph layer on its own."""
    out: list[Segment] = []
    for k, layer in enumerate(program.graph_layers()):
        strategy = layer.attr("strategy", "local")
        seg = layer.attr("segment")
        if (STRATEGIES[strategy].span == "segment" and out and out[-1].strategy == strategy
                and seg is not None and seg == out[-1].start):
            out[-1] = Segment(out[-1].start, k + 1, strategy)
        else:
            out.append(Segment(k, k + 1, strategy))
    return out


def segment_options(layers: Sequence[Layer], strategy: str) -> dict[str, Any]:
    """The formula options (gnnc.plan.comm_ops.schedule_options) of a segment's layers, as their annotations
    say: a split flag is on when every exchange it splits is split, a chunk flag when every one it chunks
    comes in chunks. A hoisted exchange (gnnc.passes.hoist: run once, before the first epoch) is never split and
    costs no epoch anything, so it does not count: a Hybrid segment from layer 0 whose first halo (of the input
    features) is hoisted runs its later layers' halos split, and was priced as if none were (GIN on an R-MAT 100K
    x4 dgx1: the schedule's 1.946 ms against the planner's 1.713 for the same plan, session 26)."""
    opts: dict[str, Any] = {}
    for option in schedule_options(strategy):
        if option == "bins":
            opts["bins"] = max(layer_schedule(layer).bins for layer in layers)
            continue
        per_epoch = [(e, d) for layer in layers for e in layer.eqns
                     if (d := exchange_of(e.op)) is not None and not e.attr("hoisted")]
        split = [e for e, d in per_epoch if d.split_flag == option]
        chunked = [e for e, d in per_epoch if d.chunk_flag == option]
        if split:
            opts[option] = all(exchange_schedule(e).split for e in split)
        else:
            opts[option] = bool(chunked) and all(exchange_schedule(e).chunked for e in chunked)
    return opts


CACHE_ALL = object()  # a Hybrid selection that caches every dependency (it has no symbol values of its own)


def priced_as(seg: Segment, extra: Any) -> str:
    """The strategy whose formula prices a segment: a Hybrid segment whose selection caches every dependency
    runs DepCache's rows with an empty halo, and is priced as DepCache with that halo's buffers
    (`depcache(halo=True)`, gnnc.passes.planner.hybrid.select)."""
    return "depcache" if seg.strategy == "hybrid" and extra is CACHE_ALL else seg.strategy


# G3's inter-layer pipeline: the options of DepComm's formula that price it (gnnc.passes.cost.neutronstar.depcomm)
PIPELINE_OPTIONS = ("feed", "chain_calls")


def segment_formula(program: Program, seg: Segment, shapes: Sequence[Any], extra: Any = None, **options: Any) -> Cost:
    """The formula of a segment with the given schedule options (those its formula takes; a user's cost
    function takes none)."""
    strategy = priced_as(seg, extra)
    if user_cost(strategy) is not None:
        return planner_cost(strategy, seg.start, seg.end, shapes[seg.start:seg.end])
    taken = {k: v for k, v in options.items()
             if k in schedule_options(strategy) or (strategy == "depcomm" and k in PIPELINE_OPTIONS)}
    if strategy != seg.strategy:  # a cache-all Hybrid: DepCache's rows, its empty halo run all the same
        taken["halo"] = True
    return segment_cost(strategy, seg.start, seg.end, shapes[seg.start:seg.end], **taken)


def pipeline_options(program: Program, seg: Segment, shapes: Sequence[Any]) -> dict[str, Any]:
    """What prices G3's inter-layer pipeline into a DepComm layer (`feed`: the sending graph layer's shape,
    `chain_calls`: the equations its bins run per bin up to this layer's halos, gnnc.plan.bins.PipeChain), or
    nothing when the layer's halos are not pipelined."""
    if seg.strategy != "depcomm" or seg.start == 0:
        return {}
    layer = program.graph_layers()[seg.start]
    if not any(e.op == "halo" and pipelined(e) for e in layer.eqns):
        return {}
    chain = pipeline_chain(program, layer)
    if not isinstance(chain, PipeChain):
        return {}  # (gnnc.plan.schedule_attrs.check_schedule refuses such a plan)
    return {"feed": shapes[seg.start - 1], "chain_calls": len(chain.eqns)}


def annotated_formula(program: Program, seg: Segment, shapes: Sequence[Any], extra: Any = None) -> Cost:
    """The formula of a segment as the program's annotations schedule it."""
    layers = program.graph_layers()[seg.start:seg.end]
    return segment_formula(program, seg, shapes, extra, **segment_options(layers, seg.strategy),
                           **pipeline_options(program, seg, shapes))


def symbol_values(extra: Any) -> Any:
    """The symbol values to evaluate a segment's formula with (none for a selection priced as DepCache)."""
    return None if extra is CACHE_ALL else extra


def grad_buckets(program: Program) -> tuple[list[float], tuple[int, ...]]:
    """Elements per gradient bucket, and the graph layer after whose backward each bucket is complete.

    A graph layer's gradients exist once its backward has run; a dense layer's once the backward of
    the graph layer after it has (after none: at the start of backward, index = number of graph layers).
    A program without buckets is one bucket complete when backward ends (index 0).
    """
    cfg = program.config_dict()
    split = split_weights(program)  # P3's split weights are never all-reduced
    sizes: dict[int, float] = {}
    ready: dict[int, int] = {}
    n_graph = len(program.graph_layers())
    position, graph_index = [], 0
    for layer in program.layers:  # a dense layer's gradients are complete after the next graph layer's backward
        position.append(graph_index)
        graph_index += layer.kind == "graph"
    for layer, at in zip(program.layers, position):
        params = [p for p in layer.params if p.value.name not in split]
        if not params:
            continue
        bucket = layer_schedule(layer).grad_bucket
        bucket = 0 if bucket is None else bucket
        elements = sum(float(np.prod([eval_dim(d, cfg) for d in p.value.type.shape])) for p in params)
        sizes[bucket] = sizes.get(bucket, 0.0) + elements
        ready[bucket] = min(ready.get(bucket, n_graph), at)
    order = sorted(sizes)
    return [sizes[b] for b in order], tuple(ready[b] for b in order)


def scheduled_plan(program: Program, priced: Any, extras: dict[tuple[int, int, str], Any] | None = None) -> Any:
    """`priced` (a choose-strategy PricedPlan) with the program's segments priced as their annotations
    schedule them, and the gradient all-reduce split into the annotated buckets.

    `extras`: each segment's symbol values (a Hybrid selection's; CACHE_ALL when it caches every dependency),
    by segment key.
    """
    formulas, values, segment_extras = Formulas(priced.formulas), dict(priced.values), dict(priced.extras)
    for seg in program_segments(program):
        key = (seg.start, seg.end, seg.strategy)
        extra = (extras or {}).get(key)
        cost = annotated_formula(program, seg, priced.shapes, extra)
        formulas[key], segment_extras[key] = cost, symbol_values(extra)
        values[key] = evaluate_cost(cost, priced.inputs, symbol_values(extra))
    sizes, ready = grad_buckets(program)
    allreduce_cost = priced.allreduce_cost
    if sizes:  # one stage per bucket, in the order they are posted
        buckets = [grad_allreduce(n) for n in sizes]
        allreduce_cost = Cost("grad_allreduce", tuple(c.stages[0] for c in buckets),
                              sympy.Add(*(c.bytes for c in buckets)), sympy.Integer(0))
    return dataclasses.replace(priced, formulas=formulas, values=values, extras=segment_extras,
                               allreduce_cost=allreduce_cost, allreduce=evaluate_cost(allreduce_cost, priced.inputs),
                               epoch=evaluate_cost(priced.epoch_cost, priced.inputs),
                               grad_ready=ready, grad_overlap=program_schedule(program).grad_overlap)
