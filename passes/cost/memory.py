"""The peak memory of each process of a training run, predicted before anything is allocated.

Why this module exists: the planner prices the memory each strategy keeps
alive per layer (`compute.layer_memory`, inside every strategy's `Cost`), but
a run also holds its parameters, their gradients and Adam's two moments, the
graph arrays it loaded and an interpreter with torch; and a run on one
process has no planner at all. `run_memory` adds those terms to the same
per-layer formula, evaluated on the rows and edges each rank really holds,
so that `gnnc run` can refuse a run that cannot fit (issue 20, item 10)
instead of being killed by the kernel minutes later. One function, so that a
fuller model of the epoch (its time too) extends it rather than a copy.

The terms, per process (bytes):

* parameters: every parameter's elements at its dtype's size.
* optimizer state: a gradient and Adam's exp_avg and exp_avg_sq per
  parameter, 3x the parameters.
* activations: `layer_memory` of every graph layer (its input rows, the
  aggregated buffer with received rows, its output rows, the structure it
  aggregates over), plus, for the backward pass, the gradients of one
  layer's input and output alive at once (the widest layer's). With
  `--recompute` (gnnc.runtime.recompute) a layer after the first keeps its
  input rows and structure only until its backward, which runs it again:
  the first layer's whole `layer_memory` (it is not run again), every other
  layer's input, plus the whole `layer_memory` of the one layer recomputed
  at a time (the largest). A GCN-like first layer (`first_in_blocks`:
  gnnc.runtime.recompute.first_layer) runs in blocks instead: it holds its
  output and a block of `FIRST_LAYER_COLUMNS` columns of its product (not
  the product beside the aggregation), its backward writes its output's
  gradient and the next layer's input gradient over that output (only the
  next layer's output gradient is new), and the next layer runs as without
  recomputation (its product was computed by the blocks): a two-layer GCN's
  peak is one [vertices, hidden] tensor lower than without --recompute.
* attention on a rank: a process of several runs no fused chain (gnnc.runtime.fusion runs in one process only),
  so a GAT layer there runs equation by equation and holds, per edge and head, what autograd saves of its scores
  (the scores, their softmax, the dropped attention: `ATTENTION_EDGE_VALUES` values) and the per-head block
  patterns its SpMM multiplies over, forward and transposed (gnnc.runtime.kernels.cpu.Pattern: an int32 column
  and an int64 permutation per edge and head each, `PATTERN_BYTES`), and in its backward those values' gradients
  (`ATTENTION_EDGE_GRADS`) beside the gradients of its transformed rows, every source row's, from the aggregation
  and from the scores before they are summed (`ATTENTION_SOURCE_GRADS`). One process computes the same in fused
  chains that keep none of them, but whose backward holds `FUSED_ATTENTION_EDGE_GRADS` values per edge and head at
  once (gnnc.runtime.fusion's attention backward, measured below).
* graph: the arrays the process loaded (features, labels, masks, edges or
  its shard).
* process: an interpreter with torch and gnnc's runtime and the collective
  library, before any graph (`PROCESS_BASELINE_BYTES`, measured).

What it leaves out: dense layers between graph layers beyond the value
each graph layer reads (a dropout's boolean mask, an activation's saved
output), the evaluation forward after each step (it runs without autograd,
after the step's activations are freed) and the allocator's slack.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.cost.compute import layer_memory
from gnnc.passes.cost.evaluation import compile_expr
from gnnc.passes.cost.symbols import LayerShape, b, b_idx, d, heads

# Resident memory of a rank that trained a 3-vertex graph: the interpreter, torch, gnnc's runtime and gloo,
# and next to no data. Measured (VmHWM) with `gnnc run examples/gcn.gnn --graph G --nproc 2 --json`
# on a 3-vertex graph, torch 2.13.0 CPU, Linux x86-64: 314 MiB (329,195,520 bytes).
PROCESS_BASELINE_BYTES = 329_195_520
# Adam keeps a gradient, exp_avg and exp_avg_sq beside each parameter.
OPTIMIZER_COPIES = 3
WARN_FRACTION = 0.8  # a prediction above this share of the memory there is gets a warning (plan and run)
# the per-process counts `layer_memory` is evaluated on, one value per process
IN, HALO, OUT, EDGES, WIDTH = (Symbol(name, nonnegative=True)
                               for name in ("in_rows", "halo_rows", "out_rows", "edges", "in_width"))
ROWS = {IN: "in_rows", HALO: "halo_rows", OUT: "out_rows", EDGES: "edges"}
# a rank's unfused attention layer, per edge and head (module docstring): the values autograd saves (the scores,
# their softmax, the dropped attention), the block patterns (forward and transposed: int32 column, int64 permutation),
# the gradients alive at once in its backward (per edge and head; per source row, of its transformed rows). Measured on
# a 50K-vertex R-MAT (deg 20, GAT 4 x 64, 2 ranks): without them the pre-check predicted 0.49 GiB for a rank that
# peaked at 0.80
ATTENTION_EDGE_VALUES = 3
PATTERN_BYTES = 2 * (4 + 8)
ATTENTION_EDGE_GRADS = 3
ATTENTION_SOURCE_GRADS = 2
# one process's fused attention backward (gnnc.runtime.fusion): the values per edge and head it holds at once.
# Measured on products' R-MAT at 0.05 (6.3M edges with self-loops, GAT 4 x 64): the large blocks' high-water mark
# rose 174 MiB inside the first layer's backward, 1.8 [edges, heads] float32 tensors; without them the pre-check
# priced GAT as GCN (1.14 GiB for a run that peaked at 1.42; at full size 17.0 GiB for one out of memory at 22)
FUSED_ATTENTION_EDGE_GRADS = 2
# the columns of a first layer's product `first_in_blocks` holds at once (gnnc.runtime.recompute.COLUMN_BLOCK)
FIRST_LAYER_COLUMNS = 32
BYTES_PER = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "bool": 1}


@dataclass(frozen=True)
class LayerRows:
    """What one process holds for one graph layer: the arguments of `layer_memory`."""

    in_rows: float
    halo_rows: float
    out_rows: float
    edges: float
    in_width: float | None = None  # columns of the input held, when not all of d_l (P3's feature slice)


@dataclass(frozen=True)
class ProcessCounts:
    """One process of a run: its rows and edges per graph layer, and the bytes of graph it loads."""

    layers: tuple[LayerRows, ...]
    graph_bytes: float


@dataclass(frozen=True)
class ParameterSize:
    name: str
    shape: str  # as the IR states it, with values: "[features=1433, hidden=16]"
    bytes: float


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak bytes of every process of a run; `terms` are the largest process's, by what holds them."""

    per_process: tuple[float, ...]
    terms: dict[str, float]
    parameters: tuple[ParameterSize, ...] = field(default=())  # largest first

    @property
    def peak(self) -> float:
        return max(self.per_process)

    @property
    def total(self) -> float:
        return sum(self.per_process)


def parameter_sizes(program: Program) -> list[ParameterSize]:
    """Every parameter with its shape and bytes, largest first."""
    cfg = program.config_dict()
    out = []
    for p in program.params():
        t = p.value.type
        dims = [eval_dim(x, cfg) for x in t.shape]
        shape = "[" + ", ".join(str(v) if str(x) == str(v) else f"{x}={v}" for x, v in zip(t.shape, dims)) + "]"
        out.append(ParameterSize(p.value.name, f"{t.dtype}{shape}", BYTES_PER.get(t.dtype, 4) * math.prod(dims)))
    return sorted(out, key=lambda s: -s.bytes)


def run_memory(program: Program, dims: Sequence[float], head_counts: Sequence[float], shapes: Sequence[LayerShape],
               processes: Sequence[ProcessCounts], baseline_bytes: float = PROCESS_BASELINE_BYTES,
               bytes_per_element: int = 4, index_bytes: int = 8, recompute: bool = False,
               fused: bool = True, first_in_blocks: bool = False) -> MemoryEstimate:
    """The peak memory of each process (see the module docstring for the terms); `fused`: the processes run
    attention as fused chains (one process), else equation by equation (the ranks of a run on several);
    `first_in_blocks`: under `recompute`, the first graph layer runs in blocks (gnnc.runtime.recompute.first_layer).

    dims, head_counts, shapes: the graph layers' widths d_0..d_L, heads and LayerShapes (as the planner
    reads them off the IR: `analysis.layers.layer_dims`, `cost.symbols.layer_shape`).
    """
    sizes = parameter_sizes(program)
    params = float(sum(s.bytes for s in sizes))
    n = len(processes)
    table: dict[Symbol, Any] = {b: float(bytes_per_element), b_idx: float(index_bytes)}
    table.update({d(i): float(w) for i, w in enumerate(dims)})
    table.update({heads(i): float(h) for i, h in enumerate(head_counts)})
    kept, backward, recomputed = np.zeros(n), np.zeros(n), np.zeros(n)
    for i, shape in enumerate(shapes):
        for sym, field_name in ROWS.items():
            table[sym] = np.array([float(getattr(p.layers[i], field_name)) for p in processes])
        table[WIDTH] = np.array([float(dims[i] if p.layers[i].in_width is None else p.layers[i].in_width)
                                 for p in processes])
        whole = compile_expr(layer_memory(i, shape, IN, HALO, OUT, EDGES).subs(d(i), WIDTH))(table, n)
        blocks = recompute and first_in_blocks and i < 2
        if blocks and i == 0:  # its output and a block of its product's columns, not the product beside the aggregation
            kept += compile_expr(b * (IN * WIDTH + OUT * shape.out_width(i) + IN * sympy.Min(shape.width(i),
                                 FIRST_LAYER_COLUMNS)) + EDGES * (b_idx + b))(table, n)
        elif blocks:  # run as without recomputation, priced as there (its input counted again, as there)
            kept += whole
        elif recompute and i > 0:  # the first layer is not run again (gnnc.runtime.recompute.regions)
            # its input rows and structure kept; while its backward runs it again, all it holds in a forward beside
            # them (its input counted twice: a GCN layer's forward holds its product and its aggregation at once,
            # more than it keeps, which a measured run shows on top of the gradients alive there)
            # (the second layer's input is the first's output, counted in the first layer's whole `layer_memory`)
            kept += compile_expr((b * IN * WIDTH if i > 1 else 0) + EDGES * (b_idx + b))(table, n)
            recomputed = np.maximum(recomputed, whole)
        else:
            kept += whole
        # the backward pass holds the gradients of one layer's input and output at a time; in blocks, the first
        # layer's output gradient and the next layer's input gradient are written over the first layer's output
        grads = sympy.Integer(0) if blocks and i == 0 else b * OUT * shape.out_width(i) if blocks \
            else b * (IN * WIDTH + OUT * shape.out_width(i))
        if shape.attention and not fused:
            kept += compile_expr(EDGES * heads(i) * (ATTENTION_EDGE_VALUES * b + PATTERN_BYTES))(table, n)
            grads += b * (EDGES * heads(i) * ATTENTION_EDGE_GRADS
                          + (IN + HALO) * shape.out_width(i) * ATTENTION_SOURCE_GRADS)
        elif shape.attention:
            grads += b * EDGES * heads(i) * FUSED_ATTENTION_EDGE_GRADS
        backward = np.maximum(backward, compile_expr(grads)(table, n))
    terms = {"parameters": np.full(n, params), "optimizer state": np.full(n, OPTIMIZER_COPIES * params),
             "activations": kept + recomputed + backward, "graph": np.array([float(p.graph_bytes) for p in processes]),
             "process": np.full(n, float(baseline_bytes))}
    per_process = sum(terms.values())
    top = int(np.argmax(per_process))
    return MemoryEstimate(tuple(float(v) for v in per_process), {k: float(v[top]) for k, v in terms.items()},
                          tuple(sizes))
