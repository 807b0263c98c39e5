"""Fennel, the streaming partitioner (issue 34): the paper's rule exactly at batch 1, balance within the
slack, a smaller cut than hashing, the same split from a memory-mapped store, and O(N) state."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gnnc.errors import GnncError
from gnnc.graph.loaders import load_graph
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition.core import PartitionInput, partition_graph
from gnnc.passes.partition.fennel import run

SBM = "sbm:n=600,blocks=4,deg=8,intra=0.9,features=4,classes=4,seed=3"


def paper_fennel(src: np.ndarray, dst: np.ndarray, n: int, parts: int, gamma: float, slack: float) -> np.ndarray:
    """Tsourakakis et al.'s one-pass rule, written out vertex by vertex (neighbours in and out)."""
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist()):
        nbrs[d].append(s)
        nbrs[s].append(d)
    alpha = len(src) * parts ** (gamma - 1) / n ** gamma
    cap = max(math.ceil(slack * n / parts), math.ceil(n / parts))
    part = [-1] * n
    sizes = [0] * parts
    for v in range(n):
        def score(i: int) -> tuple[float, int]:
            placed = sum(1 for u in nbrs[v] if part[u] == i)
            return placed - alpha * gamma * sizes[i] ** (gamma - 1), -sizes[i]
        best = max((i for i in range(parts) if sizes[i] < cap), key=score)
        part[v] = best
        sizes[best] += 1
    return np.array(part)


def test_batch_1_is_the_papers_algorithm() -> None:
    g = load_graph(SBM, use_cache=False)
    got = partition_graph(g, 4, "fennel", batch=1).assignment
    assert np.array_equal(got, paper_fennel(g.src, g.dst, g.num_nodes, 4, 1.5, 1.1))


@pytest.mark.parametrize("parts", [2, 3, 8])
def test_balanced_within_the_slack_and_cuts_less_than_hashing(parts) -> None:
    g = load_graph(SBM, use_cache=False)
    p = partition_graph(g, parts, "fennel")
    assert p.sizes().max() <= math.ceil(1.1 * g.num_nodes / parts) and p.sizes().min() > 0
    hashed = partition_graph(g, parts, "hash").assignment
    assert p.stats["edge_cut"] < int(np.count_nonzero(hashed[g.src] != hashed[g.dst]))
    assert p.stats["edge_cut"] == int(np.count_nonzero(p.assignment[g.src] != p.assignment[g.dst]))
    assert np.array_equal(p.assignment, partition_graph(g, parts, "fennel").assignment)  # deterministic


def test_streams_a_store_with_o_n_state(tmp_path) -> None:
    g = load_graph(SBM, use_cache=False)
    write_store(g, tmp_path / "store")
    s = open_store(tmp_path / "store")
    inp = PartitionInput(s)
    assignment, _ = run(inp, 4, 0)
    assert np.array_equal(assignment, partition_graph(g, 4, "fennel").assignment)
    assert "undirected" not in inp.__dict__  # METIS's symmetric adjacency (O(E)) was never built


@pytest.mark.parametrize("option, message", [({"gamma": 1.0}, "gamma must be"), ({"slack": 0.5}, "slack must be"),
                                             ({"batch": 0}, "batch must be")])
def test_bad_options(option, message) -> None:
    with pytest.raises(GnncError, match=message):
        partition_graph(load_graph(SBM, use_cache=False), 2, "fennel", **option)
