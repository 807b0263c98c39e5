"""A run's predicted memory against what the machine has, checked before the run allocates it.

Why this module exists: `--set hidden=2000000` on Cora needs far more memory
than the machine has; without a check, the first epoch allocates until the
kernel kills the process, 112 s later, with no word. Both ways `gnnc run`
trains (in this process, and on N worker processes) pass `check_run_memory`
first: it counts what each process will hold (its rows and edges per layer:
the whole graph in one process, the manifest of each rank's shard in N),
prices that with the cost model's memory formula
(`gnnc.passes.cost.memory.run_memory`) and compares it with
`gnnc.host.available_memory()`. More than is available is refused (exit 2)
with the estimate broken down; more than WARN_FRACTION of it is a warning
on stderr. Workers of a torchrun job are not checked (they share machines
this process cannot see).

A sampled run (`--fanout`, `--batch-size`) holds one minibatch's blocks at a
time, not the whole graph's rows (issue 34): its activations are priced on the
largest blocks of a dry run of the sampler (the first training batches of
epoch 0 and the first evaluation batches, `dry_run_layers`, times a margin and
a measured factor, within the fan-outs' bound `sampled_layers`), each process's
peak the larger of its training step's and its evaluation's. Its graph term is
what it holds in memory: a graph in memory's arrays and the CSR the sampler
builds; from a memory-mapped store (one process) or a rank's mapped shards only
what the sampler allocates per vertex, a rank's loaded shard arrays, and one
gather's window of the mapped files (`GATHER_WINDOW_BYTES`), not the feature
matrix or the edge list, which stay on disk. At papers100M/10 the whole-graph
count predicted 9.89 GB for a run that peaked at 2.22 GB (the peak itself the
check's own reading of the edge list, now counted a block at a time:
`non_loop_edges`); benchmarks/RESULTS-scale.md has the measured table.

On CUDA (`device="cuda"`) the tensors live on the GPUs: each process's parameters, optimizer state, activations
and graph are compared with what its GPU has free (`torch.cuda.mem_get_info` of GPU `local rank`, the one
`gnnc.runtime.device.rank_device` gives it), and only the interpreter itself (`process`) and the graph it loads
before copying it with the host's memory. Host RAM says nothing about whether a 40 GiB GPU can hold a run.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph import Graph
from gnnc.graph.generators import parse_spec
from gnnc.graph.sampling import FULL, REGION_BYTES, SamplingConfig, reads_edge_ids
from gnnc.graph.store import MANIFEST, is_store, mapped_files, release_pages
from gnnc.host import AvailableMemory, available_memory, format_bytes, resident_bytes
from gnnc.ir import Program
from gnnc.passes.analysis.layers import layer_dims, param_dependent
from gnnc.passes.cost.memory import WARN_FRACTION, LayerRows, MemoryEstimate, ProcessCounts, run_memory
from gnnc.passes.cost.symbols import layer_shape
from gnnc.plan.plan_file import Plan
from gnnc.plan.schedule_attrs import layer_schedule, split_exchange
from gnnc.plan.shard_files import read_manifest
from gnnc.plan.strategies import STRATEGIES



def estimate_run_memory(plan: Plan, graph: Graph | None = None,
                        shard_dir: str | Path | None = None, recompute: bool = False) -> MemoryEstimate:
    """Predicted peak bytes of each process: one process on `graph`, or one per shard in `shard_dir`; `recompute`:
    the run keeps graph layers' inputs only (--recompute)."""
    program = plan.program
    dims, heads = layer_dims(program)
    needs = param_dependent(program)
    shapes = [layer_shape(layer, needs) for layer in program.graph_layers()]
    if plan.sampling is not None:  # each process's training step or its evaluation, the larger
        if shard_dir is not None:
            pairs = sampled_rank_counts(program, plan.sampling, shard_dir, read_manifest(shard_dir))
        elif graph is not None:
            pairs = [sampled_process_counts(program, graph, plan.sampling)]
        else:
            raise ValueError("estimate_run_memory needs the graph (one process) or the shards (several)")
        return sampled_estimate(program, dims, heads, shapes, pairs, fused=shard_dir is None)
    if shard_dir is not None:
        processes = shard_counts(program, read_manifest(shard_dir))
    elif graph is not None:
        processes = [single_process_counts(program, graph)]
    else:
        raise ValueError("estimate_run_memory needs the graph (one process) or the shards (several)")
    # a rank runs no fused chain (gnnc.runtime.fusion): its attention holds per-edge values one process does not
    return run_memory(program, dims, heads, shapes, processes, recompute=recompute, fused=shard_dir is None,
                      first_in_blocks=recompute and shard_dir is None and first_layer_in_blocks(program))


def first_layer_in_blocks(program: Program) -> bool:
    """Whether --recompute runs `program`'s first graph layer in blocks (gnnc.runtime.recompute.first_layer)."""
    from gnnc.runtime import fusion, recompute  # deferred: torch, which `gnnc check` does not load
    return recompute.first_layer(program, fusion.find_chains(program)) is not None


def single_process_counts(program, graph: Graph) -> ProcessCounts:
    """One process training full-graph steps holds the whole graph, and every row and edge of every layer."""
    n = graph.num_nodes
    edges = {"plain": graph.num_edges, "self_loops": non_loop_edges(graph) + n}
    layers = tuple(LayerRows(n, 0, n, edges[layer.edges]) for layer in program.graph_layers())
    return ProcessCounts(layers, float(graph_arrays_bytes(graph)))


def graph_arrays_bytes(graph: Graph) -> int:
    """The bytes of a graph's arrays: features, labels, masks, edge data and the edge list."""
    arrays = [graph.x, graph.y, graph.train_mask, graph.val_mask, graph.test_mask, *graph.edge_data.values()]
    return sum(t.numel() * t.element_size() for t in arrays) + np.asarray(graph.src).nbytes * 2


# edges compared at a time when counting self-loops: the comparison of a whole edge list at once held a bool per
# edge and, from a store, every page of src and dst (8 bytes per edge: 1.29 GB at papers100M/10, resident until the
# run's first minibatch let the pages go, the largest part of that run's measured peak, issue 34)
LOOP_COUNT_EDGES = 1 << 22


def non_loop_edges(graph: Graph) -> int:
    """The edges whose source is not their destination, counted a block at a time; a store's pages let go after
    each block (release_pages)."""
    src, dst = np.asarray(graph.src), np.asarray(graph.dst)
    count = 0
    for lo in range(0, len(src), LOOP_COUNT_EDGES):
        count += int(np.count_nonzero(src[lo:lo + LOOP_COUNT_EDGES] != dst[lo:lo + LOOP_COUNT_EDGES]))
        release_pages(graph)
    return count


# --- sampled runs (issue 34): what a sampled process holds, measured on the papers100M-like R-MAT stores of
# benchmarks/scale.py (GraphSAGE 3 x 256, fan-out 15,10,5, batch 1024): the check priced the whole feature matrix
# and edge list resident (7.1 GB of its 9.89 at papers100M/10, where the store maps them and a minibatch reads its
# rows a region at a time, gnnc.graph.sampling.take) and every layer at the fan-outs' bound (a first block of
# 1.08M rows, where R-MAT's many low in-degrees and shared neighbours gave 60-135K at 0.01)

# training and evaluation batches the check samples (the first of epoch 0's, as the run draws them; the first of
# the evaluation's, the lowest ids: an R-MAT's hubs): their largest blocks price the activations
DRY_TRAIN_BATCHES = 4
DRY_EVAL_BATCHES = 2
# the largest dry-run block's rows and edges times this: batches differ (at 0.01, batch 1024, the first 6 training
# batches' first blocks were 58.7-62.1K rows, the first 3 evaluation batches' 65.9-90.9K)
DRY_RUN_MARGIN = 1.15
# what a sampled step holds per row and edge beyond `layer_memory`'s values, as a factor on them (they are linear in
# the rows and edges): the dropouts' outputs and masks, the activations' outputs, both linear maps' products and
# autograd's saved inputs, the block's structures, and the block cache's and the heap's kept blocks. Fitted on the
# measured peaks (benchmarks/RESULTS-scale.md, "The memory check on sampled runs"): a training step needed 2.5-2.9
# (batch 64-4096, 0.001-0.01), an evaluation batch (no autograd) 1.1-1.8 where it set the peak (0.01-0.1); with
# DRY_RUN_MARGIN above, 3.3 and 1.7 on the dry run's largest blocks
TRAIN_ACTIVATION_FACTOR = 2.9
EVAL_ACTIVATION_FACTOR = 1.5
# bytes per vertex the sampler and a sampled worker hold whatever the batch: the sampler's scratch of local ids
# (int64), per edge view its candidates' degrees (int64) and deg^-1/2 (float64) (gnnc.graph.sampling), 24 bytes for
# one view; measured 48 per vertex at papers100M/10 (507 MB over the interpreter once the first minibatch let the
# mapped pages go, 11.1M vertices): the temporaries of deg^-1/2 and the evaluation's label union, freed to a heap
# that keeps them (gnnc.runtime.memory's mmap threshold), are the rest, priced as a second view's
SAMPLER_SCRATCH_BYTES = 8 + 16
SAMPLER_VIEW_BYTES = 16
# a rank's own arrays beside its shard's (gnnc.runtime.minibatch_dist): the local row of every vertex (int64), and
# per vertex it owns its id (int64), label (int64) and three mask entries
RANK_VERTEX_BYTES = 8
RANK_OWNED_BYTES = 8 + 8 + 3
# the mapped pages a minibatch's gathers hold at once: a region of x or of the CSR (gnnc.graph.sampling.take reads one
# at a time and lets it go); at most the mapped features and CSR. Measured at 0.01: the gather rose 85-115 MiB over
# the step, 53-57 MiB of it beside the gathered rows
GATHER_WINDOW_BYTES = REGION_BYTES


def is_mapped(graph: Graph) -> bool:
    """Whether `graph`'s arrays are memory-mapped (a store's, a rank's shards'): resident only as far as read."""
    return bool(mapped_files(graph))


def sampler_bytes(graph: Graph, views: set[str], non_loop: int) -> int:
    """What the sampler allocates on `graph` (gnnc.graph.sampling.NeighbourSampler): its scratch, each view's
    degrees, and a `self_loops` view of a graph with self-loops its own copy of the CSR without them."""
    n = graph.num_nodes
    total = SAMPLER_SCRATCH_BYTES * n + SAMPLER_VIEW_BYTES * n * len(views)
    if "self_loops" in views:
        if non_loop < graph.num_edges:  # the non-loop entries' indptr, indices and eids, and the mask of them
            total += 8 * (n + 1) + (8 + 8 + 1) * graph.num_edges
    return total


def sampled_process_counts(program, graph: Graph,
                           sampling: SamplingConfig) -> tuple[ProcessCounts, ProcessCounts]:
    """One process training sampled minibatches of `graph`, in its training steps and in its evaluation: the
    activations on the largest blocks a dry run of the sampler draws (`dry_run_layers`), the graph's arrays where
    they are in memory (a mapped store's only as far as its gathers read them: `GATHER_WINDOW_BYTES`) and what the
    sampler allocates per vertex."""
    n = graph.num_nodes
    edges = {"plain": graph.num_edges, "self_loops": non_loop_edges(graph) + n}
    views = {layer.edges for layer in program.graph_layers()}
    train, evaluation = dry_run_layers(program, graph, sampling, edges, {0: train_and_eval_seeds(graph)})[0]
    held = min(GATHER_WINDOW_BYTES, graph.x.numel() * graph.x.element_size() + csr_bytes(graph)) if is_mapped(graph) \
        else graph_arrays_bytes(graph) + csr_bytes(graph)
    held += sampler_bytes(graph, views, edges["self_loops"] - n)
    return ProcessCounts(train, float(held)), ProcessCounts(evaluation, float(held))


def csr_bytes(graph: Graph) -> int:
    """The in-edge CSR a graph in memory builds for the sampler (int64 indptr, indices and edge ids)."""
    return 8 * (graph.num_nodes + 1) + 16 * graph.num_edges


def train_and_eval_seeds(graph: Graph, parts: np.ndarray | None = None, rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The training seeds and the evaluated vertices of a process (of rank `rank` under `parts`)."""
    from gnnc.runtime.minibatch import labelled_ids  # deferred: torch's runtime, which `gnnc check` does not load

    train = np.nonzero(graph.train_mask.numpy())[0]
    labelled = labelled_ids(graph.train_mask, graph.val_mask, graph.test_mask)
    if parts is not None:
        labelled = labelled[parts[labelled] == rank]
    return train, labelled


def dry_run_layers(program, graph: Graph, sampling: SamplingConfig, edges: dict[str, int],
                   seeds: dict[int, tuple[np.ndarray, np.ndarray]], parts: np.ndarray | None = None,
                   seed: int = 0) -> dict[int, tuple[tuple[LayerRows, ...], tuple[LayerRows, ...]]]:
    """Per process (a rank, or 0), the rows and edges of each graph layer priced for its training steps and for its
    evaluation: the largest blocks of the first `DRY_TRAIN_BATCHES` training batches of epoch 0 (a rank samples its
    own seeds of each global batch, as the run does) and of the first `DRY_EVAL_BATCHES` evaluation batches, times
    `DRY_RUN_MARGIN` and times `TRAIN_ACTIVATION_FACTOR` or `EVAL_ACTIVATION_FACTOR` (module comment), within the
    fan-outs' bound (`sampled_layers`). The sampler's pages read are let go after each batch."""
    from gnnc.graph.sampling import NeighbourSampler  # deferred, as above
    from gnnc.runtime.minibatch import eval_batch_size  # deferred: torch's runtime, as above

    graph_layers = program.graph_layers()
    bound = sampled_layers(program, sampling, graph.num_nodes, edges)
    size = eval_batch_size(sampling)
    eval_bound = sampled_layers(program, SamplingConfig(sampling.fanouts, size), graph.num_nodes, edges)
    sampler = NeighbourSampler(graph, [layer.edges for layer in graph_layers],
                               sampling.layer_fanouts(len(graph_layers)), seed)
    first = graph_layers[0].attr("strategy")
    merged_first = parts is not None and first in STRATEGIES and STRATEGIES[first].layout_in == "feature"

    def sizes(batches: list[np.ndarray], index0: int = 0) -> np.ndarray:
        """[batch, layer, (sources, destinations, edges)] of `batches` sampled."""
        out = np.zeros((max(len(batches), 1), len(graph_layers), 3))
        for index, batch in enumerate(batches):
            if len(batch):
                mb = sampler.sample(batch, 0, index0 + index)
                release_pages(graph)
                out[index] = [(b.n_src, b.n_dst, b.nnz) for b in mb.blocks]
        return out

    def priced(most: np.ndarray, factor: float, bound: tuple[LayerRows, ...]) -> tuple[LayerRows, ...]:
        return tuple(LayerRows(min(src * DRY_RUN_MARGIN, b.in_rows) * factor, 0,
                               min(dst * DRY_RUN_MARGIN, b.out_rows) * factor,
                               min(nnz * DRY_RUN_MARGIN, b.edges) * factor) for (src, dst, nnz), b in zip(most, bound))

    ranks = sorted(seeds)
    batches = sampler.epoch_batches(0, seeds[ranks[0]][0], sampling.batch_size)[:DRY_TRAIN_BATCHES]
    # [rank, batch, layer, 3]: each rank samples its own seeds of each global batch
    train = np.stack([sizes([b if parts is None else b[parts[b] == rank] for b in batches]) for rank in ranks])
    if merged_first:  # push-pull: every rank runs all ranks' first blocks at once (merge_blocks)
        train[:, :, 0] = train[:, :, 0].sum(axis=0)
    out = {}
    for k, rank in enumerate(ranks):
        labelled = seeds[rank][1]
        evaluated = sizes([labelled[lo:lo + size] for lo in range(0, len(labelled), size)][:DRY_EVAL_BATCHES],
                          len(batches))
        if merged_first:  # the other ranks' evaluation batches are pushed alike: priced as this rank's, times them
            evaluated[:, 0] *= len(ranks)
        out[rank] = (priced(train[k].max(axis=0), TRAIN_ACTIVATION_FACTOR, bound),
                     priced(evaluated.max(axis=0), EVAL_ACTIVATION_FACTOR, eval_bound))
    return out


def sampled_estimate(program, dims, heads, shapes, pairs: list[tuple[ProcessCounts, ProcessCounts]],
                     fused: bool) -> MemoryEstimate:
    """Each process's peak as the larger of its training step's and its evaluation's (`pairs`)."""
    est = run_memory(program, dims, heads, shapes, [p for pair in pairs for p in pair], fused=fused)
    per = tuple(max(est.per_process[2 * k], est.per_process[2 * k + 1]) for k in range(len(pairs)))
    return MemoryEstimate(per, est.terms, est.parameters)  # the terms: the largest of them all, the peak's


def sampled_rank_counts(program, sampling: SamplingConfig, shard_dir: str | Path,
                        manifest: dict[str, Any]) -> list[tuple[ProcessCounts, ProcessCounts]]:
    """Each rank of a sampled run on several processes (gnnc.plan.sampled_shards): its shard's arrays (loaded),
    its own per-vertex arrays and the sampler's, a gather's window of its mapped structure and features (not the
    whole features' file: a minibatch reads its rows a region at a time), and its activations on the largest blocks
    of a dry run of its own seeds, from the shards' structure (as rank 0 opens it)."""
    from gnnc.plan.sampled_shards import features_bytes, load_sampled_rank  # deferred: torch

    world = len(manifest["shards"])
    data = load_sampled_rank(shard_dir, 0, world)
    graph, parts = data.graph, data.parts
    n = graph.num_nodes
    edges = {"plain": graph.num_edges, "self_loops": non_loop_edges(graph) + n}
    views = {layer.edges for layer in program.graph_layers()}
    seeds = {rank: train_and_eval_seeds(graph, parts, rank) for rank in range(world)}
    layers = dry_run_layers(program, graph, sampling, edges, seeds, parts)
    per_vertex = sampler_bytes(graph, views, edges["self_loops"] - n) + RANK_VERTEX_BYTES * n
    window = min(GATHER_WINDOW_BYTES, max(features_bytes(entry) for entry in manifest["shards"]) + csr_bytes(graph))
    release_pages(graph)
    owned = np.bincount(parts, minlength=world)
    out = []
    for rank, entry in enumerate(manifest["shards"]):
        held = float(entry["bytes"] + per_vertex + RANK_OWNED_BYTES * int(owned[rank]) + window)
        out.append((ProcessCounts(layers[rank][0], held), ProcessCounts(layers[rank][1], held)))
    return out


def sampled_layers(program, sampling: SamplingConfig, num_nodes: int,
                   edges: dict[str, int]) -> tuple[LayerRows, ...]:
    """The rows and edges of the largest minibatch the fan-outs allow, per graph layer (first layer first).

    The last layer's destinations are the batch's seeds; each layer's sources are its destinations and up to
    a fan-out of sampled neighbours each, and they are the layer below's destinations. Every count is bounded
    by the graph: no more vertices than it has, no more edges than the layer's edge view (a fan-out of -1
    takes whole neighbourhoods, bounded by the view alone). An upper bound: seeds share neighbours.
    """
    graph_layers = program.graph_layers()
    fanouts = sampling.layer_fanouts(len(graph_layers))
    dst = min(sampling.batch_size, num_nodes)
    out = []
    for layer, fanout in zip(reversed(graph_layers), reversed(fanouts)):
        view_edges = edges[layer.edges]
        per_dst = fanout + (layer.edges == "self_loops")  # a kept self-loop beside the sampled neighbours
        sampled = view_edges if fanout == FULL else min(dst * per_dst, view_edges)
        src = min(dst + sampled, num_nodes)
        out.append(LayerRows(src, 0, dst, sampled))
        dst = src
    return tuple(reversed(out))


# a shard's global id per edge of each structure (int64 once loaded), which a rank lets go of where no graph layer
# reads it (gnnc.runtime.distributed.forget_edge_ids)
EDGE_ID_BYTES = 8
# what a rank saves per edge of a structure it holds by the source parts of a split exchange: their columns int32,
# not int64 as loaded (gnnc.runtime.distributed.narrow_part_sources)
NARROWED_COLUMN_BYTES = 4


def shard_counts(program, manifest: dict[str, Any]) -> list[ProcessCounts]:
    """Each rank's rows and edges per layer from its shard's layout, and the bytes its shard's arrays take once
    loaded (`loaded_bytes`: a shard stores shared arrays once and ids as int32; its file's size before it did), less
    its edges' global ids where no graph layer reads them and half the columns of a structure held by source parts
    (int32 on the rank)."""
    ids_kept = any(reads_edge_ids(layer) for layer in program.graph_layers())
    by_parts = [layer.name for layer in program.graph_layers()
                if split_exchange(layer) is not None and not layer_schedule(layer).binned]
    out = []
    for entry in manifest["shards"]:
        layout = entry["layout"]["layers"]
        # a pipeline shard's layers name no structure: its worker keeps every id and column as loaded
        structures = {info["structure"]: info["nnz"] for info in layout.values() if "structure" in info}
        # (a shard's `loaded_bytes` counts them only where they are kept, each array once: layers share them)
        forgotten = 0 if ids_kept or "loaded_bytes" in entry else EDGE_ID_BYTES * sum(structures.values())
        narrowed = {layout[name]["structure"]: layout[name]["nnz"] for name in by_parts if "structure" in layout[name]
                    and max(layout[name]["nnz"], layout[name].get("n_src") or 0) < 2**31 - 1}
        forgotten += NARROWED_COLUMN_BYTES * sum(narrowed.values())
        layers = []
        for k, layer in enumerate(program.graph_layers()):
            info = layout[layer.name]
            pushpull = entry["layout"].get("pushpull")
            if k == 0 and pushpull is not None:
                # P3: partial results of every vertex from a slice of the features, summed at the owners
                n, (lo, hi) = manifest["num_nodes"], pushpull["cols"]
                layers.append(LayerRows(n, 0, n + info["n_out"], pushpull["nnz"], in_width=hi - lo))
                continue
            n_src = info.get("n_src") or info["n_in"]
            layers.append(LayerRows(info["n_in"], max(n_src - info["n_in"], 0), info["n_out"], info["nnz"]))
        out.append(ProcessCounts(tuple(layers), float(entry.get("loaded_bytes", entry["bytes"]) - forgotten)))
    return out


def check_run_memory(plan: Plan, graph: Graph | None = None, shard_dir: str | Path | None = None,
                     warn: Callable[[str], None] | None = None, device: str = "cpu",
                     recompute: bool = False) -> MemoryEstimate:
    """Refuse (GnncError) a run predicted not to fit in the memory available; warn when it comes close.

    With `graph`, the run is in this process, which already holds part of what it needs (the
    interpreter, the graph): only the rest must be available. With `shard_dir`, the run starts one
    new process per shard. On `device` "cuda" each process's device terms are checked against its GPU's
    free memory, and the host only for the interpreter and the graph (see the module docstring).
    """
    estimate = estimate_run_memory(plan, graph, shard_dir, recompute)
    if device == "cuda":
        _check_devices(estimate, warn)
    room = available_memory()
    if room is None:
        return estimate
    held = (resident_bytes() or 0) if shard_dir is None else 0
    # on CUDA the host holds each process's interpreter and graph only (the largest process's, for every process)
    host_total = estimate.total if device != "cuda" else len(estimate.per_process) * _host_terms(estimate)
    need = max(host_total - held, 0.0)
    if need > room.bytes:
        raise GnncError(describe(estimate, need, room))
    if need > WARN_FRACTION * room.bytes:
        (warn or _stderr)(f"warning: this run is predicted to need {format_bytes(need)} more memory, "
                          f"{need / room.bytes:.0%} of the {room}")
    return estimate


# rows per chunk of a layer-wise evaluation the run chooses itself: measured on a 200K-vertex R-MAT (GCN, hidden 256,
# one process, torch's allocator), 16,384 rows held 22 MiB above the two [rows, 256] tensors, 65,536 rows 124 MiB
EVAL_CHUNK_ROWS = 16_384


def evaluation_chunk(estimate: MemoryEstimate, asked: int | None, device: str = "cpu") -> int:
    """Rows per chunk of the run's evaluation (TrainConfig.eval_chunk; 0: whole layers): `asked` (--eval-chunk)
    when given; else layer-wise (gnnc.runtime.layerwise) where the whole forward's evaluation would not fit beside
    the run, that is on several processes predicted above WARN_FRACTION of the memory available: a rank runs its
    graph layers equation by equation and holds every edge value of a layer at once (GAT's scores, their softmax
    and weights). One process runs them as fused chains that hold no edge value (gnnc.runtime.fusion), which a
    layer-wise evaluation would give up: measured on the 200K R-MAT (GAT 8 x 32), its whole evaluation rose 521
    MiB, layer-wise 774 MiB, 4.5x slower; it runs layer-wise only when asked."""
    if asked is not None:
        return asked
    if len(estimate.per_process) < 2:
        return 0
    room = available_memory() if device != "cuda" else None
    if room is None:
        return 0
    return EVAL_CHUNK_ROWS if estimate.total > WARN_FRACTION * room.bytes else 0


# the terms of a process that a CUDA run keeps in the host's memory: the interpreter, and the graph it loads there
# before copying it to its GPU
HOST_TERMS = ("process", "graph")


def _host_terms(estimate: MemoryEstimate) -> float:
    return sum(estimate.terms[k] for k in HOST_TERMS)


def device_free_memory(index: int) -> AvailableMemory:
    """What GPU `index` has free now (torch.cuda.mem_get_info: what the driver says, other processes' use
    included)."""
    import torch  # deferred: `gnnc check` and a CPU run's pre-check load no torch here

    free, _total = torch.cuda.mem_get_info(index)
    return AvailableMemory(int(free), f"free on cuda:{index}, torch.cuda.mem_get_info")


def _check_devices(estimate: MemoryEstimate, warn: Callable[[str], None] | None) -> None:
    """Each process's device terms (its total less the interpreter, `process`) against the free memory of its GPU,
    GPU i for rank i. The graph is counted on both sides: a process loads it on the host and copies it."""
    baseline = estimate.terms["process"]
    for rank, total in enumerate(estimate.per_process):
        need = total - baseline
        room = device_free_memory(rank)
        if need > room.bytes:
            who = "this run" if len(estimate.per_process) == 1 else f"rank {rank} of this run"
            terms = " + ".join(f"{name} {format_bytes(v)}" for name, v in estimate.terms.items() if name != "process")
            raise GnncError(f"{who} is predicted to need {format_bytes(need)} on its GPU, more than the {room}; "
                            f"the largest process needs {terms}. Make the model smaller (--set), or run it on "
                            "more GPUs (--nproc)")
        if need > WARN_FRACTION * room.bytes:
            (warn or _stderr)(f"warning: this run is predicted to need {format_bytes(need)} on cuda:{rank}, "
                              f"{need / room.bytes:.0%} of the {room}")


def describe(estimate: MemoryEstimate, need: float, room: AvailableMemory) -> str:
    """Why a run does not fit: the need, the largest process's terms and its largest parameter."""
    n = len(estimate.per_process)
    terms = " + ".join(f"{name} {format_bytes(v)}" for name, v in estimate.terms.items())
    if n > 1:
        text = (f"this run's {n} worker processes are predicted to need {format_bytes(need)} in all, more than "
                f"the {room}; the largest needs {terms}")
    else:
        text = (f"this run is predicted to need {format_bytes(need)} more than this process holds, more than the "
                f"{room}; in all it needs {terms}")
    if estimate.parameters:
        p = estimate.parameters[0]
        text += f"; the largest parameter is {p.name} {p.shape} ({format_bytes(p.bytes)})"
    return text + ". Make the model smaller (--set), or run it on more or larger machines"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


# ----- several processes, before the graph is loaded (issue 35): the launcher loads the whole graph and partitions it
# before the shards exist that `check_run_memory` counts, which at ogbn-products' size held 17.8 GiB for 4 minutes
# before a refusal. What the graph's spec or store says of its size, read in milliseconds, prices the ranks first.


@dataclass(frozen=True)
class GraphCounts:
    """A graph's size as its spec or its store's manifest gives it, without loading it."""

    vertices: int
    edges: int
    features: int
    classes: int
    launcher_bytes: int  # what the launcher reads to partition it and write the shards: a store's arrays, or the
    # generated graph's features, labels and edge list


def graph_counts(spec: Any) -> GraphCounts | None:
    """The counts of a graph named by a store directory or an `rmat:` spec; None for anything else (a file, a
    dataset: those are loaded first and checked by their shards). A store's classes come from its labels' file
    (mapped, one pass over N labels)."""
    if not isinstance(spec, (str, Path)):
        return None
    path = Path(spec)
    if path.is_dir() and is_store(path):
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        arrays = manifest.get("arrays", {})
        x, y = arrays.get("x"), arrays.get("y")
        if x is None or y is None or len(x["shape"]) != 2 or len(y["shape"]) != 1:
            return None
        labels = np.load(path / y["file"], mmap_mode="r")
        classes = int(labels.max()) + 1 if labels.size else 0
        return GraphCounts(int(manifest["num_nodes"]), int(manifest["num_edges"]), int(x["shape"][1]), classes,
                           sum(int(a["bytes"]) for a in arrays.values()))
    if not str(spec).startswith("rmat:"):
        return None
    _, p = parse_spec(str(spec))
    n, features = int(p["n"]), int(p["features"])
    edges = 2 * max(1, int(round(n * float(p["deg"]) / 2)))  # undirected pairs, both ways (generators.rmat)
    return GraphCounts(n, edges, features, int(p["classes"]), n * (features * 4 + 8 + 3) + edges * 2 * 8)


def check_ranks_before_loading(program, counts: GraphCounts, workers: int,
                               warn: Callable[[str], None] | None = None) -> MemoryEstimate:
    """Refuse (GnncError) a run of `workers` processes on a graph of `counts` that cannot fit even at best: every
    rank holding an even share of the rows and edges and no halo row, its shard its features and 8 bytes per
    edge; or, before the ranks start, the launcher's reading of the whole graph (`GraphCounts.launcher_bytes`). A
    lower bound of what `check_run_memory` prices from the shards later, so that no run it would admit is refused
    here; `program`: the model compiled for the graph's widths (a stand-in graph of two vertices will do:
    `stand_in_graph`)."""
    dims, heads = layer_dims(program)
    needs = param_dependent(program)
    graph_layers = program.graph_layers()
    shapes = [layer_shape(layer, needs) for layer in graph_layers]
    rows = math.ceil(counts.vertices / workers)
    layers = tuple(LayerRows(rows, 0, rows, math.ceil(
        (counts.edges + (counts.vertices if layer.edges == "self_loops" else 0)) / workers)) for layer in graph_layers)
    shard = rows * (counts.features * 4 + 8 + 3) + math.ceil(counts.edges / workers) * 8
    estimate = run_memory(program, dims, heads, shapes, [ProcessCounts(layers, float(shard))] * workers, fused=False)
    room = available_memory()
    if room is None:
        return estimate
    # the launcher reads and partitions the graph before any rank starts, and lets go of what it derived before they
    # do (gnnc.runtime.distributed.let_go_of_graph): the larger of the two phases, not their sum (at ogbn-products'
    # size, GCN 256 on 2 ranks, the sum refused a run whose ranks are projected at 8.2 GiB each, issue 35)
    need = max(estimate.total, float(counts.launcher_bytes))
    if need > room.bytes:
        terms = " + ".join(f"{name} {format_bytes(v)}" for name, v in estimate.terms.items())
        raise GnncError(f"this run's {workers} worker processes are predicted to need at least "
                        f"{format_bytes(estimate.total)} in all (each with an even share of the graph's "
                        f"{counts.vertices:,} vertices and {counts.edges:,} edges and no halo: {terms}), or loading "
                        f"and partitioning the graph before they start at least "
                        f"{format_bytes(counts.launcher_bytes)}: more than the "
                        f"{room}, refused before loading it. Make the model smaller (--set), or run it on more or "
                        "larger machines")
    return estimate


def stand_in_graph(counts: GraphCounts) -> Graph:
    """Two vertices with the counts' features and classes: what compiling a model for the graph's widths reads."""
    import torch  # deferred: `gnnc check` loads no torch here

    return Graph(2, np.array([0, 1]), np.array([1, 0]), torch.zeros(2, counts.features),
                 torch.tensor([0, max(counts.classes - 1, 0)]), torch.tensor([True, False]),
                 torch.tensor([False, True]), torch.tensor([False, False]), "stand-in")
