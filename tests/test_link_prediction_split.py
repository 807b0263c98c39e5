"""Link prediction's edge split, training negatives and metrics (issue 37 item 1), without a model.

The split is checked against PyG's RandomLinkSplit (same counts, message-passing edges without the held-out
ones in both directions), the metrics against their definitions (Mann-Whitney's AUC; OGB's Hits@K and MRR
written out from the evaluator's rules), the negatives for being non-edges, distinct, seeded.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnc
from gnnc.errors import GnncError
from gnnc.graph.edge_split import message_graph, split_edges
from gnnc.runtime.link_task import hits_at_k, mrr, pair_auc


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


def _keys(pairs: np.ndarray, n: int) -> set[int]:
    return set((pairs[0].astype(np.int64) * n + pairs[1]).tolist())


def test_split_counts_match_pygs_random_link_split(cora) -> None:
    T = pytest.importorskip("torch_geometric.transforms")
    from torch_geometric.data import Data

    data = Data(edge_index=torch.as_tensor(np.stack([cora.src, cora.dst]), dtype=torch.int64),
                num_nodes=cora.num_nodes)
    train, val, test = T.RandomLinkSplit(num_val=0.05, num_test=0.10, is_undirected=True,
                                         add_negative_train_samples=False)(data)
    s = split_edges(cora.src, cora.dst, cora.num_nodes, 0.05, 0.10, 1.0, seed=0)
    assert s.undirected
    assert s.train_pos.shape[1] == train.edge_label_index.shape[1] == 4488
    assert s.val_pos.shape[1] == int(val.edge_label.sum()) == 263
    assert s.val_neg.shape[1] == int((val.edge_label == 0).sum())
    assert s.test_pos.shape[1] == int(test.edge_label.sum()) == 527
    assert s.test_neg.shape[1] == int((test.edge_label == 0).sum())
    assert int(s.message_edges.sum()) == train.edge_index.shape[1] == 2 * 4488


def test_message_edges_hold_no_held_out_edge_in_either_direction(cora) -> None:
    n = cora.num_nodes
    s = split_edges(cora.src, cora.dst, n, seed=3)
    mp = message_graph(cora, s)
    kept = _keys(np.stack([mp.src, mp.dst]), n)
    held = np.concatenate([s.val_pos, s.test_pos], 1)
    assert not kept & (_keys(held, n) | _keys(held[::-1], n))
    assert _keys(s.train_pos, n) <= kept and _keys(s.train_pos[::-1], n) <= kept  # both directions kept
    every = _keys(np.stack([cora.src, cora.dst]), n)
    for neg in (s.val_neg, s.test_neg):
        assert not _keys(neg, n) & every  # no edge of the graph (an undirected graph: neither direction)
        assert (neg[0] != neg[1]).all() and len(_keys(neg, n)) == neg.shape[1]  # no self-loop, distinct


def test_split_is_seeded(cora) -> None:
    a, b = (split_edges(cora.src, cora.dst, cora.num_nodes, seed=1) for _ in range(2))
    c = split_edges(cora.src, cora.dst, cora.num_nodes, seed=2)
    for field in ("train_pos", "val_pos", "val_neg", "test_pos", "test_neg"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.test_pos, c.test_pos) and not np.array_equal(a.test_neg, c.test_neg)


def test_directed_graph_holds_out_one_direction() -> None:
    src, dst = np.array([0, 1, 2, 3, 4, 0, 2]), np.array([1, 2, 3, 4, 0, 2, 0])
    s = split_edges(src, dst, 5, val=0.0, test=0.3, seed=0)
    assert not s.undirected and s.test_pos.shape[1] == 2 and s.val_pos.shape[1] == 0
    kept = _keys(np.stack([src[s.message_edges], dst[s.message_edges]]), 5)
    assert not kept & _keys(s.test_pos, 5) and kept | _keys(s.test_pos, 5) == _keys(np.stack([src, dst]), 5)


def test_bad_split_is_refused() -> None:
    with pytest.raises(GnncError, match="val_edges"):
        split_edges(np.array([0]), np.array([1]), 2, val=0.6, test=0.5)
    with pytest.raises(GnncError, match="too few"):
        split_edges(np.array([0, 1]), np.array([1, 0]), 2, val=0.05, test=0.1)


def _auc_by_definition(pos: torch.Tensor, neg: torch.Tensor) -> float:
    d = pos[:, None] - neg[None, :]
    return float(((d > 0).double() + 0.5 * (d == 0).double()).mean())


def test_metrics_follow_their_definitions() -> None:
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 40, (300,), generator=gen).float()  # many ties on purpose
    neg = torch.randint(0, 30, (500,), generator=gen).float()
    assert pair_auc(pos, neg) == pytest.approx(_auc_by_definition(pos, neg), abs=1e-12)
    for k in (1, 20, 100):  # OGB: positives strictly above the K-th best negative
        kth = torch.sort(neg, descending=True).values[k - 1]
        assert float(hits_at_k(pos, neg, k)) == pytest.approx(float((pos > kth).double().mean()))
    assert float(hits_at_k(pos, neg[:5], 20)) == 1.0  # fewer negatives than K: OGB's 1
    # OGB's MRR: rank = 1 + (optimistic + pessimistic) / 2 over the negatives
    ranks = 1 + 0.5 * ((neg[None, :] > pos[:, None]).sum(1) + (neg[None, :] >= pos[:, None]).sum(1)).double()
    assert float(mrr(pos, neg)) == pytest.approx(float((1 / ranks).mean()))


def test_training_negatives_are_seeded_non_edges(cora) -> None:
    from gnnc.runtime.link_task import LinkWorker
    from gnnc.runtime.train import TrainConfig

    model = gnnc.load_model("examples/link_gae.gnn")
    program = model.program(cora)
    worker = LinkWorker(program, cora, TrainConfig(seed=5, progress=False))
    a, b, c = worker.negatives(0), worker.negatives(0), worker.negatives(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (2, worker.train_pos.shape[1]) and bool((a[0] != a[1]).all())
    n = cora.num_nodes
    hit = np.isin((a[0] * n + a[1]).numpy(), worker.split.message_keys)
    assert hit.mean() < 1e-3  # three redraws: a message edge survives with probability density**4
