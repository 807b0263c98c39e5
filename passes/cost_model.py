"""Cost model: the time, bytes and memory of every strategy, as named sympy formulas.

Why this module exists: the planner chooses a strategy per segment of layers
by comparing predictions, and `--explain` must be able to say *why* — print
the formula behind a number and the point (a bandwidth, a hidden size) where
the choice would flip. So every cost is a sympy expression over named symbols
(graph statistics per worker, dims, the cluster's rates), built by a function
named after the strategy, evaluated on numpy arrays (`compile_expr`), and
solvable for crossovers with sympy.

The shape of a cost. A `Cost` holds, per worker i (the part-indexed symbols
`V_i`, `E_i`, `B_i`, ... stand for worker i's figures):

* `stages`: the seconds worker i spends in each *synchronised* stage. Workers
  meet at every exchange, so a stage lasts as long as its slowest worker, and
  the cost's time is the sum over stages of the max over workers
  (DESIGN.md 5.5: "epoch time is the slowest worker's"). A strategy whose
  workers never meet inside a segment (DepCache) has one forward and one
  backward stage for the whole segment.
* `bytes`: the bytes worker i sends, counted as DESIGN.md section 8 and
  `gnnc.runtime.comm` count them: the *logical payload* an operation must
  deliver to other workers, not what a ring algorithm relays and not a
  worker's data for itself. The job's traffic is the sum over workers.
* `memory`: the bytes worker i holds for the segment (an estimate of what
  autograd keeps: inputs of the dense maps, exchanged rows, outputs, the
  local structure).

Rules every formula follows: compute is op-aware (a dense map costs
2·rows·d_in·d_out FLOP at the GEMM rate; an aggregation nnz·width
multiply-adds at the SpMM rate); compute and communication that overlap take
the max, not the sum; communication is alpha-beta (bytes / bandwidth plus
latency per message) using the collectives below.

Layers are numbered from 0: layer l reads h^l (h^0 = x, width d_l) and
writes h^{l+1} (width d_{l+1}). `LayerShape` carries what the IR knows about
a layer's ops (how many weight matrices, whether the dense map runs before
the aggregation, attention, whether its input needs a gradient).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.cluster import ClusterProfile


def Max(*args: sympy.Expr) -> sympy.Expr:
    """max of cost terms, left as written: sympy's evaluating Max compares its arguments symbolically
    to drop dominated ones, which took most of the planning time of deep models and changes no value."""
    return sympy.Max(*args, evaluate=False)


# --- symbols -----------------------------------------------------------------------------------
# Scalars of the job (the same for every worker).
P = Symbol("P", positive=True)  # workers
N = Symbol("N", positive=True)  # vertices of the graph
E_tot = Symbol("E_tot", positive=True)  # edges of the graph (in-edges of all vertices)
V_max = Symbol("V_max", positive=True)  # the largest part's vertex count
b = Symbol("b", positive=True)  # bytes per feature element (4 for float32)
b_idx = Symbol("b_idx", positive=True)  # bytes per stored edge index (8 for int64)
bw = Symbol("bw", positive=True)  # bytes/s one worker sends to its peers
alpha = Symbol("alpha", nonnegative=True)  # seconds to start one message
R_gemm = Symbol("R_gemm", positive=True)  # FLOP/s of dense maps
R_spmm = Symbol("R_spmm", positive=True)  # edge-feature multiply-adds/s of aggregations

# Per worker i (evaluated on arrays with one entry per worker).
V = Symbol("V_i", nonnegative=True)  # |V_i|: owned vertices
E = Symbol("E_i", nonnegative=True)  # |E_i|: in-edges of the owned vertices
B = Symbol("B_i", nonnegative=True)  # |B_i|: distinct remote in-neighbours (rows received per exchange)
S = Symbol("S_i", nonnegative=True)  # rows sent per exchange (one per (owned vertex, remote worker) pair)
E_r = Symbol("Er_i", nonnegative=True)  # in-edges of owned vertices whose source is remote

# Attention: multiply-adds per edge and head beyond the aggregation (score add, leaky_relu + exp,
# normalisation, dropout mask). An estimate of elementwise edge work; no seed paper gives one.
ATTENTION_OPS_PER_EDGE = 4


def d(layer: int) -> Symbol:
    """d_l: the width of h^l (d_0 is the input feature count F)."""
    return Symbol(f"d_{layer}", positive=True)


def heads(layer: int) -> Symbol:
    """Attention heads of layer l."""
    return Symbol(f"heads_{layer}", positive=True)


def hop_vertices(k: int) -> Symbol:
    """HV_k,i: vertices within k in-hops of V_i, V_i included (HV_0 = V_i)."""
    return Symbol(f"HV_{k}_i", nonnegative=True)


def hop_edges(k: int) -> Symbol:
    """HE_k,i: in-edges of the vertices within k in-hops of V_i (HE_0 = E_i)."""
    return Symbol(f"HE_{k}_i", nonnegative=True)


def comm_rows(layer: int) -> Symbol:
    """CR_l,i: rows of h^l worker i receives in a Hybrid segment (its communicated dependencies)."""
    return Symbol(f"CR_{layer}_i", nonnegative=True)


def comm_sent(layer: int) -> Symbol:
    """CS_l,i: rows of h^l worker i sends in a Hybrid segment."""
    return Symbol(f"CS_{layer}_i", nonnegative=True)


def recompute_rows(layer: int) -> Symbol:
    """RV_l,i: rows of h^{l+1} worker i recomputes at layer l for its cached dependencies."""
    return Symbol(f"RV_{layer}_i", nonnegative=True)


def recompute_edges(layer: int) -> Symbol:
    """RE_l,i: edges worker i aggregates at layer l for its cached dependencies."""
    return Symbol(f"RE_{layer}_i", nonnegative=True)


RX = Symbol("RX_i", nonnegative=True)  # rows of a Hybrid segment's input h^start replicated at worker i


# --- inputs ------------------------------------------------------------------------------------


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
    """

    gemms: int = 1
    gemm_first: bool = True
    attention: bool = False
    mean_heads: bool = False
    input_grad: bool = True

    def out_width(self, layer: int) -> sympy.Expr:
        """Width of the dense map's output (heads x d_out when heads are averaged later)."""
        return d(layer + 1) * heads(layer) if self.mean_heads else d(layer + 1)

    def width(self, layer: int) -> sympy.Expr:
        """Width of the aggregated value, which is also the value a vertex-partitioned layer exchanges."""
        return self.out_width(layer) if self.gemm_first else d(layer)

    @property
    def exchange_grad(self) -> bool:
        """Whether the exchanged value has a gradient to send back (it does if it went through W)."""
        return self.input_grad or self.gemm_first


@dataclass(frozen=True)
class CostInputs:
    """Plain numbers the formulas are evaluated on: per-worker statistics, dims, the cluster.

    Per-worker arrays have one entry per worker (the parts of the
    partition). `hop_vertices[i, k]` and `hop_edges[i, k]` are *cumulative*:
    the vertices within k in-hops of V_i and the in-edges of those vertices
    (column 0: V_i and E_i); a DepCache segment of k layers needs columns
    0..k. `remote_edges` (in-edges with a remote source) lets the local part
    of an aggregation overlap the exchange; None means unknown, and then no
    overlap is assumed (every edge waits for the exchange).
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
    bytes_per_element: int = 4
    index_bytes: int = 8

    def __post_init__(self) -> None:
        p = len(self.vertices)
        for name in ("edges", "remote", "send") + (("remote_edges",) if self.remote_edges is not None else ()):
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

    @classmethod
    def from_stats(cls, stats: Any, dims: Sequence[float], profile: ClusterProfile, *,
                   heads: Sequence[float] = (), hop_levels: str = "per-level",
                   remote_edges: np.ndarray | None = None, bytes_per_element: int = 4) -> CostInputs:
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
        return cls(np.asarray(stats.vertices, np.float64), np.asarray(stats.edges, np.float64),
                   np.asarray(stats.remote, np.float64), np.asarray(stats.send, np.float64), hv, he,
                   tuple(float(x) for x in dims), profile, tuple(float(h) for h in heads),
                   None if remote_edges is None else np.asarray(remote_edges, np.float64), bytes_per_element)

    @functools.cached_property
    def table(self) -> Mapping[Symbol, np.ndarray]:
        """`values()` with every value one float64 entry per worker: what compiled formulas read
        (made once: the planner evaluates thousands of formulas on the same inputs)."""
        return MappingProxyType(_per_worker(self.values(), self.workers))

    def values(self) -> dict[Symbol, np.ndarray | float]:
        """Every symbol the formulas use, mapped to its value (arrays for per-worker symbols)."""
        p = self.workers
        prof = self.profile
        vertices = np.asarray(self.vertices, np.float64)
        edges = np.asarray(self.edges, np.float64)
        out: dict[Symbol, np.ndarray | float] = {
            P: float(p), N: float(vertices.sum()), E_tot: float(edges.sum()), V_max: float(vertices.max()),
            b: float(self.bytes_per_element), b_idx: float(self.index_bytes),
            bw: prof.effective_bandwidth(p), alpha: prof.latency,
            R_gemm: prof.effective_gemm_rate, R_spmm: prof.effective_spmm_rate,
            V: vertices, E: edges, B: np.asarray(self.remote, np.float64), S: np.asarray(self.send, np.float64),
            E_r: edges if self.remote_edges is None else np.asarray(self.remote_edges, np.float64),
        }
        for k in range(np.shape(self.hop_vertices)[1]):
            out[hop_vertices(k)] = np.asarray(self.hop_vertices, np.float64)[:, k]
            out[hop_edges(k)] = np.asarray(self.hop_edges, np.float64)[:, k]
        for layer, width in enumerate(self.dims):
            out[d(layer)] = float(width)
        for layer in range(max(len(self.dims) - 1, len(self.heads))):
            out[heads(layer)] = float(self.heads[layer]) if layer < len(self.heads) else 1.0
        return out


@dataclass(frozen=True)
class Cost:
    """Per-worker expressions of one strategy on one segment (see the module docstring)."""

    name: str
    stages: tuple[sympy.Expr, ...]
    bytes: sympy.Expr
    memory: sympy.Expr

    def __add__(self, other: Cost) -> Cost:
        return Cost(f"{self.name} + {other.name}", self.stages + other.stages, self.bytes + other.bytes,
                    self.memory + other.memory)

    @property
    def free_symbols(self) -> set[Symbol]:
        out: set[Symbol] = set()
        for expr in (*self.stages, self.bytes, self.memory):
            out |= sympy.sympify(expr).free_symbols
        return out

    def describe(self) -> str:
        """The formulas as text, for `--explain` and the plan."""
        lines = [f"{self.name}:"]
        for k, stage in enumerate(self.stages):
            lines.append(f"  time stage {k} = max over workers i of {stage}")
        lines.append(f"  bytes sent by worker i = {self.bytes}")
        lines.append(f"  memory of worker i = {self.memory}")
        return "\n".join(lines)


ZERO = sympy.Integer(0)


def _zero_cost(name: str) -> Cost:
    return Cost(name, (), ZERO, ZERO)


# --- compute -----------------------------------------------------------------------------------


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


# --- collectives (alpha-beta) -----------------------------------------------------------------


def all_to_all_time(send_bytes: sympy.Expr, recv_bytes: sympy.Expr) -> sympy.Expr:
    """Personalised exchange with every peer (NeutronStar's ring order: P-1 steps).

    Full-duplex links: a worker's sends and receives proceed together, so the
    larger of the two sets the time; one message start per step.
    """
    return Max(send_bytes, recv_bytes) / bw + (P - 1) * alpha


def all_reduce_time(nbytes: sympy.Expr) -> sympy.Expr:
    """Ring all-reduce of `nbytes` (reduce-scatter then all-gather): 2(P-1)/P·bytes/bw + 2(P-1)·alpha."""
    return 2 * (P - 1) / P * nbytes / bw + 2 * (P - 1) * alpha


def reduce_scatter_time(send_bytes: sympy.Expr) -> sympy.Expr:
    """Reduce-scatter where this worker must send `send_bytes` (the other workers' blocks).

    For equal blocks of a buffer of n bytes this is the ring's (P-1)/P·n/bw.
    """
    return send_bytes / bw + (P - 1) * alpha


def all_gather_time(recv_bytes: sympy.Expr) -> sympy.Expr:
    """All-gather where this worker must receive `recv_bytes` (every other block); ring: P-1 steps."""
    return recv_bytes / bw + (P - 1) * alpha


def broadcast_time(nbytes: sympy.Expr) -> sympy.Expr:
    """Pipelined tree broadcast of `nbytes`: the block crosses each link once, ceil(log2 P) message starts."""
    return nbytes / bw + sympy.ceiling(sympy.log(P, 2)) * alpha


def grad_allreduce(param_elements: sympy.Expr, buckets: int = 1, name: str = "grad_allreduce") -> Cost:
    """Sum the gradients of replicated weights over workers (ring all-reduce, `buckets` calls).

    Time: 2(P-1)/P·n·b/bw + 2(P-1)·alpha per bucket (the textbook ring).
    Bytes: the logical payload as gnnc.runtime.comm counts it (reduce-scatter
    then all-gather): 2(P-1)·n·b over all workers, 2(P-1)/P·n·b per worker
    on average; `allreduce_payload` gives each rank's exact share. Weights a
    strategy does not replicate (P3's W1 under pushpull: each worker owns the
    rows of dW1 for its feature slice) are left out by the caller.
    """
    nbytes = param_elements * b
    time = 2 * (P - 1) / P * nbytes / bw + 2 * (P - 1) * alpha * buckets
    return Cost(name, (time,), 2 * (P - 1) / P * nbytes, ZERO)


def allreduce_payload(bucket_elements: Sequence[int], world: int) -> np.ndarray:
    """Elements each rank sends for all-reduces of these bucket sizes, exactly as the runtime counts.

    Rank r's chunk c_r of a bucket of n elements follows torch.tensor_split
    (the first n mod world chunks are one longer); it sends the other chunks
    (n - c_r) in the reduce-scatter and its reduced chunk to world-1 ranks.
    """
    out = np.zeros(world, dtype=np.int64)
    if world <= 1:
        return out
    for n in bucket_elements:
        chunk = np.full(world, n // world, dtype=np.int64)
        chunk[: n % world] += 1
        out += (n - chunk) + (world - 1) * chunk
    return out


# --- strategies --------------------------------------------------------------------------------


def depcomm(layer: int, shape: LayerShape) -> Cost:
    """DepComm (NeutronStar) / G3's peer-to-peer push: halo exchange of remote in-neighbour rows.

    Worker i sends S_i rows and receives B_i rows of the exchanged value (one
    row per (vertex, remote worker) pair, thanks to mirrors), each
    `shape.width` wide; in backward the gradients of the B_i received rows
    go back and are summed at their owners. This is the per-layer
    communication term of NeutronStar's Eq. 1-3 (T_c per communicated
    vertex) and of G3's Eq. 4, whose per-epoch total 2·b·Σ_l H_l·Σ_i |B_i|
    DESIGN.md quotes (GNNPipe's Table 4).

    Beyond the seeds: (1) the width is what the IR exchanges (d_out when the
    dense map runs first, else d_in); (2) a layer reading the input features
    sends nothing back (x has no gradient), so its traffic is half of the
    2·b·H·|B_i| above; (3) time is full-duplex alpha-beta,
    max(S_i, B_i)·width·b/bw + (P-1)·alpha; (4) the aggregation over edges
    with a local source, E_i - Er_i, overlaps the exchange (max, not sum),
    as NeutronStar computes while chunks are in flight.
    """
    w = shape.width(layer)
    gemm_rows = V
    local_edges, remote_edges = E - E_r, E_r
    exch = all_to_all_time(S * w * b, B * w * b)
    fwd = (gemm_time(gemm_rows, d(layer), shape.out_width(layer), shape.gemms)
           + (attention_time(E, heads(layer)) if shape.attention else ZERO)
           + Max(exch, spmm_time(local_edges, w)) + spmm_time(remote_edges, w))
    bwd_dense = compute_backward(layer, shape, gemm_rows, ZERO)
    nbytes = S * w * b
    if shape.exchange_grad:
        bwd = bwd_dense + Max(exch, spmm_time(local_edges, w)) + spmm_time(remote_edges, w)
        nbytes += B * w * b
    else:
        bwd = bwd_dense
    memory = layer_memory(layer, shape, V, B, V, E)
    return Cost(f"depcomm[{layer}]", (fwd, bwd), nbytes, memory)


def _fetch_rows(rows: sympy.Expr, width: sympy.Expr, with_grad: bool) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """Forward time, backward time and bytes of replicating `rows` remote rows at a segment's entry.

    Per worker only the received count is known (who sends how many depends
    on the other workers' neighbourhoods), so the time is receive-bound and
    the bytes are charged to the receiver; the sum over workers is exact.
    """
    t = all_gather_time(rows * width * b)
    nbytes = rows * width * b * (2 if with_grad else 1)
    return t, (t if with_grad else ZERO), nbytes


def depcache(start: int, end: int, shapes: Sequence[LayerShape], fetch_input: bool | None = None) -> Cost:
    """DepCache (NeutronStar): replicate the (end-start)-hop in-neighbourhood and recompute it.

    With k = end - start layers, layer start+m computes the rows within
    k-1-m hops of V_i (HV_{k-1-m}) from the in-edges of those rows
    (HE_{k-1-m}); the dense map runs on its input rows (HV_{k-m}) when it
    comes first, else on its output rows. No activation is exchanged inside
    the segment, so workers meet only at its ends: one forward and one
    backward stage. The weight all-reduce is a separate `grad_allreduce`.
    This is NeutronStar's DepCache cost (Eq. 1-3: T_v per computed vertex,
    T_e per edge) with op-aware T_v, T_e.

    Beyond the seed: a segment that starts after layer 0 must first fetch
    the rows of h^start in its k-hop neighbourhood (HV_k - V_i rows, and
    their gradients back); at layer 0 the input features are static, loaded
    once with the partition, and cost nothing per epoch. `fetch_input`
    overrides that rule.
    """
    k = end - start
    if k < 1 or len(shapes) != k:
        raise ValueError(f"depcache[{start}:{end}] needs {max(k, 0)} layer shapes, got {len(shapes)}")
    fwd_terms, bwd_terms, memory_terms = [], [], []  # summed once: sympy re-sorts a sum at every +=
    for m, shape in enumerate(shapes):
        layer = start + m
        in_rows, out_rows, edges = hop_vertices(k - m), hop_vertices(k - 1 - m), hop_edges(k - 1 - m)
        gemm_rows = in_rows if shape.gemm_first else out_rows
        fwd_terms.append(compute_forward(layer, shape, gemm_rows, edges))
        bwd_terms.append(compute_backward(layer, shape, gemm_rows, edges))
        memory_terms.append(layer_memory(layer, shape, in_rows, ZERO, out_rows, edges))
    fwd, bwd, memory = sympy.Add(*fwd_terms), sympy.Add(*bwd_terms), sympy.Add(*memory_terms)
    nbytes = ZERO
    if fetch_input if fetch_input is not None else start > 0:
        t_f, t_b, nbytes = _fetch_rows(hop_vertices(k) - V, d(start), shapes[0].input_grad)
        fwd, bwd = t_f + fwd, bwd + t_b
    return Cost(f"depcache[{start}:{end}]", (fwd, bwd), nbytes, memory)


def hybrid(start: int, end: int, shapes: Sequence[LayerShape], fetch_input: bool | None = None) -> Cost:
    """Hybrid (NeutronStar): the cost of a given cache/communicate selection over a segment.

    Per worker and layer l the selection gives CR_l rows received and CS_l
    rows sent (the communicated dependencies C) and RV_l rows / RE_l edges
    recomputed for the cached ones R (their subtrees, down to the segment's
    first layer); RX rows of h^start are replicated. `hybrid_values` turns a
    `gnnc.passes.hybrid_greedy.HybridResult` into those symbols' values.

    Each layer: the worker's own rows (V_i, E_i) as in DepComm, plus the
    recomputation, which runs while the communicated rows are in flight
    (NeutronStar overlaps cached computation with communication: max, not
    sum). With nothing cached (CR = B, CS = S, RV = RE = RX = 0) this is
    exactly `depcomm` layer by layer. Beyond the seed, as for `depcache`: a
    segment after layer 0 fetches its RX replicated rows at entry.
    """
    k = end - start
    if k < 1 or len(shapes) != k:
        raise ValueError(f"hybrid[{start}:{end}] needs {max(k, 0)} layer shapes, got {len(shapes)}")
    stages_f: list[sympy.Expr] = []
    stages_b: list[sympy.Expr] = []
    byte_terms: list[sympy.Expr] = []  # summed once: sympy re-sorts a sum at every +=
    memory_terms: list[sympy.Expr] = []
    for m, shape in enumerate(shapes):
        fwd, bwd, nbytes, memory = _hybrid_layer(start + m, shape, m == 0)
        stages_f.append(fwd)
        stages_b.append(bwd)
        byte_terms.append(nbytes)
        memory_terms.append(memory)
    nbytes, memory = sympy.Add(*byte_terms), sympy.Add(*memory_terms, RX * d(start) * b)
    if fetch_input if fetch_input is not None else start > 0:
        t_f, t_b, fetch_bytes = _fetch_rows(RX, d(start), shapes[0].input_grad)
        stages_f[0] = t_f + stages_f[0]
        stages_b[0] = stages_b[0] + t_b
        nbytes += fetch_bytes
    return Cost(f"hybrid[{start}:{end}]", tuple(stages_f) + tuple(reversed(stages_b)), nbytes, memory)


@functools.lru_cache(maxsize=4096)
def _hybrid_layer(layer: int, shape: LayerShape, first: bool) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """One layer of a Hybrid segment: forward and backward stage, bytes, memory (see `hybrid`).

    They depend on the segment only through whether the layer is its first, so a
    deep model's many spans share them (cached: the planner prices every span).
    """
    w = shape.width(layer)
    cr, cs, rv, re = comm_rows(layer), comm_sent(layer), recompute_rows(layer), recompute_edges(layer)
    # a dense map that runs before the aggregation runs on the recomputed rows' inputs: the rows
    # recomputed one layer down, or the replicated input rows at the segment's first layer
    rg = (RX if first else recompute_rows(layer - 1)) if shape.gemm_first else rv
    exch = all_to_all_time(cs * w * b, cr * w * b)
    local_f = spmm_time(E - E_r, w) + compute_forward(layer, shape, rg, re)
    fwd = (gemm_time(V, d(layer), shape.out_width(layer), shape.gemms)
           + (attention_time(E, heads(layer)) if shape.attention else ZERO)
           + Max(exch, local_f) + spmm_time(E_r, w))
    bwd = compute_backward(layer, shape, V, ZERO)
    local_b = compute_backward(layer, shape, rg, re)
    nbytes = cs * w * b
    if shape.exchange_grad:
        bwd += Max(exch, spmm_time(E - E_r, w) + local_b) + spmm_time(E_r, w)
        nbytes += cr * w * b
    else:
        bwd += local_b
    # the recomputed rows come with their own inputs and structure
    memory = layer_memory(layer, shape, V, cr, V, E) + layer_memory(layer, shape, ZERO, ZERO, rv, re)
    return fwd, bwd, nbytes, memory


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
    computes its slice of dW locally: no all-reduce for this layer's weights
    (leave them out of `grad_allreduce`). GAT is legal only with the
    attention scores synced before the softmax: an all-reduce of 2 scores
    per vertex and head.

    Beyond the seed: P3 pipelines minibatches (2F2B); this is the
    full-graph, unpipelined step, with alpha-beta collectives.
    """
    f = d(layer) / P
    out_w = shape.out_width(layer)
    w = out_w if shape.gemm_first else f
    gemm = gemm_time(N, f, out_w, shape.gemms)
    spmm = spmm_time(E_tot, w)
    att = attention_time(E_tot, heads(layer)) if shape.attention else ZERO
    scores = all_reduce_time(2 * N * heads(layer) * b) if shape.attention else ZERO
    push = all_gather_time((E_tot - E) * b_idx) if structure_push else ZERO
    pull = reduce_scatter_time((N - V) * out_w * b)
    fwd = push + gemm + att + scores + spmm + pull
    grad_push = all_gather_time((N - V) * out_w * b)
    bwd = (grad_push + gemm * (2 if shape.input_grad else 1) + (spmm if shape.exchange_grad else ZERO)
           + att + (scores if shape.attention else ZERO))
    nbytes = (N - V) * out_w * b + V * out_w * (P - 1) * b
    if structure_push:
        nbytes += E * (P - 1) * b_idx
    if shape.attention:
        nbytes += 2 * (2 * (P - 1) / P) * 2 * N * heads(layer) * b  # scores all-reduced forward and backward
    memory = b * (N * f + N * w + N * out_w + V * out_w) + E_tot * (b_idx + b)
    return Cost(f"pushpull[{layer}]", (fwd, bwd), nbytes, memory)


def bcast1d(layer: int, shape: LayerShape) -> Cost:
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
    gradients exact, so the backward mirrors the forward and the gathered
    N x width rows stay in memory.
    """
    w = shape.width(layer)
    stages = N * w * b / bw + P * sympy.ceiling(sympy.log(P, 2)) * alpha
    first = broadcast_time(V_max * w * b)
    rest = stages - first
    fwd = (gemm_time(V, d(layer), shape.out_width(layer), shape.gemms)
           + (attention_time(E, heads(layer)) if shape.attention else ZERO)
           + first + Max(rest, spmm_time(E, w)))
    bwd = compute_backward(layer, shape, V, ZERO)
    nbytes = V * w * (P - 1) * b
    if shape.exchange_grad:
        bwd += first + Max(rest, spmm_time(E, w))
        nbytes += (N - V) * w * b
    memory = b * (V * d(layer) + N * w + V * shape.out_width(layer)) + E * (b_idx + b)
    return Cost(f"bcast1d[{layer}]", (fwd, bwd), nbytes, memory)


def local(layer: int, shape: LayerShape) -> Cost:
    """One worker runs the layer on the whole graph (N rows, E_tot edges): compute only."""
    fwd = compute_forward(layer, shape, N, E_tot)
    bwd = compute_backward(layer, shape, N, E_tot)
    memory = layer_memory(layer, shape, N, ZERO, N, E_tot)
    return Cost(f"local[{layer}]", (fwd, bwd), ZERO, memory)


# --- layouts and their transitions ---------------------------------------------------------------

LAYOUTS = ("vertex", "feature", "replicated")

# (input layout, output layout) of each strategy. DepCache and Hybrid read vertex-partitioned rows
# at their entry (their neighbourhood replication is part of their own cost) and leave owned rows.
STRATEGY_LAYOUT: Mapping[str, tuple[str, str]] = MappingProxyType({
    "depcomm": ("vertex", "vertex"),
    "depcache": ("vertex", "vertex"),
    "hybrid": ("vertex", "vertex"),
    "pushpull": ("feature", "vertex"),
    "bcast1d": ("vertex", "vertex"),
    "local": ("replicated", "replicated"),
})


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
        return _zero_cost(name)
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
    loss reads owned rows, which every multi-worker strategy leaves.
    """
    if prev is None or nxt is None:
        return _zero_cost(f"{prev}->{nxt}")
    src = STRATEGY_LAYOUT[prev][1]
    dst = STRATEGY_LAYOUT[nxt][0]
    return transition(src, dst, d(layer), needs_grad)


SINGLE_LAYER = ("depcomm", "pushpull", "bcast1d", "local")
MULTI_LAYER = ("depcache", "hybrid")


def segment_cost(strategy: str, start: int, end: int, shapes: Sequence[LayerShape], **options: Any) -> Cost:
    """The formula of `strategy` on layers [start, end) (single-layer strategies: end = start + 1)."""
    if strategy in SINGLE_LAYER:
        if end != start + 1 or len(shapes) != 1:
            raise ValueError(f"{strategy} runs one layer at a time; got layers [{start}, {end})")
        fn = {"depcomm": depcomm, "pushpull": pushpull, "bcast1d": bcast1d, "local": local}[strategy]
        return fn(start, shapes[0], **options)
    if strategy == "depcache":
        return depcache(start, end, shapes, **options)
    if strategy == "hybrid":
        return hybrid(start, end, shapes, **options)
    raise ValueError(f"no cost formula for strategy {strategy!r}")


# --- evaluation --------------------------------------------------------------------------------

Values = Mapping[Symbol, Any]


def compile_expr(expr: sympy.Expr) -> Callable[..., np.ndarray]:
    """`expr` as a function from a symbol->value table to one value per worker.

    The formula is turned into nested numpy calls once (`_numeric`) and kept
    (the planner meets the same layer terms in many segments). The worker
    count comes from the table's arrays (or `workers=`), so a formula that is
    constant still yields one value per worker.
    """
    return _compiled(sympy.sympify(expr))


@functools.lru_cache(maxsize=8192)
def _compiled(expr: sympy.Expr) -> Callable[..., np.ndarray]:
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    fn = _numeric(expr)

    def run(values: Values, workers: int | None = None) -> np.ndarray:
        missing = [s.name for s in syms if s not in values]
        if missing:
            raise KeyError(f"no value for {', '.join(missing)}")
        if workers is None:
            workers = max((np.shape(v)[0] for v in values.values() if np.ndim(v) == 1), default=1)
        table = {s: _row(values[s], workers) for s in syms}
        out = fn(table)
        return np.array(np.broadcast_to(np.asarray(out, dtype=np.float64), (workers,)))

    return run


def _row(value: Any, workers: int) -> np.ndarray:
    """`value` as one float64 entry per worker (as it comes, when it already is)."""
    if isinstance(value, np.ndarray) and value.shape == (workers,) and value.dtype == np.float64:
        return value
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (workers,))


_NARY = {sympy.Add: np.add, sympy.Mul: np.multiply, sympy.Max: np.maximum, sympy.Min: np.minimum}
_UNARY = {sympy.log: np.log, sympy.exp: np.exp, sympy.ceiling: np.ceil, sympy.floor: np.floor}


def _numeric(expr: sympy.Expr) -> Callable[[Mapping[Symbol, np.ndarray]], Any]:
    """`expr` as nested numpy calls on a table of values.

    The formulas are sums, products, powers and maxima of symbols (plus the
    odd log and ceiling; sympy writes log(x, b) as a product): walking them is far cheaper than `sympy.lambdify`,
    which prints and compiles Python source per formula, and the planner
    evaluates thousands of formulas once each.
    """
    if expr.is_Symbol:
        return lambda t: t[expr]
    if expr.is_Number:
        value = float(expr)
        return lambda t: value
    for kind, op in _NARY.items():
        if isinstance(expr, kind):
            parts = [_numeric(a) for a in expr.args]

            def nary(t, parts=parts, op=op):
                acc = parts[0](t)
                for f in parts[1:]:
                    acc = op(acc, f(t))
                return acc

            return nary
    if isinstance(expr, sympy.Pow):
        base, exp = _numeric(expr.base), _numeric(expr.exp)
        return lambda t: np.power(np.asarray(base(t), dtype=np.float64), exp(t))
    for kind, op in _UNARY.items():
        if isinstance(expr, kind) and len(expr.args) == 1:
            arg = _numeric(expr.args[0])
            return lambda t, op=op: op(arg(t))
    # anything else (a user cost function's exotic term): sympy compiles it
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    fn = sympy.lambdify(syms, expr, modules="numpy")
    return lambda t: fn(*[t[s] for s in syms])


def _per_worker(values: Values, p: int) -> dict[Symbol, np.ndarray]:
    return {k: (np.broadcast_to(np.asarray(v, np.float64), (p,)) if np.ndim(v) == 0 else np.asarray(v, np.float64))
            for k, v in values.items()}


def _table(inputs: CostInputs, extra: Values | None) -> Mapping[Symbol, Any]:
    """Every symbol's value per worker: the inputs' (`CostInputs.table`, shared, read-only), then `extra`'s."""
    if not extra:
        return inputs.table
    return {**inputs.table, **_per_worker(extra, inputs.workers)}


def evaluate(expr: sympy.Expr, inputs: CostInputs, extra: Values | None = None) -> np.ndarray:
    """`expr` on `inputs` (plus `extra` symbol values, e.g. a Hybrid selection): one value per worker."""
    return compile_expr(expr)(_table(inputs, extra), inputs.workers)


@dataclass(frozen=True)
class CostValue:
    """A `Cost` evaluated: the time (sum over stages of the slowest worker), the job's bytes, the peak memory."""

    name: str
    time: float
    bytes: float
    memory: float
    stage_times: np.ndarray = field(repr=False)  # [stages, workers]
    worker_bytes: np.ndarray = field(repr=False)  # [workers]
    worker_memory: np.ndarray = field(repr=False)  # [workers]


class CompiledCost:
    """A `Cost` with its expressions lambdified once; call it on inputs as often as needed."""

    def __init__(self, cost: Cost):
        self.cost = cost
        self._stages = tuple(compile_expr(s) for s in cost.stages)
        self._bytes = compile_expr(cost.bytes)
        self._memory = compile_expr(cost.memory)

    def __call__(self, inputs: CostInputs, extra: Values | None = None) -> CostValue:
        return self.on_table(_table(inputs, extra), inputs.workers)

    def on_table(self, table: Values, workers: int) -> CostValue:
        stage_times = (np.stack([fn(table, workers) for fn in self._stages]) if self._stages
                       else np.zeros((0, workers)))
        worker_bytes = self._bytes(table, workers)
        worker_memory = self._memory(table, workers)
        time = float(sum(float(row.max()) for row in stage_times))
        return CostValue(self.cost.name, time, float(worker_bytes.sum()), float(worker_memory.max()),
                         stage_times, worker_bytes, worker_memory)


def compile_cost(cost: Cost) -> CompiledCost:
    return CompiledCost(cost)


def evaluate_cost(cost: Cost, inputs: CostInputs, extra: Values | None = None) -> CostValue:
    """`cost` on `inputs`; compile it with `compile_cost` instead when evaluating it repeatedly."""
    return CompiledCost(cost)(inputs, extra)


def total_time(costs: Iterable[Cost], inputs: CostInputs, extra: Values | None = None) -> float:
    """Predicted time of a sequence of costs (segments, transitions, all-reduces) run one after another."""
    return sum(evaluate_cost(c, inputs, extra).time for c in costs)


# --- crossovers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crossover:
    """A value of `symbol` where two predictions are equal, and the equation solved there.

    `equation` is the piece of the (piecewise) time difference that is active
    at the crossover, with every max resolved: sympy solved it exactly.
    `first_faster_above` says which side of the crossover favours the first
    sequence of costs.
    """

    symbol: Symbol
    value: float
    equation: sympy.Eq
    first_faster_above: bool


def total_time_expr(costs: Iterable[Cost], inputs: CostInputs, keep: Symbol,
                    extra: Values | None = None) -> sympy.Expr:
    """The time of `costs` as an expression in `keep` alone: every other symbol takes its value,
    worker by worker, and each stage becomes the max over workers."""
    table = {s: v for s, v in _table(inputs, extra).items() if s != keep}
    p = inputs.workers
    subs_per_worker = [{s: sympy.Float(float(v[i])) for s, v in table.items()} for i in range(p)]
    total = ZERO
    for cost in costs:
        for stage in cost.stages:
            stage = sympy.sympify(stage)
            # evaluating Max here: with the numbers in, sympy drops the workers that cannot be the slowest,
            # which leaves the piecewise difference `crossover` solves small
            total += sympy.Max(*[stage.xreplace(sub) for sub in subs_per_worker])
    return total


def _active_piece(expr: sympy.Expr, at: Mapping[Symbol, float]) -> sympy.Expr:
    """Replace every Max/Min by the argument that wins at the point `at` (the linear piece there)."""
    if not expr.args:
        return expr
    args = [_active_piece(a, at) for a in expr.args]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        vals = [float(a.evalf(subs=dict(at))) for a in args]
        pick = int(np.argmax(vals)) if isinstance(expr, sympy.Max) else int(np.argmin(vals))
        return args[pick]
    return expr.func(*args)


def crossover(first: Sequence[Cost], second: Sequence[Cost], symbol: Symbol, inputs: CostInputs,
              lo: float, hi: float, *, extra_first: Values | None = None, extra_second: Values | None = None,
              samples: int = 256) -> list[Crossover]:
    """Values of `symbol` in [lo, hi] where the two cost sequences predict the same time.

    For example the bandwidth (`bw`) at which DepComm's time equals
    DepCache's, or the hidden width (`d(1)`) below which pushpull stays
    best. The time difference is piecewise (maxima over workers and over
    overlapped terms): it is sampled on a log grid to bracket each sign
    change, and on each bracket sympy solves the piece active there exactly;
    a root that falls outside its piece is refined by bisection instead.
    """
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")
    diff = (total_time_expr(first, inputs, symbol, extra_first)
            - total_time_expr(second, inputs, symbol, extra_second))
    if symbol not in diff.free_symbols:
        return []
    fn = sympy.lambdify([symbol], diff, modules="numpy")
    grid = np.geomspace(lo, hi, samples)
    vals = np.array([float(fn(x)) for x in grid])
    roots: list[float] = []
    for i in range(samples):
        if vals[i] == 0.0:
            roots.append(float(grid[i]))
        elif i + 1 < samples and vals[i] * vals[i + 1] < 0:
            roots.append(_solve_bracket(diff, fn, symbol, float(grid[i]), float(grid[i + 1])))
    out: list[Crossover] = []
    for root in roots:
        below, above = float(fn(max(lo, root * (1 - 1e-6)))), float(fn(min(hi, root * (1 + 1e-6))))
        piece = _active_piece(diff, {symbol: root})
        out.append(Crossover(symbol, root, sympy.Eq(piece, 0), above < 0 or (above == 0 and below > 0)))
    return out


def _solve_bracket(diff: sympy.Expr, fn: Callable[[float], float], symbol: Symbol, x0: float, x1: float) -> float:
    f0 = float(fn(x0))
    if f0 == 0.0:
        return x0
    mid = math.sqrt(x0 * x1)
    for _ in range(3):
        piece = _active_piece(diff, {symbol: mid})
        roots = [complex(r) for r in sympy.solve(sympy.Eq(piece, 0), symbol)]
        real = [r.real for r in roots if abs(r.imag) < 1e-12 and x0 <= r.real <= x1]
        if real:
            return min(real, key=lambda r: abs(float(fn(r))))
        # the piece changes inside the bracket: bisect once and try the half holding the sign change
        if (float(fn(mid)) > 0) == (f0 > 0):
            x0, f0 = mid, float(fn(mid))
        else:
            x1 = mid
        mid = math.sqrt(x0 * x1)
    lo_x, hi_x = x0, x1
    for _ in range(200):
        mid = 0.5 * (lo_x + hi_x)
        if (float(fn(mid)) > 0) == (f0 > 0):
            lo_x = mid
        else:
            hi_x = mid
    return 0.5 * (lo_x + hi_x)


# --- bridges to the Hybrid greedy ---------------------------------------------------------------


def hybrid_values(start: int, comm_received: np.ndarray, comm_sent_rows: np.ndarray, rec_rows: np.ndarray,
                  rec_edges: np.ndarray, replicated: np.ndarray) -> dict[Symbol, np.ndarray]:
    """Symbol values of a Hybrid selection for `hybrid(start, ...)`: arrays [workers, layers] (layer
    m of the segment is model layer start+m) and the replicated input rows [workers]."""
    out: dict[Symbol, np.ndarray] = {RX: np.asarray(replicated, np.float64)}
    for m in range(np.shape(comm_received)[1]):
        layer = start + m
        out[comm_rows(layer)] = np.asarray(comm_received, np.float64)[:, m]
        out[comm_sent(layer)] = np.asarray(comm_sent_rows, np.float64)[:, m]
        out[recompute_rows(layer)] = np.asarray(rec_rows, np.float64)[:, m]
        out[recompute_edges(layer)] = np.asarray(rec_edges, np.float64)[:, m]
    return out


def hybrid_unit_costs(inputs: CostInputs, start: int, shapes: Sequence[LayerShape],
                      fetch_input: bool | None = None) -> dict[str, Any]:
    """NeutronStar's unit costs for the greedy, from the same formulas as the strategies above.

    Returns t_v, t_e, t_c per layer of the segment (seconds per recomputed
    row, per recomputed edge, per communicated row; forward plus backward),
    t_x (seconds per replicated input row: 0 at layer 0, whose input is
    static), row_bytes per level (bytes of one cached row of h^start ..
    h^end) and edge_bytes, plus own_time [workers, layers]: each worker's
    work on its own rows. When the profile carries measured T_v, T_e, T_c
    they enter through its effective rates.
    """
    table = _table(inputs, None)

    def scalar(expr: sympy.Expr) -> float:
        return float(compile_expr(expr)(table, inputs.workers)[0])

    k = len(shapes)
    t_v, t_e, t_c, own = [], [], [], []
    for m, shape in enumerate(shapes):
        per_vertex, per_edge, per_row, own_rows = _unit_formulas(start + m, shape)
        t_v.append(scalar(per_vertex))
        t_e.append(scalar(per_edge))
        t_c.append(scalar(per_row))
        own.append(compile_expr(own_rows)(table, inputs.workers))
    fetch = fetch_input if fetch_input is not None else start > 0
    t_x = scalar(d(start) * b / bw * (2 if shapes[0].input_grad else 1)) if fetch else 0.0
    row_bytes = [scalar(d(start) * b)] + [scalar(shapes[m].out_width(start + m) * b) for m in range(k)]
    edge_bytes = float(inputs.index_bytes + inputs.bytes_per_element)
    return {"t_v": np.array(t_v), "t_e": np.array(t_e), "t_c": np.array(t_c), "t_x": t_x,
            "row_bytes": np.array(row_bytes), "edge_bytes": edge_bytes, "own_time": np.stack(own, axis=1)}


@functools.lru_cache(maxsize=4096)
def _unit_formulas(layer: int, shape: LayerShape) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr, sympy.Expr]:
    """`hybrid_unit_costs`' formulas for one layer: seconds per recomputed row, per recomputed edge and
    per communicated row, and the worker's time on its own rows (cached: every span shares them)."""
    return (compute_forward(layer, shape, 1, 0) + compute_backward(layer, shape, 1, 0),
            compute_forward(layer, shape, 0, 1) + compute_backward(layer, shape, 0, 1),
            shape.width(layer) * b / bw * (2 if shape.exchange_grad else 1),
            compute_forward(layer, shape, V, E) + compute_backward(layer, shape, V, E))
