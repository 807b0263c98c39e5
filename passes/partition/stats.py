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

from gnnc.passes.partition.core import Partition
from gnnc.graph import sorted_unique
from gnnc.graph import Graph


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


def compute_stats(graph: Graph, partition: Partition | np.ndarray, layers: int, view: str = "plain",
                  num_parts: int | None = None) -> PartStats:
    """The statistics of `partition` on `graph` for an L-layer model (see PartStats).

    `num_parts` counts the parts of an assignment array whose last parts are empty (the
    largest part id + 1 otherwise).
    """
    if isinstance(partition, Partition):
        part, parts = np.asarray(partition.assignment, dtype=np.int64), partition.parts
    else:
        part = np.asarray(partition, dtype=np.int64)
        parts = num_parts if num_parts is not None else int(part.max()) + 1 if len(part) else 1
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    n = graph.num_nodes
    src, dst = (np.asarray(a, dtype=np.int64) for a in graph.edges(view))
    csr = graph.csr(view)
    # each edge's two parts gathered once, as int32 (half the bytes of int64), and the in-degrees read off the CSR:
    # the parts were gathered per edge five times over, a third of this pass at products' size
    small = part.astype(np.int32) if parts < 2**31 else part
    part_src, part_dst = small[src], small[dst]
    vertices = np.bincount(part, minlength=parts)
    edges = np.bincount(part_dst, minlength=parts)
    in_degree = np.diff(csr.indptr.numpy())

    # remote dependencies: distinct (receiving part, source) pairs across parts
    cross = part_src != part_dst
    edge_cut = int(np.count_nonzero(cross))
    receiving = part_dst[cross].astype(np.int64)
    keys = sorted_unique(receiving * n + src[cross])
    receiver, dep = keys // n, keys % n
    owner = part[dep]
    remote = np.bincount(receiver, minlength=parts)
    remote_edges = np.bincount(receiving, minlength=parts)
    boundary = np.zeros(n, dtype=bool)
    boundary[dst[cross]] = True
    inner_edges = np.bincount(part_dst[~boundary[dst]], minlength=parts)
    max_in_degree = np.zeros(parts, dtype=np.int64)
    np.maximum.at(max_in_degree, part, in_degree)
    send_matrix = np.bincount(owner * parts + receiver, minlength=parts * parts).reshape(parts, parts)
    order = np.lexsort((dep, owner, receiver))
    dep_ids = dep[order]
    dep_ptr = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(remote, out=dep_ptr[1:])

    # unfolded in-trees: walks[j][u] = in-walks of length j ending at u; edges at depth k = sum_{j<=k} walks[j]
    # the graph's in-CSR (rows: destinations) as it is: a matrix built from the edge list sorted the edges again
    # (a third of this pass at products' size); duplicates stay separate entries, the same integer sums
    in_adj = sp.csr_matrix((np.ones(csr.nnz, dtype=np.float64), csr.indices.numpy(), csr.indptr.numpy()),
                           shape=(n, n))
    tree_edges = np.zeros((n, max(layers, 0)), dtype=np.float64)
    walks = np.ones(n, dtype=np.float64)
    for k in range(1, layers):
        walks = in_adj @ walks
        tree_edges[:, k] = tree_edges[:, k - 1] + walks
    dep_subtree_edges = tree_edges[dep_ids]
    dep_subtree_vertices = dep_subtree_edges + 1.0

    lhop_vertices, lhop_edges = _lhop(in_adj, part, parts, layers, in_degree)
    mean = float(vertices.mean())
    return PartStats(
        parts=parts, layers=layers, view=view, num_nodes=n, num_edges=len(src),
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


def _lhop(in_adj: sp.csr_matrix, part: np.ndarray, parts: int, layers: int, in_degree: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and in-edges per BFS level of every part's in-neighbourhood, all parts at once.

    depth[v, i] is v's in-distance from V_i (-1 beyond L); one sparse product
    per level moves the frontier of every part to its in-neighbours, until no part's frontier is left: the
    levels beyond are empty. A deep model on a small-world graph reaches every vertex within a few hops (GCNII
    x32 on the 89,000-vertex SBM: 6 products, where one per layer made 32, most of this pass).
    """
    n = len(part)
    depth = np.full((n, parts), -1, dtype=np.int16)
    depth[np.arange(n), part] = 0
    out_adj = in_adj.T.tocsr()  # row u: the vertices u sends to
    frontier = (depth == 0).astype(np.float32)
    for level in range(1, layers + 1):
        reached = out_adj @ frontier > 0  # u reaches the frontier through one of its out-edges
        new = reached & (depth < 0)
        if not new.any():
            break  # nothing new at this level, so nothing at any later one
        depth[new] = level
        frontier = new.astype(np.float32)
    # per (part, level) in one pass over depth, not one comparison of the whole table per level
    cell = np.flatnonzero(depth.reshape(-1) >= 0)
    vertex, column = np.divmod(cell, parts)
    key = column * (layers + 1) + depth.reshape(-1)[cell]
    size = parts * (layers + 1)
    lhop_vertices = np.bincount(key, minlength=size).reshape(parts, layers + 1).astype(np.int64)
    # integer sums in float64 weights: exact below 2**53 edges
    lhop_edges = np.bincount(key, weights=in_degree[vertex], minlength=size).reshape(parts, layers + 1)
    return lhop_vertices, lhop_edges.astype(np.int64)


def _max_over_mean(a: np.ndarray) -> float:
    mean = float(a.mean())
    return float(a.max()) / mean if mean > 0 else 1.0


def _max_over_min(a: np.ndarray) -> float:
    lo, hi = int(a.min()), int(a.max())
    if hi == 0:
        return 1.0
    return hi / lo if lo > 0 else float("inf")
