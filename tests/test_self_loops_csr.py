"""The self-loops view's CSR built from the plain one equals the one sorted from the view's edges, array for array.

Graph.csr("self_loops") reads the plain CSR where it is held (a store's always is) instead of sorting the
view's edge list (at ogbn-products' size the sort and the list were 17.7 of a GCN compile's 20.5 s of
statistics). Random graphs with self-loops (one, several, or on every vertex), duplicate edges and isolated
vertices, held in memory and opened from a store; and what a plan computes on it (gcn_norm) is unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_graph
from gnnc.graph import CSR, Graph, store


def _graph(seed: int, loops: str) -> Graph:
    g = random_graph(n=200 + 40 * seed, e=1500, f=3, c=2, seed=seed)
    rng = np.random.default_rng(seed)
    if loops == "many":  # repeated loops on some vertices, and duplicate edges
        v = rng.integers(0, g.num_nodes, 60)
        g.src = np.concatenate([g.src, v, v, g.src[:50]])
        g.dst = np.concatenate([g.dst, v, v, g.dst[:50]])
    elif loops == "every":
        v = np.arange(g.num_nodes)
        g.src, g.dst = np.concatenate([v, g.src]), np.concatenate([v, g.dst])
    elif loops == "none":
        keep = g.src != g.dst
        g.src, g.dst = g.src[keep], g.dst[keep]
    g._views.clear()
    return g


def _sorted(g: Graph) -> CSR:
    s, d = g.edges("self_loops")
    return CSR.from_edges(s, d, g.num_nodes)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("loops", ["some", "many", "every", "none"])
def test_from_the_plain_csr_equals_the_sorted_edges(seed: int, loops: str, tmp_path) -> None:
    g = _graph(seed, loops)
    assert (g.src == g.dst).any() == (loops != "none")
    want = _sorted(g)
    g.csr("plain")
    got = g.csr("self_loops")
    for a, b in ((got.indptr, want.indptr), (got.indices, want.indices), (got.eids, want.eids)):
        assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)
    assert (got.n_dst, got.n_src) == (want.n_dst, want.n_src)
    # a store's graph: its stored CSR, the same arrays
    store.write_store(g, tmp_path / "s")
    opened = store.open_store(tmp_path / "s")
    held = opened.csr("self_loops")
    assert torch.equal(held.indices, want.indices) and torch.equal(held.eids, want.eids)
    assert torch.equal(opened.gcn_norm("self_loops"), _graph(seed, loops).gcn_norm("self_loops"))


def test_without_a_plain_csr_the_view_is_sorted(monkeypatch) -> None:
    g = _graph(1, "some")
    calls = []
    real = CSR.from_edges
    monkeypatch.setattr(CSR, "from_edges", staticmethod(lambda *a, **k: calls.append(1) or real(*a, **k)))
    g.csr("self_loops")
    assert calls == [1]
    calls.clear()
    h = _graph(1, "some")
    h.csr("plain")
    h.csr("self_loops")
    assert calls == [1]  # the plain one's sort only
