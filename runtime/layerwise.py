"""Layer-wise evaluation: a graph layer's output for every row it computes, in chunks of destination rows.

Why this module exists: the evaluation after each step runs the whole forward pass over every vertex. Without
autograd it keeps no activations, yet each graph layer still holds its edge values for every edge at once (GAT's
scores, their softmax and its weights: several [edges, heads] tensors, and a reference gather's [edges, width]
messages) beside its [rows, width] products. Run layer by layer in chunks of `rows` destination rows, a layer holds
its input and the values its neighbour reads take from every source row (the transform, GAT's source scores) whole,
its output whole as it is filled, and one chunk's edges and intermediates: about two [rows, width] tensors plus a
chunk, whatever the graph's degree.

How a layer is split (`split_layer`): an equation runs on every row ("whole") when its result is read at a source
position of a neighbour read (`OpDef.reads_neighbours`: the rows of every source are needed), when it is an
exchange (a rank's halo, fetch or broadcast moves whole rows, as the training forward does), when it is hoisted
(its cached value is the whole graph's) or when it computes a value of another domain (a scalar constant);
the values such an equation reads are whole too. Every other equation runs once per chunk on the chunk's rows: its
edges are the chunk's in-edges, a contiguous slice of the CSR (`chunk_view`: destinations renumbered from 0,
sources as they are), its vertex operands the chunk's rows of the whole values. A layer whose whole values would
need a value computed per chunk (a second aggregation reading the first one's result at its sources) runs as it
does without chunks, as does one without a destination row. A rank that holds a layer's structure by the source
parts of its split exchange only (gnnc.runtime.distributed's `hold_parts_views`) cuts its chunks from the parts.

Rows are prefixes of one order (gnnc.plan.rows): a layer's destination row i is row i of each of its vertex
values, in one process and on a rank of every strategy, so a chunk's rows of a whole value are its slice [lo, hi).
The equations compute what they compute in the whole layer, row by row, through the interpreter's own `eqn`
(exchanges included: a rank's exchange posts the same rows and bytes); a fused chain (gnnc.runtime.fusion) runs
as its equations, within float rounding of the fused kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from gnnc.graph import CSR, GraphView
from gnnc.ir import Layer
from gnnc.ir.ops import op_def, reads_neighbours, reads_structure
from gnnc.plan.rows import SourceParts
from gnnc.plan.schedule_attrs import split_exchange
from gnnc.runtime.parts import PartStream

# rows per chunk when layer-wise evaluation is chosen without a size (gnnc.memory_check decides when): a GAT layer
# of 8 heads over 65,536 rows of degree 13 holds some 30 MB of edge values per chunk
DEFAULT_CHUNK_ROWS = 65_536
_CHUNKED = ("vertex", "edge")


def split_layer(layer: Layer) -> tuple[list[int], list[int]] | None:
    """(the equations run on every row, those run per chunk), indices into `layer.eqns` in order; None when the
    layer cannot be split (module docstring)."""
    eqns = layer.eqns
    producer = {e.outs[0].name: k for k, e in enumerate(eqns)}
    whole_values: set[str] = set()
    whole: set[int] = set()
    for k, e in enumerate(eqns):
        kind = op_def(e.op)
        if kind.comm or e.attr("hoisted") or e.outs[0].type is None or e.outs[0].type.domain not in _CHUNKED:
            whole.add(k)
            whole_values.update(v.name for v in e.ins if v.type is not None and v.type.domain in _CHUNKED)
        whole_values.update(e.ins[i].name for i in reads_neighbours(e))
    # what a whole equation reads is whole too, back to the layer's inputs
    pending = list(whole_values)
    while pending:
        name = pending.pop()
        k = producer.get(name)
        if k is None:
            continue  # a layer input, or a value of a layer before: whole already
        e = eqns[k]
        if reads_structure(e) and not e.attr("hoisted"):
            return None  # a per-edge or aggregated value read whole: a second wave this module does not run
        whole.add(k)
        for v in e.ins:
            if v.name not in whole_values and v.type is not None and v.type.domain in _CHUNKED:
                whole_values.add(v.name)
                pending.append(v.name)
    order = sorted(whole)
    return order, [k for k in range(len(eqns)) if k not in whole]


def chunk_view(view: GraphView, lo: int, hi: int,
               parts: SourceParts | None = None) -> tuple[GraphView, slice | torch.Tensor]:
    """The in-edges of destinations [lo, hi) of `view` (destinations renumbered from 0, sources and edge ids as they
    are), and where they sit among the view's edges as its edge values hold them. From the CSR: a contiguous slice.
    From `parts`, when a rank holds the structure by source part only (the CSR dropped,
    gnnc.plan.rows.LayerGraph.hold_parts): each part's in-edges of the chunk, sources numbered in the layer's rows,
    merged by destination (a destination's edges part after part)."""
    if view.csr is not None:
        csr = view.csr
        a, b = int(csr.indptr[lo]), int(csr.indptr[hi])
        sub = CSR(csr.indptr[lo:hi + 1] - csr.indptr[lo], csr.indices[a:b], csr.eids[a:b], hi - lo, csr.n_src)
        return GraphView(sub, sub.indices, sub.dst_index(), view.edge_ids[a:b],
                         {k: v[a:b] for k, v in view.edge_data.items()}, view.deg[lo:hi]), slice(a, b)
    assert parts is not None, "a view without its CSR is held by source parts"
    dst, src, eids, at = [], [], [], []
    data: dict[str, list[torch.Tensor]] = {k: [] for k in view.edge_data}
    for p, part in enumerate(parts.views):
        ends = part.csr.indptr[lo:hi + 1]
        a, b = int(ends[0]), int(ends[-1])
        # the chunk's destinations from its rows' degrees: the part's dst_index() would be built for every edge and
        # kept with the part for the run (8 bytes per edge, 0.47 GiB of each of 2 GCN ranks at ogbn-products' size)
        dst.append(torch.repeat_interleave(torch.arange(hi - lo, device=ends.device), ends.diff(), output_size=b - a))
        src.append(part.csr.indices[a:b] + parts.bounds[p])
        eids.append(part.edge_ids[a:b])
        for k in data:
            data[k].append(part.edge_data[k][a:b])
        pos = parts.pos[p]
        at.append(torch.arange(pos.start + a, pos.start + b, device=dst[-1].device) if isinstance(pos, slice)
                  else pos[a:b])
    local = torch.cat(dst)
    order = torch.argsort(local, stable=True)
    indptr = torch.zeros(hi - lo + 1, dtype=torch.int64, device=local.device)
    indptr[1:] = torch.cumsum(torch.bincount(local, minlength=hi - lo), 0)
    edge_ids = torch.cat(eids)[order]
    sub = CSR(indptr, torch.cat(src)[order], edge_ids, hi - lo, parts.bounds[-1])
    return GraphView(sub, sub.indices, local[order], edge_ids, {k: torch.cat(v)[order] for k, v in data.items()},
                     view.deg[lo:hi]), torch.cat(at)[order]


def run_layer_chunked(interp: Any, layer: Layer, env: dict[str, Any], params: dict[str, torch.Tensor], ctx: Any,
                      rows: int) -> bool:
    """Run graph layer `layer` of `interp` (an Interpreter) in chunks of `rows` destination rows into `env`, as
    `interp.run_layer` would; False, having run nothing, when it cannot be split (module docstring)."""
    view = ctx.views.get(layer.edges)
    split = split_layer(layer)
    if split is None or view is None:
        return False
    parts = None
    if view.csr is None:  # a rank's structure held by the source parts of its split exchange
        exchange = split_exchange(layer)
        if exchange is None or ctx.comm is None:
            return False
        parts = ctx.comm.part_run(layer, exchange).parts
    n_dst = (view.csr if parts is None else parts.views[0].csr).n_dst
    if n_dst == 0:
        return False
    whole, chunked = split
    eqns = layer.eqns
    read_per_chunk = {v.name for k in chunked for v in eqns[k].ins}
    for k in whole:
        e = eqns[k]
        ins = [_whole(env[v.name]) if v.name in env else params[v.name] for v in e.ins]
        env[e.outs[0].name] = interp.eqn(e, ins, view, ctx)
        for name in interp._dying.get((layer.name, k), ()):
            if name not in read_per_chunk:
                env.pop(name, None)
    made = {eqns[k].outs[0].name for k in chunked}
    dying_here = {n for k in range(len(eqns)) for n in interp._dying.get((layer.name, k), ())}
    # the layer's results: what later layers (or the caller) read of the values computed per chunk
    results = [n for n in dict.fromkeys(eqns[k].outs[0].name for k in chunked) if n not in dying_here]
    out: dict[str, torch.Tensor] = {}
    for lo in range(0, n_dst, rows):
        hi = min(lo + rows, n_dst)
        sub, edges = chunk_view(view, lo, hi, parts)
        local: dict[str, Any] = {}
        cctx = dataclasses.replace(ctx, vertex_ids=ctx.vertex_ids[lo:hi])
        for k in chunked:
            e = eqns[k]
            sources = set(reads_neighbours(e))
            ins = [local[v.name] if v.name in made else
                   _rows_of(env[v.name], v, i in sources, lo, hi, edges) if v.name in env else params[v.name]
                   for i, v in enumerate(e.ins)]
            local[e.outs[0].name] = interp.eqn(e, ins, sub, cctx)
            for name in interp._dying.get((layer.name, k), ()):
                local.pop(name, None)
        for name in results:
            value = local[name]
            if name not in out:
                out[name] = value.new_empty((n_dst, *value.shape[1:]))
            out[name][lo:hi] = value
    env.update(out)
    interp.drop_dead(env, layer)
    return True


def _rows_of(x: Any, v: Any, source: bool, lo: int, hi: int, edges: slice | torch.Tensor) -> Any:
    """A whole value as a chunk's equation reads it: every row at a source position, else the chunk's rows (or, an
    edge value, its edges)."""
    x = _whole(x)
    if source or not isinstance(x, torch.Tensor) or v.type is None:
        return x
    if v.type.domain == "vertex":
        return (x.to_dense() if x.is_sparse else x)[lo:hi]
    if v.type.domain == "edge":
        return x[edges]
    return x


def _whole(x: Any) -> Any:
    """A split exchange's rows as one tensor, anything else as it is."""
    return x.whole() if isinstance(x, PartStream) else x
