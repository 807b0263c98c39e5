"""Compute terms of the cost formulas: dense maps, aggregations, attention, what a layer keeps alive.

Why this module exists: every strategy prices the same op-aware compute (a
dense map costs 2·rows·d_in·d_out FLOP at the GEMM rate; an aggregation
nnz·width multiply-adds at the SpMM rate) on different rows and edges; the
probe's fit (`gnnc.passes.cost.fit`) reads the same terms.
"""
from __future__ import annotations

import sympy

from gnnc.passes.cost.symbols import b, b_idx, R_gemm, R_spmm, ATTENTION_OPS_PER_EDGE, d, heads, LayerShape


def gemm_time(rows: sympy.Expr, d_in: sympy.Expr, d_out: sympy.Expr, gemms: int = 1) -> sympy.Expr:
    """Dense map of `rows` rows: 2·gemms·rows·d_in·d_out FLOP at the GEMM rate (MG-GCN's GeMM)."""
    return 2 * gemms * rows * d_in * d_out / R_gemm


def spmm_time(nnz: sympy.Expr, width: sympy.Expr) -> sympy.Expr:
    """Aggregation over `nnz` edges of `width`-wide rows: nnz·width multiply-adds at the SpMM rate."""
    return nnz * width / R_spmm


def attention_time(nnz: sympy.Expr, n_heads: sympy.Expr) -> sympy.Expr:
    """Per-edge attention work (scores, softmax): ATTENTION_OPS_PER_EDGE per edge and head.

    Beyond the seeds: none of the five papers costs attention; this is an
    elementwise estimate at the (memory-bound) SpMM rate.
    """
    return ATTENTION_OPS_PER_EDGE * nnz * n_heads / R_spmm


def compute_forward(layer: int, shape: LayerShape, gemm_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """Forward compute of one layer: its dense maps on `gemm_rows` rows, its aggregation on `edges`."""
    t = gemm_time(gemm_rows, d(layer), shape.out_width(layer), shape.gemms)
    t += spmm_time(edges, shape.width(layer))
    if shape.attention:
        t += attention_time(edges, heads(layer))
    return t


def compute_backward(layer: int, shape: LayerShape, gemm_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """Backward compute: dW always, dX only when the input needs a gradient.

    The dense map's backward is one GEMM for dW plus one for dX; the
    aggregation's backward (an SpMM with the transposed structure) is needed
    when something below it needs a gradient: the input, or W when the dense
    map ran first. Attention's backward is taken equal to its forward.
    """
    gemm = gemm_time(gemm_rows, d(layer), shape.out_width(layer), shape.gemms)
    t = gemm * (2 if shape.input_grad else 1)
    if shape.exchange_grad:
        t += spmm_time(edges, shape.width(layer))
    if shape.attention:
        t += attention_time(edges, heads(layer))
    return t


def layer_memory(layer: int, shape: LayerShape, in_rows: sympy.Expr, halo_rows: sympy.Expr,
                 out_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """What one layer keeps alive until its backward: input rows, the aggregated buffer (with any
    received rows), output rows, and the structure it aggregates over (an index and a weight per edge)."""
    return (b * (in_rows * d(layer) + (in_rows + halo_rows) * shape.width(layer) + out_rows * shape.out_width(layer))
            + edges * (b_idx + b))


def layer_parameters(layer: int, shape: LayerShape, bias: bool = True) -> sympy.Expr:
    """Elements of a layer's weights: the dense maps, a bias, attention vectors (for all-reduce costs)."""
    n = shape.gemms * d(layer) * shape.out_width(layer)
    if bias:
        n += d(layer + 1)
    if shape.attention:
        n += 2 * shape.out_width(layer)
    return n
