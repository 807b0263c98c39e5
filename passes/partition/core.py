"""One interface over the graph partitioners: `partition_graph(graph, parts, method)`.

Each strategy the planner weighs assumes some split of the vertices (P3
hashes them, NeutronStar takes contiguous chunks, G3 refines METIS, MG-GCN
permutes at random); the planner compares strategies on the statistics of
these splits, so every method answers through the same `Partition` record
and the same registry. The methods themselves live in one module each
(`gnnc.passes.partition.<name>`, with `run(inp, parts, seed, **options)`), imported
only when used. Feature slices (P3 splits the feature dimension, not the
vertices) and GNNPipe's chunks come from here too, so that every split of a
graph has one home.
"""
from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.graph import CSR, Graph, row_blocks, sorted_unique
from gnnc.graph.store import release_pages
from gnnc.plan.shard_files import read_assignment
from gnnc.passes.partition.methods import METHODS, Method  # noqa: F401  (re-exported)


@dataclass(frozen=True, eq=False)
class Partition:
    """A split of the vertices into `parts` parts (what passes read as `PassContext.partition`).

    assignment: int64 [N], the part of every vertex (0 <= part < parts).
    method: the registry name that produced it.
    stats: what the method reports (time_s always; balance reached, edge cut,
    stopping reason, ... per method), JSON-serialisable values only.
    seed: the seed the method ran with, so the split can be made again.
    """

    assignment: np.ndarray
    parts: int
    method: str
    stats: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def sizes(self) -> np.ndarray:
        """Vertices per part."""
        return np.bincount(self.assignment, minlength=self.parts)

    def members(self, part: int) -> np.ndarray:
        """Global ids of the vertices of `part`, increasing."""
        return np.nonzero(self.assignment == part)[0]


class PartitionInput:
    """The graph plus structures several methods share, built at most once per call.

    `undirected` is the symmetric adjacency METIS and G3 work on: every edge in
    both directions, self-loops and duplicates removed (CSR over vertices,
    int64 `indptr` [N+1] and `indices`, each row's neighbours increasing). For a graph whose edge set is already
    symmetric (all built-in datasets and generators), a vertex's neighbours
    there are exactly its in-neighbours. int64 because that is METIS's idx_t in pymetis's wheels: METIS reads
    these very arrays, where an int32 build would need an int64 copy beside it (8 bytes per entry more at the peak).
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.num_nodes = graph.num_nodes

    @cached_property
    def undirected(self) -> tuple[np.ndarray, np.ndarray]:
        return undirected_adjacency(self.graph)

    @cached_property
    def in_degree(self) -> np.ndarray:
        graph = self.graph
        if ("csr", "plain") in graph._views:
            # the in-CSR a store maps (or one built already): its row lengths are the in-degrees, N reads; a
            # bincount of a store's dst would hold every destination's page resident (4-8 bytes per edge)
            return np.diff(graph.csr("plain").indptr.numpy()).astype(np.int64)
        return np.bincount(graph.dst, minlength=self.num_nodes).astype(np.int64)


EDGE_BLOCK = 1 << 21  # adjacency entries per block of the passes over a whole graph here and in metis (~40 bytes each)


def undirected_adjacency(graph: Graph, block: int = EDGE_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the symmetrised simple graph (see PartitionInput), int64.

    Built block by block of rows from the graph's in-edge CSR and its transpose (a store maps both; for an in-memory
    graph whatever of them it holds, the rest built here for the call): a block's in- and out-neighbours, about `block`
    entries, sorted and made unique as one key per entry (row in the block, neighbour), written where the block's
    rows go. No array of the edges' length but the result: the edge list sorted whole, as before, held some 80
    bytes per edge at its peak (the keys of both directions, their sorted copy, the rows, the indices), more than
    METIS's own input. `indices` is the first nnz entries of an array sized for 2E (in plus out entries, the most
    there can be): the pages past nnz are never written, so never resident.
    """
    n = graph.num_nodes
    if ("csr", "plain") in graph._views:
        csr = graph.csr("plain")  # the graph's own (a store maps it, with its transpose)
    else:
        # built here and dropped on return: kept on the graph, it (and its transpose) would stay in a compile that
        # reads another view (GCN's self-loops), 40 bytes per edge
        csr = CSR.from_edges(graph.src, graph.dst, n)
    # a transpose the graph's CSR does not hold yet is built on a copy of the record (the same tensors), not kept
    out = csr._cache["t"] if "t" in csr._cache else CSR(csr.indptr, csr.indices, csr.eids_given, n, n).transpose()
    sides = [(csr.indptr.numpy(), csr.indices.numpy()), (out.indptr.numpy(), out.indices.numpy())]
    # entries of rows 0..v-1 on both sides: a block is the rows whose entries fit in `block` (at least one row)
    total = np.asarray(sides[0][0], dtype=np.int64) + np.asarray(sides[1][0], dtype=np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    indices = np.empty(int(total[-1]), dtype=np.int64)
    filled = 0
    for lo, hi in row_blocks(total, block):
        keys = []
        for ptr, idx in sides:
            a, b = int(ptr[lo]), int(ptr[hi])
            rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(np.asarray(ptr[lo:hi + 1])))
            cols = np.asarray(idx[a:b], dtype=np.int64)
            keep = rows != cols
            keys.append((rows[keep] - lo) * n + cols[keep])
        unique = sorted_unique(np.concatenate(keys))
        del keys
        rows = unique // n
        indices[filled:filled + len(unique)] = unique - rows * n
        np.cumsum(np.bincount(rows, minlength=hi - lo), out=indptr[lo + 1:hi + 1])
        indptr[lo + 1:hi + 1] += filled
        filled += len(unique)
        release_pages(graph)  # a store's CSR pages of this block: read once
    return indptr, indices[:filled]


def partition_graph(graph: Graph, parts: int, method: str, seed: int = 0, **opts: Any) -> Partition:
    """Split the vertices of `graph` into `parts` parts with a registered method.

    `opts` are the method's own options (see its module); an unknown method,
    an unknown option or a part count outside [1, N] raises GnncError.
    """
    if method not in METHODS:
        raise GnncError(f"unknown partitioning method '{method}' (known: {', '.join(METHODS)})")
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1:
        raise GnncError(f"parts must be a positive integer, got {parts!r}")
    parts = int(parts)
    if parts > graph.num_nodes:
        raise GnncError(f"parts ({parts}) exceeds the number of vertices ({graph.num_nodes})")
    run = METHODS[method].runner()
    accepted = [p for p in inspect.signature(run).parameters if p not in ("inp", "parts", "seed")]
    for key in opts:
        if key not in accepted:
            raise GnncError(f"unknown option '{key}' for partitioning method '{method}' "
                            f"(known: {', '.join(accepted) or 'none'})")
    start = time.perf_counter()
    assignment, stats = run(PartitionInput(graph), parts, int(seed), **opts)
    elapsed = time.perf_counter() - start
    assignment = np.ascontiguousarray(assignment, dtype=np.int64)
    if assignment.shape != (graph.num_nodes,) or (len(assignment) and (assignment.min() < 0
                                                                       or assignment.max() >= parts)):
        raise AssertionError(f"partitioner '{method}' returned an invalid assignment")  # a bug, not user input
    stats = {"time_s": elapsed, **stats}
    return Partition(assignment, parts, method, stats, int(seed))


def load_partition(directory: str | os.PathLike, graph: Graph, parts: int) -> Partition:
    """The split a `gnnc partition -o DIR` run wrote (its checked assignment.npy), for `graph` into `parts` parts:
    so `gnnc compile --partition-from DIR` compiles after partitioning without partitioning again. A split of
    another graph (its vertex or edge count) or into another part count is refused (GnncError, exit 2)."""
    assignment, manifest = read_assignment(directory)
    if (manifest.get("num_nodes"), manifest.get("num_edges")) != (graph.num_nodes, graph.num_edges):
        raise GnncError(f"{directory}: the partition is of a graph of {manifest.get('num_nodes')} vertices and "
                        f"{manifest.get('num_edges')} edges, not of {graph.name} ({graph.num_nodes} vertices, "
                        f"{graph.num_edges} edges)")
    if manifest["parts"] != parts:
        raise GnncError(f"{directory}: the partition has {manifest['parts']} parts; compiling for {parts} workers "
                        f"needs {parts} (`gnnc partition --parts {parts}`)")
    meta = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
    seed = meta.get("seed", 0)
    method = manifest.get("method")
    if method not in METHODS or isinstance(seed, bool) or not isinstance(seed, int):
        raise GnncError(f"{directory}: the manifest's method ({str(method)[:40]!r}) or seed is not one gnnc writes")
    stats = meta.get("partition_stats") if isinstance(meta.get("partition_stats"), dict) else {}
    return Partition(assignment, parts, method, dict(stats), seed)


def tile_nnz(graph: Graph, assignment: np.ndarray, parts: int, view: str = "plain") -> np.ndarray:
    """int64 [parts, parts]: tile (i, j) counts the edges into part i from part j.

    With parts as row blocks of the adjacency matrix (rows = destinations),
    this is the nnz of block A_ij that MG-GCN's stage j multiplies on GPU i.
    """
    src, dst = graph.edges(view)
    a = np.asarray(assignment, dtype=np.int64)
    return np.bincount(a[dst] * parts + a[src], minlength=parts * parts).reshape(parts, parts)


def induced_subgraph(graph: Graph, vertices: np.ndarray) -> Graph:
    """The subgraph on `vertices` (renumbered 0..len-1 in the given order) with its edges among them."""
    vertices = np.asarray(vertices, dtype=np.int64)
    local = np.full(graph.num_nodes, -1, dtype=np.int64)
    local[vertices] = np.arange(len(vertices))
    s, d = local[graph.src], local[graph.dst]
    keep = (s >= 0) & (d >= 0)
    idx = torch.as_tensor(vertices)
    kept = torch.from_numpy(keep)
    return Graph(len(vertices), s[keep], d[keep], graph.x[idx], graph.y[idx], graph.train_mask[idx],
                 graph.val_mask[idx], graph.test_mask[idx], name=f"{graph.name}[sub]",
                 edge_data={k: v[kept] for k, v in graph.edge_data.items()})


def chunks_for_pipeline(graph: Graph, chunks: int, partition: Partition | None = None, part: int = 0,
                        seed: int = 0) -> list[np.ndarray]:
    """GNNPipe's K chunks: METIS on the vertices of one part (the whole graph without a partition).

    Returns `chunks` arrays of global vertex ids, each increasing; together
    they hold every vertex of the part exactly once.
    """
    vertices = np.arange(graph.num_nodes) if partition is None else partition.members(part)
    if chunks < 1 or chunks > len(vertices):
        raise GnncError(f"chunks ({chunks}) must be between 1 and the part's vertex count ({len(vertices)})")
    sub = induced_subgraph(graph, vertices)
    inner = partition_graph(sub, chunks, "metis", seed=seed)
    return [vertices[inner.assignment == k] for k in range(chunks)]


def estimate_peak_memory(graph: Graph, parts: int, method: str, baseline_bytes: int | None = None) -> int:
    """Bytes the process will hold at its peak while partitioning `graph` (an estimate).

    `baseline_bytes`: what the process holds already, the loaded graph
    included (the CLI passes its RSS so far); without it, the graph's own
    arrays. On top of that, per method: the symmetric adjacency (METIS, G3: at
    most 2E int64 indices, built in blocks), METIS's own memory (its edge
    weights and coarsening levels: 99-108 bytes per adjacency entry measured with
    pymetis's 64-bit idx_t on the products-like R-MAT at 10-21M entries,
    benchmarks/metis_memory.py; taken as 112 on the 2E bound, so an overestimate
    for a graph whose edge list holds both directions already), G3's per-part
    neighbour counts (parts x N int32), and the statistics pass that follows
    (a few int64 arrays per edge, an N x parts depth table).
    """
    n, e, f = graph.num_nodes, graph.num_edges, graph.num_features
    if baseline_bytes is None:
        baseline_bytes = graph.src.nbytes + graph.dst.nbytes + n * f * 4 + n * 8 + 3 * n
    per_vertex = 8 * 4 * n  # assignment, degrees, positions, masks
    stats = 8 * 6 * e + (8 + 2 + 4) * n * parts
    adjacency = 8 * (2 * e) + 8 * (n + 1)
    metis = 112 * (2 * e) + 5 * 8 * 3 * n
    extra = {
        "hash": 0,
        "chunk": 0,
        "random": 8 * n + 8 * e,
        "fennel": 8 * n,  # the assignment; the CSR it streams is the graph's (built once, or mapped from a store)
        "metis": adjacency + metis,
        "g3": adjacency + metis + 4 * parts * n + 8 * (2 * e),
    }.get(method, adjacency + metis)
    return int(baseline_bytes + per_vertex + max(stats, extra))
