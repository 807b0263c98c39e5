"""In-memory graph storage shared by the loaders, partitioners and executors.

A `Graph` holds a directed edge list (messages flow src -> dst), vertex
features, labels and split masks. Aggregation reads in-edges, so the main
structure is a CSR over destinations (`CSR`: for each destination, its
sources). Layers may ask for a *view* of the edges: `plain` (the edges as
given, self-loops and duplicates kept, as PyG's SAGEConv/GINConv see them) or
`self_loops` (every existing self-loop removed, then exactly one added per
vertex, as PyG's GCNConv/GATConv/GCN2Conv see the graph). Named edge data
(`edge.weight`, `edge.attr`, ...: gnnc.graph.edge_data) follows the edges into
each view. Views and their CSRs are built once per graph and cached.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from gnnc.errors import GraphInputError
from gnnc.graph import edge_data as _edge_data
from gnnc.ir import VIEWS

# The label of a vertex without one (NaN in OGB's files: 98.6% of ogbn-papers100M). Such a vertex is in no
# mask, so the loss and the metrics, which read labels through the masks only, never see it.
UNLABELLED = -1


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """np.unique for int64 keys, by sorting (numpy's hash-based unique is several times slower here)."""
    keys = np.sort(keys)
    if len(keys) == 0:
        return keys
    first = np.empty(len(keys), dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return keys[first]


def row_blocks(indptr: np.ndarray, block: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) row ranges of a CSR (its `indptr`, or any row-entry prefix sum) holding at most `block` entries
    each (one row more where a single row holds more): the passes over a whole graph (partitioning, statistics,
    part distances) hold a block's temporaries, not the edges'."""
    n = len(indptr) - 1
    lo = 0
    while lo < n:
        hi = min(max(int(np.searchsorted(indptr, indptr[lo] + block, side="right")) - 1, lo + 1), n)
        yield lo, hi
        lo = hi


def row_ranges(indptr: np.ndarray, pieces: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges of a CSR, `pieces` of them (fewer where rows are few) holding about as many entries
    each: what a pass over every row hands each process (gnnc.parallel.map_processes) when it splits by rows."""
    n = len(indptr) - 1
    if pieces <= 1 or n < 2:
        return [(0, n)]
    cuts = np.searchsorted(indptr, np.linspace(0, int(indptr[-1]), pieces + 1)[1:-1], side="right") - 1
    bounds = np.unique(np.concatenate(([0], np.clip(cuts, 0, n), [n])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def index_dtype(n: int) -> np.dtype:
    """int32 where every index fits, else int64."""
    return np.dtype(np.int32) if n < 2**31 - 1 else np.dtype(np.int64)


RELEASE_PAGES = "release_pages"  # CSR._cache key of a stored CSR's page release (CSR.release_pages)


@dataclass
class CSR:
    """Edges grouped by destination.

    indptr[d]:indptr[d+1] are the in-edges of destination d; `indices` holds
    their sources and `eids` their positions in the view's edge order (so
    per-edge data stored in edge order can be permuted into CSR order).
    `n_dst` x `n_src` allows bipartite blocks (distributed halos, bins).
    """

    indptr: torch.Tensor  # int64 [n_dst + 1]
    indices: torch.Tensor  # int64 [nnz], source ids
    # int64 [nnz], edge ids in the view's order (`eids`); None: a transpose's, gathered from its CSR's when first read
    eids_given: torch.Tensor | None
    n_dst: int
    n_src: int
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    @property
    def eids(self) -> torch.Tensor:
        """int64 [nnz], each entry's edge id in the view's order. A transpose gathers its own from its CSR's on first
        read: 8 bytes per edge (0.9 GiB at ogbn-products' size) that the kernels, which keep a transpose for
        attention, never read (issue 35)."""
        if self.eids_given is None:
            of, perm = self._cache["eids_of"]
            self.eids_given = of[perm]
        return self.eids_given

    def dst_index(self) -> torch.Tensor:
        """The destination of every CSR entry (row ids expanded), on the CSR's device."""
        if "dst" not in self._cache:
            self._cache["dst"] = self._dst_entries()
        return self._cache["dst"]

    def _dst_entries(self) -> torch.Tensor:
        deg = self.indptr[1:] - self.indptr[:-1]
        # output_size: the length is known, so a GPU need not read the degrees back to size the result
        return torch.repeat_interleave(torch.arange(self.n_dst, device=self.indptr.device), deg, output_size=self.nnz)

    def in_degree(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def release_pages(self) -> None:
        """Let go of the resident pages of the store's files this CSR maps, where it maps some (a no-op for one in
        memory; `_cache[RELEASE_PAGES]`, set by gnnc.graph.store's loader). For whoever copied what it needs out of
        them: the kernels' int32 patterns are built from a stored CSR and its transpose (int64: 24 bytes per edge
        of file pages, 2.8 GiB at ogbn-products' size, resident once read), which nothing reads again (issue 35).
        A later read maps them again from the page cache."""
        release = self._cache.get(RELEASE_PAGES)
        if release is not None:
            release()

    def transpose(self) -> "CSR":
        """The same edges grouped by source (CSC of this matrix), built once."""
        if "t" not in self._cache:
            # the destinations as a temporary unless already built: kept, they are 8 bytes per edge that the
            # kernels' products never read (GraphView.dst)
            dst = self._cache["dst"] if "dst" in self._cache else self._dst_entries()
            order = torch.argsort(self.indices, stable=True)
            counts = torch.bincount(self.indices, minlength=self.n_src)
            indptr = torch.zeros(self.n_src + 1, dtype=torch.int64, device=self.indptr.device)
            indptr[1:] = torch.cumsum(counts, 0)
            t = CSR(indptr, dst[order], None, self.n_src, self.n_dst)
            t._cache["perm_from"] = order  # t's entry k is this CSR's entry order[k]
            # its edge ids, gathered when read (CSR.eids); this CSR's tensor, not this CSR: no reference cycle
            t._cache["eids_of"] = (self.eids, order)
            self._cache["t"] = t
        return self._cache["t"]

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "CSR":
        """This CSR with `fn` applied to each of its tensors (e.g. a copy to a GPU).

        The destination index and the transpose are built first (here, where the
        structure is) and mapped too, so a copy on a device never rebuilds them there.
        """
        self.transpose()
        out = CSR(fn(self.indptr), fn(self.indices), fn(self.eids), self.n_dst, self.n_src)
        out._cache["dst"] = fn(self.dst_index())
        t = self._cache["t"]
        out_t = CSR(fn(t.indptr), fn(t.indices), fn(t.eids), t.n_dst, t.n_src)
        out_t._cache["perm_from"] = fn(t._cache["perm_from"])
        out._cache["t"] = out_t
        return out

    @staticmethod
    def from_edges(src: np.ndarray | torch.Tensor, dst: np.ndarray | torch.Tensor,
                   n_dst: int, n_src: int | None = None) -> "CSR":
        src_t = torch.as_tensor(np.asarray(src), dtype=torch.int64)
        dst_t = torch.as_tensor(np.asarray(dst), dtype=torch.int64)
        order = torch.argsort(dst_t, stable=True)
        counts = torch.bincount(dst_t, minlength=n_dst)
        indptr = torch.zeros(n_dst + 1, dtype=torch.int64)
        indptr[1:] = torch.cumsum(counts, 0)
        return CSR(indptr, src_t[order], order, n_dst, n_src if n_src is not None else n_dst)


@dataclass
class Graph:
    """A directed graph with vertex data; edges in the order they were given."""

    num_nodes: int
    src: np.ndarray  # [E] integer sources
    dst: np.ndarray  # [E] integer destinations
    x: torch.Tensor  # float32 [N, F]
    y: torch.Tensor  # int64 [N] class labels (UNLABELLED: none), or float32 [N, T] multi-label 0/1 targets (NaN: unknown)
    train_mask: torch.Tensor  # bool [N]
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    name: str = "graph"
    edge_data: dict[str, torch.Tensor] = field(default_factory=dict)  # `edge.NAME`: float32 [E] or [E, d]
    _views: dict = field(default_factory=dict, repr=False, compare=False)
    # Vertex data the input did not give and the loader made up, each with a sentence saying what stands in:
    # "x" (one constant feature), "y" (label 0 everywhere: nothing to learn, so training refuses the graph),
    # "split" (a seeded random train/val/test split, which training states on stderr).
    stand_ins: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def num_edges(self) -> int:
        return int(len(self.src))

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        """Classes (labels are 0..classes-1), or the tasks of a multi-label graph: the model's output width."""
        if self.multi_label:
            return int(self.y.shape[1])
        return int(self.y.max().item()) + 1 if self.y.numel() else 0

    @property
    def num_targets(self) -> int:
        """The columns of y as float targets (mse, bce read them): T of a [N, T] y, 1 for one class per vertex."""
        return int(self.y.shape[1]) if self.y.dim() == 2 else 1

    @property
    def multi_label(self) -> bool:
        """y is a [N, T] matrix of binary targets (ogbn-proteins' 112 tasks), not one class per vertex."""
        return self.y.dim() == 2

    def edges(self, view: str = "plain") -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of the named edge view, in that view's edge order."""
        if view == "plain":
            return self.src, self.dst
        if view == "self_loops":
            if "self_loops_edges" not in self._views:
                keep = self.src != self.dst
                loop = np.arange(self.num_nodes, dtype=self.src.dtype)
                self._views["self_loops_edges"] = (
                    np.concatenate([self.src[keep], loop]),
                    np.concatenate([self.dst[keep], loop]),
                )
            return self._views["self_loops_edges"]
        raise ValueError(f"unknown edge view {view!r}; expected one of {VIEWS}")

    def csr(self, view: str = "plain") -> CSR:
        """In-edge CSR of a view, built once: the self-loops view's from the plain one where that is held (a
        store's always is), else by sorting the view's edges."""
        key = ("csr", view)
        if key not in self._views:
            plain = self._views.get(("csr", "plain"))
            if view == "self_loops" and plain is not None:
                self._views[key] = _with_self_loops(plain, self.num_nodes)
            else:
                s, d = self.edges(view)
                self._views[key] = CSR.from_edges(s, d, self.num_nodes)
        return self._views[key]

    def edge_values(self, view: str = "plain") -> dict[str, torch.Tensor]:
        """The named edge data in the view's edge order (self-loops as gnnc.graph.edge_data says)."""
        if view == "plain":
            return self.edge_data
        key = ("edge_data", view)
        if key not in self._views:
            self.edges(view)  # an unknown view is refused there
            self._views[key] = {name: _edge_data.with_self_loops(name, v, self.src, self.dst, self.num_nodes)
                                for name, v in self.edge_data.items()}
        return self._views[key]

    def gcn_norm(self, view: str = "self_loops") -> torch.Tensor:
        """deg^-1/2[src] * w * deg^-1/2[dst] per edge of the view, in edge order (PyG's gcn_norm).

        w is the edge weight (`edge_weight`; 1 without one; a self-loop the view adds
        has weight 1) and deg the weighted in-degree (a scatter over the target), so
        the coefficients match GCNConv's, with or without `edge_weight`, on directed
        graphs too. A degree that is not positive gives 0 (as PyG's inf -> 0; a
        negative one gives NaN there too).
        """
        key = ("gcn_norm", view)
        if key not in self._views:
            s, d = self.edges(view)
            w = self._edge_weight(view)
            inv = _inverse_sqrt(np.bincount(d, weights=w, minlength=self.num_nodes).astype(np.float64))
            # (times a weight of 1 where there is none: the same float64 products)
            self._views[key] = torch.as_tensor(inv[s] * inv[d] if w is None else inv[s] * w * inv[d],
                                               dtype=torch.float32)
        return self._views[key]

    def gcn_norm_in_csr_order(self, view: str = "self_loops") -> np.ndarray:
        """`gcn_norm(view)` in the order of `csr(view)`'s entries, bit for bit its values gathered by the CSR's eids,
        computed a block of rows at a time from the CSR (each entry's source and row; its weight gathered only where
        the graph has one): a plan's shards and views want it so, and the gather by edge id over every edge was 7.6 of
        19.3 s at ogbn-products' size (self-loops view), the norm in edge order 11.8 more."""
        csr = self.csr(view)
        indptr, indices = csr.indptr.numpy(), csr.indices.numpy()
        w = self._edge_weight(view)
        # the in-degree: a row's entries (integers, exact in float64) or the weights summed in edge order, as gcn_norm
        inv = _inverse_sqrt(np.diff(indptr).astype(np.float64) if w is None else
                            np.bincount(self.edges(view)[1], weights=w, minlength=self.num_nodes))
        out = np.empty(int(indptr[-1]), dtype=np.float32)
        eids = None if w is None else csr.eids.numpy()
        for lo in range(0, self.num_nodes, NORM_BLOCK_ROWS):
            hi = min(lo + NORM_BLOCK_ROWS, self.num_nodes)
            a, b = int(indptr[lo]), int(indptr[hi])
            block = inv[indices[a:b]]
            if eids is not None:
                block *= w[eids[a:b]]
            block *= np.repeat(inv[lo:hi], np.diff(indptr[lo:hi + 1]))
            out[a:b] = block
        return out

    def _edge_weight(self, view: str) -> np.ndarray | None:
        """The view's edge weights as float64 (gcn_norm's w), None without an `edge_weight`."""
        weight = self.edge_values(view).get(_edge_data.WEIGHT)
        return None if weight is None else weight.numpy().astype(np.float64)


def _with_self_loops(plain: CSR, n: int) -> CSR:
    """The self-loops view's CSR from the plain view's, in a few passes over its entries, no sort: each row's entries
    less its self-loops, in their order, then the row's own loop; an edge keeps its place among the edges that are
    not loops (its id less the loops before it), the loop of v is edge E' + v (`Graph.edges`' order). Equal to
    `CSR.from_edges` of the view's edges, array for array, because the plain CSR is a stable sort of the edges by
    destination (Graph.csr's and a store's, gnnc.graph.store._write_csrs): at ogbn-products' size the sort and the
    edge list it sorts were 17.7 of a GCN compile's 20.5 s of statistics."""
    indptr, indices, eids = plain.indptr.numpy(), plain.indices.numpy(), plain.eids.numpy()
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), counts)
    loop = indices == rows
    loops = np.bincount(rows[loop], minlength=n)
    del rows
    out_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts - loops + 1, out=out_indptr[1:])
    last = out_indptr[1:] - 1  # each row's loop, after its other entries
    kept = np.ones(int(out_indptr[-1]), dtype=bool)
    kept[last] = False
    out_indices = np.empty(len(kept), dtype=np.int64)
    out_indices[last] = np.arange(n)
    out_eids = np.empty(len(kept), dtype=np.int64)
    if loops.any():
        out_indices[kept] = indices[~loop]
        # an edge's id among the edges that are not loops: its id less the loops before it
        is_loop = np.zeros(len(eids), dtype=bool)
        is_loop[eids[loop]] = True
        before = np.cumsum(is_loop, dtype=np.int32 if len(eids) < 2**31 else np.int64)
        others = eids[~loop]
        out_eids[kept] = others - before[others]
    else:  # no loop to drop (ogbn-products has none): every edge keeps its id
        out_indices[kept] = indices
        out_eids[kept] = eids
    out_eids[last] = len(eids) - int(loops.sum()) + np.arange(n)
    return CSR(torch.from_numpy(out_indptr), torch.from_numpy(out_indices), torch.from_numpy(out_eids), n, n)


NORM_BLOCK_ROWS = 1 << 16  # gcn_norm_in_csr_order's rows at a time: its float64 temporaries a few of a block's entries


def _inverse_sqrt(deg: np.ndarray) -> np.ndarray:
    """deg^-1/2, 0 where the degree is 0 (PyG's inf -> 0; a negative degree gives NaN, as there)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = deg ** -0.5
    inv[np.isinf(inv)] = 0.0
    return inv


def check_class_labels(y: torch.Tensor, name: str, loss: str | None = None) -> None:
    """Refuse, before a run, labels the model's loss cannot read (`loss`: its op; None: not known yet, nothing
    to check). cross_entropy reads one class per vertex, so a multi-label (or regression) matrix is refused
    rather than read as something else; mse reads float targets and takes one class per vertex as a number (as
    `F.mse_loss(out, y.float())` would); bce reads binary targets: 0, 1 or NaN (unknown), a matrix or one 0/1
    class per vertex."""
    if loss is None:
        return
    if loss == "cross_entropy" and y.dim() != 1:
        raise GraphInputError(f"graph '{name}' holds {int(y.shape[1])} float targets per vertex (a multi-label "
                              f"matrix, as ogbn-proteins' 112 binary tasks), but the model's loss is cross_entropy, "
                              f"which reads one class per vertex: use `loss = bce(logits, y, mask = train)` for "
                              f"binary targets or `loss = mse(h, y, mask = train)` for regression")
    if loss == "bce":
        known = y[~torch.isnan(y)] if y.is_floating_point() else y[y != UNLABELLED]
        bad = known[(known != 0) & (known != 1)]
        if bad.numel():
            raise GraphInputError(f"graph '{name}': bce reads binary targets (0, 1 or NaN for unknown), but its y "
                                  f"holds {float(bad[0]):g}; for classes use cross_entropy, for real values mse")


@dataclass
class GraphView:
    """The tensors one edge view needs, built once: CSR, index vectors, edge data."""

    csr: CSR
    src: torch.Tensor  # [nnz] source of each CSR entry
    # [nnz] destination of each CSR entry (`dst`); None: the CSR's `dst_index()`, built when first read
    dst_given: torch.Tensor | None
    edge_ids: torch.Tensor  # [nnz] global edge id (for dropout on edges)
    edge_data: dict[str, torch.Tensor]
    deg: torch.Tensor  # in-degree, float [n_dst]

    @property
    def dst(self) -> torch.Tensor:
        """[nnz] destination of each CSR entry. A view built from its CSR makes it on first use: 8 bytes per edge
        (0.9 GiB at ogbn-products' size) that the kernels' products never read (their patterns are the CSR's own;
        the reference ops, edge dropout, SDDMM and softmax do), issue 35."""
        if self.dst_given is not None or self.csr is None:  # no CSR: a view held by source parts (plan.rows)
            return self.dst_given
        return self.csr.dst_index()

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "GraphView":
        """This view with `fn` applied to every tensor; its index vectors stay those of its (mapped) CSR."""
        csr = None if self.csr is None else self.csr.map_tensors(fn)
        shared = csr is not None and self.src is self.csr.indices and (
            self.dst_given is None or self.dst_given is self.csr._cache.get("dst"))
        src, dst = (csr.indices, None) if shared else (
            None if self.src is None else fn(self.src), None if self.dst_given is None else fn(self.dst_given))
        return GraphView(csr, src, dst, fn(self.edge_ids), {k: fn(v) for k, v in self.edge_data.items()},
                         fn(self.deg))

    @staticmethod
    def build(graph: Graph, view: str) -> "GraphView":
        csr = graph.csr(view)
        return GraphView(csr, csr.indices, None, csr.eids, view_edge_data(graph, view, csr.eids),
                         csr.in_degree().to(torch.float32))


def view_edge_data(graph: Graph, view: str, eids: torch.Tensor) -> dict[str, torch.Tensor]:
    """gcn_norm and the named edge data of the view's edges `eids` (ids in the view's edge order).

    Gathered by numpy: torch's indexing of a CPU tensor by a long index took twice as long, and a plan's shards
    gather every rank's edges for each layer structure (issue 34: most of the graph per rank and layer)."""
    at = eids.numpy()
    out = {"gcn_norm": torch.from_numpy(graph.gcn_norm(view).numpy()[at])}
    out.update((name, torch.from_numpy(values.numpy()[at])) for name, values in graph.edge_values(view).items())
    return out


SPARSE_INPUT_DENSITY = 0.05  # below this, input features are kept sparse (dropout at nonzeros, sparse matmul)


def input_density(x: torch.Tensor, nonzeros: int | None = None) -> float:
    """The nonzero fraction of input features `sparse_if_sparse` keeps sparse, 1.0 for features it keeps dense:
    what the cost model prices the ops reading them with (a sparse product does work per nonzero).

    `nonzeros`: x's nonzero values where known without reading x (a store's manifest: gnnc.graph.store.x_nonzeros;
    counted over x otherwise): the same fraction either way."""
    if x.is_sparse:
        return x._nnz() / max(x.numel(), 1)
    if x.dim() != 2 or x.numel() == 0:
        return 1.0
    density = (int(torch.count_nonzero(x)) if nonzeros is None else nonzeros) / x.numel()
    return density if density <= SPARSE_INPUT_DENSITY else 1.0


def sparse_if_sparse(x: torch.Tensor) -> torch.Tensor:
    """Input features as a coalesced sparse COO tensor when few of them are nonzero (bag-of-words graphs)."""
    if x.dim() != 2 or x.numel() == 0:
        return x
    nnz = int(torch.count_nonzero(x))
    if nnz > SPARSE_INPUT_DENSITY * x.numel():
        return x
    return x.to_sparse_coo().coalesce()
