"""The neighbour sampler (gnnc.graph.sampling): real edges, fan-outs, prefixes, seeds, uniformity, self-loops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_graph
from gnnc.errors import GnncError
from gnnc.graph import Graph
from gnnc.graph.sampling import (FULL, NeighbourSampler, SamplingConfig, SamplingView, merge_blocks, pack_block,
                                 packed_size, unpack_block)


def edge_set(block, view_src, view_dst):
    """(global src, global dst) of every block edge, checked against the view's edge ids."""
    dst = np.repeat(block.dst_ids, np.diff(block.indptr))
    src = block.src_ids[block.indices]
    assert (view_src[block.eids] == src).all() and (view_dst[block.eids] == dst).all()
    return sorted(zip(block.eids.tolist(), dst.tolist()))


@pytest.mark.parametrize("view", ["plain", "self_loops"])
def test_blocks_hold_real_edges_within_the_fanout_destinations_first(view) -> None:
    g = random_graph(n=80, e=600, seed=1)
    s = NeighbourSampler(g, [view, view], [3, 2], seed=0)
    seeds = np.array([5, 9, 40, 2])
    mb = s.sample(seeds, epoch=0, index=0)
    vs, vd = g.edges(view)
    assert (mb.blocks[-1].dst_ids == seeds).all()
    assert (mb.blocks[0].dst_ids == mb.blocks[1].src_ids).all()  # layer l's sources are layer l+1's... rows
    loops = 1 if view == "self_loops" else 0
    for block, k in zip(mb.blocks, [3, 2]):
        edge_set(block, vs, vd)
        assert len(np.unique(block.src_ids)) == block.n_src
        kept = np.diff(block.indptr)
        cand = SamplingView(g, view).degree[block.dst_ids]
        assert (kept == np.minimum(cand, k) + loops).all()
        if loops:  # exactly one loop per destination, its last edge
            ends = block.indptr[1:] - 1
            assert (block.src_ids[block.indices[ends]] == block.dst_ids).all()
            body = np.setdiff1d(np.arange(block.nnz), ends)
            assert (block.src_ids[block.indices[body]] != np.repeat(block.dst_ids, kept - 1)).all()


def test_full_fanout_is_the_whole_in_neighbourhood_in_csr_order() -> None:
    g = random_graph(n=60, e=300, seed=2)
    s = NeighbourSampler(g, ["plain"], [FULL], seed=0)
    seeds = np.arange(0, 60, 4)
    block = s.sample(seeds, 0, 0).blocks[0]
    csr = g.csr("plain")
    want = np.concatenate([csr.eids[csr.indptr[v]:csr.indptr[v + 1]].numpy() for v in seeds])
    assert (block.eids == want).all()


def test_seeded_reproducible_and_a_subset_of_seeds_gets_the_same_edges() -> None:
    g = random_graph(n=200, e=3000, seed=3)
    s = NeighbourSampler(g, ["plain", "plain"], [4, 3], seed=11)
    seeds = np.arange(0, 200, 3)
    a, b = s.sample(seeds, 2, 5), NeighbourSampler(g, ["plain", "plain"], [4, 3], seed=11).sample(seeds, 2, 5)
    for x, y in zip(a.blocks, b.blocks):
        assert (x.src_ids == y.src_ids).all() and (x.eids == y.eids).all() and (x.indptr == y.indptr).all()
    other = NeighbourSampler(g, ["plain", "plain"], [4, 3], seed=12).sample(seeds, 2, 5)
    assert not np.array_equal(other.blocks[0].eids, a.blocks[0].eids)
    assert not np.array_equal(s.sample(seeds, 3, 5).blocks[0].eids, a.blocks[0].eids)
    part = s.sample(seeds[::4], 2, 5)  # what a worker owning a quarter of the seeds samples
    vs, vd = g.edges("plain")
    for whole, mine in zip(a.blocks, part.blocks):
        assert set(edge_set(mine, vs, vd)) <= set(edge_set(whole, vs, vd))
    last = part.blocks[-1]
    assert edge_set(last, vs, vd) == [e for e in edge_set(a.blocks[-1], vs, vd) if e[1] in set(seeds[::4])]


@pytest.mark.parametrize("fanout", [5, 30])  # 5: drawn (100 > 4 x 5); 30: the k smallest keys
def test_each_neighbour_is_kept_with_probability_k_over_degree(fanout) -> None:
    hub, deg = 0, 100
    src = np.arange(1, deg + 1)
    g = Graph(deg + 1, src, np.zeros(deg, dtype=np.int64), torch.zeros(deg + 1, 1),
              torch.zeros(deg + 1, dtype=torch.int64), *(torch.zeros(deg + 1, dtype=torch.bool),) * 3)
    s = NeighbourSampler(g, ["plain"], [fanout], seed=0)
    trials = 2000
    counts = np.zeros(deg + 1)
    for t in range(trials):
        block = s.sample(np.array([hub]), 0, t).blocks[0]
        assert block.nnz == fanout and len(np.unique(block.src_ids[block.indices])) == fanout
        np.add.at(counts, block.src_ids[block.indices], 1)
    p = fanout / deg
    sd = np.sqrt(trials * p * (1 - p))
    assert np.abs(counts[1:] - trials * p).max() < 5 * sd  # every neighbour within 5 sigma of k/deg


def test_epoch_batches_cover_the_seeds_once_in_a_seeded_order() -> None:
    g = random_graph(n=100, e=400, seed=4)
    s = NeighbourSampler(g, ["plain"], [2], seed=5)
    seeds = np.arange(100)
    batches = s.epoch_batches(0, seeds, 30)
    assert [len(b) for b in batches] == [30, 30, 30, 10]
    assert sorted(np.concatenate(batches).tolist()) == list(range(100))
    assert np.array_equal(np.concatenate(batches), np.concatenate(s.epoch_batches(0, seeds, 30)))
    assert not np.array_equal(np.concatenate(batches), np.concatenate(s.epoch_batches(1, seeds, 30)))


def test_edge_scale_is_degree_over_kept_on_sampled_edges_and_one_on_loops() -> None:
    g = random_graph(n=80, e=800, seed=6)
    s = NeighbourSampler(g, ["self_loops"], [2], seed=0)
    block = s.sample(np.arange(10), 0, 0).blocks[0]
    view = s.views["self_loops"]
    scale = view.edge_scale(block)
    loops = block.eids >= view.loop_eid0
    assert (scale[loops] == 1).all()
    dst = np.repeat(block.dst_ids, np.diff(block.indptr))[~loops]
    kept = np.minimum(view.degree[dst], 2)
    assert np.allclose(scale[~loops], view.degree[dst] / kept)


def test_merge_and_pack_keep_every_block() -> None:
    g = random_graph(n=80, e=600, seed=7)
    s = NeighbourSampler(g, ["plain"], [3], seed=0)
    blocks = [s.sample(np.array(ids), 0, 0).blocks[0] for ids in ([1, 2, 3], [4, 5], [2, 7])]
    for b in blocks:
        u = unpack_block(pack_block(b))
        assert all(np.array_equal(getattr(u, f), getattr(b, f)) for f in ("src_ids", "indptr", "indices", "eids"))
        small = pack_block(b, np.dtype(np.int32), edge_ids=False)  # P3's push: int32 ids, no edge ids
        assert small.dtype == np.int32 and len(small) == packed_size(b.n_src, b.n_dst, b.nnz, edge_ids=False)
        u = unpack_block(small, edge_ids=False)
        assert all(np.array_equal(getattr(u, f), getattr(b, f)) for f in ("src_ids", "indptr", "indices"))
        assert (u.eids == -1).all()
    m = merge_blocks(blocks)
    assert m.n_dst == 7 and (m.dst_ids == [1, 2, 3, 4, 5, 2, 7]).all()
    vs, vd = g.edges("plain")
    assert edge_set(m, vs, vd) == sorted(e for b in blocks for e in edge_set(b, vs, vd))


def test_the_configuration_is_checked() -> None:
    assert SamplingConfig.parse("25,10", 512).layer_fanouts(2) == [10, 25]
    for text, batch, msg in [("25,x", 5, "comma-separated"), ("25,0", 5, "positive count or -1"),
                             ("25", None, "needs --batch-size"), ("25", 0, "at least 1")]:
        with pytest.raises(GnncError, match=msg):
            SamplingConfig.parse(text, batch)
    with pytest.raises(GnncError, match="gives 1 fan-outs for a model with 2 graph layers"):
        SamplingConfig.parse("25", 4).layer_fanouts(2)
