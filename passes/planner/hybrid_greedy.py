"""NeutronStar's Algorithm 4: per worker and layer, cache or communicate each remote dependency.

Why this module exists: a Hybrid segment (docs/design.md section 1, NeutronStar)
splits every worker's remote dependencies into R, recomputed locally from a
replicated subtree, and C, fetched every epoch. Which split is best depends
on each dependency's subtree, the layer widths, the network and the memory
left; NeutronStar decides with a greedy, reproduced here as a pure function
of plain arrays so the planner (and its tests) can run it on any statistics.

Terms. A dependency (l, v) of worker i: to compute layer l for its own
vertices, i needs row v of h^l, and v is owned elsewhere. Communicating it
costs t_c = T_c(l) (one row each way, forward and backward). Caching it means
computing h^l_v locally, which needs v's in-neighbourhood at every layer
below l, down to the segment's input: caching a layer-l dependency
replicates its subtree down to layer 0 (of the segment). Its recompute cost
is t_r = sum_k (T_v(k)·rows_k + T_e(k)·edges_k) + T_x·inputs, its memory the
bytes of those rows, edges and inputs.

Algorithm 4 as docs/design.md describes it, and how this module reads it:
  for each worker, with a memory budget S shared by all its layers,
  for each layer l = 0, 1, ... (lowest first: lower layers have the smaller
  subtrees, so the shared budget goes first to the cheapest caches),
    put the layer's dependencies in a min-queue on t_r (ties: vertex id);
    pop while the head's t_r < t_c, strictly, and its memory fits in what is
    left of S: cache it; the first dependency that fails either test stops
    the layer, and it and everything still queued is communicated.
Because t_c is the same for every dependency of a layer (one row of h^l), a
dependency popped after one with t_r >= t_c would fail too, so stopping is
the paper's "cache while t_r < t_c". Popping a min-queue to exhaustion is a
sort; `greedy_worker` sorts with numpy (stable on (t_r, vertex)), which is
the same sequence of pops and fast for millions of dependencies.

Subtrees are costed per dependency, as the paper does: vertices shared by
two cached subtrees are counted twice, so the predicted recompute is an
upper bound on what the runtime must compute.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Dependencies:
    """The remote dependencies of one worker in a segment of L layers: one entry per (layer, vertex).

    layer[d]: the segment layer (0..L-1) that reads the remote row.
    vertex[d]: the row's global vertex id (orders ties in the queue).
    sub_rows[d, k]: rows of h^{k+1} to compute at layer k if d is cached
        (zero for k >= layer[d]; at k = layer[d]-1 it counts v itself).
    sub_edges[d, k]: edges to aggregate at layer k if d is cached.
    sub_inputs[d]: rows of the segment's input h^0 the subtree needs (for a
        layer-0 dependency: v's own input row).
    owner[d]: the worker owning v, to count the rows each worker sends for
        the communicated dependencies; None when unknown (sends are then
        taken equal to receives).
    """

    layer: np.ndarray
    vertex: np.ndarray
    sub_rows: np.ndarray
    sub_edges: np.ndarray
    sub_inputs: np.ndarray
    owner: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.layer)
        if np.shape(self.vertex) != (n,) or np.shape(self.sub_inputs) != (n,):
            raise ValueError("Dependencies: layer, vertex and sub_inputs need one entry per dependency")
        if np.ndim(self.sub_rows) != 2 or np.shape(self.sub_rows)[0] != n or \
                np.shape(self.sub_edges) != np.shape(self.sub_rows):
            raise ValueError("Dependencies: sub_rows and sub_edges must both be [dependencies, layers]")
        if self.owner is not None and np.shape(self.owner) != (n,):
            raise ValueError("Dependencies: owner needs one entry per dependency")

    @property
    def layers(self) -> int:
        return int(np.shape(self.sub_rows)[1])

    def __len__(self) -> int:
        return len(self.layer)


def dependencies_from_stats(stats: Any, part: int, layers: int) -> Dependencies:
    """Part `part`'s dependencies for a segment of `layers` layers, from `partition.stats.PartStats`.

    Every remote in-neighbour v of the part is a dependency at each layer m
    of the segment (m = 0..layers-1, relative to the segment's first layer).
    PartStats gives, per dependency, the edges of v's unfolded in-tree of
    depth k (`dep_subtree_edges[:, k]`, walks of length 1..k ending at v), so
    the walks of length exactly j are its differences, w_0 = 1. Caching
    (m, v) computes the tree level by level: at layer k < m the rows at
    distance m-1-k from v (w_{m-1-k}), aggregating the edges into them
    (w_{m-k}), from w_m input rows. Owners follow PartStats' order (by owner,
    then id), so they are read off `send_matrix[:, part]`. Like PartStats'
    trees, rows the part owns anyway are counted too.
    """
    lo, hi = int(stats.dep_ptr[part]), int(stats.dep_ptr[part + 1])
    ids = np.asarray(stats.dep_ids[lo:hi], dtype=np.int64)
    tree = np.asarray(stats.dep_subtree_edges[lo:hi], dtype=np.float64)
    if tree.shape[1] < layers:
        raise ValueError(f"PartStats holds in-trees of depth < {tree.shape[1]}; a {layers}-layer segment "
                         f"needs depth {layers - 1}: compute the statistics for at least {layers} layers")
    n = len(ids)
    walks = np.ones((n, layers))  # w_0 .. w_{layers-1}: the deepest dependency reads h^{layers-1}
    walks[:, 1:] = np.diff(tree[:, :layers], axis=1)
    owner_counts = np.asarray(stats.send_matrix, dtype=np.int64)[:, part]
    owners = np.repeat(np.arange(len(owner_counts)), owner_counts)
    layer = np.repeat(np.arange(layers), n)
    rows = np.zeros((layers * n, layers))
    edges = np.zeros((layers * n, layers))
    inputs = np.zeros(layers * n)
    for m in range(layers):
        block = slice(m * n, (m + 1) * n)
        for k in range(m):
            rows[block, k] = walks[:, m - 1 - k]
            edges[block, k] = walks[:, m - k]
        inputs[block] = walks[:, m]
    return Dependencies(layer, np.tile(ids, layers), rows, edges, inputs,
                        owner=np.tile(owners, layers) if len(owners) == n else None)


@dataclass(frozen=True)
class UnitCosts:
    """NeutronStar's constants for one segment (`gnnc.passes.cost.neutronstar.hybrid_unit_costs` derives them).

    t_v[k], t_e[k]: seconds per row computed / edge aggregated at layer k
    (forward plus backward). t_c[k]: seconds to communicate one row of h^k
    (forward plus backward). t_x: seconds per replicated input row (0 when
    the input is static). row_bytes[k]: bytes of one cached row of h^k,
    k = 0..L. edge_bytes: bytes per cached edge.
    """

    t_v: np.ndarray
    t_e: np.ndarray
    t_c: np.ndarray
    t_x: float
    row_bytes: np.ndarray
    edge_bytes: float


def recompute_cost(deps: Dependencies, costs: UnitCosts) -> np.ndarray:
    """t_r of every dependency: its subtree's rows and edges at their layers' unit costs, plus its inputs."""
    rows = np.asarray(deps.sub_rows, np.float64)
    edges = np.asarray(deps.sub_edges, np.float64)
    return rows @ np.asarray(costs.t_v, np.float64) + edges @ np.asarray(costs.t_e, np.float64) \
        + np.asarray(deps.sub_inputs, np.float64) * costs.t_x


def communicate_cost(deps: Dependencies, costs: UnitCosts) -> np.ndarray:
    """t_c of every dependency: one row of its layer, there and back."""
    return np.asarray(costs.t_c, np.float64)[np.asarray(deps.layer, np.int64)]


def cache_memory(deps: Dependencies, costs: UnitCosts) -> np.ndarray:
    """Bytes caching each dependency takes: its input rows, computed rows and edges."""
    row_bytes = np.asarray(costs.row_bytes, np.float64)
    return (np.asarray(deps.sub_inputs, np.float64) * row_bytes[0]
            + np.asarray(deps.sub_rows, np.float64) @ row_bytes[1:deps.layers + 1]
            + np.asarray(deps.sub_edges, np.float64).sum(axis=1) * costs.edge_bytes)


def greedy_worker(t_r: np.ndarray, t_c: np.ndarray, memory: np.ndarray, layer: np.ndarray,
                  vertex: np.ndarray, budget: float, layers: int) -> np.ndarray:
    """Algorithm 4 for one worker: a boolean mask, True for the cached dependencies.

    Layers in increasing order share `budget` bytes. Within a layer the
    dependencies are taken in min-queue order of (t_r, vertex); caching
    continues while t_r < t_c (strictly) and the dependency's memory fits in
    what is left; the first that fails ends the layer.
    """
    cached = np.zeros(len(t_r), dtype=bool)
    left = float(budget)
    for lyr in range(layers):
        idx = np.nonzero(np.asarray(layer) == lyr)[0]
        if len(idx) == 0:
            continue
        order = idx[np.lexsort((np.asarray(vertex)[idx], np.asarray(t_r)[idx]))]  # the queue's pop order
        worth = np.asarray(t_r)[order] < np.asarray(t_c)[order]
        stop = int(np.argmin(worth)) if not worth.all() else len(order)
        fits = np.cumsum(np.asarray(memory, np.float64)[order]) <= left
        stop = min(stop, int(np.argmin(fits)) if not fits.all() else len(order))
        cached[order[:stop]] = True
        left -= float(np.asarray(memory, np.float64)[order[:stop]].sum())
    return cached


@dataclass(frozen=True)
class HybridResult:
    """A selection and its prediction.

    cached: per worker, a mask over its dependencies (True: in R).
    time: the predicted segment time, sum over layers of the slowest worker.
    layer_times[i, k]: worker i's time at layer k.
    memory[i]: bytes of worker i's caches.
    comm_received / comm_sent[i, k]: rows of h^k worker i receives / sends.
    recompute_rows / recompute_edges[i, k]: work added at layer k by caching.
    replicated_inputs[i]: rows of the segment's input worker i replicates.
    source: "greedy" (Algorithm 4's selection) or, from `choose`, the pure
        selection that predicted less: "communicate-all" or "cache-all".
    """

    cached: tuple[np.ndarray, ...]
    time: float
    layer_times: np.ndarray = field(repr=False)
    memory: np.ndarray = field(repr=False)
    comm_received: np.ndarray = field(repr=False)
    comm_sent: np.ndarray = field(repr=False)
    recompute_rows: np.ndarray = field(repr=False)
    recompute_edges: np.ndarray = field(repr=False)
    replicated_inputs: np.ndarray = field(repr=False)
    source: str = "greedy"


def predict(deps: Sequence[Dependencies], costs: UnitCosts, own_time: np.ndarray,
            cached: Sequence[np.ndarray], overlap: bool = True, source: str = "greedy") -> HybridResult:
    """The time, memory and traffic of a given selection (the greedy's own cost model).

    Worker i at layer k spends own_time[i, k] on its own rows, then the
    larger (overlap=True: cached work runs while rows are in flight) or the
    sum of: communicating its C dependencies of layer k, and recomputing
    the subtree rows of its R dependencies that belong to layer k (their
    replicated inputs are charged to the first layer). A layer lasts as long
    as its slowest worker.
    """
    own = np.asarray(own_time, np.float64)
    p, layers = own.shape
    if len(deps) != p or len(cached) != p:
        raise ValueError(f"own_time has {p} workers, but {len(deps)} dependency sets and {len(cached)} masks")
    t_v, t_e, t_c = (np.asarray(x, np.float64) for x in (costs.t_v, costs.t_e, costs.t_c))
    comm_t = np.zeros((p, layers))
    rec_t = np.zeros((p, layers))
    received = np.zeros((p, layers))
    sent = np.zeros((p, layers))
    rec_rows = np.zeros((p, layers))
    rec_edges = np.zeros((p, layers))
    replicated = np.zeros(p)
    memory = np.zeros(p)
    owners_known = all(dep.owner is not None for dep in deps)
    for i, (dep, mask) in enumerate(zip(deps, cached)):
        mask = np.asarray(mask, dtype=bool)
        if dep.layers != layers:
            raise ValueError(f"worker {i}: dependencies span {dep.layers} layers, own_time {layers}")
        lyr = np.asarray(dep.layer, np.int64)
        comm = ~mask
        received[i] = np.bincount(lyr[comm], minlength=layers)[:layers]
        if owners_known:
            owner = np.asarray(dep.owner, np.int64)
            np.add.at(sent, (owner[comm], lyr[comm]), 1.0)
        comm_t[i] = received[i] * t_c
        rec_rows[i] = np.asarray(dep.sub_rows, np.float64)[mask].sum(axis=0)
        rec_edges[i] = np.asarray(dep.sub_edges, np.float64)[mask].sum(axis=0)
        replicated[i] = float(np.asarray(dep.sub_inputs, np.float64)[mask].sum())
        rec_t[i] = rec_rows[i] * t_v + rec_edges[i] * t_e
        rec_t[i, 0] += replicated[i] * costs.t_x
        memory[i] = float(cache_memory(dep, costs)[mask].sum())
    if not owners_known:
        sent = received.copy()
    layer_times = own + (np.maximum(comm_t, rec_t) if overlap else comm_t + rec_t)
    time = float(layer_times.max(axis=0).sum()) if p else 0.0
    return HybridResult(tuple(np.asarray(m, dtype=bool) for m in cached), time, layer_times, memory, received,
                        sent, rec_rows, rec_edges, replicated, source)


def select(deps: Sequence[Dependencies], costs: UnitCosts, own_time: np.ndarray,
           memory_cap: float | Sequence[float], overlap: bool = True) -> HybridResult:
    """Algorithm 4 on every worker, and the prediction of its selection."""
    p = len(deps)
    caps = np.broadcast_to(np.asarray(memory_cap, np.float64), (p,))
    masks = []
    for i, dep in enumerate(deps):
        masks.append(greedy_worker(recompute_cost(dep, costs), communicate_cost(dep, costs),
                                   cache_memory(dep, costs), dep.layer, dep.vertex, float(caps[i]), dep.layers))
    return predict(deps, costs, own_time, masks, overlap, "greedy")


def choose(deps: Sequence[Dependencies], costs: UnitCosts, own_time: np.ndarray,
           memory_cap: float | Sequence[float], overlap: bool = True) -> HybridResult:
    """Algorithm 4's selection, unless a pure selection predicts less time.

    Beyond the paper: the greedy decides worker by worker, but a layer lasts
    as long as its slowest worker, so moving one worker's work from a later
    layer to an earlier one can lengthen a layer another worker already made
    the longest. The planner never wants a Hybrid worse than DepComm (all
    communicated) or DepCache (all cached, when it fits every worker's cap),
    so those are predicted too and the fastest wins (ties: the greedy's).
    """
    p = len(deps)
    caps = np.broadcast_to(np.asarray(memory_cap, np.float64), (p,))
    best = select(deps, costs, own_time, memory_cap, overlap)
    none = predict(deps, costs, own_time, [np.zeros(len(dep), bool) for dep in deps], overlap, "communicate-all")
    candidates = [none]
    everything = predict(deps, costs, own_time, [np.ones(len(dep), bool) for dep in deps], overlap, "cache-all")
    if bool(np.all(everything.memory <= caps)):
        candidates.append(everything)
    for cand in candidates:
        if cand.time < best.time:
            best = cand
    return best
