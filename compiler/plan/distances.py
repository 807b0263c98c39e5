"""Each vertex's in-distance from every part of a partition: DepCache's L-hop neighbourhoods, all parts at once.

Why this module exists: the statistics pass (gnnc.passes.partition.stats: lhop_vertices, lhop_edges) and the
row sets of a depcache segment (gnnc.plan.rows: C^l = the vertices within end - l in-hops of the owned ones)
read the same table, dist[v, i] = the length of the shortest path from v into V_i (0: v in V_i; -1: farther
than the levels asked for). Each computed it on its own: the statistics by a float32 sparse product per level
over a transpose of the in-CSR it built (the store holds that transpose already), the row sets by walking every
rank's in-edges again (issue 34: at the products-like R-MAT's 0.1, 0.7 + 1.0 CPU s of the compile's 11).

`part_distances` computes it once per (graph, partition) and keeps it on the graph (P bytes per vertex for P
parts, int8) where it is small beside the edges; a later call for the same assignment reads it. The frontier of
every part moves one level per step as a bit set (part i: bit i), each vertex's parts' bits OR-ed over its
out-edges: a gather of one byte per edge (P <= 8) and a segmented OR over the out-CSR, where the sparse product
multiplied P float32 columns per edge.

Where the graph holds the out-CSR and has PARALLEL_EDGES entries or more, each level's OR splits by row range
over processes (`processes`, gnnc.parallel.map_processes): a row's OR reads only the front, so every range's rows
get the same words whichever process computes them, and the table is the same for any count (issue 34: the
three levels at ogbn-products' size were ~3.5 s of the compile's serial wall beside an idle core).

The distance does not depend on the edge view: `self_loops` differs from `plain` only in self-loops, and a
self-loop shortens no path, so the table of one view is the other's (the cache is keyed by the assignment only).
"""
from __future__ import annotations

import hashlib

import numpy as np

from gnnc.graph import CSR, Graph, row_blocks
from gnnc.graph.storage import row_ranges
from gnnc.parallel import map_processes

_KEY = "part_distances"  # Graph._views key prefix of the cached table
BLOCK_ENTRIES = 1 << 23  # out-CSR entries gathered at once (their bit words: a temporary of this many words)
# Out-CSR entries from which a level's OR splits by row range over processes: below, a fork per level costs more
# than the second core saves. Measured LOADED (load 3.8-4.0, products' store, the out-CSR's first E rows, one
# level, 8 parts): here 3.8-4.3 ns per entry (16M 0.05 s, 124M 0.47-0.53 s), a fork of two children and their
# pieces back 0.05-0.07 s: half the entries on the other core saves more than that from ~25M entries
# (issue 34, session 29). Loaded, no split won: the other core was busy.
PARALLEL_EDGES = 1 << 25

# counters of the work done, read by the tests (a table computed, a level stepped); never reset here
WORK = {"tables": 0, "levels": 0}


def _digest(parts: np.ndarray, num_parts: int) -> tuple[str, int, bytes]:
    """The cache key of an assignment: its bytes as int64 hashed (the same split from any dtype), and P."""
    data = np.ascontiguousarray(parts, dtype=np.int64)
    return _KEY, num_parts, hashlib.blake2b(data.view(np.uint8), digest_size=20).digest()


def part_distances(graph: Graph, parts: np.ndarray, num_parts: int, levels: int, view: str = "plain",
                   processes: int = 1) -> np.ndarray:
    """int8 [N, P] (int16 for levels >= 127): dist[v, i], v's in-distance from the vertices `parts` gives part i,
    -1 beyond `levels`. Read-only: a cached table is shared by every caller.

    `view`: the edge view whose CSR is walked when the graph holds no transpose of its plain CSR (a store does);
    any view gives the same table (module docstring). `processes`: what each level's OR over the out-CSR may
    spread over from PARALLEL_EDGES entries (the same table for any count)."""
    parts = np.asarray(parts)
    key = _digest(parts, num_parts)
    held = graph._views.get(key)
    if held is not None:
        done, complete, table = held
        if done == levels or (complete and done <= levels):
            return table
        if done > levels:  # a deeper table: the levels beyond are -1 here
            out = np.where(table > levels, -1, table).astype(table.dtype)
            out.flags.writeable = False
            return out
    table, complete = _compute(graph, parts, num_parts, levels, view, processes)
    table.flags.writeable = False
    # kept while it is at most a byte per edge (or 16 MiB): a partition of many parts over a graph of few edges
    # per vertex is not worth holding for the graph's lifetime
    if table.nbytes <= max(graph.num_edges, 1 << 24):
        graph._views[key] = (levels, complete, table)
    return table


def held_out_csr(graph: Graph) -> CSR | None:
    """The transpose of the plain in-CSR (rows: sources, entries: their out-neighbours) where the graph holds one
    already (a store maps it), else None: building one sorts every edge, the cost this module avoids."""
    csr = graph._views.get(("csr", "plain"))
    return None if csr is None else csr._cache.get("t")


def _word_dtype(num_parts: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if num_parts <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def _compute(graph: Graph, parts: np.ndarray, num_parts: int, levels: int, view: str, processes: int = 1
             ) -> tuple[np.ndarray, bool]:
    """(the table, whether the search ran out of vertices before `levels`: then no level beyond adds any)."""
    WORK["tables"] += 1
    n = len(parts)
    dtype = np.int8 if levels < 127 else np.int16
    table = np.full((n, num_parts), -1, dtype=dtype)
    table[np.arange(n), parts] = 0
    words = (num_parts + 63) // 64 if num_parts > 64 else 1
    wdt = _word_dtype(num_parts)
    # front[v]: the parts whose frontier v is on, one bit each ([n, words] uint64 beyond 64 parts)
    seen = _bits(parts, num_parts, wdt, words)
    front = seen
    out = held_out_csr(graph)
    csr = graph.csr(view) if out is None else None
    ranges = [] if out is None else row_ranges(out.indptr.numpy(), processes if out.nnz >= PARALLEL_EDGES else 1)
    for level in range(1, levels + 1):
        WORK["levels"] += 1
        reached = _step(out, csr, front, ranges, processes)
        new = reached & ~seen
        if not new.any():
            return table, True  # nothing new at this level, so nothing at any later one
        seen = seen | new
        np.copyto(table, level, where=_unpack(new, num_parts))  # (a masked copy: no positions built, as [] had)
        front = new
    return table, False


def _bits(parts: np.ndarray, num_parts: int, wdt: np.dtype, words: int) -> np.ndarray:
    if words == 1:
        return np.left_shift(np.ones(1, dtype=wdt), parts.astype(wdt))
    bits = np.zeros((len(parts), words), dtype=np.uint64)
    bits[np.arange(len(parts)), parts // 64] = np.left_shift(np.uint64(1), (parts % 64).astype(np.uint64))
    return bits


def _unpack(bits: np.ndarray, num_parts: int) -> np.ndarray:
    """bool [n, P]: bit i of each vertex's word(s), little-endian (part 0: the lowest bit)."""
    raw = np.ascontiguousarray(bits).view(np.uint8).reshape(len(bits), -1)
    return np.unpackbits(raw, axis=1, count=num_parts, bitorder="little").view(bool)


def _step(out: CSR | None, csr: CSR | None, front: np.ndarray, ranges: list[tuple[int, int]], processes: int
          ) -> np.ndarray:
    """reached[u]: OR of front[w] over the out-edges u -> w, every vertex at once (the out-CSR's rows split as
    `ranges` over up to `processes` processes; their pieces concatenated in row order)."""
    if out is not None:
        indptr, indices = out.indptr.numpy(), out.indices.numpy()
        if len(ranges) == 1:
            return _or_rows(indptr, indices, front, *ranges[0])
        return np.concatenate(map_processes(lambda r: _or_rows(indptr, indices, front, *r), ranges, processes))
    # no transpose held: each in-edge u -> v ORs front[v] into reached[u] (an unbuffered scatter, ~5x the gather's
    # time, still below a sort of every edge to build the transpose)
    reached = np.zeros_like(front)
    indptr, indices = csr.indptr.numpy(), csr.indices.numpy()
    np.bitwise_or.at(reached, indices, np.repeat(front, np.diff(indptr), axis=0))
    return reached


def _or_rows(indptr: np.ndarray, indices: np.ndarray, front: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """reached[u - lo] for the out-CSR's rows lo..hi-1: a segmented OR of the out-neighbours' words, row block by
    row block (a row's OR reads only `front`: the same words whichever range holds the row)."""
    reached = np.zeros((hi - lo,) + front.shape[1:], dtype=front.dtype)
    degree = np.diff(indptr[lo:hi + 1])
    for a, b in row_blocks(indptr[lo:hi + 1], BLOCK_ENTRIES):
        first, last = int(indptr[lo + a]), int(indptr[lo + b])
        rows = np.flatnonzero(degree[a:b]) + a
        if len(rows):
            words = front[indices[first:last]]
            reached[rows] = np.bitwise_or.reduceat(words, indptr[lo + rows] - first, axis=0)
    return reached
