"""Activation memory of one training step, per worker, as the annotated IR schedules it.

Why this module exists: `--memory-cap` bounds a worker's activation memory,
and the schedule pass meets it with G3's bins; it needs to know, before
anything runs, how much each layer keeps alive and how much one bin of it
needs. This model reads the IR: the runtime keeps every value of the forward
pass until backward (its interpreter holds them by name, and autograd saves
most of them), so the memory kept is the sum of the values' sizes; a value
has the rows its position says (a layer's input rows, the rows its exchange
delivers, its output rows, or its edges) times its width. In a binned layer
(gnnc.plan.schedule_attrs: `bins=k`) the values computed per bin live only while
their bin runs (backward recomputes them), so the layer keeps its outputs and
one bin's values, twice over in backward (the bin's activations and their
gradients). One bin holds, per gnnc.plan.bins' widths, its rows' values, its
in-edges' values and the source rows it gathers; bins are cut to equal rows
and edges, so the largest holds 1/k of the layer's plus its heaviest row (the
worker's largest in-degree, `max_in_degree`), and gathers at most as many
source rows as it has edges (and no more than the layer reads). While its bins
run backward, a binned layer also holds the gradient of every value its bins
take from outside them, whole (gnnc.runtime.bins adds each bin's into it), and
a second one of the held rows' when some bins ran early on held rows only
(eager computation: `inner_edges`). A dropout also keeps its mask (a byte per
element).

Rows per worker, from the partition statistics: DepComm and Hybrid hold V_i
rows and receive B_i (Hybrid's cached rows are left out); DepCache holds the
L-hop neighbourhood of its segment; a staged broadcast holds two row blocks,
a gathered one all N rows; push-pull's first layer every row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnc.ir import Layer, Program
from gnnc.plan.bins import MASK_FRACTION, SOURCES, WHOLE, bin_inputs, bin_widths, value_width
from gnnc.plan.comm_ops import exchange_of
from gnnc.plan.schedule_attrs import bin_eqn, exchange_schedule, layer_schedule
from gnnc.plan.strategies import STRATEGIES

AGGREGATIONS = ("spmm", "gather")


@dataclass(frozen=True)
class Activations:
    """Bytes per worker: what the step keeps alive, one bin's working set at most, and the estimated peak."""

    kept: np.ndarray
    bin_working: np.ndarray
    peak: np.ndarray
    per_layer: dict[str, np.ndarray]  # what each layer keeps (its binned values at one bin's size)


@dataclass(frozen=True)
class _Rows:
    """A graph layer's row counts per worker: its input rows, the rows its exchange delivers, its output
    rows and its edges."""

    rows_in: np.ndarray
    src: np.ndarray
    out: np.ndarray
    edges: np.ndarray


def _layer_rows(program: Program, inputs) -> list[_Rows]:
    """Row counts of every graph layer (module docstring)."""
    v = np.asarray(inputs.vertices, np.float64)
    e = np.asarray(inputs.edges, np.float64)
    b = np.asarray(inputs.remote, np.float64)
    n = float(v.sum())
    hv, he = np.asarray(inputs.hop_vertices, np.float64), np.asarray(inputs.hop_edges, np.float64)
    layers = program.graph_layers()
    out: list[_Rows] = []
    for k, layer in enumerate(layers):
        strategy = layer.attr("strategy", "local")
        rows = STRATEGIES[strategy].rows
        if rows == "neighbourhood":
            start = int(layer.attr("segment", k))
            end = k + 1
            while end < len(layers) and layers[end].attr("strategy") == strategy and layers[end].attr("segment") == start:
                end += 1
            depth = end - k  # this layer's input lies `depth` hops out, its output depth-1
            col = min(depth, hv.shape[1] - 1)
            out.append(_Rows(hv[:, col], hv[:, col], hv[:, col - 1], he[:, col - 1]))
        elif rows == "blocks":
            # a split whose parts are each read once holds two blocks (gnnc.plan.comm_ops: parts_read_once)
            staged = any(exchange_schedule(q).split and exchange_of(q.op).parts_read_once for q in layer.eqns)
            src = np.full_like(v, 2 * float(v.max())) if staged else np.full_like(v, n)
            out.append(_Rows(v, src, v, e))
        elif rows == "all":
            out.append(_Rows(np.full_like(v, n), np.full_like(v, n), np.full_like(v, n), np.full_like(e, e.sum())))
        else:
            out.append(_Rows(v, v + b, v, e))
    return out


def _value_rows(layer: Layer, rows: _Rows, owned: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of every value a graph layer computes (its input rows, exchanged rows, output rows, edges)."""
    after: set[str] = set()  # values that depend on an aggregation: output rows
    out: dict[str, np.ndarray] = {}
    pulled = False
    for e in layer.eqns:
        name = e.outs[0].name
        typ = e.outs[0].type
        d = exchange_of(e.op)
        if d is not None and d.output_rows == "owned":  # P3's pull: owned rows from here
            pulled = True
        if typ is not None and typ.domain == "edge":
            out[name] = rows.edges
        elif d is not None and d.output_rows == "received":
            out[name] = rows.src
        elif e.op in AGGREGATIONS or any(v.name in after for v in e.ins):
            after.add(name)
            out[name] = rows.out
        else:
            out[name] = rows.rows_in
        if pulled:
            out[name] = owned
    return out


def _one_bin(widths, rows: _Rows, bins: int, max_degree: np.ndarray) -> np.ndarray:
    """Elements the largest of `bins` bins holds: 1/bins of the layer's rows and edges plus its heaviest
    row (gnnc.plan.bins.bin_bounds), and the source rows it gathers: one per edge at most (as many edges
    as that weight allows), and no more than the layer reads."""
    weight = (rows.out * widths.row + rows.edges * widths.edge) / bins + widths.row + max_degree * widths.edge
    edges = np.minimum(weight / widths.edge, rows.edges) if widths.edge else rows.edges
    return weight + np.minimum(edges, rows.src) * widths.source


def estimate(program: Program, inputs, bytes_per_element: int = 4) -> Activations:
    """The activation memory of one training step of `program` (annotated by the schedule pass)."""
    cfg = program.config_dict()
    graph_rows = _layer_rows(program, inputs)
    v = np.asarray(inputs.vertices, np.float64)
    kept = np.zeros_like(v)
    working = np.zeros_like(v)
    largest = np.zeros_like(v)
    per_layer: dict[str, np.ndarray] = {}
    max_degree = np.zeros_like(v) if inputs.max_in_degree is None else np.asarray(inputs.max_in_degree, np.float64)
    # some bins read held rows only and run while the halo is in flight: rows without remote in-neighbours
    eager = np.zeros(len(v), dtype=bool) if inputs.inner_edges is None else np.asarray(inputs.inner_edges) > 0
    binned_backward = np.zeros_like(v)
    graph_index = 0
    outputs_of_bins: set[str] = set()
    for layer in program.layers:
        if layer.kind == "graph":
            rows = graph_rows[graph_index]
            graph_index += 1
            value_rows = _value_rows(layer, rows, v)
            bins = layer_schedule(layer).bins
            outputs_of_bins = {o.name for o in layer.outputs}
        else:
            # a dense layer's values have the rows of the graph layer after it reads (owned rows after one)
            nxt = graph_rows[graph_index] if graph_index < len(graph_rows) else None
            here = nxt.rows_in if nxt is not None and graph_index == 0 else v
            value_rows = {e.outs[0].name: here for e in layer.eqns}
            bins = 1
        layer_kept = np.zeros_like(v)
        layer_bin = np.zeros_like(v)
        for e in layer.eqns:
            value = e.outs[0]
            if value.type is None or value.type.domain == "scalar":
                continue
            size = value_rows[value.name] * value_width(value, cfg) * bytes_per_element
            if e.op == "dropout":
                size = size * (1 + MASK_FRACTION)
            if bins > 1 and bin_eqn(e) and value.name not in outputs_of_bins:
                continue  # one bin's share: below
            layer_kept += size
            largest = np.maximum(largest, size)
        if layer.kind == "graph" and bins > 1:
            layer_bin = _one_bin(bin_widths(layer, cfg), rows, bins, max_degree) * bytes_per_element
            binned_backward = np.maximum(binned_backward, 2 * layer_bin + _bin_input_grads(
                layer, rows, value_rows, cfg, eager) * bytes_per_element)
        per_layer[layer.name] = layer_kept + layer_bin
        kept += layer_kept
        working = np.maximum(working, layer_bin)
    # backward: the gradient of the largest value alive, or a binned layer's recomputed bin, its gradients
    # and its inputs' whole gradients
    peak = kept + np.maximum(largest, binned_backward)
    return Activations(kept, working, peak, per_layer)


def _bin_input_grads(layer: Layer, rows: _Rows, value_rows: dict[str, np.ndarray], cfg, eager: np.ndarray
                     ) -> np.ndarray:
    """Elements of the gradients a binned layer's backward accumulates whole: one per value its bins take
    from outside them, and the held rows' of those read through edges again where bins ran early."""
    split = any(exchange_schedule(e).split for e in layer.eqns)
    out = np.zeros_like(rows.out)
    for v, how in bin_inputs(layer):
        if how == WHOLE:
            continue
        width = value_width(v, cfg)
        out = out + value_rows.get(v.name, rows.rows_in) * width  # the layer's input: its input rows
        if how == SOURCES and split:
            out = out + np.where(eager, rows.rows_in, 0.0) * width
    return out
