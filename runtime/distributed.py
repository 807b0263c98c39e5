"""Training on several workers: one process per rank, each running the plan on its rows.

Every rank interprets the same IR (with the communication `insert-comm`
made explicit) over its LocalGraph; the communication ops are the autograd
Functions of gnnc.runtime.comm, so `loss.backward()` runs the distributed
backward pass. The loss of each rank is the sum over its owned training
vertices divided by the global training count, so the ranks' losses add up to
the single-process loss; parameter gradients are summed over ranks
(GradAllReduce) and every rank takes the same optimizer step. Under P3's
push-pull the weights of the first layer's partial products are the
exception (P3 section 3.2.2): each rank holds only the rows of its feature
slice (gnnc.plan.slices.split_weights), computes only their gradient and
updates them alone, so they are never all-reduced; they are assembled whole
only where the whole model is wanted (the trained weights, one_step's
gradients).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gnnc.graph.sampling import reads_edge_ids
from gnnc.ir import Eqn, Program
from gnnc.ir.ops import reads_structure
from gnnc.ir.text import parse_ir
from gnnc.plan.bins import bins_of, pipelines
from gnnc.plan.comm_ops import comm_op
from gnnc.plan.rows import LayerGraph, LocalGraph
from gnnc.plan.schedule_attrs import (check_schedule, exchange_schedule, layer_schedule, program_schedule,
                                      split_eqn, split_exchange)
from gnnc.plan.shards import RankData, load_rank
from gnnc.plan.slices import split_weights
from gnnc.runtime import block_cache, comm, fusion
from gnnc.runtime import device as devices
from gnnc.runtime.bins import run_binned
from gnnc.runtime.executor import (ExecContext, PrefixRowsInterpreter, check_dims_fit, chunked_evaluation,
                                   init_state)
from gnnc.runtime.implementations import exchange_implementation, implements_exchange
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.layerwise import run_layer_chunked
from gnnc.runtime.parts import PartRun, Parts, PartStream, run_split
from gnnc.runtime.train import RunResult, TrainConfig, Worker, fit


@dataclass(frozen=True)
class DistJob:
    """Everything a rank needs, decided before any process starts (picklable, small)."""

    ir: str  # the plan's IR text, strategies annotated and communication inserted
    shard_dir: str  # the plan's per-rank shards (gnnc.plan.shards); a rank reads only its own
    train: TrainConfig
    metrics_path: str | None = None
    want_logits: bool = False

    @functools.cached_property
    def program(self) -> Program:
        """The IR, parsed once in the rank that reads it (the job crosses to the rank as text)."""
        return parse_ir(self.ir)


def let_go_of_graph(graph: Any) -> None:
    """The launcher's graph once every rank's shard is written: its derived structure (CSRs, self-loop edges,
    gcn_norm, cached in `Graph._views`, rebuilt if read again) dropped and a store's pages released. The ranks
    read their shards; kept, these and the allocator's blocks they freed were 440 MiB of the launcher's 524 at
    products 0.05 (about 9 GiB at full size) beside the ranks for the whole run (issue 35)."""
    from gnnc.graph.store import forget_derived, release_pages  # deferred: what only the launcher calls

    forget_derived(graph)
    release_pages(graph)
    block_cache.empty()  # the blocks just freed (and those partitioning freed) go back to the system, not kept


def strategy_of(program: Program) -> set[str]:
    return {layer.attr("strategy") for layer in program.graph_layers()}


class Exchange:
    """The communication ops of the IR, bound to this rank's layers and byte counters: each exchange is a
    function registered with `@implements_exchange` (gnnc.runtime.implementations) taking this binding, here for
    gnnc's own exchanges."""

    def __init__(self, data: RankData, stats: comm.CommStats, world: int, dtype: torch.dtype = torch.float32):
        self.lg = data.lg
        self.stats = stats
        self.layer: LayerGraph | None = None  # the graph layer running now (DistInterpreter sets it)
        self.block_order = data.block_order
        self.block_sizes = data.lg.block_rows
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = world
        self.dtype = dtype  # what exchanged rows travel in: the run's precision (gnnc.plan.precision)
        # G3's inter-layer pipeline (gnnc.runtime.bins): values a binned layer computed bin by bin for the layers
        # after it (None: computed, read by no one else; a pipelined halo's messages), taken instead of computed
        self.ahead: dict[str, Any] = {}
        self.pipes: dict[str, Any] | None = None  # gnnc.plan.bins.pipelines of the program, once read

    def wire(self, x: torch.Tensor) -> torch.Tensor:
        """`x` in the type it travels in (a no-op at fp32), so each exchange carries what predict-bytes counts."""
        return x.to(self.dtype) if x.is_floating_point() else x

    def exchange(self, op: str, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """Run exchange `op` on `x`, as its schedule says; bytes labelled by its value."""
        return exchange_implementation(op)(self, self.wire(x), e)

    def owned_rows(self) -> int:
        """How many rows of a vertex value are this rank's own: its first ones (gnnc.plan.rows)."""
        return self.lg.n_owned

    def all_reduce(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """The sum over ranks of `x`, computed by equation `e` from each rank's own rows (batch_norm)."""
        return comm.all_reduce_sum(x, self.stats, label=_label(e))

    def start_parts(self, e: Eqn, x: torch.Tensor) -> PartStream:
        """Post a split exchange (gnnc.plan.schedule_attrs): its rows come part by part as the readers ask for them."""
        return exchange_implementation(e.op, "parts")(self, x, e)

    @implements_exchange("halo", "parts")
    def _halo_parts(self, x: torch.Tensor, e: Eqn) -> PartStream:
        """An overlapped halo: the held rows at once, the remote rows once they arrive; chunked, each peer's
        rows once that peer's have arrived, in ring order (part 1 + k holds the k-th other rank's, by rank; this
        rank sends itself nothing and has no part)."""
        layer = self.layer
        assert layer is not None and layer.halo is not None
        held = self.wire(_dense(x)[: layer.n_in])  # a sparse input (bag of words) travels as dense rows
        schedule = exchange_schedule(e)
        if schedule.chunked:
            chunked = comm.start_chunked_halo_exchange(held, layer.halo, self.stats, label=_label(e),
                                                       method=schedule.method)
            return PartStream(held, chunked.chunks(), self.world, self.chunk_order()[1:])
        handle = comm.start_halo_exchange(held, layer.halo, self.stats, label=_label(e), method=schedule.method)
        return PartStream(held, _waited(handle), 2)

    def chunk_order(self) -> tuple[int, ...]:
        """A chunked halo's parts in the order they are run: the held rows, then each peer's in ring order
        (gnnc.runtime.comm.ChunkedHalo); peer src's part is 1 + its place among the other ranks."""
        return (0, *(chunk_part(src, self.rank) for _, src in comm.ring_schedule(self.rank, self.world)))

    @implements_exchange("bcast_rows", "parts")
    def _bcast_rows_parts(self, x: torch.Tensor, e: Eqn) -> PartStream:
        """A staged broadcast: every rank's block, one stage after another."""
        return PartStream(None, self._stages(self.wire(_dense(x)[: self.lg.n_owned]), _label(e)),
                          len(self.block_sizes))

    def _stages(self, own: torch.Tensor, label: str):
        """MG-GCN's broadcast stages: stage 0 posted now, stage j+1 posted before stage j is waited for."""
        sizes, width = self.block_sizes, tuple(own.shape[1:])

        def post(j: int) -> comm.CommHandle:
            # a staged block has one reader (the schedule pass checks it), whose gradient is its own
            return comm.start_broadcast_block(own, j, (sizes[j], *width), self.stats, label=label, owns_grad=True)

        handle = post(0)

        def later():
            nonlocal handle
            for j in range(len(sizes)):
                nxt = post(j + 1) if j + 1 < len(sizes) else None
                block, handle = handle.wait(), nxt
                yield block

        return later()

    def part_run(self, layer, e: Eqn) -> PartRun:
        """The source parts of `layer`'s edges that its split exchange `e` delivers, in the order they arrive."""
        lgl = self.layer
        assert lgl is not None
        return PartRun(lgl.parts(layer.edges, part_bounds(lgl, e, self.block_sizes, self.rank)),
                       release=comm_op(e.op).parts_read_once,
                       order=self.chunk_order() if exchange_schedule(e).chunked else None)

    @implements_exchange("sync_scores")
    def _sync_scores(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """P3's sync of a pushpull layer's attention scores: every vertex's partial dot products summed on every
        rank (backward: the same sum of their gradients, each rank's loss reading the sum)."""
        return comm.all_reduce_sum(x, self.stats, label=_label(e))

    @implements_exchange("reduce_scatter")
    def _reduce_scatter(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """P3's pull: every vertex's partial sums, summed at its owner (rows in block order)."""
        return comm.reduce_scatter(x[self.block_order], self.block_sizes, self.stats, dim=0, label=_label(e))

    @implements_exchange("halo")
    def _halo(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """DepComm / Hybrid: the held rows followed by the remote rows of this layer's halo."""
        layer = self.layer
        assert layer is not None and layer.halo is not None
        held = _dense(x)[: layer.n_in]  # a sparse input (bag of words) travels as dense rows
        method = exchange_schedule(e).method
        if torch.is_grad_enabled():
            return torch.cat([held, comm.halo_exchange(held, layer.halo, self.stats, label=_label(e), method=method)],
                             dim=0)
        # without autograd (an evaluation: a layer-wise one runs every halo whole, gnnc.runtime.layerwise) the rows
        # are received into the result beside a copy of the held ones, not into a buffer of their own joined by a
        # concatenation: one [halo, width] less at the exchange (68 MiB of a GCN rank at products 0.1; 0.66 GiB at
        # full size on 2 ranks, issue 35)
        out = held.new_empty((layer.n_in + layer.halo.n_halo, *held.shape[1:]))
        out[: layer.n_in] = held
        comm.halo_exchange(held, layer.halo, self.stats, label=_label(e), method=method, into=out[layer.n_in:])
        return out

    @implements_exchange("fetch")
    def _fetch(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """Entering a depcache/hybrid segment: the rows of C^s it does not own, in the segment's order."""
        layer = self.layer
        assert layer is not None and layer.entry is not None and layer.entry_perm is not None
        own = _dense(x)[: self.lg.n_owned]
        got = comm.halo_exchange(own, layer.entry, self.stats, label=_label(e), method=exchange_schedule(e).method)
        return torch.cat([own, got], dim=0)[layer.entry_perm]

    @implements_exchange("bcast_rows")
    def _bcast_rows(self, x: torch.Tensor, e: Eqn) -> torch.Tensor:
        """MG-GCN's broadcast, every block gathered first (`staged=false`): every rank's row block, in block order."""
        own = _dense(x)[: self.lg.n_owned]
        blocks = [h for _, h in comm.staged_broadcast(own, self.lg.block_rows, self.stats, label=_label(e))]
        return torch.cat(blocks, dim=0)


@dataclass
class FeaturePhase:
    """P3's layout before its pull: every vertex's row, this worker's slice of the input features."""

    views: dict[str, Any]  # the whole graph's edge views (the layer-1 structure, replicated)
    ids: torch.Tensor  # arange(N)
    cols: tuple[int, int]  # this worker's feature slice [start, stop)


class DistInterpreter(PrefixRowsInterpreter):
    """Runs each layer in its strategy's layout: feature-sliced up to P3's pull, rows elsewhere.

    Rows of different layers are prefixes of one order (gnnc.plan.rows),
    so a vertex-wise op meeting two of them keeps the shorter prefix.
    """

    def __init__(self, program: Program, lg: LocalGraph, phase: FeaturePhase | None = None):
        super().__init__(program)
        self.lg = lg
        self.phase = phase
        # the weights the rank holds as its slice's rows already (P3's split W1); others are sliced where read
        self.split = split_weights(program) if phase is not None else frozenset()
        self.in_phase = phase is not None
        self.sliced: set[str] = {"x"} if phase is not None else set()
        self._ids = lg.rows  # ids of the rows the values of the running layer hold
        # a layer's epilogue (bias, activation, dropout: gnnc.runtime.fusion) reads and writes this rank's rows only,
        # so a rank runs it as one process does: GCN's relu and dropout keep one [owned, hidden] tensor for the
        # backward, not two (123 MiB less in a rank's second layer at products 0.1, 1.2 GiB at full size; issue 35);
        # the attention chain reads a layer's exchanged rows (its SpMM may run per part): equation by equation
        self.epilogues = {k: c for k, c in self.chains.items() if c.kind == "epilogue"}
        self.in_epilogues = fusion.inner_results(self.epilogues)

    def run_layer(self, layer, env, params, ctx):
        if layer.name == self.program.layers[0].name:
            self.in_phase = self.phase is not None  # a new forward pass starts in the feature layout
            self._ids = self.lg.rows
        if layer.kind == "graph":
            lgl = self.lg.layers[layer.name]
            ctx.comm.layer = lgl
            self._ids = lgl.ids  # the layer's rows, in its segment's order
        ctx = _with(ctx, views=lgl.views, vertex_ids=self._ids) if layer.kind == "graph" else \
            _with(ctx, vertex_ids=self._ids)
        if not self.in_phase:
            return self._run_rows(layer, env, params, ctx)
        p = self.phase
        # every vertex's rows; a value on this worker's feature slice draws its dropout by global column, a whole
        # one (an attention score summed over the workers, its softmax) as one process does
        whole_ctx = _with(ctx, views=p.views, vertex_ids=p.ids)
        fctx = _with(whole_ctx, col_offset=p.cols[0])
        for k, e in enumerate(layer.eqns):
            ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
            sliced_in = any(v.name in self.sliced for v in e.ins)
            if e.op == "linear" and sliced_in:
                if e.ins[1].name not in self.split:
                    ins[1] = ins[1][p.cols[0]:p.cols[1]]  # this slice's rows of W: a partial product
            elif sliced_in:
                self.sliced.update(o.name for o in e.outs)
            view = fctx.views.get(layer.edges) if layer.kind == "graph" else None
            run_ctx = (fctx if sliced_in else whole_ctx) if self.in_phase else ctx
            env[e.outs[0].name] = self.eqn(e, ins, view, run_ctx)
            self.drop_dead(env, layer, k)
            if e.op == "reduce_scatter":
                self.in_phase = False  # the pull: owned rows from here on
                fctx = ctx

    def _run_rows(self, layer, env, params, ctx: ExecContext) -> None:
        """A layer on rows, as its schedule annotations say (gnnc.plan.schedule_attrs).

        A binned layer runs bin by bin (gnnc.runtime.bins). Otherwise a split
        exchange (an overlapped halo: NeutronStar's DepComm, one message per
        peer posted in ring order, its remote rows one part or, chunked, one
        part per peer; a staged broadcast: MG-GCN) is posted where it stands
        and the equations marked `split` run once per source part as the
        parts arrive (gnnc.runtime.parts); the others run on whole values.
        Backward overlaps the same way (gnnc.runtime.comm's split ops).
        """
        if layer.kind == "graph" and chunked_evaluation(ctx) and run_layer_chunked(self, layer, env, params, ctx,
                                                                                ctx.eval_chunk):
            return  # an evaluation layer-wise: exchanges whole, as below, the rest per chunk of rows
        if layer.kind == "graph" and layer_schedule(layer).binned:
            run_binned(self, layer, env, params, ctx)
            self.drop_dead(env, layer)
            return
        view = ctx.views.get(layer.edges) if layer.kind == "graph" else None
        exchange = split_exchange(layer) if layer.kind == "graph" else None
        run = ctx.comm.part_run(layer, exchange) if exchange is not None else None
        fuse = ctx.use_kernels and ctx.fuse
        for k, e in enumerate(layer.eqns):
            name = e.outs[0].name
            if name in ctx.comm.ahead:  # computed bin by bin by a binned layer before (gnnc.runtime.bins)
                got = ctx.comm.ahead.pop(name)
                if got is not None:
                    env[name] = got
                self.drop_dead(env, layer, k)
                continue
            if fuse and name in self.epilogues and fusion.run(self.epilogues[name], env, params, ctx):
                self.drop_dead(env, layer, k)
                continue
            if fuse and name in self.in_epilogues and name in env:  # computed when its chain ran
                self.drop_dead(env, layer, k)
                continue
            ins = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
            if exchange_schedule(e).split:
                env[e.outs[0].name] = ctx.comm.start_parts(e, ins[0])
            elif split_eqn(e):
                # never hoisted (the schedule pass splits no hoisted equation): computed, not cached
                env[e.outs[0].name] = run_split(e, ins, run, lambda eq, xs, v: self.compute(eq, xs, v, ctx),
                                                ctx.use_kernels)
            else:
                env[e.outs[0].name] = self.eqn(e, [whole(x) for x in ins], view, ctx)
            self.drop_dead(env, layer, k)

def _dense(x: torch.Tensor) -> torch.Tensor:
    return x.to_dense() if x.is_sparse else x


def whole(x: Any) -> Any:
    """A value as one tensor: a split exchange's rows all together (an edge value split by part never is)."""
    if isinstance(x, PartStream):
        return x.whole()
    if isinstance(x, Parts):
        raise AssertionError("an edge value split by source part read by an equation that does not run per part")
    return x


def _label(e: Eqn) -> str:
    """The byte counters' label of a communication equation: the value it exchanges."""
    return e.outs[0].name.split(".")[0]


def _waited(handle: comm.CommHandle):
    yield handle.wait()


def hold_parts_views(program: Program, lg: LocalGraph, rank: int) -> None:
    """Hold a layer structure by source parts only (LayerGraph.hold_parts) when every layer using it reads
    its structure only in equations that run per part (a split exchange's readers, gnnc.plan.schedule_attrs)."""
    users: dict[int, list[tuple[Any, Eqn | None]]] = {}
    for layer in program.graph_layers():
        lgl = lg.layers[layer.name]
        exchange = split_exchange(layer)
        only_parts = exchange is not None and not layer_schedule(layer).binned and all(
            not reads_structure(e) or split_eqn(e) for e in layer.eqns)
        users.setdefault(id(lgl), []).append((layer, exchange if only_parts else None))
    for uses in users.values():
        kinds = {e.op for _, e in uses if e is not None}
        if any(e is None for _, e in uses) or len(kinds) != 1:
            continue
        layer, e = uses[0]
        lgl = lg.layers[layer.name]
        if layer.edges not in lgl.views or lgl.views[layer.edges].csr is None:
            continue
        if all(other.edges == layer.edges for other, _ in uses):
            lgl.hold_parts(layer.edges, part_bounds(lgl, e, lg.block_rows, rank))


def build_split_parts(program: Program, lg: LocalGraph, rank: int) -> None:
    """Group by source part (`LayerGraph.parts`) the structure of every layer whose exchange is split, here on
    the host before the shard moves to its device: built there, during the first epoch, it would read the device."""
    for layer in program.graph_layers():
        exchange = split_exchange(layer)
        lgl = lg.layers[layer.name]
        if exchange is not None and not layer_schedule(layer).binned and lgl.views[layer.edges].csr is not None:
            lgl.parts(layer.edges, part_bounds(lgl, exchange, lg.block_rows, rank))


def _distinct_layers(lg: LocalGraph, by_name: bool = False) -> list:
    """Each of a rank's layer structures once (layers that share a structure share one LayerGraph), in the order of
    the first layer that holds it: the layers' own order, or their names' (`by_name`)."""
    names = sorted(lg.layers) if by_name else list(lg.layers)
    return list({id(lg.layers[name]): lg.layers[name] for name in names}.values())


def forget_edge_ids(program: Program, lg: LocalGraph) -> None:
    """Let go of the edges' global ids where no graph layer reads them: only a dropout of an edge value draws by
    them (gnnc.graph.sampling.reads_edge_ids; edge data comes with the shard). Kept, they were 8 bytes per edge of a
    GCN rank for the whole run (0.47 GiB of each rank at ogbn-products' size on 2 ranks, issue 35). What stays is
    -1 ("unknown", as a sampled block without ids has them) of the same length, one element in memory, so that
    slicing and concatenating views (a layer-wise evaluation's chunks) work as before; run after the structures'
    source parts are built (`build_split_parts`), which gather them."""
    if any(reads_edge_ids(layer) for layer in program.graph_layers()):
        return
    unknown = torch.full((), -1, dtype=torch.int64)
    for layer in _distinct_layers(lg):
        # the layer's views and the source parts built from them (LayerGraph.parts), whose ids are slices of theirs
        views = [*layer.views.values(), *(v for sp in layer._parts.values() for v in sp.views)]
        for view in views:
            view.edge_ids = unknown.expand(len(view.edge_ids))
            if view.csr is not None:
                view.csr.eids_given = unknown.expand(view.csr.nnz)


def narrow_part_sources(lg: LocalGraph) -> None:
    """Hold the sources of each source part's edges (its CSR's columns, numbered within the part) as int32 where they
    fit, as the kernels' patterns take them (gnnc.runtime.kernels.cpu.pattern narrows them to int32 and keeps that
    copy beside the int64 ones): one int32 tensor serves both, 8 bytes per edge less (0.47 GiB of each rank at
    ogbn-products' size on 2 ranks, issue 35). Every reader takes int32 indices (gathers, index_add, bincount)."""
    for layer in _distinct_layers(lg):
        for view in (v for sp in layer._parts.values() for v in sp.views):
            csr = view.csr
            if csr is None or csr.indices.dtype != torch.int64 or max(csr.n_src, csr.nnz) >= 2**31 - 1:
                continue
            shared = view.src is csr.indices
            csr.indices = csr.indices.to(torch.int32)
            if shared:
                view.src = csr.indices


def grad_buckets(program: Program, split: frozenset[str] = frozenset()) -> list[list[int]] | None:
    """The gradient buckets the schedule annotates (`grad_bucket`), as indices into the replicated parameters
    (those not in `split`, P3's split weights, which are never all-reduced) in program order (init_params'
    order), last ones first; None when the plan names none."""
    names = [p.value.name for p in program.params() if p.value.name not in split]
    index = {name: i for i, name in enumerate(names)}
    buckets: dict[int, list[int]] = {}
    for layer in program.layers:
        b = layer_schedule(layer).grad_bucket
        mine = [index[p.value.name] for p in layer.params if p.value.name in index]
        if b is None and mine:
            return None
        if b is not None:
            buckets.setdefault(b, []).extend(mine)
    return [sorted(buckets[b], reverse=True) for b in sorted(buckets)]


def part_bounds(lgl: LayerGraph, e: Eqn, block_rows: list[int], rank: int) -> tuple[int, ...]:
    """Where each source part of split exchange `e` starts (its registered "bounds"); chunked, the remote
    rows cut by the rank that sends them (the received rows are ordered by rank, gnnc.plan.halo), one part per
    other rank: this rank's own (always empty) range is no part, since every part runs each of the layer's
    per-part equations once more, forward and backward (an empty one measured 0.5-5 ms a layer on the loaded
    box: benchmarks/RESULTS-seeds.md)."""
    bounds = exchange_implementation(e.op, "bounds")(lgl, block_rows)
    if not exchange_schedule(e).chunked:
        return bounds
    assert lgl.halo is not None and len(bounds) == 3
    ends = lgl.halo.recv_offsets()[1:]
    return (0, lgl.n_in, *(lgl.n_in + end for src, end in enumerate(ends) if src != rank))


def chunk_part(src: int, rank: int) -> int:
    """The part of a chunked halo that holds rank src's rows on rank `rank` (`part_bounds`: part 0 the held
    rows, then one per other rank, by rank)."""
    return 1 + src - (src > rank)


@implements_exchange("halo", "bounds")
def _halo_bounds(lgl: LayerGraph, block_rows: list[int]) -> tuple[int, ...]:
    """An overlapped halo's parts: the held rows, then the halo rows."""
    assert lgl.halo is not None
    return (0, lgl.n_in, lgl.n_in + lgl.halo.n_halo)


@implements_exchange("bcast_rows", "bounds")
def _block_bounds(lgl: LayerGraph, block_rows: list[int]) -> tuple[int, ...]:
    """A staged broadcast's parts: every rank's block, in rank order."""
    out = [0]
    for n in block_rows:
        out.append(out[-1] + int(n))
    return tuple(out)


def _with(ctx: ExecContext, **changes: Any) -> ExecContext:
    import dataclasses

    return dataclasses.replace(ctx, **changes)


class DistWorker(Worker):
    """One rank: its shard, the communication bound to it, and sums over ranks.

    Under push-pull the rank's parameters hold only its feature slice's rows of P3's split weights
    (`split`, columns `cols` of the input features); every other parameter is whole on every rank.
    """

    split: frozenset[str] = frozenset()  # none in a sampled run's worker (gnnc.runtime.minibatch_dist)
    cols: tuple[int, int] | None = None

    def __init__(self, cfg: DistConfig, job: DistJob, device: torch.device | None = None):
        """`device`: where this rank's tensors live; by default its GPU (`local_rank`) on CUDA, else the CPU."""
        self.device = devices.start_rank(job.train.device, job.train.precision, cfg.local_rank, device)
        program = job.program
        data = load_rank(job.shard_dir, cfg.rank, cfg.world_size)
        check_dims_fit(program, data.num_features, data.num_classes, data.graph_name, data.inputs["y"])
        self.rank, self.world_size = cfg.rank, cfg.world_size
        self.program = program
        self.num_nodes = data.num_nodes
        self.graph_name = data.graph_name
        self.cfg = job.train
        self.stats = comm.CommStats()
        lg = data.lg
        checked: set[int] = set()
        for layer in lg.layers.values():
            if id(layer) not in checked:
                if layer.halo is not None:
                    comm.check_halo_plan(layer.halo, layer.n_in)
                if layer.entry is not None:
                    comm.check_halo_plan(layer.entry, lg.n_owned)
                checked.add(id(layer))
        check_schedule(program)
        pipelines(program)  # a halo marked pipelined that cannot be: PlanError now, not mid-epoch
        hold_parts_views(program, lg, self.rank)
        for layer in program.graph_layers():  # a binned layer's bins: structure, built with the shard
            if layer_schedule(layer).binned:
                bins_of(lg.layers[layer.name], layer, program.config_dict())
        build_split_parts(program, lg, self.rank)
        forget_edge_ids(program, lg)
        narrow_part_sources(lg)
        # The shard goes to the device once, every structure derived from it (parts, bins) built first, on the
        # host: built there during the first epoch, they would read the device (on CPU this changes nothing).
        move = devices.mover(self.device)
        self.lg = lg = devices.place(lg, self.device)
        data.lg = lg
        self.inputs = {k: move(t) for k, t in data.inputs.items()}
        phase = None
        if data.full_views is not None:
            phase = FeaturePhase({k: devices.place(v, self.device) for k, v in data.full_views.items()},
                                 torch.arange(data.num_nodes, device=self.device), data.cols)
        if data.block_order is not None:
            data.block_order = move(data.block_order)
        self.interp = DistInterpreter(program, lg, phase)
        self.split, self.cols = self.interp.split, data.cols
        self.views: dict[str, Any] = {}
        self.ids = lg.rows
        self.count = data.train_count
        self.exchange = Exchange(data, self.stats, cfg.world_size, devices.compute_dtype(job.train.precision))
        self._reducer: comm.GradAllReduce | None = None
        self.state, self.hoisted = init_state(program, self.device), {}

    def context(self, training: bool, epoch: int) -> ExecContext:
        return _with(super().context(training, epoch), comm=self.exchange)

    def initial_params(self, seed: int) -> dict[str, torch.nn.Parameter]:
        """The parameters one process starts from, P3's split weights cut to this rank's feature slice: the rank
        holds, differentiates and updates (Adam's moments, weight decay: elementwise) only those rows."""
        params = super().initial_params(seed)
        for name in self.split:
            assert self.cols is not None
            params[name] = torch.nn.Parameter(params[name].detach()[self.cols[0]:self.cols[1]].clone())
        return params

    def replicated(self, params) -> list[torch.nn.Parameter]:
        """The parameters every rank holds whole, whose gradients are summed over ranks (all but `split`)."""
        return [p for name, p in params.items() if name not in self.split]

    def forward(self, params, training: bool, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._reducer is None:  # before the first backward: an overlapped all-reduce hooks the parameters
            self._reducer = comm.GradAllReduce(self.replicated(params), self.stats,
                                               buckets=grad_buckets(self.program, self.split),
                                               overlap=program_schedule(self.program).grad_overlap)
        return super().forward(params, training, epoch)

    def owned(self, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = self.lg.n_owned
        return logits[:n], {k: v[:n] for k, v in self.inputs.items() if k != "x"}

    def reduce_grads(self, params) -> None:
        if self._reducer is None:  # a step that never ran forward() (a sampled minibatch's phases): after backward
            self._reducer = comm.GradAllReduce(self.replicated(params), self.stats)
        self._reducer.finish()
        if self.split and self.cfg.precision == "fp16":
            self._share_overflow(params)

    def _share_overflow(self, params) -> None:
        """fp16's loss scaler skips a step whose gradients overflowed; a summed gradient overflows on every rank
        alike, a split one only where it is held: make every rank's split gradients non-finite when any rank's
        are, so that all skip the step together (on the device: no host read)."""
        grads = [params[name].grad for name in sorted(self.split) if params[name].grad is not None]
        bad = torch.zeros(1, device=self.device)
        for g in grads:
            bad = torch.maximum(bad, (~torch.isfinite(g)).any().to(bad.dtype).reshape(1))
        bad = self.max(bad)
        poison = torch.where(bad > 0, torch.tensor(float("inf"), device=self.device), torch.zeros(1, device=self.device))
        for g in grads:
            g.add_(poison.to(g.dtype))

    def clip_grads(self, params, max_norm: float) -> None:
        """Clip by the norm over every parameter of the model, as one process: the split weights' squared norms
        are summed over ranks (their slices are disjoint), the replicated ones' counted once."""
        if not self.split:
            return super().clip_grads(params, max_norm)
        split = [params[name].grad for name in sorted(self.split) if params[name].grad is not None]
        zero = torch.zeros((), dtype=torch.float32, device=self.device)
        sq_split = sum((g.detach().float().pow(2).sum() for g in split), zero)
        sq_whole = sum((p.grad.detach().float().pow(2).sum() for p in self.replicated(params) if p.grad is not None),
                       zero)
        total = (self.sum(sq_split.reshape(1))[0] + sq_whole).sqrt()
        torch.nn.utils.clip_grads_with_norm_([p for p in params.values() if p.grad is not None], max_norm, total)

    def whole_weights(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """`tensors` (one per parameter, on the host: the trained weights, their gradients) with each split
        weight's slices of every rank assembled into the whole, on rank 0 (None elsewhere); a collective."""
        mine = {name: tensors[name].detach().cpu() for name in sorted(self.split) if name in tensors}
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, (self.cols, mine))
        if self.rank != 0:
            return None
        out = dict(tensors)
        for name in mine:
            pieces = sorted(((cols[0], part[name]) for cols, part in every), key=lambda c: c[0])
            out[name] = torch.cat([t for _, t in pieces], dim=0)
        return out

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def train_vertices(self) -> int:
        return int(self.sum(self.inputs["train"][: self.lg.n_owned].sum().reshape(1).to(torch.int64))[0])

    def graph_tensors(self) -> list[torch.Tensor]:
        """This rank's rows, inputs and layer structures, in layer order (a structure shared by layers once)."""
        out = [self.lg.rows, *self.inputs.values()]
        for layer in _distinct_layers(self.lg, by_name=True):
            for view in (layer.views[v] for v in sorted(layer.views)):
                if view.csr is not None:
                    out += [view.csr.indptr, view.csr.indices]
        return out

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Every rank's owned rows on rank 0's host, in global order (after the epochs)."""
        return _gather_rows(logits.detach()[: self.lg.n_owned].cpu(), self.lg.owned.cpu(), self.num_nodes,
                            self.rank, self.world_size)


def one_step(cfg: DistConfig, job: DistJob) -> dict[str, Any] | None:
    """Forward (training mode, dropout on) and backward once; rank 0 returns logits and summed grads (host).

    The exactness tests compare this with one process.
    """
    w = DistWorker(cfg, job)
    params = w.initial_params(job.train.seed)
    with torch.no_grad():  # computes the hoisted values, once per run: the step measured is a steady one
        w.forward(params, False, 0)
    w.stats.reset()
    logits, loss = w.forward(params, True, 0)
    loss.backward()
    w.reduce_grads(params)
    total = w.sum(loss.detach())
    gathered = w.gather_logits(logits)
    every: list[Any] = [None] * cfg.world_size
    dist.all_gather_object(every, w.stats.bytes_by("op"))
    grads = w.whole_weights({k: p.grad.detach().to("cpu", copy=True) for k, p in params.items()})  # W1's slices
    if grads is None:
        return None
    sent: dict[str, int] = {}
    for per_rank in every:
        for op, nbytes in per_rank.items():
            sent[op] = sent.get(op, 0) + nbytes
    return {"logits": gathered, "loss": float(total), "grads": grads, "bytes_by_op": sent}


def train_and_report(w: DistWorker, cfg: DistConfig, job: Any) -> RunResult | None:
    """Train rank `w` (`job`: train, metrics_path, want_logits); rank 0 returns the run's result."""
    from gnnc.runtime.metrics import peak_rss_bytes  # deferred: metrics loads torch.distributed

    result = fit(w, job.train, job.metrics_path)
    peak = w.max(torch.tensor([float(peak_rss_bytes())], dtype=torch.float64, device=w.device)).cpu()
    gathered = w.gather_logits(result.logits) if job.want_logits else None
    weights = w.whole_weights(result.weights) if w.split else result.weights  # the whole W1 (--save-model)
    if cfg.rank != 0:
        return None
    result.weights = weights
    result.logits, result.graph, result.world_size, result.peak_rss_bytes = (gathered, w.graph_name, cfg.world_size,
                                                                             int(peak[0]))
    result.strategies = [layer.attr("strategy") for layer in w.program.graph_layers()]
    return result


def _gather_rows(rows: torch.Tensor, ids: torch.Tensor, n: int, rank: int, world: int) -> torch.Tensor | None:
    """Assemble every rank's owned rows into one [n, ...] tensor on rank 0 (global order)."""
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, (ids, rows.detach()))
    if rank != 0:
        return None
    out = torch.zeros((n,) + tuple(rows.shape[1:]), dtype=rows.dtype)
    for ids_p, rows_p in objs:
        out[ids_p] = rows_p
    return out


def one_step_each(cfg: DistConfig, jobs: list[DistJob]) -> list[dict[str, Any] | None]:
    """`one_step` for several jobs in one launch (the process start is the expensive part)."""
    return [one_step(cfg, job) for job in jobs]
