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

  parts           the owner of every vertex
  y, train, val, test

and, beside it, as `.npy` files every rank memory-maps (as `--graph DIR` maps a graph store, gnnc.graph.store):

  graph.src, graph.dst                              the edge list, written once for every rank
  graph.in.indptr, graph.in.indices, graph.in.eids  its in-edge CSR (Graph.csr("plain")), what the sampler reads
  rank-NNNNN.x                                      the rank's features: rows of the owned vertices (layout
                                                    "rows") or columns [c0, c1) of every vertex ("columns")

each with its size, dtype, shape and sha256 in the manifest ("structure"; a rank's entry's "x"). A rank gathers
only the feature rows a minibatch samples and reads only the CSR rows it samples, letting their pages go after
each minibatch (`release_pages`), so its resident set is near a minibatch's, not the graph's: the edge list in
each rank's memory, and the sampler's CSR built from it, were 24 bytes per edge per rank (40 GiB at papers100M).
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError, PlanError
from gnnc.graph import CSR, Graph
from gnnc.graph.storage import index_dtype
from gnnc.graph.sampling import take
from gnnc.graph.store import (BLOCK_BYTES, _check_indptr, _check_range, _npy_writer, _open_array, _tensor,
                              keep_mapped_files, mapped_files, release_pages)
from gnnc.plan.shard_files import load_npz, read_manifest, write_manifest, write_npz
from gnnc.plan.slices import feature_slices
from gnnc.plan.strategies import STRATEGIES

# How ranks hold the features, by the layout their first graph layer's strategy reads (StrategyDef.layout_in)
SAMPLED_LAYOUTS = {"vertex": "rows", "feature": "columns"}
LAYOUTS = tuple(SAMPLED_LAYOUTS.values())
STRUCTURE = ("src", "dst", "in.indptr", "in.indices", "in.eids")  # the graph's arrays every rank maps


def feature_layout(program) -> str:
    """How a sampled plan's ranks hold the features: columns when its first graph layer runs on a feature slice."""
    return SAMPLED_LAYOUTS[STRATEGIES[program.graph_layers()[0].attr("strategy")].layout_in]


@dataclass
class SampledRankData:
    """One rank's shard, loaded: the structure as a Graph (no features), its features and the owners."""

    graph: Graph  # structure (mapped; its plain CSR the shards'), labels and masks; x has no columns;
    # release_pages(graph) lets go of the pages read of the structure and the features
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
    common = {"parts": np.asarray(parts, dtype=np.int64), "y": graph.y.numpy(), "train": graph.train_mask.numpy(),
              "val": graph.val_mask.numpy(), "test": graph.test_mask.numpy()}
    csr = graph.csr("plain")  # a store's is mapped: written through in blocks, never whole in memory
    ids = index_dtype(graph.num_nodes)
    structure = {}
    for name, arr in (("src", graph.src), ("dst", graph.dst), ("in.indptr", csr.indptr.numpy()),
                      ("in.indices", csr.indices.numpy()), ("in.eids", csr.eids.numpy())):
        dtype = ids if name in ("src", "dst") else arr.dtype
        step = _rows_per_block(arr)
        structure[name] = _save_blocks(out, _structure_name(name), dtype, arr.shape, graph,
                                       (np.asarray(arr[lo:lo + step], dtype=dtype) for lo in range(0, len(arr), step)))
    x = graph.x.numpy()
    maps = mapped_files(graph)
    step = _rows_per_block(x)
    entries = []
    for rank in range(world):
        if layout == "rows":
            mine = np.nonzero(common["parts"] == rank)[0]
            blocks = (take(x, mine[lo:lo + step], maps) for lo in range(0, len(mine), step))
            shape = (len(mine), x.shape[1])
        else:
            c0, c1 = slices[rank]
            blocks = (np.ascontiguousarray(x[lo:lo + step, c0:c1]) for lo in range(0, len(x), step))
            shape = (len(x), c1 - c0)
        features = _save_blocks(out, _features_name(rank), x.dtype, shape, graph, blocks)
        entries.append(write_npz(out / f"rank-{rank:05d}.npz", rank, common, cols=list(slices[rank]), x=features))
    write_manifest(out, {"kind": "sampled", "layout": layout, "graph": graph.name, "num_nodes": graph.num_nodes,
                         "num_edges": graph.num_edges, "num_features": graph.num_features,
                         "num_classes": graph.num_classes, "parts": world, "shards": entries,
                         "structure": structure})
    return read_manifest(out)


def _rows_per_block(arr: np.ndarray) -> int:
    return max(BLOCK_BYTES // max(arr.itemsize * int(np.prod(arr.shape[1:])), 1), 1)


def _save_blocks(out: Path, name: str, dtype: np.dtype, shape: tuple[int, ...], graph: Graph,
                 blocks: Iterator[np.ndarray]) -> dict[str, Any]:
    """One array as `name.npy` from its blocks of rows, a store's mapped pages let go after each: written whole
    from a mapped graph, a rank's features were an anonymous copy of its rows (256 bytes per vertex of
    papers100M's at 2 ranks) beside the whole mapped x.npy (512), the launcher's peak (~9 GiB at papers100M/10)."""
    with _npy_writer(out, name, dtype, shape) as w:
        for block in blocks:
            w.write(block)
            release_pages(graph)  # a store's pages read for this block (a graph in memory has none)
    return w.entry


def _features_name(rank: int) -> str:
    return f"rank-{rank:05d}.x"


def _structure_name(name: str) -> str:
    return f"graph.{name}"


def features_bytes(entry: dict[str, Any]) -> int:
    """The size of the features file a rank's shard entry describes (0 where it describes none: such shards are
    refused when a rank opens them)."""
    x = entry.get("x")
    size = x.get("bytes") if isinstance(x, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0


def _open_features(shard_dir: str | os.PathLike, manifest: dict[str, Any], rank: int,
                   maps: list[mmap.mmap]) -> np.ndarray:
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
        return _open_array(Path(shard_dir), "x", entry, maps)
    except GnncError as err:  # missing, truncated or altered: the plan's shards are damaged
        raise PlanError(str(err)) from None


def _open_structure(shard_dir: str | os.PathLike, manifest: dict[str, Any],
                    maps: list[mmap.mmap]) -> dict[str, np.ndarray]:
    """The graph's edge list and in-edge CSR, memory-mapped read-only once each file matches the manifest's size,
    checksum, dtype and shape, and is in range (checked a block at a time, its pages let go after)."""
    entries = manifest.get("structure")
    if not isinstance(entries, dict) or set(entries) != set(STRUCTURE) or not all(
            isinstance(e, dict) and e.get("file") == f"{_structure_name(k)}.npy" for k, e in entries.items()):
        raise PlanError(f"{shard_dir}: the manifest must describe the graph's structure as "
                        f"{', '.join(_structure_name(k) + '.npy' for k in STRUCTURE)}; shards written before the "
                        f"ranks mapped it hold the edge list inside each rank's .npz: compile the plan again")
    n, e = int(manifest["num_nodes"]), int(manifest["num_edges"])
    root = Path(shard_dir)
    a = {}
    try:
        for name in STRUCTURE:
            path = root / entries[name]["file"]
            a[name] = _open_array(root, name, entries[name], maps)
            want = (n + 1,) if name == "in.indptr" else (e,)
            allowed = ("int32", "int64") if name in ("src", "dst") else ("int64",)
            if a[name].shape != want or str(a[name].dtype) not in allowed:
                raise PlanError(f"{path}: {name}: expected {' or '.join(allowed)} {list(want)}, got "
                                f"{a[name].dtype} {list(a[name].shape)}")
            # each block's pages let go as it is checked (gnnc.graph.store._blocks): not one edge array resident
            if name == "in.indptr":
                _check_indptr(path, name, a[name], e, maps[-1])
            else:
                _check_range(path, name, a[name], 0, e if name == "in.eids" else n, maps[-1])
    except PlanError:
        raise
    except GnncError as err:  # missing, truncated, altered or out of range: the plan's shards are damaged
        raise PlanError(str(err)) from None
    return a


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
    maps: list[mmap.mmap] = []
    s = _open_structure(shard_dir, manifest, maps)
    cols = tuple(int(c) for c in manifest["shards"][rank]["cols"])
    x = _open_features(shard_dir, manifest, rank, maps)
    want = (int(np.count_nonzero(a["parts"] == rank)), int(manifest["num_features"])) \
        if manifest["layout"] == "rows" else (n, cols[1] - cols[0])
    if x.shape != want:
        raise PlanError(f"{shard_dir}: rank {rank}'s features have shape {list(x.shape)}, expected {list(want)}")
    graph = Graph(n, s["src"], s["dst"], torch.zeros((n, 0)), torch.from_numpy(a["y"]),
                  torch.from_numpy(a["train"]), torch.from_numpy(a["val"]), torch.from_numpy(a["test"]),
                  name=str(manifest["graph"]))
    # the shards' CSR, as open_store sets a store's: Graph.csr would sort every edge again
    graph._views[("csr", "plain")] = CSR(*(_tensor(s[k]) for k in ("in.indptr", "in.indices", "in.eids")), n, n)
    keep_mapped_files(graph, maps)  # release_pages(graph): the pages read of the structure and of the features
    return SampledRankData(graph, _tensor(x), str(manifest["layout"]), a["parts"], cols,
                           int(manifest["num_features"]))
