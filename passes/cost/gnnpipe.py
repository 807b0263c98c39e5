"""GNNPipe's pipeline: stages of consecutive layers over the whole graph, K chunks flowing through them.

Why this module exists: GNNPipe (the seed, section 3.1) argues from traffic:
graph parallelism moves 2·b·Σ_l H_l·Σ_i |B_i| bytes per epoch (every layer
fetches the remote in-neighbours' rows, and sends their gradients back),
layer-level model parallelism 2·b·c·(S-1)·N·H (each of the S-1 stage
boundaries carries every vertex's c boundary values of width H, forward and
back). Both are here as named formulas (`graph_parallel_traffic`,
`pipeline_traffic`; tests/test_gnnpipe_cost.py reproduces the seed's Table 4
with them), and `pipeline` prices a whole pipelined epoch for the planner:
the traffic above, GPipe's bubble (K+S-1)/K on the slowest stage, the
history refresh every alpha epochs, and each stage's memory (the whole
graph's structure, the activations of all K chunks, the history).

Symbols of a pipeline cost beside the common ones (values from
`gnnc.passes.planner.pipeline`, which balances the stages and cuts the chunks):
W_s (elements per row entering stage s: its boundary values side by side),
DF_s and DB_s (seconds of stage s's dense layers, forward and backward, on
one member's rows), bw_pipe (bytes/s of the slowest link a stage boundary
crosses: point to point, one sender), bw_group (bytes/s a member moves to its
group peers), GR and GS (rows the busiest member receives and sends in its
group exchanges per layer and epoch), GT (rows a whole group receives per
layer and epoch), GL (rows a whole group hands to its members' histories
as chunks pass, per layer and epoch) and GLM (the busiest member's share of
those, sent or received), RR (rows the busiest member fetches per layer of
a full pass), HR (history rows read per layer and epoch by a whole group).
"""
from __future__ import annotations

from collections.abc import Sequence

import sympy
from sympy import Symbol

from gnnc.passes.cost.compute import (call_ops, compute_backward, compute_forward, edge_ops, gemm_time, layer_memory,
                                      row_ops)
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import Max, N, E_tot, b, alpha, LayerShape, Cost, ZERO

bw_pipe = Symbol("bw_pipe", positive=True)
bw_group = Symbol("bw_group", positive=True)
GR = Symbol("GR", nonnegative=True)
GS = Symbol("GS", nonnegative=True)
GT = Symbol("GT", nonnegative=True)
GL = Symbol("GL", nonnegative=True)
GLM = Symbol("GLM", nonnegative=True)
RR = Symbol("RR", nonnegative=True)
HR = Symbol("HR", nonnegative=True)


def boundary_width(stage: int) -> Symbol:
    """W_s: elements per row stage s receives from stage s-1."""
    return Symbol(f"W_{stage}", nonnegative=True)


def dense_forward(stage: int) -> Symbol:
    """DF_s: seconds of stage s's dense layers in forward, on one member's rows (every chunk)."""
    return Symbol(f"DF_{stage}", nonnegative=True)


def dense_backward(stage: int) -> Symbol:
    """DB_s: the same in backward."""
    return Symbol(f"DB_{stage}", nonnegative=True)


def graph_parallel_traffic(widths: Sequence[sympy.Expr], remote_rows: sympy.Expr) -> sympy.Expr:
    """GNNPipe section 3.1.1: bytes per epoch of graph parallelism, 2·b·Σ_l H_l·Σ_i |B_i|.

    Every layer l fetches the H_l-wide rows of each part's remote in-neighbours B_i (Σ_i |B_i|
    rows) and sends their gradients back. gnnc's `depcomm` counts the same per layer, with the
    width the IR exchanges and no backward for a layer that reads the input features.
    """
    return 2 * b * sympy.Add(*widths) * remote_rows


def pipeline_traffic(stages: sympy.Expr, row_width: sympy.Expr) -> sympy.Expr:
    """GNNPipe section 3.1.2: bytes per epoch of layer-level model parallelism, 2·b·(S-1)·N·(c·H).

    Each of the S-1 stage boundaries carries every vertex's boundary row (c values of width H:
    GCN and SAGE send h, c = 1; GCNII also x0, c = 2) forward and its gradient back.
    """
    return 2 * b * (stages - 1) * N * row_width


def dense_time(rows: sympy.Expr, d_in: int, d_out: int, input_grad: bool) -> tuple[sympy.Expr, sympy.Expr]:
    """Forward and backward seconds of one dense map `rows` x d_in -> d_out (backward: dW, and dX if needed)."""
    t = gemm_time(rows, d_in, d_out)
    return t, t * (2 if input_grad else 1)


def bubble(chunks: int, stages: int) -> sympy.Expr:
    """GPipe's stretch of a pipelined pass: K chunks through S stages take (K+S-1)/K of the slowest stage."""
    return sympy.Rational(chunks + stages - 1, chunks)


@cost_formula("pipeline")
def pipeline(start: int, end: int, shapes: Sequence[LayerShape], split: Sequence[tuple[int, int]] = (),
             chunks: int = 0, groups: int = 1, history_every: int = 23,
             pipe_grad: Sequence[bool] = (), stage_params: Sequence[float] = ()) -> Cost:
    """A GNNPipe epoch: stages `split` (graph layers [a, b) each; default one per layer), K = `chunks` chunks
    (default GNNPipe's 4 per stage), G = `groups`.

    Per stage s and epoch, one member computes its layers on N/G rows and E_tot/G edges (the
    `local` formulas of its graph layers, plus DF_s/DB_s for its dense layers) and exchanges, per
    chunk and history layer, its chunk's rows with its group peers (GS sent, GR received,
    alpha-beta over bw_group); it sends its N/G rows of W_{s+1} elements to the next stage
    (over bw_pipe), which overlaps the next chunk's compute (the step is the longer of the two).
    GPipe: every chunk's forward, then every chunk's backward, each pass taking (K+S-1) steps
    of the slowest stage: (K+S-1)/K times its epoch (the bubble). Every `history_every` epochs
    a full pass (layer by layer, no pipelining, no gradient) refreshes the history: its time,
    divided by alpha, is a third stage of the cost.

    Bytes: `pipeline_traffic` over the boundaries (a boundary without gradient, `pipe_grad`
    false, sends forward only), plus the group exchanges (GT rows per history layer and group,
    and their gradients back, and the GL rows handed to the peers' histories), plus each group's all-reduce of its stage's `stage_params` weights
    (2·(G-1)·n_s·b, in the last stage of the cost: the groups reduce side by side; no all-reduce at
    all with one worker per stage, whose weights nobody shares): the job's total, shown per worker
    as its average (divided by P = S·G). Memory of a member: per graph
    layer, `layer_memory` on its N/G rows (aggregated over its rows, its peers' rows and the
    history rows), the history itself (N rows of the value read through the history), and the
    N/G received boundary rows of every chunk, kept for backward (GPipe); the largest stage's.
    """
    split = list(split) or [(layer, layer + 1) for layer in range(start, end)]  # default: one layer per stage
    chunks = chunks or 4 * len(split)
    if groups < 1:
        raise ValueError(f"pipeline cost: {groups} workers per stage")
    if split[0][0] != start or split[-1][1] != end or len(shapes) != end - start:
        raise ValueError(f"pipeline[{start}:{end}]: split {list(split)} does not cover the segment")
    S, K, G = len(split), chunks, groups
    rows, edges = N / G, E_tot / G
    grads = list(pipe_grad) or [True] * (S - 1)
    steps_f, steps_b, refresh, memory = [], [], [], []
    group_bytes = ZERO
    for s, (a, z) in enumerate(split):
        fwd, bwd, exch_f, exch_b, refresh_x, mem = [dense_forward(s)], [dense_backward(s)], [], [], [], []
        for layer in range(a, z):
            shape = shapes[layer - start]
            w = shape.width(layer)
            # the layer's other ops (gnnc.passes.cost.ops) on the member's rows, dispatched once per chunk
            # (the dense layers' maps are DF_s and DB_s: row_ops leaves them out here)
            fwd.append(compute_forward(layer, shape, rows, edges) + row_ops(layer, rows, rows, "f", dense_maps=False)
                       + edge_ops(layer, edges, "f") + K * call_ops(layer, "f"))
            bwd.append(compute_backward(layer, shape, rows, edges) + row_ops(layer, rows, rows, "b", dense_maps=False)
                       + edge_ops(layer, edges, "b") + K * call_ops(layer, "b"))
            mem.append(layer_memory(layer, shape, rows, GR + HR / G, rows, edges) + b * N * w)
            if G > 1:
                exch = Max(GS, GR) * w * b / bw_group + K * (G - 1) * alpha
                exch_f.append(exch + GLM * w * b / bw_group + K * (G - 1) * alpha)
                refresh_x.append(RR * w * b / bw_group + (G - 1) * alpha)
                if shape.exchange_grad:
                    exch_b.append(exch)
                group_bytes += GT * w * b * (2 if shape.exchange_grad else 1) + GL * w * b
        send_f = rows * boundary_width(s + 1) * b / bw_pipe + K * alpha if s < S - 1 else ZERO
        send_b = rows * boundary_width(s) * b / bw_pipe + K * alpha if s > 0 and grads[s - 1] else ZERO
        compute_f, compute_b = sympy.Add(*fwd) + sympy.Add(*exch_f), sympy.Add(*bwd) + sympy.Add(*exch_b)
        steps_f.append(Max(compute_f, send_f) / K)
        steps_b.append(Max(compute_b, send_b) / K)
        refresh.append(sympy.Add(*fwd) + sympy.Add(*refresh_x) + send_f)
        memory.append(sympy.Add(*mem) + (rows * boundary_width(s) * b if s > 0 else ZERO))
    passes = K + S - 1
    time_f = passes * Max(*steps_f) if S > 1 else steps_f[0] * K
    time_b = passes * Max(*steps_b) if S > 1 else steps_b[0] * K
    pipe_bytes = sympy.Add(*[2 * b * N * boundary_width(s) if grads[s - 1] else b * N * boundary_width(s)
                             for s in range(1, S)])
    reduce_t, reduce_bytes = ZERO, ZERO
    if G > 1 and stage_params:
        reduce_t = Max(*[2 * sympy.Rational(G - 1, G) * n * b / bw_group + 2 * (G - 1) * alpha
                         for n in stage_params])
        reduce_bytes = sympy.Add(*[2 * (G - 1) * n * b for n in stage_params])
    nbytes = (pipe_bytes + group_bytes + reduce_bytes) / (S * G)  # each layer's group exchanges once
    return Cost(f"pipeline[{start}:{end}] S={S} G={G} K={K}",
                (time_f, time_b, sympy.Add(*refresh) / history_every, reduce_t), nbytes,
                Max(*memory) if S > 1 else memory[0])
