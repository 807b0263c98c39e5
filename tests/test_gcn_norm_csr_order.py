"""gcn_norm in a view's CSR order is its edge-order values gathered by the CSR's edge ids, bit for bit.

A plan's structures carry each edge's gcn_norm in their CSR's order (gnnc.plan.rows._edge_data_in_csr_order); it is
computed there from the CSR, a block of rows at a time, not gathered by edge id over every edge (at ogbn-products'
size the gather and the edge-order norm were 19.3 s of a GCN plan's save). Graphs with self-loops, duplicate edges
and isolated vertices, with and without weights (zeros and negatives among them: a zero in-degree gives 0, a
negative one NaN, as in edge order), on both views, in one block and in many.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_graph
from gnnc.graph import storage


def _graph(seed: int, weighted: bool):
    graph = random_graph(n=300 + 50 * seed, e=2000, f=3, c=2, seed=seed)
    if weighted:
        rng = np.random.default_rng(seed)
        w = rng.random(graph.num_edges).astype(np.float32)
        w[rng.random(graph.num_edges) < 0.1] = 0.0
        w[rng.random(graph.num_edges) < 0.05] *= -3.0
        graph.edge_data = {"weight": torch.from_numpy(w)}
    return graph


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("view", ["plain", "self_loops"])
@pytest.mark.parametrize("block", [1 << 16, 7])
def test_csr_order_is_the_edge_order_gathered(seed: int, weighted: bool, view: str, block: int, monkeypatch) -> None:
    monkeypatch.setattr(storage, "NORM_BLOCK_ROWS", block)
    graph = _graph(seed, weighted)
    want = graph.gcn_norm(view).numpy()[graph.csr(view).eids.numpy()]
    got = _graph(seed, weighted).gcn_norm_in_csr_order(view)  # a graph that has not computed the edge order's
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))
    assert weighted or not np.isnan(want).any()  # (NaN only from a negative weighted degree)
