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
time, not the whole graph's rows: its activations are priced on the largest
batch the fan-outs allow (`sampled_layers`: the batch's seeds, and at each
layer outward every destination's fan-out of sources, bounded by the graph),
its graph term is what each rank loads (the whole graph in one process, its
sampled shard in N).

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
from gnnc.graph.sampling import FULL, SamplingConfig, reads_edge_ids
from gnnc.graph.store import MANIFEST, is_store
from gnnc.host import AvailableMemory, available_memory, format_bytes, resident_bytes
from gnnc.ir import Program
from gnnc.passes.analysis.layers import layer_dims, param_dependent
from gnnc.passes.cost.memory import WARN_FRACTION, LayerRows, MemoryEstimate, ProcessCounts, run_memory
from gnnc.passes.cost.symbols import layer_shape
from gnnc.plan.plan_file import Plan
from gnnc.plan.schedule_attrs import layer_schedule, split_exchange
from gnnc.plan.sampled_shards import features_bytes
from gnnc.plan.shard_files import read_manifest



def estimate_run_memory(plan: Plan, graph: Graph | None = None,
                        shard_dir: str | Path | None = None, recompute: bool = False) -> MemoryEstimate:
    """Predicted peak bytes of each process: one process on `graph`, or one per shard in `shard_dir`; `recompute`:
    the run keeps graph layers' inputs only (--recompute)."""
    program = plan.program
    dims, heads = layer_dims(program)
    needs = param_dependent(program)
    shapes = [layer_shape(layer, needs) for layer in program.graph_layers()]
    if shard_dir is not None:
        manifest = read_manifest(shard_dir)
        if plan.sampling is not None:
            layers = sampled_layers(program, plan.sampling, int(manifest["num_nodes"]),
                                    {"plain": int(manifest["num_edges"]),
                                     "self_loops": int(manifest["num_edges"]) + int(manifest["num_nodes"])})
            # a rank maps its features' file (gnnc.plan.sampled_shards): the pages an epoch reads count in its RSS
            processes = [ProcessCounts(layers, float(entry["bytes"] + features_bytes(entry)))
                         for entry in manifest["shards"]]
        else:
            processes = shard_counts(program, manifest)
    elif graph is not None:
        processes = [single_process_counts(program, graph, plan.sampling)]
    else:
        raise ValueError("estimate_run_memory needs the graph (one process) or the shards (several)")
    # a rank runs no fused chain (gnnc.runtime.fusion): its attention holds per-edge values one process does not
    return run_memory(program, dims, heads, shapes, processes, recompute=recompute, fused=shard_dir is None,
                      first_in_blocks=recompute and shard_dir is None and first_layer_in_blocks(program))


def first_layer_in_blocks(program: Program) -> bool:
    """Whether --recompute runs `program`'s first graph layer in blocks (gnnc.runtime.recompute.first_layer)."""
    from gnnc.runtime import fusion, recompute  # deferred: torch, which `gnnc check` does not load
    return recompute.first_layer(program, fusion.find_chains(program)) is not None


def single_process_counts(program, graph: Graph, sampling: SamplingConfig | None = None) -> ProcessCounts:
    """One process holds the whole graph, and every row and edge of every layer (or, sampled, one batch's)."""
    n = graph.num_nodes
    edges = {"plain": graph.num_edges,
             "self_loops": int(np.count_nonzero(np.asarray(graph.src) != np.asarray(graph.dst))) + n}
    if sampling is None:
        layers = tuple(LayerRows(n, 0, n, edges[layer.edges]) for layer in program.graph_layers())
    else:
        layers = sampled_layers(program, sampling, n, edges)
    arrays = [graph.x, graph.y, graph.train_mask, graph.val_mask, graph.test_mask, *graph.edge_data.values()]
    held = sum(t.numel() * t.element_size() for t in arrays) + np.asarray(graph.src).nbytes * 2
    return ProcessCounts(layers, float(held))


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
