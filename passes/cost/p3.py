"""P3's push-pull: the first layer model-parallel on a feature slice, its partial sums pulled to the owners."""
from __future__ import annotations

from gnnc.passes.cost.collectives import all_reduce_time, reduce_scatter_time, all_gather_time
from gnnc.passes.cost.compute import aggregation_time, dense_backward_time, dense_map_time, layer_ops
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import P, N, E_tot, b, b_idx, V, E, d, heads, LayerShape, Cost, ZERO


@cost_formula("pushpull")
def pushpull(layer: int, shape: LayerShape, structure_push: bool = False) -> Cost:
    """P3's push-pull (section 3.2): model-parallel layer on a feature slice, then pull partials.

    Worker i holds every vertex's slice of d_l/P input features. The layer's
    structure is pushed to every worker (`structure_push`: each owner sends
    its E_i in-edges to P-1 workers), or is already there when it is
    replicated, as in full-graph training where it is loaded once. Each
    worker computes the partial aggregation and partial first dense map of
    every vertex from its slice (both linear in it), then the sync (pull)
    sums the partials at each vertex's owner: a reduce-scatter of the N x
    d_out partials (worker i sends (N - V_i) rows). Bias and non-linearities
    follow the sync. Backward pushes the output gradient to every worker (an
    all-gather: worker i sends its V_i rows to P-1 workers) and each
    computes its slice of dW locally and updates those rows alone: no
    all-reduce for this layer's weights (the planner prices pushpull with
    them left out of `grad_allreduce`, as the runtime runs it). GAT is legal only with the
    attention scores synced before the softmax: an all-reduce of 2 scores
    per vertex and head.

    Beyond the seed: P3 pipelines minibatches (2F2B); this is the
    full-graph, unpipelined step, with alpha-beta collectives. The layer's
    other ops (gnnc.passes.cost.ops) run before the pull on every vertex's
    slice (N/P full rows' worth: the input features' dropout), on every edge,
    and after it on the owned rows.
    """
    f = d(layer) / P
    out_w = shape.out_width(layer)
    w = out_w if shape.gemm_first else f
    gemm = dense_map_time(layer, shape, N, f)
    spmm = aggregation_time(layer, shape, E_tot, w)
    scores = all_reduce_time(2 * N * heads(layer) * b) if shape.attention else ZERO
    push = all_gather_time((E_tot - E) * b_idx) if structure_push else ZERO
    pull = reduce_scatter_time((N - V) * out_w * b)
    fwd = push + gemm + scores + spmm + pull + layer_ops(layer, N / P, V, E_tot, "f")
    grad_push = all_gather_time((N - V) * out_w * b)
    bwd = (grad_push + dense_backward_time(layer, shape, N, f)
           + (aggregation_time(layer, shape, E_tot, w, "b") if shape.exchange_grad else ZERO)
           + (scores if shape.attention else ZERO) + layer_ops(layer, N / P, V, E_tot, "b"))
    nbytes = (N - V) * out_w * b + V * out_w * (P - 1) * b
    if structure_push:
        nbytes += E * (P - 1) * b_idx
    if shape.attention:
        nbytes += 2 * (2 * (P - 1) / P) * 2 * N * heads(layer) * b  # scores all-reduced forward and backward
    memory = b * (N * f + N * w + N * out_w + V * out_w) + E_tot * (b_idx + b)
    return Cost(f"pushpull[{layer}]", (fwd, bwd), nbytes, memory)
