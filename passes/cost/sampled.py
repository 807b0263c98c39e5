"""Sampled minibatch strategies: DistDGL's data-parallel `dp-sample` and P3's `pushpull` on the pushed block.

Why this module exists: with `--fanout` a step's work and traffic follow the
sampled blocks, not the partition's halo sets. The formulas below are
written in per-worker symbols summed over one epoch's minibatches, valued
by the seeded dry run of gnnc.passes.analysis.sampled_stats (`sampled_values`), so
their bytes equal what the run's counters measure for that epoch.
A worker's block counts are those of the seeds it owns:

  SV_l_i, SD_l_i, SE_l_i   sources, destinations and edges of layer l's blocks at worker i
  SVt_0, SEt_0, SDt_0      the first layer's, summed over workers (push-pull runs every worker's first block)
  SR_i, SS_i               first-block sources worker i pulls from others, and rows others pull from it
  SK_i, SKt                packed first-block entries worker i pushes (all workers: SKt)
  NB                       minibatches per epoch

dp-sample (DistDGL): the first layer's remote input rows are fetched (ids
sent, F-wide rows returned: SR_i b_idx + SS_i d_0 b bytes from worker i);
every layer then runs locally on the worker's blocks. Push-pull (P3 3.2):
the first block's structure goes to the P-1 other workers ((P-1) SK_i
b_idx), each worker runs every first block on its d_0/P feature columns,
sends the partial sums of the others' destinations to their owners
((SDt_0 - SD_0_i) w b, w the layer's output width) and, backward, pushes its
own destinations' gradient to every worker ((P-1) SD_0_i w b). P3's win is
d_0 SR against w (SDt_0 + (P-2) SD_0) plus the structure: large when F >> H.
Each layer's other ops (gnnc.passes.cost.ops) run on its blocks' rows and
edges, dispatched once per minibatch (NB calls).
Compute and communication add within a step; the 2F2B pipeline (approximate)
overlaps a step's exchanges with other minibatches' compute, priced here as
the max of the two per phase. The runtime (gnnc.runtime.minibatch's 2F2B)
posts the pull and the gradient push and waits for them a tick later, but
waits for the structure push at once (minibatch_dist's push_structure), so
the max over push + pull overstates what it hides by the push (issue 38
item 3). Alpha: one message start per peer per
exchange and minibatch.
"""
from __future__ import annotations

import numpy as np
import sympy
from sympy import Symbol

from gnnc.passes.cost.collectives import all_gather_time, all_to_all_time, reduce_scatter_time
from gnnc.passes.cost.compute import (aggregation_time, call_ops, compute_backward, compute_forward,
                                      dense_backward_time, dense_map_time, edge_ops, layer_memory, row_ops)
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import Max, P, alpha, b, b_idx, bw, d, LayerShape, Cost, ZERO

NB = Symbol("NB", positive=True)
SVt_0 = Symbol("SVt_0", nonnegative=True)
SEt_0 = Symbol("SEt_0", nonnegative=True)
SDt_0 = Symbol("SDt_0", nonnegative=True)
SR = Symbol("SR_i", nonnegative=True)
SS = Symbol("SS_i", nonnegative=True)
SK = Symbol("SK_i", nonnegative=True)
SKt = Symbol("SKt", nonnegative=True)


def sources(layer: int) -> Symbol:
    return Symbol(f"SV_{layer}_i", nonnegative=True)


def destinations(layer: int) -> Symbol:
    return Symbol(f"SD_{layer}_i", nonnegative=True)


def edges(layer: int) -> Symbol:
    return Symbol(f"SE_{layer}_i", nonnegative=True)


def sampled_values(stats) -> dict[Symbol, np.ndarray | float]:
    """The symbols above valued by a dry run (gnnc.passes.analysis.sampled_stats.SampledStats)."""
    f = np.float64
    out: dict[Symbol, np.ndarray | float] = {
        NB: float(stats.batches), SR: stats.pulled.astype(f), SS: stats.served.astype(f), SK: stats.packed.astype(f),
        SKt: float(stats.packed.sum()), SVt_0: float(stats.sources[:, 0].sum()),
        SEt_0: float(stats.edges[:, 0].sum()), SDt_0: float(stats.destinations[:, 0].sum())}
    for layer in range(stats.sources.shape[1]):
        out[sources(layer)] = stats.sources[:, layer].astype(f)
        out[destinations(layer)] = stats.destinations[:, layer].astype(f)
        out[edges(layer)] = stats.edges[:, layer].astype(f)
    return out


def _rows(layer: int, shape: LayerShape) -> sympy.Expr:
    """Rows a layer's dense map runs on: its sources when the map runs before the aggregation, else its
    destinations (where the aggregated rows are)."""
    return sources(layer) if shape.gemm_first else destinations(layer)


def _ops(layer: int, phase: str) -> sympy.Expr:
    """A layer's other ops on its blocks (sources in, destinations out), once per minibatch."""
    return (row_ops(layer, sources(layer), destinations(layer), phase) + edge_ops(layer, edges(layer), phase)
            + NB * call_ops(layer, phase))


@cost_formula("dp-sample", batching="sampled")
def dp_sample(layer: int, shape: LayerShape, overlap: bool = False) -> Cost:
    """DistDGL: the worker's own seeds' blocks, locally; the first layer first pulls its remote input rows."""
    fwd = compute_forward(layer, shape, _rows(layer, shape), edges(layer)) + _ops(layer, "f")
    bwd = compute_backward(layer, shape, _rows(layer, shape), edges(layer)) + _ops(layer, "b")
    memory = layer_memory(layer, shape, sources(layer) / NB, ZERO, destinations(layer) / NB, edges(layer) / NB)
    if layer != 0:
        return Cost(f"dp-sample[{layer}]", (fwd, bwd), ZERO, memory)
    sent = SS * d(0) * b + SR * b_idx
    pull = all_to_all_time(sent, SR * d(0) * b + SS * b_idx) + NB * 2 * (P - 1) * alpha
    fwd = Max(fwd, pull) if overlap else fwd + pull
    return Cost(f"dp-sample[{layer}]", (fwd, bwd), sent, memory + b * SR / NB * d(0))


@cost_formula("pushpull", batching="sampled")
def pushpull_sampled(layer: int, shape: LayerShape, overlap: bool = False) -> Cost:
    """P3 on minibatches: push the first block's structure, run every worker's block on a feature slice,
    pull the partial sums to the owners; backward pushes the owners' gradient (see the module docstring).
    `overlap`: the 2F2B pipeline hides the exchanges behind other minibatches' compute."""
    f = d(layer) / P
    out_w = shape.out_width(layer)
    w = out_w if shape.gemm_first else f
    rows = SVt_0 if shape.gemm_first else SDt_0
    gemm = dense_map_time(layer, shape, rows, f)
    spmm = aggregation_time(layer, shape, SEt_0, w)
    # every worker runs every first block's other ops on its slice (the rows' worth of SVt_0 / P)
    ops = (row_ops(layer, SVt_0 / P, destinations(layer), "f") + edge_ops(layer, SEt_0, "f")
           + NB * call_ops(layer, "f"))
    ops_b = (row_ops(layer, SVt_0 / P, destinations(layer), "b") + edge_ops(layer, SEt_0, "b")
             + NB * call_ops(layer, "b"))
    push = all_gather_time((SKt - SK) * b_idx) + NB * (P - 1) * alpha
    pull = reduce_scatter_time((SDt_0 - destinations(layer)) * out_w * b) + NB * (P - 1) * alpha
    grad_push = all_gather_time((SDt_0 - destinations(layer)) * out_w * b) + NB * (P - 1) * alpha
    compute_f = gemm + spmm + ops
    compute_b = (dense_backward_time(layer, shape, rows, f)
                 + (aggregation_time(layer, shape, SEt_0, w, "b") if shape.exchange_grad else ZERO) + ops_b)
    if overlap:
        fwd, bwd = Max(compute_f, push + pull), Max(compute_b, grad_push)
    else:
        fwd, bwd = push + compute_f + pull, grad_push + compute_b
    nbytes = (P - 1) * SK * b_idx + (SDt_0 - destinations(layer)) * out_w * b \
        + (P - 1) * destinations(layer) * out_w * b
    memory = (b * (SVt_0 * f + SVt_0 * w + SDt_0 * out_w) + SEt_0 * (b_idx + b)) / NB
    return Cost(f"pushpull[{layer}]", (fwd, bwd), nbytes, memory)


def steps_allreduce(param_elements: sympy.Expr) -> Cost:
    """The gradient all-reduce, once per minibatch (as gnnc.runtime.comm counts it: 2(P-1)/P n b per worker)."""
    nbytes = 2 * (P - 1) / P * param_elements * b
    return Cost("grad_allreduce x NB", (NB * (nbytes / bw + 2 * (P - 1) * alpha),), NB * nbytes, ZERO)
