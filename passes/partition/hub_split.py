"""A start for G3's swaps on power-law graphs: hub parts beside a METIS split of the rest.

On a power-law graph every part that holds a share of the graph receives
the hubs' neighbourhoods, so a split that spreads the graph evenly over P
parts pays for each hub about P - 1 times, and edge-cut METIS keeps its sum
|B_i| low only by leaving some parts nearly empty (R-MAT: half the vertices
are isolated and fill whole parts), which G3's |B_i| balance forbids.

This split gives the highest-degree vertices parts of their own: hubs, in
descending degree, are dealt into P - C "hub parts", each closed once its
remote set |N(group) \\ group| reaches a target T. The rest of the
non-isolated graph is split C ways by METIS (volume objective, one weight per
vertex: 1 + in-degree). A hub part receives its hubs' neighbours (about T
rows) and a core part receives the rows across the C-way cut and the hubs it
touches, so |B_i| is balanced when T equals the core parts' mean |B_i|.
T starts at the mean |B_i| of a C-way split of the whole non-isolated graph
and is then set, round by round, to the core parts' mean of the previous
round; the round with the smallest max |B_i| is kept. Isolated vertices,
which nobody receives, go to the parts with the fewest vertices.

The price is paid elsewhere than |B_i|. Compute: a hub part holds few edges
and a core part many, as in edge-cut METIS's split of the same graph (the
stats report the degree balance reached). Sends: the core parts send the
hubs' neighbourhoods to every hub part, so the most rows a part sends is
several times the most it receives (benchmarks/partition.py prints both).
G3's swaps then run from here under their usual bounds (`partition_g3`,
`start='hubs'`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from gnnc.passes.partition.metis import metis_kway, remote_sizes
from gnnc.passes.partition.core import PartitionInput


def hub_split(inp: PartitionInput, parts: int, seed: int, core_parts: int = 2,
              rounds: int = 2) -> tuple[np.ndarray, dict[str, Any]]:
    """P - core_parts hub parts and a METIS split of the rest into core_parts parts; (assignment, stats)."""
    indptr, indices = inp.undirected
    n = inp.num_nodes
    core_parts = min(core_parts, parts)
    hub_parts = parts - core_parts
    weight = inp.in_degree + 1
    linked = np.flatnonzero(np.diff(indptr) > 0)
    adj = sp.csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr), shape=(n, n))  # built once
    start = np.full(n, -1, dtype=np.int64)
    start[linked] = _metis(adj, linked, core_parts, weight, seed)
    _fill_evenly(start, core_parts)
    target = float(remote_sizes(indptr, indices, start, core_parts).mean())
    order = np.argsort(-np.diff(indptr), kind="stable")[:len(linked)]  # non-isolated, highest degree first
    best: tuple[tuple[int, int], np.ndarray, float, int] = ((0, 0), start, 0.0, 0)  # no hub parts: the start
    history = []
    for k in range(rounds if hub_parts else 0):
        assignment, hubs = _deal_hubs(indptr, indices, order, hub_parts, target)
        rest = linked[assignment[linked] < 0]
        assignment[rest] = hub_parts + _metis(adj, rest, core_parts, weight, seed)
        _fill_evenly(assignment, parts)
        sizes = remote_sizes(indptr, indices, assignment, parts)
        history.append({"target": round(target), "hubs": hubs, "max_remote": int(sizes.max()),
                        "sum_remote": int(sizes.sum())})
        key = (int(sizes.max()), int(sizes.sum()))
        if k == 0 or key < best[0]:
            best = (key, assignment, target, hubs)
        target = float(sizes[hub_parts:].mean())
    _, assignment, target, hubs = best
    load = np.bincount(assignment, weights=inp.in_degree, minlength=parts)
    return assignment, {
        "hub_parts": hub_parts,
        "core_parts": core_parts,
        "hubs": hubs,
        "hub_target": round(target),
        "rounds": history,
        "degree_balance": float(load.max() / load.mean()) if load.sum() else 1.0,
    }


def _deal_hubs(indptr: np.ndarray, indices: np.ndarray, order: np.ndarray, groups: int,
               target: float) -> tuple[np.ndarray, int]:
    """Vertices of `order` into `groups` parts in turn, each closed once |N(group) \\ group| >= target.

    Returns the assignment (-1 outside the hub parts) and the number of hubs
    dealt. A vertex's mark holds the group that has it as a neighbour or
    member, so no array is reset between groups.
    """
    n = len(indptr) - 1
    assignment = np.full(n, -1, dtype=np.int64)
    seen = np.full(n, -1, dtype=np.int64)  # the last group with this vertex as neighbour
    group, remote, dealt = 0, 0, 0
    for v in order.tolist():
        if group == groups:
            break
        assignment[v] = group
        dealt += 1
        if seen[v] == group:  # a neighbour of the group joins it: no longer remote
            remote -= 1
        nb = indices[indptr[v]:indptr[v + 1]]
        new = nb[(seen[nb] != group) & (assignment[nb] != group)]
        seen[new] = group
        seen[v] = group
        remote += len(new)
        if remote >= target:
            group, remote = group + 1, 0
    return assignment, dealt


def _metis(adj: sp.csr_matrix, vertices: np.ndarray, parts: int, weight: np.ndarray, seed: int) -> np.ndarray:
    """METIS (volume objective, weights `weight`) on the subgraph induced by `vertices`; part per vertex."""
    if parts == 1 or len(vertices) <= parts:
        return np.arange(len(vertices), dtype=np.int64) % parts
    sub = adj[vertices][:, vertices].tocsr()
    if sub.nnz == 0:
        return np.arange(len(vertices), dtype=np.int64) % parts
    part, _ = metis_kway(sub.indptr.astype(np.int64), sub.indices.astype(np.int64), parts,
                         weight[vertices][:, None], "vol", seed, 30)
    return part


def _fill_evenly(assignment: np.ndarray, parts: int) -> None:
    """Give the unassigned (-1) vertices to the parts with the fewest vertices, levelling the counts."""
    free = np.flatnonzero(assignment < 0)
    counts = np.bincount(assignment[assignment >= 0], minlength=parts)
    # the highest level L that the free vertices can raise every part below it to
    lo, hi = int(counts.min()), int(counts.max()) + len(free)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.maximum(mid - counts, 0).sum() <= len(free):
            lo = mid
        else:
            hi = mid - 1
    quota = np.maximum(lo - counts, 0)
    spare = len(free) - int(quota.sum())  # fewer than the parts at the level: one more each
    quota[np.flatnonzero(counts + quota == lo)[:spare]] += 1
    assignment[free] = np.repeat(np.arange(parts), quota)
