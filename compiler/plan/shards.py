"""What each rank of a plan loads: its rows, their inputs and every graph layer's local structure.

The launcher (or `gnnc compile -o PLAN`) holds the whole graph once, works
out every rank's row sets (gnnc.plan.rows) and writes one shard
per rank; a rank then reads only its own file, so its memory is its share
of the graph, never the whole of it. A shard holds, as plain arrays (no
pickle), with the manifest of gnnc.plan.shard_files (sizes, sha256, written
last and atomically):

  rows, n_owned            global ids of the held rows in prefix order
  x                        input features of C^0 (pushpull: every row, this rank's feature slice), unless the
                           rank reads them from the shared `features.npy` or the graph's store (below)
  y, train, val, test      labels and split masks of the owned rows
  g<k>.indptr/indices/eids/norm    local CSR of distinct layer structure k (global edge ids and gcn_norm,
                           each only where a layer reads it)
  g<k>.edata.<NAME>        the graph's edge data `edge.NAME` on those edges, halo edges included
  g<k>.ids                 global ids of its rows, in its segment's order
  g<k>.halo_ids            a structure the rank builds from the store: the global ids of its halo rows
  g<k>.send_ptr/send_idx/recv      its halo plan, when it has one
  g<k>.entry.*             the rows fetched on entering a depcache/hybrid segment after layer 0
  full.<view>.*, block_order       pushpull: the whole first-layer structure and the owners' block order

The manifest entry of each shard says which structure each graph layer
uses and its row counts, and how its arrays are packed (gnnc.plan.shard_files.pack_arrays: an array that is
the first rows of another is stored once, int64 ids that fit as int32). Ranks that each hold at least half of
the vertices' input rows (a deep depcache or hybrid segment reaches most of the graph) read them from one
`features.npy` beside the shards, the graph's x written once (its size and sha256 in the manifest's
`features`), instead of a copy in each shard: the features were 165 MB of each 200 MB shard of GCNII x32 on
an 89,000-vertex SBM, 8 copies of 178 MB. A graph opened from a store has neither copy: the manifest names the
store, each rank builds its structures on the stored edges from it and reads its input rows there
(`store_source`). Everything a rank checks before a collective (manifest, size, checksum, the store's identity)
fails with PlanError, exit 2.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gnnc.errors import GnncError, PlanError
from gnnc.host import available_memory
from gnnc.parallel import map_processes
from gnnc.graph import CSR, Graph, GraphView, sparse_if_sparse
from gnnc.graph.loaders import default_cache_dir
from gnnc.graph.storage import check_class_labels
from gnnc.graph.sampling import reads_edge_ids, take
from gnnc.graph.store import (BLOCK_BYTES, _npy_writer, _open_array, _tensor, array_file, open_store,
                              release_pages, stored_structure)
from gnnc.plan.halo import HaloPlan
from gnnc.plan.slices import feature_slices
from gnnc.plan.strategies import STRATEGIES
from gnnc.plan.rows import (LayerGraph, LayerSpec, LocalGraph, RowSets, ViewRecipe, _edge_data_in_csr_order, _view,
                            all_row_sets, build_local_graph, hold_view, layer_specs)
from gnnc.plan.shard_files import ShardWriter, load_npz, pack_arrays, read_manifest, unpack_arrays, write_manifest

FEATURES = "features"  # the shared input features' file, features.npy
# the structure edges of all ranks together (`rank_edges`) from which `write_plan_shards` spreads the ranks over
# processes. Measured LOADED (load 5.4, 2 cores): gnnc.parallel's two children for nothing cost 0.05-0.10 s of
# wall, and a plan's shards ~50 ns per structure edge (R-MAT x8 depcache: 5.2M edges 0.29-0.39 s, 13.9M 0.45-0.77 s
# in one process), so below ~8M edges two processes save less than their start costs
PROCESS_EDGES = 8_000_000
# bytes a process building and writing one rank's shard holds per edge of the rank's structure, at most: an
# ogbn-products rank's child (123.7M edges) peaked at 2.43 GiB VmHWM, ~1 GiB of it the store's mapped pages (shared
# page cache), so ~12 bytes per edge of its own (int32 columns, a mask byte per entry, the packed copies); 16 rounds up
RANK_BYTES_PER_EDGE = 16
# bytes of the shared features' file that cost about what one structure edge of a rank's shard costs (products:
# the 0.98 GB file 2.5 CPU s to read, hash and write; a rank of 123.7M edges ~3.2 CPU s), for balancing the jobs
FEATURE_BYTES_PER_EDGE = 8


@dataclass
class RankData:
    """One rank's shard, loaded: its LocalGraph, its inputs and what P3's first layer needs."""

    lg: LocalGraph
    inputs: dict[str, torch.Tensor]
    num_nodes: int
    num_features: int
    num_classes: int
    train_count: float
    graph_name: str
    full_views: dict[str, GraphView] | None = None  # pushpull: the first layer's whole structure
    block_order: torch.Tensor | None = None  # pushpull: vertices by owner, the order P3's pull scatters in
    cols: tuple[int, int] | None = None  # pushpull: this rank's feature slice


def _unread(edge_ids: bool, norm: bool) -> frozenset[str]:
    """The per-edge arrays a plan's structures neither gather nor store (rows.build_local_graph's `unread`): the
    edges' global ids where no graph layer reads them, gcn_norm where no layer reads edge.gcn_norm."""
    return frozenset(k for k, kept in (("eids", edge_ids), ("gcn_norm", norm)) if not kept)


def _csr_arrays(prefix: str, view: GraphView, edge_ids: bool = True, norm: bool = True) -> dict[str, np.ndarray]:
    """A view's arrays; its edges' global ids only where `edge_ids`, their gcn_norm only where `norm`
    (`rank_arrays`)."""
    out = {f"{prefix}.indptr": view.csr.indptr.numpy(), f"{prefix}.indices": view.csr.indices.numpy()}
    if norm:
        out[f"{prefix}.norm"] = view.edge_data["gcn_norm"].numpy()
    if edge_ids:
        out[f"{prefix}.eids"] = view.edge_ids.numpy()
    out.update((f"{prefix}.edata.{k}", v.numpy()) for k, v in view.edge_data.items() if k != "gcn_norm")
    return out


def _view_from(arrays: dict[str, np.ndarray], prefix: str, n_src: int,
               positions: torch.Tensor | None = None) -> GraphView:
    """A loaded structure's view. No copy of an int64 array: layers whose structures are one array's rows share it,
    as they did when compiled; its CSR numbers its edges 0..nnz-1 (the first of `positions`, where given: one
    arange for every structure of the rank), and its destinations are built when first read (GraphView.dst: the kernels'
    products never read them; built for each structure on load they were 8 bytes per edge, 2.7 GB and 4.5 s of an
    ogbn-products rank's load under a deep DepCache segment)."""
    indptr = torch.from_numpy(np.asarray(arrays[f"{prefix}.indptr"], dtype=np.int64))
    indices = torch.from_numpy(np.asarray(arrays[f"{prefix}.indices"], dtype=np.int64))
    named = arrays.get(f"{prefix}.eids")
    # a shard without its edges' ids (no graph layer reads them): -1, "unknown", one element in memory, as
    # gnnc.runtime.distributed.forget_edge_ids leaves them
    eids = torch.full((), -1, dtype=torch.int64).expand(len(indices)) if named is None else \
        torch.from_numpy(np.asarray(named, dtype=np.int64))
    csr = CSR(indptr, indices, torch.arange(len(indices)) if positions is None else positions[:len(indices)],
              len(indptr) - 1, n_src)
    norm = arrays.get(f"{prefix}.norm")  # absent where no layer reads edge.gcn_norm
    data = {} if norm is None else {"gcn_norm": torch.from_numpy(norm)}
    named = f"{prefix}.edata."
    data.update((k[len(named):], torch.from_numpy(v)) for k, v in arrays.items() if k.startswith(named))
    return GraphView(csr, csr.indices, None, eids, data, csr.in_degree().to(torch.float32))


def rank_arrays(graph: Graph, parts: np.ndarray, rank: int, world: int, specs: list[LayerSpec], sets,
                shared_x: bool = False, edge_ids: bool = True, norm: bool = True,
                narrow: bool = False, store: bool = False,
                store_x: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One rank's shard arrays (unpacked) and its layout (the manifest entry's extra fields); `shared_x`: its
    input rows are read from the shared features file, not stored; `edge_ids`: its structures' edges' global
    ids are stored (a graph layer reads them: gnnc.graph.sampling.reads_edge_ids; without, a rank lets go of
    them as soon as it has built its source parts, and they were a third of a structure's bytes); `norm`: their
    gcn_norm is stored (a layer reads edge.gcn_norm: GraphSAGE's and GIN's do not); `narrow`: its structures'
    columns are gathered as int32 where they fit (`narrowed` names them: the int64 arrays they stand for, which
    `write_packed` packs byte for byte as it packs those)."""
    # a shard holds no CSR eids, and neither global edge ids nor gcn_norm where no layer reads them: not gathered
    lg = build_local_graph(graph, parts, rank, world, specs, sets, edge_positions=False,
                           unread=_unread(edge_ids, norm), narrow=narrow, store_views=store)
    rows = lg.rows.numpy()
    owned = rows[: lg.n_owned]
    arrays: dict[str, np.ndarray] = {"rows": rows, "n_owned": np.array(lg.n_owned)}
    layout: dict[str, Any] = {"layers": {}, "block_rows": lg.block_rows, "n_owned": lg.n_owned}
    ids: dict[int, int] = {}
    homes: dict[int, int] = {}  # a recipe -> the structure that builds it (the others read its rows)
    built = 0
    for s in specs:
        g = lg.layers[s.name]
        k = ids.setdefault(id(g), len(ids))
        v = g.views.get(s.view)
        recipe = None
        if isinstance(v, ViewRecipe):
            base = v.of if v.of is not None else v if id(v) in homes else None
            recipe = {"rows": v.n_out, "cols": v.cols, "of": None if base is None else homes[id(base)]}
            homes.setdefault(id(v), k)
        if f"g{k}.ids" not in arrays:
            arrays[f"g{k}.ids"] = g.ids.numpy()
            if recipe is not None and recipe["of"] is None:
                built += _built_bytes(graph, v, edge_ids, norm)
                if v.halo is not None:
                    arrays[f"g{k}.halo_ids"] = v.halo
                if v.cols == "blocks":
                    arrays["block_order"] = np.argsort(parts, kind="stable").astype(np.int64)
            elif recipe is None and v is not None:
                arrays.update(_csr_arrays(f"g{k}", v, edge_ids, norm))
            if g.halo is not None:
                arrays.update(_plan_arrays(f"g{k}", g.halo))
            if g.entry is not None:
                arrays.update(_plan_arrays(f"g{k}.entry", g.entry))
                arrays[f"g{k}.entry.perm"] = g.entry_perm.numpy()
        info = {"structure": k, "view": s.view, "n_in": g.n_in, "n_out": g.n_out,
                "n_src": None if v is None else v.n_src if recipe is not None else v.csr.n_src,
                "nnz": 0 if v is None else v.nnz if recipe is not None else v.csr.nnz,
                "halo": g.halo is not None, "entry": g.entry is not None, "blocks": g.blocks,
                # what the row sets were made for: checked against the IR on load
                "strategy": s.strategy, "segment": s.segment}
        layout["layers"][s.name] = info if recipe is None else {**info, "store": recipe}
    if homes:  # what the rank gathers with the structures it builds (`unread`, `_csr_arrays`)
        layout["edges"] = {"eids": edge_ids, "norm": norm}
    first = specs[0] if specs else None
    if first is not None and STRATEGIES[first.strategy].layout_in == "feature":  # P3's first layer
        lo, hi = feature_slices(graph.num_features, world)[rank]
        arrays["x"] = graph.x[:, lo:hi].numpy()
        full = GraphView.build(graph, first.view)
        arrays.update(_csr_arrays(f"full.{first.view}", full, edge_ids, norm))
        arrays["block_order"] = np.argsort(parts, kind="stable").astype(np.int64)
        layout["pushpull"] = {"view": first.view, "cols": [lo, hi], "nnz": full.csr.nnz}
    elif store_x:
        layout["x"] = {"store": True, "rows": lg.layers[first.name].n_in if first is not None else lg.n_owned}
        built += layout["x"]["rows"] * graph.num_features * graph.x.element_size()
    elif shared_x:
        layout["x"] = {"file": f"{FEATURES}.npy", "rows": lg.layers[first.name].n_in}
    else:
        n_in = lg.layers[first.name].n_in if first is not None else lg.n_owned
        arrays["x"] = take_rows(graph.x, rows[:n_in])
    arrays["y"] = graph.y[torch.as_tensor(owned)].numpy()
    for name, mask in (("train", graph.train_mask), ("val", graph.val_mask), ("test", graph.test_mask)):
        arrays[name] = mask[torch.as_tensor(owned)].numpy()
    # the recipes' halo ids and block order are read to build the structures, and let go (the block order is kept
    # by P3's first layer only)
    built -= sum(a.nbytes for k, a in arrays.items() if k.endswith(".halo_ids")
                 or k == "block_order" and "pushpull" not in layout)
    if built:
        layout["built_bytes"] = built
    return arrays, layout


def _built_bytes(graph: Graph, recipe: ViewRecipe, edge_ids: bool, norm: bool) -> int:
    """What the structure a rank builds from `recipe` takes once built (`load_rank`: int64 row pointers and
    columns, the edges' global ids where kept, gcn_norm where read, the graph's edge data): the bytes its arrays
    would have taken, loaded from the shard."""
    per_edge = 8 + (8 if edge_ids else 0) + (4 if norm else 0) + sum(
        v[:1].numel() * v.element_size() for v in graph.edge_data.values())  # (every view: the graph's names)
    return 8 * (recipe.n_out + 1) + per_edge * recipe.nnz


def take_rows(t: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of the dense tensor `t`, as a new array: numpy's take costs ~0.4x the CPU of torch's indexing
    here, and a rank's feature rows are most of its shard (165 MB of each 200 MB shard of GCNII x32 on the
    89,000-vertex SBM)."""
    return np.take(t.numpy(), rows, axis=0)


def _plan_arrays(prefix: str, plan: HaloPlan) -> dict[str, np.ndarray]:
    counts = plan.send_counts
    return {f"{prefix}.send_ptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            f"{prefix}.send_idx": torch.cat(plan.send_idx).numpy() if counts else np.zeros(0, np.int64),
            f"{prefix}.recv": np.asarray(plan.recv_counts, dtype=np.int64)}


def _plan_from(arrays: dict[str, np.ndarray], prefix: str, world: int) -> HaloPlan:
    ptr = arrays[f"{prefix}.send_ptr"]
    idx = torch.from_numpy(arrays[f"{prefix}.send_idx"].astype(np.int64))
    return HaloPlan(tuple(idx[ptr[p]:ptr[p + 1]] for p in range(world)),
                    tuple(int(c) for c in arrays[f"{prefix}.recv"]))


def write_plan_shards(program, graph: Graph, parts: np.ndarray, world: int, out_dir: str | os.PathLike,
                      cached: dict[int, list[np.ndarray]] | None = None,
                      progress: Callable[[int], None] | None = None,
                      row_sets: tuple[list[LayerSpec], list[RowSets]] | None = None,
                      processes: int = 1) -> dict[str, Any]:
    """Every rank's shard of `program` (strategies annotated) on `graph` split by `parts`; the manifest.
    `row_sets`: (specs, every rank's row sets) that compile's predict-bytes built, taken when `program`'s
    specs are those (the same graph, parts and cache: the plan's), else built here. `processes`: how many
    processes may build and write the shards (the compile's thread count, `Plan.threads`); `shard_processes`
    decides how many do."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = layer_specs(program)
    if row_sets is not None and row_sets[0] == specs:
        sets = row_sets[1]
    else:
        sets = all_row_sets(graph, parts, world, specs, cached)
    ids_kept = any(reads_edge_ids(layer) for layer in program.graph_layers())
    norm = any(e.op == "edata" and e.attr("name") == "gcn_norm" for layer in program.layers for e in layer.eqns)
    # a store's graph: its ranks build the structures on its stored edges and read their input rows from it
    # (`store_source`); the shards hold their rows, halo plans and labels
    source = store_source(graph)
    store_x = source is not None and array_file(graph, "x", graph.x) is not None
    shared = set() if store_x else shared_feature_ranks(graph, specs, sets, world)
    # (a store's ranks build their structures: nothing heavy per rank is left to spread over processes)
    edges = [0] * world if source is not None else rank_edges(graph, specs, sets, world)
    views = write_views(out, graph, {s.view for s in specs if STRATEGIES[s.strategy].rows != "all"}, ids_kept, norm) \
        if source is not None else {}
    room = available_memory() if processes > 1 else None
    count = shard_processes(processes, edges, None if room is None else room.bytes)
    # the jobs: rank r's shard is job r; the shared features' file, where the ranks read one, is job `world`,
    # weighed as FEATURE_BYTES_PER_EDGE of its bytes per structure edge
    weights = edges + ([graph.x.numel() * graph.x.element_size() // FEATURE_BYTES_PER_EDGE] if shared else [])

    def write_jobs(jobs: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The shards of the ranks in `jobs`, each built and written (packed, checksummed) in turn, and the
        features' file where `jobs` holds `world`; their manifest entries. One writer for the shards: each
        reaches the disk (fsync) on its thread while the next is built."""
        features = None
        with ShardWriter() as writer:
            for rank in jobs:
                if rank == world:
                    features = write_features(out, graph)
                    continue
                arrays, layout = rank_arrays(graph, parts, rank, world, specs, sets, rank in shared, ids_kept, norm,
                                             narrow=True, store=source is not None, store_x=store_x)
                x_bytes = layout["x"]["rows"] * graph.num_features * graph.x.element_size() if rank in shared else 0
                write_packed(writer, out / f"rank-{rank:05d}.npz", rank, arrays, layout,
                             x_bytes + layout.get("built_bytes", 0), ids_kept, narrowed(arrays))
                del arrays
                if rank not in shared:
                    # a store's graph: this rank's input rows are written, the next rank reads its own. A rank that
                    # reads the shared features read none: what it mapped is the in-CSR, which the next rank reads
                    # again (most of it under a deep DepCache segment), kept mapped: faulting it in again cost
                    # 1.3-1.7 of every 8 CPU s of 4 products ranks (LOADED)
                    release_pages(graph)
                if progress is not None and count <= 1:
                    progress(rank)
            release_pages(graph)
            return writer.entries(), features

    # each process builds and writes its group of jobs (forked: the graph, the row sets and this closure are the
    # parent's memory, nothing pickled but the small manifest entries coming back); one process: the same jobs
    # here, the features first, then the ranks in order. Each rank gathers most of the graph's edges under a deep
    # DepCache segment, and the structures, shard files and features were a third of the products compile, on one
    # of its cores (issue 34)
    groups = [sorted(g, key=lambda j: (j != world, j)) for g in rank_groups(weights, count)]
    done = map_processes(write_jobs, groups, count)
    entries = sorted((e for shards, _ in done for e in shards), key=lambda e: e["part"])
    features = next((f for _, f in done if f is not None), None)
    if progress is not None and count > 1:
        for rank in range(world):
            progress(rank)
    return write_plan_manifest(out, graph, world, entries, features, source and {**source, "views": views})


def store_source(graph: Graph) -> dict[str, str] | None:
    """The manifest's "store" (the store's directory and its manifest's sha256) for a graph whose stored edges a
    rank can read (gnnc.graph.store.stored_structure), None otherwise.

    A plan of a store's graph does not copy its structure: a deep DepCache segment's rank holds most of the
    graph's edges, so each shard was a relabelled copy of nearly all of them (ogbn-products for 8 workers: 5.1 GB
    written, 8 x 124M edges gathered and renumbered, the largest part of the compile, issue 34). Its ranks open the
    store (mapped, checked against the sha256) and build their structures from its CSR, each the same arrays
    `rows._view` builds for the shard (`load_rank`); the shards keep the rows, halo plans and labels. The
    store must stay where it was, unchanged, while the plan is used (a rank refuses it otherwise)."""
    held = stored_structure(graph)
    return None if held is None else {"path": str(held[0]), "sha256": held[1]}


def write_views(out: Path, graph: Graph, views: set[str], edge_ids: bool, norm: bool) -> dict[str, dict[str, Any]]:
    """What the ranks of a store's plan read beside the store, written once for all of them: the CSR of each view
    the store does not hold (the self-loops view: its columns int32 where they fit, its edges' global ids where a
    layer reads them), and each view's per-edge arrays in its CSR's order that a layer reads (gcn_norm, the graph's
    edge data: `rows._edge_data_in_csr_order`, a gather over every edge a rank would otherwise make). Each file
    `view.<view>.<name>.npy`; their manifest entries (dtype, shape, size, sha256) by view and name."""
    written: dict[str, dict[str, Any]] = {}
    for view in sorted(views):
        arrays: dict[str, np.ndarray] = {}
        if view != "plain":
            csr = graph.csr(view)
            arrays["indptr"] = csr.indptr.numpy()
            indices = csr.indices.numpy()
            arrays["indices"] = indices.astype(np.int32) if graph.num_nodes < 2**31 else indices
            if edge_ids:
                arrays["eids"] = csr.eids.numpy()
        per_edge = _edge_data_in_csr_order(graph, view, _unread(edge_ids, norm))
        arrays.update((f"data.{k}", v) for k, v in per_edge.items())
        entries = {}
        for name, a in arrays.items():
            with _npy_writer(out, f"view.{view}.{name}", a.dtype, a.shape) as w:
                w.write(a)
            entries[name] = w.entry
        if entries:
            written[view] = entries
    return written


def _held_views(graph: Graph, shard_dir: str | os.PathLike, manifest: dict[str, Any], views: set[str],
                maps: list) -> None:
    """The views `views` as the compiler wrote them (`write_views`), checked (size, sha256, dtype, shape) and held
    by the store's `graph` where `rows._view` reads them (`rows.hold_view`); a view the manifest does not list is
    the store's own CSR with no per-edge array read."""
    listed = manifest["store"].get("views", {})
    names = ("indptr", "indices", "eids", *(f"data.{k}" for k in ("gcn_norm", *graph.edge_data)))
    for view in sorted(views):
        entries = listed.get(view, {}) if isinstance(listed, dict) else None
        if not isinstance(entries, dict) or view != "plain" and "indptr" not in entries:
            raise PlanError(f"{shard_dir}: the manifest does not describe the {view} structure its ranks build: "
                            f"compile the plan again")
        arrays = {}
        for name, entry in entries.items():
            file = f"view.{view}.{name}"
            if not (isinstance(entry, dict) and entry.get("file") == f"{file}.npy" and name in names):
                raise PlanError(f"{shard_dir}: the manifest's {view} structure lists {str(name)[:60]!r}, which no "
                                f"plan writes: compile the plan again")
            arrays[name] = _plan_array(shard_dir, file, entry, maps)
        n = graph.num_nodes
        csr = graph.csr("plain") if view == "plain" else \
            CSR(_tensor(arrays["indptr"]), _tensor(arrays["indices"]),
                _tensor(arrays["eids"]) if "eids" in arrays else torch.zeros(0, dtype=torch.int64), n, n)
        hold_view(graph, view, csr, {k[len("data."):]: v for k, v in arrays.items() if k.startswith("data.")})


def rank_edges(graph: Graph, specs: list[LayerSpec], sets: list[RowSets], world: int) -> list[int]:
    """Each rank's structure edges, the measure of its shard's work: the in-edges of the rows of its layer that
    computes the most (a depcache segment's first layer; deeper layers read prefixes of it), counted for that
    layer only (each count a pass over every vertex)."""
    if not specs:
        return [0] * world
    degrees = {v: np.diff(graph.csr(v).indptr.numpy()) for v in {s.view for s in specs}}
    out = []
    for r in range(world):
        k = max(range(len(specs)), key=lambda k: int(np.count_nonzero(sets[r].held_out[k])))
        out.append(int(degrees[specs[k].view][sets[r].held_out[k]].sum()))
    return out


def shard_processes(processes: int, edges: list[int], available: int | None = None) -> int:
    """How many processes write a plan's shards: `processes` (the compile's threads) up to one per rank where
    the ranks' structures hold `PROCESS_EDGES` edges together, else one (a fork, a child's start and its result's
    trip cost more than a small graph's shards); and no more than `available` bytes (gnnc.host.available_memory)
    hold with `RANK_BYTES_PER_EDGE` per edge of the largest rank for each process beyond the first (each
    holds one rank's arrays at a time)."""
    if processes <= 1 or sum(edges) < PROCESS_EDGES:
        return 1
    count = min(processes, len(edges))
    if available is not None and edges:
        count = min(count, 1 + available // max(RANK_BYTES_PER_EDGE * max(edges), 1))
    return max(1, count)


def rank_groups(edges: list[int], count: int) -> list[list[int]]:
    """The jobs (ranks, and the features' file: `write_plan_shards`) split into `count` groups of about equal
    edges (the largest first into the lightest group), each group in order: one process writes a group."""
    groups: list[list[int]] = [[] for _ in range(max(count, 1))]
    load = [0] * len(groups)
    for r in sorted(range(len(edges)), key=lambda r: (-edges[r], r)):
        g = min(range(len(groups)), key=lambda g: (load[g], g))
        groups[g].append(r)
        load[g] += edges[r]
    return [sorted(g) for g in groups if g]


def narrowed(arrays: dict[str, np.ndarray]) -> set[str]:
    """The arrays of `rank_arrays(narrow=True)` held as int32 that stand for int64 ones: its structures' columns
    (an unnarrowed structure's are int64, the runtime's and the loader's dtype)."""
    return {k for k, a in arrays.items() if k.endswith(".indices") and a.dtype == np.int32}


def write_packed(writer: ShardWriter, path: Path, rank: int, arrays: dict[str, np.ndarray], layout: dict[str, Any],
                 x_bytes: int = 0, edge_ids_kept: bool = True, wide: set[str] | frozenset[str] = frozenset()
                 ) -> None:
    """One plan shard, its arrays packed (`pack_arrays`; the packing in its layout); its entry's "loaded_bytes" is
    what its arrays take once loaded, each once (`x_bytes`: the rows it reads from the shared features; its
    structures' global edge ids only where `edge_ids_kept`: gnnc.runtime.distributed.forget_edge_ids lets them go
    where no graph layer reads them), the rank's graph bytes to gnnc.memory_check (the file's size counts shared
    arrays once and ids at 4 bytes). `wide`: int32 arrays that stand for int64 ones (`narrowed`), counted and
    packed as those."""
    stored, layout["packing"] = pack_arrays(arrays, wide)
    loaded = sum(a.nbytes * (2 if k in wide else 1) for k, a in arrays.items()
                 if k not in layout["packing"]["refs"] and (edge_ids_kept or not k.endswith(".eids"))) + x_bytes
    writer.write(path, rank, stored, layout=layout, loaded_bytes=int(loaded))


def shared_feature_ranks(graph: Graph, specs: list[LayerSpec], sets, world: int) -> set[int]:
    """The ranks that read their input rows from the shared features file: each that holds at least half of the
    vertices' rows, when together they hold at least 1.5x the vertices' (the file then saves at least a third of
    their feature bytes, and no such rank reads more than twice the rows it needs); none otherwise, and none under
    pushpull (its first layer holds a slice of every row's features)."""
    if not specs or STRATEGIES[specs[0].strategy].layout_in == "feature":
        return set()
    n = graph.num_nodes
    rows = [int(np.count_nonzero(sets[r].held_in[0])) for r in range(world)]
    wide = {r for r in range(world) if 2 * rows[r] >= n}
    return wide if 2 * sum(rows[r] for r in wide) >= 3 * n else set()


def write_features(out: Path, graph: Graph) -> dict[str, Any]:
    """The graph's x as `features.npy`, written block by block (a store's pages let go after each); its manifest
    entry (file, dtype, shape, bytes, sha256). A store's graph has none: its ranks read their rows from the store
    (`store_source`)."""
    x = graph.x.numpy()
    step = max(BLOCK_BYTES // max(x[:1].nbytes, 1), 1)
    with _npy_writer(out, FEATURES, x.dtype, x.shape) as w:
        for lo in range(0, len(x), step):
            w.write(x[lo:lo + step])
            release_pages(graph)
    return w.entry


def _plan_array(shard_dir: str | os.PathLike, name: str, entry: dict[str, Any], maps: list) -> np.ndarray:
    """`name`.npy beside a plan's shards, mapped once its size, checksum, dtype and shape match `entry`
    (gnnc.graph.store's check); PlanError where it is missing, truncated or altered: the plan is damaged."""
    try:
        return _open_array(Path(shard_dir), name, entry, maps)
    except GnncError as err:
        raise PlanError(str(err)) from None


def _read_features(shard_dir: str | os.PathLike, manifest: dict[str, Any], rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of the shared features, read once the file matches the manifest's size, checksum, dtype and
    shape (gnnc.graph.store's check, its pages let go region by region); the file is features.npy, never a path
    read from the manifest."""
    entry = manifest.get("features")
    shape = [int(manifest["num_nodes"]), int(manifest["num_features"])]
    if not (isinstance(entry, dict) and entry.get("file") == f"{FEATURES}.npy" and entry.get("shape") == shape
            and isinstance(entry.get("dtype"), str) and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)):
        raise PlanError(f"{shard_dir}: a rank reads the shared features, but the manifest does not describe them as "
                        f"{FEATURES}.npy ({shape}, dtype, size and sha256): compile the plan again")
    maps: list = []
    x = _plan_array(shard_dir, FEATURES, entry, maps)
    if len(rows) and (rows.min() < 0 or rows.max() >= shape[0]):
        raise PlanError(f"{shard_dir}: a rank's rows are out of the features' range")
    out = take(x, rows, maps)
    del x
    for pages in maps:
        pages.close()
    return out


def write_plan_manifest(out: Path, graph: Graph, world: int, entries: list[dict[str, Any]],
                        features: dict[str, Any] | None = None, store: dict[str, str] | None = None) -> dict[str, Any]:
    """A plan's shard manifest (written last, after every rank's shard and the shared features); returns it as
    read back. `store`: the graph store its ranks build their structures from (`store_source`)."""
    write_manifest(out, {"kind": "plan", "graph": graph.name, "num_nodes": graph.num_nodes,
                         "num_edges": graph.num_edges, "num_features": graph.num_features,
                         "num_classes": graph.num_classes, "train_count": int(graph.train_mask.sum()),
                         "parts": world, "shards": entries, **({"features": features} if features else {}),
                         **({"store": store} if store else {})})
    return read_manifest(out)


def check_shards_match(manifest: dict[str, Any], program, where: str) -> None:
    """Refuse shards written for other strategies or segments than `program` states (an edited IR).

    Each rank's rows, halo plans and structures were cut for the strategies the
    plan was compiled with; running them under other names would report one
    strategy while executing another.
    """
    specs = layer_specs(program)
    for entry in manifest["shards"]:
        layers = (entry.get("layout") or {}).get("layers") or {}
        for s in specs:
            got = layers.get(s.name) or {}
            if "strategy" not in got:
                raise PlanError(f"{where}: the shards do not say which strategies they were cut for (written by "
                                f"an older gnnc); compile the plan again")
            if (got["strategy"], got.get("segment"), got.get("view")) != (s.strategy, s.segment, s.view):
                raise PlanError(f"{where}: layer {s.name} runs {s.strategy} (segment from layer {s.segment}) in "
                                f"the plan's IR, but its shards were cut for {got['strategy']} (segment from layer "
                                f"{got.get('segment')}): the IR was edited after compiling; compile the plan again")


def _open_plan_store(shard_dir: str | os.PathLike, manifest: dict[str, Any], rank: int) -> Graph:
    """The graph store a plan's rank builds its structures from (`store_source`): the one the manifest names,
    opened as `--graph DIR` opens it (its verification stamps in gnnc's cache folder), refused (PlanError) where it
    is missing, unreadable or no longer the store the plan was compiled from (its manifest's sha256)."""
    entry = manifest.get("store")
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)):
        raise PlanError(f"{shard_dir}: rank {rank} builds its structures from the graph store the plan was compiled "
                        f"from, but the manifest does not name it (path and sha256): compile the plan again")
    where = entry["path"]
    try:
        graph = open_store(where, stamps=default_cache_dir())
    except GnncError as err:
        raise PlanError(f"{shard_dir}: rank {rank} builds its structures from the graph store {where}, which the "
                        f"plan was compiled from: {err}") from None
    held = stored_structure(graph)
    if held is None or held[1] != entry["sha256"]:
        raise PlanError(f"{shard_dir}: the graph store {where} is not the one the plan was compiled from (its "
                        f"manifest changed since): compile the plan again")
    return graph


VIEW_ARRAYS = ("indptr", "indices", "eids", "norm")  # with "edata.NAME": a structure's arrays (`_csr_arrays`)


def _build_from_store(graph: Graph, info: dict[str, Any], arrays: dict[str, np.ndarray], k: int,
                      edges: dict[str, bool]) -> None:
    """Structure k's arrays (`_csr_arrays`' names, in `arrays`), built from the store's CSR by the recipe the
    compiler left (gnnc.plan.rows.ViewRecipe: `info["store"]`) with the function it builds a shard's with
    (gnnc.plan.rows._view), columns int64 as a shard's load widens them; a recipe that reads the first rows of
    another structure's (`of`: a deeper DepCache layer's) takes views of that one's arrays, as unpacking a shard's
    references does."""
    recipe = info["store"]
    name = f"g{k}"
    n_out = int(recipe["rows"])
    if recipe["of"] is not None:
        base = f"g{int(recipe['of'])}."
        nnz = int(arrays[base + "indptr"][n_out])
        for key in [key for key in arrays if key.startswith(base)]:
            suffix = key[len(base):]
            if suffix in VIEW_ARRAYS or suffix.startswith("edata."):
                arrays[f"{name}.{suffix}"] = arrays[key][:n_out + 1] if suffix == "indptr" else arrays[key][:nnz]
        return
    ids = np.asarray(arrays[f"{name}.ids"], dtype=np.int64)
    n = graph.num_nodes
    col = np.full(n, -1, dtype=np.int64)
    if recipe["cols"] == "blocks":
        col[np.asarray(arrays["block_order"], dtype=np.int64)] = np.arange(n)
    else:
        n_in = int(info["n_in"])
        col[ids[:n_in]] = np.arange(n_in)
        halo = arrays.get(f"{name}.halo_ids")
        if halo is not None:
            col[np.asarray(halo, dtype=np.int64)] = n_in + np.arange(len(halo))
    ids_kept, norm = bool(edges.get("eids", True)), bool(edges.get("norm", True))
    view = _view(graph, info["view"], ids[:n_out], None, col, int(info["n_src"]), edge_positions=False,
                 unread=_unread(ids_kept, norm), narrow=True)
    built = _csr_arrays(name, view, ids_kept, norm)
    built[f"{name}.indices"] = built[f"{name}.indices"].astype(np.int64, copy=False)
    arrays.update(built)


def load_rank(shard_dir: str | os.PathLike, rank: int, world: int) -> RankData:
    """Rank `rank`'s shard, checked against the manifest before anything is read."""
    manifest = read_manifest(shard_dir)
    if manifest.get("kind") != "plan":
        raise PlanError(f"{shard_dir}: these are a partition's shards, not a plan's (compile a plan)")
    if manifest["parts"] != world:
        raise PlanError(f"{shard_dir}: the shards are for {manifest['parts']} ranks; this job has {world}")
    layout = manifest["shards"][rank]["layout"]
    arrays = unpack_arrays(load_npz(shard_dir, manifest, rank), layout.get("packing", {}),
                           f"{shard_dir}: rank {rank}'s shard")
    x_from = layout.get("x")
    store = None
    if any("store" in info for info in layout["layers"].values()) or isinstance(x_from, dict) and x_from.get("store"):
        store = _open_plan_store(shard_dir, manifest, rank)
    if isinstance(x_from, dict):  # its input rows: the first of its rows, from the store or the shared features
        rows = arrays["rows"][:int(x_from["rows"])]
        if store is not None and x_from.get("store"):
            arrays["x"] = take_rows(store.x, rows)
            release_pages(store)  # x's pages, read: not beside the in-edges' while the structures are built
        else:
            arrays["x"] = _read_features(shard_dir, manifest, rows)
    maps: list = []  # the plan's view files, mapped while the structures are built
    built = {info["view"] for info in layout["layers"].values() if "store" in info and info["store"]["of"] is None}
    if built:
        _held_views(store, shard_dir, manifest, built, maps)
    pp = layout.get("pushpull")
    positions = torch.arange(max([int(info["nnz"]) for info in layout["layers"].values()] +
                                 [int(pp["nnz"]) if pp is not None else 0]))
    structures: dict[int, LayerGraph] = {}
    layers: dict[str, LayerGraph] = {}
    for name, info in layout["layers"].items():
        k = int(info["structure"])
        if k not in structures:
            halo = _plan_from(arrays, f"g{k}", world) if info["halo"] else None
            if "store" in info:
                _build_from_store(store, info, arrays, k, layout.get("edges") or {})
            views = {} if info["n_src"] is None else \
                {info["view"]: _view_from(arrays, f"g{k}", int(info["n_src"]), positions)}
            g = LayerGraph(int(info["n_in"]), int(info["n_out"]), views, halo, bool(info["blocks"]),
                           ids=torch.from_numpy(arrays[f"g{k}.ids"]))
            if info["entry"]:
                g.entry = _plan_from(arrays, f"g{k}.entry", world)
                g.entry_perm = torch.from_numpy(arrays[f"g{k}.entry.perm"])
            structures[k] = g
        layers[name] = structures[k]
    if store is not None:
        release_pages(store)  # the store's pages read: this rank holds what it built, not the mapped graph
        del store
    for pages in maps:
        try:
            pages.close()
        except BufferError:  # an array over it still held: unmapped when the last goes
            pass
    check_class_labels(torch.from_numpy(arrays["y"]), str(manifest["graph"]))
    n_owned = int(arrays["n_owned"])
    lg = LocalGraph(torch.from_numpy(arrays["rows"].astype(np.int64)), n_owned, layers, layout.get("block_rows"))
    inputs = {"x": sparse_if_sparse(torch.from_numpy(arrays["x"])), "y": torch.from_numpy(arrays["y"]),
              "train": torch.from_numpy(arrays["train"]), "val": torch.from_numpy(arrays["val"]),
              "test": torch.from_numpy(arrays["test"])}
    data = RankData(lg, inputs, int(manifest["num_nodes"]), int(manifest["num_features"]),
                    int(manifest["num_classes"]), float(max(manifest["train_count"], 1)), str(manifest["graph"]))
    if pp is not None:
        n = data.num_nodes
        data.full_views = {pp["view"]: _view_from(arrays, f"full.{pp['view']}", n, positions)}
        data.block_order = torch.from_numpy(arrays["block_order"])
        data.cols = (int(pp["cols"][0]), int(pp["cols"][1]))
    return data
