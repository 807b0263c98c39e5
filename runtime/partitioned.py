"""The graph as one worker sees it under each layout.

* vertex-partitioned (`depcomm`, `bcast1d`): the worker owns the vertices of
  its part (rows in increasing global id) and the in-edges of those
  vertices. Under `halo` columns, a source is an owned row or one of the
  remote in-neighbours B_i, which come after the owned rows ordered by
  (owner, global id) — the order the owners send them in. Under `blocks`
  columns, every vertex is a column in block order (part 0's vertices, then
  part 1's, ...), the order of MG-GCN's staged broadcast.
* replicated (`depcache`): the worker holds its vertices and their L-hop
  in-neighbourhood, owned rows first; a vertex at depth < L keeps all its
  in-edges, the frontier (depth L) none, so the owned rows come out exact
  after L layers.

Edge data (gcn_norm) and dropout ids are global, so every worker computes
what one process computes for the rows it owns.

Not built yet, NeutronStar's hybrid generalises both: per graph layer k a row
set C_k (owned rows first, C_L = owned, C_{k-1} = C_k plus the dependencies
cached at layer k, so the sets nest) and a halo H_{k-1} = (C_k and its
in-neighbours) minus C_{k-1}, fetched from the owners. depcomm is C_k = owned,
depcache the k-hop closures; vertex-wise ops take the first |C_k| rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from gnnc.runtime.comm import HaloPlan
from gnnc.runtime.executor import GraphView
from gnnc.runtime.graph import CSR, Graph


@dataclass
class LocalGraph:
    """Rows held here (global ids), which of them are owned, and one GraphView per edge view."""

    rows: torch.Tensor  # global ids of the rows held here, owned first
    n_owned: int
    views: dict[str, GraphView]
    halo: HaloPlan | None = None  # depcomm
    block_rows: list[int] | None = None  # bcast1d: rows per rank's block
    block_views: dict[str, GraphView] | None = None  # bcast1d layers beside depcomm ones

    @property
    def owned(self) -> torch.Tensor:
        return self.rows[: self.n_owned]


def _owned_ids(parts: np.ndarray, rank: int) -> np.ndarray:
    return np.nonzero(parts == rank)[0].astype(np.int64)


def _view(graph: Graph, view: str, sel: np.ndarray, local_src: np.ndarray, local_dst: np.ndarray,
          n_dst: int, n_src: int, deg_override: np.ndarray | None = None) -> GraphView:
    csr = CSR.from_edges(local_src, local_dst, n_dst, n_src)
    global_eids = torch.as_tensor(sel, dtype=torch.int64)[csr.eids]
    norm = graph.gcn_norm(view)[global_eids]
    return GraphView(csr, csr.indices, csr.dst_index(), global_eids, {"gcn_norm": norm},
                     csr.in_degree().to(torch.float32))


def remote_in_neighbours(graph: Graph, parts: np.ndarray, world: int, views: list[str]) -> list[np.ndarray]:
    """B_p for every part p: the distinct remote in-neighbours of its vertices over the views' edges,
    ordered by (owner, global id), the order each owner sends its rows in."""
    out: list[np.ndarray] = []
    for p in range(world):
        srcs = []
        for v in views:
            s, d = graph.edges(v)
            m = (parts[d] == p) & (parts[s] != p)
            srcs.append(s[m])
        b = np.unique(np.concatenate(srcs)) if srcs else np.zeros(0, np.int64)
        b = b[np.lexsort((b, parts[b]))]
        out.append(b.astype(np.int64))
    return out


def vertex_partitioned(graph: Graph, parts: np.ndarray, rank: int, world: int, views: list[str],
                       columns: str) -> LocalGraph:
    """Owned rows and their in-edges; columns `halo` (depcomm) or `blocks` (bcast1d)."""
    owned = _owned_ids(parts, rank)
    pos = np.full(graph.num_nodes, -1, dtype=np.int64)
    pos[owned] = np.arange(len(owned))
    if columns == "blocks":
        order = np.argsort(parts, kind="stable")  # block order: by part, then global id
        col_of = np.empty(graph.num_nodes, dtype=np.int64)
        col_of[order] = np.arange(graph.num_nodes)
        counts = np.bincount(parts, minlength=world)
        out: dict[str, GraphView] = {}
        for v in views:
            s, d = graph.edges(v)
            sel = np.nonzero(parts[d] == rank)[0]
            out[v] = _view(graph, v, sel, col_of[s[sel]], pos[d[sel]], len(owned), graph.num_nodes)
        return LocalGraph(torch.as_tensor(owned), len(owned), out, block_rows=[int(c) for c in counts])
    remote_of = remote_in_neighbours(graph, parts, world, views)
    halo_ids = remote_of[rank]
    col_of = np.full(graph.num_nodes, -1, dtype=np.int64)
    col_of[owned] = np.arange(len(owned))
    col_of[halo_ids] = len(owned) + np.arange(len(halo_ids))
    out = {}
    for v in views:
        s, d = graph.edges(v)
        sel = np.nonzero(parts[d] == rank)[0]
        out[v] = _view(graph, v, sel, col_of[s[sel]], pos[d[sel]], len(owned), len(owned) + len(halo_ids))
    send_idx = []
    recv_counts = []
    for p in range(world):
        if p == rank:
            send_idx.append(torch.zeros(0, dtype=torch.int64))
            recv_counts.append(0)
            continue
        theirs = remote_of[p]
        mine = theirs[parts[theirs] == rank]  # already sorted by global id
        send_idx.append(torch.as_tensor(pos[mine], dtype=torch.int64))
        recv_counts.append(int(np.count_nonzero(parts[halo_ids] == p)))
    return LocalGraph(torch.as_tensor(owned), len(owned), out, HaloPlan(tuple(send_idx), tuple(recv_counts)))


def replicated_lhop(graph: Graph, parts: np.ndarray, rank: int, layers: int, views: list[str]) -> LocalGraph:
    """Owned vertices plus their `layers`-hop in-neighbourhood (DepCache)."""
    n = graph.num_nodes
    owned = _owned_ids(parts, rank)
    srcs, dsts = zip(*(graph.edges(v) for v in views))
    s_all, d_all = np.concatenate(srcs), np.concatenate(dsts)
    adj_in = sp.csr_matrix((np.ones(len(s_all), dtype=np.int8), (d_all, s_all)), shape=(n, n))  # row d: its sources
    depth = np.full(n, -1, dtype=np.int64)
    depth[owned] = 0
    frontier = np.zeros(n, dtype=bool)
    frontier[owned] = True
    for k in range(1, layers + 1):
        reached = np.asarray(adj_in.T @ frontier.astype(np.int8)).ravel() > 0  # sources of the frontier
        new = reached & (depth < 0)
        depth[new] = k
        frontier = new
    others = np.nonzero(depth > 0)[0]
    rows = np.concatenate([owned, others]).astype(np.int64)
    pos = np.full(n, -1, dtype=np.int64)
    pos[rows] = np.arange(len(rows))
    out = {}
    for v in views:
        s, d = graph.edges(v)
        sel = np.nonzero((depth[d] >= 0) & (depth[d] < layers))[0]
        out[v] = _view(graph, v, sel, pos[s[sel]], pos[d[sel]], len(rows), len(rows))
    return LocalGraph(torch.as_tensor(rows), len(owned), out)
