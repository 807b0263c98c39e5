"""Compute terms of the cost formulas: dense maps, aggregations, every other op, what a layer keeps alive.

Why this module exists: every strategy prices the same op-aware compute (a
dense map costs 2·rows·d_in·d_out FLOP at the GEMM rate; an aggregation
nnz·width multiply-adds at the SpMM rate; each other op its elements at its
class's measured seconds per element, gnnc.passes.cost.ops) on different
rows and edges; the probe's fit (`gnnc.passes.cost.fit`) reads the same terms.
Each kernel's time is scaled by its layer's `kernel_factor` (its slowdown at
the layer's widths, gnnc.passes.cost.symbols), so the rates R_gemm and R_spmm
are those of the fastest widths the probe timed.
"""
from __future__ import annotations

import sympy

from gnnc.passes.cost.symbols import (b, b_idx, R_gemm, R_spmm, T_copy_b, T_copy_f, d, kernel_factor, op_time,
                                      rho, square_factor, LayerShape, ZERO)


def gemm_time(rows: sympy.Expr, d_in: sympy.Expr, d_out: sympy.Expr, gemms: int = 1) -> sympy.Expr:
    """Dense map of `rows` rows: 2·gemms·rows·d_in·d_out FLOP at the GEMM rate (MG-GCN's GeMM)."""
    return 2 * gemms * rows * d_in * d_out / R_gemm


def dense_map_time(layer: int, shape: LayerShape, rows: sympy.Expr, d_in: sympy.Expr | None = None,
                   kernel: str = "gemm_f") -> sympy.Expr:
    """A layer's dense maps on `rows` rows of width `d_in` (default d_l), one of their products (`kernel`: the
    forward x W, or backward's x^T g or g W^T): those reading a dense value at the GEMM rate slowed by the
    layer's `kernel_factor`; those reading the input features stored sparse (`shape.sparse_gemms`: a
    bag-of-words graph's) as the sparse-dense product they run, rho·d_in nonzeros per row times d_out
    multiply-adds, at the SpMM rate."""
    d_in = d(layer) if d_in is None else d_in
    out = shape.out_width(layer)
    dense = gemm_time(rows, d_in, out, shape.gemms - shape.sparse_gemms - shape.square_gemms)
    dense *= kernel_factor(layer, kernel)
    if shape.square_gemms:  # an MLP's later maps read the output width: their rate is that shape's
        dense += square_map_time(layer, shape, rows, kernel)
    if not shape.sparse_gemms:
        return dense
    return dense + shape.sparse_gemms * rows * rho * d_in * shape.out_width(layer) / R_spmm


def square_map_time(layer: int, shape: LayerShape, rows: sympy.Expr, kernel: str = "gemm_f") -> sympy.Expr:
    """The layer's later dense maps (`shape.square_gemms`: an MLP's out x out maps, GIN's second Linear) on
    `rows` rows, one of their products, at the GEMM rate slowed by their own shape's `square_factor` (out, out)."""
    out = shape.out_width(layer)
    return gemm_time(rows, out, out, shape.square_gemms) * square_factor(layer, kernel)


def dense_backward_time(layer: int, shape: LayerShape, rows: sympy.Expr, d_in: sympy.Expr | None = None) -> sympy.Expr:
    """The dense maps' backward: the weight gradient x^T g always, the input gradient g W^T when the input
    needs one. An MLP's later maps (`square_gemms`) read the first map's output, which has a gradient whatever
    the layer's input: their g W^T runs always (GIN's first layer reads x, and its 512 x 512 map's input
    gradient, which the first map's weight gradient needs, was priced by nothing)."""
    t = dense_map_time(layer, shape, rows, d_in, "gemm_dw")
    if shape.input_grad:
        return t + dense_map_time(layer, shape, rows, d_in, "gemm_dx")
    return t + square_map_time(layer, shape, rows, "gemm_dx") if shape.square_gemms else t


def spmm_time(layer: int, nnz: sympy.Expr, width: sympy.Expr, phase: str = "f") -> sympy.Expr:
    """Graph layer `layer`'s aggregation over `nnz` edges of `width`-wide rows, forward (`phase` f), its
    transpose backward (b) or its edge values' gradient (dw): nnz·width multiply-adds at the SpMM rate slowed
    by the layer's `kernel_factor`."""
    return nnz * width / R_spmm * kernel_factor(layer, f"spmm_{phase}")


def aggregation_time(layer: int, shape: LayerShape, nnz: sympy.Expr, width: sympy.Expr,
                     phase: str = "f") -> sympy.Expr:
    """The aggregation as a layer runs it: forward (`phase` f), or backward (b): the transpose product, and
    where the edge values come from parameters (attention's coefficients) their gradient too, a dot of the
    output gradient's row with the source row per edge (as many multiply-adds again: a GAT layer's
    aggregation backward took 2.3x its forward, timed alone on a 16,000-vertex R-MAT graph). A reducer doing more
    per edge than a sum (its ReducerCost.edge: std's sums of m and m*m) takes that many times a sum's."""
    if shape.hoisted:  # computed once per run (gnnc.passes.hoist), not per epoch
        return ZERO
    edges = _times(nnz, shape.aggregation.edge)
    if phase != "b":
        return spmm_time(layer, edges, width, phase)
    t = spmm_time(layer, edges, width, "b")
    return t + spmm_time(layer, nnz, width, "dw") if shape.attention else t


def _times(x: sympy.Expr, k: float) -> sympy.Expr:
    """x * k, and x itself for a factor of 1 (a sum's expressions stay the ones they were)."""
    return x if k == 1 else x * k


def row_ops(layer: int, in_rows: sympy.Expr, out_rows: sympy.Expr, phase: str = "f",
            dense_maps: bool = True) -> sympy.Expr:
    """The layer's other vertex ops (gnnc.passes.cost.ops): those before its aggregation on `in_rows`,
    those after it and the dense layer after it on `out_rows`. Phase f, b or e (`op_time`). With `dense_maps`,
    the dense layers' dense maps too (sides dense_in, dense_out: the dense layer before layer 0 maps the input
    features on every row the layer reads, DepCache's HV_k; GCNII's 512 -> 32 there was priced by no formula);
    False for a formula that prices them itself (GNNPipe's DF_s)."""
    t = in_rows * op_time(layer, "in", phase) + out_rows * op_time(layer, "out", phase)
    if dense_maps:
        t += in_rows * op_time(layer, "dense_in", phase) + out_rows * op_time(layer, "dense_out", phase)
    return t


def edge_ops(layer: int, edges: sympy.Expr, phase: str = "f") -> sympy.Expr:
    """The layer's other edge ops (attention scores and softmax, edge dropout, ...) on `edges`."""
    return edges * op_time(layer, "edge", phase)


def call_ops(layer: int, phase: str = "f") -> sympy.Expr:
    """The dispatch of every op the layer (and its dense layers) runs, once per call."""
    return op_time(layer, "call", phase)


def part_calls(layer: int, phase: str = "f") -> sympy.Expr:
    """The dispatch of the equations a split exchange's layer runs once per source part (gnnc.runtime.parts)."""
    return op_time(layer, "part", phase)


def layer_ops(layer: int, in_rows: sympy.Expr, out_rows: sympy.Expr, edges: sympy.Expr,
              phase: str = "f") -> sympy.Expr:
    """Every op of one layer that the dense map and the aggregation leave, on these rows and edges, once."""
    return row_ops(layer, in_rows, out_rows, phase) + edge_ops(layer, edges, phase) + call_ops(layer, phase)


def copy_time(elements: sympy.Expr, phase: str = "f") -> sympy.Expr:
    """Rows packed and assembled around an exchange (index_select, cat; backward: split, index_add)."""
    return elements * (T_copy_b if phase == "b" else T_copy_f)


def halo_buffers(rows: sympy.Expr, width: sympy.Expr, with_grad: bool, phase: str) -> sympy.Expr:
    """What a halo exchange's layer passes over `rows` rows of `width` whatever the rows moved (0 included), at
    the copy rate: forward, its output rows, the aggregation summed part by part into one zero-filled buffer
    (gnnc.runtime.parts.run_split; without overlap, the layer's rows concatenated with the halo's); backward, its
    held (input) rows, the halo's gradient for them zero-filled before the mirror gradients are added
    (gnnc.runtime.comm) and then added to the gradient they get from the layer's other readers: two passes.

    Why priced: a Hybrid selection that caches every dependency exchanges no row, yet runs its halo and the
    split aggregation around it, where DepCache runs one whole aggregation; priced as equal, Hybrid was chosen
    at ties and measured slower (GIN, R-MAT dense 512 -> 32, 2 emulated hosts: 37 against 32 ms at 400 Mb/s,
    issue 36 item 5). Timed on 2 ranks of one machine (GIN 32 -> 512 on a 16,000-vertex R-MAT, `gnnc run --nproc
    2`, loaded: load 3.6-6.4, three alternating pairs): the empty halo's backward blocked 5-23 ms per epoch, the
    step's CPU per rank -2 to +42 ms (median +17) beside DepCache's ~650-700 ms: a few passes over the held
    [~10,000, 512] rows; this term prices 3 x 10,000 x 512 copies there (15 ms at 1 ns a copy)."""
    if phase == "b":
        return copy_time(2 * rows * width, "b") if with_grad else ZERO
    return copy_time(rows * width, "f")


def per_epoch(shape: LayerShape, exchange: sympy.Expr) -> sympy.Expr:
    """The time or bytes of exchanging a layer's aggregated value, per epoch: none when the aggregation is hoisted
    (its input is the graph's: every rank exchanges it in the first step and keeps the rows, gnnc.passes.hoist)."""
    return ZERO if shape.hoisted else exchange


def compute_forward(layer: int, shape: LayerShape, gemm_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """Forward compute of one layer's kernels: its dense maps on `gemm_rows` rows, its aggregation on
    `edges` (its other ops: `layer_ops`)."""
    return dense_map_time(layer, shape, gemm_rows) + aggregation_time(layer, shape, edges, shape.width(layer))


def compute_backward(layer: int, shape: LayerShape, gemm_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """Backward compute of the kernels: dW always, dX only when the input needs a gradient.

    The dense map's backward is one GEMM for dW plus one for dX; the
    aggregation's backward (an SpMM with the transposed structure) is needed
    when something below it needs a gradient: the input, or W when the dense
    map ran first.
    """
    t = dense_backward_time(layer, shape, gemm_rows)
    if shape.exchange_grad:
        t += aggregation_time(layer, shape, edges, shape.width(layer), "b")
    return t


def layer_memory(layer: int, shape: LayerShape, in_rows: sympy.Expr, halo_rows: sympy.Expr,
                 out_rows: sympy.Expr, edges: sympy.Expr) -> sympy.Expr:
    """What one layer keeps alive until its backward: input rows, the aggregated buffer (with any
    received rows, and the reducer's state per output row: ReducerCost.state), output rows, and the structure
    it aggregates over (an index and a weight per edge)."""
    aggregated = (in_rows + halo_rows) * shape.width(layer)
    if shape.aggregation.state:
        aggregated += out_rows * shape.width(layer) * shape.aggregation.state
    return (b * (in_rows * d(layer) + aggregated + out_rows * shape.out_width(layer))
            + edges * (b_idx + b))


def layer_parameters(layer: int, shape: LayerShape, bias: bool = True) -> sympy.Expr:
    """Elements of a layer's weights: the dense maps, a bias, attention vectors (for all-reduce costs)."""
    n = shape.gemms * d(layer) * shape.out_width(layer)
    if bias:
        n += d(layer + 1)
    if shape.attention:
        n += 2 * shape.out_width(layer)
    return n
