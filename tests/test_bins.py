"""G3's bins as a worker builds them (gnnc.plan.bins): priority order, bin subgraphs, held bins.

The order is G3's priority list: breadth-first from the rows with a remote neighbour, the rows whose
inputs arrive over the network first, then the rows only sent, then the rest. A bin holds its rows'
in-edges with their sources renumbered (G3's bin subgraph); a bin is held when every source it reads
is held, so it can run before the halo arrives. Counted by hand on a path of 8 vertices.
"""
from __future__ import annotations

import numpy as np
import torch

from gnnc.graph import CSR, GraphView
from gnnc.plan.bins import boundary_rows, layer_bins, priority_order
from gnnc.plan.halo import HaloPlan
from gnnc.plan.rows import LayerGraph


def path_layer() -> LayerGraph:
    """A worker owning vertices 0..7 of a path 0-1-...-7 (both directions) plus a halo row 8 (a remote
    vertex joined to 0); it sends row 7 to the peer."""
    und = [(i, i + 1) for i in range(7)]
    src = [a for a, b in und] + [b for a, b in und] + [8]
    dst = [b for a, b in und] + [a for a, b in und] + [0]
    csr = CSR.from_edges(np.array(src), np.array(dst), 8, 9)
    view = GraphView(csr, csr.indices, csr.dst_index(), torch.arange(csr.nnz), {}, csr.in_degree().float())
    halo = HaloPlan((torch.zeros(0, dtype=torch.int64), torch.tensor([7])), (0, 1))
    return LayerGraph(8, 8, {"plain": view}, halo)


def test_boundary_rows_receive_or_send() -> None:
    receiving, sent = boundary_rows(path_layer(), "plain")
    assert np.nonzero(receiving)[0].tolist() == [0] and np.nonzero(sent)[0].tolist() == [7]


def test_priority_is_receiving_then_sent_then_breadth_first() -> None:
    order = priority_order(path_layer(), "plain")
    # 0 receives, 7 is sent; the traversal from both reaches 1 and 6 first, then 2 and 5, ...
    assert order.tolist() == [0, 7, 1, 6, 2, 5, 3, 4]


def test_bins_cover_every_row_once_with_compact_sources() -> None:
    lg = path_layer()
    bins = layer_bins(lg, "plain", 3)
    rows = torch.cat(bins.rows)
    assert sorted(rows.tolist()) == list(range(8)) and [len(r) for r in bins.rows] == [3, 2, 3]
    view = lg.views["plain"]
    for b in range(3):
        bv, sources, pos = bins.views[b], bins.sources[b], bins.pos[b]
        assert bv.csr.n_dst == len(bins.rows[b]) and bv.csr.n_src == len(sources)
        # each edge of the bin is one of the layer's, from the same source to the same row
        torch.testing.assert_close(sources[bv.src], view.src[pos])
        torch.testing.assert_close(bins.rows[b][bv.dst], view.dst[pos])
        assert int(bv.csr.nnz) == int(view.csr.in_degree()[bins.rows[b]].sum())
    # the first bin holds row 0, which reads the halo row 8; the others read held rows only
    assert bins.held == [False, True, True]


def test_a_part_without_boundary_rows_is_one_component_traversal() -> None:
    """No halo, nothing sent: the traversal starts from each component's first row."""
    src, dst = np.array([1, 0, 3, 2]), np.array([0, 1, 2, 3])
    csr = CSR.from_edges(src, dst, 5, 5)
    view = GraphView(csr, csr.indices, csr.dst_index(), torch.arange(csr.nnz), {}, csr.in_degree().float())
    order = priority_order(LayerGraph(5, 5, {"plain": view}), "plain")
    # components {0, 1}, {2, 3}, {4}: their first rows, then the rows one step further
    assert order.tolist() == [0, 2, 4, 1, 3]
