"""Mini-batches of many graphs (PyG's DataLoader over `Batch`), and the folds graph classification is judged on.

A batch is one block-diagonal graph: the graphs' nodes one after the other (graph k's nodes renumbered from the
sum of the sizes before it), their edges likewise, and a `batch` vector giving every node's graph row (0..B-1,
in the batch's order), as `torch_geometric.data.Batch` builds it.

Batches (`epoch_batches`): every epoch the training graphs are shuffled by a generator seeded with (seed, epoch)
and cut into batches of `batch_size` in that order (the last one smaller), as PyG's `DataLoader(shuffle=True)`
does; an evaluation visits the graphs in dataset order.

Folds (`stratified_folds`, `fold_split`): 10-fold stratified cross validation as PyG's GIN benchmark
(benchmark/kernel/train_eval.py) runs it: the graphs of each class are shuffled (seeded) and dealt round-robin
into k folds, so every fold has each class in the dataset's proportion; in run i fold i is the test set, fold
i-1 the validation set and the other k-2 folds the training set.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.graph.storage import Graph
from gnnc.graph.tu_dataset import GraphDataset

DEFAULT_FOLDS = 10
DEFAULT_BATCH_SIZE = 128  # PyG's GIN example


def stratified_folds(y: np.ndarray, folds: int = DEFAULT_FOLDS, seed: int = 0) -> list[np.ndarray]:
    """`folds` disjoint, sorted arrays of graph ids covering every graph, each class spread evenly (seeded)."""
    if folds < 3:
        raise GnncError(f"{folds}-fold cross validation: it needs at least 3 folds (test, validation, training)")
    if folds > len(y):
        raise GnncError(f"{folds}-fold cross validation needs at least {folds} graphs; the dataset has {len(y)}")
    rng = np.random.default_rng(seed)
    out: list[list[int]] = [[] for _ in range(folds)]
    k = 0
    for c in np.unique(y):
        ids = np.flatnonzero(y == c)
        rng.shuffle(ids)
        for g in ids:  # dealt on from where the last class stopped, so the folds' sizes differ by at most one
            out[k % folds].append(int(g))
            k += 1
    return [np.sort(np.asarray(f, dtype=np.int64)) for f in out]


def fold_split(folds: list[np.ndarray], fold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) graph ids of run `fold`: test fold `fold`, validation fold `fold - 1`, the rest train."""
    k = len(folds)
    if not 0 <= fold < k:
        raise GnncError(f"fold {fold} of {k}-fold cross validation: expected 0..{k - 1}")
    test, val = folds[fold], folds[(fold - 1) % k]
    train = np.sort(np.concatenate([f for i, f in enumerate(folds) if i not in (fold, (fold - 1) % k)]))
    return train, val, test


def epoch_batches(train: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """This epoch's training batches: the graphs shuffled by (seed, epoch), cut into batch_size pieces."""
    if batch_size < 1:
        raise GnncError(f"training(batch_size=...): must be at least 1, not {batch_size}")
    order = np.random.default_rng([seed, epoch]).permutation(train)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def eval_batches(ids: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """An evaluation's batches: the graphs in the order given."""
    return [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]


@dataclass
class GraphBatch:
    """Graphs `graph_ids` of a dataset as one block-diagonal Graph, with every node's graph row and global id."""

    graph: Graph  # its y and masks are per vertex and unused: the labels are graph rows (`y`)
    batch: torch.Tensor  # int64 [nodes]: the graph row (0..len(graph_ids)-1) of every node
    node_ids: torch.Tensor  # int64 [nodes]: the dataset's ids of the nodes (dropout masks are keyed by them)
    graph_ids: torch.Tensor  # int64 [graphs]
    y: torch.Tensor  # int64 [graphs]
    edge_ids: torch.Tensor  # int64 [edges]: the dataset's ids of the graph's edges, in its edge order


def make_batch(ds: GraphDataset, graph_ids: np.ndarray, edge_ptr: np.ndarray | None = None) -> GraphBatch:
    """The block-diagonal graph of `graph_ids` (in that order); `edge_ptr` is ds.edge_ptr(), passed to save its
    computation on every batch."""
    edge_ptr = ds.edge_ptr() if edge_ptr is None else edge_ptr
    graph_ids = np.asarray(graph_ids, dtype=np.int64)
    starts, ends = ds.ptr[graph_ids], ds.ptr[graph_ids + 1]
    sizes = ends - starts
    offsets = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    node_ids = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(graph_ids) else \
        np.zeros(0, np.int64)
    esl = [np.arange(edge_ptr[g], edge_ptr[g + 1]) for g in graph_ids]
    eids = np.concatenate(esl) if esl else np.zeros(0, np.int64)
    shift = np.repeat(offsets - starts, [len(e) for e in esl])  # a node's id in the batch = its id - start + offset
    n = int(sizes.sum())
    batch = np.repeat(np.arange(len(graph_ids), dtype=np.int64), sizes)
    none = torch.zeros(n, dtype=torch.bool)
    graph = Graph(n, ds.src[eids] + shift, ds.dst[eids] + shift, torch.from_numpy(ds.x[node_ids]),
                  torch.zeros(n, dtype=torch.int64), none, none.clone(), none.clone(), name=ds.name)
    return GraphBatch(graph, torch.from_numpy(batch), torch.from_numpy(node_ids), torch.from_numpy(graph_ids),
                      torch.from_numpy(ds.y[graph_ids]), torch.from_numpy(eids.astype(np.int64)))
