"""`gnnc convert` of an OGB directory too large to load: the store written from blocks.

Why this module exists apart from gnnc.graph.store: reading OGB's layout needs
the loaders' label and split rules (so the store equals the one
`write_store(load_graph(DIR))` writes), and the loaders open stores; the
streaming writer depends on both, so it lives above them, and neither imports it.
Neither ogbn-papers100M's features nor its sorted edges are held whole: the edges
are one array per edge beside the edge list, the features written as they come.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gnnc.errors import GraphInputError
from gnnc.graph import edge_data
from gnnc.graph.generators import split_masks
from gnnc.graph.loaders import MASKS as LOADER_MASKS, NO_FEATURES, SPLIT_SEED, _labels, made_up_split, read_npz
from gnnc.graph.ogb import EDGE_FEATURES, stream_ogb_dir
from gnnc.graph.storage import index_dtype
from gnnc.graph.store import MASKS, _npy_writer, _save, _store_dir, _write_csrs


def write_ogb_store(root: Path, out_dir: str | os.PathLike) -> dict[str, Any]:
    """Write an OGB node-property directory as a store without holding its features or more than the edge
    list and one array per edge (`gnnc convert` of ogbn-papers100M's size): the edges, features and edge
    features are read in blocks and checked as build_graph checks them, the features written as they come;
    the store is the one `write_store(load_graph(root))` writes, array for array. The manifest."""
    source = str(root)
    a = stream_ogb_dir(root, read_npz)
    n = a.num_nodes
    if n == 0:
        raise GraphInputError(f"{source}: empty graph: x has 0 rows (no vertices)")
    y, unlabelled = _labels(np.asarray(a.y), n, source)
    stand_ins: dict[str, str] = {} if a.x is not None else {"x": NO_FEATURES}
    if a.masks:
        masks = [a.masks[m] for m in LOADER_MASKS]
    else:
        masks = list(split_masks(n, np.random.default_rng(SPLIT_SEED)))
        stand_ins["split"] = made_up_split(SPLIT_SEED)
    if unlabelled is not None:  # a vertex without a label is in no mask (as build_graph leaves it)
        masks = [m & ~unlabelled for m in masks]
    counts: dict[str, int] = {}
    with _store_dir(out_dir, a.name, n, lambda: counts["edges"], stand_ins) as manifest:
        out, entries = Path(out_dir), manifest["arrays"]
        src, dst = _read_edges(a.edges(), n, index_dtype(n), source, a.num_edges)
        counts["edges"] = e = len(src)
        entries["src"], entries["dst"] = _save(out, "src", src), _save(out, "dst", dst)
        _write_csrs(out, src, dst, n, entries)
        del src, dst
        x_blocks = a.x() if a.x is not None else iter([np.ones((n, 1), dtype=np.float32)])
        x_rows = _write_rows(out, "x", x_blocks, n, source, "row", entries)
        if x_rows != n:
            raise GraphInputError(f"{source}: x: node-feat has {x_rows} rows but num-node-list says {n}"
                                  if a.nodes_from_count else f"{source}: y: has {n} rows but x has {x_rows} "
                                                             f"(one label per vertex)")
        entries["y"] = _save(out, "y", y)
        for name, mask in zip(MASKS, masks):
            entries[name] = _save(out, name, np.ascontiguousarray(mask))
        if a.edge_feat is not None:
            field = edge_data.PREFIX + EDGE_FEATURES
            rows = _write_rows(out, field, a.edge_feat(), e, source, "edge", entries)
            if rows != e:
                raise GraphInputError(f"{source}: {field}: has {rows} rows but edge_index has {e} edges (one row "
                                      f"per edge)")
    return manifest


def _read_edges(blocks: Iterator[tuple[np.ndarray, np.ndarray]], n: int, dtype: np.dtype, source: str,
                expected: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The edge list in gnnc's index dtype from (src, dst) blocks, every id checked against [0, n). With the
    count known ahead (the source never yields more) the blocks go straight into their place: kept blocks
    between transient ones would fragment the heap, which then holds the transient ones' room too."""
    ends = ([np.empty(expected, dtype), np.empty(expected, dtype)] if expected is not None else None)
    parts: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    done = 0
    for block in blocks:
        for row, ids in enumerate(block):
            if ids.dtype.kind not in "iu":
                raise GraphInputError(f"{source}: edge_index: expected an integer dtype, got {ids.dtype}")
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
                col = int(np.flatnonzero((ids < 0) | (ids >= n))[0])
                bad = int(ids[col])
                raise GraphInputError(f"{source}: edge_index: negative vertex id {bad} at [{row}, {done + col}]"
                                      if bad < 0 else
                                      f"{source}: edge_index: vertex id {bad} at [{row}, {done + col}] is out of "
                                      f"range: x has {n} rows, so ids must be < {n}")
            if ends is not None:
                ends[row][done:done + len(ids)] = ids
            else:
                parts[row].append(ids.astype(dtype))
        done += len(block[0])
    if done == 0:
        raise GraphInputError(f"{source}: empty graph: edge_index has no edges")
    if ends is not None:
        return ends[0][:done], ends[1][:done]  # fewer than expected: the source has refused it already
    src = np.concatenate(parts[0])
    parts[0].clear()
    dst = np.concatenate(parts[1])
    return src, dst


def _write_rows(out: Path, name: str, blocks: Iterator[np.ndarray], rows: int, source: str, unit: str,
                entries: dict[str, Any]) -> int:
    """Float rows (the features, an edge feature) from blocks into `name.npy` [rows, d] float32, checked as
    build_graph checks them (numeric, d > 0, finite); the rows the blocks held (the file is only kept when
    they are `rows`: the caller says what the mismatch means)."""
    field = "x" if name == "x" else name
    first = next(blocks, None)
    if first is None:
        return 0
    if first.ndim != 2:
        raise GraphInputError(f"{source}: {field}: expected shape [N, F], got {list(first.shape)}" if name == "x"
                              else f"{source}: {field}: expected shape [E] or [E, d], got {list(first.shape)}")
    if first.shape[1] == 0:
        raise GraphInputError(f"{source}: {field}: has 0 columns" + (" (no features)" if name == "x" else ""))
    seen, bad_at, bad_count = 0, None, 0
    try:
        with _npy_writer(out, name, np.dtype(np.float32), (rows, first.shape[1])) as w:
            for block in itertools.chain([first], blocks):
                if block.dtype.kind not in "fiub":
                    raise GraphInputError(f"{source}: {field}: expected a numeric dtype, got {block.dtype}")
                values = np.ascontiguousarray(block, dtype=np.float32)
                bad = ~np.isfinite(values)
                if bad.any():
                    bad_count += int(bad.sum())
                    if bad_at is None:
                        r, c = (int(v[0]) for v in np.nonzero(bad))
                        bad_at = (seen + r, c, "NaN" if np.isnan(values[r, c]) else "inf")
                seen += len(values)
                if seen <= rows and bad_at is None:
                    w.write(values)
            if bad_at is not None:
                r, c, what = bad_at
                raise GraphInputError(f"{source}: x: holds {what} at row {r}, column {c} ({bad_count} non-finite "
                                      f"values)" if name == "x" else f"{source}: {field}: holds {what} at edge {r} "
                                                                      f"({bad_count} non-finite values)")
            if seen != rows:
                raise _RowCount(seen)
            entries[name] = w
    except _RowCount as count:
        return count.rows
    entries[name] = entries[name].entry
    return seen


class _RowCount(Exception):
    """Leaves _write_rows's writer (its file removed) when the blocks held another number of rows."""

    def __init__(self, rows: int):
        super().__init__(rows)
        self.rows = rows
