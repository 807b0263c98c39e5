"""schedule: decide how every layer runs, and write each decision into the IR (docs/design.md section 5, step 8).

The decisions, as attributes the runtime follows and the cost model prices
(gnnc.plan.schedule_attrs defines them; gnnc.passes.cost.scheduled reads them):

* every halo exchange (depcomm, hybrid) split into start and wait with the
  local edges between (`halo[overlap=true]`; its readers `split=true`):
  NeutronStar's overlap, for every aggregation (sum, mean, max, min, the
  attention softmax); its messages in ring order (`method=ring`); and per
  layer, whether the edges of remote sources run on each peer's rows as
  they arrive, in ring order (`chunked=true`: NeutronStar's chunks, section
  4.3), or once the whole halo is in: priced by gnnc.passes.cost.overlap
  (each chunk's exposed communication against the dispatch of the
  equations an extra part reruns; the wait for ranks behind is not priced),
  the cheaper taken;
* every broadcast of bcast1d staged (`bcast_rows[staged=true]`): MG-GCN's
  per-stage multiply, two blocks in memory instead of N rows;
* G3's bins (`bins=k`, `bin_order=boundary_bfs`, the per-bin equations
  `bin=true`) when `memory_cap` needs them, as few as meet the cap;
* G3's inter-layer pipeline (`halo[pipelined=true]`) where the layers allow it
  (gnnc.plan.bins.pipeline_chain) and `pipeline=on` asks for it, or `auto`
  and the cost model prices it faster (gnnc.passes.cost.overlap.pipelined_window:
  the halo in flight from the previous layer's first bin, against k messages per
  peer and the chain's equations run per bin); `off` by default (measured slower
  on every case of benchmarks/RESULTS-seeds.md's G3 section);
* the gradient all-reduce in buckets of whole layers (`grad_bucket=b`),
  posted during backward (program attribute `grad_overlap=true`).

Each choice is priced by the cost model: overlap or not, chunked or not, staged or not (the
strategy's formula with that schedule option), bins by the activation
memory they leave (gnnc.passes.cost.activations) and the recomputation they
cost; `auto` takes the cheaper, `on`/`off` fix it. A split exchange is
moved to just after the equation that produces its input, so it is in
flight as early as possible. What the pass compared and chose goes to
`ctx.results.schedule_report` (`--explain` prints it), and the predicted epoch
(the Gantt chart's) is redrawn from the annotated IR.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Eqn, Layer, Program
from gnnc.ir.dims import eval_dim
from gnnc.ir.ops import reads_neighbours, reads_structure
from gnnc.passes.cost import activations
from gnnc.passes.cost.collectives import grad_allreduce
from gnnc.passes.cost.epoch import epoch_costs
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.inputs import PlanningInputs
from gnnc.passes.cost.neutronstar import hybrid_values
from gnnc.passes.cost.priced import PricedPlan
from gnnc.passes.cost.schedule import predicted_schedule
from gnnc.passes.cost.scheduled import (CACHE_ALL, Segment, annotated_formula, program_segments, scheduled_plan,
                                        segment_formula, segment_options, symbol_values)
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.pipeline_text import option
from gnnc.plan.bins import PIPELINED, PipeChain, pipeline_chain
from gnnc.plan.comm_ops import COMM_OP_DEFS, exchange_of, schedule_options
from gnnc.plan.schedule_attrs import HALO_METHODS, exchange_schedule
from gnnc.plan.slices import split_weights
from gnnc.plan.strategies import STRATEGIES
from gnnc.plan.pipeline import is_pipeline

CHOICES = ("auto", "on", "off")
MAX_BINS = 1 << 12  # beyond this the bins are a few rows each: the cap is not met by bins


@dataclass(frozen=True)
class ScheduleOptions:
    overlap: str = option("auto", "split each halo into start and wait, the local edges between: auto, on, off")
    chunked: str = option("auto", "an overlapped halo's remote edges run on each peer's rows as they arrive "
                          "(ring order): auto, on, off")
    staged: str = option("auto", "bcast1d: multiply each block as it arrives (MG-GCN's stages): auto, on, off")
    method: str = option("ring", f"order of a halo's messages: {', '.join(HALO_METHODS)}")
    bins: int = option(0, "G3's bins per graph layer; 0: as few as memory_cap allows (none without a cap)")
    memory_cap: int = option(0, "activation memory per worker in bytes (0: no cap)")
    grad_overlap: str = option("auto", "post each gradient bucket's all-reduce during backward: auto, on, off")
    pipeline: str = option("off", "G3's inter-layer pipeline between binned DepComm layers: each bin's rows of the "
                           "next layer's halos sent as the bin ends, the next layer's bins run as they arrive: auto "
                           "(where the cost model prices it faster), on, off")
    bucket_bytes: int = option(4 << 20, "gradient all-reduce buckets hold whole layers up to this many bytes")


@dataclass
class SegmentChoice:
    """The schedule of one segment: its options, and every alternative the cost model priced."""

    segment: Segment
    options: dict[str, Any]
    alternatives: list[dict[str, Any]]
    why: str = ""


def _check(opts: ScheduleOptions) -> None:
    for name in ("overlap", "chunked", "staged", "grad_overlap"):
        if getattr(opts, name) not in CHOICES:
            raise GnncError(f"schedule: {name} must be one of {', '.join(CHOICES)}, not '{getattr(opts, name)}'")
    if opts.pipeline not in CHOICES:
        raise GnncError(f"schedule: pipeline must be one of {', '.join(CHOICES)}, not '{opts.pipeline}'")
    if opts.method not in HALO_METHODS:
        raise GnncError(f"schedule: method must be one of {', '.join(HALO_METHODS)}, not '{opts.method}'")
    if opts.bins < 0 or opts.bins > MAX_BINS:
        raise GnncError(f"schedule: bins must be between 0 and {MAX_BINS}, not {opts.bins}")
    if opts.memory_cap < 0:
        raise GnncError(f"--memory-cap must be a positive number of bytes, not {opts.memory_cap}")


# --- what may be scheduled how ---------------------------------------------------------------------------


def _readers(layer: Layer) -> dict[str, list[tuple[Eqn, int]]]:
    out: dict[str, list[tuple[Eqn, int]]] = {}
    for e in layer.eqns:
        for k, v in enumerate(e.ins):
            out.setdefault(v.name, []).append((e, k))
    return out


def stageable(layer: Layer, flag: str) -> str:
    """Why the exchanges split by `flag` whose parts are read once (a bcast1d layer's broadcasts) cannot be
    split ("" when they can): such a part (a staged block) is read once, by one equation through the edges,
    then dropped."""
    readers = _readers(layer)
    for e in layer.eqns:
        d = exchange_of(e.op)
        if d is None or d.split_flag != flag or not d.parts_read_once:
            continue
        uses = readers.get(e.outs[0].name, [])
        if len(uses) != 1 or uses[0][1] not in reads_neighbours(uses[0][0]):
            return f"%{e.outs[0].name} is read by {len(uses)} equations; a staged block is read once"
        if any(v.name == e.outs[0].name for v in layer.outputs):
            return f"%{e.outs[0].name} leaves the layer"
    return ""


def binnable(layer: Layer) -> bool:
    """Whether a graph layer may run in bins: its rows are its own (not P3's feature slices or MG-GCN's
    blocks) and it aggregates over a structure it holds."""
    strategy = STRATEGIES.get(layer.attr("strategy"))
    return strategy is not None and strategy.bins and any(reads_structure(e) for e in layer.eqns)


# --- annotating ----------------------------------------------------------------------------------------


def _edge(v) -> bool:
    return v.type is not None and v.type.domain == "edge"


def _early(eqns: list[Eqn], layer: Layer) -> list[Eqn]:
    """Each split exchange moved to just after the equation producing its input (posted as early as can be)."""
    moving = [e for e in eqns if exchange_schedule(e).split]
    rest = [e for e in eqns if e not in moving]
    for e in moving:
        source = e.ins[0].name
        at = next((i + 1 for i, q in enumerate(rest) if any(o.name == source for o in q.outs)), 0)
        rest.insert(at, e)
    return rest


def annotate_layer(layer: Layer, options: dict[str, Any], method: str) -> Layer:
    """`layer` with its schedule written in: exchanges, split or per-bin equations, bins."""
    bins = options.get("bins", 1)
    eqns: list[Eqn] = []
    # with a split exchange, every equation on edges runs per part (edges are held part by part), and so
    # does every reader of the exchange
    # (a hoisted equation, computed once per run and cached (gnnc.passes.hoist), runs whole: nothing of it
    # overlaps later steps, and its exchange is not repeated)
    split_values = {e.outs[0].name for e in layer.eqns if bins == 1 and not e.attr("hoisted") and (
        (d := exchange_of(e.op)) is not None and d.split_flag is not None and options.get(d.split_flag, False))}
    binned: set[str] = set()
    for e in layer.eqns:
        attrs: dict[str, Any] = {}
        hoisted = bool(e.attr("hoisted"))
        d = exchange_of(e.op)
        if d is not None and d.ordered:
            attrs["method"] = method
        if d is not None and d.split_flag is not None:
            attrs[d.split_flag] = bool(options.get(d.split_flag, False)) and not hoisted
            if d.chunk_flag is not None and attrs[d.split_flag] and bins == 1 and options.get(d.chunk_flag, False):
                attrs[d.chunk_flag] = True  # written only where chosen: absent, the remote rows come as one part
        if d is None and not hoisted:
            if split_values and (any(v.name in split_values for v in e.ins) or any(map(_edge, e.ins))
                                 or any(map(_edge, e.outs))):
                attrs["split"] = True
            if bins > 1 and (reads_structure(e) or any(map(_edge, e.ins)) or any(map(_edge, e.outs))
                             or any(v.name in binned for v in e.ins)):
                attrs["bin"] = True
                binned.update(o.name for o in e.outs)
        eqns.append(e.with_attrs(**attrs) if attrs else e)
    attrs = dict(layer.attrs)
    if bins > 1 and binned:  # (a layer whose aggregations are all hoisted has nothing to run per bin)
        attrs["bins"] = bins
        attrs["bin_order"] = "boundary_bfs"
    return layer.replace(eqns=tuple(_early(eqns, layer)), attrs=tuple(sorted(attrs.items())))


def grad_bucket_attrs(program: Program, bucket_bytes: int) -> dict[str, int]:
    """Layer name -> gradient bucket: layers with replicated parameters in reverse order (the order backward
    finishes them), a new bucket whenever the next layer would take one past `bucket_bytes`. P3's split weights
    (gnnc.plan.slices) are never all-reduced: a layer holding only those has no bucket."""
    cfg = program.config_dict()
    split = split_weights(program)
    out: dict[str, int] = {}
    bucket, size = -1, 0
    for layer in reversed(program.layers):
        params = [p for p in layer.params if p.value.name not in split]
        if not params:
            continue
        nbytes = 4 * sum(int(np.prod([eval_dim(d, cfg) for d in p.value.type.shape])) for p in params)
        if bucket < 0 or (size + nbytes > bucket_bytes and size > 0):
            bucket, size = bucket + 1, 0
        out[layer.name] = bucket
        size += nbytes
    return out


def annotate(program: Program, choices: dict[int, dict[str, Any]], opts: ScheduleOptions, grad_overlap: bool
             ) -> Program:
    """The whole program annotated: each graph layer with its options (by graph index), gradient buckets,
    program attributes."""
    buckets = grad_bucket_attrs(program, opts.bucket_bytes)
    layers, k = [], 0
    for layer in program.layers:
        if layer.kind == "graph":
            layer = annotate_layer(layer, choices.get(k, {}), opts.method)
            k += 1
        if layer.name in buckets:
            layer = layer.replace(attrs=tuple(sorted({**dict(layer.attrs), "grad_bucket": buckets[layer.name]}.items())))
        layers.append(layer)
    attrs = {**dict(program.attrs), "grad_overlap": grad_overlap}
    if opts.memory_cap:
        attrs["memory_cap"] = opts.memory_cap
    out = program.replace(layers=tuple(layers), attrs=tuple(sorted(attrs.items())))
    return pipelined_program(out) if opts.pipeline == "on" else out


def pipelined_program(program: Program, only: set[str] | None = None) -> Program:
    """`program` with G3's inter-layer pipeline into every graph layer it can feed (gnnc.plan.bins.pipeline_chain:
    both layers binned DepComm, the halos' inputs computed row by row from the previous layer's outputs), or into
    those of them named in `only`: the receiver's halos marked `pipelined=true`."""
    layers = list(program.layers)
    for k, layer in enumerate(layers):
        if layer.kind == "graph" and (only is None or layer.name in only) and isinstance(
                pipeline_chain(program, layer), PipeChain):
            layers[k] = layer.replace(eqns=tuple(e.with_attrs(**{PIPELINED: True}) if e.op == "halo" else e
                                                 for e in layer.eqns))
    return program.replace(layers=tuple(layers))


def choose_pipeline(program: Program, priced: PricedPlan) -> tuple[Program, list[dict[str, Any]]]:
    """`pipeline=auto`: each graph layer G3's inter-layer pipeline can feed, priced with its halos whole
    (fed once the previous layer has ended) and pipelined (gnnc.passes.cost.overlap.pipelined_window: in flight
    from the previous layer's first bin, at k messages per peer and the chain run per bin); pipelined where that
    is faster. Each receiver's formula reads only its own halos' marks and its sender's shape, so each layer is
    decided alone. Returns the program and, per candidate layer, both times."""
    report, chosen = [], set()
    graph = program.graph_layers()
    for k, layer in enumerate(graph):
        if layer.attr("strategy") != "depcomm" or not isinstance(pipeline_chain(program, layer), PipeChain):
            continue
        seg = Segment(k, k + 1, "depcomm")
        times = {}
        for on, candidate in ((False, program), (True, pipelined_program(program, {layer.name}))):
            times[on] = evaluate_cost(annotated_formula(candidate, seg, priced.shapes), priced.inputs).time
        if times[True] < times[False]:
            chosen.add(layer.name)
        report.append({"layer": layer.name, "time_s": times[False], "pipelined_time_s": times[True],
                       "pipelined": times[True] < times[False]})
    return (pipelined_program(program, chosen) if chosen else program), report


# --- pricing -------------------------------------------------------------------------------------------


def _priced(program: Program, ctx: PassContext) -> PricedPlan | None:
    """The planner's priced tables, or the planning inputs priced afresh (fixed strategies); None without a
    partition (nothing to price on)."""
    report = ctx.results.planner
    if report is not None and getattr(report, "priced", None) is not None:
        return report.priced
    if ctx.partition is None or ctx.graph is None or ctx.cluster is None:
        return None
    planned = ctx.analyses.get(PlanningInputs, program)
    split = split_weights(program)  # P3's split weights: never all-reduced
    params = sum(float(np.prod([eval_dim(d, program.config_dict()) for d in p.value.type.shape]))
                 for p in program.params() if p.value.name not in split)
    ar = grad_allreduce(params)
    epoch_cost, epoch = epoch_costs(program, planned.inputs)
    return PricedPlan({}, {}, {}, {}, {}, planned.inputs, planned.shapes, ar, evaluate_cost(ar, planned.inputs), [],
                      epoch_cost=epoch_cost, epoch=epoch)


def _extra(ctx: PassContext, priced: PricedPlan, seg: Segment) -> Any:
    """The symbol values a segment's formula needs besides the inputs: a Hybrid selection's (the planner's
    or select-hybrid's; CACHE_ALL for one that caches every dependency, priced as DepCache); for a selection
    given by the caller, communicate-all (its overlap and bins are priced as if it cached nothing)."""
    if seg.strategy != "hybrid":
        return None
    key = (seg.start, seg.end, seg.strategy)
    known = ctx.results.hybrid_values or {}
    if key in priced.extras or (seg.start, seg.end) in known:
        chosen = priced.extras[key] if key in priced.extras else known[(seg.start, seg.end)]
        return CACHE_ALL if chosen is None else chosen
    inp, k = priced.inputs, seg.end - seg.start
    p = inp.workers
    return hybrid_values(seg.start, np.stack([inp.remote] * k, 1), np.stack([inp.send] * k, 1),
                         np.zeros((p, k)), np.zeros((p, k)), np.zeros(p))


def _flags(value: str, legal: bool) -> list[bool]:
    if not legal or value == "off":
        return [False]
    return [True] if value == "on" else [True, False]


def choose_segment(program: Program, seg: Segment, priced: PricedPlan | None, extra: Any,
                   opts: ScheduleOptions) -> SegmentChoice:
    """The options of one segment: every combination of its legal choices priced, the fastest taken."""
    layers = program.graph_layers()[seg.start:seg.end]
    names = schedule_options(seg.strategy)
    why = []
    space: dict[str, list[bool]] = {}
    chunk_of = {d.chunk_flag: d.split_flag for d in COMM_OP_DEFS.values() if d.chunk_flag is not None}
    for flag in names:
        if flag == "bins":
            continue
        if flag in chunk_of:
            # a peer's chunk is waited for alone only in the ring, whose receives are posted one per peer
            # (all_to_all is one collective; ring_paced completes before any work)
            if opts.method != "ring":
                why.append(f"not {flag}: {opts.method} exchanges deliver every peer's rows at once")
            # unchunked first: on a tie the whole halo, one dispatch per part fewer
            space[flag] = _flags(getattr(opts, flag, "auto"), opts.method == "ring")[::-1]
            continue
        splits = [d for d in COMM_OP_DEFS.values() if d.split_flag == flag]
        if any(opts.method in d.no_overlap_methods for d in splits):
            why.append(f"{opts.method} exchanges complete before the work that could overlap them")
            space[flag] = _flags(getattr(opts, flag, "auto"), False)
            continue
        blocker = next((w for w in (stageable(layer, flag) for layer in layers) if w), "")
        if blocker:
            why.append(f"not {flag}: {blocker}")
        space[flag] = _flags(getattr(opts, flag, "auto"), not blocker)
    combos: list[dict[str, Any]] = [{}]
    for name, values in space.items():
        combos = [{**c, name: v} for c in combos for v in values]
    # chunks are of a split exchange only: chunked=on splits it where it may be split; an exchange not split
    # comes whole (chunked=on with overlap=off too)
    for ch, sp in chunk_of.items():
        if getattr(opts, ch, "auto") == "on" and any(c.get(ch) and c.get(sp) for c in combos):
            combos = [c for c in combos if c.get(sp)]
    combos = [{**c, **{ch: False for ch, sp in chunk_of.items() if ch in c and not c.get(sp, False)}} for c in combos]
    combos = [c for k, c in enumerate(combos) if c not in combos[:k]]
    bins = {"bins": 1} if "bins" in names else {}
    alternatives = []
    best = None
    for combo in combos:
        options = {**combo, **bins}
        alt: dict[str, Any] = {"options": options}
        if priced is not None:
            value = evaluate_cost(segment_formula(program, seg, priced.shapes, extra, **options), priced.inputs,
                                  symbol_values(extra))
            alt.update(time_s=value.time, memory_bytes=value.memory)
            if best is None or value.time < best[0]:
                best = (value.time, options)
        elif best is None:
            best = (0.0, options)
        alternatives.append(alt)
    assert best is not None
    if priced is None and len(combos) > 1:
        why.append("no partition to price on: the first choice")
    return SegmentChoice(seg, dict(best[1]), alternatives, "; ".join(why))


def _fit_cap(program: Program, choices: list[SegmentChoice], opts: ScheduleOptions, priced: PricedPlan | None,
             grad_overlap: bool) -> tuple[Program, activations.Activations | None, list[str]]:
    """Bins for the memory cap: as few as bring the predicted activation peak under it, or the fixed `bins`
    option. Returns the annotated program.

    Each step doubles the bins of the layer (with its segment) whose doubling lowers the predicted peak
    most: the peak holds one bin of the layer with the largest bin, so doubling another layer's bins
    saves nothing (choosing by what a layer keeps doubled the first layer to 4096 bins while the second
    layer's 8 bins set the peak: a GAT epoch 6.8x the unbinned one, measured). Once under the cap, each
    layer's bins are halved back while the cap still holds (a layer doubled while it set the peak may
    not need its bins once the others were doubled)."""
    per_layer: dict[int, dict[str, Any]] = {}
    for c in choices:
        for k in range(c.segment.start, c.segment.end):
            per_layer[k] = dict(c.options)
    layers = program.graph_layers()
    notes: list[str] = []
    if opts.bins > 1:
        for k, layer in enumerate(layers):
            if binnable(layer):
                per_layer[k] = {**per_layer.get(k, {}), "bins": opts.bins}
            else:
                notes.append(f"{layer.name} ({layer.attr('strategy')}) does not run in bins")
    annotated = annotate(program, per_layer, opts, grad_overlap)
    if priced is None:
        if opts.memory_cap:
            raise GnncError("--memory-cap needs the partition to estimate the activations on (--workers N --graph G)")
        return annotated, None, notes
    est = activations.estimate(annotated, priced.inputs)
    if not opts.memory_cap or opts.bins:
        return annotated, est, notes
    while float(est.peak.max()) > opts.memory_cap:
        names = [layer.name for layer in annotated.graph_layers()]
        grow = [k for k, layer in enumerate(layers) if binnable(layer) and per_layer.get(k, {}).get("bins", 1) < MAX_BINS]
        if not grow:
            binned = {k: per_layer.get(k, {}).get("bins", 1) for k in range(len(layers))}
            raise GnncError(f"--memory-cap {opts.memory_cap}: the predicted activation memory is still "
                            f"{float(est.peak.max()):.0f} bytes per worker with bins {binned} "
                            f"({float(est.kept.max()):.0f} bytes are kept whatever the bins: layer inputs and "
                            f"outputs, exchanged rows, layers that do not run in bins)")
        tried = []
        for k in grow:
            doubled = _scaled(per_layer, k, choices, layers, 2)
            trial = annotate(program, doubled, opts, grad_overlap)
            trial_est = activations.estimate(trial, priced.inputs)
            # the lowest peak; on a tie the layer that keeps the most (the old rule), then the first
            tried.append((float(trial_est.peak.max()), -float(est.per_layer[names[k]].max()), k, doubled, trial,
                          trial_est))
        _, _, _, per_layer, annotated, est = min(tried, key=lambda t: t[:3])
    # halve back what the cap allows, the most bins first
    for k in sorted(range(len(layers)), key=lambda i: -per_layer.get(i, {}).get("bins", 1)):
        while per_layer.get(k, {}).get("bins", 1) > 1:
            fewer = _scaled(per_layer, k, choices, layers, 0.5)
            trial = annotate(program, fewer, opts, grad_overlap)
            trial_est = activations.estimate(trial, priced.inputs)
            if float(trial_est.peak.max()) > opts.memory_cap:
                break
            per_layer, annotated, est = fewer, trial, trial_est
    return annotated, est, notes


def _scaled(per_layer: dict[int, dict[str, Any]], k: int, choices: list[SegmentChoice], layers: list[Layer],
            factor: float) -> dict[int, dict[str, Any]]:
    """`per_layer` with layer k's bins times `factor` (2 or 1/2), and its segment's layers with it (a
    segment's layers run in as many bins as its largest: one formula option)."""
    out = dict(per_layer)
    out[k] = {**out.get(k, {}), "bins": max(1, int(out.get(k, {}).get("bins", 1) * factor))}
    for c in choices:
        if c.segment.start <= k < c.segment.end:
            for j in range(c.segment.start, c.segment.end):
                if binnable(layers[j]):
                    out[j] = {**out.get(j, {}), "bins": out[k]["bins"]}
    return out


@register_pass("schedule", "decide every execution detail: overlap, staged broadcasts, G3 bins, gradient buckets",
               options=ScheduleOptions, requires=("strategies",))
def schedule(program: Program, ctx: PassContext, opts: ScheduleOptions) -> Program:
    _check(opts)
    if ctx.workers == 1 or ctx.sampling is not None:
        return program  # one process, or sampled minibatches: gnnc.runtime.minibatch orders their phases
    if is_pipeline(program):
        # GNNPipe's stages run chunk by chunk as stage-pipeline laid them out; nothing here applies to them
        if opts.memory_cap:
            raise GnncError("--memory-cap runs layers in G3's bins, which the pipeline strategy does not: "
                            "its stages hold their layers' activations chunk by chunk")
        return program
    priced = _priced(program, ctx)
    choices = []
    for seg in program_segments(program):
        extra = _extra(ctx, priced, seg) if priced is not None else None
        choices.append(choose_segment(program, seg, priced, extra, opts))
    grad_overlap = opts.grad_overlap != "off"
    annotated, est, notes = _fit_cap(program, choices, opts, priced, grad_overlap)
    final = program_segments(annotated)
    report: dict[str, Any] = {"segments": [], "memory_cap": opts.memory_cap or None, "notes": notes}
    if opts.pipeline == "auto" and priced is not None:
        annotated, pipeline_report = choose_pipeline(annotated, priced)
        if pipeline_report:  # (only binned DepComm layers are candidates)
            report["pipeline"] = pipeline_report
    for c, seg in zip(choices, final):
        report["segments"].append({"layers": [seg.start, seg.end], "strategy": seg.strategy, "why": c.why,
                                   "options": segment_options(annotated.graph_layers()[seg.start:seg.end],
                                                              seg.strategy),
                                   "alternatives": c.alternatives})
    if priced is not None:
        extras = {(s.start, s.end, s.strategy): _extra(ctx, priced, s) for s in final}
        plan = scheduled_plan(annotated, priced, extras)
        report["grad_alternatives"] = _grad_alternatives(final, plan)
        if opts.grad_overlap == "auto":  # the faster; during backward when they tie
            grad_overlap = min(report["grad_alternatives"], key=lambda a: (a["time_s"], not a["grad_overlap"]))[
                "grad_overlap"]
            annotated = annotated.replace(attrs=tuple(sorted({**dict(annotated.attrs),
                                                              "grad_overlap": grad_overlap}.items())))
            plan = dataclasses.replace(plan, grad_overlap=grad_overlap)
        drawn = predicted_schedule(final, plan)
        report["predicted"] = drawn
        report["predicted_time_s"] = drawn["time_s"]
        report["grad_buckets"] = len(plan.allreduce_cost.stages)
        for entry, seg in zip(report["segments"], final):
            value = plan.values[(seg.start, seg.end, seg.strategy)]
            entry.update(time_s=value.time, memory_bytes=value.memory)
        if est is not None:
            report["activation_bytes"] = float(est.peak.max())
            report["activation_kept_bytes"] = float(est.kept.max())
        planner = ctx.results.planner
        if planner is not None:
            planner.schedule = drawn
            planner.predicted_time_s = drawn["time_s"]
    report["grad_overlap"] = grad_overlap
    ctx.results.schedule_report = report
    return annotated


def _grad_alternatives(segments: list[Segment], plan: PricedPlan) -> list[dict[str, Any]]:
    """The predicted epoch with the gradient all-reduce after backward and during it (their times only: the
    stages are not split into pieces)."""
    out = []
    for overlap in (False, True):
        drawn = predicted_schedule(segments, dataclasses.replace(plan, grad_overlap=overlap), pieces=False)
        out.append({"grad_overlap": overlap, "time_s": drawn["time_s"]})
    return out
