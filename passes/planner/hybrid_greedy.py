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

Two rules, hybrid_greedy.RULES; the planner uses DEFAULT_RULE, "paper".

"paper" (`paper_run`, `select_paper`): Algorithm 4 as NeutronStar (SIGMOD'22,
section 4.2) writes it, measured on the graph itself. Per worker, a memory
budget S shared by all layers and a replicated set V_rep (line 2), one set of
rows per level; for each layer l = 0, 1, ... (line 3): measure every
dependency's t_r with V_rep excluded (line 6: a vertex some cached subtree
replicated already costs nothing again), queue them on t_r (ties: vertex id),
and pop until the queue is empty (line 8), re-measuring the popped one
without V_rep (line 10); cache it when t_r < t_c, strictly (lines 11-12), and
add its subtree to V_rep (line 13); when the caches' size then exceeds S,
drop it and end the algorithm (lines 14-15): the layers not reached fetch
every dependency. The predicted recompute and memory are V_rep's, each row
counted once, which is what the runtime computes (gnnc.plan.rows); equation
3's mu, which the paper leaves open, is measured (`select_paper`). Subtrees
are the runtime's: the ball of the dependency expanded through vertices the
worker does not own (its own rows are computed anyway).

"walks" (`greedy_worker`, `select`): gnnc's earlier reading, kept for the
measurement in benchmarks/RESULTS-seeds.md ("NeutronStar Algorithm 4"). It
costs each dependency's subtree alone, as PartStats' unfolded in-trees
(walks: a vertex reached by two paths counts twice, and two cached subtrees
sharing a vertex count it twice: an upper bound on what the runtime
computes), pops while the head's t_r < t_c and its memory fits, and the first
dependency that fails either test ends the layer, not the algorithm.
Because t_c is the same for every dependency of a layer and its t_r never
changes, stopping at the first t_r >= t_c is its "cache while t_r < t_c";
popping a min-queue to exhaustion is a sort (numpy, stable on (t_r, vertex)),
fast for millions of dependencies.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np
import torch

from gnnc.graph import sorted_unique
from gnnc.parallel import map_processes
from gnnc.plan.distances import held_out_csr
from gnnc.plan.rows import MASK_WALK


@dataclass(frozen=True)
class Dependencies:
    """The remote dependencies of one worker in a segment of L layers: one entry per (layer, vertex), layer by
    layer (`layer` non-decreasing: a shorter segment's are the first entries, `dependencies_prefix`).

    layer[d]: the segment layer (0..L-1) that reads the remote row.
    vertex[d]: the row's global vertex id (orders ties in the queue).
    walks[j, i]: the in-walks of length i (0..L-1) ending at a vertex, w_0 = 1 (PartStats' unfolded in-trees
        level by level); walk[d]: the row of `walks` that is vertex[d]'s.
    owner[d]: the worker owning v, to count the rows each worker sends for
        the communicated dependencies; None when unknown (sends are then
        taken equal to receives).

    Caching d = (m, v) computes v's unfolded in-tree of depth m level by level: at layer k < m the
    w_{m-1-k} rows at distance m-1-k from v (k = m-1: v itself), aggregating the w_{m-k} edges into them, from
    w_m rows of the segment's input. So a subtree is a row of `walks`, read backwards: `subtree_tables` gives
    those counts as [dependencies, L] tables (sub_rows[d, k], sub_edges[d, k], zero for k >= layer[d]) a block
    of dependencies at a time, `sub_inputs` the inputs. They are not held whole: L x n x L each, 145 MB per
    worker for GCNII x32 on the 89,000-vertex SBM, whose select-hybrid spent 3.8 s building and zeroing them.
    """

    layer: np.ndarray
    vertex: np.ndarray
    walks: np.ndarray
    walk: np.ndarray
    owner: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.layer)
        if np.shape(self.vertex) != (n,) or np.shape(self.walk) != (n,):
            raise ValueError("Dependencies: layer, vertex and walk need one entry per dependency")
        if np.ndim(self.walks) != 2 or np.shape(self.walks)[1] < 1:
            raise ValueError("Dependencies: walks must be [vertices, layers], w_0 .. w_{L-1}")
        layer = np.asarray(self.layer)
        # layer by layer: each entry's layer not below the one before, compared with its neighbour (np.diff's int64
        # copy took twice as long: the products compile's planner checks 24 of up to 3.6M entries, serially)
        if n and (bool(np.any(layer[1:] < layer[:-1])) or int(np.min(layer)) < 0 or
                  int(np.max(layer)) >= self.layers):
            raise ValueError(f"Dependencies: layers 0..{self.layers - 1}, layer by layer")
        if n and (int(np.min(self.walk)) < 0 or int(np.max(self.walk)) >= len(self.walks)):
            raise ValueError(f"Dependencies: walk indexes the {len(self.walks)} rows of walks")
        if self.owner is not None and np.shape(self.owner) != (n,):
            raise ValueError("Dependencies: owner needs one entry per dependency")

    @property
    def layers(self) -> int:
        return int(np.shape(self.walks)[1])

    @property
    def sub_inputs(self) -> np.ndarray:
        """Rows of the segment's input h^0 each subtree needs, w_m (a layer-0 dependency: v's own input row)."""
        return np.asarray(self.walks, np.float64)[self.walk, self.layer]

    def __len__(self) -> int:
        return len(self.layer)


# Elements of a block of `subtree_tables` at most (2 MB: 8,192 rows of 32 layers): OpenBLAS computes a gemv of
# this size on one thread; a larger one on two, which wait for each other on a loaded machine (load 4 on 2 cores:
# a [17,700 x 32] product 17 ms on two threads, 0.2 ms on one).
TABLE_ELEMENTS = 1 << 18


def subtree_tables(deps: Dependencies) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """The subtree tables of `deps` (see Dependencies), a block of consecutive dependencies at a time: (lo, hi,
    sub_rows[lo:hi], sub_edges[lo:hi], sub_inputs[lo:hi]), read-only, valid until the next block is asked for.

    Every block starts at a multiple of 64 rows and the last ends at the end, so that a block's product with a
    vector rounds each row as one product of the whole table does: OpenBLAS's gemv takes a call's rows 4 at a
    time, and its last rows beyond a multiple of 4 by another kernel, which rounds otherwise. A row's t_r and
    memory are then the floats the whole tables gave (tests/test_hybrid_greedy_walks.py), and with them the
    queue's order and ties. Where a layer's dependencies read consecutive rows of `walks`
    (`dependencies_from_stats`'), a block is a view, not a copy: with each row of walks reversed and followed by
    zeros, a layer-m subtree's rows and edges are L consecutive columns of it (the rows' from L - m on).
    """
    layers, n = deps.layers, len(deps)
    if not n:
        return
    walks = np.asarray(deps.walks, np.float64)
    layer, walk = np.asarray(deps.layer, np.int64), np.asarray(deps.walk, np.int64)
    # row j: w_{L-1} .. w_0, then L zeros: a layer-m dependency's sub_rows are its columns L-m .. 2L-m-1
    # (w_{m-1} .. w_0, zeros), its sub_inputs column L-1-m (w_m); of edges_of (w_{L-1} .. w_1, zeros), its
    # sub_edges columns L-1-m .. 2L-2-m (w_m .. w_1, zeros)
    rows_of = np.zeros((len(walks), 2 * layers))
    rows_of[:, :layers] = walks[:, ::-1]
    edges_of = np.zeros((len(walks), 2 * layers))
    edges_of[:, :layers - 1] = walks[:, :0:-1]
    rows_of.flags.writeable = edges_of.flags.writeable = False  # the blocks are views of them

    def of(m: int, j: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (rows_of[j, layers - m:2 * layers - m], edges_of[j, layers - 1 - m:2 * layers - 1 - m],
                rows_of[j, layers - 1 - m])

    bounds = np.searchsorted(layer, np.arange(layers + 1))  # layer m's dependencies: bounds[m]..bounds[m + 1]
    step = max(64, TABLE_ELEMENTS // layers // 64 * 64)
    buffers: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    lo = 0
    while lo < n:
        m = int(layer[lo])
        end = int(bounds[m + 1])
        hi = min(end if end == n else lo + (end - lo) // 64 * 64, lo + step)
        if hi > lo and bool(np.all(np.diff(walk[lo:hi]) == 1)):  # layer m's run, to a multiple of 64 rows (or
            # to the end), on consecutive rows of walks: a view
            yield (lo, hi, *of(m, slice(int(walk[lo]), int(walk[lo]) + hi - lo)))
        else:  # copied: the 64 rows across the end of a run, or `step` rows of runs that are not views
            hi = min(n, lo + (64 if hi == lo else step))
            if buffers is None:
                buffers = (np.empty((step, layers)), np.empty((step, layers)), np.empty(step))
            for k in range(m, int(layer[hi - 1]) + 1):
                a, b = max(lo, int(bounds[k])), min(hi, int(bounds[k + 1]))
                for buffer, part in zip(buffers, of(k, walk[a:b])):
                    buffer[a - lo:b - lo] = part
            yield (lo, hi, *(buffer[:hi - lo] for buffer in buffers))
        lo = hi


def dependencies_from_stats(stats: Any, part: int, layers: int) -> Dependencies:
    """Part `part`'s dependencies for a segment of `layers` layers, from `partition.stats.PartStats`.

    Every remote in-neighbour v of the part is a dependency at each layer m
    of the segment (m = 0..layers-1, relative to the segment's first layer).
    PartStats gives, per dependency, the edges of v's unfolded in-tree of
    depth k (`dep_subtree_edges[:, k]`, walks of length 1..k ending at v), so
    the walks of length exactly j are its differences, w_0 = 1: one row of
    `Dependencies.walks` per vertex, shared by its entries at every layer. Owners follow PartStats' order (by
    owner, then id), so they are read off `send_matrix[:, part]`. Like PartStats' trees, rows the part owns
    anyway are counted too.
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
    owner = np.tile(owners, layers) if len(owners) == n else None
    walk = np.tile(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), layers)  # int32: 4 bytes per dependency
    return Dependencies(np.repeat(np.arange(layers), n), np.tile(ids, layers), walks, walk, owner=owner)


def dependencies_prefix(deps: Dependencies, layers: int) -> Dependencies:
    """The dependencies of a segment's first `layers` layers out of `dependencies_from_stats`' for a longer one
    from the same start: its entries are layer by layer and a layer's subtree does not depend on the layers
    above, so the shorter segment's are the first entries and the first `layers` walks. Views of `deps`, not
    copies (copying a deep model's subtree columns per span was most of its compile: GCNII x32 on an
    89,000-vertex SBM, 22 of 92 s)."""
    if layers == deps.layers:
        return deps
    n = int(np.searchsorted(deps.layer, layers))
    return Dependencies(deps.layer[:n], deps.vertex[:n], deps.walks[:, :layers], deps.walk[:n],
                        owner=None if deps.owner is None else deps.owner[:n])


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


def recompute_cost(deps: Dependencies, costs: UnitCosts, where: np.ndarray | None = None) -> np.ndarray:
    """t_r of every dependency: its subtree's rows and edges at their layers' unit costs, plus its inputs. With
    `where` (a mask), t_r of those dependencies only, in order: the blocks holding none are not computed
    (select_paper's mu reads the cached ones', 6% of GCNII x32's on the SBM, all in its first 3 layers)."""
    t_v, t_e = np.asarray(costs.t_v, np.float64), np.asarray(costs.t_e, np.float64)
    where = None if where is None else np.asarray(where, dtype=bool)
    out = np.zeros(len(deps))
    for lo, hi, rows, edges, inputs in subtree_tables(deps):
        if where is None or where[lo:hi].any():
            out[lo:hi] = rows @ t_v + edges @ t_e + inputs * costs.t_x
    return out if where is None else out[where]


def communicate_cost(deps: Dependencies, costs: UnitCosts) -> np.ndarray:
    """t_c of every dependency: one row of its layer, there and back."""
    return np.asarray(costs.t_c, np.float64)[np.asarray(deps.layer, np.int64)]


def cache_memory(deps: Dependencies, costs: UnitCosts) -> np.ndarray:
    """Bytes caching each dependency takes: its input rows, computed rows and edges."""
    row_bytes = np.asarray(costs.row_bytes, np.float64)
    out = np.empty(len(deps))
    for lo, hi, rows, edges, inputs in subtree_tables(deps):
        out[lo:hi] = inputs * row_bytes[0] + rows @ row_bytes[1:deps.layers + 1] + edges.sum(axis=1) * costs.edge_bytes
    return out


def subtree_sums(deps: Dependencies, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sub_rows and sub_edges (Dependencies) summed over the dependencies `mask` selects, per layer: in the
    dependencies' order, each block's rows added on to the sum so far (numpy sums a table's rows one after
    another), so the sums are the same floats as one sum of the whole tables' masked rows."""
    mask = np.asarray(mask, dtype=bool)
    rows_sum, edges_sum = np.zeros(deps.layers), np.zeros(deps.layers)
    for lo, hi, rows, edges, _ in subtree_tables(deps):
        sel = mask[lo:hi]
        if sel.any():
            rows_sum = np.concatenate((rows_sum[None], rows[sel])).sum(axis=0)
            edges_sum = np.concatenate((edges_sum[None], edges[sel])).sum(axis=0)
    return rows_sum, edges_sum


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

    cached: per worker, a mask over its dependencies (True: in R); empty where the planner counted a span's
        rows without them (select_paper_prefix, communicate_all).
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
    mu: np.ndarray | None = field(default=None, repr=False)  # per worker, equation 3's factor (select_paper)


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
        if owners_known:  # a count per (owner, layer): bincount, not np.add.at's unbuffered loop (seconds)
            owner = np.asarray(dep.owner, np.int64)[comm]
            sent += np.bincount(owner * layers + lyr[comm], minlength=p * layers)[:p * layers].reshape(p, layers)
        comm_t[i] = received[i] * t_c
        if not mask.any():  # nothing cached: no recompute, no memory (the zeros the sums below would give)
            continue
        rec_rows[i], rec_edges[i] = subtree_sums(dep, mask)
        replicated[i] = float(dep.sub_inputs[mask].sum())
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


# --- Algorithm 4 as NeutronStar writes it ------------------------------------------------------------------
# The rule above ("walks") costs each dependency's subtree alone, counted as unfolded walks, and ends a layer at
# its first refusal. NeutronStar's Algorithm 4 (section 4.2) keeps a replicated set V_rep and measures every
# subtree without it (lines 2, 6, 10, 13), keeps popping after a refusal (line 8: while the queue is not empty),
# and when the caches outgrow the memory S it drops the dependency and returns (lines 14-15): the layers not yet
# reached fetch every dependency. `select_paper` runs that on the graph itself.

RULES = ("paper", "walks")  # "paper": select_paper, Algorithm 4 as written; "walks": select, per-dependency trees
DEFAULT_RULE = "paper"


@dataclass(frozen=True)
class InTrees:
    """What one worker's subtrees are measured on: the segment's in-edges (CSR by destination, the view the
    statistics used) and the vertices the worker owns (computed anyway: never redundant, never expanded)."""

    indptr: np.ndarray
    indices: np.ndarray
    owned: np.ndarray  # bool [N]
    # the same edges by source (the in-CSR's transpose), where the graph holds one (a store maps it): `_expand`
    # reads a hop from the sources' side when they hold fewer edges; None: by destination only
    out_indptr: np.ndarray | None = None
    out_indices: np.ndarray | None = None
    # `in_degree` given, read-only: the workers of one graph share one array (`workers_trees`)
    degrees: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def num_nodes(self) -> int:
        return len(self.owned)

    @cached_property
    def in_degree(self) -> np.ndarray:
        """Read-only, made once (or given): every measure and run read it (np.diff of the whole CSR each time was
        ~3% of the products compile's passes, issue 34)."""
        if self.degrees is not None:
            return self.degrees
        deg = np.diff(self.indptr)
        deg.flags.writeable = False
        return deg


def workers_trees(graph: Any, view: str, parts: np.ndarray, world: int) -> list[InTrees]:
    """Every worker's `in_trees`, all reading one in-degree array (one per worker was 8 x N int64 beside the
    passes' peak: +0.1 GiB at ogbn-products' size)."""
    trees = [in_trees(graph, view, parts, 0)] if world else []
    return trees + [in_trees(graph, view, parts, r, trees[0].in_degree) for r in range(1, world)]


def in_trees(graph: Any, view: str, parts: np.ndarray, part: int, degrees: np.ndarray | None = None) -> InTrees:
    """`part`'s InTrees on `graph`'s edge view `view` (gnnc.graph.Graph.csr); `degrees`: its in-degrees, read-only,
    when another worker's InTrees of the same view made them."""
    csr = graph.csr(view)
    out = held_out_csr(graph) if view == "plain" else None  # the store's transpose is of the plain view's CSR
    if out is not None and (out.indptr.dtype != torch.int64 or out.indices.dtype != torch.int64):
        out = None  # read as it is mapped, never copied to int64 per worker (8 copies of the edges)
    return InTrees(np.asarray(csr.indptr, dtype=np.int64), np.asarray(csr.indices, dtype=np.int64),
                   np.asarray(parts) == part, None if out is None else np.asarray(out.indptr, dtype=np.int64),
                   None if out is None else np.asarray(out.indices, dtype=np.int64), degrees)


@dataclass(frozen=True)
class Replicated:
    """A worker's V_rep after Algorithm 4: per level k = 0..L, the non-owned vertices whose h^k it holds (level
    0: input rows), with the edges aggregated into them, their cost and memory, and mu (equation 3's factor)."""

    rows: np.ndarray  # [L + 1] vertices per level
    edges: np.ndarray  # [L + 1] in-edges of those vertices (level 0's are not computed)
    memory: float  # bytes of the caches (line 14's size)
    time: float  # seconds to recompute them all once


def _expand(trees: InTrees, dep: np.ndarray, vtx: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """Every (dep, in-neighbour) pair of the (dep, vertex) pairs, the pairs themselves included, but those whose
    vertex is `excluded` (bool [N]): their keys dep * N + vertex, sorted, each once. Excluded before the pairs
    are joined and sorted (a deep model's layer expands ~200,000 pairs per worker on the 89,000-vertex SBM).

    The in-neighbours are read off the CSR and masked, and only those kept are joined to their pair's dep (its
    row found by a search of the kept ones' positions): a layer's first hop from its dependencies reads most of
    the graph's in-edges and keeps few (the products-like R-MAT at 0.05: 4.3M read, 4% kept, per worker and
    start). Pairs of distinct vertices holding more than gnnc.plan.rows.MASK_WALK of the edges read their
    entries through a mask over every entry (by vertex id: the keys are sorted anyway) instead of building
    their positions (issue 34)."""
    n = trees.num_nodes
    indptr, indices = trees.indptr, trees.indices
    lo = indptr[vtx]
    counts = indptr[vtx + 1] - lo
    total = int(counts.sum())
    keys = [(dep * n + vtx)[~excluded[vtx]]]  # each key made whole, then masked once (not each half masked)
    if total > n and trees.out_indptr is not None and _by_sources(trees, dep, vtx, excluded, keys, total):
        return sorted_unique(np.concatenate(keys))
    if total:
        edges = int(indptr[-1])
        held = None
        if total > MASK_WALK * edges:
            held = np.zeros(n, dtype=bool)
            held[vtx] = True
            if int(np.count_nonzero(held)) != len(vtx):  # a vertex in two pairs: by positions
                held = None
        if held is not None:
            by_id = np.argsort(vtx, kind="stable")  # the pairs in the CSR's row order
            dep, counts = dep[by_id], counts[by_id]
            src = indices[:edges][np.repeat(held, np.diff(indptr))]
        else:
            starts = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
            src = indices[starts + np.arange(total)]
        kept = np.flatnonzero(~excluded[src])
        pair = np.searchsorted(np.cumsum(counts), kept, side="right")  # the pair each kept entry is of
        keys.append(dep[pair] * n + src[kept])
    return sorted_unique(np.concatenate(keys))


def _by_sources(trees: InTrees, dep: np.ndarray, vtx: np.ndarray, excluded: np.ndarray, keys: list[np.ndarray],
                total: int) -> bool:
    """`_expand`'s in-neighbour pairs read from the sources' side, appended to `keys`, where the pairs' vertices
    are distinct and the vertices not `excluded` have fewer out-edges than they have in-edges (`total`); False
    (nothing appended) otherwise. An edge u -> v with v a pair's vertex and u not excluded is the pair (dep of v,
    u) either way: the same keys, sorted by the caller. Algorithm 4's first hop from a worker's dependencies
    reads their in-edges, on the products-like R-MAT at 0.1 most of the graph's (11.0M of 12.4M for 6 of 8
    workers: R-MAT's hubs are every part's dependencies), where the vertices left after the owned and the
    replicated have 0.26-0.95M out-edges (issue 34)."""
    n = trees.num_nodes
    free = np.flatnonzero(~excluded)
    out_indptr = trees.out_indptr
    lo = out_indptr[free]
    counts = out_indptr[free + 1] - lo
    reads = int(counts.sum())
    if reads >= total:
        return False
    dep_of = np.full(n, -1, dtype=np.int64)
    dep_of[vtx] = dep
    if int(np.count_nonzero(dep_of >= 0)) != len(vtx) or bool(np.any(dep < 0)):  # a vertex in two pairs
        return False
    if reads:
        starts = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        to = dep_of[trees.out_indices[starts + np.arange(reads)]]  # the dep of each out-neighbour (-1: none)
        hit = np.flatnonzero(to >= 0)
        keys.append(to[hit] * n + np.repeat(free, counts)[hit])
    return True


@dataclass(frozen=True)
class _Trace:
    """One `_measure`, kept so that a later layer's may be read off it: its roots, which of them V_rep held at
    the measured level, its cap, per hop below the measured level the unit costs it charged and the vertices it
    excluded from the expansion (None at the last hop, which expanded nothing), and what it returned, the
    elements by hop rather than level."""

    roots: np.ndarray
    keep: np.ndarray
    cap: float
    hops: tuple[tuple[float, float, np.ndarray | None], ...]
    cost: np.ndarray
    live: np.ndarray
    dep: np.ndarray
    hop: np.ndarray
    vtx: np.ndarray


class _Measures:
    """What one worker's run of Algorithm 4 measured, for its later measures to read back.

    Line 6 measures every dependency again at each layer, and on a deep model the measure of layer m+1 repeats
    layer m's: the same roots, the same hops, the same unit costs (its layers are alike) and, while V_rep holds
    nothing of the vertices reached, the same exclusions. Both are pure functions of those inputs, so:

    * a measure equal to the last one in all of them is read back whole (`_measure`): its costs, its cheap
      roots and its elements one level up; checking is O(N) per hop, where measuring expands and sorts every
      root's subtree pairs (`measured` counts the measures made, `reused` those read back);
    * an expansion (`expand`) equal to one kept for the same hop is read back (`expanded` counts those made,
      `asked` those asked for): a measure that differs from the last only below some hop, or a re-measure of
      stale roots (line 10) between two layers' measures.

    GCNII x32 on the 89,000-vertex SBM x8: 448 expansions of up to a few million pairs before, 64 after."""

    KEPT = 2  # expansions per hop: a layer's measure and a re-measure of its stale roots (line 10) alternate
    KEPT_BYTES = 256 << 20  # an expansion or a measure larger than this is not kept (a products-size graph's
    # would hold GBs beside the run's own arrays): measured again instead

    def __init__(self, trees: InTrees) -> None:
        self.trees = trees
        self.kept: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.last: _Trace | None = None
        self.asked = self.expanded = self.measured = self.reused = 0

    def expand(self, hop: int, dep: np.ndarray, vtx: np.ndarray, excluded: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """`_expand`'s pairs as (dep, vertex) arrays."""
        self.asked += 1
        kept = self.kept.setdefault(hop, [])
        for i, (d, v, x, out_dep, out_vtx) in enumerate(kept):
            if len(d) == len(dep) and np.array_equal(d, dep) and np.array_equal(v, vtx) and \
                    np.array_equal(x, excluded):
                kept.insert(0, kept.pop(i))
                return out_dep, out_vtx
        self.expanded += 1
        n = self.trees.num_nodes
        key = _expand(self.trees, dep, vtx, excluded)
        out_dep, out_vtx = np.divmod(key, n)  # one pass (two int64 divisions were 3% of the products-like compile)
        if sum(a.nbytes for a in (dep, vtx, excluded, out_dep, out_vtx)) <= self.KEPT_BYTES:
            kept.insert(0, (dep, vtx, excluded, out_dep, out_vtx))
            del kept[self.KEPT:]
        return out_dep, out_vtx

    def read_back(self, roots: np.ndarray, keep: np.ndarray, m: int, rep: np.ndarray, t_v: np.ndarray,
                  t_e: np.ndarray, cap: float) -> _Trace | None:
        """The last measure when measuring `roots` at level m now would repeat it, else None."""
        last = self.last
        if last is None or last.cap != cap or len(last.roots) != len(roots) or len(last.hops) > m or \
                not np.array_equal(last.roots, roots) or not np.array_equal(last.keep, keep):
            return None
        for j, (v_cost, e_cost, excluded) in enumerate(last.hops):
            k = m - j  # >= 1: the last measure ended before level 0 (none that reached it is kept)
            if t_v[k - 1] != v_cost or t_e[k - 1] != e_cost:
                return None
            if excluded is not None and not np.array_equal(rep[k - 1] | self.trees.owned, excluded):
                return None
        self.reused += 1
        return last


def _measure(trees: InTrees, roots: np.ndarray, m: int, rep: np.ndarray, costs: UnitCosts,
             cap: float, kept: _Measures | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lines 6 and 10: t_r of caching h^m of each root, V_rep excluded, measured down to where it reaches `cap`.

    Caching h^m_v computes, at each level k < m, the rows of the ball of v (expanded through vertices the
    worker does not own) and aggregates their in-edges; level 0's rows are inputs (t_x each). A vertex of
    V_rep costs nothing and is not expanded: what it needs is in V_rep already (V_rep is a union of such
    balls). Returns per root its cost (exact below `cap`; above, the cost of the levels measured, a lower
    bound), whether it stayed below `cap`, and its elements (root index, level, vertex): the whole new
    subtree for those below `cap`, the part measured for the others. `kept`: what the run measured before
    (`_Measures`: an equal measure or expansion is read back; a new one when None). The elements' root
    indices and vertices may be the kept ones: read-only.
    """
    kept = kept or _Measures(trees)
    t_v, t_e = np.asarray(costs.t_v, np.float64), np.asarray(costs.t_e, np.float64)
    roots = np.asarray(roots, dtype=np.int64)
    keep = ~rep[m][roots]
    last = kept.read_back(roots, keep, m, rep, t_v, t_e, cap)
    if last is not None:  # the same measure one level up: its elements' levels are m - hop
        return last.cost.copy(), last.live.copy(), last.dep, m - last.hop, last.vtx
    kept.measured += 1
    deg = trees.in_degree
    cost = np.zeros(len(roots))
    live = np.ones(len(roots), dtype=bool)
    dep, vtx = np.flatnonzero(keep), roots[keep]
    out_dep, out_hop, out_vtx = [], [], []
    hops: list[tuple[float, float, np.ndarray | None]] = []
    ended = False  # whether a hop left nothing to expand above level 0 (else the measure reached the inputs)
    for k in range(m, -1, -1):
        out_dep.append(dep)
        out_hop.append(np.full(len(dep), m - k, dtype=np.int64))
        out_vtx.append(vtx)
        if k == 0:
            cost += np.bincount(dep, minlength=len(roots)) * costs.t_x
            break
        cost += np.bincount(dep, weights=t_v[k - 1] + t_e[k - 1] * deg[vtx], minlength=len(roots))
        live &= cost < cap
        go = live[dep]  # a root past the cap is not expanded further: it is refused unless V_rep grows into it
        if not go.any():  # nothing left to expand: the levels below add no cost and no element (most of a deep
            # model's levels: a subtree ends at owned, replicated or over-the-cap vertices within a few hops)
            hops.append((float(t_v[k - 1]), float(t_e[k - 1]), None))
            ended = True
            break
        excluded = rep[k - 1] | trees.owned
        hops.append((float(t_v[k - 1]), float(t_e[k - 1]), excluded))
        dep, vtx = kept.expand(m - k, dep[go], vtx[go], excluded)
    live &= cost < cap
    e_dep, e_hop, e_vtx = np.concatenate(out_dep), np.concatenate(out_hop), np.concatenate(out_vtx)
    for a in (e_dep, e_hop, e_vtx):
        a.flags.writeable = False  # shared with the measures that read them back
    small = 3 * e_dep.nbytes + sum(x.nbytes for _, _, x in hops if x is not None) <= kept.KEPT_BYTES
    kept.last = _Trace(roots, keep, cap, tuple(hops), cost.copy(), live.copy(), e_dep, e_hop, e_vtx) \
        if ended and small else None
    return cost, live, e_dep, m - e_hop, e_vtx


@dataclass(frozen=True)
class RunTotals:
    """A PaperRun's sizes per layer without its rep_when table ((L + 1) x N entries per worker): V_rep's rows, edges,
    bytes and time after any first m layers, which is all the planner's prices of a start's spans read of a run
    beside the start's StartTraffic (`select_paper_prefix`)."""

    added_rows: np.ndarray
    added_edges: np.ndarray
    used_after: np.ndarray
    t_v: np.ndarray
    t_e: np.ndarray
    t_x: float

    def replicated(self, m: int) -> Replicated:
        """V_rep after the first m layers."""
        rows = self.added_rows[:m].sum(axis=0)[:m + 1]
        edges = self.added_edges[:m].sum(axis=0)[:m + 1]
        time = float(rows[1:] @ self.t_v[:m] + edges[1:] @ self.t_e[:m] + rows[0] * self.t_x) if m else 0.0
        return Replicated(rows, edges, float(self.used_after[m - 1]) if m else 0.0, time)


@dataclass(frozen=True)
class PaperRun(RunTotals):
    """One worker's Algorithm 4 over L layers, kept so that every shorter segment from the same start reads its
    result off it: the algorithm decides layer after layer, so a segment of m layers is its first m layers
    (the same dependencies, unit costs and budget). rep_when[k, v]: the layer during which v's h^k entered
    V_rep (L: never); added_rows / added_edges[m, k]: what layer m added at level k; used_after[m]: line 14's
    size after layer m (RunTotals' fields)."""

    rep_when: np.ndarray

    def prefix(self, m: int, layer: np.ndarray, vertex: np.ndarray) -> tuple[np.ndarray, Replicated]:
        """The cached mask over the dependencies of the first m layers (`layer` < m), and V_rep after them.

        A dependency is cached when its row is in V_rep at its level (line 13 puts a cached dependency's
        own row there). That includes, beyond the paper's lines, a dependency refused at its layer whose row
        a later layer's subtree replicated: the worker then holds that row and fetches nothing for it."""
        layer, vertex = np.asarray(layer, np.int64), np.asarray(vertex, np.int64)
        cached = self.rep_when[np.minimum(layer, m), vertex] < m if len(layer) else np.zeros(0, dtype=bool)
        return cached, self.replicated(m)

    def totals(self) -> RunTotals:
        """The run without rep_when: what the planner's prices of its spans read (`select_paper_prefix`)."""
        return RunTotals(*(getattr(self, f.name) for f in fields(RunTotals)))

    def packed(self) -> tuple[Any, ...]:
        """The run as a child process sends it back (`paper_runs`): rep_when's entries below L (V_rep: the
        products compile's start-0 runs hold 1.5-3.3M of 9.8M entries, the later starts' none), not the table;
        `unpacked` rebuilds the same arrays."""
        never = self.rep_when.shape[0] - 1
        flat = self.rep_when.reshape(-1)
        where = np.flatnonzero(flat != never)
        where = where.astype(np.int32) if flat.size < 2**31 else where
        return (self.rep_when.shape, self.rep_when.dtype.str, where, flat[where],
                *(getattr(self, f.name) for f in fields(RunTotals)))

    @classmethod
    def unpacked(cls, packed: tuple[Any, ...]) -> "PaperRun":
        """The PaperRun `packed` was made from, bit for bit."""
        shape, dtype, where, when, *rest = packed
        rep_when = np.full(shape, shape[0] - 1, dtype=np.dtype(dtype))
        rep_when.reshape(-1)[where] = when
        return cls(*rest, rep_when=rep_when)


# Dependency entries (summed over the workers and the starts) of the runs one `starts_runs` call makes from which it
# spreads them over processes: below, forking, sending the runs back and rebuilding them cost more than the second
# core saves. Measured on one start's runs (tests/test_ppass_processes.py's graphs and the products compile,
# LOADED): see docs/design.md; one call now makes every start's, so one fork serves them all.
PARALLEL_ENTRIES = 250_000


@dataclass(frozen=True)
class StartJob:
    """One span start's Algorithm 4 runs for `starts_runs` to make: every worker's dependencies of the start's longest
    span (their `layer` and `vertex`; `owner` too with `traffic`), its unit costs over those `layers`, the budget S.
    `whole`: the runs come back as PaperRuns (select-hybrid's masks read rep_when), else as their RunTotals (the
    planner's prices: the parent then never holds the start's rep_when tables). `traffic`: the start's StartTraffic
    counted beside each worker's run, where the run is made."""

    deps: Sequence[Any]
    costs: UnitCosts
    budget: float
    layers: int
    whole: bool = True
    traffic: bool = False


def paper_runs(trees: Sequence[InTrees], deps: Sequence[Any], costs: UnitCosts, budget: float, layers: int,
               processes: int = 1) -> list[PaperRun]:
    """`paper_run` of every worker (its InTrees, its dependencies' `layer` and `vertex` from `deps`) for one start:
    `starts_runs` of that one start."""
    [(runs, _)] = starts_runs(trees, [StartJob(deps, costs, budget, layers)], processes)
    return runs  # type: ignore[return-value]


def starts_runs(trees: Sequence[InTrees], jobs: Sequence[StartJob], processes: int = 1
                ) -> list[tuple[list[PaperRun | RunTotals], StartTraffic | None]]:
    """Every worker's `paper_run` for every start of `jobs`, and each start's StartTraffic where its job asks: per
    job, (its runs in worker order, whole or totals as `StartJob.whole` says; the traffic or None).

    All the starts' runs go to one `gnnc.parallel.map_processes` call of up to `processes` child processes where
    their dependency entries together reach PARALLEL_ENTRIES, else they are made here, one after another. A worker's
    run reads only its own trees and dependencies and the shared graph (Algorithm 4 is per worker: its V_rep, budget
    S and queue are its own; NeutronStar runs the workers' selections each on its own machine), and the starts'
    runs are independent of one another, so the runs are the same whichever process makes them and in whatever
    order. One call for all the starts, not one per start, so that no core waits at the end of a start for the
    other's last run (the products compile's start 0: 8 runs of 2.1-2.7 CPU s, 19.6 in all, 10.2 s on two
    processes by list scheduling; starts 1 and 2 forked again), and the longest runs are handed out first
    (`_longest_first`).
    A run comes back `packed`, or as its totals; a start's traffic as each worker's counts (`_worker_traffic`),
    summed here: integers, the same whatever process counted them."""
    items = [(j, r) for j, job in enumerate(jobs) for r in range(len(job.deps))]
    owners = [job.traffic and all(d.owner is not None for d in job.deps) for job in jobs]

    def made(item: tuple[int, int]) -> tuple[PaperRun | RunTotals, Any]:
        j, r = item
        job = jobs[j]
        run = paper_run(trees[r], job.deps[r].layer, job.deps[r].vertex, job.costs, job.budget, job.layers)
        counts = _worker_traffic(job.deps[r], run, len(job.deps), job.layers, owners[j]) if job.traffic else None
        return run if job.whole else run.totals(), counts

    entries = sum(len(d.layer) for job in jobs for d in job.deps)
    if processes <= 1 or len(items) < 2 or entries < PARALLEL_ENTRIES:
        done = [made(item) for item in items]
    else:
        order = _longest_first(jobs, items)

        def sent_back(i: int) -> tuple[Any, Any]:
            run, counts = made(items[i])
            return (run.packed() if isinstance(run, PaperRun) else run), counts

        done = [None] * len(items)  # type: ignore[list-item]
        for i, (run, counts) in zip(order, map_processes(sent_back, order, processes)):
            done[i] = (PaperRun.unpacked(run) if isinstance(run, tuple) else run), counts
    out: list[tuple[list[PaperRun | RunTotals], StartTraffic | None]] = []
    at = 0
    for j, job in enumerate(jobs):
        mine = done[at:at + len(job.deps)]
        at += len(job.deps)
        out.append(([run for run, _ in mine], _traffic_of([c for _, c in mine], owners[j]) if job.traffic else None))
    return out


def _longest_first(jobs: Sequence[StartJob], items: Sequence[tuple[int, int]]) -> list[int]:
    """The items' indices, the runs predicted longest first (longest-processing-time-first dispatch: the last runs
    handed out are short, so the processes end together). The prediction, cheap and only an order: a run's layers
    first (a layer-m measure expands its subtrees m hops: the products compile's runs took 2.1-2.7 CPU s over 3
    layers, 0.29-1.67 over 2, 0.015-0.078 over 1), then its dependency entries (rank correlation with the run's CPU
    within those layers 0.81 and 0.90 for 2 and 1, but -0.90 for 3: a guess there), ties in the items' order."""
    return sorted(range(len(items)), key=lambda i: (-jobs[items[i][0]].layers,
                                                    -len(jobs[items[i][0]].deps[items[i][1]].layer), i))


def paper_run(trees: InTrees, layer: np.ndarray, vertex: np.ndarray, costs: UnitCosts, budget: float,
              layers: int) -> PaperRun:
    """Algorithm 4 for one worker, line by line, over `layers` layers (see PaperRun).

    Differences of form, not of result: the queue is popped by sorting (its keys are line 6's measures, which
    do not change while it is popped); line 10 re-measures only the popped dependencies whose measured subtree
    V_rep has grown into since (the others' t_r is unchanged), and a run of popped dependencies measured below
    t_c is cached at once (V_rep only lowers t_r), each charged only for the vertices no earlier one of the run
    replicated, so the memory test of line 14 sees the same sizes. One liberty: line 6 measures a subtree only
    until it reaches t_c (a deep one can be the whole graph); a root costing more keeps the lower bound measured
    as its key, so it is popped after every root below t_c, as by its exact t_r, but among such roots the
    order is by that bound.
    """
    n = trees.num_nodes
    layer, vertex = np.asarray(layer, np.int64), np.asarray(vertex, np.int64)
    row_bytes = np.asarray(costs.row_bytes, np.float64)
    deg = trees.in_degree
    rep = np.zeros((layers + 1, n), dtype=bool)  # line 2: V_rep, one set per level (rep[k]: rows of h^k)
    rep_when = np.full((layers + 1, n), layers, dtype=np.int16 if layers < 2**15 else np.int32)
    added_rows = np.zeros((layers, layers + 1))
    added_edges = np.zeros((layers, layers + 1))
    used_after = np.zeros(layers)
    used = 0.0
    kept = _Measures(trees)  # line 6 measures the same roots at every layer: equal measures are read back
    popped: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the last layer's keys, vertices and pops
    by_vertex: tuple[np.ndarray, np.ndarray] | None = None  # the last roots and their stable order by vertex id
    by_layer = np.argsort(layer, kind="stable")  # each layer's dependencies in index order, found in one sort
    # line 14's sizes summed in any order are the same floats when every row's and edge's bytes are whole numbers
    # and no sum reaches 2**53: then each element's first popper is found without sorting the elements
    # (`_FirstPoppers`); else by element, as the sums' order was
    whole = bool(np.all(np.isfinite(row_bytes)) and np.all(row_bytes == np.floor(row_bytes)) and
                 float(costs.edge_bytes) == np.floor(float(costs.edge_bytes)) and min(row_bytes.min(initial=0),
                 float(costs.edge_bytes)) >= 0 and (layers + 1) * n * (row_bytes.max(initial=0) + float(
                     deg.max(initial=0)) * float(costs.edge_bytes)) < 2.0 ** 53)
    firsts = _FirstPoppers((layers + 1) * n, len(vertex)) if whole else None
    bounds = np.searchsorted(layer[by_layer], np.arange(layers + 1))
    stopped = False
    for m in range(layers):  # line 3
        idx = by_layer[bounds[m]:bounds[m + 1]]
        if stopped or len(idx) == 0:
            used_after[m] = used
            continue
        t_c = float(np.asarray(costs.t_c, np.float64)[m])
        roots = vertex[idx]
        key, cheap, e_dep, e_lvl, e_vtx = _measure(trees, roots, m, rep, costs, t_c, kept)  # lines 4-7
        if popped is not None and len(popped[0]) == len(key) and np.array_equal(popped[0], key) and \
                np.array_equal(popped[1], roots):
            order = popped[2]  # the same keys as the last layer's (a measure read back): the same pops
        else:
            # line 9's pops: least t_r first (ties: vertex id), np.lexsort((roots, key)) as two stable sorts, the
            # one by vertex shared by the layers (each layer's roots are the same vertices: 5.7% of the products-like
            # compile's CPU at 0.1 was this lexsort, sorting them again per layer)
            if by_vertex is None or len(by_vertex[0]) != len(roots) or not np.array_equal(by_vertex[0], roots):
                by_vertex = (roots, np.argsort(roots, kind="stable"))
            order = by_vertex[1][np.argsort(key[by_vertex[1]], kind="stable")]
            popped = (key.copy(), roots, order)
        rank = np.empty(len(idx), dtype=np.int64)
        rank[order] = np.arange(len(idx))
        stale = np.zeros(len(idx), dtype=bool)
        elements = (e_dep, e_lvl, e_vtx)
        pos = 0
        ends = None  # where each run of pops alike (cheap or not, neither stale) ends; None: cheap or stale changed
        while pos < len(order):  # line 8
            j = order[pos]
            if ends is None:  # found in one numpy pass, not a Python step per pop (millions on a deep model)
                alike = cheap[order].astype(np.int8) | (stale[order].astype(np.int8) << 1)
                ends = np.append(np.flatnonzero(alike[1:] != alike[:-1]) + 1, len(order))
            if stale[j]:  # line 10: V_rep grew into what was measured: measure again, every stale one at once
                again = order[pos:][stale[order[pos:]]]
                _, now_cheap, d2, l2, v2 = _measure(trees, vertex[idx[again]], m, rep, costs, t_c, kept)
                cheap[again] = now_cheap
                stale[again] = False
                ends = None
                gone = np.zeros(len(idx), dtype=bool)  # a mask, not np.isin's sort of the elements
                gone[again] = True
                drop = gone[elements[0]]
                elements = (np.concatenate([elements[0][~drop], again[d2]]), np.concatenate([elements[1][~drop], l2]),
                            np.concatenate([elements[2][~drop], v2]))
                continue
            run_end = int(ends[np.searchsorted(ends, pos, side="right")])  # the pops alike from pos on
            if cheap[j]:  # lines 11-13: t_r < t_c (strictly), and it only falls as V_rep grows
                run = order[pos:run_end]
                in_run = np.zeros(len(idx), dtype=bool)
                in_run[run] = True
                sel = in_run[elements[0]]
                d, lv, vx = elements[0][sel], elements[1][sel], elements[2][sel]
                new = ~rep[lv, vx]
                d, lv, vx = d[new], lv[new], vx[new]
                if firsts is not None:  # each (level, vertex) to its first popper, in the elements' order
                    charged = firsts(lv * n + vx, rank[d])
                    d, lv, vx = d[charged], lv[charged], vx[charged]
                else:  # the same, by element: the order the bytes below are summed in
                    first = _first_poppers(lv * n + vx, rank[d], len(idx))
                    lvx = (lv * n + vx)[first]
                    charged = np.ones(len(first), dtype=bool)
                    charged[1:] = lvx[1:] != lvx[:-1]
                    d, lv, vx = d[first][charged], lv[first][charged], vx[first][charged]
                nbytes = row_bytes[lv] + np.where(lv > 0, deg[vx] * costs.edge_bytes, 0.0)
                per_dep = np.bincount(rank[d] - pos, weights=nbytes, minlength=len(run))
                total = used + np.cumsum(per_dep)
                over = np.nonzero(total > budget)[0]
                take = int(over[0]) if len(over) else len(run)
                taken = np.zeros(len(idx), dtype=bool)
                taken[run[:take]] = True
                keep_d = taken[d]
                lv, vx = lv[keep_d], vx[keep_d]
                rep[lv, vx] = True  # line 13
                rep_when[lv, vx] = m
                added_rows[m] += np.bincount(lv, minlength=layers + 1)
                added_edges[m] += np.bincount(lv, weights=np.where(lv > 0, deg[vx], 0), minlength=layers + 1)
                used = float(total[take - 1]) if take else used
                if take < len(run):  # lines 14-15: the memory would exceed S: drop it, and the algorithm ends
                    stopped = True
                    break
                rest = order[run_end:]
                if len(lv) and len(rest):  # who measured a vertex V_rep now holds is measured again
                    hit = rep[elements[1], elements[2]] & ~cheap[elements[0]]
                    stale[elements[0][hit]] = True  # each once or more: the same mask, without sorting them
                    ends = None
            # else t_r >= t_c: communicated (line 16), and the next pop
            pos = run_end
        used_after[m] = used
    return PaperRun(added_rows, added_edges, used_after, np.asarray(costs.t_v, np.float64),
                    np.asarray(costs.t_e, np.float64), float(costs.t_x), rep_when=rep_when)


class _FirstPoppers:
    """Which entries are their element's first popper (least rank), for a run of Algorithm 4: `_first_poppers`
    without a sort. Each (element, rank) pair is given once (a measure's elements are: per hop its sorted_unique
    keys), so exactly one entry per element is chosen; the chosen keep the entries' order. One scratch array of
    the least rank per element (levels x vertices, int32 while the ranks fit), reset where written after each
    call: a sort of a cached run's ~1-8M elements was the largest cost of the products compile's passes (8.3 of
    35 CPU s at full size, issue 34); np.minimum.at and two gathers are ~5x less."""

    def __init__(self, elements: int, ranks: int) -> None:
        self.dtype = np.int32 if ranks < np.iinfo(np.int32).max else np.int64
        self.none = np.iinfo(self.dtype).max
        self.least: np.ndarray | None = None  # made at the first call (a run caching nothing needs none)
        self.elements = elements

    def __call__(self, element: np.ndarray, rank: np.ndarray) -> np.ndarray:
        if self.least is None:
            self.least = np.full(self.elements, self.none, dtype=self.dtype)
        rank = rank.astype(self.dtype, copy=False)
        np.minimum.at(self.least, element, rank)
        first = self.least[element] == rank
        self.least[element] = self.none
        return first


def _first_poppers(element: np.ndarray, rank: np.ndarray, ranks: int) -> np.ndarray:
    """np.lexsort((rank, element)): the order by element, then rank (each (element, rank) pair once, as a
    measure's elements are). As one int64 key where it fits, sorted in one pass: lexsort sorts twice, and this
    was the slowest step of a cached run (GCNII x32 on the 89,000-vertex SBM: 55 ms each)."""
    if len(element) and int(element.max()) < np.iinfo(np.int64).max // max(ranks, 1) - 1:
        return np.argsort(element * ranks + rank)
    return np.lexsort((rank, element))


def greedy_paper_worker(trees: InTrees, layer: np.ndarray, vertex: np.ndarray, costs: UnitCosts, budget: float,
                        layers: int) -> tuple[np.ndarray, Replicated]:
    """Algorithm 4 for one worker over `layers` layers: the cached dependencies (a mask) and V_rep."""
    return paper_run(trees, layer, vertex, costs, budget, layers).prefix(layers, layer, vertex)


def select_paper(deps: Sequence[Dependencies], trees: Sequence[InTrees], costs: UnitCosts, own_time: np.ndarray,
                 memory_cap: float | Sequence[float], overlap: bool = True,
                 runs: Sequence[PaperRun] | None = None) -> HybridResult:
    """Algorithm 4 as written on every worker, and the prediction of its selection: the recomputed rows, edges
    and inputs are V_rep's (each counted once, as the runtime computes them, gnnc.plan.rows), the memory its
    bytes. mu (equation 3: 0 < mu <= 1 trims the per-dependency sum to what is computed once; the paper gives
    no value) is measured: V_rep's recompute time over the per-dependency trees' (`recompute_cost`) of the
    cached dependencies; `HybridResult.mu` holds it per worker. `runs`: each worker's PaperRun over at least
    these layers from the same start (the planner runs each start once for all its spans); `trees` then unused.
    """
    p = len(deps)
    caps = np.broadcast_to(np.asarray(memory_cap, np.float64), (p,))
    masks, reps = [], []
    for i, dep in enumerate(deps):
        run = runs[i] if runs is not None else paper_run(trees[i], dep.layer, dep.vertex, costs, float(caps[i]),
                                                         dep.layers)
        mask, rep = run.prefix(dep.layers, dep.layer, dep.vertex)
        masks.append(mask)
        reps.append(rep)
    own = np.asarray(own_time, np.float64)
    layers = own.shape[1]
    # the rows fetched, as `predict` counts them; the rest is V_rep's, not the per-dependency trees' it sums
    received = np.zeros((p, layers))
    sent = np.zeros((p, layers))
    owners_known = all(dep.owner is not None for dep in deps)
    for i, (dep, mask) in enumerate(zip(deps, masks)):
        lyr = np.asarray(dep.layer, np.int64)[~mask]
        received[i] = np.bincount(lyr, minlength=layers)[:layers]
        if owners_known:
            owner = np.asarray(dep.owner, np.int64)[~mask]
            sent += np.bincount(owner * layers + lyr, minlength=p * layers)[:p * layers].reshape(p, layers)
    if not owners_known:
        sent = received.copy()
    per_dep = [float(recompute_cost(dep, costs, where=mask).sum()) for dep, mask in zip(deps, masks)]
    mu = np.array([min(1.0, r.time / s) if s > 0 else 1.0 for r, s in zip(reps, per_dep)])
    return _paper_result(tuple(masks), reps, received, sent, costs, own, overlap, mu)


def _paper_result(cached: tuple[np.ndarray, ...], reps: Sequence[Replicated], received: np.ndarray,
                  sent: np.ndarray, costs: UnitCosts, own: np.ndarray, overlap: bool,
                  mu: np.ndarray | None) -> HybridResult:
    """Algorithm 4's prediction from what each worker fetches and replicates (select_paper, select_paper_prefix)."""
    p, layers = own.shape
    t_v, t_e = np.asarray(costs.t_v, np.float64), np.asarray(costs.t_e, np.float64)
    rec_rows = np.array([r.rows[1:layers + 1] for r in reps]).reshape(p, layers)
    rec_edges = np.array([r.edges[1:layers + 1] for r in reps]).reshape(p, layers)
    replicated = np.array([r.rows[0] for r in reps])
    rec_t = rec_rows * t_v + rec_edges * t_e
    rec_t[:, 0] += replicated * costs.t_x
    comm_t = received * np.asarray(costs.t_c, np.float64)
    layer_times = own + (np.maximum(comm_t, rec_t) if overlap else comm_t + rec_t)
    return HybridResult(cached, float(layer_times.max(axis=0).sum()) if p else 0.0, layer_times,
                        np.array([r.memory for r in reps]), received, sent, rec_rows, rec_edges, replicated, "greedy",
                        mu)


@dataclass(frozen=True)
class StartTraffic:
    """The rows each worker fetches and sends in every span from one start, under Algorithm 4's selection and
    under communicate-all, counted once for all the spans (the planner prices up to L of them per start, and
    counting each apiece was O(L^2) passes over a deep model's dependencies).

    A dependency (l, v) of a span's first m layers is fetched unless v's h^l entered V_rep during one of them
    (rep_when[l, v] < m: PaperRun.prefix), so per layer a histogram of rep_when, summed from the top, holds
    every span's count: fetched[i, l, t], worker i's dependencies at layer l with rep_when >= t (t = 0: all of
    them, communicate-all's); sent[o, l, t] likewise of the rows worker o owns, over every worker, or None
    when the owners are unknown (sends are then taken equal to receives, as `predict` and `select_paper` do)."""

    fetched: np.ndarray
    sent: np.ndarray | None

    def rows(self, layers: int, everything: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """[workers, layers] rows received and sent in the span of the first `layers` layers: Algorithm 4's
        selection, or with `everything` communicate-all's."""
        t = 0 if everything else layers
        received = self.fetched[:, :layers, t].astype(np.float64)
        return received, received.copy() if self.sent is None else self.sent[:, :layers, t].astype(np.float64)


def start_traffic(deps: Sequence[Dependencies], runs: Sequence[PaperRun]) -> StartTraffic:
    """StartTraffic of the dependencies of a start's longest span and its workers' PaperRuns (over as many layers
    or more)."""
    p = len(deps)
    layers = deps[0].layers if p else 0
    owners_known = all(dep.owner is not None for dep in deps)
    return _traffic_of([_worker_traffic(dep, run, p, layers, owners_known) for dep, run in zip(deps, runs)],
                       owners_known)


def _worker_traffic(dep: Dependencies, run: PaperRun, p: int, layers: int, owners_known: bool
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """One worker's part of its start's StartTraffic before the sums from the top: [layers, top] its dependencies
    per layer and rep_when (top: the run's layers + 1), and with `owners_known` [p, layers, top] the same by owner."""
    top = run.rep_when.shape[0]  # rep_when's values: 0 .. the run's layers
    lyr = np.asarray(dep.layer, np.int64)
    key = lyr * top + run.rep_when[lyr, np.asarray(dep.vertex, np.int64)]
    fetched = np.bincount(key, minlength=layers * top).reshape(layers, top)
    if not owners_known:
        return fetched, None
    owned = np.asarray(dep.owner, np.int64) * (layers * top) + key
    return fetched, np.bincount(owned, minlength=p * layers * top).reshape(p, layers, top)


def _traffic_of(counts: Sequence[tuple[np.ndarray, np.ndarray | None]], owners_known: bool) -> StartTraffic:
    """StartTraffic from every worker's `_worker_traffic` in worker order (int64 counts: their sum is exact)."""
    p = len(counts)
    shape = counts[0][0].shape if p else (0, 1)
    fetched = np.zeros((p, *shape), np.int64)
    sent = np.zeros((p, *shape), np.int64) if owners_known else None
    for i, (mine, by_owner) in enumerate(counts):
        fetched[i] = mine
        if sent is not None:
            sent += by_owner
    # from the top: [..., t] counts the rows with rep_when >= t
    fetched = np.cumsum(fetched[..., ::-1], axis=-1)[..., ::-1]
    return StartTraffic(fetched, None if sent is None else np.cumsum(sent[..., ::-1], axis=-1)[..., ::-1])


def select_paper_prefix(traffic: StartTraffic, runs: Sequence[PaperRun | RunTotals], costs: UnitCosts,
                        own_time: np.ndarray, overlap: bool = True) -> HybridResult:
    """`select_paper` of the span of the first `own_time.shape[1]` layers from the start `traffic` and `runs`
    were made for, counted off them: the same prediction, without the per-dependency masks (`cached` is empty)
    or mu (None), which only select-hybrid's record reads."""
    own = np.asarray(own_time, np.float64)
    layers = own.shape[1]
    received, sent = traffic.rows(layers)
    return _paper_result((), [run.replicated(layers) for run in runs], received, sent, costs, own, overlap, None)


def communicate_all(traffic: StartTraffic, costs: UnitCosts, own_time: np.ndarray,
                    overlap: bool = True) -> HybridResult:
    """`predict` of fetching every dependency of the span of the first `own_time.shape[1]` layers from the
    start `traffic` was made for (`cached` empty: no masks)."""
    own = np.asarray(own_time, np.float64)
    p, layers = own.shape
    received, sent = traffic.rows(layers, everything=True)
    comm_t = received * np.asarray(costs.t_c, np.float64)
    zeros = np.zeros((p, layers))
    layer_times = own + (np.maximum(comm_t, zeros) if overlap else comm_t + zeros)
    return HybridResult((), float(layer_times.max(axis=0).sum()) if p else 0.0, layer_times, np.zeros(p), received,
                        sent, zeros, zeros.copy(), np.zeros(p), "communicate-all")
