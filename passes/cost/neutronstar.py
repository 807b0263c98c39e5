"""NeutronStar's strategies: DepComm per layer, DepCache and Hybrid over segments, and the greedy's unit costs.

Why this module exists: the three share the halo exchange and the
neighbourhood replication terms, and Hybrid with nothing cached is DepComm
layer by layer; `hybrid_values` and `hybrid_unit_costs` bridge the formulas
to the Hybrid greedy (gnnc.passes.planner.hybrid_greedy). G3's peer-to-peer push is
DepComm.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.passes.cost.collectives import all_to_all_time, all_gather_time, any_moved
from gnnc.passes.cost.compute import (aggregation_time, dense_map_time, compute_forward, compute_backward,
                                      layer_memory, call_ops, copy_time, edge_ops, halo_buffers, layer_ops, part_calls,
                                      per_epoch, row_ops)
from gnnc.passes.cost.epoch import evaluation_of
from gnnc.passes.cost.evaluation import (CostValue, Columns, Overlay, compile_expr, evaluate_alike, numeric_function,
                                        table)
from gnnc.passes.cost.overlap import overlap_window, pipeline_dispatch, pipelined_window
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import (Max, P, b, bw, V, E, B, S, E_r, E_in, d, hop_vertices, hop_edges,
                                      comm_rows, comm_sent, recompute_rows, recompute_edges, RX, LayerShape,
                                      CostInputs, Cost, Rows, ZERO)


@cost_formula("depcomm")
def depcomm(layer: int, shape: LayerShape, overlap: bool = True, bins: int = 1, chunked: bool = False,
            feed: LayerShape | None = None, chain_calls: int = 0) -> Cost:
    """DepComm (NeutronStar) / G3's peer-to-peer push: halo exchange of remote in-neighbour rows.

    Worker i sends S_i rows and receives B_i rows of the exchanged value (one
    row per (vertex, remote worker) pair, thanks to mirrors), each
    `shape.width` wide; in backward the gradients of the B_i received rows
    go back and are summed at their owners. This is the per-layer
    communication term of NeutronStar's Eq. 1-3 (T_c per communicated
    vertex) and of G3's Eq. 4, whose per-epoch total 2·b·Σ_l H_l·Σ_i |B_i|
    docs/design.md quotes (GNNPipe's Table 4).

    Beyond the seeds: (1) the width is what the IR exchanges (d_out when the
    dense map runs first, else d_in); (2) a layer reading the input features
    sends nothing back (x has no gradient), so its traffic is half of the
    2·b·H·|B_i| above; (3) time is full-duplex alpha-beta,
    max(S_i, B_i)·width·b/bw + (P-1)·alpha; (4) the layer's other ops
    (gnnc.passes.cost.ops: activations, bias, dropout, attention scores, the
    dense layer after it) on its V_i rows and E_i edges, and the rows packed
    and assembled around the exchange ((S_i + B_i)·width copies).

    The schedule (gnnc.plan.schedule_attrs) prices in: `overlap` (the halo split
    into start and wait): the work on edges with a held source, E_i - Er_i
    (the aggregation and the edge ops, which run per source part),
    overlaps the exchange (max, not sum) and the edges of remote sources wait
    for the whole halo, or with `chunked` each peer's edges for that peer's rows,
    as they arrive in ring order (NeutronStar section 4.3; gnnc.passes.cost.overlap);
    without it every edge waits. `bins` (G3):
    with k > 1 bins, the bins whose rows have no remote in-neighbour (Ein_i
    edges) run while the halo is in flight (eager computation), and backward
    recomputes every bin's forward before its own backward. `feed` (G3's
    inter-layer pipeline, `halo[pipelined=true]`: the previous graph layer's
    shape, binned too): the halo is in flight from the sender's first bin
    (gnnc.passes.cost.overlap.pipelined_window, on the sender's per-bin work and
    this layer's dense map, which its bins run per bin), at the cost of k
    messages per peer and the `chain_calls` equations run per bin.
    """
    w = shape.width(layer)
    xw = sympy.Add(*shape.exchanged_widths(layer))  # with attention, its scores' exchange too
    gemm_rows = V
    exch = per_epoch(shape, sympy.Add(*(all_to_all_time(S * x * b, B * x * b) for x in shape.exchanged_widths(layer))))
    gemm = dense_map_time(layer, shape, gemm_rows)

    def edge_work(edges: sympy.Expr, phase: str) -> sympy.Expr:
        return aggregation_time(layer, shape, edges, w, phase) + edge_ops(layer, edges, phase)

    piped = feed is not None and bins > 1 and overlap
    if piped:
        # the sender's per-bin work, and the dense map whose output the halo carries, now run per sender bin
        sent = _bin_recompute(layer - 1, feed, V, E) + (gemm / shape.gemms if shape.gemm_first else ZERO)
        window = (pipelined_window(exch, sent, edge_work(E_in, "f"), edge_work(E - E_in, "f"), bins)
                  + pipeline_dispatch(bins, chain_calls, "f"))
    elif bins > 1:
        held, rest = edge_work(E_in, "f"), edge_work(E - E_in, "f")
        window = Max(exch, held) + rest if overlap else exch + held + rest
    elif overlap:
        window = overlap_window(exch, edge_work(E - E_r, "f"), edge_work(E_r, "f"), chunked, part_calls(layer, "f"))
    else:
        window = exch + edge_work(E, "f")
    fwd = (gemm + row_ops(layer, V, V, "f") + call_ops(layer, "f") + per_epoch(shape, copy_time((S + B) * xw, "f"))
           + per_epoch(shape, halo_buffers(V, xw, shape.exchange_grad, "f")) + window)
    bwd_dense = (compute_backward(layer, shape, gemm_rows, ZERO) + row_ops(layer, V, V, "b") + call_ops(layer, "b")
                 + per_epoch(shape, halo_buffers(V, xw, shape.exchange_grad, "b")))
    nbytes = per_epoch(shape, S * xw * b)
    if shape.exchange_grad:
        bwd = bwd_dense + copy_time((S + B) * xw, "b")
        if overlap:
            bwd += overlap_window(exch, edge_work(E - E_r, "b"), edge_work(E_r, "b"), chunked, part_calls(layer, "b"))
        else:
            bwd += exch + edge_work(E, "b")
        nbytes += B * xw * b
    else:
        bwd = bwd_dense + edge_ops(layer, E, "b")
    if bins > 1:
        bwd += _bin_recompute(layer, shape, V, E)
    if piped:
        bwd += pipeline_dispatch(bins, chain_calls, "b", messages=shape.exchange_grad)
    memory = layer_memory(layer, shape, V, B, V, E)
    return Cost(f"depcomm[{layer}]", (fwd, bwd), nbytes, memory)


def _bin_recompute(layer: int, shape: LayerShape, rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """The forward work backward repeats when a layer runs in bins: what runs per bin (the aggregation,
    the edge ops, and the dense map when it comes after the aggregation)."""
    t = aggregation_time(layer, shape, edges, shape.width(layer)) + edge_ops(layer, edges, "f")
    if not shape.gemm_first:
        t += dense_map_time(layer, shape, rows)
    return t


def _fetch_rows(rows: sympy.Expr, width: sympy.Expr, with_grad: bool,
                only_if_any: bool = False) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """Forward time, backward time and bytes of replicating `rows` remote rows at a segment's entry.

    Per worker only the received count is known (who sends how many depends
    on the other workers' neighbourhoods), so the time is receive-bound and
    the bytes are charged to the receiver; the sum over workers is exact.
    `only_if_any`: a worker that fetches no row starts no message (Hybrid,
    whose selection may replicate nothing).
    """
    t = all_gather_time(rows * width * b, (P - 1) * any_moved(rows) if only_if_any else None)
    nbytes = rows * width * b * (2 if with_grad else 1)
    return t, (t if with_grad else ZERO), nbytes


@cost_formula("depcache")
def depcache(start: int, end: int, shapes: Sequence[LayerShape], fetch_input: bool | None = None,
             bins: int = 1, halo: bool = False) -> Cost:
    """DepCache (NeutronStar): replicate the (end-start)-hop in-neighbourhood and recompute it.

    With k = end - start layers, layer start+m computes the rows within
    k-1-m hops of V_i (HV_{k-1-m}) from the in-edges of those rows
    (HE_{k-1-m}); the dense map runs on its input rows (HV_{k-m}) when it
    comes first, else on its output rows. No activation is exchanged inside
    the segment, so workers meet only at its ends: one forward and one
    backward stage. The weight all-reduce is a separate `grad_allreduce`.
    This is NeutronStar's DepCache cost (Eq. 1-3: T_v per computed vertex,
    T_e per edge) with op-aware T_v, T_e; the layer's other ops
    (gnnc.passes.cost.ops) run on the same rows and edges.

    Beyond the seed: a segment that starts after layer 0 must first fetch
    the rows of h^start in its k-hop neighbourhood (HV_k - V_i rows, and
    their gradients back); at layer 0 the input features are static, loaded
    once with the partition, and cost nothing per epoch. `fetch_input`
    overrides that rule. With `bins` > 1 (G3's bins, gnnc.plan.schedule_attrs) backward
    first recomputes each bin's forward.

    `halo`: a Hybrid segment whose selection caches every dependency (gnnc.passes.planner.hybrid's cache-all):
    DepCache's rows, but its plan still runs each layer's halo, empty, and the aggregation split around it, so
    each layer also pays `compute.halo_buffers` over the rows it computes, as the Hybrid formula charges a
    halo's layer. Measured: on the extended grid every such plan beside DepCache (same bytes) measured slower in
    11 of 12 pairs (+0 to +13%, median +6%; RESULTS-planner-extended.md, "Session 25 (PRICE)"), where the two were
    priced alike.
    """
    k = end - start
    if k < 1 or len(shapes) != k:
        raise ValueError(f"depcache[{start}:{end}] needs {max(k, 0)} layer shapes, got {len(shapes)}")
    fwd_terms, bwd_terms, memory_terms = [], [], []  # summed once: sympy re-sorts a sum at every +=
    for m, shape in enumerate(shapes):
        layer = start + m
        rows = {_IN: hop_vertices(k - m), _OUT: hop_vertices(k - 1 - m), _EDGES: hop_edges(k - 1 - m)}
        fwd, bwd, memory, _ = _depcache_layer(layer, shape, halo)
        fwd_terms.append(fwd.xreplace(rows))
        bwd_terms.append(bwd.xreplace(rows))
        if bins > 1:
            bwd_terms.append(_bin_recompute(layer, shape, rows[_OUT], rows[_EDGES]))
        memory_terms.append(memory.xreplace(rows))
    fwd, bwd, memory = sympy.Add(*fwd_terms), sympy.Add(*bwd_terms), sympy.Add(*memory_terms)
    nbytes = ZERO
    if fetch_input if fetch_input is not None else start > 0:
        t_f, t_b, nbytes = _fetch_rows(hop_vertices(k) - V, d(start), shapes[0].input_grad)
        fwd, bwd = t_f + fwd, bwd + t_b
    return Cost(f"depcache[{start}:{end}]", (fwd, bwd), nbytes, memory)


# A DepCache layer's rows, as placeholders: its input rows, its output rows and the edges it aggregates over (a
# layer m of a k-layer segment: HV_{k-m}, HV_{k-1-m}, HE_{k-1-m}), so that one formula per layer serves every span
_IN, _OUT, _EDGES = (Symbol(f"_depcache_{n}", nonnegative=True) for n in ("in_rows", "out_rows", "edges"))
_HOP = Symbol("_depcache_hop_rows", nonnegative=True)  # HV_k of a k-layer segment, for its entry fetch


@functools.lru_cache(maxsize=4096)
def _depcache_layer(layer: int, shape: LayerShape,
                    halo: bool = False) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """One layer of a DepCache segment on the placeholder rows `_IN`, `_OUT`, `_EDGES`: its forward and backward
    time, its memory, and its forward as the evaluation pass runs it (gnnc.passes.cost.epoch). `halo`: with an
    empty halo's buffers over its computed rows (`depcache`'s cache-all Hybrid)."""
    gemm_rows = _IN if shape.gemm_first else _OUT
    fwd = compute_forward(layer, shape, gemm_rows, _EDGES) + layer_ops(layer, _IN, _OUT, _EDGES, "f")
    bwd = compute_backward(layer, shape, gemm_rows, _EDGES) + layer_ops(layer, _IN, _OUT, _EDGES, "b")
    if halo:
        xw = sympy.Add(*shape.exchanged_widths(layer))
        fwd += per_epoch(shape, halo_buffers(_OUT, xw, shape.exchange_grad, "f"))
        bwd += per_epoch(shape, halo_buffers(_OUT, xw, shape.exchange_grad, "b"))
    memory = layer_memory(layer, shape, _IN, ZERO, _OUT, _EDGES)
    [evaluation] = evaluation_of((fwd,), range(layer, layer + 1))
    return fwd, bwd, memory, evaluation


class DepcacheSpans:
    """`depcache` (with the evaluation pass's stage, as the planner prices it) on any span of one model, evaluated
    without building the span's formula.

    Why: a k-layer segment's formula holds O(k) terms and the planner prices up to L(L+1)/2 spans; building
    each span's sum (sympy sorting its terms) took most of a deep model's compile. Layer l of a segment
    [start, end) runs on HV_{end-l} input rows, HV_{end-1-l} output rows and HE_{end-1-l} edges, whatever the
    start: each layer's terms (`_depcache_layer`) are compiled once and evaluated on every hop count in one
    numpy call, and a span sums its layers' values at its hop counts. The values are the formula's, summed in
    another order (equal to rounding: tests/test_planner_speed.py).
    """

    def __init__(self, inputs: CostInputs, shapes: Sequence[LayerShape], halo: bool = False):
        self.inputs, self.shapes, self.halo = inputs, tuple(shapes), halo  # halo: `depcache`'s (cache-all Hybrid)
        self.table = inputs.table.by_name
        hv, he = np.asarray(inputs.hop_vertices, np.float64), np.asarray(inputs.hop_edges, np.float64)
        self.hops = hv.shape[1] - 1  # a segment of at most this many layers has its rows counted
        p = inputs.workers
        # every symbol as a column (made when a term reads it), the placeholders as [workers, hop counts]: one call
        # per layer term
        self._grid = Columns(self.table, p, {_IN.name: hv[:, 1:], _OUT.name: hv[:, :-1], _EDGES.name: he[:, :-1]})
        self._terms: dict[int, np.ndarray] = {}  # layer -> [hop count h, term (fwd, bwd, memory, eval), worker]
        # start -> (its spans' layer sums [span length - 1, term, worker], how many of its layers are added)
        self._sums: dict[int, tuple[np.ndarray, int]] = {}

    def _layer(self, layer: int) -> np.ndarray:
        terms = self._terms.get(layer)
        if terms is None:
            self._evaluate([layer])
            terms = self._terms[layer]
        return terms

    def _evaluate(self, layers: Sequence[int]) -> None:
        """The terms of `layers` (those not done yet), evaluated together: a deep model's layers' terms are alike
        (gnnc.passes.cost.evaluation.evaluate_alike: one numpy call per operation for all of them)."""
        layers = [layer for layer in layers if layer not in self._terms]
        if not layers:
            return
        exprs = [e for layer in layers for e in _depcache_layer(layer, self.shapes[layer], self.halo)]
        cols = evaluate_alike(exprs, self._grid, (self.inputs.workers, self.hops))
        for n, layer in enumerate(layers):
            self._terms[layer] = np.ascontiguousarray(np.stack(cols[4 * n:4 * n + 4]).transpose(2, 0, 1))

    def _summed(self, start: int, k: int) -> np.ndarray:
        """The terms of the span of `k` layers from `start` summed over its layers, first to last: layer l adds its
        terms at hop count start + k - 1 - l. Every span from `start` is summed at once, a layer at a time (one
        numpy addition per layer for all of them, where a span's sum was one per layer and span: O(L²) calls for
        a deep model); each span's sum adds the same terms in the same order from 0, so it is the same floats."""
        sums, added = self._sums.get(start) or (None, 0)
        if sums is None:
            sums = np.zeros((min(self.hops, len(self.shapes) - start), 4, self.inputs.workers))
        longest = len(sums)
        self._evaluate(range(start + added, start + longest))  # every layer the spans from `start` may read, at once
        for j in range(added, k):  # layer start + j into every span holding it (lengths j + 1 .. longest)
            sums[j:] += self._layer(start + j)[:longest - j]
        self._sums[start] = (sums, max(added, k))
        return sums[k - 1]

    def value(self, start: int, end: int) -> CostValue:
        k = end - start
        if not 1 <= k <= self.hops:
            raise KeyError(f"no value for {hop_vertices(k)} (depcache[{start}:{end}])")
        fwd, bwd, memory, evaluation = self._summed(start, k).copy()
        nbytes = np.zeros(self.inputs.workers)
        if start > 0:
            t_f, t_b, fetched = _fetch_terms(start, self.shapes[start].input_grad)
            rows = Overlay(self.table, {_HOP.name: self.table[hop_vertices(k).name]})
            t_f, t_b, nbytes = (np.broadcast_to(np.asarray(numeric_function(e)[0](rows), np.float64),
                                                (self.inputs.workers,)) for e in (t_f, t_b, fetched))
            fwd, bwd, evaluation = t_f + fwd, bwd + t_b, t_f + evaluation
        return _value(f"depcache[{start}:{end}]", np.stack([fwd, bwd, evaluation]), nbytes, memory)


def _on_grid(value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A formula's value on a grid as float64 of `shape`: as it comes when it has that shape, else broadcast (a term
    constant along the grid); np.broadcast_to costs more than the formula's own few operations on small grids."""
    value = np.asarray(value, np.float64)
    return value if value.shape == shape else np.broadcast_to(value, shape)


@functools.lru_cache(maxsize=4096)
def _fetch_terms(start: int, with_grad: bool) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """`_fetch_rows` of a DepCache segment from `start` (its HV_k - V_i rows of h^start), on the placeholder `_HOP`."""
    return _fetch_rows(_HOP - V, d(start), with_grad)


def _value(name: str, stage_times: np.ndarray, worker_bytes: np.ndarray, worker_memory: np.ndarray) -> CostValue:
    """A cost's value from its per-worker stage times, bytes and memory (as `CompiledCost.on_table` makes it)."""
    time = float(sum(stage_times.max(axis=1).tolist()))  # the stages' maxima summed in order, as floats
    return CostValue(name, time, float(worker_bytes.sum()), float(worker_memory.max()), stage_times, worker_bytes,
                     worker_memory)


@cost_formula("hybrid")
def hybrid(start: int, end: int, shapes: Sequence[LayerShape], fetch_input: bool | None = None,
           overlap: bool = True, bins: int = 1, chunked: bool = False) -> Cost:
    """Hybrid (NeutronStar): the cost of a given cache/communicate selection over a segment.

    Per worker and layer l the selection gives CR_l rows received and CS_l
    rows sent (the communicated dependencies C) and RV_l rows / RE_l edges
    recomputed for the cached ones R (their subtrees, down to the segment's
    first layer); RX rows of h^start are replicated. `hybrid_values` turns a
    `gnnc.passes.planner.hybrid_greedy.HybridResult` into those symbols' values.

    Each layer: the worker's own rows (V_i, E_i) as in DepComm, plus the
    recomputation, which runs while the communicated rows are in flight
    (NeutronStar overlaps cached computation with communication: max, not
    sum). With nothing cached (CR = B, CS = S, RV = RE = RX = 0) this is
    `depcomm` layer by layer. Beyond the seed, as for `depcache`: a
    segment after layer 0 fetches its RX replicated rows at entry.

    Message start-ups are paid only by a worker that moves rows: the
    runtime's ring exchange posts nothing for an empty chunk, so a layer
    whose dependencies a worker all caches (and a segment entry that
    replicates nothing) costs it no latency. Charging (P-1)·alpha there made
    a selection that caches everything, and fetches 0 bytes, cost 0.6 ms more
    than DepCache on Cora x 4 at 50 us per message (issue 16). Whole
    selections are priced by `gnnc.passes.planner.hybrid.select`, which prices
    the one that caches everything as what the runtime then runs: DepCache.
    The schedule's `overlap`, `chunked` and `bins` as for `depcomm` (without overlap
    nothing runs while the rows are in flight; bins recompute their forward
    in backward).
    """
    k = end - start
    if k < 1 or len(shapes) != k:
        raise ValueError(f"hybrid[{start}:{end}] needs {max(k, 0)} layer shapes, got {len(shapes)}")
    stages_f: list[sympy.Expr] = []
    stages_b: list[sympy.Expr] = []
    byte_terms: list[sympy.Expr] = []  # summed once: sympy re-sorts a sum at every +=
    memory_terms: list[sympy.Expr] = []
    for m, shape in enumerate(shapes):
        fwd, bwd, nbytes, memory = _hybrid_layer(start + m, shape, m == 0, overlap, bins, chunked)
        stages_f.append(fwd)
        stages_b.append(bwd)
        byte_terms.append(nbytes)
        memory_terms.append(memory)
    nbytes, memory = sympy.Add(*byte_terms), sympy.Add(*memory_terms, RX * d(start) * b)
    if fetch_input if fetch_input is not None else start > 0:
        t_f, t_b, fetch_bytes = _fetch_rows(RX, d(start), shapes[0].input_grad, only_if_any=True)
        stages_f[0] = t_f + stages_f[0]
        stages_b[0] = stages_b[0] + t_b
        nbytes += fetch_bytes
    return Cost(f"hybrid[{start}:{end}]", tuple(stages_f) + tuple(reversed(stages_b)), nbytes, memory)


@functools.lru_cache(maxsize=4096)
def _hybrid_layer(layer: int, shape: LayerShape, first: bool, overlap: bool = True,
                  bins: int = 1, chunked: bool = False) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """One layer of a Hybrid segment: forward and backward stage, bytes, memory (see `hybrid`).

    They depend on the segment only through whether the layer is its first, so a
    deep model's many spans share them (cached: the planner prices every span).
    """
    w = shape.width(layer)
    cr, cs, rv, re = comm_rows(layer), comm_sent(layer), recompute_rows(layer), recompute_edges(layer)
    # the recomputed rows' inputs: the rows recomputed one layer down, or the replicated input rows at the segment's
    # first layer; a dense map that runs before the aggregation runs on them, as do the ops before the aggregation
    # (side "in": at layer 0 the dense layer before it, GCNII's dropout and 512 -> 32 map of x, on every replicated
    # row: priced on the output rows RV, 0 for a selection replicating only x, the gcnii/sbm x4 Hybrid measured
    # 1.2-1.55x its prediction, session 25)
    r_in = RX if first else recompute_rows(layer - 1)
    rg = r_in if shape.gemm_first else rv
    xw = sympy.Add(*shape.exchanged_widths(layer))  # with attention, its scores' exchange too
    # a worker that moves no row at this layer starts no message (its ring posts nothing)
    exch = per_epoch(shape, sympy.Add(*(all_to_all_time(cs * x * b, cr * x * b, (P - 1) * any_moved(cs + cr))
                                        for x in shape.exchanged_widths(layer))))

    def own_edges(edges: sympy.Expr, phase: str) -> sympy.Expr:
        return aggregation_time(layer, shape, edges, w, phase) + edge_ops(layer, edges, phase)

    def recompute(phase: str) -> sympy.Expr:  # the cached dependencies' rows: kernels and other ops
        kernels = compute_forward(layer, shape, rg, re) if phase == "f" else compute_backward(layer, shape, rg, re)
        return kernels + row_ops(layer, r_in, rv, phase) + edge_ops(layer, re, phase)

    def window(exchange: sympy.Expr, local: sympy.Expr, remote: sympy.Expr, phase: str) -> sympy.Expr:
        if not overlap:
            return exchange + local + remote
        return overlap_window(exchange, local, remote, chunked, part_calls(layer, phase))

    # the halo's buffers span the rows the layer computes, V + RV (its input's gradient spans those recomputed one
    # layer down too; the layer's own rows keep its price to its own symbols, as the planner evaluates a layer)
    held = V + rv
    fwd = (dense_map_time(layer, shape, V) + row_ops(layer, V, V, "f")
           + call_ops(layer, "f") + per_epoch(shape, copy_time((cs + cr) * xw, "f"))
           + per_epoch(shape, halo_buffers(held, xw, shape.exchange_grad, "f"))
           + window(exch, own_edges(E - E_r, "f") + recompute("f"), own_edges(E_r, "f"), "f"))
    bwd = (compute_backward(layer, shape, V, ZERO) + row_ops(layer, V, V, "b") + call_ops(layer, "b")
           + per_epoch(shape, halo_buffers(held, xw, shape.exchange_grad, "b")))
    nbytes = per_epoch(shape, cs * xw * b)
    if shape.exchange_grad:
        bwd += copy_time((cs + cr) * xw, "b") + window(exch, own_edges(E - E_r, "b") + recompute("b"),
                                                       own_edges(E_r, "b"), "b")
        nbytes += cr * xw * b
    else:
        bwd += recompute("b") + edge_ops(layer, E, "b")
    if bins > 1:
        bwd += _bin_recompute(layer, shape, V + rv, E + re)
    # the recomputed rows come with their own inputs and structure
    memory = layer_memory(layer, shape, V, cr, V, E) + layer_memory(layer, shape, ZERO, ZERO, rv, re)
    return fwd, bwd, nbytes, memory


@functools.lru_cache(maxsize=4096)
def _hybrid_layer_evaluation(layer: int, shape: LayerShape, first: bool) -> sympy.Expr:
    """`_hybrid_layer`'s forward stage as the evaluation pass runs it (gnnc.passes.cost.epoch)."""
    [evaluation] = evaluation_of(_hybrid_layer(layer, shape, first)[:1], range(layer, layer + 1))
    return evaluation


@functools.lru_cache(maxsize=4096)
def _hybrid_entry(start: int, with_grad: bool) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """A Hybrid segment's entry from `start`: its fetch of the RX replicated rows (forward, backward time and
    bytes, `hybrid`'s) and the memory they take."""
    return (*_fetch_rows(RX, d(start), with_grad, only_if_any=True), RX * d(start) * b)


def hybrid_value(start: int, end: int, shapes: Sequence[LayerShape], inputs: CostInputs,
                 extra: dict[Symbol, Any]) -> CostValue:
    """`hybrid` on layers [start, end) (`shapes`: theirs; with the evaluation pass's stages, as the planner
    prices it) on a selection's symbol values `extra` (`hybrid_values`): `hybrid_values_of` for one."""
    if len(shapes) != end - start:
        raise ValueError(f"hybrid[{start}:{end}] needs {end - start} layer shapes, got {len(shapes)}")
    return hybrid_values_of(inputs, {start + m: shape for m, shape in enumerate(shapes)}, [(start, end, extra)])[0]


def hybrid_values_of(inputs: CostInputs, shapes: Mapping[int, LayerShape] | Sequence[LayerShape],
                     selections: Sequence[tuple[int, int, dict[Symbol, Any]]]) -> list[CostValue]:
    """`hybrid` (with the evaluation pass's stages) on each of `selections` ((start, end, its symbol values,
    `hybrid_values`)), evaluated without building a segment's formula. `shapes`: every layer's, by index.

    Why: the planner prices two selections of every span (Algorithm 4's and communicate-all), O(L²) layer
    stages in all. Each layer's stages are compiled once (`_hybrid_layer`) and evaluated in one numpy call on
    every selection holding the layer, its values side by side as columns; a selection's stages are its
    layers' columns (the formula's values, its sums in another order)."""
    p, n = inputs.workers, len(selections)
    base = Columns(inputs.table.by_name, p)  # each one float64 per worker, as a column when a formula reads it
    # [selection, layer, worker]: a group of selections' layer written at once, not one (selection, layer) entry
    # at a time (O(L²) of them for a deep model's spans)
    top = max((end for _, end, _ in selections), default=0)
    stages_f, stages_b, stages_e = (np.zeros((n, top, p)) for _ in range(3))
    nbytes, memory = np.zeros((p, n)), np.zeros((p, n))

    named = [{s.name: v for s, v in extra.items()} for _, _, extra in selections]
    valued = {name for values in named for name in values}  # the names any selection has a value of

    missing = np.full(p, np.nan)
    # The selections' per-layer symbols (CR, CS, RV, RE of each layer) side by side, when every selection came
    # from `hybrid_values` (its `HybridValues.dense` arrays): [kind, selection, worker, model layer], NaN where a
    # selection has no such layer (as `missing`). A layer's column for all of its selections is then one
    # indexing, where stacking one row per (selection, symbol) was O(L²) Python calls for a deep model's spans.
    dense = _dense_columns(selections, p, top)

    def row(value: Any) -> np.ndarray:
        """A selection's value of one symbol as one float64 entry per worker (`hybrid_values` makes them so)."""
        if isinstance(value, np.ndarray) and value.dtype == np.float64 and value.shape == (p,):
            return value
        return np.broadcast_to(np.asarray(value, np.float64), (p,))

    def columns(which: list[int], exprs: Sequence[sympy.Expr]) -> Mapping[str, Any]:
        """The selections' values of the symbols `exprs` read, one column each, over every symbol's value.
        The names are the formulas' that some selection holds, looked up per name (a handful per layer), not
        gathered from every selection's values (O(L) names each: O(L³) over a deep model's spans)."""
        read = {s.name for e in exprs for s in numeric_function(e)[1]} & valued
        names = [name for name in read if any(name in named[i] for i in which)]
        return Overlay(base, {name: (np.ascontiguousarray(dense[0][dense[1][name]][which].T)
                                     if dense is not None and name in dense[1]
                                     else np.stack([row(named[i].get(name, missing)) for i in which], axis=1))
                              for name in names})

    def run(expr: sympy.Expr, grid: Mapping[str, Any], cols: int) -> np.ndarray:
        return _on_grid(numeric_function(expr)[0](grid), (p, cols))

    groups: dict[tuple[int, bool], list[int]] = {}
    for i, (start, end, _) in enumerate(selections):
        for layer in range(start, end):
            groups.setdefault((layer, layer == start), []).append(i)
    # every layer's five formulas evaluated together (evaluation.evaluate_alike: a deep model's layers are alike),
    # each layer's selections' columns widened to the widest layer's by repeating its last one (values computed
    # and dropped: no operation a real column does not make), then each layer's own columns taken back
    items = list(groups.items())
    width = max((len(which) for _, which in items), default=0)
    exprs: list[sympy.Expr] = []
    tables: list[Mapping[str, Any]] = []
    for (layer, first), which in items:
        five = (*_hybrid_layer(layer, shapes[layer], first), _hybrid_layer_evaluation(layer, shapes[layer], first))
        grid = columns(which, five)
        widen = np.minimum(np.arange(width), len(which) - 1)  # its columns, then its last one again
        wide = Overlay(base, {name: v[:, widen] for name, v in dict(grid).items()})
        exprs.extend(five)
        tables.extend([wide] * 5)
    got = evaluate_alike(exprs, tables, (p, width))
    for n, ((layer, first), which) in enumerate(items):
        cols = len(which)
        f, bk, layer_bytes, layer_mem, e = (got[5 * n + j][:, :cols] for j in range(5))
        nbytes[:, which] += layer_bytes
        memory[:, which] += layer_mem
        stages_f[which, layer], stages_b[which, layer], stages_e[which, layer] = f.T, bk.T, e.T
    entries: dict[tuple[int, bool], list[int]] = {}
    for i, (start, _, _) in enumerate(selections):
        entries.setdefault((start, shapes[start].input_grad), []).append(i)
    for (start, grad), which in entries.items():
        entry = _hybrid_entry(start, grad)
        grid, cols = columns(which, entry), len(which)
        t_f, t_b, fetched, held = (run(e, grid, cols) for e in entry)
        memory[:, which] += held
        if start > 0:
            nbytes[:, which] += fetched
            stages_f[which, start] = t_f.T + stages_f[which, start]
            stages_b[which, start] = stages_b[which, start] + t_b.T
            stages_e[which, start] = t_f.T + stages_e[which, start]
    out = []
    for i, (start, end, _) in enumerate(selections):
        stage_times = np.concatenate([stages_f[i, start:end], stages_b[i, start:end][::-1], stages_e[i, start:end]])
        out.append(_value(f"hybrid[{start}:{end}]", stage_times, nbytes[:, i].copy(), memory[:, i].copy()))
    return out


class HybridValues(dict):
    """`hybrid_values`' table of symbol values (a dict like any other, read-only: `dense` is what its per-layer
    entries are columns of), with the arrays it was read from: `dense` = (start, [workers, layers] arrays of CR,
    CS, RV, RE), for `hybrid_values_of` to read a layer's values of many selections at once."""

    dense: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _dense_columns(selections: Sequence[tuple[int, int, Mapping[Symbol, Any]]], p: int,
                   top: int) -> tuple[np.ndarray, dict[str, tuple[int, slice, slice, int]]] | None:
    """`hybrid_values_of`'s per-layer symbols of every selection: ([kind, selection, worker, layer] array, {symbol
    name: (kind, all selections, layer)}), or None unless every selection is a `HybridValues` of its span."""
    arrays = []
    for start, end, extra in selections:
        dense = getattr(extra, "dense", None)
        if dense is None or dense[0] != start or any(a.shape != (p, end - start) for a in dense[1:]):
            return None
        arrays.append(dense[1:])
    out = np.full((4, len(selections), p, top), np.nan)
    for i, ((start, end, _), kinds) in enumerate(zip(selections, arrays)):
        for k, a in enumerate(kinds):
            out[k, i, :, start:end] = a
    names = {sym(layer).name: (k, slice(None), slice(None), layer)
             for layer in range(top) for k, sym in enumerate((comm_rows, comm_sent, recompute_rows, recompute_edges))}
    return out, names


def hybrid_values(start: int, comm_received: np.ndarray, comm_sent_rows: np.ndarray, rec_rows: np.ndarray,
                  rec_edges: np.ndarray, replicated: np.ndarray) -> dict[Symbol, np.ndarray]:
    """Symbol values of a Hybrid selection for `hybrid(start, ...)`: arrays [workers, layers] (layer
    m of the segment is model layer start+m) and the replicated input rows [workers]. A `HybridValues`."""
    out: dict[Symbol, np.ndarray] = HybridValues({RX: np.asarray(replicated, np.float64)})
    received, sent, rows, edges = (np.asarray(a, np.float64) for a in (comm_received, comm_sent_rows, rec_rows,
                                                                         rec_edges))
    out.dense = (start, received, sent, rows, edges)
    for m in range(np.shape(comm_received)[1]):
        layer = start + m
        out[comm_rows(layer)] = received[:, m]
        out[comm_sent(layer)] = sent[:, m]
        out[recompute_rows(layer)] = rows[:, m]
        out[recompute_edges(layer)] = edges[:, m]
    return out


def hybrid_unit_costs(inputs: CostInputs, start: int, shapes: Sequence[LayerShape],
                      fetch_input: bool | None = None, cache: dict[Any, Any] | None = None) -> dict[str, Any]:
    """NeutronStar's unit costs for the greedy, from the same formulas as the strategies above.

    Returns t_v, t_e, t_c per layer of the segment (seconds per recomputed
    row, per recomputed edge, per communicated row; forward plus backward),
    t_x (seconds per replicated input row), row_bytes per level (bytes of one
    cached row of h^start .. h^end) and edge_bytes, plus own_time [workers,
    layers]: each worker's work on its own rows. When the profile carries
    measured T_v, T_e, T_c they enter through its effective rates. `cache`: a dict kept across the segments of
    one model and inputs (a layer's unit costs are the same in every span holding it).

    Deviation from the paper (its Eq. 1 sums the recomputed layers k >= 1 only: a replicated row of h^0 is
    fetched once and costs nothing per epoch): t_x is the first layer's work per input row, what `hybrid`'s
    formula charges on RX, the rows of h^start replicated: the ops before its aggregation (side "in"; at layer
    0 the dense layer before it, GCNII's dropout of x and its 512 -> 32 map, which the paper's models do not
    have) and a dense map that runs before the aggregation; plus, for a segment after layer 0, the fetch of the
    row and of its gradient. That work is taken off the first layer's t_v, which priced it per recomputed row
    (RV), where the formula does not. With t_x = 0 at layer 0 the greedy replicated every input row its
    dependencies reach as if free (gcnii/sbm x4: all ~6,900 per worker, 116-138 ms an epoch that the formula
    prices and the run measured, session 25).
    """
    values = inputs.table
    cache = {} if cache is None else cache

    def of(layer: int, shape: LayerShape) -> tuple[float, float, float, np.ndarray, float, float]:
        if (layer, shape) not in cache:
            per_vertex, per_edge, per_row, own_rows, fetch_row, row = _unit_formulas(layer, shape)
            cache[layer, shape] = (*(scalar(e) for e in (per_vertex, per_edge, per_row)),
                                   compile_expr(own_rows)(values, inputs.workers), scalar(fetch_row), scalar(row))
        return cache[layer, shape]

    def scalar(expr: sympy.Expr) -> float:
        return float(compile_expr(expr)(values, inputs.workers)[0])

    layers = [of(start + m, shape) for m, shape in enumerate(shapes)]
    fetch = fetch_input if fetch_input is not None else start > 0
    if ("input", start, shapes[0]) not in cache:
        cache["input", start, shapes[0]] = scalar(_input_row_work(start, shapes[0]))
    on_input = cache["input", start, shapes[0]]
    t_x = (layers[0][4] if fetch else 0.0) + on_input
    t_v = np.array([u[0] for u in layers])
    t_v[0] -= on_input  # its share on the input rows is t_x's (the docstring's deviation)
    row_bytes = [scalar(_input_row(start))] + [u[5] for u in layers]
    edge_bytes = float(inputs.index_bytes + inputs.bytes_per_element)
    return {"t_v": t_v, "t_e": np.array([u[1] for u in layers]),
            "t_c": np.array([u[2] for u in layers]), "t_x": t_x, "row_bytes": np.array(row_bytes),
            "edge_bytes": edge_bytes, "own_time": np.stack([u[3] for u in layers], axis=1)}


@functools.lru_cache(maxsize=4096)
def _input_row(layer: int) -> sympy.Expr:
    """Bytes of one row of h^layer."""
    return d(layer) * b


@functools.lru_cache(maxsize=4096)
def _input_row_work(layer: int, shape: LayerShape) -> sympy.Expr:
    """Seconds of a segment's first layer per row of its input (forward plus backward), the part of
    `_unit_formulas`' per recomputed row that `hybrid` charges on the replicated input rows RX instead: the ops
    before the aggregation (with the dense layer before layer 0) and a dense map that runs first."""
    kernels = (compute_forward(layer, shape, 1, 0) + compute_backward(layer, shape, 1, 0)
               if shape.gemm_first else ZERO)
    return kernels + row_ops(layer, 1, 0, "f") + row_ops(layer, 1, 0, "b")


@functools.lru_cache(maxsize=4096)
def _unit_formulas(layer: int, shape: LayerShape) -> tuple[sympy.Expr, ...]:
    """`hybrid_unit_costs`' formulas for one layer: seconds per recomputed row, per recomputed edge and
    per communicated row, the worker's time on its own rows, seconds per replicated row of h^layer when a
    segment starts here, and bytes of one row of h^{layer+1} (cached: every span shares them)."""
    # a recomputed row: its dense map and its other ops, in and out (its input row and itself)
    return (compute_forward(layer, shape, 1, 0) + compute_backward(layer, shape, 1, 0)
            + row_ops(layer, 1, 1, "f") + row_ops(layer, 1, 1, "b"),
            compute_forward(layer, shape, 0, 1) + compute_backward(layer, shape, 0, 1)
            + edge_ops(layer, 1, "f") + edge_ops(layer, 1, "b"),
            shape.width(layer) * b / bw * (2 if shape.exchange_grad else 1),
            compute_forward(layer, shape, V, E) + compute_backward(layer, shape, V, E)
            + layer_ops(layer, V, V, E, "f") + layer_ops(layer, V, V, E, "b"),
            d(layer) * b / bw * (2 if shape.input_grad else 1),
            shape.out_width(layer) * b)
