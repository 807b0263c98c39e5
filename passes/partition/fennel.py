"""Fennel (Tsourakakis et al., WSDM 2014), the streaming partitioner NeutronStar uses (its section 5.7).

Why it is here: METIS needs the whole symmetric adjacency in memory (and
about five times that while coarsening); Fennel makes one pass over the
vertices and keeps O(N + parts) state, the assignment and the part sizes,
reading each vertex's neighbours from the CSR as it goes. With a graph store
(`gnnc convert`) both CSRs are memory-mapped, so the pass reads the structure
from disk in vertex order and never holds it whole.

Each vertex v, in id order, goes to the part i that maximises

    |N(v) ∩ P_i| - alpha * gamma * |P_i|^(gamma - 1),    among parts with |P_i| < slack * N / parts,

where N(v) are v's in- and out-neighbours already placed (an edge in both directions counts twice, as it
carries messages both ways), alpha = E * parts^(gamma - 1) / N^gamma with E the directed edge count (the
paper's alpha with m = E / 2 undirected edges, the neighbour counts doubled alike), gamma = 1.5 (the paper's
choice) and slack = 1.1 (the paper's nu: no part beyond 1.1 times the average). Ties go to the smaller part.

One departure, for speed in Python: vertices are taken in batches of `batch` consecutive ids, and a vertex
sees the placements of the batches before its own, not of the earlier vertices of its own batch (the part
sizes it is charged for are its own batch's, kept exactly). `batch=1` is the paper's algorithm. The seed
is not used: the stream order is the vertex order, which a store reads sequentially.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph.store import release_pages
from gnnc.passes.partition.core import PartitionInput

GAMMA = 1.5
SLACK = 1.1
BATCH = 64
RELEASE = 1 << 16  # vertices streamed between two releases of a store's pages read so far


def _neighbour_counts(lo: int, hi: int, csrs: list[tuple[np.ndarray, np.ndarray]], assignment: np.ndarray,
                      parts: int) -> np.ndarray:
    """[hi - lo, parts]: how many of each vertex's placed neighbours (in- and out-) each part holds."""
    counts = np.zeros((hi - lo) * parts, dtype=np.int64)
    for indptr, indices in csrs:
        ptr = np.asarray(indptr[lo:hi + 1])
        nbrs = np.asarray(indices[int(ptr[0]):int(ptr[-1])])  # one contiguous read of the (mapped) CSR
        rows = np.repeat(np.arange(hi - lo), np.diff(ptr))
        owner = assignment[nbrs]
        placed = owner >= 0
        counts += np.bincount(rows[placed] * parts + owner[placed], minlength=(hi - lo) * parts)
    return counts.reshape(hi - lo, parts)


def run(inp: PartitionInput, parts: int, seed: int, gamma: float = GAMMA, slack: float = SLACK,
        batch: int = BATCH) -> tuple[np.ndarray, dict[str, Any]]:
    if not (isinstance(gamma, (int, float)) and gamma > 1):
        raise GnncError(f"fennel: gamma must be a number > 1, got {gamma}")
    if not (isinstance(slack, (int, float)) and slack >= 1):
        raise GnncError(f"fennel: slack must be a number >= 1 (the largest part over the average), got {slack}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise GnncError(f"fennel: batch must be a positive integer, got {batch}")
    graph = inp.graph
    n = graph.num_nodes
    csr = graph.csr("plain")
    out = csr.transpose()
    csrs = [(csr.indptr.numpy(), csr.indices.numpy()), (out.indptr.numpy(), out.indices.numpy())]
    alpha = graph.num_edges * parts ** (gamma - 1) / n ** gamma
    # every part can hold its share: ceil, so that parts * cap >= n whatever the slack
    cap = max(math.ceil(slack * n / parts), math.ceil(n / parts))
    assignment = np.full(n, -1, dtype=np.int64)
    sizes = [0] * parts
    for lo in range(0, n, batch):
        hi = min(lo + batch, n)
        counts = _neighbour_counts(lo, hi, csrs, assignment, parts).tolist()
        chosen = []
        for row in counts:  # the per-vertex choice, in plain Python: parts is small
            best, best_score = -1, -math.inf
            for i in range(parts):
                if sizes[i] >= cap:
                    continue
                score = row[i] - alpha * gamma * sizes[i] ** (gamma - 1)
                if score > best_score or (score == best_score and sizes[i] < sizes[best]):
                    best, best_score = i, score
            sizes[best] += 1
            chosen.append(best)
        assignment[lo:hi] = chosen
        if hi % RELEASE < batch:
            # a store's CSR pages, read once in vertex order, let go as the pass goes: RSS counts a mapping's
            # resident pages, and the pass would otherwise end holding both CSRs (32 bytes per edge)
            release_pages(graph)
    src, dst = graph.edges("plain")
    step = 1 << 22  # the cut counted in blocks of edges: no array per edge
    cut = 0
    for k in range(0, len(src), step):
        cut += int(np.count_nonzero(assignment[src[k:k + step]] != assignment[dst[k:k + step]]))
        release_pages(graph)
    return assignment, {"gamma": gamma, "slack": slack, "alpha": alpha, "batch": batch, "edge_cut": cut,
                        "balance": float(max(sizes) / (n / parts))}
