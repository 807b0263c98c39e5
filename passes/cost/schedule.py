"""The predicted schedule: the chosen assignment's epoch, stage by stage and worker by worker.

Why this module exists: `gnnc inspect --format gantt|trace` draws the epoch
the planner predicted. The cost model prices a stage as one expression per
worker; the chart needs it split into what computes and what communicates,
and which of those overlap. Each stage expression is a sum of terms: a term
that is a Max is an overlap window (its arguments run side by side, the
stage pays the longest), any other term runs on its own. A term reading the
link symbols (bw, alpha) is communication, one reading the GEMM rate a
dense map, one reading the SpMM rate aggregation (attention included). The
split is checked against the stage's own evaluation, worker by worker; a
stage it does not reproduce (a user cost function of another shape) is
recorded whole, marked unsplit.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import sympy

from gnnc.ir.expr import as_expr
from gnnc.passes.cost.evaluation import compile_expr, evaluate_cost, table
from gnnc.passes.cost.layouts import boundary
from gnnc.passes.cost.priced import PricedPlan
from gnnc.passes.cost.symbols import R_gemm, R_gemm_e, R_spmm, R_spmm_e, alpha, bw
from gnnc.plan.comm_ops import PIECES, draw_order
from gnnc.plan.strategies import STRATEGIES


# Forward order of a layer's pieces ("overlap": a Max window). The cost model fixes durations and
# what overlaps, not the order inside a stage; this is the order the runtime runs them in when the
# dense map comes first (NeutronStar: fetch at the segment's entry, GeMM, exchange while the local
# edges aggregate, then the remote ones); an exchange that runs later says so in its descriptor
# (gnnc.plan.comm_ops: draw_order; MG-GCN broadcasts W's output, P3 pulls the partial sums).
# Backward draws the reverse.
_DEFAULT_ORDER = PIECES
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


_COMM, _GEMM, _SPMM = 1, 2, 4  # the rates a term divides by, as bits (module comment above)
_RATES = {s.name: bit for bit, rates in ((_COMM, (bw, alpha)), (_GEMM, (R_gemm, R_gemm_e)),
                                         (_SPMM, (R_spmm, R_spmm_e))) for s in rates}
# what a term does, by the bits of the rates it reads: communication and a compute rate is mixed, both compute
# rates compute
_OPS = {0: "compute", _COMM: "communication", _GEMM: "dense", _SPMM: "aggregation", _GEMM | _SPMM: "compute",
        _COMM | _GEMM: "mixed", _COMM | _SPMM: "mixed", _COMM | _GEMM | _SPMM: "mixed"}


class _Marks(NamedTuple):
    """What a term's symbols say of it: the rates it reads (`_OPS`' bits), the hops k of the `HE_{k}_i` it reads
    (in-edges within k hops) and the layers l of the widths `d_{l}`, each once."""

    rates: int
    hops: frozenset[int]
    dims: tuple[int, ...]  # sorted

    @property
    def op(self) -> str:
        """What the term does, read off the rates it divides by."""
        return _OPS[self.rates]


_SYMBOL_MARKS: dict[str, tuple[int, int | None, int | None]] = {}  # by symbol name (`_symbol_marks`)


def _symbol_marks(name: str) -> tuple[int, int | None, int | None]:
    """(rate bit, hop, width's layer) of the symbol named `name` (0 / None where it is none of those). Kept by name
    (a str's hash is C's; a Symbol's is a Python call): a deep stage's ~1,600 terms read the same ~200 symbols."""
    marks = _SYMBOL_MARKS.get(name)
    if marks is None:
        hop, dim = _HOP_EDGES.fullmatch(name), _DIM.fullmatch(name)
        marks = _SYMBOL_MARKS[name] = (_RATES.get(name, 0), int(hop.group(1)) if hop else None,
                                       int(dim.group(1)) if dim else None)
    return marks


def _symbol_names(term) -> set[str]:
    """The names of the symbols a term reads (its free symbols': cost formulas bind none), by one walk of its
    arguments (sympy's free_symbols unions a set per sub-expression)."""
    if term.is_Symbol:
        return {term.name}
    names: set[str] = set()
    todo = list(term.args)
    while todo:
        arg = todo.pop()
        if arg.is_Symbol:
            names.add(arg.name)
        elif not arg.is_Number:
            todo.extend(arg.args)
    return names


def _marks(term) -> _Marks:
    """A term's `_Marks`, from one walk of its symbols (the op and the layer were each read off a walk of the
    term's free symbols of their own: two walks of every term of a stage)."""
    rates, hops, dims = 0, set(), set()
    for name in _symbol_names(term):
        rate, hop, dim = _symbol_marks(name)
        rates |= rate
        if hop is not None:
            hops.add(hop)
        if dim is not None:
            dims.add(dim)
    return _Marks(rates, frozenset(hops), tuple(sorted(dims)))


_NO_MARKS = _Marks(0, frozenset(), ())


def _term_layer(marks: _Marks, layers: Sequence[int], op: str) -> int | None:
    """The graph layer a term of a stage belongs to (`marks`: the term's).

    A stage of one layer: that layer. A stage spanning layers [start, end) (DepCache: workers meet
    only at the segment's ends) is a sum of every layer's terms: an aggregation reads the in-edges
    within end-1-l hops of the worker's vertices (HE_{end-1-l}), a dense map the widths d_l and
    d_{l+1}, and the communication is the fetch of the segment's input (first layer). None: unknown.
    """
    if len(layers) == 1:
        return layers[0]
    if not layers:
        return None
    end = layers[-1] + 1
    if len(marks.hops) == 1 and op != "dense":
        (hop,) = marks.hops
        layer = end - 1 - hop
    elif op == "dense" and len(marks.dims) >= 2:
        layer = marks.dims[0]
    elif op == "communication":
        layer = layers[0]
    else:
        return None
    return layer if layer in layers else None


def _ordered(pieces: list, order: Sequence[str], gemm_first: dict[int, bool], backward: bool) -> list:
    """Pieces (or windows) in the order they run: by layer, then by `order` (dense after the
    aggregation in a layer whose dense map runs last); reversed in backward."""
    ops = list(order)
    first = {op: k for k, op in enumerate(ops)}  # a layer whose dense map runs first (the default)
    if "dense" in ops:  # (the dense map after the aggregation: built once, not per piece)
        ops.remove("dense")
        ops.insert(ops.index("aggregation") + 1, "dense")
    last = {op: k for k, op in enumerate(ops)}

    def rank(item) -> tuple[int, int]:
        op = "overlap" if isinstance(item, _Window) else item.op
        if item.layer is None:
            return (1 << 30, first[op])
        return (item.layer, (first if gemm_first.get(item.layer, True) else last)[op])

    out = sorted(pieces, key=rank)
    return out[::-1] if backward else out


def _merged(pieces: list) -> list:
    """Adjacent pieces of the same layer and op as one (e.g. a message's bytes and its latency). Each run is
    summed once: adding its terms one by one re-sorted the sum at every step, quadratic in a deep DepCache
    stage's thousands of terms."""
    runs: list[list] = []
    for p in pieces:
        if runs and isinstance(p, _Piece) and isinstance(runs[-1][0], _Piece) and (
                runs[-1][0].layer, runs[-1][0].op) == (p.layer, p.op):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [run[0] if len(run) == 1 else _Piece(run[0].layer, run[0].op, sympy.Add(*(p.expr for p in run)))
            for run in runs]


def _stage_items(expr, layers: Sequence[int], order: Sequence[str], gemm_first: dict[int, bool],
                 backward: bool) -> list:
    """A stage expression as the pieces and overlap windows it runs, in order."""
    items: list = []
    spans = len(layers) > 1  # (a stage of one layer or none needs no symbol to place its terms)
    for term in sympy.Add.make_args(as_expr(expr)):
        if isinstance(term, sympy.Max):
            layer = _term_layer(_marks(term), layers, "overlap") if spans else _term_layer(_NO_MARKS, layers, "")
            lanes = []
            for arg in term.args:
                lane = [_Piece(layer, _marks(t).op, t) for t in sympy.Add.make_args(arg)]
                lanes.append(_merged(_ordered(lane, order, gemm_first, backward)))
            items.append(_Window(layer, lanes))
        else:
            marks = _marks(term)
            op = marks.op
            items.append(_Piece(_term_layer(marks, layers, op), op, term))
    return _merged(_ordered(items, order, gemm_first, backward))


def _place(items: list, start: float, workers: int, evaluate) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Start and duration of every piece, per worker: pieces one after another, a window's lanes side
    by side from the same point, the window as long as its longest lane. Returns (pieces, end)."""
    out: list[dict[str, Any]] = []
    cursor = np.full(workers, start, dtype=np.float64)

    def emit(piece: _Piece, at: np.ndarray, window: int | None) -> np.ndarray:
        t = evaluate(piece.expr)
        out.append({"layer": piece.layer, "op": piece.op, "track": _TRACK[piece.op], "overlap": window,
                    "start_s": at.tolist(), "time_s": t.tolist()})  # (float64 [workers]: Python floats)
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


def _segment_stages(start: int, end: int, n: int, whole_model: bool = False) -> list[tuple[str, list[int]]]:
    """(direction, layers) of each of a segment's n stages: one per layer and direction (DepComm,
    Hybrid: forward layer by layer, then backward in reverse), one per direction spanning every layer
    (DepCache; a whole-model pipeline, whose later stages are steps: its history refresh, its groups'
    all-reduce), else (a user cost of another shape) steps over the whole segment."""
    k = end - start
    if whole_model:
        layers = list(range(start, end))
        return [("forward", layers), ("backward", layers)] + [("step", layers)] * (n - 2)
    if n == 2 * k:
        return [("forward", [start + i]) for i in range(k)] + [("backward", [end - 1 - j]) for j in range(k)]
    if n == 2:
        return [("forward", list(range(start, end))), ("backward", list(range(start, end)))]
    return [("step", list(range(start, end)))] * n


# (stage expression, its times per worker, extra symbol values, stage description, drawing order)
_StageSpec = tuple[Any, np.ndarray, Any, dict[str, Any], Sequence[str]]


def predicted_schedule(segments: Sequence[Any], priced: PricedPlan, pieces: bool = True) -> dict[str, Any]:
    """The chosen assignment's epoch as the cost model predicts it, for every worker.

    Stages in the order they run: for each segment its forward stages (after the layout transition
    into it, if any), then the segments' backward stages in reverse (each followed by its
    transition's backward), then the gradient all-reduce and the optimizer step; then the
    evaluation pass (each transition's and segment's evaluation stages, in forward order;
    gnnc.passes.cost.epoch). Every stage lasts as long as its slowest
    worker (the cost model's rule), so stage k starts where stage k-1's slowest worker ended; the
    total is the planner's predicted epoch time. Each stage lists its pieces with their start and
    duration per worker (seconds from the epoch's start); pieces sharing an `overlap` id run side
    by side, and the stage pays the longest. `pieces` False: the stages without their pieces (every stage's
    start and time are the same: a stage lasts its own evaluation's slowest worker), for a caller that reads
    only the times (splitting each stage's formula into its terms is most of the drawing).
    """
    inputs = priced.inputs
    gemm_first = {i: shape.gemm_first for i, shape in enumerate(priced.shapes)}
    forward: list[_StageSpec] = []
    backward: list[list[_StageSpec]] = []  # per segment: its backward stages, then its transition's
    evaluation: list[_StageSpec] = []
    prev = None
    for seg in segments:
        into_f: list[_StageSpec] = []
        into_b: list[_StageSpec] = []
        if prev is not None and prev != seg.strategy:
            cost = boundary(prev, seg.strategy, seg.start)
            value = evaluate_cost(cost, inputs)
            info = {"kind": "transition", "strategy": f"{prev}->{seg.strategy}", "segment": None, "layers": []}
            train = len(cost.training_stages)
            for k, (direction, into) in enumerate((("forward", into_f), ("backward", into_b))[:train]):
                into.append((cost.stages[k], value.stage_times[k], None, {**info, "direction": direction},
                             _DEFAULT_ORDER))
            for k in range(train, len(cost.stages)):
                evaluation.append((cost.stages[k], value.stage_times[k], None, {**info, "direction": "evaluation"},
                                   _DEFAULT_ORDER))
        key = (seg.start, seg.end, seg.strategy)
        cost, value, extra = priced.formulas[key], priced.values[key], priced.extras[key]
        order = draw_order(seg.strategy)
        seg_f: list[_StageSpec] = []
        seg_b: list[_StageSpec] = []
        whole = STRATEGIES[seg.strategy].whole_model
        train = len(cost.training_stages)
        kinds = _segment_stages(seg.start, seg.end, train, whole)
        kinds += [("evaluation", layers) for direction, layers in kinds if direction == "forward"][:cost.evaluation]
        for (direction, layers), expr, times in zip(kinds, cost.stages, value.stage_times):
            info = {"kind": "segment", "strategy": seg.strategy, "segment": [seg.start, seg.end],
                    "direction": direction, "layers": layers}
            into = {"backward": seg_b, "evaluation": evaluation}.get(direction, seg_f)
            into.append((expr, times, extra, info, order))
        forward += into_f + seg_f
        backward.append(seg_b + into_b)
        prev = seg.strategy
    ar = priced.allreduce_cost
    # a pipeline replicates no weight: its own cost holds its groups' all-reduce
    reduced = not any(STRATEGIES[seg.strategy].whole_model for seg in segments)
    buckets = [(expr, times, None, {"kind": "allreduce", "strategy": None, "segment": None, "direction": "backward",
                                    "layers": []}, _DEFAULT_ORDER)
               for expr, times in zip(ar.stages, priced.allreduce.stage_times) if reduced]
    step = _optimizer_stage(priced)
    overlap = bool(getattr(priced, "grad_overlap", False))
    stages, clock = [], 0.0
    # each segment's symbol values, made once and read by all its pieces: `evaluate(piece, inputs, extra)` made a
    # table of every symbol per piece (a Hybrid selection's extra values over the inputs' whole table)
    tables: dict[int, tuple[Any, Any]] = {}

    def values(extra: Any) -> Any:
        if id(extra) not in tables:
            tables[id(extra)] = (extra, table(inputs, extra))  # (extra held: its id stays its own)
        return tables[id(extra)][1]

    def draw(specs: list[_StageSpec]) -> None:
        nonlocal clock
        for expr, times, extra, info, order in specs:
            if float(np.max(times)) <= 0.0:
                continue  # nothing happens (e.g. a layout change that is free forward)
            if pieces:
                record = _stage_record(expr, times, clock,
                                       lambda e, t=values(extra): compile_expr(e)(t, inputs.workers), info, order,
                                       gemm_first)
            else:
                record = {**info, "start_s": clock, "time_s": float(times.max()),
                          "worker_time_s": [float(x) for x in times], "pieces": []}
            stages.append(record)
            clock += record["time_s"]

    draw(forward + [s for block in reversed(backward) for s in block] + ([] if overlap else buckets))
    if overlap and buckets:
        record = _overlapped_allreduce(buckets, stages, clock, getattr(priced, "grad_ready", ()), len(priced.shapes))
        stages.append(record)
        clock += record["time_s"]
    draw(step + evaluation)
    return {"per": "worker", "workers": inputs.workers, "cluster": inputs.profile.name, "time_s": clock,
            "stages": stages}


def _optimizer_stage(priced: PricedPlan) -> list[_StageSpec]:
    """The optimizer's stage, after the all-reduce (none for a priced plan without one)."""
    cost, value = getattr(priced, "epoch_cost", None), getattr(priced, "epoch", None)
    if cost is None or value is None:
        return []
    return [(expr, times, None, {"kind": "optimizer", "strategy": None, "segment": None, "direction": "step",
                                 "layers": []}, _DEFAULT_ORDER)
            for expr, times in zip(cost.stages, value.stage_times)]


def _overlapped_allreduce(buckets: list[_StageSpec], stages: list[dict[str, Any]], end: float,
                          ready: Sequence[int], layers: int) -> dict[str, Any]:
    """The gradient all-reduce posted bucket by bucket during backward (the schedule's `grad_overlap`).

    Bucket b can start once the backward stage of graph layer ready[b] has ended (ready[b] = the
    number of graph layers: at the start of backward); the buckets share one link, in order. The
    stage that follows backward lasts as long as the all-reduce outlasts it (0 when it hides).
    """
    backward = [s for s in stages if s["direction"] == "backward" and s["kind"] != "allreduce"]
    start = backward[0]["start_s"] if backward else end
    done: dict[int, float] = {}
    for s in backward:
        for layer in s["layers"]:
            done[layer] = max(done.get(layer, 0.0), s["start_s"] + s["time_s"])
    workers = len(buckets[0][1])
    link = np.full(workers, start, dtype=np.float64)
    pieces = []
    for k, (expr, times, _extra, _info, _order) in enumerate(buckets):
        layer = ready[k] if k < len(ready) else 0
        at = start if layer >= layers else done.get(layer, end)
        begin = np.maximum(link, at)
        link = begin + np.asarray(times, dtype=np.float64)
        # None: the buckets run beside the backward stages before this one, not beside each other
        pieces.append({"layer": None, "op": "communication", "track": "communication", "overlap": None,
                       "start_s": [float(x) for x in begin], "time_s": [float(x) for x in times]})
    tail = np.maximum(link - end, 0.0)
    return {"kind": "allreduce", "strategy": None, "segment": None, "direction": "backward", "layers": [],
            "start_s": end, "time_s": float(tail.max()), "worker_time_s": [float(x) for x in tail], "split": True,
            "overlapped": True, "pieces": pieces}
