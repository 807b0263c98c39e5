"""Layout transitions between segments: the cost of changing how a value's rows are split over workers.

Why this module exists: each strategy reads one layout at its entry and
leaves one at its exit (its descriptor's layout_in / layout_out, in
gnnc.plan.strategies); where consecutive segments disagree, the value
changes layout (all-to-all, all-gather, reduce-scatter) with its backward
dual. DepCache and Hybrid read vertex-partitioned rows at their entry: their
neighbourhood replication is part of their own cost.
"""
from __future__ import annotations

import sympy

from gnnc.passes.cost.collectives import all_to_all_time, reduce_scatter_time, all_gather_time
from gnnc.passes.cost.epoch import with_evaluation
from gnnc.passes.cost.symbols import P, N, b, V, d, Cost, ZERO, zero_cost
from gnnc.plan.strategies import LAYOUTS, STRATEGIES


def transition(src: str, dst: str, width: sympy.Expr, needs_grad: bool = True) -> Cost:
    """Change the layout of an N x width value between segments, with its backward dual.

    vertex -> feature: all-to-all; worker i sends its V_i rows' other slices
    (V_i·(w - w/P)) and receives every other row's slice ((N - V_i)·w/P);
    feature -> vertex is the mirror (gnnc.runtime.comm.vertex_to_feature).
    vertex -> replicated: all-gather (send V_i·w to P-1 workers); backward a
    reduce-scatter of the gradient. replicated -> vertex: keep the owned rows,
    free forward; backward all-gathers the row gradients so every replica gets
    the whole gradient. feature <-> replicated: the same along the feature dim.
    Slices are taken as w/P wide (the runtime's slices differ by at most one).
    """
    if src not in LAYOUTS or dst not in LAYOUTS:
        raise ValueError(f"layouts are {LAYOUTS}; got {src!r} -> {dst!r}")
    name = f"{src}->{dst}"
    if src == dst:
        return zero_cost(name)
    w = width
    if {src, dst} == {"vertex", "feature"}:
        mine, theirs = V * (w - w / P) * b, (N - V) * (w / P) * b  # to_feature: send mine, receive theirs
        send_f, recv_f = (mine, theirs) if dst == "feature" else (theirs, mine)
        t = all_to_all_time(send_f, recv_f)
        stages = (t, t if needs_grad else ZERO)
        nbytes = send_f + (recv_f if needs_grad else ZERO)
        return Cost(name, stages, nbytes, (N * w / P + V * w) * b)
    if {src, dst} == {"vertex", "replicated"}:
        gather_t, gather_b = all_gather_time((N - V) * w * b), V * w * (P - 1) * b
        scatter_t, scatter_b = reduce_scatter_time((N - V) * w * b), (N - V) * w * b
        if dst == "replicated":
            return Cost(name, (gather_t, scatter_t if needs_grad else ZERO),
                        gather_b + (scatter_b if needs_grad else ZERO), N * w * b)
        return Cost(name, (ZERO, gather_t if needs_grad else ZERO), gather_b if needs_grad else ZERO, ZERO)
    # feature <-> replicated
    gather_t, gather_b = all_gather_time(N * (w - w / P) * b), N * (w / P) * (P - 1) * b
    scatter_t, scatter_b = reduce_scatter_time(N * (w - w / P) * b), N * (w - w / P) * b
    if dst == "replicated":
        return Cost(name, (gather_t, scatter_t if needs_grad else ZERO),
                    gather_b + (scatter_b if needs_grad else ZERO), N * w * b)
    return Cost(name, (ZERO, gather_t if needs_grad else ZERO), gather_b if needs_grad else ZERO, ZERO)


def boundary(prev: str | None, nxt: str | None, layer: int, needs_grad: bool = True) -> Cost:
    """The transition at the boundary before `layer` between two strategies (None: the model's input
    before the first segment, or its output after the last).

    The input features are static: the loader lays them out as the first
    segment wants (P3 loads feature slices), so entering costs nothing. The
    loss reads owned rows, which every multi-worker strategy leaves. The
    evaluation pass changes the layout again, forward (gnnc.passes.cost.epoch).
    """
    if prev is None or nxt is None:
        return zero_cost(f"{prev}->{nxt}")
    src = STRATEGIES[prev].layout_out
    dst = STRATEGIES[nxt].layout_in
    return with_evaluation(transition(src, dst, d(layer), needs_grad), layer, layer)
