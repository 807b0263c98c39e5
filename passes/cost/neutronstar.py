"""NeutronStar's strategies: DepComm per layer, DepCache and Hybrid over segments, and the greedy's unit costs.

Why this module exists: the three share the halo exchange and the
neighbourhood replication terms, and Hybrid with nothing cached is DepComm
layer by layer; `hybrid_values` and `hybrid_unit_costs` bridge the formulas
to the Hybrid greedy (gnnc.passes.planner.hybrid_greedy). G3's peer-to-peer push is
DepComm.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.passes.cost.collectives import all_to_all_time, all_gather_time, any_moved
from gnnc.passes.cost.compute import (aggregation_time, dense_map_time, compute_forward, compute_backward,
                                      layer_memory, call_ops, copy_time, edge_ops, layer_ops, row_ops)
from gnnc.passes.cost.evaluation import compile_expr, table
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import (Max, P, b, bw, V, E, B, S, E_r, E_in, d, hop_vertices, hop_edges,
                                      comm_rows, comm_sent, recompute_rows, recompute_edges, RX, LayerShape,
                                      CostInputs, Cost, ZERO)


@cost_formula("depcomm")
def depcomm(layer: int, shape: LayerShape, overlap: bool = True, bins: int = 1) -> Cost:
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
    overlaps the exchange (max, not sum), as NeutronStar computes
    while chunks are in flight; without it every edge waits. `bins` (G3):
    with k > 1 bins, the bins whose rows have no remote in-neighbour (Ein_i
    edges) run while the halo is in flight (eager computation), and backward
    recomputes every bin's forward before its own backward.
    """
    w = shape.width(layer)
    xw = sympy.Add(*shape.exchanged_widths(layer))  # with attention, its scores' exchange too
    gemm_rows = V
    exch = sympy.Add(*(all_to_all_time(S * x * b, B * x * b) for x in shape.exchanged_widths(layer)))
    gemm = dense_map_time(layer, shape, gemm_rows)

    def edge_work(edges: sympy.Expr, phase: str) -> sympy.Expr:
        return aggregation_time(layer, shape, edges, w, phase) + edge_ops(layer, edges, phase)

    if bins > 1:
        held, rest = edge_work(E_in, "f"), edge_work(E - E_in, "f")
        window = Max(exch, held) + rest if overlap else exch + held + rest
    elif overlap:
        window = Max(exch, edge_work(E - E_r, "f")) + edge_work(E_r, "f")
    else:
        window = exch + edge_work(E, "f")
    fwd = gemm + row_ops(layer, V, V, "f") + call_ops(layer, "f") + copy_time((S + B) * xw, "f") + window
    bwd_dense = compute_backward(layer, shape, gemm_rows, ZERO) + row_ops(layer, V, V, "b") + call_ops(layer, "b")
    nbytes = S * xw * b
    if shape.exchange_grad:
        bwd = bwd_dense + copy_time((S + B) * xw, "b")
        if overlap:
            bwd += Max(exch, edge_work(E - E_r, "b")) + edge_work(E_r, "b")
        else:
            bwd += exch + edge_work(E, "b")
        nbytes += B * xw * b
    else:
        bwd = bwd_dense + edge_ops(layer, E, "b")
    if bins > 1:
        bwd += _bin_recompute(layer, shape, V, E)
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
             bins: int = 1) -> Cost:
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
    """
    k = end - start
    if k < 1 or len(shapes) != k:
        raise ValueError(f"depcache[{start}:{end}] needs {max(k, 0)} layer shapes, got {len(shapes)}")
    fwd_terms, bwd_terms, memory_terms = [], [], []  # summed once: sympy re-sorts a sum at every +=
    for m, shape in enumerate(shapes):
        layer = start + m
        in_rows, out_rows, edges = hop_vertices(k - m), hop_vertices(k - 1 - m), hop_edges(k - 1 - m)
        gemm_rows = in_rows if shape.gemm_first else out_rows
        fwd_terms.append(compute_forward(layer, shape, gemm_rows, edges)
                         + layer_ops(layer, in_rows, out_rows, edges, "f"))
        bwd_terms.append(compute_backward(layer, shape, gemm_rows, edges)
                         + layer_ops(layer, in_rows, out_rows, edges, "b"))
        if bins > 1:
            bwd_terms.append(_bin_recompute(layer, shape, out_rows, edges))
        memory_terms.append(layer_memory(layer, shape, in_rows, ZERO, out_rows, edges))
    fwd, bwd, memory = sympy.Add(*fwd_terms), sympy.Add(*bwd_terms), sympy.Add(*memory_terms)
    nbytes = ZERO
    if fetch_input if fetch_input is not None else start > 0:
        t_f, t_b, nbytes = _fetch_rows(hop_vertices(k) - V, d(start), shapes[0].input_grad)
        fwd, bwd = t_f + fwd, bwd + t_b
    return Cost(f"depcache[{start}:{end}]", (fwd, bwd), nbytes, memory)


@cost_formula("hybrid")
def hybrid(start: int, end: int, shapes: Sequence[LayerShape], fetch_input: bool | None = None,
           overlap: bool = True, bins: int = 1) -> Cost:
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
    The schedule's `overlap` and `bins` as for `depcomm` (without overlap
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
        fwd, bwd, nbytes, memory = _hybrid_layer(start + m, shape, m == 0, overlap, bins)
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
                  bins: int = 1) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """One layer of a Hybrid segment: forward and backward stage, bytes, memory (see `hybrid`).

    They depend on the segment only through whether the layer is its first, so a
    deep model's many spans share them (cached: the planner prices every span).
    """
    w = shape.width(layer)
    cr, cs, rv, re = comm_rows(layer), comm_sent(layer), recompute_rows(layer), recompute_edges(layer)
    # a dense map that runs before the aggregation runs on the recomputed rows' inputs: the rows
    # recomputed one layer down, or the replicated input rows at the segment's first layer
    rg = (RX if first else recompute_rows(layer - 1)) if shape.gemm_first else rv
    xw = sympy.Add(*shape.exchanged_widths(layer))  # with attention, its scores' exchange too
    # a worker that moves no row at this layer starts no message (its ring posts nothing)
    exch = sympy.Add(*(all_to_all_time(cs * x * b, cr * x * b, (P - 1) * any_moved(cs + cr))
                       for x in shape.exchanged_widths(layer)))

    def own_edges(edges: sympy.Expr, phase: str) -> sympy.Expr:
        return aggregation_time(layer, shape, edges, w, phase) + edge_ops(layer, edges, phase)

    def recompute(phase: str) -> sympy.Expr:  # the cached dependencies' rows: kernels and other ops
        kernels = compute_forward(layer, shape, rg, re) if phase == "f" else compute_backward(layer, shape, rg, re)
        return kernels + row_ops(layer, rg, rv, phase) + edge_ops(layer, re, phase)

    def window(exchange: sympy.Expr, local: sympy.Expr) -> sympy.Expr:
        return Max(exchange, local) if overlap else exchange + local

    fwd = (dense_map_time(layer, shape, V) + row_ops(layer, V, V, "f")
           + call_ops(layer, "f") + copy_time((cs + cr) * xw, "f")
           + window(exch, own_edges(E - E_r, "f") + recompute("f")) + own_edges(E_r, "f"))
    bwd = compute_backward(layer, shape, V, ZERO) + row_ops(layer, V, V, "b") + call_ops(layer, "b")
    nbytes = cs * xw * b
    if shape.exchange_grad:
        bwd += (copy_time((cs + cr) * xw, "b") + window(exch, own_edges(E - E_r, "b") + recompute("b"))
                + own_edges(E_r, "b"))
        nbytes += cr * xw * b
    else:
        bwd += recompute("b") + edge_ops(layer, E, "b")
    if bins > 1:
        bwd += _bin_recompute(layer, shape, V + rv, E + re)
    # the recomputed rows come with their own inputs and structure
    memory = layer_memory(layer, shape, V, cr, V, E) + layer_memory(layer, shape, ZERO, ZERO, rv, re)
    return fwd, bwd, nbytes, memory


def hybrid_values(start: int, comm_received: np.ndarray, comm_sent_rows: np.ndarray, rec_rows: np.ndarray,
                  rec_edges: np.ndarray, replicated: np.ndarray) -> dict[Symbol, np.ndarray]:
    """Symbol values of a Hybrid selection for `hybrid(start, ...)`: arrays [workers, layers] (layer
    m of the segment is model layer start+m) and the replicated input rows [workers]."""
    out: dict[Symbol, np.ndarray] = {RX: np.asarray(replicated, np.float64)}
    for m in range(np.shape(comm_received)[1]):
        layer = start + m
        out[comm_rows(layer)] = np.asarray(comm_received, np.float64)[:, m]
        out[comm_sent(layer)] = np.asarray(comm_sent_rows, np.float64)[:, m]
        out[recompute_rows(layer)] = np.asarray(rec_rows, np.float64)[:, m]
        out[recompute_edges(layer)] = np.asarray(rec_edges, np.float64)[:, m]
    return out


def hybrid_unit_costs(inputs: CostInputs, start: int, shapes: Sequence[LayerShape],
                      fetch_input: bool | None = None) -> dict[str, Any]:
    """NeutronStar's unit costs for the greedy, from the same formulas as the strategies above.

    Returns t_v, t_e, t_c per layer of the segment (seconds per recomputed
    row, per recomputed edge, per communicated row; forward plus backward),
    t_x (seconds per replicated input row: 0 at layer 0, whose input is
    static), row_bytes per level (bytes of one cached row of h^start ..
    h^end) and edge_bytes, plus own_time [workers, layers]: each worker's
    work on its own rows. When the profile carries measured T_v, T_e, T_c
    they enter through its effective rates.
    """
    values = table(inputs, None)

    def scalar(expr: sympy.Expr) -> float:
        return float(compile_expr(expr)(values, inputs.workers)[0])

    k = len(shapes)
    t_v, t_e, t_c, own = [], [], [], []
    for m, shape in enumerate(shapes):
        per_vertex, per_edge, per_row, own_rows = _unit_formulas(start + m, shape)
        t_v.append(scalar(per_vertex))
        t_e.append(scalar(per_edge))
        t_c.append(scalar(per_row))
        own.append(compile_expr(own_rows)(values, inputs.workers))
    fetch = fetch_input if fetch_input is not None else start > 0
    t_x = scalar(d(start) * b / bw * (2 if shapes[0].input_grad else 1)) if fetch else 0.0
    row_bytes = [scalar(d(start) * b)] + [scalar(shapes[m].out_width(start + m) * b) for m in range(k)]
    edge_bytes = float(inputs.index_bytes + inputs.bytes_per_element)
    return {"t_v": np.array(t_v), "t_e": np.array(t_e), "t_c": np.array(t_c), "t_x": t_x,
            "row_bytes": np.array(row_bytes), "edge_bytes": edge_bytes, "own_time": np.stack(own, axis=1)}


@functools.lru_cache(maxsize=4096)
def _unit_formulas(layer: int, shape: LayerShape) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """`hybrid_unit_costs`' formulas for one layer: seconds per recomputed row, per recomputed edge and
    per communicated row, and the worker's time on its own rows (cached: every span shares them)."""
    # a recomputed row: its dense map and its other ops, in and out (its input row and itself)
    return (compute_forward(layer, shape, 1, 0) + compute_backward(layer, shape, 1, 0)
            + row_ops(layer, 1, 1, "f") + row_ops(layer, 1, 1, "b"),
            compute_forward(layer, shape, 0, 1) + compute_backward(layer, shape, 0, 1)
            + edge_ops(layer, 1, "f") + edge_ops(layer, 1, "b"),
            shape.width(layer) * b / bw * (2 if shape.exchange_grad else 1),
            compute_forward(layer, shape, V, E) + compute_backward(layer, shape, V, E)
            + layer_ops(layer, V, V, E, "f") + layer_ops(layer, V, V, E, "b"))
