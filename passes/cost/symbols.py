"""The names every cost formula is written in: sympy symbols, what a layer's ops look like, the inputs.

Why this module exists: a formula is an expression over named symbols (graph
statistics per worker, dims, the cluster's rates) so that `--explain` can
print it and `crossovers` can solve it; the symbols, the `LayerShape` the IR
gives each layer, the `CostInputs` the formulas are evaluated on and the
`Cost` a strategy's formula returns are defined once, here.

The shape of a cost. A `Cost` holds, per worker i (the part-indexed symbols
`V_i`, `E_i`, `B_i`, ... stand for worker i's figures):

* `stages`: the seconds worker i spends in each *synchronised* stage. Workers
  meet at every exchange, so a stage lasts as long as its slowest worker, and
  the cost's time is the sum over stages of the max over workers
  (docs/design.md 5.5: "epoch time is the slowest worker's"). A strategy whose
  workers never meet inside a segment (DepCache) has one forward and one
  backward stage for the whole segment.
* `bytes`: the bytes worker i sends, counted as docs/design.md section 8 and
  `gnnc.runtime.comm` count them: the *logical payload* an operation must
  deliver to other workers, not what a ring algorithm relays and not a
  worker's data for itself. The job's traffic is the sum over workers.
* `memory`: the bytes worker i holds for the segment (an estimate of what
  autograd keeps: inputs of the dense maps, exchanged rows, outputs, the
  local structure).

Layers are numbered from 0: layer l reads h^l (h^0 = x, width d_l) and
writes h^{l+1} (width d_{l+1}). `LayerShape` carries what the IR knows about
a layer's ops (how many weight matrices, whether the dense map runs before
the aggregation, attention, whether its input needs a gradient).

Every other op of the epoch (activations, bias, dropout, attention scores,
the loss, the dense layers between graph layers) is priced per row and per
edge through `op_time` symbols, one per graph layer, side and phase, whose
values `LayerOpWork` computes from what gnnc.passes.cost.ops counted in the
IR and the profile's measured rates; the formulas charge them on the rows
and edges each strategy computes.

A dense map's and an aggregation's rate depends on its widths (a GEMM writing
8-wide rows runs at a fraction of the FLOP rate of a 64-wide one): each
graph layer's kernels carry a `kernel_factor` symbol per kernel (forward,
weight and input gradient of the dense map; the aggregation's forward,
backward and edge-value gradient, at its head count), valued from the profile's `kernel_rates` at the layer's widths
(`ClusterProfile.kernel_slowdown`; 1 without them).

Their rates also depend on the working set (ops on rows that fit a cache run several times faster per
element than on rows streamed from memory): the elementwise ops' `op_time` values and the aggregation's
`kernel_factor` are scaled by the profile's `size_factor` at the op's working set on a worker's mean rows
(`CostInputs.values`; 1 without `size_rates`). Numbers, not symbols: the formulas keep their shape.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.cluster import KERNELS, ClusterProfile
from gnnc.ir import Layer
from gnnc.ir.expr import as_expr
from gnnc.ir.reducers import ReducerCost, reducer
from gnnc.plan.precision import DEFAULT_PRECISION, GRAD_BYTES, element_bytes


def Max(*args: sympy.Expr) -> sympy.Expr:
    """max of cost terms, left as written: sympy's evaluating Max compares its arguments symbolically
    to drop dominated ones, which took most of the planning time of deep models and changes no value."""
    return sympy.Max(*args, evaluate=False)


# Scalars of the job (the same for every worker).
P = Symbol("P", positive=True)  # workers
N = Symbol("N", positive=True)  # vertices of the graph
E_tot = Symbol("E_tot", positive=True)  # edges of the graph (in-edges of all vertices)
V_max = Symbol("V_max", positive=True)  # the largest part's vertex count
b = Symbol("b", positive=True)  # bytes per feature element (4 for float32, 2 at bf16/fp16)
b_grad = Symbol("b_grad", positive=True)  # bytes per parameter-gradient element (4: fp32 master weights)
b_idx = Symbol("b_idx", positive=True)  # bytes per stored edge index (8 for int64)
bw = Symbol("bw", positive=True)  # bytes/s one worker sends to its peers
alpha = Symbol("alpha", nonnegative=True)  # seconds to start one message
R_gemm = Symbol("R_gemm", positive=True)  # FLOP/s of dense maps
R_spmm = Symbol("R_spmm", positive=True)  # edge-feature multiply-adds/s of aggregations
# the same rates forward alone, as the evaluation pass runs its dense maps and aggregations
R_gemm_e = Symbol("R_gemm_e", positive=True)
R_spmm_e = Symbol("R_spmm_e", positive=True)
rho = Symbol("rho_x", positive=True)  # the input features' nonzero fraction, when they are stored sparse (else 1)

# Per worker i (evaluated on arrays with one entry per worker).
V = Symbol("V_i", nonnegative=True)  # |V_i|: owned vertices
E = Symbol("E_i", nonnegative=True)  # |E_i|: in-edges of the owned vertices
B = Symbol("B_i", nonnegative=True)  # |B_i|: distinct remote in-neighbours (rows received per exchange)
S = Symbol("S_i", nonnegative=True)  # rows sent per exchange (one per (owned vertex, remote worker) pair)
E_r = Symbol("Er_i", nonnegative=True)  # in-edges of owned vertices whose source is remote
E_in = Symbol("Ein_i", nonnegative=True)  # in-edges of the owned vertices with no remote in-neighbour


# Made once, as the per-layer symbols below: a Symbol() call runs sympy's assumption handling each time, and a
# deep model's search named ~30,000 of them.
@functools.lru_cache(maxsize=None)
def d(layer: int) -> Symbol:
    """d_l: the width of h^l (d_0 is the input feature count F)."""
    return Symbol(f"d_{layer}", positive=True)


@functools.lru_cache(maxsize=None)
def heads(layer: int) -> Symbol:
    """Attention heads of layer l."""
    return Symbol(f"heads_{layer}", positive=True)


@functools.lru_cache(maxsize=None)
def hop_vertices(k: int) -> Symbol:
    """HV_k,i: vertices within k in-hops of V_i, V_i included (HV_0 = V_i)."""
    return Symbol(f"HV_{k}_i", nonnegative=True)


@functools.lru_cache(maxsize=None)
def hop_edges(k: int) -> Symbol:
    """HE_k,i: in-edges of the vertices within k in-hops of V_i (HE_0 = E_i)."""
    return Symbol(f"HE_{k}_i", nonnegative=True)


@functools.lru_cache(maxsize=None)
def comm_rows(layer: int) -> Symbol:
    """CR_l,i: rows of h^l worker i receives in a Hybrid segment (its communicated dependencies)."""
    return Symbol(f"CR_{layer}_i", nonnegative=True)


@functools.lru_cache(maxsize=None)
def comm_sent(layer: int) -> Symbol:
    """CS_l,i: rows of h^l worker i sends in a Hybrid segment."""
    return Symbol(f"CS_{layer}_i", nonnegative=True)


@functools.lru_cache(maxsize=None)
def recompute_rows(layer: int) -> Symbol:
    """RV_l,i: rows of h^{l+1} worker i recomputes at layer l for its cached dependencies."""
    return Symbol(f"RV_{layer}_i", nonnegative=True)


@functools.lru_cache(maxsize=None)
def recompute_edges(layer: int) -> Symbol:
    """RE_l,i: edges worker i aggregates at layer l for its cached dependencies."""
    return Symbol(f"RE_{layer}_i", nonnegative=True)


RX = Symbol("RX_i", nonnegative=True)  # rows of a Hybrid segment's input h^start replicated at worker i

# The ops besides dense maps, aggregations and exchanges (gnnc.passes.cost.ops): seconds per element of a
# row copied (a halo's rows packed and assembled, forward; split and added back, backward), per parameter
# element and per parameter tensor of an optimizer step.
T_copy_f = Symbol("Tcopy_f", nonnegative=True)
T_copy_b = Symbol("Tcopy_b", nonnegative=True)
T_opt = Symbol("Topt", nonnegative=True)
T_opt_call = Symbol("Toptcall", nonnegative=True)
T_call_f = Symbol("Tcall_f", nonnegative=True)  # one equation's dispatch, forward (the probe's "call" rate)
T_call_b = Symbol("Tcall_b", nonnegative=True)  # and backward
# "dense_in", "dense_out": the dense maps (linear) of the dense layers charged to the layer's input and output rows
OP_SIDES = ("in", "out", "edge", "call", "part", "dense_in", "dense_out")
PHASES = {"f": "forward", "b": "backward", "e": "evaluation"}


@functools.lru_cache(maxsize=None)
def op_time(layer: int, side: str, phase: str) -> Symbol:
    """T<side>_<phase>_l: seconds graph layer l's other ops take (everything but its dense maps,
    aggregations and exchanges; the dense layer after it and, for layer 0, the one before it, included)
    per row of its input (side "in": ops before the aggregation, and the dense layer before layer 0),
    per row of its output ("out": ops after it, and the dense layer after the layer), per edge ("edge"),
    once per call ("call": every op's dispatch), and once per source part of a split exchange ("part": the
    dispatch of the equations that run per part, gnnc.runtime.parts). Phase f: training forward, b: backward,
    e: evaluation forward (no dropout, no backward). Sides "dense_in" and "dense_out": per row of the input
    (output), the dense maps (`linear`) of the dense layers "in" ("out") counts the other ops of, at the GEMM
    rate (`LayerOpWork.dense_maps`): no strategy's formula prices a dense layer's map, and a strategy that
    computes more rows than it owns (DepCache's L-hop neighbourhood) runs it on all of them."""
    if side not in OP_SIDES or phase not in PHASES:
        raise ValueError(f"op_time side must be one of {OP_SIDES} and phase one of {tuple(PHASES)}")
    return Symbol(f"T{side}_{phase}_{layer}", nonnegative=True)


@functools.lru_cache(maxsize=None)
def kernel_factor(layer: int, kernel: str) -> Symbol:
    """K<kernel>_l: how many times its fitted seconds per unit of work graph layer l's `kernel` takes at the
    layer's widths (the dense map's forward, weight gradient, input gradient; the aggregation's forward,
    backward and edge-value gradient: gnnc.cluster.KERNELS)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    return Symbol(f"K{kernel}_{layer}", positive=True)


@functools.lru_cache(maxsize=None)
def square_factor(layer: int, kernel: str) -> Symbol:
    """K<kernel>sq_l: `kernel_factor` of graph layer l's later dense maps, those reading its output width (an
    MLP's out x out maps: `LayerShape.square_gemms`, GIN's second Linear), at (out, out), not the layer's
    (d_l, out): GIN 32 -> 512's 512 x 512 map ran at 35 GFLOP/s alone (one thread, 8,000 rows), the table's
    fastest rate, where the 32 x 512 map's slowdown (1.65 on the extended grid's 2-worker profiles) priced it."""
    if not kernel.startswith("gemm"):
        raise ValueError(f"only a dense map's kernels have a square factor, not {kernel!r}")
    return Symbol(f"K{kernel}sq_{layer}", positive=True)


@dataclass(frozen=True)
class LayerOpWork:
    """What gnnc.passes.cost.ops counted of one graph layer's other ops: (side, op class, elements per row or
    edge) for every op forward, and for every op with a backward; the ops run forward and backward."""

    forward: tuple[tuple[str, str, float], ...] = ()
    backward: tuple[tuple[str, str, float], ...] = ()
    calls_forward: int = 0
    calls_backward: int = 0
    # the equations that run once per source part when the layer's exchange is split (gnnc.passes.schedule marks
    # them `split`: those on edges and the readers of the exchanged rows, which read them through the edges)
    part_calls_forward: int = 0
    part_calls_backward: int = 0
    # the dense layers' dense maps (`linear` outside a graph layer): (side "in" or "out", d_in, d_out, the nonzero
    # fraction of its input when it reads the input features stored sparse (else None), whether its input needs a
    # gradient), one per map
    dense_maps: tuple[tuple[str, float, float, float | None, bool], ...] = ()
    # per side, the elements per row (edge) of one elementwise op (gnnc.passes.cost.ops: the work-weighted mean
    # over the side's ops): its working set is a worker's rows times these, not times the side's summed elements
    op_elements: tuple[tuple[str, float], ...] = ()

    def seconds(self, profile: Any, side: str, phase: str, precision: str = DEFAULT_PRECISION,
                rows: float | None = None) -> float:
        """The value of `op_time(layer, side, phase)` on the rates of `profile` (a ClusterProfile, or anything
        with its `op_rate(op, direction)`; the dense sides read its `rates_at`, `forward_rates_at` and
        `kernel_slowdown` at `precision`). `rows`: the rows (side "edge": the edges) a worker runs the ops on;
        with it, an elementwise op is priced at its own working set, its rows times one op's elements per row
        (`op_elements`; without them the side's) at `precision`'s bytes (`ClusterProfile.size_factor`; the
        profile then needs it); None: at the one rate."""
        if side in ("dense_in", "dense_out"):
            return self.dense_seconds(profile, side[len("dense_"):], phase, precision)
        if side in ("call", "part"):
            if side == "part":
                calls = self.part_calls_backward if phase == "b" else self.part_calls_forward
            else:
                calls = self.calls_backward if phase == "b" else self.calls_forward
            return calls * profile.op_rate("call", "backward" if phase == "b" else "forward")
        entries = self.backward if phase == "b" else self.forward
        direction = "backward" if phase == "b" else "forward"
        size_bytes = element_bytes(precision)
        per_row = dict(self.op_elements).get(side)  # one op's elements per row; None: each entry's own

        def rate(cls: str, n: float) -> float:
            if rows is None or cls != "elementwise":
                return profile.op_rate(cls, direction)
            return profile.op_rate(cls, direction) * profile.size_factor(
                f"{cls}.{direction}", rows * (n if per_row is None else per_row) * size_bytes)

        return float(sum(n * rate(cls, n) for s, cls, n in entries  # evaluation: no dropout
                         if s == side and not (phase == "e" and cls in ("dropout", "dropout_row"))))

    def dense_seconds(self, profile: Any, side: str, phase: str, precision: str = DEFAULT_PRECISION) -> float:
        """Seconds per row of the dense maps on `side` ("in", "out") in `phase`, priced as a graph layer's
        (compute.dense_map_time): 2·d_in·d_out FLOP per product at the GEMM rate slowed by the profile's
        `kernel_slowdown` at those widths, forward x W, backward the weight gradient x^T g and, when the input
        needs one, the input gradient g W^T; a map reading the input features stored sparse as the sparse-dense
        product it runs (rho·d_in·d_out multiply-adds at the SpMM rate; its input has no gradient). Evaluation:
        forward at the rates measured forward alone."""
        if not self.dense_maps:
            return 0.0
        gemm, spmm = profile.forward_rates_at(precision) if phase == "e" else profile.rates_at(precision)
        t = 0.0
        for s, k, n, density, grad in self.dense_maps:
            if s != side:
                continue
            kernels = ("gemm_dw", "gemm_dx") if phase == "b" and grad else ("gemm_dw",) if phase == "b" else ("gemm_f",)
            if density is not None:
                t += density * k * n / spmm  # one product forward or backward (dW), as dense_map_time's
            else:
                t += sum(2.0 * k * n / gemm * profile.kernel_slowdown(kernel, k, n) for kernel in kernels)
        return t


@dataclass(frozen=True)
class LayerShape:
    """What the formulas need to know about one graph layer's ops (the planner reads it off the IR).

    gemms: weight matrices d_in x d_out applied per row (GCN 1, SAGE 2).
    gemm_first: the dense map runs before the aggregation (reorder-gemm's
        rule, d_out <= d_in), so the aggregated and exchanged width is d_out.
    attention: GAT-style per-edge scores and softmax before the aggregation.
    mean_heads: the layer keeps heads x d_out through the aggregation and
        averages the heads after it (GAT's output layer).
    input_grad: the layer's input needs a gradient (False when it reads the
        input features directly: no input gradient, and no backward exchange
        of a value that has none).
    sparse_gemms: how many of the dense maps read the input features stored
        sparse (a bag-of-words graph's: gnnc.graph.sparse_if_sparse), which
        run as sparse-dense products (`compute.dense_map_time`).
    aggregation: what its aggregation's reducer costs beyond a sum's (its ReducerDef's cost, gnnc.ir.reducers):
        per edge at the SpMM rate (`compute.aggregation_time`), its extra state per output row
        (`compute.layer_memory`); its work per output row is an op's (gnnc.passes.cost.ops).
    square_gemms: how many of the dense maps read the layer's output width rather than its input width (an MLP's
        later maps, GIN's second Linear: out x out, not d_in x out).
    hoisted: the aggregation reads only the graph's inputs (gnnc.passes.hoist marks it, and the exchange of its
        input): it and that exchange run once per run, not per epoch (GIN's first layer sums x's rows).
    """

    gemms: int = 1
    gemm_first: bool = True
    attention: bool = False
    mean_heads: bool = False
    input_grad: bool = True
    sparse_gemms: int = 0
    aggregation: ReducerCost = ReducerCost()
    square_gemms: int = 0
    hoisted: bool = False

    def out_width(self, layer: int) -> sympy.Expr:
        """Width of the dense map's output (heads x d_out when heads are averaged later)."""
        return d(layer + 1) * heads(layer) if self.mean_heads else d(layer + 1)

    def width(self, layer: int) -> sympy.Expr:
        """Width of the aggregated value, which is also the value a vertex-partitioned layer exchanges."""
        return self.out_width(layer) if self.gemm_first else d(layer)

    def exchanged_widths(self, layer: int) -> tuple[sympy.Expr, ...]:
        """Widths of the values a vertex-partitioned layer exchanges, one exchange each: the aggregated value,
        and with attention the source side's scores too (GAT's dot of z with a_src, heads per row: each rank
        scores its own rows and exchanges them beside z, gnnc.passes.insert_comm)."""
        return (self.width(layer), heads(layer)) if self.attention else (self.width(layer),)

    def kernel_widths(self, layer: int, dims: Sequence[float],
                      n_heads: Sequence[float]) -> dict[str, tuple[float, float]]:
        """(k, n) of each of the layer's kernels (gnnc.cluster.KERNELS) at these widths: the dense map reads d_l-wide
        rows and writes out_width ones; the aggregation on width-wide rows (k 0), or with attention's per-head
        edge values on head-wide rows, its heads as k (a product on a structure with a row per vertex and head:
        gnnc.runtime.kernels.cpu.Pattern, slower per multiply-add than one value per edge)."""
        subs = {d(i): float(w) for i, w in enumerate(dims)}
        subs.update({heads(i): float(h) for i, h in enumerate(n_heads)})
        subs.setdefault(heads(layer), 1.0)
        # xreplace, not subs: subs tries every entry of `subs` (two per layer of the model) on the expression
        k, n = float(d(layer).xreplace(subs)), float(self.out_width(layer).xreplace(subs))
        width, per_head = float(self.width(layer).xreplace(subs)), 0.0
        if self.attention:
            per_head = subs[heads(layer)]
            width /= per_head
        return {"gemm_f": (k, n), "gemm_dw": (k, n), "gemm_dx": (k, n), "spmm_f": (per_head, width),
                "spmm_b": (per_head, width), "spmm_dw": (per_head, width)}

    @property
    def exchange_grad(self) -> bool:
        """Whether the exchanged value has a gradient to send back (it does if it went through W)."""
        return self.input_grad or self.gemm_first


def layer_shape(layer: Layer, needs_grad: set[str], sparse: set[str] = frozenset()) -> LayerShape:
    """The cost model's view of one lowered graph layer (`needs_grad`: the values that need a gradient,
    gnnc.passes.analysis.layers.param_dependent; `sparse`: the values held as sparse input features,
    gnnc.passes.cost.ops.sparse_values, when the graph's are)."""
    ops = [e.op for e in layer.eqns]
    first_linear = next((i for i, o in enumerate(ops) if o == "linear"), None)
    first_agg = next((i for i, o in enumerate(ops) if o in ("spmm", "gather")), None)
    gemm_first = first_linear is not None and (first_agg is None or first_linear < first_agg)
    sparse_gemms = sum(1 for e in layer.eqns if e.op == "linear" and e.ins[0].name in sparse)
    aggregation = ReducerCost() if first_agg is None else reducer(layer.eqns[first_agg].attr("reduce")).cost
    # a dense map reading a value as wide as the layer's output (an MLP's later maps), not as its input
    width_in = layer.inputs[0].type.shape[-1] if layer.inputs[0].type is not None else None
    square = sum(1 for e in layer.eqns if e.op == "linear" and e.ins[0].type is not None and width_in is not None
                 and e.ins[0].type.shape[-1] != width_in and e.ins[0].type.shape[-1] == e.outs[0].type.shape[-1])
    return LayerShape(gemms=max(1, ops.count("linear")), gemm_first=gemm_first,
                      attention="sddmm" in ops or "edge_softmax" in ops, mean_heads="mean_heads" in ops,
                      input_grad=layer.inputs[0].name in needs_grad, sparse_gemms=sparse_gemms,
                      aggregation=aggregation, square_gemms=square,
                      hoisted=first_agg is not None and bool(layer.eqns[first_agg].attr("hoisted")))


@dataclass(frozen=True)
class CostInputs:
    """Plain numbers the formulas are evaluated on: per-worker statistics, dims, the cluster.

    Per-worker arrays have one entry per worker (the parts of the
    partition). `hop_vertices[i, k]` and `hop_edges[i, k]` are *cumulative*:
    the vertices within k in-hops of V_i and the in-edges of those vertices
    (column 0: V_i and E_i); a DepCache segment of k layers needs columns
    0..k. `remote_edges` (in-edges with a remote source) lets the local part
    of an aggregation overlap the exchange; None means unknown, and then no
    overlap is assumed (every edge waits for the exchange). `inner_edges` (the
    in-edges of vertices with no remote in-neighbour: the work G3's bins can
    do before the halo arrives) likewise; None means none. `max_in_degree`
    (the largest in-degree among V_i: the heaviest row a bin of G3's can
    hold) None means unknown, and no row is heavier than a bin's share.
    """

    vertices: np.ndarray
    edges: np.ndarray
    remote: np.ndarray
    send: np.ndarray
    hop_vertices: np.ndarray
    hop_edges: np.ndarray
    dims: tuple[float, ...]
    profile: ClusterProfile
    heads: tuple[float, ...] = ()
    remote_edges: np.ndarray | None = None
    precision: str = DEFAULT_PRECISION  # of the activations (gnnc.plan.precision): their bytes and the rates
    index_bytes: int = 8
    inner_edges: np.ndarray | None = None
    op_work: tuple[LayerOpWork, ...] = ()  # per graph layer (gnnc.passes.cost.ops); () prices those ops at 0
    input_density: float = 1.0  # the input features' nonzero fraction when stored sparse (gnnc.graph.input_density)
    max_in_degree: np.ndarray | None = None
    shapes: tuple[LayerShape, ...] = ()  # per graph layer: what its kernels' widths are (`kernel_factor`)

    def __post_init__(self) -> None:
        p = len(self.vertices)
        optional = tuple(k for k in ("remote_edges", "inner_edges", "max_in_degree") if getattr(self, k) is not None)
        for name in ("edges", "remote", "send") + optional:
            if np.shape(getattr(self, name)) != (p,):
                raise ValueError(f"CostInputs.{name} must have one entry per worker ({p}), "
                                 f"has shape {np.shape(getattr(self, name))}")
        for name in ("hop_vertices", "hop_edges"):
            shape = np.shape(getattr(self, name))
            if len(shape) != 2 or shape[0] != p or shape[1] < 1:
                raise ValueError(f"CostInputs.{name} must be [workers, hops+1], has shape {shape}")
        if len(self.dims) < 1:
            raise ValueError("CostInputs.dims needs at least d_0")

    @property
    def workers(self) -> int:
        return len(self.vertices)

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one activation element at this precision."""
        return element_bytes(self.precision)

    @classmethod
    def from_stats(cls, stats: Any, dims: Sequence[float], profile: ClusterProfile, *,
                   heads: Sequence[float] = (), hop_levels: str = "per-level",
                   remote_edges: np.ndarray | None = None, precision: str = DEFAULT_PRECISION,
                   op_work: Sequence[LayerOpWork] = (), input_density: float = 1.0,
                   shapes: Sequence[LayerShape] = ()) -> CostInputs:
        """Fill from `gnnc.passes.partition.stats.PartStats` (fields vertices, edges, remote, send,
        lhop_vertices, lhop_edges).

        hop_levels: how PartStats counts the L-hop sets: "per-level" (column k
        holds the vertices at exactly depth k and their in-edges; summed here)
        or "cumulative" (already within-k-hops counts).
        """
        hv = np.asarray(stats.lhop_vertices, dtype=np.float64)
        he = np.asarray(stats.lhop_edges, dtype=np.float64)
        if hop_levels == "per-level":
            hv, he = np.cumsum(hv, axis=1), np.cumsum(he, axis=1)
        elif hop_levels != "cumulative":
            raise ValueError(f"hop_levels must be 'per-level' or 'cumulative', not {hop_levels!r}")
        if remote_edges is None:
            remote_edges = getattr(stats, "remote_edges", None)
        inner = getattr(stats, "inner_edges", None)
        heaviest = getattr(stats, "max_in_degree", None)
        return cls(np.asarray(stats.vertices, np.float64), np.asarray(stats.edges, np.float64),
                   np.asarray(stats.remote, np.float64), np.asarray(stats.send, np.float64), hv, he,
                   tuple(float(x) for x in dims), profile, tuple(float(h) for h in heads),
                   None if remote_edges is None else np.asarray(remote_edges, np.float64), precision,
                   inner_edges=None if inner is None else np.asarray(inner, np.float64), op_work=tuple(op_work),
                   input_density=float(input_density),
                   max_in_degree=None if heaviest is None else np.asarray(heaviest, np.float64),
                   shapes=tuple(shapes))

    @functools.cached_property
    def table(self) -> Rows:
        """`values()` with every value one float64 entry per worker: what compiled formulas read
        (made once: the planner evaluates thousands of formulas on the same inputs)."""
        return per_worker(self.values(), self.workers)

    def values(self) -> dict[Symbol, np.ndarray | float]:
        """Every symbol the formulas use, mapped to its value (arrays for per-worker symbols)."""
        p = self.workers
        prof = self.profile
        vertices = np.asarray(self.vertices, np.float64)
        edges = np.asarray(self.edges, np.float64)
        gemm_rate, spmm_rate = prof.rates_at(self.precision)
        gemm_rate_e, spmm_rate_e = prof.forward_rates_at(self.precision)
        out: dict[Symbol, np.ndarray | float] = {
            P: float(p), N: float(vertices.sum()), E_tot: float(edges.sum()), V_max: float(vertices.max()),
            b: float(self.bytes_per_element), b_grad: float(GRAD_BYTES), b_idx: float(self.index_bytes),
            bw: prof.effective_bandwidth(p), alpha: prof.latency,
            R_gemm: gemm_rate, R_spmm: spmm_rate, rho: float(self.input_density),
            R_gemm_e: gemm_rate_e, R_spmm_e: spmm_rate_e,
            V: vertices, E: edges, B: np.asarray(self.remote, np.float64), S: np.asarray(self.send, np.float64),
            E_r: edges if self.remote_edges is None else np.asarray(self.remote_edges, np.float64),
            E_in: np.zeros_like(edges) if self.inner_edges is None else np.asarray(self.inner_edges, np.float64),
        }
        for k in range(np.shape(self.hop_vertices)[1]):
            out[hop_vertices(k)] = np.asarray(self.hop_vertices, np.float64)[:, k]
            out[hop_edges(k)] = np.asarray(self.hop_edges, np.float64)[:, k]
        for layer, width in enumerate(self.dims):
            out[d(layer)] = float(width)
        for layer in range(max(len(self.dims) - 1, len(self.heads))):
            out[heads(layer)] = float(self.heads[layer]) if layer < len(self.heads) else 1.0
        out.update({T_copy_f: prof.op_rate("copy", "forward"), T_copy_b: prof.op_rate("copy", "backward"),
                    T_opt: prof.op_rate("optimizer", "forward"), T_opt_call: prof.op_rate("optimizer_call", "forward"),
                    T_call_f: prof.op_rate("call", "forward"), T_call_b: prof.op_rate("call", "backward")})
        # the working sets the elementwise ops and the aggregations are priced at: a worker's mean rows (edges)
        sized = bool(prof.size_rates)
        rows = {"in": float(vertices.mean()), "out": float(vertices.mean()), "edge": float(edges.mean())}
        for layer in range(max(len(self.dims) - 1, len(self.op_work))):
            work = self.op_work[layer] if layer < len(self.op_work) else LayerOpWork()
            for side in OP_SIDES:
                for phase in PHASES:
                    out[op_time(layer, side, phase)] = work.seconds(prof, side, phase, self.precision,
                                                                    rows.get(side) if sized else None)
        out.update(kernel_factors(self.shapes, self.dims, self.heads, prof.kernel_slowdown))
        if sized:
            source_rows = float((vertices + np.asarray(self.remote, np.float64)).mean())
            out.update(aggregation_size_factors(self.shapes, self.dims, self.heads, prof, source_rows,
                                                self.bytes_per_element, out))
        return out


def aggregation_size_factors(shapes: Sequence[LayerShape], dims: Sequence[float], n_heads: Sequence[float],
                             profile: ClusterProfile, source_rows: float, element_size: int,
                             factors: Mapping[Symbol, float]) -> dict[Symbol, float]:
    """Each graph layer's aggregation `kernel_factor` values (`factors`: `kernel_factors`' values) times the
    profile's `size_factor` of its kernel at the layer's working set, `source_rows` rows (a worker's own and
    received rows, which its gathers read) of the aggregated width at `element_size` bytes, relative to the
    same width on the graph the width table was timed on (the largest size timed: the table's rates hold
    there). The edge values' gradient (spmm_dw) reads the same rows: at the backward's factor."""
    out: dict[Symbol, float] = {}
    for layer, shape in enumerate(shapes):
        per_head, width = shape.kernel_widths(layer, dims, n_heads)["spmm_f"]
        elements = width * max(per_head, 1.0)
        for kernel in ("spmm_f", "spmm_b", "spmm_dw"):
            kind = "spmm_b" if kernel == "spmm_dw" else kernel
            timed = [r.rows for r in profile.size_rates if r.kind == kind]
            if not timed:
                continue
            scale = profile.size_factor(kind, source_rows * elements * element_size, 4.0 * max(timed) * elements)
            out[kernel_factor(layer, kernel)] = factors[kernel_factor(layer, kernel)] * scale
    return out


def kernel_factors(shapes: Sequence[LayerShape], dims: Sequence[float], n_heads: Sequence[float],
                   slowdown: Callable[[str, float, float], float]) -> dict[Symbol, float]:
    """Every graph layer's `kernel_factor` values: `slowdown(kernel, k, n)` (a profile's `kernel_slowdown`) at
    the layer's widths, and its `square_factor` values at (out, out); 1 for a layer whose shape is not given
    (len(dims) - 1 layers in all)."""
    out: dict[Symbol, float] = {}
    for layer in range(max(len(dims) - 1, len(shapes))):
        widths = shapes[layer].kernel_widths(layer, dims, n_heads) if layer < len(shapes) else {}
        for kernel in KERNELS:
            out[kernel_factor(layer, kernel)] = slowdown(kernel, *widths[kernel]) if kernel in widths else 1.0
            if kernel in widths and kernel.startswith("gemm"):
                n = widths[kernel][1]
                out[square_factor(layer, kernel)] = slowdown(kernel, n, n)
            elif kernel.startswith("gemm"):
                out[square_factor(layer, kernel)] = 1.0
    return out


@dataclass(frozen=True)
class Cost:
    """Per-worker expressions of one strategy on one segment (see the module docstring).

    evaluation: how many of the last stages are the evaluation forward pass the run makes after each
    training step (gnnc.passes.cost.epoch adds them: the forward stages again, without dropout);
    the stages before them are the training step's.
    """

    name: str
    stages: tuple[sympy.Expr, ...]
    bytes: sympy.Expr
    memory: sympy.Expr
    evaluation: int = 0

    @property
    def training_stages(self) -> tuple[sympy.Expr, ...]:
        return self.stages[:len(self.stages) - self.evaluation]

    @property
    def evaluation_stages(self) -> tuple[sympy.Expr, ...]:
        return self.stages[len(self.stages) - self.evaluation:]

    def __add__(self, other: Cost) -> Cost:
        return Cost(f"{self.name} + {other.name}",
                    self.training_stages + other.training_stages + self.evaluation_stages + other.evaluation_stages,
                    self.bytes + other.bytes, self.memory + other.memory, self.evaluation + other.evaluation)

    @property
    def free_symbols(self) -> set[Symbol]:
        out: set[Symbol] = set()
        for expr in (*self.stages, self.bytes, self.memory):
            out |= as_expr(expr).free_symbols
        return out

    def describe(self) -> str:
        """The formulas as text, for `--explain` and the plan (printed once per cost: printing a deep
        segment's sums is sympy sorting their terms, and the alternatives share segments)."""
        return _described(self)


@functools.lru_cache(maxsize=4096)
def _described(cost: Cost) -> str:
    lines = [f"{cost.name}:"]
    first_eval = len(cost.stages) - cost.evaluation
    for k, stage in enumerate(cost.stages):
        what = "evaluation stage" if k >= first_eval else "time stage"
        lines.append(f"  {what} {k} = max over workers i of {stage}")
    lines.append(f"  bytes sent by worker i = {cost.bytes}")
    lines.append(f"  memory of worker i = {cost.memory}")
    return "\n".join(lines)


ZERO = sympy.Integer(0)


def zero_cost(name: str) -> Cost:
    """A cost of nothing (a layout kept as it is, a boundary at the model's ends)."""
    return Cost(name, (), ZERO, ZERO)


class Rows(dict):
    """Symbol values, each one float64 entry per worker (`per_worker`'s), read-only: a compiled formula reads
    them as they are, where another table's values are first made rows (gnnc.passes.cost.evaluation)."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a Rows table is shared and read-only; make a new one")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type, tuple[dict[Symbol, np.ndarray]]]:  # a copy or pickle: built whole, not set
        return (Rows, (dict(self),))

    @functools.cached_property
    def by_name(self) -> dict[str, np.ndarray]:
        """The same values by symbol name, what compiled formulas look up: a str key compares in C, where a
        sympy Symbol equal to the table's but not the same object compares in Python (most of a deep
        model's evaluation time went to sympy's __eq__)."""
        return {s.name: v for s, v in self.items()}


def per_worker(values: Mapping[Symbol, Any], p: int) -> Rows:
    """Every value as one float64 entry per worker (scalars broadcast: read-only rows of one [scalars, p] broadcast,
    made in one np.broadcast_to call; one per scalar was ~0.03 CPU s of every compile of the 64-layer example,
    whose inputs hold ~2,200 symbols, most of them scalars)."""
    scalar = [np.ndim(v) == 0 for v in values.values()]
    rows = iter(np.broadcast_to(np.array([v for v, s in zip(values.values(), scalar) if s], np.float64)[:, None],
                                (sum(scalar), p)))
    return Rows({k: next(rows) if s else np.asarray(v, np.float64) for (k, v), s in zip(values.items(), scalar)})
