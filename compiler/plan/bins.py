"""G3's bins: a worker's output rows of a layer in priority order, cut into bins, each with its in-edges.

Why this module exists: the schedule pass decides how many bins a layer
runs in (`bins=k`) and by which rule they are ordered (`bin_order`,
gnnc.plan.schedule_attrs); the order itself follows from the worker's own
structure, so it is derived here, deterministically, from the LayerGraph a
worker loads. The runtime executes the bins in this order; nothing about
them is decided while the data moves.

G3's priority list (section 5.3, step 1): a breadth-first traversal of the
worker's part, started from the vertices with a remote neighbour, and those
vertices moved to the front. Here a row is *boundary* when one of its
in-neighbours is not one of the layer's output rows (a halo row, or a
replica another worker owns: its inputs arrive over the network) or when a
peer receives its row (it is in the halo plan's send lists: its output
leaves through it). The traversal runs over the undirected edges among
output rows, from every boundary row (and from one row of each component
without one), so a bin holds neighbours together. The list puts the rows
whose inputs arrive first, then the rows only sent, then the others, each
group in traversal order: that concentrates the rows that wait for the halo
in the first bins and leaves the later bins *held* (every source they read
is held), so they can run while the halo is in flight (G3's eager
computation); gnnc sends a layer's rows in one exchange after the layer, not
bin by bin, so putting the sent rows first buys nothing more here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import breadth_first_order, connected_components

from gnnc.graph import CSR, GraphView
from gnnc.plan.rows import LayerGraph


def boundary_rows(lg: LayerGraph, view: str) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the layer's output rows with an in-neighbour that is not an output row (their inputs
    arrive over the network), and of those a peer receives (their outputs leave through it)."""
    v = lg.views[view]
    receiving = np.zeros(lg.n_out, dtype=bool)
    src, dst = v.src.numpy(), v.dst.numpy()
    receiving[dst[src >= lg.n_out]] = True
    sent = np.zeros(lg.n_out, dtype=bool)
    if lg.halo is not None:
        for idx in lg.halo.send_idx:
            rows = idx.numpy()
            sent[rows[rows < lg.n_out]] = True
    return receiving, sent


def priority_order(lg: LayerGraph, view: str) -> np.ndarray:
    """G3's priority list of the layer's output rows (positions 0..n_out-1), boundary rows first."""
    n = lg.n_out
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    v = lg.views[view]
    src, dst = v.src.numpy(), v.dst.numpy()
    local = (src < n) & (src != dst)
    adj = sp.csr_matrix((np.ones(int(local.sum()), dtype=np.int8), (dst[local], src[local])), shape=(n, n))
    receiving, sent = boundary_rows(lg, view)
    boundary = receiving | sent
    # one start per component without a boundary row (its first row), so the traversal reaches every row
    _, label = connected_components(adj, directed=False)
    seeded = np.zeros(int(label.max()) + 1, dtype=bool)
    seeded[label[boundary]] = True
    first = np.full(len(seeded), n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n))
    starts = np.concatenate([np.nonzero(boundary)[0], first[~seeded]])
    # a virtual root (row n) joined to every start: one traversal visits the starts first, then outwards
    root = sp.csr_matrix((np.ones(len(starts), dtype=np.int8), (np.full(len(starts), n), starts)), shape=(n + 1, n + 1))
    grown = sp.bmat([[adj, None], [None, sp.csr_matrix((1, 1), dtype=np.int8)]], format="csr") + root
    order = breadth_first_order(grown, n, directed=False, return_predecessors=False)[1:].astype(np.int64)
    rank = np.where(receiving[order], 0, np.where(sent[order], 1, 2))
    return order[np.argsort(rank, kind="stable")]


@dataclass
class Bins:
    """A layer's output rows in bins, each with the in-edges of its rows.

    rows[b]: positions of bin b's output rows (in priority order).
    views[b]: bin b's in-edges, destinations numbered 0..len(rows[b])-1 within the bin and sources
        0..len(sources[b])-1 (G3's bin subgraph: the bin's rows and the neighbours they read).
    sources[b]: the layer's source rows bin b reads, ascending (the rows a bin gathers).
    pos[b]: the positions of bin b's edges in the order the layer view's per-edge data is held in.
    held[b]: every source of bin b is a held row: it can run before the layer's halo has arrived.
    """

    rows: list[torch.Tensor]
    views: list[GraphView]
    sources: list[torch.Tensor]
    pos: list[torch.Tensor]
    held: list[bool]

    def __len__(self) -> int:
        return len(self.rows)


def _bin_view(v: GraphView, rows: torch.Tensor, n_in: int) -> tuple[GraphView, torch.Tensor, torch.Tensor, bool]:
    """Bin `rows`'s in-edges with their sources renumbered compactly: (view, sources, edge positions, held)."""
    indptr = v.csr.indptr
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    total = int(counts.sum())
    offsets = torch.cumsum(counts, 0) - counts
    pos = torch.repeat_interleave(starts - offsets, counts) + torch.arange(total)
    sources, cols = torch.unique(v.src[pos], sorted=True, return_inverse=True)
    held = bool(total == 0 or int(sources[-1]) < n_in)
    bptr = torch.zeros(len(rows) + 1, dtype=torch.int64)
    bptr[1:] = torch.cumsum(counts, 0)
    edge_ids = v.edge_ids[pos]
    csr = CSR(bptr, cols, edge_ids, len(rows), len(sources))
    view = GraphView(csr, csr.indices, csr.dst_index(), edge_ids, {k: t[pos] for k, t in v.edge_data.items()},
                     v.deg[rows])
    return view, sources, pos, held


def layer_bins(lg: LayerGraph, view: str, bins: int, order: str = "boundary_bfs") -> Bins:
    """The layer's output rows cut into `bins` bins of (nearly) equal size in `order` (built once)."""
    key = ("bins", view, bins, order)
    if key not in lg._cache:
        if order != "boundary_bfs":
            raise ValueError(f"unknown bin order {order!r}")
        prio = torch.from_numpy(priority_order(lg, view))
        bounds = [round(b * lg.n_out / bins) for b in range(bins + 1)]
        out = Bins([], [], [], [], [])
        for b in range(bins):
            rows = prio[bounds[b]:bounds[b + 1]]
            bv, sources, pos, held = _bin_view(lg.views[view], rows, lg.n_in)
            out.rows.append(rows)
            out.views.append(bv)
            out.sources.append(sources)
            out.pos.append(pos)
            out.held.append(held)
        lg._cache[key] = out
    return lg._cache[key]
