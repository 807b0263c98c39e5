"""G3's bins: a worker's output rows of a layer in priority order, cut into bins, each with its in-edges.

Why this module exists: the schedule pass decides how many bins a layer
runs in (`bins=k`) and by which rule they are ordered (`bin_order`,
gnnc.plan.schedule_attrs); the order itself follows from the worker's own
structure, so it is derived here, deterministically, from the LayerGraph a
worker loads. The runtime executes the bins in this order; nothing about
them is decided while the data moves.

G3's priority list (section 5.3, step 1): a breadth-first traversal of the
worker's part, started from the vertices with a remote neighbour, and those
vertices moved to the front. Here a row is *boundary* when one of its
in-neighbours is not one of the layer's output rows (a halo row, or a
replica another worker owns: its inputs arrive over the network) or when a
peer receives its row (it is in the halo plan's send lists: its output
leaves through it). The traversal runs over the undirected edges among
output rows, from every boundary row (and from one row of each component
without one), so a bin holds neighbours together. The list puts the rows
whose inputs arrive first, then the rows only sent, then the others, each
group in traversal order: that concentrates the rows that wait for the halo
in the first bins and leaves the later bins *held* (every source they read
is held), so they can run while the halo is in flight (the part of G3's eager
computation that needs no remote row). With G3's inter-layer pipeline
(`PipeChain`, `halo[pipelined=true]` on the next layer) each bin's rows leave as
the bin ends and the next layer runs each of its bins once the peers' bins its
sources come in have arrived; the list still puts the rows whose inputs arrive
first, then the rows only sent: G3 puts every row with a remote neighbour first
(section 5.3, step 1) to send early, while gnnc's first bins are those that must
wait for the layer's own halo (a deviation kept from the bins without pipeline).

Bins are cut from that list by the memory they take, as G3 sizes them (to
half a device's memory), not by row count: a bin holds its rows' values and
its in-edges' values, so on a power-law graph a bin of hub rows with equal
row counts held up to 97x the mean bin's edges (a 100K-vertex R-MAT, 4096
bins), and the activation estimate, which prices one bin as 1/k of the
layer, was exceeded. `bin_widths` reads the per-bin widths off the IR (the
runtime and gnnc.passes.cost.activations use the same), and `bin_bounds`
cuts the list into bins of equal rows * row width + in-edges * edge width,
each at most 1/k of the layer plus its heaviest row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gnnc.graph import CSR, GraphView
from gnnc.ir import Eqn, Layer, Value
from gnnc.ir.dims import eval_dim
from gnnc.errors import PlanError
from gnnc.ir.ops import op_def, reads_neighbours
from gnnc.plan.rows import LayerGraph
from gnnc.plan.schedule_attrs import bin_eqn, layer_schedule

MASK_FRACTION = 0.25  # a dropout keeps a bool mask (gnnc.runtime.rng): a quarter of a float32 value


def value_width(value: Value, cfg: dict[str, Any]) -> float:
    """Elements per row (or per edge) of an IR value under the program's configuration."""
    w = 1.0
    for d in value.type.shape:
        w *= eval_dim(d, cfg)
    return w


# how a bin takes a value of its layer: the rows its edges read, its own rows, its edges' entries, whole
SOURCES, ROWS, EDGES, WHOLE = "sources", "rows", "edges", "whole"


def taken_as(e: Eqn, k: int) -> str:
    """How a bin takes input k of its per-bin equation `e` (one of SOURCES, ROWS, EDGES, WHOLE)."""
    v = e.ins[k]
    if k in reads_neighbours(e):
        return SOURCES
    if v.type is not None and v.type.domain == "edge":
        return EDGES
    if v.type is not None and v.type.domain == "vertex":
        return ROWS
    return WHOLE


def bin_inputs(layer: Layer) -> list[tuple[Value, str]]:
    """(value, how a bin takes it) for every value a binned layer's per-bin equations read from outside
    them, in a fixed order (the runtime passes them to its bins in this order)."""
    made = {o.name for e in layer.eqns if bin_eqn(e) for o in e.outs}
    out: list[tuple[Value, str]] = []
    seen: set[tuple[str, str]] = set()
    for e in layer.eqns:
        if not bin_eqn(e):
            continue
        for k, v in enumerate(e.ins):
            how = taken_as(e, k)
            if v.name not in made and (v.name, how) not in seen:
                seen.add((v.name, how))
                out.append((v, how))
    return out


@dataclass(frozen=True)
class BinWidths:
    """Elements one bin of a layer holds per output row, per in-edge and per source row it gathers.

    The values the layer computes per bin (a dropout's mask counted), by domain, and those the bins
    take from outside them (`bin_inputs`): a vertex value read through the edges is gathered at the
    bin's source rows, one read at its rows per row, an edge value per edge.
    """

    row: float
    edge: float
    source: float


def bin_widths(layer: Layer, cfg: dict[str, Any]) -> BinWidths:
    """The per-bin widths of a graph layer's equations marked `bin` (see BinWidths)."""
    lanes = {SOURCES: 0.0, ROWS: 0.0, EDGES: 0.0}
    for v, how in bin_inputs(layer):
        if how != WHOLE:
            lanes[how] += value_width(v, cfg)
    for e in layer.eqns:
        out = e.outs[0]
        if bin_eqn(e) and out.type is not None and out.type.domain in ("vertex", "edge"):
            w = value_width(out, cfg) * (1 + MASK_FRACTION if e.op == "dropout" else 1)
            lanes[EDGES if out.type.domain == "edge" else ROWS] += w
    return BinWidths(lanes[ROWS], lanes[EDGES], lanes[SOURCES])


def bin_bounds(weights: np.ndarray, bins: int) -> list[int]:
    """Cut rows of `weights` (in bin order) into `bins` contiguous bins of near-equal weight.

    Each bin takes rows until it reaches its share of what is left (the remaining weight over the
    remaining bins), so the shares never grow: a bin weighs at most total/bins plus its last row.
    Every bin gets a row while rows remain; bins after the last row are empty.
    """
    n = len(weights)
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    total = float(cum[-1]) if n else 0.0
    bounds = [0]
    for b in range(bins - 1):
        start = bounds[-1]
        if start >= n:
            bounds.append(n)
            continue
        done = float(cum[start - 1]) if start else 0.0
        share = (total - done) / (bins - b)
        end = int(np.searchsorted(cum, done + share, side="left")) + 1
        bounds.append(min(max(end, start + 1), n))
    bounds.append(n)
    return bounds


def boundary_rows(lg: LayerGraph, view: str) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the layer's output rows with an in-neighbour that is not an output row (their inputs
    arrive over the network), and of those a peer receives (their outputs leave through it)."""
    v = lg.views[view]
    receiving = np.zeros(lg.n_out, dtype=bool)
    src, dst = v.src.numpy(), v.dst.numpy()
    receiving[dst[src >= lg.n_out]] = True
    sent = np.zeros(lg.n_out, dtype=bool)
    if lg.halo is not None:
        for idx in lg.halo.send_idx:
            rows = idx.numpy()
            sent[rows[rows < lg.n_out]] = True
    return receiving, sent


def priority_order(lg: LayerGraph, view: str) -> np.ndarray:
    """G3's priority list of the layer's output rows (positions 0..n_out-1), boundary rows first."""
    # deferred: a heavy import (~0.3 CPU-s) that only G3's bins need, not every rank that imports this module
    import scipy.sparse as sp
    from scipy.sparse.csgraph import breadth_first_order, connected_components

    n = lg.n_out
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    v = lg.views[view]
    src, dst = v.src.numpy(), v.dst.numpy()
    local = (src < n) & (src != dst)
    adj = sp.csr_matrix((np.ones(int(local.sum()), dtype=np.int8), (dst[local], src[local])), shape=(n, n))
    receiving, sent = boundary_rows(lg, view)
    boundary = receiving | sent
    # one start per component without a boundary row (its first row), so the traversal reaches every row
    _, label = connected_components(adj, directed=False)
    seeded = np.zeros(int(label.max()) + 1, dtype=bool)
    seeded[label[boundary]] = True
    first = np.full(len(seeded), n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n))
    starts = np.concatenate([np.nonzero(boundary)[0], first[~seeded]])
    # a virtual root (row n) joined to every start: one traversal visits the starts first, then outwards
    root = sp.csr_matrix((np.ones(len(starts), dtype=np.int8), (np.full(len(starts), n), starts)), shape=(n + 1, n + 1))
    grown = sp.bmat([[adj, None], [None, sp.csr_matrix((1, 1), dtype=np.int8)]], format="csr") + root
    order = breadth_first_order(grown, n, directed=False, return_predecessors=False)[1:].astype(np.int64)
    rank = np.where(receiving[order], 0, np.where(sent[order], 1, 2))
    return order[np.argsort(rank, kind="stable")]


@dataclass
class Bins:
    """A layer's output rows in bins, each with the in-edges of its rows.

    rows[b]: positions of bin b's output rows (in priority order).
    views[b]: bin b's in-edges, destinations numbered 0..len(rows[b])-1 within the bin and sources
        0..len(sources[b])-1 (G3's bin subgraph: the bin's rows and the neighbours they read).
    sources[b]: the layer's source rows bin b reads, ascending (the rows a bin gathers).
    pos[b]: the positions of bin b's edges in the order the layer view's per-edge data is held in.
    held[b]: every source of bin b is a held row: it can run before the layer's halo has arrived.
    """

    rows: list[torch.Tensor]
    views: list[GraphView]
    sources: list[torch.Tensor]
    pos: list[torch.Tensor]
    held: list[bool]

    def __len__(self) -> int:
        return len(self.rows)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Bins":
        """These bins with every tensor mapped by `fn` (copied to the run's device with the layer)."""
        return Bins([fn(r) for r in self.rows], [v.map_tensors(fn) for v in self.views],
                    [fn(s) for s in self.sources], [fn(p) for p in self.pos], list(self.held))


def _bin_view(v: GraphView, rows: torch.Tensor, n_in: int) -> tuple[GraphView, torch.Tensor, torch.Tensor, bool]:
    """Bin `rows`'s in-edges with their sources renumbered compactly: (view, sources, edge positions, held)."""
    indptr = v.csr.indptr
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    total = int(counts.sum())
    offsets = torch.cumsum(counts, 0) - counts
    pos = torch.repeat_interleave(starts - offsets, counts) + torch.arange(total)
    sources, cols = torch.unique(v.src[pos], sorted=True, return_inverse=True)
    held = bool(total == 0 or int(sources[-1]) < n_in)
    bptr = torch.zeros(len(rows) + 1, dtype=torch.int64)
    bptr[1:] = torch.cumsum(counts, 0)
    edge_ids = v.edge_ids[pos]
    csr = CSR(bptr, cols, edge_ids, len(rows), len(sources))
    view = GraphView(csr, csr.indices, csr.dst_index(), edge_ids, {k: t[pos] for k, t in v.edge_data.items()},
                     v.deg[rows])
    return view, sources, pos, held


def layer_bins(lg: LayerGraph, view: str, bins: int, order: str = "boundary_bfs",
               widths: BinWidths | None = None) -> Bins:
    """The layer's output rows cut into `bins` bins in `order` (built once): of equal rows * widths.row +
    in-edges * widths.edge (`bin_bounds`), of equal row counts without widths."""
    key = ("bins", view, bins, order, widths)
    if key not in lg._cache:
        if order != "boundary_bfs":
            raise ValueError(f"unknown bin order {order!r}")
        prio = torch.from_numpy(priority_order(lg, view))
        weights = np.ones(len(prio))
        if widths is not None:
            degree = lg.views[view].csr.in_degree()[prio].numpy().astype(np.float64)
            weights = widths.row + widths.edge * degree
        bounds = bin_bounds(weights, bins)
        out = Bins([], [], [], [], [])
        for b in range(bins):
            rows = prio[bounds[b]:bounds[b + 1]]
            bv, sources, pos, held = _bin_view(lg.views[view], rows, lg.n_in)
            out.rows.append(rows)
            out.views.append(bv)
            out.sources.append(sources)
            out.pos.append(pos)
            out.held.append(held)
        lg._cache[key] = out
    return lg._cache[key]


def bins_of(lg: LayerGraph, layer: Layer, cfg: dict[str, Any]) -> Bins:
    """The bins a binned graph layer runs in on this worker, as its annotations and widths say."""
    sched = layer_schedule(layer)
    return layer_bins(lg, layer.edges, sched.bins, sched.bin_order, bin_widths(layer, cfg))


# --- G3's inter-layer pipeline (section 5.2) -------------------------------------------------------------------

PIPELINED = "pipelined"  # on a halo: its rows are posted bin by bin by the previous graph layer (`PipeChain`)

# ops whose every output row is computed from the same row of their vertex inputs alone (parameters and scalars
# aside): a bin's rows of their result need that bin's rows only, so they can run per bin of the layer before
# (besides the elementwise ops: activations, dropout)
ROW_LOCAL = frozenset({"linear", "bias", "dot", "concat", "mean_heads", "add", "sub", "mul", "div", "pow",
                       "maximum", "minimum", "const", "layer_norm", "l2_normalize"})


def pipelined(e: Eqn) -> bool:
    """Whether halo `e` is fed bin by bin by the previous graph layer (G3's inter-layer pipeline)."""
    return bool(e.attr(PIPELINED, False))


@dataclass(frozen=True)
class PipeChain:
    """G3's inter-layer pipeline from one binned graph layer to the next (section 5.2).

    The sender's bins, as each ends, run the equations `eqns` (the dense layers between and the receiver's
    equations before its halos: an activation, a dropout, the next layer's dense map, whose output is what
    gnnc exchanges) on that bin's rows and post the rows of the receiver's halos `halos` that each peer
    needs; the receiver runs each of its bins once every message its sources arrive in is in.
    """

    sender: str
    receiver: str
    eqns: tuple[tuple[str, int], ...]  # (layer, equation index) run per bin of the sender, in program order
    halos: tuple[int, ...]  # the receiver's halo equations (indices), all fed by the chain


def pipeline_chain(program: Any, receiver: Layer) -> PipeChain | str:
    """The pipeline that would feed `receiver`'s halos from the previous graph layer's bins, or why none can.

    Needs: both layers binned, on DepComm (the receiver's held rows a prefix of the sender's output rows);
    every halo of the receiver split (overlapped) and read only through edges by its per-bin equations; the
    halos' inputs computed from the sender's outputs, parameters and constants by ROW_LOCAL equations only.
    """
    layers = list(program.layers)
    at = next(k for k, lay in enumerate(layers) if lay.name == receiver.name)
    sender = next((lay for lay in reversed(layers[:at]) if lay.kind == "graph"), None)
    if sender is None:
        return "no graph layer before it"
    if not (layer_schedule(sender).binned and layer_schedule(receiver).binned):
        return "it or the graph layer before it does not run in bins"
    if sender.attr("strategy") != "depcomm" or receiver.attr("strategy") != "depcomm":
        return "both layers must be DepComm (the receiver's held rows the sender's output rows)"
    halos = [k for k, e in enumerate(receiver.eqns) if e.op == "halo"]
    if not halos:
        return "it has no halo"
    halo_outs = {receiver.eqns[k].outs[0].name for k in halos}
    for k in halos:
        if not receiver.eqns[k].attr("overlap", False):
            return f"its halo %{receiver.eqns[k].outs[0].name} is not overlapped"
    for e in receiver.eqns:
        for j, v in enumerate(e.ins):
            if v.name in halo_outs and not (bin_eqn(e) and taken_as(e, j) == SOURCES):
                return f"%{v.name} is read other than through edges by a per-bin equation ({e.op})"
    span = [(lay, k, e) for lay in layers[layers.index(sender) + 1:at] for k, e in enumerate(lay.eqns)]
    span += [(receiver, k, e) for k, e in enumerate(receiver.eqns) if k < max(halos) and k not in halos]
    made = {e.outs[0].name: (lay, k, e) for lay, k, e in span}
    sent = {v.name for v in sender.outputs}
    params = {p.value.name for lay in layers for p in lay.params}
    need = [receiver.eqns[k].ins[0].name for k in halos]
    chain: set[tuple[str, int]] = set()
    while need:
        name = need.pop()
        if name in sent or name in params:
            continue
        if name not in made:
            return f"%{name} is not computed from the previous graph layer's rows"
        lay, k, e = made[name]
        if (lay.name, k) in chain:
            continue
        domain = e.outs[0].type.domain if e.outs[0].type is not None else None
        if not (op_def(e.op).elementwise or e.op in ROW_LOCAL) or e.attr("hoisted") or len(e.outs) != 1 \
                or domain not in ("vertex", "scalar"):
            return f"%{name} ({e.op}) is not computed row by row"
        chain.add((lay.name, k))
        need.extend(v.name for v in e.ins)
    order = [(lay.name, k) for lay, k, _ in span if (lay.name, k) in chain]
    return PipeChain(sender.name, receiver.name, tuple(order), tuple(halos))


def pipelines(program: Any) -> dict[str, PipeChain]:
    """Sender layer name -> the pipeline its bins feed, for every receiver whose halos are marked `pipelined`
    (PlanError where a marked one cannot be: gnnc.plan.schedule_attrs.check_schedule calls this)."""
    out: dict[str, PipeChain] = {}
    for layer in program.graph_layers():
        marked = [e for e in layer.eqns if e.op == "halo" and pipelined(e)]
        if not marked:
            continue
        chain = pipeline_chain(program, layer)
        if isinstance(chain, str):
            raise PlanError(f"layer {layer.name}: its halos cannot be pipelined: {chain}")
        if len(marked) != len(chain.halos):
            raise PlanError(f"layer {layer.name}: every halo of a pipelined layer must be pipelined")
        out[chain.sender] = chain
    return out
