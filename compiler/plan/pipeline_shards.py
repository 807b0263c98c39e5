"""What each rank of a pipeline plan loads: its member's rows, its stage's chunk structures, their inputs.

A pipeline rank (member g of stage s, gnnc.plan.pipeline) computes its
stage's layers on the rows of sub-chunk g of every chunk, over the whole
graph; its shard holds, as plain arrays (no pickle) with the manifest of
gnnc.plan.shard_files:

  rows, chunk_ptr           the member's rows (chunk by chunk, global id inside one) and each chunk's offset
  <view>.c<k>.indptr/indices/eids/norm   chunk k's in-edges over [own rows; ext rows]
  <view>.ext, <view>.ext_ptr, <view>.n_peer   the ext rows of every chunk (peer rows first), their offsets
  <view>.c<k>.send_ptr/send_idx/recv     chunk k's group exchange (more than one worker per stage)
  <view>.c<k>.later.*, <view>.later, <view>.later_ptr   the rows chunk k hands to the peers' histories
  <view>.refresh.*, <view>.refresh_ids   the peer rows a full pass fetches (more than one worker per stage)
  x                          the input features of its rows (only when its stage reads them)
  y, train, val, test        the labels and split masks of its rows

packed as every plan shard (gnnc.plan.shard_files.pack_arrays). Only the edge views its stage's history layers read are stored. The
manifest's layout entry names the stage, the member and the views.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gnnc.errors import PlanError
from gnnc.graph import Graph, GraphView, sparse_if_sparse
from gnnc.plan import pipeline as plan_pipeline
from gnnc.plan.pipeline import ChunkStructure, MemberStructures
from gnnc.plan.rows import layer_specs
from gnnc.plan.shard_files import ShardWriter, load_npz, read_manifest, unpack_arrays
from gnnc.plan.shards import _csr_arrays, _plan_arrays, _plan_from, _view_from  # the plan's shard encodings
from gnnc.plan.shards import take_rows, write_packed, write_plan_manifest


def stage_views(program, sched: plan_pipeline.PipelineSchedule, stage: int) -> list[str]:
    """The edge views stage `stage`'s history layers read, sorted."""
    return sorted({layer.edges for layer in sched.layers(program, stage) if plan_pipeline.history_values(layer)})


def write_pipeline_shards(program, graph: Graph, parts: np.ndarray, world: int, out_dir: str | os.PathLike,
                          progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Every rank's shard of a pipeline plan (`parts`: its chunking) and the manifest."""
    sched = plan_pipeline.schedule_of(program)
    if sched.workers != world:
        raise PlanError(f"the pipeline has {sched.stages} stages of {sched.groups} workers, not {world} workers")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    views = sorted({v for s in range(sched.stages) for v in stage_views(program, sched, s)})
    structures = {v: plan_pipeline.member_structures(graph, v, parts, sched.chunks, sched.groups) for v in views}
    specs = layer_specs(program)
    with ShardWriter() as writer:
        for rank in range(world):
            stage, member = sched.stage_of_rank(rank), sched.member_of_rank(rank)
            rows, chunk_ptr = plan_pipeline.member_rows(parts, sched.chunks, sched.groups, member)
            arrays: dict[str, np.ndarray] = {"rows": rows, "chunk_ptr": chunk_ptr}
            mine = stage_views(program, sched, stage)
            layers = _layer_layout(program, sched, stage, specs, {v: structures[v][member] for v in mine},
                                   len(rows), graph.num_nodes)
            for v in mine:
                arrays.update(_member_arrays(v, structures[v][member]))
            if "x" in plan_pipeline.reads_inputs(program, sched.layers(program, stage)):
                arrays["x"] = take_rows(graph.x, rows)
            idx = torch.as_tensor(rows)
            arrays["y"] = graph.y[idx].numpy()
            for name, mask in (("train", graph.train_mask), ("val", graph.val_mask), ("test", graph.test_mask)):
                arrays[name] = mask[idx].numpy()
            layout = {"pipeline": {"stage": stage, "member": member, "views": mine, "stages": sched.stages,
                                   "groups": sched.groups, "chunks": sched.chunks},
                      "layers": layers}
            write_packed(writer, out / f"rank-{rank:05d}.npz", rank, arrays, layout)
            if progress is not None:
                progress(rank)
        entries = writer.entries()
    return write_plan_manifest(out, graph, world, entries)


def _layer_layout(program, sched: plan_pipeline.PipelineSchedule, stage: int, specs, structures, rows: int,
                  n: int) -> dict[str, dict]:
    """Per graph layer what the plan's checks read: the strategy it was cut for (gnnc.plan.shards.
    check_shards_match) and the rows and edges this rank holds for it (gnnc.memory_check): its rows, every
    chunk's ext rows and the N-row history as the rows it aggregates from beside them; nothing for
    another stage's layers."""
    mine = {layer.name for layer in sched.layers(program, stage)}
    out = {}
    for spec in specs:
        entry = {"strategy": spec.strategy, "segment": spec.segment, "view": spec.view, "n_in": 0, "n_out": 0,
                 "n_src": 0, "nnz": 0}
        if spec.name in mine and spec.view in structures:
            chunks = structures[spec.view].chunks
            ext = sum(len(c.ext_ids) for c in chunks)
            entry.update(n_in=rows, n_out=rows, n_src=rows + ext + n, nnz=sum(c.view.csr.nnz for c in chunks))
        elif spec.name in mine:
            entry.update(n_in=rows, n_out=rows, n_src=rows)
        out[spec.name] = entry
    return out


def _member_arrays(view: str, member: MemberStructures) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    ext_ptr = np.zeros(len(member.chunks) + 1, dtype=np.int64)
    later_ptr = np.zeros(len(member.chunks) + 1, dtype=np.int64)
    for k, chunk in enumerate(member.chunks):
        arrays.update(_csr_arrays(f"{view}.c{k}", chunk.view))
        if chunk.halo is not None:
            arrays.update(_plan_arrays(f"{view}.c{k}", chunk.halo))
            arrays.update(_plan_arrays(f"{view}.c{k}.later", chunk.later))
        ext_ptr[k + 1] = ext_ptr[k] + len(chunk.ext_ids)
        later_ptr[k + 1] = later_ptr[k] + len(chunk.later_ids)
    arrays[f"{view}.ext"] = (torch.cat([c.ext_ids for c in member.chunks]).numpy() if member.chunks
                             else np.zeros(0, np.int64))
    arrays[f"{view}.ext_ptr"] = ext_ptr
    arrays[f"{view}.later"] = (torch.cat([c.later_ids for c in member.chunks]).numpy() if member.chunks
                               else np.zeros(0, np.int64))
    arrays[f"{view}.later_ptr"] = later_ptr
    arrays[f"{view}.n_peer"] = np.array([c.n_peer for c in member.chunks], dtype=np.int64)
    if member.refresh is not None:
        arrays.update(_plan_arrays(f"{view}.refresh", member.refresh))
        arrays[f"{view}.refresh_ids"] = member.refresh_ids.numpy()
    return arrays


@dataclass
class PipelineRankData:
    """One pipeline rank's shard, loaded.

    rows, chunk_ptr: its rows in member order and each chunk's offset; structures[view]: its chunks
    over that view; inputs: x (when its stage reads it), y and the masks, on its rows.
    """

    stage: int
    member: int
    rows: torch.Tensor
    chunk_ptr: list[int]
    structures: dict[str, MemberStructures]
    inputs: dict[str, torch.Tensor]
    num_nodes: int
    num_features: int
    num_classes: int
    train_count: float
    graph_name: str


def load_pipeline_rank(shard_dir: str | os.PathLike, rank: int, world: int,
                       sched: plan_pipeline.PipelineSchedule) -> PipelineRankData:
    """Rank `rank`'s shard of the pipeline `sched`, checked against the manifest before anything is read."""
    manifest = read_manifest(shard_dir)
    if manifest.get("kind") != "plan" or manifest.get("parts") != world:
        raise PlanError(f"{shard_dir}: not the shards of a plan for {world} ranks")
    layout = manifest["shards"][rank].get("layout", {}).get("pipeline")
    if not isinstance(layout, dict):
        raise PlanError(f"{shard_dir}: rank {rank}'s shard is not a pipeline rank's (compile the plan again)")
    cut = tuple(layout.get(k) for k in ("stage", "member", "stages", "groups", "chunks"))
    if cut != (sched.stage_of_rank(rank), sched.member_of_rank(rank), sched.stages, sched.groups, sched.chunks):
        raise PlanError(f"{shard_dir}: rank {rank}'s shard was cut for another pipeline (stage, member, stages, "
                        f"groups, chunks {list(cut)}) than the plan's IR states: compile the plan again")
    groups = sched.groups
    arrays = unpack_arrays(load_npz(shard_dir, manifest, rank), manifest["shards"][rank]["layout"].get("packing", {}),
                           f"{shard_dir}: rank {rank}'s shard")
    chunk_ptr = [int(c) for c in arrays["chunk_ptr"]]
    structures = {}
    for view in layout["views"]:
        ext, ext_ptr, n_peer = (torch.from_numpy(arrays[f"{view}.ext"].astype(np.int64)), arrays[f"{view}.ext_ptr"],
                                arrays[f"{view}.n_peer"])
        later, later_ptr = torch.from_numpy(arrays[f"{view}.later"].astype(np.int64)), arrays[f"{view}.later_ptr"]
        chunks = []
        for k in range(len(chunk_ptr) - 1):
            n_own = chunk_ptr[k + 1] - chunk_ptr[k]
            ids = ext[int(ext_ptr[k]):int(ext_ptr[k + 1])]
            chunk = ChunkStructure(_view_from(arrays, f"{view}.c{k}", n_own + len(ids)), ids, int(n_peer[k]), None)
            if groups > 1:
                chunk.halo = _plan_from(arrays, f"{view}.c{k}", groups)
                chunk.later = _plan_from(arrays, f"{view}.c{k}.later", groups)
                chunk.later_ids = later[int(later_ptr[k]):int(later_ptr[k + 1])]
            chunks.append(chunk)
        refresh, refresh_ids = None, torch.zeros(0, dtype=torch.int64)
        if groups > 1:
            refresh = _plan_from(arrays, f"{view}.refresh", groups)
            refresh_ids = torch.from_numpy(arrays[f"{view}.refresh_ids"].astype(np.int64))
        structures[view] = MemberStructures(chunks, refresh, refresh_ids)
    inputs = {name: torch.from_numpy(arrays[name]) for name in ("y", "train", "val", "test")}
    if "x" in arrays:
        inputs["x"] = sparse_if_sparse(torch.from_numpy(arrays["x"]))
    return PipelineRankData(int(layout["stage"]), int(layout["member"]),
                            torch.from_numpy(arrays["rows"].astype(np.int64)), chunk_ptr, structures, inputs,
                            int(manifest["num_nodes"]), int(manifest["num_features"]), int(manifest["num_classes"]),
                            float(max(manifest["train_count"], 1)), str(manifest["graph"]))


def chunk_view(data: PipelineRankData, view: str, chunk: int) -> GraphView:
    """The view chunk `chunk` of this rank aggregates over."""
    return data.structures[view].chunks[chunk].view
