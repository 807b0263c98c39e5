"""The statistics pass: what each part of a partition owns, needs and sends.

The cost model prices every strategy from these numbers (DepComm sends the
rows of B_i each layer, DepCache replicates L-hop neighbourhoods, Hybrid
weighs each dependency's subtree, G3 balances |B_i|, MG-GCN's stages follow
the busiest tile), so they are computed once per (graph, partition, layers,
view), with numpy/scipy over the whole edge list: no Python loop over
vertices or edges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from gnnc.graph import Graph, row_blocks
from gnnc.graph.storage import row_ranges as _row_ranges
from gnnc.parallel import map_processes
from gnnc.passes.partition.core import EDGE_BLOCK, Partition
from gnnc.plan.distances import part_distances


@dataclass(frozen=True, eq=False)
class PartStats:
    """Per-part dependency statistics of a vertex partition (P parts, L layers).

    Edges are those of `view` (plain or self_loops), directed src -> dst;
    part i owns V_i and aggregates the in-edges of its vertices.

    vertices[i]: |V_i|, the vertices part i owns.
    edges[i]: |E_i|, the in-edges of V_i (duplicates and self-loops counted as the view has them).
    remote[i]: |B_i|, the distinct in-neighbours of V_i owned by other parts: rows part i receives
        each layer under DepComm.
    send[i]: rows part i sends each layer, one per (vertex, receiving part) pair = sum_j send_matrix[i, j].
    send_matrix[i, j]: |V_i ∩ B_j|, rows part i sends to part j (zero diagonal).
    remote_edges[i]: in-edges of V_i whose source another part owns: the edges that wait for the halo
        when its exchange overlaps the local ones (DepComm's overlap).
    inner_edges[i]: in-edges of the vertices of V_i with no remote in-neighbour: the work of G3's bins
        that can run before the halo arrives (eager computation).
    max_in_degree[i]: the largest in-degree among V_i: the heaviest row one of G3's bins holds.
    lhop_vertices[i, l], l = 0..L: vertices at in-distance exactly l from V_i (l = 0: V_i itself);
        DepCache for L layers replicates the levels 1..L.
    lhop_edges[i, l]: in-edges of the vertices at level l. DepCache computes the in-edges of levels
        0..L-1 (level l's for layers 1..L-l); level L's are the frontier's, not needed.
    dep_ptr [P + 1], dep_ids [sum |B_i|]: the remote dependencies of part i are
        dep_ids[dep_ptr[i]:dep_ptr[i+1]], ordered by (owner, global id), the order owners send them in.
    dep_subtree_edges [sum |B_i|, L], column k: edges of the dependency's in-tree of depth k
        (k = 0: none). Caching a dependency at layer l (its layer-(l-1) output computed locally)
        replicates its depth-(l-1) tree. Trees are unfolded as in NeutronStar's dependency trees:
        a vertex reached by two paths counts twice (float64: counts grow as degree^k).
    dep_subtree_vertices: likewise, vertices of that tree, root included (= 1 + edges).
    edge_cut: edges whose endpoints lie in different parts.
    replication_factor: sum_i (|V_i| + |B_i|) / N, copies of a vertex row held under DepComm.
    lhop_replication_factor: sum_i sum_{l<=L} lhop_vertices[i, l] / N, under DepCache.
    vertex_balance, edge_balance, send_balance: max / mean over parts.
    remote_balance: max / min of |B_i| (inf when some part has no remote vertex and another has).
    """

    parts: int
    layers: int
    view: str
    num_nodes: int
    num_edges: int
    vertices: np.ndarray
    edges: np.ndarray
    remote: np.ndarray
    send: np.ndarray
    send_matrix: np.ndarray
    remote_edges: np.ndarray
    inner_edges: np.ndarray
    max_in_degree: np.ndarray
    lhop_vertices: np.ndarray
    lhop_edges: np.ndarray
    dep_ptr: np.ndarray
    dep_ids: np.ndarray
    dep_subtree_edges: np.ndarray
    dep_subtree_vertices: np.ndarray
    edge_cut: int
    replication_factor: float
    lhop_replication_factor: float
    vertex_balance: float
    edge_balance: float
    send_balance: float
    remote_balance: float

    def deps(self, part: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(global ids, subtree vertices [|B_i|, L], subtree edges [|B_i|, L]) of part's dependencies."""
        lo, hi = int(self.dep_ptr[part]), int(self.dep_ptr[part + 1])
        return self.dep_ids[lo:hi], self.dep_subtree_vertices[lo:hi], self.dep_subtree_edges[lo:hi]

    def summary(self) -> dict[str, Any]:
        """The per-part counts and scalars as plain Python values (for JSON and tables)."""
        return {
            "parts": self.parts, "layers": self.layers, "view": self.view,
            "vertices": self.vertices.tolist(), "edges": self.edges.tolist(), "remote": self.remote.tolist(),
            "send": self.send.tolist(), "lhop_vertices": self.lhop_vertices.tolist(),
            "lhop_edges": self.lhop_edges.tolist(), "edge_cut": self.edge_cut,
            "replication_factor": self.replication_factor,
            "lhop_replication_factor": self.lhop_replication_factor,
            "vertex_balance": self.vertex_balance, "edge_balance": self.edge_balance,
            "send_balance": self.send_balance, "remote_balance": self.remote_balance,
        }


# In-edges of the graph from which `compute_stats` splits its passes over the edges by row range over processes
# (gnnc.parallel.map_processes): below, a fork and the pieces sent back cost more than the second core saves.
# Measured: see docs/design.md (the statistics, processes).
PARALLEL_EDGES = 16_000_000


def compute_stats(graph: Graph, partition: Partition | np.ndarray, layers: int, view: str = "plain",
                  num_parts: int | None = None, processes: int = 1) -> PartStats:
    """The statistics of `partition` on `graph` for an L-layer model (see PartStats).

    `num_parts` counts the parts of an assignment array whose last parts are empty (the
    largest part id + 1 otherwise). `processes`: the passes over every in-edge (per destination its cut in-edges;
    the walks of length 2+ while exact) split by row range over up to this many processes where the graph has
    PARALLEL_EDGES in-edges or more: per row the same sums, so the same statistics.
    """
    if isinstance(partition, Partition):
        part, parts = np.asarray(partition.assignment, dtype=np.int64), partition.parts
    else:
        part = np.asarray(partition, dtype=np.int64)
        parts = num_parts if num_parts is not None else int(part.max()) + 1 if len(part) else 1
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    n = graph.num_nodes
    csr = graph.csr(view)
    indptr, indices = csr.indptr.numpy(), csr.indices.numpy()
    in_degree = np.diff(indptr)
    # the parts in the narrowest integer that holds them: the row pass gathers one per in-edge at random, and an
    # int8 table (2.4 MB at ogbn-products' size, where int32's was 9.8) halved that pass's CPU time (issue 34)
    small = part.astype(next(t for t in (np.int8, np.int16, np.int32, np.int64) if parts <= np.iinfo(t).max + 1))
    vertices = np.bincount(part, minlength=parts)
    edges = _sum_by(part, in_degree, parts)

    # per destination, its in-edges from another part, read off the in-CSR block of rows by block (a row's part is
    # its destination's, repeated; the sources' parts gathered): the per-edge arrays of the edge list (its two
    # parts, the cut mask, the cut edges' keys) were ~25 bytes per edge of the compile's peak, and every count
    # below but the cut is a sum over vertices
    # below, the walks of length 2 (the in-degrees summed over each row's sources) in the same pass over the rows,
    # where they are exact (< 2**53) and a level needs them: one fork for both where processes split the rows
    marked = np.zeros((parts, n), dtype=bool) if layers == 0 else None
    ranges = _row_ranges(indptr, 1 if marked is not None or csr.nnz < PARALLEL_EDGES else processes)
    degrees = in_degree.astype(np.float64)
    second = layers > 2 and float(degrees.max(initial=0.0)) * max(csr.nnz, 1) < 2.0**53

    def rows_pass(r: tuple[int, int]) -> tuple[np.ndarray, np.ndarray | None]:
        return (_cross_in(indptr, indices, small, r[0], r[1], marked),
                _in_sums(indptr, indices, degrees, *r) if second else None)

    pieces = map_processes(rows_pass, ranges, processes)
    cross_in = np.concatenate([c for c, _ in pieces])
    walks_2 = np.concatenate([w for _, w in pieces]) if second else None
    del pieces
    edge_cut = int(cross_in.sum())
    remote_edges = _sum_by(part, cross_in, parts)
    boundary = cross_in > 0
    inner_edges = _sum_by(part[~boundary], in_degree[~boundary], parts)

    # remote dependencies: distinct (receiving part, source) pairs across parts, by (receiver, owner, source): the
    # vertices at in-distance 1 from each part, a level of the table the L-hop counts read (a sort of the cut
    # edges' int64 keys took a fifth of this pass); without levels, marked in a [part, vertex] table above
    depth = part_distances(graph, part, parts, layers, view, processes)
    max_in_degree = np.zeros(parts, dtype=np.int64)
    np.maximum.at(max_in_degree, part, in_degree)
    remote, send_matrix, dep_ids, lhop_vertices, lhop_edges = _by_receiver(depth, marked, part, parts, layers,
                                                                           degrees)
    del marked
    dep_ptr = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(remote, out=dep_ptr[1:])

    # unfolded in-trees: walks[j][u] = in-walks of length j ending at u; edges at depth k = sum_{j<=k} walks[j],
    # read at the dependencies only (column k: column k - 1 plus walks[k] gathered, the same additions as a
    # [vertex, depth] table gathered after: no n x L table built). walks[1] is the in-degree (the sums of ones,
    # exactly). A level whose sums are all below 2**53 (the largest walk count times the edges bounds every
    # partial sum) is exact in any order, so it is summed block by block off the in-CSR; above, a float64 sum
    # depends on its order, so scipy's product over the in-CSR as it is (the matrix built once: an int32 copy of
    # its indices and a float64 one per edge) sums in the order it always did
    dep_subtree_edges = np.empty((len(dep_ids), max(layers, 0)), dtype=np.float64)
    if layers > 0:
        dep_subtree_edges[:, 0] = 0.0
    walks = degrees
    in_adj = None
    for k in range(1, layers):
        if k > 1:
            if k == 2 and walks_2 is not None:
                walks = walks_2  # summed in the pass above
            elif float(walks.max(initial=0.0)) * max(csr.nnz, 1) < 2.0**53:
                values = walks
                walks = np.concatenate(map_processes(lambda r: _in_sums(indptr, indices, values, *r), ranges,
                                                     processes))
            else:
                if in_adj is None:
                    in_adj = sp.csr_matrix((np.ones(csr.nnz, dtype=np.float64), indices, indptr), shape=(n, n))
                walks = in_adj @ walks
        dep_subtree_edges[:, k] = dep_subtree_edges[:, k - 1] + walks[dep_ids]
    del in_adj
    dep_subtree_vertices = dep_subtree_edges + 1.0

    mean = float(vertices.mean())
    return PartStats(
        parts=parts, layers=layers, view=view, num_nodes=n, num_edges=csr.nnz,
        vertices=vertices, edges=edges, remote=remote, send=send_matrix.sum(axis=1), send_matrix=send_matrix,
        remote_edges=remote_edges, inner_edges=inner_edges, max_in_degree=max_in_degree,
        lhop_vertices=lhop_vertices, lhop_edges=lhop_edges, dep_ptr=dep_ptr, dep_ids=dep_ids,
        dep_subtree_edges=dep_subtree_edges, dep_subtree_vertices=dep_subtree_vertices, edge_cut=edge_cut,
        replication_factor=float((vertices.sum() + remote.sum()) / n),
        lhop_replication_factor=float(lhop_vertices.sum() / n),
        vertex_balance=float(vertices.max() / mean) if mean else 1.0,
        edge_balance=_max_over_mean(edges), send_balance=_max_over_mean(send_matrix.sum(axis=1)),
        remote_balance=_max_over_min(remote),
    )


def _by_receiver(depth: np.ndarray, marked: np.ndarray | None, part: np.ndarray, parts: int, layers: int,
                 degrees: np.ndarray) -> tuple[np.ndarray, ...]:
    """(remote, send_matrix, dep_ids, lhop_vertices, lhop_edges) of PartStats, part by receiving part from its
    column of depth[v, i], v's in-distance from V_i (-1 beyond L; gnnc.plan.distances, whose table the row sets of
    a depcache segment read too), or its row of `marked` without levels.

    Part i's dependencies are its column's vertices at distance 1 in id order, stably sorted by owner: (owner, id)
    within the receiver, as a stable sort of every pair by (receiver, owner) gave (the int64 keys of every pair,
    their divmod and that sort were a third of this step at ogbn-products' size). L-hop counts: one bincount per
    column (levels shifted by one, so -1 counts in bin 0, dropped); edges summed in float64 weights, exact below
    2**53 edges."""
    columns = np.ascontiguousarray(depth.T)  # a part's column read once per count below, contiguous
    owners = part.astype(np.uint8 if parts <= 2**8 else np.uint16 if parts <= 2**16 else np.int64)
    remote = np.zeros(parts, dtype=np.int64)
    send_matrix = np.zeros((parts, parts), dtype=np.int64)
    lhop_vertices = np.zeros((parts, layers + 1), dtype=np.int64)
    lhop_edges = np.zeros((parts, layers + 1), dtype=np.int64)
    ids: list[np.ndarray] = []
    for i in range(parts):
        column = columns[i]
        dep = np.flatnonzero(column == 1 if marked is None else marked[i])
        owner = owners[dep]
        ids.append(dep[np.argsort(owner, kind="stable")])
        remote[i] = len(dep)
        send_matrix[:, i] = np.bincount(owner, minlength=parts)
        level = column.astype(np.intp) + 1
        lhop_vertices[i] = np.bincount(level, minlength=layers + 2)[1:]
        lhop_edges[i] = np.bincount(level, weights=degrees, minlength=layers + 2)[1:].astype(np.int64)
    dep_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.intp)
    return remote, send_matrix, dep_ids, lhop_vertices, lhop_edges


def _cross_in(indptr: np.ndarray, indices: np.ndarray, part: np.ndarray, lo: int, hi: int,
              marked: np.ndarray | None = None) -> np.ndarray:
    """int64 [hi - lo]: per destination of rows lo..hi-1, its in-edges from another part, read off the in-CSR
    block of rows by block (a row's part is its destination's, repeated; the sources' parts gathered). `marked`
    ([part, vertex] bool): each (destination's part, cut source) pair set True as well."""
    cross_in = np.zeros(hi - lo, dtype=np.int64)
    degree = np.diff(indptr[lo:hi + 1])
    for a, b in row_blocks(indptr[lo:hi + 1], EDGE_BLOCK):
        first, last = int(indptr[lo + a]), int(indptr[lo + b])
        sources = indices[first:last]
        cut = part[sources] != np.repeat(part[lo + a:lo + b], degree[a:b])
        rows = np.flatnonzero(degree[a:b]) + a
        if len(rows):
            cross_in[rows] = np.add.reduceat(cut, indptr[lo + rows] - first, dtype=np.int64)
        if marked is not None:
            marked[np.repeat(part[lo + a:lo + b], degree[a:b])[cut], sources[cut]] = True
    return cross_in


def _in_sums(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, lo: int = 0,
             hi: int | None = None) -> np.ndarray:
    """float64 [hi - lo]: per CSR row of lo..hi-1 (every row by default), the sum of `values` over its entries'
    columns, block of rows by block (each row's sum of its own entries in their order, whatever the range)."""
    hi = len(indptr) - 1 if hi is None else hi
    out = np.zeros(hi - lo, dtype=np.float64)
    degree = np.diff(indptr[lo:hi + 1])
    for a, b in row_blocks(indptr[lo:hi + 1], EDGE_BLOCK):
        first, last = int(indptr[lo + a]), int(indptr[lo + b])
        rows = np.flatnonzero(degree[a:b]) + a
        if len(rows):
            out[rows] = np.add.reduceat(values[indices[first:last]], indptr[lo + rows] - first)
    return out


def _sum_by(part: np.ndarray, values: np.ndarray, parts: int) -> np.ndarray:
    """int64 [parts]: the sum of `values` (integers) over each part's vertices (float64 weights: exact below
    2**53, an edge count)."""
    return np.bincount(part, weights=values, minlength=parts).astype(np.int64)


def _max_over_mean(a: np.ndarray) -> float:
    mean = float(a.mean())
    return float(a.max()) / mean if mean > 0 else 1.0


def _max_over_min(a: np.ndarray) -> float:
    lo, hi = int(a.min()), int(a.max())
    if hi == 0:
        return 1.0
    return hi / lo if lo > 0 else float("inf")
