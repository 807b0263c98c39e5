"""Link prediction's edge split: which edges the encoder sees, which pairs are scored.

The semantics are PyG's `RandomLinkSplit(num_val, num_test, is_undirected, neg_sampling_ratio)` with its
defaults `add_negative_train_samples=False` and `split_labels=False`:

- the positive edges (one per vertex pair: an undirected graph's two directions are one edge; self-loops and
  duplicates are not candidates) are shuffled by a generator seeded with the run's seed and cut into
  validation (`floor(val * m)`), test (`floor(test * m)`) and training edges (the rest);
- the encoder passes messages over the graph without the held-out edges (both directions of an undirected
  one), the graph's own edge data following the edges kept;
- validation and test each get `round(neg_ratio * positives)` negative pairs, fixed for the seed: uniform
  pairs (u, v), u != v, that are no edge of the graph in either direction (undirected) or in that direction,
  distinct from each other;
- training scores its positives against `neg_ratio` times as many negatives drawn anew every epoch
  (gnnc.runtime.link_task draws them on the model's device), as PyG's link-prediction examples call
  `negative_sampling` on the training edges each epoch.

A split is a function of the graph, the
settings and the seed, so every process of a run computes the same one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.graph.storage import Graph

DEFAULT_VAL, DEFAULT_TEST, DEFAULT_NEG_RATIO = 0.05, 0.10, 1.0


@dataclass(frozen=True)
class EdgeSplit:
    """Positive and negative pairs of each split ([2, k] int64 arrays: sources, destinations), and which of
    the graph's edges (a boolean mask over its edge list) the encoder passes messages over."""

    num_nodes: int
    undirected: bool
    message_edges: np.ndarray  # bool [E]: the graph's edges kept for message passing
    train_pos: np.ndarray
    val_pos: np.ndarray
    val_neg: np.ndarray
    test_pos: np.ndarray
    test_neg: np.ndarray
    neg_ratio: float
    message_keys: np.ndarray  # sorted unique u * N + v of the message-passing edges: what training negatives avoid

    def train_negatives(self) -> int:
        """How many negative pairs each training epoch draws."""
        return int(round(self.neg_ratio * self.train_pos.shape[1]))


def message_graph(graph: Graph, split: EdgeSplit) -> Graph:
    """The graph the encoder passes messages over: `graph` without the held-out edges, its edge data kept along."""
    keep = split.message_edges
    return dataclasses.replace(graph, src=graph.src[keep], dst=graph.dst[keep], _views={},
                               edge_data={k: v[torch.from_numpy(keep)] for k, v in graph.edge_data.items()})


def _check(val: float, test: float, neg_ratio: float) -> None:
    if not (0.0 <= val < 1.0 and 0.0 < test < 1.0 and val + test < 1.0):
        raise GnncError(f"link prediction's split: val_edges ({val}) and test_edges ({test}) must be fractions "
                        "in [0, 1) and (0, 1) that leave training edges (their sum below 1)")
    if not neg_ratio > 0:
        raise GnncError(f"link prediction's neg_ratio must be above 0, not {neg_ratio}")


def is_undirected(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> bool:
    """Every edge (u, v) has its reverse (v, u) (PyG's is_undirected)."""
    n = np.int64(num_nodes)
    fwd = np.unique(src.astype(np.int64) * n + dst.astype(np.int64))
    rev = np.unique(dst.astype(np.int64) * n + src.astype(np.int64))
    return fwd.shape == rev.shape and bool(np.array_equal(fwd, rev))


def _negatives(rng: np.random.Generator, count: int, num_nodes: int, forbidden: np.ndarray) -> np.ndarray:
    """`count` distinct uniform pairs (u, v), u != v, whose key u*N+v is not in the sorted `forbidden`."""
    n = np.int64(num_nodes)
    room = n * (n - 1) - forbidden.shape[0]
    if count > room:
        raise GnncError(f"link prediction needs {count} negative pairs but the graph has only {room} vertex "
                        "pairs that are no edge: lower neg_ratio")
    chosen = np.zeros(0, np.int64)
    while chosen.shape[0] < count:
        want = 2 * (count - chosen.shape[0]) + 16
        u = rng.integers(0, n, want, dtype=np.int64)
        v = rng.integers(0, n - 1, want, dtype=np.int64)
        v = v + (v >= u)  # uniform over v != u
        keys = u * n + v
        pos = np.searchsorted(forbidden, keys)
        hit = (pos < forbidden.shape[0]) & (forbidden[np.minimum(pos, forbidden.shape[0] - 1)] == keys)
        keys = keys[~hit]
        # distinct, in order of drawing (np.unique would sort them and bias which ones are kept)
        _, first = np.unique(np.concatenate([chosen, keys]), return_index=True)
        chosen = np.concatenate([chosen, keys])[np.sort(first)][:count]
    return np.stack([chosen // n, chosen % n])


def split_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, val: float = DEFAULT_VAL,
                test: float = DEFAULT_TEST, neg_ratio: float = DEFAULT_NEG_RATIO, seed: int = 0) -> EdgeSplit:
    """The seeded split of a graph's edges (module docstring)."""
    _check(val, test, neg_ratio)
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    n = np.int64(num_nodes)
    undirected = is_undirected(src, dst, num_nodes)
    lo, hi = (np.minimum(src, dst), np.maximum(src, dst)) if undirected else (src, dst)
    candidates = np.unique((lo * n + hi)[src != dst])  # one key per positive edge, sorted: the order is the seed's
    m = candidates.shape[0]
    n_val, n_test = int(val * m), int(test * m)
    if m - n_val - n_test < 1 or n_test < 1:
        raise GnncError(f"link prediction: the graph has {m} candidate edges, too few for a split of "
                        f"val_edges={val}, test_edges={test}")
    rng = np.random.default_rng(seed)
    perm = candidates[rng.permutation(m)]
    val_keys, test_keys, train_keys = perm[:n_val], perm[n_val:n_val + n_test], perm[n_val + n_test:]
    held = np.sort(np.concatenate([val_keys, test_keys]))
    edge_keys = lo * n + hi
    pos = np.searchsorted(held, edge_keys)
    in_held = (pos < held.shape[0]) & (held[np.minimum(pos, max(held.shape[0] - 1, 0))] == edge_keys) \
        if held.shape[0] else np.zeros(src.shape[0], bool)
    keep = ~in_held
    every = src * n + dst
    forbidden = np.unique(np.concatenate([every, dst * n + src]) if undirected else every)

    def pairs(keys: np.ndarray) -> np.ndarray:
        return np.stack([keys // n, keys % n])

    val_neg = _negatives(rng, int(round(neg_ratio * n_val)), num_nodes, forbidden)
    test_neg = _negatives(rng, int(round(neg_ratio * n_test)), num_nodes, forbidden)
    return EdgeSplit(num_nodes, undirected, keep, pairs(train_keys), pairs(val_keys), val_neg,
                     pairs(test_keys), test_neg, float(neg_ratio), np.unique(src[keep] * n + dst[keep]))
