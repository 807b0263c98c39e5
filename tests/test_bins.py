"""G3's bins as a worker builds them (gnnc.plan.bins): priority order, bin subgraphs, held bins, sizes.

The order is G3's priority list: breadth-first from the rows with a remote neighbour, the rows whose
inputs arrive over the network first, then the rows only sent, then the rest. A bin holds its rows'
in-edges with their sources renumbered (G3's bin subgraph); a bin is held when every source it reads
is held, so it can run before the halo arrives. Counted by hand on a path of 8 vertices. Bins are cut
by the memory they hold (rows and edges by the layer's per-bin widths), and no bin a worker builds on
a power-law graph holds more than the activation estimate prices one bin at.
"""
from __future__ import annotations

import numpy as np
import torch

from conftest import EXAMPLES

import gnnc
from gnnc.cluster import resolve_cluster
from gnnc.graph import CSR, GraphView
from gnnc.passes.cost.activations import estimate
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.bins import BinWidths, bin_bounds, bin_widths, bins_of, boundary_rows, layer_bins, priority_order
from gnnc.plan.halo import HaloPlan
from gnnc.plan.rows import LayerGraph
from gnnc.plan.shards import load_rank


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
    assert sorted(rows.tolist()) == list(range(8)) and [len(r) for r in bins.rows] == [3, 3, 2]
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


def test_bins_take_their_share_of_what_is_left() -> None:
    """Each bin takes rows until it holds the remaining weight over the remaining bins: a heavy row ends
    its bin and the bins after it share the rest; every bin at most total/k plus its last row."""
    weights = np.array([1, 1, 1, 20, 1, 1, 1, 1, 1, 1, 1, 1], dtype=float)  # 32 in all
    bounds = bin_bounds(weights, 4)
    # the first bin reaches 32/4 at the heavy row (23), then 9 left over 3 bins: 3, 3 and the last 2
    assert bounds == [0, 4, 7, 10, 12]
    sizes = [weights[a:b].sum() for a, b in zip(bounds, bounds[1:])]
    assert sizes == [23, 3, 3, 2] and max(sizes) <= weights.sum() / 4 + weights.max()
    assert bin_bounds(np.ones(2), 4) == [0, 1, 2, 2, 2]  # fewer rows than bins: the last bins are empty
    assert bin_bounds(np.ones(8), 3) == [0, 3, 6, 8]


def test_a_layers_per_bin_widths_by_hand() -> None:
    """GAT's first layer in bins (8 heads of 8): per row the aggregation, concat, sync and bias outputs
    (64 each) and the destination's score (8, read at the bin's rows); per edge the score, leaky ReLU,
    softmax (8 each) and dropout (8 and its mask); per source row the features and the source's score."""
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gat.gnn"), graph, workers=2, strategy="depcomm",
                        passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + ["schedule{bins=2}"])
    layer = plan.program.graph_layers()[0]
    assert bin_widths(layer, plan.program.config_dict()) == BinWidths(4 * 64 + 8, 3 * 8 + 8 * 1.25, 64 + 8)


def test_no_bin_holds_more_than_the_estimate_prices(tmp_path) -> None:
    """A skewed graph (R-MAT hubs): every bin each worker builds, counted as it holds its rows, edges and
    gathered sources at the layer's widths, fits the estimate's one-bin working set; bins of equal row
    counts (the cut before bins were sized by memory) do not."""
    graph = gnnc.load_graph("rmat:n=4000,deg=12,features=16,classes=4,seed=0")
    k = 64
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gat.gnn"), graph, workers=2, strategy="depcomm",
                        passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [f"schedule{{bins={k}}}"])
    inputs = planning_inputs(plan.program, graph, plan.parts, resolve_cluster(None))[1]
    priced = estimate(plan.program, inputs).bin_working / 4  # elements
    cfg = plan.program.config_dict()
    shards = plan.write_shards(tmp_path / "shards")
    equal_exceeds = False
    for rank in range(2):
        lg = load_rank(shards, rank, 2).lg
        for layer in plan.program.graph_layers():
            w = bin_widths(layer, cfg)

            def held(bins) -> list[float]:
                return [len(r) * w.row + len(p) * w.edge + len(s) * w.source
                        for r, p, s in zip(bins.rows, bins.pos, bins.sources)]

            sized = held(bins_of(lg.layers[layer.name], layer, cfg))
            assert max(sized) <= priced[rank], (rank, layer.name, max(sized), priced[rank])
            equal = held(layer_bins(lg.layers[layer.name], layer.edges, k))
            equal_exceeds |= max(equal) > priced[rank]
    assert equal_exceeds
