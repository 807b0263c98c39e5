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

Layers are numbered from 0: layer l reads h^l (h^0 = x, width d_l) and
writes h^{l+1} (width d_{l+1}). `LayerShape` carries what the IR knows about
a layer's ops (how many weight matrices, whether the dense map runs before
the aggregation, attention, whether its input needs a gradient).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import sympy
from sympy import Symbol

from gnnc.cluster import ClusterProfile
from gnnc.ir.expr import as_expr


def Max(*args: sympy.Expr) -> sympy.Expr:
    """max of cost terms, left as written: sympy's evaluating Max compares its arguments symbolically
    to drop dominated ones, which took most of the planning time of deep models and changes no value."""
    return sympy.Max(*args, evaluate=False)


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
E_in = Symbol("Ein_i", nonnegative=True)  # in-edges of the owned vertices with no remote in-neighbour

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
    overlap is assumed (every edge waits for the exchange). `inner_edges` (the
    in-edges of vertices with no remote in-neighbour: the work G3's bins can
    do before the halo arrives) likewise; None means none.
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
    inner_edges: np.ndarray | None = None

    def __post_init__(self) -> None:
        p = len(self.vertices)
        optional = tuple(k for k in ("remote_edges", "inner_edges") if getattr(self, k) is not None)
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
        if remote_edges is None:
            remote_edges = getattr(stats, "remote_edges", None)
        inner = getattr(stats, "inner_edges", None)
        return cls(np.asarray(stats.vertices, np.float64), np.asarray(stats.edges, np.float64),
                   np.asarray(stats.remote, np.float64), np.asarray(stats.send, np.float64), hv, he,
                   tuple(float(x) for x in dims), profile, tuple(float(h) for h in heads),
                   None if remote_edges is None else np.asarray(remote_edges, np.float64), bytes_per_element,
                   inner_edges=None if inner is None else np.asarray(inner, np.float64))

    @functools.cached_property
    def table(self) -> Mapping[Symbol, np.ndarray]:
        """`values()` with every value one float64 entry per worker: what compiled formulas read
        (made once: the planner evaluates thousands of formulas on the same inputs)."""
        return MappingProxyType(per_worker(self.values(), self.workers))

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
            E_in: np.zeros_like(edges) if self.inner_edges is None else np.asarray(self.inner_edges, np.float64),
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
            out |= as_expr(expr).free_symbols
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


def zero_cost(name: str) -> Cost:
    """A cost of nothing (a layout kept as it is, a boundary at the model's ends)."""
    return Cost(name, (), ZERO, ZERO)


def per_worker(values: Mapping[Symbol, Any], p: int) -> dict[Symbol, np.ndarray]:
    """Every value as one float64 entry per worker (scalars broadcast)."""
    return {k: (np.broadcast_to(np.asarray(v, np.float64), (p,)) if np.ndim(v) == 0 else np.asarray(v, np.float64))
            for k, v in values.items()}
