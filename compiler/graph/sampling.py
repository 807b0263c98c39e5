"""Neighbour sampling: the per-layer blocks of a minibatch, drawn from a graph's CSR in vectorised numpy.

Why this module exists: sampled minibatch training (GraphSAGE, PyG's
NeighborLoader, DistDGL, P3) runs each graph layer on a *block*, a bipartite
CSR from that layer's sources to its destinations, sampled outward from a
batch of seed vertices. Sampling is structure only (numpy, no tensors), so
it sits with the graph, below the planner, which dry-runs it to predict
bytes, and the runtime, which turns blocks into GraphViews.

Conventions a PyG or DGL user will recognise:

* `--fanout 25,10` is in hop order, as PyG's `num_neighbors` and P3's
  "(25, 10)": 25 in-neighbours of every seed (the last graph layer's block),
  then 10 of each of those (the layer before it); -1 keeps the whole
  in-neighbourhood. One fan-out per graph layer.
* A block's sources start with its destinations (DGL's `to_block`): so the
  destinations of layer l are a prefix of its sources, the sources of layer
  l+1 are the destinations of layer l, and every row set of a minibatch is a
  prefix of the first layer's sources. New sources follow in global id order.
* Sampling is without replacement and uniform; within a row the kept edges
  keep their CSR order.
* A `with self_loops` layer samples among the in-edges that are not
  self-loops and then gives every destination exactly one self-loop, which is
  never sampled away: what PyG's GCNConv/GATConv do after a NeighborLoader
  (they add the loop to the sampled subgraph). Its `edge.gcn_norm` on a block
  is the whole graph's coefficient of that edge, deg^-1/2[src] deg^-1/2[dst]
  with the view's degrees, times deg(dst)/k(dst) on sampled non-loop edges
  (`SamplingView.edge_scale`): the inverse of the probability that an edge is
  kept, so the sampled sum is an unbiased estimate of the full aggregation and
  has its scale (DGL's and PyG's block degrees approximate the same scale). At
  fan-out -1 every factor is 1 and a block computes exactly what the whole
  graph does, which is what lets a minibatch step equal a full-graph step.
  `mean` aggregations average the sampled edges (the block's in-degree).

Every random choice is a counter-based hash of (seed, epoch, batch, layer,
vertex or edge id), never a stateful generator: which neighbours a vertex
gets in a block does not depend on which other vertices are sampled with it
or on which worker samples it. That makes runs reproducible and lets a
worker sample only the seeds it owns and still draw exactly the edges one
process draws for them (the distributed strategies rely on it).
"""
from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph.storage import Graph, index_dtype, sorted_unique
from gnnc.graph.store import mapped_files

FULL = -1  # a fan-out that keeps the whole in-neighbourhood

# A row with more than DRAW_FACTOR x fan-out candidates is sampled by drawing 2 x fan-out positions (with
# replacement, deduplicated in draw order): O(fan-out) work instead of a key per candidate edge.
DRAW_FACTOR = 4

_U = np.uint64
REGION_BYTES = 64 << 20  # of a mapped array read between two releases of its pages (`take`)


@dataclass(frozen=True)
class SamplingConfig:
    """`--fanout` and `--batch-size`, parsed once: fan-outs in hop order (seeds outward)."""

    fanouts: tuple[int, ...]
    batch_size: int

    def __post_init__(self) -> None:
        if not self.fanouts:
            raise GnncError("--fanout needs at least one fan-out")
        bad = [f for f in self.fanouts if f == 0 or f < FULL]
        if bad:
            raise GnncError(f"--fanout {self.text}: each fan-out is a positive count or -1 (the whole "
                            f"neighbourhood), not {bad[0]}")
        if self.batch_size < 1:
            raise GnncError(f"--batch-size must be at least 1, not {self.batch_size}")

    @staticmethod
    def parse(fanout: str, batch_size: int | None) -> "SamplingConfig":
        """From the command line's text (`25,10`); GnncError (exit 2) names what is wrong."""
        try:
            fanouts = tuple(int(part) for part in fanout.split(","))
        except ValueError:
            raise GnncError(f"--fanout {fanout}: expected comma-separated integers such as 25,10 "
                            f"(-1 keeps the whole neighbourhood)") from None
        if batch_size is None:
            raise GnncError("--fanout needs --batch-size (seeds per minibatch)")
        return SamplingConfig(fanouts, int(batch_size))

    @property
    def text(self) -> str:
        return ",".join(str(f) for f in self.fanouts)

    def layer_fanouts(self, graph_layers: int) -> list[int]:
        """The fan-out of each graph layer, first layer first (the reverse of hop order)."""
        if len(self.fanouts) != graph_layers:
            raise GnncError(f"--fanout {self.text} gives {len(self.fanouts)} fan-outs for a model with "
                            f"{graph_layers} graph layers (one per layer, seeds' hop first)")
        return list(reversed(self.fanouts))

    def to_json(self) -> dict[str, object]:
        return {"fanouts": list(self.fanouts), "batch_size": self.batch_size}

    @staticmethod
    def from_json(data: object, where: str) -> "SamplingConfig":
        """Read back what `to_json` wrote (a plan is data: every field is checked, nothing evaluated)."""
        if not isinstance(data, dict) or set(data) != {"fanouts", "batch_size"}:
            raise GnncError(f"{where}: 'sampling' must hold exactly 'fanouts' and 'batch_size'")
        fanouts, batch = data["fanouts"], data["batch_size"]
        if not isinstance(fanouts, list) or not all(isinstance(f, int) and not isinstance(f, bool) for f in fanouts) \
                or not isinstance(batch, int) or isinstance(batch, bool):
            raise GnncError(f"{where}: 'sampling' fan-outs must be a list of integers and the batch size an integer")
        return SamplingConfig(tuple(fanouts), batch)


# --- counter-based hashing (splitmix64's finaliser on uint64 arrays; wraps mod 2^64) ------------------

def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser applied elementwise to uint64 values (a bijection with good avalanche)."""
    x = np.asarray(x).astype(_U, copy=True)
    x ^= x >> _U(30)
    x *= _U(0xBF58476D1CE4E5B9)
    x ^= x >> _U(27)
    x *= _U(0x94D049BB133111EB)
    x ^= x >> _U(31)
    return x


def stream_key(seed: int, *parts: int) -> np.uint64:
    """A 64-bit key for one random stream, e.g. (seed, epoch, batch, layer)."""
    k = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=_U)
    for p in parts:
        k = mix64(k ^ mix64(np.array([int(p) & 0xFFFFFFFFFFFFFFFF], dtype=_U)))
    return k[0]


def shuffled(ids: np.ndarray, key: np.uint64) -> np.ndarray:
    """`ids` in an order that depends only on `key` and the ids (a hash sort, not a generator)."""
    order = np.argsort(mix64(np.asarray(ids, dtype=np.int64).view(_U)) ^ key, kind="stable")
    return np.asarray(ids)[order]


# --- blocks --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """One graph layer's sampled structure: a bipartite CSR from sources to destinations, local ids.

    src_ids[:n_dst] are the destinations (global ids); indptr[d]:indptr[d+1]
    are the in-edges of destination d, `indices` their local source ids and
    `eids` their ids in the layer's edge view (the whole graph's edge order,
    so edge data and edge dropout are those of the full graph).
    """

    src_ids: np.ndarray  # int64 [n_src]
    n_dst: int
    indptr: np.ndarray  # int64 [n_dst + 1]
    indices: np.ndarray  # int64 [nnz]
    eids: np.ndarray  # int64 [nnz]

    @property
    def n_src(self) -> int:
        return int(len(self.src_ids))

    @property
    def nnz(self) -> int:
        return int(len(self.indices))

    @property
    def dst_ids(self) -> np.ndarray:
        return self.src_ids[: self.n_dst]


@dataclass(frozen=True)
class MiniBatch:
    """The seeds of one step and their blocks, first graph layer first (blocks[-1].dst_ids == seeds)."""

    epoch: int
    index: int
    seeds: np.ndarray
    blocks: tuple[Block, ...]


def _ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """concat(arange(s, s + c) for s, c in zip(starts, counts)), vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)


class SamplingView:
    """The candidate in-edges of one edge view, as numpy CSR (self-loops set apart for `self_loops`).

    Built from the graph's plain in-edge CSR only (never its edge list): a graph store's CSR is memory-mapped, so
    a process that samples from it holds the pages its minibatches read, not a copy of the structure. The
    `self_loops` view's candidates are the plain CSR's entries that are not loops (a row keeps its edges in the
    plain order, which is the self_loops view's order too), their ids renumbered into that view's edge order:
    Graph.edges("self_loops") lists the non-loop edges first, in their order, so a non-loop edge e becomes
    e minus the loops before it. A graph without loops keeps the mapped arrays as they are.
    """

    def __init__(self, graph: Graph, view: str):
        if view not in ("plain", "self_loops"):
            graph.edges(view)  # an unknown view is refused there, naming the known ones
        csr = graph.csr("plain")
        indptr, indices, eids = csr.indptr.numpy(), csr.indices.numpy(), csr.eids.numpy()
        self.num_nodes = graph.num_nodes
        self.view = view
        self.add_loops = view == "self_loops"
        self.loop_eid0 = -1
        if self.add_loops:
            loop = _loop_entries(indptr, indices)
            self.loop_eid0 = graph.num_edges - len(loop)
            if len(loop):
                keep = np.ones(len(indices), dtype=bool)
                keep[loop] = False
                counts = np.diff(indptr) - np.bincount(np.searchsorted(indptr, loop, side="right") - 1,
                                                       minlength=graph.num_nodes)
                indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
                indices, eids = indices[keep], eids[keep]
                eids = eids - np.searchsorted(np.sort(csr.eids.numpy()[loop]), eids)
        self.indptr, self.indices, self.eids = indptr, indices, eids
        self.maps = mapped_files(graph)  # a store's or a rank's shards' mapped files (`take`)
        self.degree = np.diff(indptr)  # candidate in-edges per vertex
        # deg^-1/2 of the view's in-degree (its self-loop included), as Graph.gcn_norm computes it
        view_degree = (self.degree + (1 if self.add_loops else 0)).astype(np.float64)
        self.inv_sqrt_degree = np.where(view_degree > 0, view_degree, 1.0) ** -0.5 * (view_degree > 0)

    def take(self, a: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """a[ids] for one of this view's arrays (`take`: a mapped one is read a region at a time)."""
        return take(a, ids, self.maps)

    def edge_norm(self, block: Block) -> np.ndarray:
        """`edge.gcn_norm` on a block (float32): the whole graph's deg^-1/2[src] deg^-1/2[dst] of each edge,
        computed from its endpoints (so a pushed block needs no edge ids), times `edge_scale`."""
        src = block.src_ids[block.indices]
        dst = np.repeat(block.dst_ids, np.diff(block.indptr))
        norm = (self.inv_sqrt_degree[src] * self.inv_sqrt_degree[dst]).astype(np.float32)
        return norm * self.edge_scale(block).astype(np.float32)

    def edge_scale(self, block: Block) -> np.ndarray:
        """Per edge of `block`: deg/k on a sampled non-loop edge (the inverse of its keep probability), else 1."""
        kept = np.diff(block.indptr) - (1 if self.add_loops else 0)
        cand = self.degree[block.dst_ids]
        per_dst = np.where(kept > 0, cand / np.maximum(kept, 1), 1.0)
        scale = np.repeat(per_dst, np.diff(block.indptr))
        if self.add_loops:  # the loop is the only edge from a destination to itself (samples are not loops)
            scale[block.src_ids[block.indices] == np.repeat(block.dst_ids, np.diff(block.indptr))] = 1.0
        return scale


class NeighbourSampler:
    """Draws the blocks of minibatches for one program's graph layers (their edge views and fan-outs)."""

    def __init__(self, graph: Graph, views: Sequence[str], fanouts: Sequence[int], seed: int):
        if len(views) != len(fanouts):
            raise ValueError(f"{len(views)} graph layers but {len(fanouts)} fan-outs")
        self.views = {v: SamplingView(graph, v) for v in sorted(set(views))}
        self.layer_views = list(views)
        self.fanouts = [int(f) for f in fanouts]
        self.seed = seed
        self.num_nodes = graph.num_nodes
        self._pos = np.full(graph.num_nodes, -1, dtype=np.int64)  # scratch: global id -> local id

    def epoch_batches(self, epoch: int, seeds: np.ndarray, batch_size: int) -> list[np.ndarray]:
        """The epoch's minibatches: `seeds` shuffled by (seed, epoch), cut into `batch_size` pieces."""
        order = shuffled(np.asarray(seeds, dtype=np.int64), stream_key(self.seed, 0x5EED, epoch))
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]

    def sample(self, seeds: np.ndarray, epoch: int, index: int, fanouts: Sequence[int] | None = None) -> MiniBatch:
        """The blocks of minibatch `index` of `epoch` for `seeds` (any subset of that batch's seeds gets
        exactly the edges the whole batch gets for it). `fanouts` overrides the sampler's (FULL: inference)."""
        fan = self.fanouts if fanouts is None else list(fanouts)
        dst = np.asarray(seeds, dtype=np.int64)
        blocks: list[Block] = []
        for layer in reversed(range(len(self.layer_views))):
            key = stream_key(self.seed, epoch, index, layer)
            block = self._sample_layer(self.views[self.layer_views[layer]], dst, fan[layer], key)
            blocks.append(block)
            dst = block.src_ids
        return MiniBatch(epoch, index, np.asarray(seeds, dtype=np.int64), tuple(reversed(blocks)))

    def _sample_layer(self, view: SamplingView, dst: np.ndarray, fanout: int, key: np.uint64) -> Block:
        start = view.take(view.indptr, dst)
        deg = view.take(view.indptr, dst + 1) - start
        rows = np.arange(len(dst), dtype=np.int64)
        full = deg <= fanout if fanout != FULL else np.ones(len(dst), dtype=bool)
        pick_rows = [np.repeat(rows[full], deg[full])]
        pick_pos = [_ragged_arange(start[full], deg[full])]
        if fanout != FULL and not full.all():
            many = ~full & (deg > DRAW_FACTOR * fanout)
            failed = np.zeros(0, dtype=np.int64)
            if many.any():
                r, p, failed = _draw_distinct(rows[many], dst[many], start[many], deg[many], fanout, key)
                pick_rows.append(r)
                pick_pos.append(p)
            some = np.concatenate([rows[~full & ~many], failed])
            if len(some):
                r, p = _smallest_keys(some, start[some], deg[some], view, fanout, key)
                pick_rows.append(r)
                pick_pos.append(p)
        row = np.concatenate(pick_rows)
        pos = np.concatenate(pick_pos)
        # CSR order: by destination, then by position in the view's CSR
        order = np.argsort((row << 32) | (pos - start[row]), kind="stable")
        row, pos = row[order], pos[order]
        counts = np.bincount(row, minlength=len(dst))
        src = view.take(view.indices, pos)
        eids = view.take(view.eids, pos)
        if view.add_loops:  # one self-loop per destination, after its sampled edges (the full CSR's order)
            ends = np.cumsum(counts)
            src = np.insert(src, ends, dst)
            eids = np.insert(eids, ends, view.loop_eid0 + dst)
            counts = counts + 1
        indptr = np.zeros(len(dst) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        src_ids, local = self._relabel(dst, src)
        return Block(src_ids, len(dst), indptr, local, eids.astype(np.int64, copy=False))

    def _relabel(self, dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Local ids: the destinations first (0..n_dst-1), then the other sources in global id order."""
        pos = self._pos
        pos[dst] = np.arange(len(dst), dtype=np.int64)
        new = sorted_unique(src[pos[src] < 0])
        pos[new] = np.arange(len(dst), len(dst) + len(new), dtype=np.int64)
        local = pos[src]
        src_ids = np.concatenate([dst, new])
        pos[src_ids] = -1  # leave the scratch clean for the next block
        return src_ids, local


def take(a: np.ndarray, ids: np.ndarray, maps: Sequence[mmap.mmap] = ()) -> np.ndarray:
    """a[ids] along the first axis. An `a` over one of `maps` (a graph store's or a rank's shards' mapped files) is
    read a region of `REGION_BYTES` at a time, in increasing id order, each region's pages let go once its rows are
    copied.

    Why regions: RSS counts a mapping's resident pages, and the kernel maps a page cache's large folios whole (a read
    of 100 random rows of a 542 MB mapped x.npy made 158 MB of it resident, of 4,000 rows all of it). A minibatch's
    gathers from the CSR (its last hop reads rows all over it) or from x would hold the whole file resident until
    they ended: the in-edge CSR is 16 bytes per edge (2.6 GB at papers100M/10), x 512 bytes per vertex.
    """
    found = _mapping_of(a, maps) if len(ids) else None
    if found is None:
        return a[ids]
    pages, start = found
    row = max(a.itemsize * math.prod(a.shape[1:]), 1)
    order = np.argsort(ids, kind="stable")
    rows = ids[order]
    step = max(REGION_BYTES // row, 1)
    cuts = np.searchsorted(rows, np.arange(0, a.shape[0] + step, step))
    out = np.empty((len(ids), *a.shape[1:]), dtype=a.dtype)
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        if lo == hi:
            continue
        out[order[lo:hi]] = a[rows[lo:hi]]
        first = start + int(rows[lo]) * row
        first -= first % mmap.PAGESIZE
        pages.madvise(mmap.MADV_DONTNEED, first, min(start + (int(rows[hi - 1]) + 1) * row, len(pages)) - first)
    return out


def _mapping_of(a: np.ndarray, maps: Sequence[mmap.mmap]) -> tuple[mmap.mmap, int] | None:
    """The mapping among `maps` that holds `a`'s data, and where `a` starts in it; None for an array in memory."""
    if not maps or not a.flags.c_contiguous:
        return None
    address = a.ctypes.data
    for pages in maps:
        base = np.frombuffer(pages, dtype=np.uint8).ctypes.data
        if base <= address < base + len(pages):
            return pages, address - base
    return None


def _loop_entries(indptr: np.ndarray, indices: np.ndarray, block_rows: int = 1 << 20) -> np.ndarray:
    """Positions of a CSR's self-loops (an entry whose source is its row), read a block of rows at a time: the
    row ids of every entry at once would be 8 bytes per edge."""
    found = []
    for lo in range(0, len(indptr) - 1, block_rows):
        hi = min(lo + block_rows, len(indptr) - 1)
        a, b = int(indptr[lo]), int(indptr[hi])
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
        found.append(a + np.nonzero(np.asarray(indices[a:b]) == rows)[0])
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _smallest_keys(rows: np.ndarray, start: np.ndarray, deg: np.ndarray, view: SamplingView, k: int,
                   key: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """Uniform k-subsets: hash every candidate edge (by its edge id) and keep the k smallest per row."""
    pos = _ragged_arange(start, deg)
    local_row = np.repeat(np.arange(len(rows), dtype=np.int64), deg)
    h = mix64(view.take(view.eids, pos).astype(np.int64).view(_U) ^ key)
    if len(rows) >= 1 << 24:  # the packed sort key holds 24 bits of row
        order = np.lexsort((h, local_row))
    else:
        order = np.argsort((local_row.view(_U) << _U(40)) | (h >> _U(24)))
    offsets = np.repeat(np.cumsum(deg) - deg, deg)
    rank = np.arange(len(pos), dtype=np.int64) - offsets  # rank within the row, in key order
    keep = order[rank < k]
    return rows[local_row[keep]], pos[keep]


def _draw_distinct(rows: np.ndarray, dst: np.ndarray, start: np.ndarray, deg: np.ndarray, k: int,
                   key: np.uint64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows with many candidates: draw 2k positions per row, keep the first k distinct in draw order
    (sequential sampling that rejects repeats: a uniform k-subset). Rows left with fewer than k distinct
    draws come back in the third array (the caller samples them by keys instead)."""
    m = 2 * k
    n = len(rows)
    j = np.tile(np.arange(m, dtype=np.int64), n)
    local_row = np.repeat(np.arange(n, dtype=np.int64), m)
    h = mix64((mix64(np.repeat(dst, m).view(_U)) + j.view(_U)) ^ key)
    within = (h % np.repeat(deg, m).astype(_U)).astype(np.int64)
    # first occurrence of each (row, position) in draw order: stable sort keeps j ascending among equals
    packed = (local_row << 32) | within
    order = np.argsort(packed, kind="stable")
    sp = packed[order]
    first = np.ones(len(sp), dtype=bool)
    first[1:] = sp[1:] != sp[:-1]
    survivors = np.sort(order[first])  # back to (row, j) order: the draws that were new when drawn
    srow = local_row[survivors]
    counts = np.bincount(srow, minlength=n)
    rank = np.arange(len(survivors), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    ok = counts >= k
    keep = survivors[(rank < k) & ok[srow]]
    kr = local_row[keep]
    return rows[kr], start[kr] + within[keep], rows[~ok]


def merge_blocks(blocks: Sequence[Block]) -> Block:
    """Several blocks as one (P3: a worker runs every worker's pushed layer-1 block at once).

    The destinations of all blocks come first, block by block, then their other sources, so the
    destinations stay a prefix of the sources; a vertex in two blocks appears twice (once per block).
    """
    n_dst = np.array([b.n_dst for b in blocks], dtype=np.int64)
    rest = np.array([b.n_src - b.n_dst for b in blocks], dtype=np.int64)
    nnz = np.array([b.nnz for b in blocks], dtype=np.int64)
    dst_off = np.cumsum(n_dst) - n_dst
    rest_off = int(n_dst.sum()) + np.cumsum(rest) - rest
    edge_off = np.cumsum(nnz) - nnz
    src_ids = np.concatenate([b.dst_ids for b in blocks] + [b.src_ids[b.n_dst:] for b in blocks])
    indices = np.concatenate([np.where(b.indices < b.n_dst, b.indices + dst_off[j], b.indices - b.n_dst + rest_off[j])
                              for j, b in enumerate(blocks)])
    indptr = np.concatenate([np.zeros(1, dtype=np.int64)] + [b.indptr[1:] + edge_off[j] for j, b in enumerate(blocks)])
    eids = np.concatenate([b.eids for b in blocks])
    return Block(src_ids.astype(np.int64), int(n_dst.sum()), indptr, indices.astype(np.int64), eids)


def index_bytes(num_nodes: int, num_edges: int) -> int:
    """Bytes of one vertex or edge id as sampled runs send them: 4 (int32) when every id fits, else 8."""
    return index_dtype(max(num_nodes, num_edges + num_nodes) + 1).itemsize


def reads_edge_ids(layer) -> bool:
    """Whether a graph layer draws per-edge randomness (dropout of an edge value): it needs the edges' ids.
    Edge data (gcn_norm) does not: it follows from the edges' endpoints (`SamplingView.edge_norm`)."""
    return any(e.op == "dropout" and e.outs[0].type is not None and e.outs[0].type.domain == "edge"
               for e in layer.eqns)


def pack_block(block: Block, dtype: np.dtype = np.dtype(np.int64), edge_ids: bool = True) -> np.ndarray:
    """A block as one integer array (what P3's structure push sends): n_src, n_dst, nnz, then src_ids, indptr,
    indices and (with `edge_ids`) eids, in `dtype` (`index_bytes` wide)."""
    head = np.array([block.n_src, block.n_dst, block.nnz])
    parts = [head, block.src_ids, block.indptr, block.indices] + ([block.eids] if edge_ids else [])
    return np.concatenate([np.asarray(p, dtype=dtype) for p in parts])


def packed_size(n_src: int, n_dst: int, nnz: int, edge_ids: bool = True) -> int:
    """Entries of `pack_block` for a block of these sizes."""
    return 3 + n_src + n_dst + 1 + (2 if edge_ids else 1) * nnz


def unpack_block(flat: np.ndarray, edge_ids: bool = True) -> Block:
    """The block `pack_block` packed; without `edge_ids` its eids are -1 (unknown)."""
    flat = np.asarray(flat, dtype=np.int64)
    n_src, n_dst, nnz = (int(v) for v in flat[:3])
    if min(n_src, n_dst, nnz) < 0 or n_dst > n_src or len(flat) != packed_size(n_src, n_dst, nnz, edge_ids):
        raise ValueError(f"a packed block of {len(flat)} entries does not hold ({n_src}, {n_dst}, {nnz})")
    cuts = np.cumsum([3, n_src, n_dst + 1, nnz])
    eids = flat[cuts[3]:] if edge_ids else np.full(nnz, -1, dtype=np.int64)
    return Block(flat[cuts[0]:cuts[1]], n_dst, flat[cuts[1]:cuts[2]], flat[cuts[2]:cuts[3]], eids)
