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

and, beside it, the rank's features as their own `.npy` (`rank-NNNNN.x.npy`, its size, shape and sha256 in the
manifest's entry of the rank, under "x"): rows of the owned vertices (layout "rows") or columns [c0, c1) of every
vertex ("columns"). A rank memory-maps that file (as `--graph DIR` maps a graph store, gnnc.graph.store) and
gathers only the rows a minibatch samples, so its resident set is the structure's, not its share of the features.
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
from gnnc.graph.store import _open_array, _save, _tensor, release_pages
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
    features: torch.Tensor  # [owned, F] (rows) or [N, c1 - c0] (columns), over the mapped file (read-only)
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
        features = _save(out, _features_name(rank), x)
        del x
        release_pages(graph)  # a store's pages read for this rank (a graph in memory has none)
        entries.append(write_npz(out / f"rank-{rank:05d}.npz", rank, common, cols=list(slices[rank]), x=features))
    write_manifest(out, {"kind": "sampled", "layout": layout, "graph": graph.name, "num_nodes": graph.num_nodes,
                         "num_edges": graph.num_edges, "num_features": graph.num_features,
                         "num_classes": graph.num_classes, "parts": world, "shards": entries})
    return read_manifest(out)


def _features_name(rank: int) -> str:
    return f"rank-{rank:05d}.x"


def features_bytes(entry: dict[str, Any]) -> int:
    """The size of the features file a rank's shard entry describes (0 where it describes none: such shards are
    refused when a rank opens them)."""
    x = entry.get("x")
    size = x.get("bytes") if isinstance(x, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0


def _open_features(shard_dir: str | os.PathLike, manifest: dict[str, Any], rank: int) -> np.ndarray:
    """Rank `rank`'s features, memory-mapped read-only once the file matches the manifest's size, checksum,
    dtype and shape. The file is the one the rank's name gives, never a path read from the manifest."""
    entry = manifest["shards"][rank].get("x")
    name = _features_name(rank)
    if not (isinstance(entry, dict) and entry.get("file") == f"{name}.npy" and entry.get("dtype") == "float32"
            and isinstance(entry.get("shape"), list) and len(entry["shape"]) == 2
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry["shape"])
            and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)):
        raise PlanError(f"{shard_dir}: rank {rank}'s shard entry must describe its features as {name}.npy (float32 "
                        f"[rows, columns], size and sha256); shards written before they were mapped hold them "
                        f"inside the .npz: compile the plan again")
    try:
        return _open_array(Path(shard_dir), "x", entry, [])
    except GnncError as err:  # missing, truncated or altered: the plan's shards are damaged
        raise PlanError(str(err)) from None


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
    x = _open_features(shard_dir, manifest, rank)
    want = (int(np.count_nonzero(a["parts"] == rank)), int(manifest["num_features"])) \
        if manifest["layout"] == "rows" else (n, cols[1] - cols[0])
    if x.shape != want:
        raise PlanError(f"{shard_dir}: rank {rank}'s features have shape {list(x.shape)}, expected {list(want)}")
    graph = Graph(n, src, dst, torch.zeros((n, 0)), torch.from_numpy(a["y"]), torch.from_numpy(a["train"]),
                  torch.from_numpy(a["val"]), torch.from_numpy(a["test"]), name=str(manifest["graph"]))
    return SampledRankData(graph, _tensor(x), str(manifest["layout"]), a["parts"], cols,
                           int(manifest["num_features"]))
