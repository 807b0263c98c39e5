"""What each rank of a sampled-minibatch plan loads: the structure, its features, the labels.

Why this module exists: sampled minibatch strategies (dp-sample, pushpull
with `--fanout`) hold data differently from full-graph ones. Every rank keeps
the whole graph *structure* (P3 section 3.1: the structure fits where the
features do not, so it is replicated and each rank samples locally), the
labels and masks, the part of every vertex, and its share of the
*features*: its own vertices' rows under dp-sample (DistDGL: remote rows are
pulled when sampled) or one slice of the feature columns of every vertex
under pushpull (P3: features split along the feature dimension). A shard is
plain arrays (no pickle) beside the manifest of gnnc.plan.shard_files:

  src, dst        the edge list (the structure every rank samples from)
  parts           the owner of every vertex
  y, train, val, test
  x               rows of the owned vertices (layout "rows") or columns [c0, c1) of every vertex ("columns")
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError, PlanError
from gnnc.graph import Graph
from gnnc.plan.shard_files import load_npz, read_manifest, write_manifest, write_npz
from gnnc.plan.slices import feature_slices
from gnnc.plan.strategies import STRATEGIES

# How ranks hold the features, by the layout their first graph layer's strategy reads (StrategyDef.layout_in)
SAMPLED_LAYOUTS = {"vertex": "rows", "feature": "columns"}
LAYOUTS = tuple(SAMPLED_LAYOUTS.values())


def feature_layout(program) -> str:
    """How a sampled plan's ranks hold the features: columns when its first graph layer runs on a feature slice."""
    return SAMPLED_LAYOUTS[STRATEGIES[program.graph_layers()[0].attr("strategy")].layout_in]


@dataclass
class SampledRankData:
    """One rank's shard, loaded: the structure as a Graph (no features), its features and the owners."""

    graph: Graph  # structure, labels and masks; x has no columns
    features: torch.Tensor  # [owned, F] (rows) or [N, c1 - c0] (columns)
    layout: str
    parts: np.ndarray
    cols: tuple[int, int]
    num_features: int


def write_sampled_shards(program, graph: Graph, parts: np.ndarray, world: int,
                         out_dir: str | os.PathLike) -> dict[str, Any]:
    if graph.edge_data:
        raise GnncError(f"graph '{graph.name}' has edge data ({', '.join(sorted(graph.edge_data))}), which "
                        "sampled minibatches on several workers do not carry yet; train it on one process "
                        "(--nproc 1) or full-graph")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = feature_layout(program)
    slices = feature_slices(graph.num_features, world)
    common = {"src": np.asarray(graph.src, dtype=np.int64), "dst": np.asarray(graph.dst, dtype=np.int64),
              "parts": np.asarray(parts, dtype=np.int64), "y": graph.y.numpy(), "train": graph.train_mask.numpy(),
              "val": graph.val_mask.numpy(), "test": graph.test_mask.numpy()}
    entries = []
    for rank in range(world):
        if layout == "rows":
            x = graph.x.numpy()[np.nonzero(common["parts"] == rank)[0]]
        else:
            x = graph.x.numpy()[:, slices[rank][0]:slices[rank][1]]
        entries.append(write_npz(out / f"rank-{rank:05d}.npz", rank, {**common, "x": np.ascontiguousarray(x)},
                                 cols=list(slices[rank])))
    write_manifest(out, {"kind": "sampled", "layout": layout, "graph": graph.name, "num_nodes": graph.num_nodes,
                         "num_edges": graph.num_edges, "num_features": graph.num_features,
                         "num_classes": graph.num_classes, "parts": world, "shards": entries})
    return read_manifest(out)


def check_sampled_shards_match(manifest: dict[str, Any], program, where: str) -> None:
    """Refuse sampled shards whose feature layout is not what the plan's first layer reads (an edited IR)."""
    want = feature_layout(program)
    if manifest.get("layout") != want:
        raise PlanError(f"{where}: the plan's first graph layer runs "
                        f"{program.graph_layers()[0].attr('strategy')}, which reads the features by {want}, but its "
                        f"shards hold them by {manifest.get('layout')}: the IR was edited after compiling; compile "
                        f"the plan again")


def load_sampled_rank(shard_dir: str | os.PathLike, rank: int, world: int) -> SampledRankData:
    """Rank `rank`'s shard, checked against the manifest before anything is read."""
    manifest = read_manifest(shard_dir)
    if manifest.get("kind") != "sampled" or manifest.get("layout") not in LAYOUTS:
        raise PlanError(f"{shard_dir}: these are not the shards of a plan for sampled minibatches")
    if manifest["parts"] != world:
        raise PlanError(f"{shard_dir}: the shards are for {manifest['parts']} ranks; this job has {world}")
    a = load_npz(shard_dir, manifest, rank)
    n = int(manifest["num_nodes"])
    for name in ("parts", "y", "train", "val", "test"):
        if a[name].shape != (n,):
            raise PlanError(f"{shard_dir}: field '{name}' of rank {rank}'s shard has shape {a[name].shape}, "
                            f"expected ({n},)")
    src, dst = a["src"], a["dst"]
    if src.shape != dst.shape or (len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n)):
        raise PlanError(f"{shard_dir}: the edge list of rank {rank}'s shard does not fit {n} vertices")
    cols = tuple(int(c) for c in manifest["shards"][rank]["cols"])
    graph = Graph(n, src, dst, torch.zeros((n, 0)), torch.from_numpy(a["y"]), torch.from_numpy(a["train"]),
                  torch.from_numpy(a["val"]), torch.from_numpy(a["test"]), name=str(manifest["graph"]))
    return SampledRankData(graph, torch.from_numpy(a["x"]), str(manifest["layout"]), a["parts"], cols,
                           int(manifest["num_features"]))
