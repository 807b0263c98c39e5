"""The rows one worker holds, layer by layer, under each strategy.

Graph layer l (0..L-1) reads h^l and writes h^{l+1}; h^0 is the input. A
worker holds the rows C^l of h^l. Inside a depcache or hybrid segment the
sets nest, C^s ⊇ C^{s+1} ⊇ ... ⊇ C^e = its owned vertices, so one row
order serves the segment: owned rows first, then the others by decreasing
depth (the last l with the row in C^l), then global id. Every C^l is a
prefix of that order, and a vertex-wise op that meets values of two
layers takes the shorter prefix.

Layer l computes the rows C^{l+1} from their in-neighbours. Those it holds
are the first |C^l| columns; the others, the halo H^l = (N_in(C^{l+1}) ∪
C^{l+1}) \\ C^l, are fetched from their owners, ordered by (owner, global
id), the order each owner sends them in. Per strategy:

* `depcomm`: C^l = owned, H^l = B_i (the remote in-neighbours), every layer.
* `depcache`: over its segment C^l = C^{l+1} ∪ N_in(C^{l+1}), the L-hop
  in-neighbourhood, so the halo is empty (NeutronStar's DepCache).
* `hybrid`: C^l = C^{l+1} ∪ N_in(C^{l+1} \\ owned) ∪ R_l, where R_l are the
  remote dependencies the selection caches at layer l: a cached row needs
  its whole in-tree below it (NeutronStar's Hybrid; Algorithm 4 picks R).
  Nothing cached is depcomm, everything cached is depcache.
* `bcast1d`: C^l = owned; the layer reads every row in block order (part
  0's vertices, then part 1's, ...), MG-GCN's staged broadcast.
* `pushpull` (first layer): every row, a slice of the features; P3's pull
  leaves the owned rows.

A depcache or hybrid segment [s, e) computes the owned rows at its end;
inside it the rows grow towards its start. At s = 0 the input is static
and C^0 is loaded with the shard; a segment that starts later first
fetches the rows of C^s it does not own (the replicate transition: one
row per (vertex, needing worker), gradients summed back at the owner).
Each segment has its own row order; values pass between segments as owned
rows, a prefix of every order. Edge data (gcn_norm, the graph's edge.NAME)
and dropout ids are global: every edge a worker holds, its halo's included,
carries its own values, so every worker computes what one process computes
for its rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from gnnc.graph import CSR, Graph, GraphView, sorted_unique
from gnnc.plan.distances import part_distances
from gnnc.plan.halo import HaloPlan
from gnnc.plan.strategies import STRATEGIES


def _nested(strategy: str) -> bool:
    """Whether the row sets of `strategy` grow below the last layer of its segment."""
    return STRATEGIES[strategy].nested_rows


@dataclass(frozen=True)
class LayerSpec:
    """What the row sets need to know of one graph layer."""

    name: str
    view: str  # edge view: plain or self_loops
    strategy: str
    segment: int  # first graph layer of the segment it runs in (its own index for a per-layer strategy)


def layer_specs(program) -> list[LayerSpec]:
    """The graph layers of an annotated program, with their segments.

    A layer's `segment` attribute (set by assign-strategy) names the first
    layer of its segment; without it, a run of equal depcache/hybrid layers
    is one segment.
    """
    layers = program.graph_layers()
    specs: list[LayerSpec] = []
    for k, layer in enumerate(layers):
        strategy = layer.attr("strategy", "local")
        seg = layer.attr("segment")
        if seg is None:
            seg = specs[-1].segment if _nested(strategy) and specs and specs[-1].strategy == strategy else k
        specs.append(LayerSpec(layer.name, layer.edges, strategy, int(seg)))
    return specs


def segments(specs: list[LayerSpec]) -> list[tuple[int, int]]:
    """(start, end) of every depcache/hybrid segment."""
    out: list[tuple[int, int]] = []
    for k, s in enumerate(specs):
        if _nested(s.strategy):
            if out and out[-1][0] == s.segment:
                out[-1] = (s.segment, k + 1)
            else:
                out.append((s.segment, k + 1))
    return out


def _entries(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The CSR positions of rows `rows`' entries, row after row (int32 while they fit: half the bytes)."""
    lo = indptr[rows]
    counts = indptr[rows + 1] - lo
    index = np.int32 if indptr[-1] < 2**31 else np.int64
    starts = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    at = np.repeat((lo - starts).astype(index), counts)
    at += np.arange(len(at), dtype=index)
    return at


GATHER_BLOCK = 1 << 18  # entries `_view` gathers a masked run by at a time (2 MB of int64 sources: in cache)
MASK_WALK = 0.15  # `_sources` and `_entry_pieces` read every edge's entry through a mask above this share of the edges


def _entry_pieces(indptr: np.ndarray, rows: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """The entries of rows `rows`, row after row (`_entries`' order), as pieces (lo, hi, selector): for each
    array `values` over the CSR's entries, values[selector] is values[_entries(indptr, rows)][lo:hi].

    A run of ascending rows holding more than `MASK_WALK` of the edges (a depcache layer's rows in its
    segment's order: the owned rows, then each depth's by id, most of the graph) is selected by a mask over
    every entry (one byte per edge, then numpy's compress: its entries in CSR order are the run's, row after
    row), the rows between such runs by their entries' positions: the positions of nearly every edge were
    written (int32), added to and gathered by for every rank, ~1.5-3x the CPU of the masks on the
    products-like R-MAT at 0.1 (issue 34)."""
    n = len(indptr) - 1
    counts = indptr[rows + 1] - indptr[rows]
    edges = int(indptr[-1])
    starts = np.flatnonzero(rows[1:] <= rows[:-1]) + 1  # where each run of ascending rows starts
    bounds = np.concatenate(([0], starts, [len(rows)])).astype(np.int64)
    run_edges = np.add.reduceat(counts, bounds[:-1]) if len(rows) else np.zeros(0, np.int64)
    big = np.flatnonzero(run_edges > MASK_WALK * edges)
    ends = np.zeros(len(rows) + 1, dtype=np.int64)  # entries before each row: the pieces' lo and hi
    np.cumsum(counts, out=ends[1:])
    pieces: list[tuple[int, int, np.ndarray]] = []
    row = 0
    for b in big:
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        if row < lo:
            pieces.append((int(ends[row]), int(ends[lo]), _entries(indptr, rows[row:lo])))
        held = np.zeros(n, dtype=bool)
        held[rows[lo:hi]] = True
        pieces.append((int(ends[lo]), int(ends[hi]), np.repeat(held, np.diff(indptr))))
        row = hi
    if row < len(rows) or not pieces:
        pieces.append((int(ends[row]), int(ends[-1]), _entries(indptr, rows[row:])))
    return pieces


def _sources(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mask of the in-neighbours of the rows in mask `rows`, read off their in-CSR rows: the work is their
    in-edges (a rank's owned rows: an eighth of them for 8 workers), not every edge of the graph.

    Rows holding more than `MASK_WALK` of the edges (a depcache segment's first layers: most of the graph) are
    read through a mask over every entry (one byte per edge, one sequential pass) instead of their entries'
    positions (8 bytes per edge written, then a gather by them): ~3x less CPU at 60-95% of the edges on the
    products-like R-MAT at 0.1, the same set."""
    out = np.zeros(len(rows), dtype=bool)
    degree = np.diff(indptr)
    edges = int(indptr[-1])
    if int(degree[rows].sum()) > MASK_WALK * edges:
        out[indices[:edges][np.repeat(rows, degree)]] = True
    else:
        out[indices[_entries(indptr, np.nonzero(rows)[0])]] = True
    return out


class _Sources:
    """`_sources` of one worker's row sets, each (view, mask) walked once: a deep model's layers ask for the same
    rows' in-neighbours again and again (the owned rows' at every layer of a segment, and for each halo), and
    each walk reads every edge of the graph. The masks returned are shared: callers combine them, never write."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.done: dict[tuple[str, bytes], np.ndarray] = {}
        self.last: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # view -> the rows last walked, their sources

    def __call__(self, view: str, rows: np.ndarray) -> np.ndarray:
        key = (view, np.packbits(rows).tobytes())
        out = self.done.get(key)
        if out is None:
            last = self.last.get(view)
            if last is not None and not np.any(last[0] & ~rows):
                # rows that hold the last ones (a depcache segment's, layer after layer towards its start): only
                # the rows added are walked, not the segment's whole neighbourhood again at every layer
                out = last[1] | self._walk(view, rows & ~last[0])
            else:
                out = self._walk(view, rows)
            self.done[key] = out
            self.last[view] = (rows, out)
        return out

    def _walk(self, view: str, rows: np.ndarray) -> np.ndarray:
        key = (view, np.packbits(rows).tobytes())
        if key not in self.done:
            csr = self.graph.csr(view)
            self.done[key] = _sources(csr.indptr.numpy(), csr.indices.numpy(), rows)
        return self.done[key]


@dataclass
class RowSets:
    """One worker's rows per graph layer: held on input (C^l) and computed (the layer's output rows).

    Within a depcache/hybrid segment [s, e) the layers' output rows are the
    next layers' inputs and the last one's are the owned rows; C^s of a
    segment that starts after layer 0 is fetched on entry (`entries[s]`,
    C^s minus the owned rows, by (owner, global id)). `orders[s]` is the
    segment's row order (owned rows first, then by decreasing depth, then
    global id), in which every set of the segment is a prefix.
    """

    held_in: list[np.ndarray]  # per graph layer: mask of C^l
    held_out: list[np.ndarray]  # per graph layer: mask of the rows it computes
    halos: list[np.ndarray | None]  # per graph layer: H^l by (owner, global id), None without a halo
    entries: dict[int, np.ndarray]  # segment start > 0 -> rows fetched on entry
    orders: dict[int, np.ndarray]  # segment start -> its row order; key -1: the owned rows


def _neighbourhood(specs: list[LayerSpec], start: int, end: int) -> bool:
    """Whether every layer of the segment [start, end) holds every in-neighbour (depcache): its C^l are then the
    vertices within end - l in-hops of the owned ones, read off gnnc.plan.distances' table."""
    return all(STRATEGIES[specs[lyr].strategy].rows == "neighbourhood" for lyr in range(start, end))


def rank_row_sets(graph: Graph, parts: np.ndarray, rank: int, specs: list[LayerSpec],
                  cached: dict[int, np.ndarray] | None = None, distance: np.ndarray | None = None) -> RowSets:
    """C^l, output rows and H^l of worker `rank`; `cached[l]` are the hybrid selection's R_l (global ids).
    `distance`: every vertex's in-distance from the rank's owned ones (-1 beyond; a column of
    gnnc.plan.distances' table, at least as deep as the longest depcache segment): a depcache segment's sets are
    read off it, not walked."""
    owned = parts == rank
    held_in = [owned] * len(specs)
    held_out = [owned] * len(specs)
    entries: dict[int, np.ndarray] = {}
    orders: dict[int, np.ndarray] = {-1: np.nonzero(owned)[0]}
    sources = _Sources(graph)
    off_table: set[int] = set()  # layers whose sets were read off `distance`
    for start, end in segments(specs):
        if distance is not None and _neighbourhood(specs, start, end):
            off_table.update(range(start, end))
            # C^l = {v: dist(v) <= end - l}; a vertex's depth in the segment's order is the last layer l - start
            # whose C^l holds it, end - start - dist(v): what the walk below assigns, level by level
            reached = distance >= 0
            for lyr in range(start, end):
                held_in[lyr] = reached & (distance <= end - lyr)
                if lyr > start:
                    held_out[lyr - 1] = held_in[lyr]
            depth = np.where(held_in[start], (end - start) - distance.astype(np.int32), -1).astype(np.int32)
        else:
            depth = _walk_segment(specs, start, end, owned, held_in, held_out, sources, cached)
        held = np.nonzero(depth >= 0)[0]
        orders[start] = held[np.lexsort((held, -depth[held]))]
        if start > 0:
            e = np.nonzero(held_in[start] & ~owned)[0]
            entries[start] = e[np.lexsort((e, parts[e]))]
    halos: list[np.ndarray | None] = []
    for lyr, s in enumerate(specs):
        if not STRATEGIES[s.strategy].halo:
            halos.append(None)
            continue
        if lyr in off_table:  # C^l holds every in-neighbour of C^{l+1} (it is the next level): nothing to fetch
            halos.append(np.zeros(0, dtype=np.intp))
            continue
        need = (sources(s.view, held_out[lyr]) | held_out[lyr]) & ~held_in[lyr]
        h = np.nonzero(need)[0]
        halos.append(h[np.lexsort((h, parts[h]))])
    return RowSets(held_in, held_out, halos, entries, orders)


def _walk_segment(specs: list[LayerSpec], start: int, end: int, owned: np.ndarray, held_in: list[np.ndarray],
                  held_out: list[np.ndarray], sources: _Sources, cached: dict[int, np.ndarray] | None
                  ) -> np.ndarray:
    """The segment [start, end)'s C^l (into held_in, held_out) by walking the in-edges layer by layer towards its
    start; each held row's depth in the segment's order (-1: not held)."""
    depth = np.where(owned, end - start, -1).astype(np.int32)
    for lyr in reversed(range(start, end)):
        view = specs[lyr].view
        out = held_out[lyr]
        if STRATEGIES[specs[lyr].strategy].rows == "neighbourhood":  # every in-neighbour: no halo rows
            cur = out | sources(view, out)
        else:
            cur = out | sources(view, out & ~owned)
            if cached and lyr in cached:
                cur[np.asarray(cached[lyr], dtype=np.int64)] = True
        held_in[lyr] = cur
        depth[cur & (depth < 0)] = lyr - start
        if lyr > start:
            held_out[lyr - 1] = cur
    return depth


def all_row_sets(graph: Graph, parts: np.ndarray, world: int, specs: list[LayerSpec],
                 cached: dict[int, list[np.ndarray]] | None = None) -> list[RowSets]:
    """Every worker's row sets (the send side of a halo needs the receivers').

    A depcache segment's sets are read off the in-distance table of every part (gnnc.plan.distances: computed
    once for all ranks, or the one the statistics pass computed for this assignment), not walked rank by rank:
    each rank's walk read most of the graph's in-edges for a deep segment."""
    table = None
    if any(_neighbourhood(specs, start, end) for start, end in segments(specs)):
        # as deep as the graph layers and over the statistics' view: the table that pass asked for (and cached)
        view = "self_loops" if any(s.view == "self_loops" for s in specs) else "plain"
        table = part_distances(graph, parts, world, len(specs), view)
    return [rank_row_sets(graph, parts, r, specs, {k: v[r] for k, v in (cached or {}).items()},
                          None if table is None else table[:, r])
            for r in range(world)]


def halo_rows(sets: list[RowSets], layer: int) -> int:
    """Rows all workers receive in layer `layer`'s halo (each owner sends each row once per needing worker)."""
    return sum(len(s.halos[layer]) for s in sets if s.halos[layer] is not None)


def entry_rows(sets: list[RowSets], start: int) -> int:
    """Rows all workers fetch on entering the segment that starts at graph layer `start`."""
    return sum(len(s.entries.get(start, ())) for s in sets)


@dataclass
class SourceParts:
    """A layer view's edges grouped by the part of the source rows they read (gnnc.plan.schedule_attrs: `split`).

    Part p reads source rows [bounds[p], bounds[p+1]) of the layer's exchange:
    for an overlapped halo, the held rows and then the halo rows; for a staged
    broadcast, rank p's row block. `views[p]` holds part p's edges with their
    sources numbered from 0 within the part (destinations, edge data, edge ids
    and in-degrees as the whole view has them), and `pos[p]` selects them in
    the order per-edge data of the whole view is held in (index tensors;
    slices once the view is held by parts, see `LayerGraph.hold_parts`).
    """

    bounds: tuple[int, ...]
    views: list[GraphView]
    pos: list[torch.Tensor | slice]

    def __len__(self) -> int:
        return len(self.views)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "SourceParts":
        return SourceParts(self.bounds, [v.map_tensors(fn) for v in self.views],
                           [p if isinstance(p, slice) else fn(p) for p in self.pos])


def sub_view(view: GraphView, pos: torch.Tensor, cols: torch.Tensor, n_src: int) -> GraphView:
    """The edges of `view` at positions `pos` (ascending, so still grouped by destination), sources `cols`."""
    counts = torch.bincount(view.dst[pos], minlength=view.csr.n_dst)
    indptr = torch.zeros(view.csr.n_dst + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    edge_ids = view.edge_ids[pos]
    csr = CSR(indptr, cols, edge_ids, view.csr.n_dst, n_src)
    # the destinations built when first read (GraphView.dst): the kernels' products never read them, and a rank keeps
    # every part for the run (8 bytes per edge, issue 35)
    return GraphView(csr, csr.indices, None, edge_ids, {k: v[pos] for k, v in view.edge_data.items()}, view.deg)


@dataclass
class LayerGraph:
    """One graph layer as a worker runs it: |C^l| input rows, its output rows, its edges, its halo.

    `ids` are the global ids of the rows in the order the layer holds them
    (its segment's order); a layer that starts a segment after layer 0
    first fetches C^l (`entry`, then `entry_perm` puts [owned, fetched] into
    that order).
    """

    n_in: int
    n_out: int
    views: dict[str, GraphView]
    halo: HaloPlan | None = None
    blocks: bool = False  # bcast1d: sources are every row in block order
    ids: torch.Tensor | None = None
    entry: HaloPlan | None = None
    entry_perm: torch.Tensor | None = None
    _parts: dict[tuple[str, tuple[int, ...]], SourceParts] = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)  # what the runtime derives from the structure once

    def parts(self, view: str, bounds: tuple[int, ...]) -> SourceParts:
        """The view's edges grouped by source rows [bounds[p], bounds[p+1]) (built once)."""
        key = (view, tuple(bounds))
        if key not in self._parts:
            v = self.views[view]
            if v.csr is None:
                raise AssertionError(f"the {view} structure is held by parts {[k[1] for k in self._parts]}, "
                                     f"not {bounds}")
            part = torch.bucketize(v.src, torch.as_tensor(bounds[1:-1], dtype=torch.int64), right=True)
            views, pos = [], []
            for p in range(len(bounds) - 1):
                at = torch.nonzero(part == p).flatten()
                views.append(sub_view(v, at, v.src[at] - bounds[p], bounds[p + 1] - bounds[p]))
                pos.append(at)
            self._parts[key] = SourceParts(tuple(bounds), views, pos)
        return self._parts[key]

    def hold_parts(self, view: str, bounds: tuple[int, ...]) -> None:
        """Keep only the parts: the view's per-edge data reordered part by part, its CSR dropped.

        For layers where only equations run per part read the view's
        structure (the others read only its edge data): the whole CSR next to
        its parts would be the rank's largest duplicate.
        """
        sp = self.parts(view, bounds)
        full = self.views[view]
        order = torch.cat([torch.as_tensor(p) for p in sp.pos])
        held = GraphView(None, None, None, full.edge_ids[order],  # type: ignore[arg-type]
                         {k: v[order] for k, v in full.edge_data.items()}, full.deg)
        self.views[view] = held
        sizes = [int(len(p)) for p in sp.pos]
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        cut = [slice(offsets[p], offsets[p + 1]) for p in range(len(sizes))]
        # each part's edge ids and edge data are the same values as its slice of the reordered whole: held once, as
        # slices of it (two copies were 12 bytes per edge of GCN's rank, issue 35)
        for v, at in zip(sp.views, cut):
            v.edge_ids = v.csr.eids_given = held.edge_ids[at]
            v.edge_data = {k: t[at] for k, t in held.edge_data.items()}
        self._parts = {k: v for k, v in self._parts.items() if k[0] != view}
        self._parts[(view, tuple(bounds))] = SourceParts(sp.bounds, sp.views, cut)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LayerGraph":
        """This layer with `fn` applied to every tensor: views, halo and entry plans, ids, the source parts
        built and what the runtime derived once (each `_cache` entry maps its own tensors: gnnc.plan.bins)."""
        return LayerGraph(self.n_in, self.n_out, {k: v.map_tensors(fn) for k, v in self.views.items()},
                          None if self.halo is None else self.halo.map_tensors(fn), self.blocks,
                          None if self.ids is None else fn(self.ids),
                          None if self.entry is None else self.entry.map_tensors(fn),
                          None if self.entry_perm is None else fn(self.entry_perm),
                          {k: sp.map_tensors(fn) for k, sp in self._parts.items()},
                          {k: v.map_tensors(fn) for k, v in self._cache.items()})


@dataclass
class LocalGraph:
    """The rows a worker holds (global ids, prefix order) and each graph layer's structure."""

    rows: torch.Tensor
    n_owned: int
    layers: dict[str, LayerGraph]
    block_rows: list[int]  # rows each rank owns: bcast1d's blocks, the sizes of P3's pull

    @property
    def owned(self) -> torch.Tensor:
        return self.rows[: self.n_owned]

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LocalGraph":
        """This worker's graph with `fn` applied to every tensor (a layer structure shared by layers, once)."""
        mapped: dict[int, LayerGraph] = {}
        for g in self.layers.values():
            if id(g) not in mapped:
                mapped[id(g)] = g.map_tensors(fn)
        layers = {name: mapped[id(g)] for name, g in self.layers.items()}
        return LocalGraph(fn(self.rows), self.n_owned, layers, self.block_rows)


def _view(graph: Graph, view: str, out_rows: np.ndarray, computed: np.ndarray, col: np.ndarray,
          n_src: int, edge_positions: bool = True, unread: frozenset[str] = frozenset(),
          narrow: bool = False) -> GraphView:
    """The in-edges of `out_rows` (global ids in local row order; mask `computed` over every vertex), their
    sources numbered by `col` (global id -> local column, -1: not held).

    The graph's CSR rows are gathered in local row order: a row's in-edges stay in the view's edge order, the
    order a stable sort of the edges by local row gives, with no sort per layer and rank. The CSR's `eids` are
    edge positions among the in-edges of `computed` in view order, as such a sort of them numbers them.

    It runs once per rank and distinct layer structure, and a depcache layer's rows are most of the graph: the
    positions it gathers with are int32 while the edges fit (half the bytes of int64 to write and to gather).
    `unread` (`build_local_graph`): per-edge arrays not gathered, no layer reading them. `narrow` (the shard
    writer's, `build_local_graph`): the CSR's columns int32 where they fit, the dtype the shard stores them in
    (gathered at 4 bytes per edge, not widened to int64 and narrowed again by the writer: three passes over every
    edge of the rank), and its destinations left to the CSR to expand if read (the writer never does)."""
    g = graph.csr(view)
    g_indptr, g_src, g_eids = g.indptr.numpy(), g.indices.numpy(), g.eids.numpy()
    counts = g_indptr[out_rows + 1] - g_indptr[out_rows]
    indptr = np.zeros(len(out_rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    narrow = narrow and n_src < 2**31
    cols = col.astype(np.int32 if narrow else np.int64, copy=False)
    data = _edge_data_in_csr_order(graph, view, unread)
    nnz = int(indptr[-1])
    local_src = np.empty(nnz, dtype=cols.dtype)
    global_eids = np.empty(nnz, dtype=g_eids.dtype) if edge_positions or "eids" not in unread else None
    gathered = {k: np.empty((nnz, *v.shape[1:]), dtype=v.dtype) for k, v in data.items()}
    for lo, _, at in _entry_pieces(g_indptr, out_rows):  # the rows' entries, a run of rows at a time
        # a run read through a mask over every entry goes GATHER_BLOCK entries at a time: each block's selected
        # sources go from the cache to the take, where the whole run's were a temporary of most of the graph's
        # edges (0.76 GB of int64 for a products rank, its pages faulted in and zeroed per rank, then read back)
        blocks = [(s, at[s:s + GATHER_BLOCK]) for s in range(0, len(at), GATHER_BLOCK)] if at.dtype == bool \
            else [(None, at)]
        for s, sel in blocks:
            hi = lo + (int(np.count_nonzero(sel)) if s is not None else len(sel))
            # take's "wrap" mode: no bounds check of its own (the CSR's sources are vertex ids) and no buffer,
            # ~half the CPU of indexing here
            np.take(cols, g_src[s:s + len(sel)][sel] if s is not None else g_src[sel], mode="wrap",
                    out=local_src[lo:hi])
            if global_eids is not None:
                global_eids[lo:hi] = g_eids[s:s + len(sel)][sel] if s is not None else g_eids[sel]
            for k, v in data.items():
                gathered[k][lo:hi] = v[s:s + len(sel)][sel] if s is not None else v[sel]
            lo = hi
        del at, blocks
    edge_data = {k: torch.from_numpy(v) for k, v in gathered.items()}
    if len(local_src) and local_src.min() < 0:
        raise AssertionError(f"view {view}: an in-neighbour of a computed row is neither held nor fetched")
    n_dst = len(out_rows)
    # what CSR.dst_index would expand from the degrees, here from the counts; the shard writer reads none
    dst_index = None if narrow else torch.from_numpy(np.repeat(np.arange(n_dst, dtype=np.int64), counts))
    csr = CSR(torch.from_numpy(indptr), torch.from_numpy(local_src),
              _local_eids(graph, view, computed, global_eids) if edge_positions else None, n_dst, n_src,
              _cache={} if dst_index is None else {"dst": dst_index})
    eids = torch.full((), -1, dtype=torch.int64).expand(len(local_src)) if global_eids is None else \
        torch.from_numpy(global_eids.astype(np.int64, copy=False))  # -1: "unknown", as a shard without them loads
    return GraphView(csr, csr.indices, dst_index, eids, edge_data, csr.in_degree().to(torch.float32))


def _local_eids(graph: Graph, view: str, computed: np.ndarray, global_eids: np.ndarray) -> torch.Tensor:
    """The CSR's `eids`: each edge's position among the in-edges of the rows in mask `computed`, in view order
    (a pass over every edge of the view and a gather per edge held: half of a structure's building)."""
    _, dst = graph.edges(view)
    index = np.int32 if len(dst) < 2**31 else np.int64
    position = np.cumsum(computed[dst], dtype=index)  # view edge -> its position among the computed rows' in-edges, + 1
    local_eids = position[global_eids].astype(np.int64)
    local_eids -= 1
    return torch.from_numpy(local_eids)


def _prefix_view(graph: Graph, view: str, of: GraphView, n_dst: int, computed: np.ndarray, n_src: int,
                 edge_positions: bool = True) -> GraphView:
    """`_view` of the first `n_dst` rows of the rows `of` computes, read off `of`: a deeper layer of a depcache
    segment computes a prefix of the rows an earlier one computes (the segment's order), from the same
    in-edges numbered by the same columns, so its indices, edge ids, edge data, destinations and degrees are
    prefixes of the earlier layer's (shared, not gathered again: the layers of a segment that reaches most of the
    graph hold it each). Only the CSR's `eids`, positions among its own rows' in-edges, are its own."""
    indptr = of.csr.indptr[:n_dst + 1]
    nnz = int(indptr[-1])
    eids = of.edge_ids[:nnz]
    dst_index = None if of.dst_given is None else of.dst_given[:nnz]  # None: the shard writer's, never read
    local = _local_eids(graph, view, computed, eids.numpy()) if edge_positions else None
    csr = CSR(indptr, of.csr.indices[:nnz], local, n_dst, n_src,
              _cache={} if dst_index is None else {"dst": dst_index})
    return GraphView(csr, csr.indices, dst_index, eids, {k: v[:nnz] for k, v in of.edge_data.items()},
                     of.deg[:n_dst])


def _edge_data_in_csr_order(graph: Graph, view: str, unread: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """gcn_norm and the edge data of the view's CSR entries, in the CSR's order (view_edge_data's arrays, in its
    order), less those in `unread`: gathered once per graph, view and name (kept with the graph's views), so each
    rank's structures take them by their CSR positions, runs of consecutive entries, instead of by edge id, a
    random gather over every edge per rank and layer. A name in `unread` is neither computed nor gathered:
    gcn_norm of a GraphSAGE plan's view was a pass over every edge (degrees, norms) and a gather per edge for
    nothing (0.35 of the 1.56 CPU s of the structures on the products-like R-MAT at 0.05)."""
    held = graph._views.setdefault(("edge_data in csr order", view), {})
    names = [k for k in ("gcn_norm", *graph.edge_data) if k not in unread]  # every view has the graph's names
    for k in names:
        if k not in held:
            held[k] = graph.gcn_norm_in_csr_order(view) if k == "gcn_norm" else \
                _csr_ordered(graph, view, graph.edge_values(view)[k])
    return {k: held[k] for k in names}


def hold_view(graph: Graph, view: str, csr: CSR, edge_data: dict[str, np.ndarray]) -> None:
    """Give `graph` the CSR of `view` and its per-edge arrays in that CSR's order (gcn_norm, the edge data), as
    `_view` reads them: a plan's rank that builds its structures from a store holds the views the store does not
    (the self-loops view) as the compiler wrote them (gnnc.plan.shards.write_views), not rebuilt from every edge."""
    graph._views[("csr", view)] = csr
    graph._views[("edge_data in csr order", view)] = dict(edge_data)


def _csr_ordered(graph: Graph, view: str, values: torch.Tensor) -> np.ndarray:
    """Per-edge `values` (the view's edge order) in its CSR's order: a gather by edge id over every edge."""
    return values.numpy()[graph.csr(view).eids.numpy()]


def _same_rows_key(sets: list[RowSets], rank: int, lyr: int, s: LayerSpec) -> tuple:
    """What a depcache/hybrid layer's structure is built from, by content: C^l, its output rows and every
    worker's H^l (the send side reads the receivers'). Deep layers of a segment mostly hold the same rows
    (the hop neighbourhood saturates), so equal keys are built once (the segment and view are in the key)."""
    mine = sets[rank]
    halos = None if mine.halos[lyr] is None else tuple(
        None if st.halos[lyr] is None else st.halos[lyr].tobytes() for st in sets)
    return (s.segment, s.view, s.strategy, np.packbits(mine.held_in[lyr]).tobytes(),
            np.packbits(mine.held_out[lyr]).tobytes(), halos)


@dataclass(eq=False)
class ViewRecipe:
    """What `_view` would build, left for the rank to build from the graph's store (`build_local_graph`'s
    `store_views`; gnnc.plan.shards writes it and builds it on load): the in-edges of the layer's first `n_out`
    rows (its ids' prefix), their sources numbered by `cols`: "held", the layer's first n_in rows then `halo`
    (global ids) after them, or "blocks", every row in block order. `of`: the recipe whose first `n_out` rows these
    are (a deeper depcache layer's, `_prefix_view`), built once."""

    view: str
    n_out: int
    n_src: int
    nnz: int
    cols: str
    halo: np.ndarray | None = None
    of: "ViewRecipe | None" = None


def _recipe(graph: Graph, view: str, out_rows: np.ndarray, n_src: int, cols: str,
            halo: np.ndarray | None = None) -> ViewRecipe:
    indptr = graph.csr(view).indptr.numpy()
    nnz = int((indptr[out_rows + 1] - indptr[out_rows]).sum())
    return ViewRecipe(view, len(out_rows), n_src, nnz, cols, halo)


def _same_structure(lg: LayerGraph) -> LayerGraph:
    """Another layer's LayerGraph over the same tensors: its own object, as each nested layer had when built
    apiece (a plan's shards give each such layer its own structure; the runtime keeps per-layer state on it)."""
    views = {k: v if isinstance(v, ViewRecipe) else GraphView(v.csr, v.src, v.dst_given, v.edge_ids,
                                                              dict(v.edge_data), v.deg)
             for k, v in lg.views.items()}
    return LayerGraph(lg.n_in, lg.n_out, views, lg.halo, lg.blocks, ids=lg.ids)


def build_local_graph(graph: Graph, parts: np.ndarray, rank: int, world: int, specs: list[LayerSpec],
                      sets: list[RowSets], edge_positions: bool = True,
                      unread: frozenset[str] = frozenset(), narrow: bool = False,
                      store_views: bool = False) -> LocalGraph:
    """Worker `rank`'s LocalGraph from every worker's row sets.

    `edge_positions=False` leaves out each CSR's `eids` (its edges' positions among its rows' in-edges; reading them
    is then an error): a shard does not hold them (a loaded structure numbers its edges 0..nnz-1), and they were
    half of building a depcache layer, so the shard writer (gnnc.plan.shards.rank_arrays) asks for none. `unread`
    names per-edge arrays no layer of the program reads ("eids": the edges' global ids, "gcn_norm"), which the
    shard writer does not store: not gathered (with `edge_positions=False` only), the ids -1 of each view's length.
    `narrow` (the shard writer's): each CSR's columns int32 where they fit, as the shard stores them, and its
    destinations not expanded (`_view`): the runtime's structures keep int64. `store_views` (the shard writer's,
    for a graph whose stored CSR a rank can read: gnnc.plan.shards.store_source): each view that `_view` or
    `_prefix_view` would build is a ViewRecipe, built by the rank from the store (or, for a view the store does
    not hold, from the plan's one copy of it).

    Each distinct structure is built once: layers of a per-layer strategy on one view share one LayerGraph;
    layers of a depcache/hybrid segment with equal row sets (`_same_rows_key`) get their own LayerGraph
    over the tensors of the first."""
    mine = sets[rank]
    n = graph.num_nodes
    owned_ids = mine.orders[-1]
    n_owned = len(owned_ids)
    block_col = None
    layers: dict[str, LayerGraph] = {}
    built: dict[tuple, LayerGraph] = {}
    same_rows: dict[tuple, LayerGraph] = {}
    positions: dict[int, np.ndarray] = {}
    prefix_of: dict[tuple[int, str], LayerGraph] = {}  # (segment, view) -> the depcache layer deeper ones read off
    for lyr, s in enumerate(specs):
        seg = s.segment if _nested(s.strategy) else -1
        order = mine.orders[seg]
        if seg not in positions:
            positions[seg] = np.full(n, -1, dtype=np.int64)
            positions[seg][order] = np.arange(len(order))
        pos = positions[seg]
        n_in, n_out = int(np.count_nonzero(mine.held_in[lyr])), int(np.count_nonzero(mine.held_out[lyr]))
        key = (s.view, s.strategy) if seg < 0 else None  # owned rows in and out: the same for every such layer
        if key is not None and key in built:
            layers[s.name] = built[key]
            continue
        rows_key = _same_rows_key(sets, rank, lyr, s) if seg >= 0 and lyr not in mine.entries else None
        if rows_key is not None and rows_key in same_rows:
            layers[s.name] = _same_structure(same_rows[rows_key])
            continue
        ids = torch.as_tensor(order, dtype=torch.int64)
        computed = mine.held_out[lyr]
        out_rows = order[:n_out]  # the rows it computes: a prefix of the order
        rows = STRATEGIES[s.strategy].rows
        if rows == "all":  # runs on the whole first-layer structure (the shard's full views, gnnc.plan.shards)
            lg = LayerGraph(n_in, n_out, {}, None, ids=ids)
        elif rows == "blocks":
            if block_col is None and not store_views:
                block_col = np.empty(n, dtype=np.int64)
                block_col[np.argsort(parts, kind="stable")] = np.arange(n)
            views = {s.view: _recipe(graph, s.view, out_rows, n, "blocks") if store_views
                     else _view(graph, s.view, out_rows, computed, block_col, n, edge_positions, unread, narrow)}
            lg = LayerGraph(n_in, n_out, views, None, True, ids=ids)
        else:
            col = np.where(mine.held_in[lyr], pos, -1)
            h = mine.halos[lyr]
            halo = None
            if h is not None:
                col[h] = n_in + np.arange(len(h))
                halo = _halo_plan(parts, rank, world, [st.halos[lyr] for st in sets], pos, h)
            n_src = n_in + (len(h) if h is not None else 0)
            # depcache reads every in-neighbour from held rows (its halo is empty): a deeper layer of the segment
            # computes a prefix of the rows the segment's first such layer computes (`_prefix_view`)
            whole = rows == "neighbourhood" and (h is None or len(h) == 0) and seg >= 0
            widest = prefix_of.get((seg, s.view)) if whole else None
            # the rank numbers the held rows by their place in the layer's ids (the order's prefix, RowSets)
            if store_views and n_in and int(pos[mine.held_in[lyr]].max()) >= n_in:
                raise AssertionError(f"layer {s.name}: its held rows are not the first {n_in} of its order")
            if widest is not None and widest.n_out >= n_out:
                of = widest.views[s.view]
                view = ViewRecipe(s.view, n_out, n_src, _recipe(graph, s.view, out_rows, n_src, "held").nnz, "held",
                                  of=of) if store_views else \
                    _prefix_view(graph, s.view, of, n_out, computed, n_src, edge_positions)
            elif store_views:
                view = _recipe(graph, s.view, out_rows, n_src, "held", h if h is not None and len(h) else None)
            else:
                view = _view(graph, s.view, out_rows, computed, col, n_src, edge_positions, unread, narrow)
            lg = LayerGraph(n_in, n_out, {s.view: view}, halo, ids=ids)
            if whole and widest is None:
                prefix_of[(seg, s.view)] = lg
        if lyr in mine.entries:
            fetched = mine.entries[lyr]
            lg.entry = _halo_plan(parts, rank, world, [st.entries[lyr] for st in sets], pos, fetched)
            perm = np.empty(n_in, dtype=np.int64)
            perm[pos[owned_ids]] = np.arange(n_owned)
            perm[pos[fetched]] = n_owned + np.arange(len(fetched))
            lg.entry_perm = torch.as_tensor(perm)
        layers[s.name] = lg
        if key is not None:
            built[key] = lg
        if rows_key is not None:
            same_rows[rows_key] = lg
    first = mine.orders[specs[0].segment if specs and _nested(specs[0].strategy) else -1] if specs else owned_ids
    block_rows = [int(c) for c in np.bincount(parts, minlength=world)]
    return LocalGraph(torch.as_tensor(first, dtype=torch.int64), n_owned, layers, block_rows)


def _halo_plan(parts: np.ndarray, rank: int, world: int, wanted_by: list[np.ndarray | None], pos: np.ndarray,
               mine: np.ndarray) -> HaloPlan:
    """Rows this rank sends each peer (theirs of `wanted_by[p]` it owns) and receives (`mine`, by owner)."""
    send_idx, recv_counts = [], []
    for p in range(world):
        if p == rank:
            send_idx.append(torch.zeros(0, dtype=torch.int64))
            recv_counts.append(0)
            continue
        theirs = wanted_by[p]
        wanted = theirs[parts[theirs] == rank]  # already by global id
        send_idx.append(torch.as_tensor(pos[wanted], dtype=torch.int64))
        recv_counts.append(int(np.count_nonzero(parts[mine] == p)))
    return HaloPlan(tuple(send_idx), tuple(recv_counts))


def remote_in_neighbours(graph: Graph, parts: np.ndarray, world: int, views: list[str]) -> list[np.ndarray]:
    """B_p for every part p: the distinct remote in-neighbours of its vertices over the views' edges,
    ordered by (owner, global id)."""
    out: list[np.ndarray] = []
    for p in range(world):
        srcs = []
        for v in views:
            s, d = graph.edges(v)
            m = (parts[d] == p) & (parts[s] != p)
            srcs.append(s[m])
        b = sorted_unique(np.concatenate(srcs)) if srcs else np.zeros(0, np.int64)
        b = b[np.lexsort((b, parts[b]))]
        out.append(b.astype(np.int64))
    return out
