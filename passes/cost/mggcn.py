"""MG-GCN's 1D SpMM: P broadcast stages of row blocks, overlapped with the multiply of the previous one."""
from __future__ import annotations

import sympy

from gnnc.passes.cost.collectives import broadcast_time
from gnnc.passes.cost.compute import (aggregation_time, call_ops, compute_backward, dense_map_time, edge_ops,
                                      per_epoch, row_ops)
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import Max, P, N, V_max, b, b_idx, bw, alpha, V, E, d, LayerShape, Cost, ZERO


@cost_formula("bcast1d")
def bcast1d(layer: int, shape: LayerShape, staged: bool = True) -> Cost:
    """MG-GCN's 1D SpMM (section 5.1): P stages, stage j broadcasting row block H_j.

    Every worker multiplies its tile A_ij while the next block is broadcast
    (two streams): the layer takes the longer of the broadcast stream and the
    multiply stream, plus the first stage's broadcast, which nothing hides.
    GeMM runs before SpMM when d_out <= d_in (`shape.gemm_first`), so the
    broadcast rows are the narrower ones. The broadcasts deliver all N rows
    to every worker: sum_j V_j·w·b/bw plus ceil(log2 P) message starts per
    stage. Bytes: the root of stage i sends its V_i rows to P-1 workers;
    backward reduces each block's gradient to its root, so every other
    worker sends its V_j-row contribution.

    Beyond the seed: MG-GCN skips the first layer's backward SpMM and shares
    L+3 buffers, both relying on approximate weight gradients; gnnc keeps
    gradients exact, so the backward mirrors the forward.

    The schedule (gnnc.plan.schedule_attrs) prices in `staged`: stage j multiplies
    the block received from rank j while stage j+1 is in flight, so a worker
    holds two blocks (2·V_max rows) of the broadcast value, not N; without it
    every block is gathered first (N rows held) and the multiply waits for
    the last stage. The layer's other ops (gnnc.passes.cost.ops) run on its
    V_i rows; its edge ops beside the multiply, block by block.
    """
    w = shape.width(layer)
    widths = shape.exchanged_widths(layer)  # with attention, its scores are broadcast too
    xw = sympy.Add(*widths)
    stages = per_epoch(shape, sympy.Add(*(N * x * b / bw + P * sympy.ceiling(sympy.log(P, 2)) * alpha for x in widths)))
    first = per_epoch(shape, sympy.Add(*(broadcast_time(V_max * x * b) for x in widths)))
    rest = stages - first

    def window(phase: str) -> sympy.Expr:
        multiply = aggregation_time(layer, shape, E, w, phase) + edge_ops(layer, E, phase)
        return first + Max(rest, multiply) if staged else stages + multiply

    fwd = (dense_map_time(layer, shape, V) + row_ops(layer, V, V, "f")
           + call_ops(layer, "f") + window("f"))
    bwd = compute_backward(layer, shape, V, ZERO) + row_ops(layer, V, V, "b") + call_ops(layer, "b")
    nbytes = per_epoch(shape, V * xw * (P - 1) * b)
    if shape.exchange_grad:
        bwd += window("b")
        nbytes += (N - V) * xw * b
    else:
        bwd += edge_ops(layer, E, "b")
    held = 2 * V_max if staged else N
    memory = b * (V * d(layer) + held * w + V * shape.out_width(layer)) + E * (b_idx + b)
    return Cost(f"bcast1d[{layer}]", (fwd, bwd), nbytes, memory)
