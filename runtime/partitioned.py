"""The rows one worker holds, layer by layer, under each strategy.

Graph layer l (0..L-1) reads h^l and writes h^{l+1}; h^0 is the input. A
worker holds the rows C^l of h^l, and the sets nest, C^0 ⊇ C^1 ⊇ ... ⊇ C^L =
its owned vertices, so one row order serves every layer: owned rows first,
then the others by decreasing depth (the last l with the row in C^l), then
global id. Every C^l is a prefix of that order, and a vertex-wise op that
meets values of two layers takes the shorter prefix.

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

A depcache or hybrid segment starts at the first graph layer, whose input
is static and loaded with the shard; a segment starting later would first
have to fetch a replicated neighbourhood of h^s, which the runtime does not
do yet. Edge data (gcn_norm) and dropout ids are global, so every worker
computes what one process computes for the rows it holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.runtime.comm import HaloPlan
from gnnc.runtime.executor import GraphView
from gnnc.runtime.graph import CSR, Graph

NESTED = ("depcache", "hybrid")  # strategies whose row sets grow below the last layer of their segment
HALO = ("depcomm", "hybrid", "depcache")  # strategies that read remote rows through a halo (empty for depcache)


@dataclass(frozen=True)
class LayerSpec:
    """What the row sets need to know of one graph layer."""

    name: str
    view: str  # edge view: plain or self_loops
    strategy: str


def layer_specs(program) -> list[LayerSpec]:
    """The graph layers of an annotated program; raises unless its nested segment starts at layer 0."""
    specs = [LayerSpec(layer.name, layer.edges, layer.attr("strategy", "local")) for layer in program.graph_layers()]
    nested_end = nested_segment_end(specs)
    for k, s in enumerate(specs):
        if s.strategy in NESTED and k >= nested_end:
            raise GnncError(f"layer {s.name}: a {s.strategy} segment must start at the first graph layer and run "
                            f"without a break (it replicates the input's neighbourhood, which is static only "
                            f"there)")
    return specs


def nested_segment_end(specs: list[LayerSpec]) -> int:
    """End (exclusive) of the depcache/hybrid segment that starts at layer 0; 0 when there is none."""
    if not specs or specs[0].strategy not in NESTED:
        return 0
    end = 1
    while end < len(specs) and specs[end].strategy == specs[0].strategy:
        end += 1
    return end


def _sources(src: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mask of the in-neighbours of the rows in mask `rows`."""
    out = np.zeros(len(rows), dtype=bool)
    out[src[rows[dst]]] = True
    return out


@dataclass
class RowSets:
    """One worker's C^0..C^L (as depth: v in C^l iff depth[v] >= l) and its halos H^l."""

    depth: np.ndarray  # int16 [n]: last layer index l with v in C^l, -1 if never held
    halos: list[np.ndarray | None]  # per graph layer: H^l by (owner, global id), None without a halo
    order: np.ndarray = field(init=False)  # global ids of the held rows, the prefix order

    def __post_init__(self) -> None:
        held = np.nonzero(self.depth >= 0)[0]
        self.order = held[np.lexsort((held, -self.depth[held]))]

    def count(self, level: int) -> int:
        """|C^level|."""
        return int(np.count_nonzero(self.depth >= level))


def rank_row_sets(graph: Graph, parts: np.ndarray, rank: int, specs: list[LayerSpec],
                  cached: dict[int, np.ndarray] | None = None) -> RowSets:
    """C^l and H^l of worker `rank`; `cached[l]` are the hybrid selection's R_l (global ids)."""
    L = len(specs)
    owned = parts == rank
    held = [owned] * (L + 1)
    for lyr in reversed(range(nested_segment_end(specs))):
        src, dst = graph.edges(specs[lyr].view)
        nxt = held[lyr + 1]
        if specs[lyr].strategy == "depcache":
            cur = nxt | _sources(src, dst, nxt)
        else:
            cur = nxt | _sources(src, dst, nxt & ~owned)
            if cached and lyr in cached:
                cur[np.asarray(cached[lyr], dtype=np.int64)] = True
        held[lyr] = cur
    depth = np.full(graph.num_nodes, -1, dtype=np.int16)
    for lyr in range(L + 1):
        depth[held[lyr]] = lyr
    halos: list[np.ndarray | None] = []
    for lyr, s in enumerate(specs):
        if s.strategy not in HALO:
            halos.append(None)
            continue
        src, dst = graph.edges(s.view)
        need = (_sources(src, dst, held[lyr + 1]) | held[lyr + 1]) & ~held[lyr]
        h = np.nonzero(need)[0]
        halos.append(h[np.lexsort((h, parts[h]))])
    return RowSets(depth, halos)


def all_row_sets(graph: Graph, parts: np.ndarray, world: int, specs: list[LayerSpec],
                 cached: dict[int, list[np.ndarray]] | None = None) -> list[RowSets]:
    """Every worker's row sets (the send side of a halo needs the receivers')."""
    return [rank_row_sets(graph, parts, r, specs, {k: v[r] for k, v in (cached or {}).items()})
            for r in range(world)]


def halo_rows(sets: list[RowSets], layer: int) -> int:
    """Rows all workers receive in layer `layer`'s halo (each owner sends each row once per needing worker)."""
    return sum(len(s.halos[layer]) for s in sets if s.halos[layer] is not None)


@dataclass
class SplitView:
    """A halo layer's edges split by source: held rows (computed while the halo is in flight) and halo rows.

    `local_pos` / `remote_pos` select each part's edges in the order per-edge
    data of the layer's view is held in (index tensors; slices once the
    view is held split, see `LayerGraph.hold_split`).
    """

    local: GraphView
    remote: GraphView
    local_pos: torch.Tensor | slice
    remote_pos: torch.Tensor | slice


def _sub_view(view: GraphView, pos: torch.Tensor, cols: torch.Tensor, n_src: int) -> GraphView:
    counts = torch.bincount(view.dst[pos], minlength=view.csr.n_dst)
    indptr = torch.zeros(view.csr.n_dst + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    edge_ids = view.edge_ids[pos]
    csr = CSR(indptr, cols, edge_ids, view.csr.n_dst, n_src)
    # only a sum aggregation reads a split view, its weights sliced by the caller: no edge data of its own
    return GraphView(csr, csr.indices, csr.dst_index(), edge_ids, {}, view.deg)


@dataclass
class LayerGraph:
    """One graph layer as a worker runs it: |C^l| input rows, |C^{l+1}| output rows, its edges, its halo."""

    n_in: int
    n_out: int
    views: dict[str, GraphView]
    halo: HaloPlan | None = None
    blocks: bool = False  # bcast1d: sources are every row in block order
    _split: dict[str, SplitView] = field(default_factory=dict, repr=False)

    def split(self, view: str) -> SplitView:
        """The view's edges from held rows and from halo rows (built once)."""
        if view not in self._split:
            v = self.views[view]
            is_local = v.src < self.n_in
            local_pos = torch.nonzero(is_local).flatten()
            remote_pos = torch.nonzero(~is_local).flatten()
            self._split[view] = SplitView(_sub_view(v, local_pos, v.src[local_pos], self.n_in),
                                          _sub_view(v, remote_pos, v.src[remote_pos] - self.n_in,
                                                    v.csr.n_src - self.n_in),
                                          local_pos, remote_pos)
        return self._split[view]

    def hold_split(self, view: str) -> None:
        """Keep only the split: the view's per-edge data reordered held-row edges first, its CSR dropped.

        For layers where nothing but the overlapped sum reads the view's
        structure (the rest reads only its edge data): the whole CSR next to
        its two halves would be the rank's largest duplicate.
        """
        sp = self.split(view)
        full = self.views[view]
        order = torch.cat([sp.local_pos, sp.remote_pos])
        n_local = len(sp.local_pos)
        self.views[view] = GraphView(None, None, None, full.edge_ids[order],  # type: ignore[arg-type]
                                     {k: v[order] for k, v in full.edge_data.items()}, full.deg)
        self._split[view] = SplitView(sp.local, sp.remote, slice(0, n_local), slice(n_local, None))


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


def _view(graph: Graph, view: str, sel: np.ndarray, local_src: np.ndarray, local_dst: np.ndarray,
          n_dst: int, n_src: int) -> GraphView:
    csr = CSR.from_edges(local_src, local_dst, n_dst, n_src)
    global_eids = torch.as_tensor(sel, dtype=torch.int64)[csr.eids]
    norm = graph.gcn_norm(view)[global_eids]
    return GraphView(csr, csr.indices, csr.dst_index(), global_eids, {"gcn_norm": norm},
                     csr.in_degree().to(torch.float32))


def build_local_graph(graph: Graph, parts: np.ndarray, rank: int, world: int, specs: list[LayerSpec],
                      sets: list[RowSets]) -> LocalGraph:
    """Worker `rank`'s LocalGraph from every worker's row sets."""
    mine = sets[rank]
    n = graph.num_nodes
    pos = np.full(n, -1, dtype=np.int64)
    pos[mine.order] = np.arange(len(mine.order))
    n_owned = int(np.count_nonzero(parts == rank))
    block_col = None
    layers: dict[str, LayerGraph] = {}
    built: dict[tuple, LayerGraph] = {}
    for lyr, s in enumerate(specs):
        n_in, n_out = mine.count(lyr), mine.count(lyr + 1)
        flat = lyr >= nested_segment_end(specs)  # owned rows in and out: the same for every such layer
        key = (s.view, s.strategy) if flat else None
        if key is not None and key in built:
            layers[s.name] = built[key]
            continue
        src, dst = graph.edges(s.view)
        sel = np.nonzero(mine.depth[dst] >= lyr + 1)[0]  # in-edges of C^{l+1}
        halo = None
        if s.strategy == "pushpull":  # runs on the whole first-layer structure (plan_shards' full views)
            lg = LayerGraph(n_in, n_out, {}, None)
        elif s.strategy == "bcast1d":
            if block_col is None:
                block_col = np.empty(n, dtype=np.int64)
                block_col[np.argsort(parts, kind="stable")] = np.arange(n)
            views = {s.view: _view(graph, s.view, sel, block_col[src[sel]], pos[dst[sel]], n_out, n)}
            lg = LayerGraph(n_in, n_out, views, None, True)
        else:
            col = np.where(mine.depth >= lyr, pos, -1)
            h = mine.halos[lyr]
            if h is not None:
                col[h] = n_in + np.arange(len(h))
                halo = _halo_plan(parts, rank, world, lyr, sets, pos, h)
            local_src = col[src[sel]]
            if len(local_src) and local_src.min() < 0:
                raise AssertionError(f"layer {s.name}: an in-neighbour of a held row is neither held nor fetched")
            n_src = n_in + (len(h) if h is not None else 0)
            lg = LayerGraph(n_in, n_out, {s.view: _view(graph, s.view, sel, local_src, pos[dst[sel]], n_out, n_src)},
                            halo)
        layers[s.name] = lg
        if key is not None:
            built[key] = lg
    block_rows = [int(c) for c in np.bincount(parts, minlength=world)]
    return LocalGraph(torch.as_tensor(mine.order, dtype=torch.int64), n_owned, layers, block_rows)


def _halo_plan(parts: np.ndarray, rank: int, world: int, lyr: int, sets: list[RowSets], pos: np.ndarray,
               mine: np.ndarray) -> HaloPlan:
    send_idx, recv_counts = [], []
    for p in range(world):
        if p == rank:
            send_idx.append(torch.zeros(0, dtype=torch.int64))
            recv_counts.append(0)
            continue
        theirs = sets[p].halos[lyr]
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
        b = np.unique(np.concatenate(srcs)) if srcs else np.zeros(0, np.int64)
        b = b[np.lexsort((b, parts[b]))]
        out.append(b.astype(np.int64))
    return out
