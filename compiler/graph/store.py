"""A graph as a directory of `.npy` files that `--graph DIR` memory-maps: the graph store of `gnnc convert`.

Why this module exists: a graph the size of ogbn-papers100M (111M vertices,
57 GB of features) cannot be parsed, or even held, by every process that
touches it. `write_store` writes a loaded Graph once, array by array (and
gnnc.graph.ogb_store an OGB directory read in blocks); `open_store`
maps each array read-only (an mmap of the .npy's data, as `np.load(mmap_mode="r")`
makes, kept so that `release_pages` can drop what was read), so a process reads
the pages it touches: a rank's shard gathers its own rows of x, not the whole matrix.

The directory holds, besides the manifest `gnnc-store.json`:

  src, dst [E]                     the edges in their order (index dtype: int32 below 2^31 vertices)
  in.indptr [N+1], in.indices, in.eids [E]         the in-edge CSR of the plain view (Graph.csr), int64
  out.indptr [N+1], out.indices, out.eids, out.perm [E]   its transpose (grouped by source; CSR.transpose)
  x [N, F] float32, y [N] int64 (UNLABELLED: none) or [N, T] float32 (multi-label)
  train_mask, val_mask, test_mask [N] bool, edge_NAME [E] or [E, d] float32 (edge data `edge.NAME`)

The manifest records, for every array, its file, dtype, shape, size and sha256, and the graph's name, counts
and stand-ins; x's entry its nonzero values as well (`x_nonzeros`: the cost model's input density, counted
once as x is written, not over every feature at every compile: 2.1 s with ogbn-products' pages cold; checked
with the other values where a store is checked, trusted where a stamp vouches for x; a store written before
without it: counted at each compile as before). Opening checks each file against it (missing, truncated, altered or of another shape: a
GraphInputError naming the file, exit 2) and then the structure (indptr monotone from 0 to E, every index and
label in range), in blocks, so the check holds one block at a time. Nothing is unpickled (allow_pickle=False).

Verified once (`open_store(path, stamps=DIR)`, what `--graph DIR` passes: the graph cache's folder): after a
whole check passes, a stamp in DIR (a folder only this user can change, gnnc.files.private_dir) records the
manifest's sha256 and each file's identity (device, inode, size, modification and change time, in ns). A later
open whose files all have the identity stamped skips the sha256 and the structure checks: reading every byte of
the store was ~8 CPU s of each compile at ogbn-products' size (issue 34). What it trusts: that a file whose
inode, size and change time are those it had when checked holds the bytes checked. Every write, truncate,
rename over or utime sets the change time to the clock, and no user call sets it back; so it does not catch
what bypasses the file system (a damaged disk, a write to the block device, the clock set back by root), which
the checksum read from the page cache would not catch reliably either. A file changed in the clock tick of
its check could keep its times, so a file changed less than `STAMP_SETTLE_S` before the check is not stamped
(git's "racily clean" rule). Without `stamps` (open_store's default) every open checks everything.
Each array and the manifest are written atomically, the manifest last (and removed first when a store is
written over): a directory whose manifest is there holds a whole store.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError, GraphInputError, write_failure
from gnnc.files import atomic_writer, fd_path, file_sha256, private_dir, read_text_input
from gnnc.graph import CSR, Graph, edge_data
from gnnc.graph.storage import RELEASE_PAGES, UNLABELLED

MANIFEST = "gnnc-store.json"
FORMAT = 1
KIND = "gnnc-graph-store"
MASKS = ("train_mask", "val_mask", "test_mask")
BLOCK_BYTES = 64 << 20  # what one step of a check or a checksum reads
EDGE_BLOCK = 1 << 20  # edges per step of the CSRs' construction (its temporaries: some 60 bytes per edge of a step)
_DTYPES = ("int32", "int64", "float32", "bool")  # every dtype a store's array may have
COUNTED = "x"  # the array whose entry records its nonzero values ("nonzeros": x_nonzeros)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
_MAPS = "store.maps"  # Graph._views key of a store's mappings (release_pages)
_SOURCES = "store.sources"  # Graph._views key: each array's file, manifest entry, identity and address (array_file)
_ROOT = "store.root"  # Graph._views key: the store's directory and its manifest's sha256 (stored_structure)
STAMP_SETTLE_S = 2.0  # a file changed this recently before its check is not stamped (module docstring)
_STAMP_FORMAT = 1
WORK = {"sha256": 0, "checked": 0}  # files hashed and stores structure-checked, read by the tests


def is_store(path: Path) -> bool:
    return (path / MANIFEST).is_file()


class _HashingWriter:
    """A file object that hashes what passes through it (np.lib.format.write_array writes in chunks)."""

    def __init__(self, f: Any):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes | np.ndarray) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)


def _save(out: Path, name: str, arr: np.ndarray) -> dict[str, Any]:
    """One array as `name.npy`, atomically; its manifest entry."""
    with _npy_writer(out, name, arr.dtype, arr.shape) as w:
        w.write(arr)
    return w.entry


class _NpyWriter:
    """The rows of one .npy, written block by block behind the header of its whole shape (known ahead), hashed
    as they pass; `entry` is its manifest entry once the file is complete."""

    def __init__(self, f: Any, name: str, dtype: np.dtype, shape: tuple[int, ...]):
        self.h, self.name, self.dtype, self.shape, self.rows = _HashingWriter(f), name, np.dtype(dtype), shape, 0
        self.nonzeros: int | None = 0 if name == COUNTED else None
        self.entry: dict[str, Any] = {}
        np.lib.format.write_array_header_1_0(self.h, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                      "fortran_order": False, "shape": tuple(shape)})

    def write(self, block: np.ndarray) -> None:
        if block.dtype != self.dtype or block.shape[1:] != tuple(self.shape[1:]):
            raise AssertionError(f"{self.name}: a block of {block.dtype} {list(block.shape)} for {self.dtype} "
                                 f"{list(self.shape)}")
        self.rows += len(block) if block.ndim else 1
        if self.nonzeros is not None:
            self.nonzeros += int(np.count_nonzero(block))
        data = np.ascontiguousarray(block).reshape(-1).view(np.uint8)  # its bytes, not a copy (tobytes is one)
        for lo in range(0, len(data), BLOCK_BYTES):
            self.h.write(data[lo:lo + BLOCK_BYTES])

    def close(self) -> None:
        if self.rows != (self.shape[0] if self.shape else 1):
            raise AssertionError(f"{self.name}: {self.rows} rows written of {list(self.shape)}")
        self.entry = {"file": f"{self.name}.npy", "dtype": str(self.dtype), "shape": list(self.shape),
                      "bytes": self.h.size, "sha256": self.h.sha.hexdigest()}
        if self.nonzeros is not None:
            self.entry["nonzeros"] = self.nonzeros


@contextlib.contextmanager
def _npy_writer(out: Path, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Iterator[_NpyWriter]:
    """`with _npy_writer(...) as w: w.write(rows)...`: `name.npy` written atomically; then `w.entry`."""
    with atomic_writer(out / f"{name}.npy") as f:
        w = _NpyWriter(f, name, dtype, shape)
        yield w
        w.close()


def _offsets(ids: np.ndarray, n: int) -> np.ndarray:
    """int64 [n + 1]: where each id's run starts in `ids` sorted (a CSR's indptr)."""
    indptr = np.zeros(n + 1, dtype=np.int64)
    for _, block in _blocks(ids):
        indptr[1:] += np.bincount(block, minlength=n)
    np.cumsum(indptr[1:], out=indptr[1:])
    return indptr


def _read_rows(path: Path) -> Iterator[np.ndarray]:
    """A 1-D int64 .npy just written, EDGE_BLOCK values at a time, read (not mapped: no page stays resident)."""
    with open(path, "rb") as f:
        length = _HEADERS[np.lib.format.read_magic(f)](f)[0][0]
        for lo in range(0, length, EDGE_BLOCK):
            yield np.fromfile(f, dtype=np.int64, count=min(EDGE_BLOCK, length - lo))


def _place(out: np.ndarray, cursor: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
    """One block of a stable counting sort: `values[i]` goes to `cursor[keys[i]]`, the next free slot of its
    key, in block order, and the cursors move on."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else np.zeros(0, np.int64)
    run = np.diff(np.r_[starts, len(ordered)])
    rank = np.arange(len(ordered)) - np.repeat(starts, run)  # position within its key's run
    out[cursor[ordered] + rank] = values[order]
    cursor[ordered[starts]] += run


def _counting_sort(indptr: np.ndarray, blocks: Iterator[tuple[np.ndarray, np.ndarray]], length: int) -> np.ndarray:
    """int64 [length]: every (keys, values) block's values placed by key, stably (as a stable argsort of the
    keys orders them), given each key's start `indptr`: one int64 per edge, where a sort holds three."""
    arr = np.empty(length, dtype=np.int64)
    cursor = indptr[:-1].copy()
    for keys, values in blocks:
        _place(arr, cursor, keys, values)
    return arr


def _write_csrs(out: Path, src: np.ndarray, dst: np.ndarray, n: int, entries: dict[str, Any]) -> None:
    """The in-edge CSR and its transpose, exactly those `Graph.csr("plain")` and its `transpose()` build (stable
    sorts: a run from the store sums in the same order as one from the source), by counting sorts in blocks.

    Besides src and dst, one int64 array per edge is held at a time (the one being filled; the others are
    written and read back in blocks): in.eids is the edges stably ordered by destination; the transpose's entry
    k is the in-CSR entry perm[k] with in-CSR entries stably ordered by source (CSR.transpose), so out.perm and
    out.eids are the in-CSR's positions and edge ids placed by the sources of in.indices.
    """
    e = len(src)
    entries["in.indptr"] = _save(out, "in.indptr", in_indptr := _offsets(dst, n))
    blocks = ((dst[lo:lo + EDGE_BLOCK], np.arange(lo, min(lo + EDGE_BLOCK, e), dtype=np.int64))
              for lo in range(0, e, EDGE_BLOCK))
    entries["in.eids"] = _save(out, "in.eids", _counting_sort(in_indptr, blocks, e))
    with _npy_writer(out, "in.indices", np.dtype(np.int64), (e,)) as w:
        for eids in _read_rows(out / "in.eids.npy"):
            w.write(src[eids].astype(np.int64))
    entries["in.indices"] = w.entry
    entries["out.indptr"] = _save(out, "out.indptr", out_indptr := _offsets(src, n))

    def positions() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        lo = 0
        for sources in _read_rows(out / "in.indices.npy"):
            yield sources, np.arange(lo, lo + len(sources), dtype=np.int64)
            lo += len(sources)

    entries["out.perm"] = _save(out, "out.perm", _counting_sort(out_indptr, positions(), e))
    edge_ids = zip(_read_rows(out / "in.indices.npy"), _read_rows(out / "in.eids.npy"))
    entries["out.eids"] = _save(out, "out.eids", _counting_sort(out_indptr, edge_ids, e))
    with _npy_writer(out, "out.indices", np.dtype(np.int64), (e,)) as w:
        for eids in _read_rows(out / "out.eids.npy"):
            w.write(dst[eids].astype(np.int64))
    entries["out.indices"] = w.entry


@contextlib.contextmanager
def _store_dir(out_dir: str | os.PathLike, name: str, num_nodes: Any, num_edges: Any,
               stand_ins: dict[str, str]) -> Iterator[dict[str, Any]]:
    """`with _store_dir(DIR, ...) as manifest:` fill manifest["arrays"] with each array's entry as it is
    written; the rest of the manifest is filled in and written last. A directory that holds other files and no store is refused (the
    store's files would be mixed with them); on an error the arrays written so far are removed, so a second
    convert into the same directory is not refused for them. num_nodes and num_edges may be functions, called
    once every array is written (a streamed source's counts are known only then)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GnncError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not is_store(out):
        raise GnncError(f"{out}: a directory with other files and no graph store in it; give a new or empty one")
    entries: dict[str, Any] = {}
    manifest: dict[str, Any] = {"arrays": entries}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST).unlink(missing_ok=True)  # until the new manifest is written, the directory holds no store
        try:
            yield manifest
        except BaseException:
            for entry in entries.values():
                (out / entry["file"]).unlink(missing_ok=True)
            raise
        n, e = (v() if callable(v) else v for v in (num_nodes, num_edges))
        manifest.update(format=FORMAT, kind=KIND, name=name, num_nodes=n, num_edges=e, stand_ins=stand_ins)
        with atomic_writer(out / MANIFEST) as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
    except OSError as err:  # a full disk is exit 1, a read-only or forbidden directory exit 2 (write_failure)
        raise write_failure(err, f"the graph store {out}") from err


def write_store(graph: Graph, out_dir: str | os.PathLike) -> dict[str, Any]:
    """Write `graph` as a store in `out_dir` (created; an existing store there is replaced); the manifest.
    A directory that holds other files and no store is refused."""
    with _store_dir(out_dir, graph.name, graph.num_nodes, graph.num_edges, graph.stand_ins) as manifest:
        out, entries = Path(out_dir), manifest["arrays"]
        for name, arr in (("src", graph.src), ("dst", graph.dst)):
            entries[name] = _save(out, name, arr)
        _write_csrs(out, graph.src, graph.dst, graph.num_nodes, entries)
        for name, arr in (("x", graph.x.numpy()), ("y", graph.y.numpy()),
                          *((m, getattr(graph, m).numpy()) for m in MASKS),
                          *((edge_data.PREFIX + k, v.numpy()) for k, v in graph.edge_data.items())):
            entries[name] = _save(out, name, arr)
    return manifest


# --- reading ----------------------------------------------------------------------------------------


def _manifest(root: Path) -> tuple[dict[str, Any], str]:
    """The manifest and the sha256 of the text it was parsed from (what a verification stamp names)."""
    path = root / MANIFEST
    try:
        text = read_text_input(path, str(path))
        digest = hashlib.sha256(text.encode()).hexdigest()
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphInputError(f"{path}: not a graph store manifest ({err})") from None
    except GnncError as err:
        raise GraphInputError(str(err)) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND or manifest.get("format") != FORMAT:
        raise GraphInputError(f"{path}: not a graph store manifest of format {FORMAT} (write the store again "
                              f"with `gnnc convert`)")

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    for key in ("num_nodes", "num_edges"):
        if not count(manifest.get(key)):
            raise GraphInputError(f"{path}: {key}: expected a count, got {str(manifest.get(key))[:40]!r}")
    if not isinstance(manifest.get("name"), str):
        raise GraphInputError(f"{path}: name: expected a string")
    stand_ins = manifest.get("stand_ins")
    if not (isinstance(stand_ins, dict) and all(isinstance(v, str) for v in stand_ins.values())):
        raise GraphInputError(f"{path}: stand_ins: expected an object of strings")
    arrays = manifest.get("arrays")
    if not isinstance(arrays, dict):
        raise GraphInputError(f"{path}: arrays: expected an object")
    for name, entry in arrays.items():
        ok = (_NAME.match(name) and isinstance(entry, dict) and entry.get("file") == f"{name}.npy"
              and entry.get("dtype") in _DTYPES and isinstance(entry.get("shape"), list)
              and all(count(d) for d in entry["shape"]) and count(entry.get("bytes"))
              and isinstance(entry.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
              and ("nonzeros" not in entry or name == COUNTED and count(entry["nonzeros"])
                   and entry["nonzeros"] <= math.prod(entry["shape"])))
        if not ok:
            # a file is named by the array's name, never by a path from the manifest (`../x`, `/etc/...`)
            raise GraphInputError(f"{path}: arrays: the entry of {str(name)[:40]!r} must hold file NAME.npy, a dtype "
                                  f"of {', '.join(_DTYPES)}, a shape, its size in bytes and its sha256 (x: "
                                  f"its nonzero values, at most its size)")
    return manifest, digest


def _identity(path: Path) -> list[int]:
    """What a change of the file's bytes changes: device, inode, size, modification and change time (ns)."""
    st = os.stat(path, follow_symlinks=False)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _stamp_name(root: Path) -> str:
    return f"store-verified-{hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:32]}.json"


def _stamped(stamps: Path | None, root: Path, digest: str, files: dict[str, Path]) -> bool:
    """Whether `stamps` holds a stamp of this store's manifest (sha256 `digest`) whose every file's identity is
    the file's now (an unreadable or foreign stamp, or a cache folder others could write to: False)."""
    if stamps is None:
        return False
    try:
        with private_dir(stamps) as fd:
            with open(fd_path(fd, _stamp_name(root)), "rb") as f:
                stamp = json.loads(f.read())
        if not (isinstance(stamp, dict) and stamp.get("format") == _STAMP_FORMAT and stamp.get("manifest") == digest
                and stamp.get("store") == os.path.realpath(root)):
            return False
        held = stamp.get("files")
        return isinstance(held, dict) and held.keys() == files.keys() and all(
            held[k] == _identity(p) for k, p in files.items())
    except (OSError, ValueError):
        return False


def _stamp(stamps: Path | None, root: Path, digest: str, seen: dict[str, list[int]], files: dict[str, Path],
           began_ns: int) -> None:
    """Record the check that just passed: each file's identity as it was before it was read, when it is still
    that and its times are older than STAMP_SETTLE_S before the check began. Not written on any error: a store
    not stamped is checked again next time, nothing else."""
    if stamps is None:
        return
    settled = began_ns - int(STAMP_SETTLE_S * 1e9)
    try:
        if any(_identity(p) != seen[k] or max(seen[k][3:]) > settled for k, p in files.items()):
            return
        with private_dir(stamps) as fd:
            with atomic_writer(fd_path(fd, _stamp_name(root))) as f:
                f.write(json.dumps({"format": _STAMP_FORMAT, "store": os.path.realpath(root), "manifest": digest,
                                    "files": seen}, sort_keys=True).encode())
    except OSError:
        pass  # a read-only or foreign cache folder: the store is checked whole at each open, as without stamps


def _open_array(root: Path, name: str, entry: dict[str, Any], maps: list[mmap.mmap], verified: bool = False,
                seen: dict[str, list[int]] | None = None) -> np.ndarray:
    """The array `name`, memory-mapped read-only, after its file matched the manifest's size and checksum and
    its header the manifest's dtype and shape (`verified`: a stamp vouches for its checksum, not read again;
    `seen[name]`: its identity, taken before it is read)."""
    path = root / entry["file"]
    if path.is_symlink() or not path.is_file():
        raise GraphInputError(f"{path}: {name}: missing from the graph store (or not a regular file)")
    if seen is not None:
        seen[name] = _identity(path)
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise GraphInputError(f"{path}: {name}: {size} bytes, the manifest says {entry['bytes']}: truncated or altered")
    if verified:
        digest = entry["sha256"]
    else:
        WORK["sha256"] += 1
        digest = file_sha256(path)
    if digest != entry["sha256"]:
        raise GraphInputError(f"{path}: {name}: does not match its checksum (sha256 {digest[:12]}..., the manifest "
                              f"says {entry['sha256'][:12]}...)")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in _HEADERS:
                raise ValueError(f".npy format version {version} is not supported")
            shape, fortran, dtype = _HEADERS[version](f)
            offset = f.tell()
            if dtype.hasobject or fortran:
                raise ValueError("an array of Python objects or in Fortran order")  # never unpickled
            if str(dtype) != entry["dtype"] or list(shape) != entry["shape"]:
                raise GraphInputError(f"{path}: {name}: holds {dtype} {list(shape)}, the manifest says "
                                      f"{entry['dtype']} {entry['shape']}")
            if offset + math.prod(shape) * dtype.itemsize != size:
                raise ValueError(f"{size} bytes do not hold {list(shape)} of {dtype}")
            # np.load(mmap_mode="r") maps alike; this keeps the mapping, so release_pages can let its pages go
            pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (ValueError, OSError, EOFError) as err:
        raise GraphInputError(f"{path}: {name}: not a readable .npy file ({err})") from None
    maps.append(pages)
    return np.frombuffer(pages, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)


def mapped_files(graph: Graph) -> tuple[mmap.mmap, ...]:
    """The file mappings a store's graph (or a rank's sampled shards') reads its arrays from; () for a graph held
    in memory. What `release_pages` lets go, and what gnnc.graph.sampling.take reads a region at a time."""
    return tuple(graph._views.get(_MAPS, ()))


def array_file(graph: Graph, name: str, tensor: torch.Tensor) -> tuple[Path, dict[str, Any]] | None:
    """The store file `tensor`, the graph's array `name` (x: the features), is mapped from, with its manifest
    entry (size, dtype, shape, sha256), while the tensor is still the whole array mapped from it and the file has
    the identity it had when `open_store` checked it; None otherwise (a graph held in memory, an array replaced
    since, a file changed since). What lets a plan copy a store's features by the kernel, with the store's checksum,
    rather than read, hash and write them again (gnnc.plan.shards.write_features)."""
    held = graph._views.get(_SOURCES, {}).get(name)
    if held is None:
        return None
    path, entry, identity, address = held
    if tensor.layout != torch.strided or tensor.data_ptr() != address or list(tensor.shape) != entry["shape"] or \
            not tensor.is_contiguous():  # (a sparse tensor has no data pointer: not the file's pages)
        return None
    try:
        same = _identity(path) == identity
    except OSError:
        return None
    return (path, dict(entry)) if same else None


def stored_structure(graph: Graph) -> tuple[Path, str] | None:
    """The store `graph` was opened from (its directory, absolute, and its manifest's sha256) while the graph's
    in-edge CSR and edge data are still the store's files, unchanged since the open (`array_file`): what a rank
    that opens the same store reads the same edges from (gnnc.plan.shards: a plan's structures built by its ranks).
    None for a graph held in memory or one whose structure was replaced."""
    root = graph._views.get(_ROOT)
    csr = graph._views.get(("csr", "plain"))
    if root is None or csr is None:
        return None
    arrays = [("in.indptr", csr.indptr), ("in.indices", csr.indices), ("in.eids", csr.eids),
              *((edge_data.PREFIX + k, v) for k, v in graph.edge_data.items())]
    return root if all(array_file(graph, name, t) is not None for name, t in arrays) else None


def keep_mapped_files(graph: Graph, maps: list[mmap.mmap]) -> None:
    """Record `maps` as the mappings `graph`'s arrays were read from (`mapped_files`, `release_pages`)."""
    graph._views[_MAPS] = maps


def forget_derived(graph: Graph) -> None:
    """Drop what `graph` derived and cached (CSRs, self-loop edges, gcn_norm: rebuilt if read again), keeping a
    store's mappings and the CSR it stored (read from them, not derived: sorting the edges again might order a
    row's entries otherwise)."""
    kept = (_MAPS, _SOURCES, _ROOT, ("csr", "plain")) if _MAPS in graph._views else ()
    graph._views = {k: v for k, v in graph._views.items() if k in kept}


def release_pages(graph: Graph) -> None:
    """Let go of the pages a store's graph has read so far (they stay in the page cache; a later read maps
    them again). A shard writer calls it after each rank's rows: those were gathered and written, and the
    process's resident set would otherwise grow to the whole feature matrix over the ranks."""
    _let_go(mapped_files(graph))


def _let_go(maps: tuple[mmap.mmap, ...] | list[mmap.mmap]) -> None:
    for pages in maps:
        pages.madvise(mmap.MADV_DONTNEED)


def _blocks(arr: np.ndarray, pages: mmap.mmap | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) of `arr` in blocks of about BLOCK_BYTES; with `pages` (the mapping `arr` is over), each
    block's pages are let go once the caller is done with it: a check that let them go only after the whole array
    held one edge array resident (8 bytes per edge: the one-tenth papers100M's open peaked 1.1 GiB over the
    interpreter, 12 GiB at its full size)."""
    row_bytes = max(arr.itemsize * math.prod(arr.shape[1:]), 1)
    step = max(BLOCK_BYTES // row_bytes, 1)
    for lo in range(0, len(arr), step):
        yield lo, np.asarray(arr[lo:lo + step])
        if pages is not None:
            pages.madvise(mmap.MADV_DONTNEED)


def _check_shape(path: Path, name: str, arr: np.ndarray, want: tuple[int | None, ...]) -> None:
    if arr.ndim != len(want) or any(w is not None and s != w for s, w in zip(arr.shape, want)):
        shown = ", ".join("*" if w is None else str(w) for w in want)
        raise GraphInputError(f"{path}: {name}: expected shape [{shown}], got {list(arr.shape)}")


def _check_range(path: Path, name: str, arr: np.ndarray, low: int, high: int, pages: mmap.mmap | None = None) -> None:
    """Every value of `arr` in [low, high), checked block by block (`pages`: as `_blocks`)."""
    for lo, block in _blocks(arr, pages):
        if len(block) and (int(block.min()) < low or int(block.max()) >= high):
            at = lo + int(np.nonzero((block < low) | (block >= high))[0][0])
            raise GraphInputError(f"{path}: {name}: value {int(arr[at])} at {at} is out of range [{low}, {high})")


def _check_indptr(path: Path, name: str, indptr: np.ndarray, nnz: int, pages: mmap.mmap | None = None) -> None:
    if int(indptr[0]) != 0 or int(indptr[-1]) != nnz:
        raise GraphInputError(f"{path}: {name}: must run from 0 to {nnz}, runs from {int(indptr[0])} to "
                              f"{int(indptr[-1])}")
    last = 0
    for lo, block in _blocks(indptr, pages):
        if int(block[0]) < last or (len(block) > 1 and bool((block[1:] < block[:-1]).any())):
            raise GraphInputError(f"{path}: {name}: decreases near row {lo}")
        last = int(block[-1])


def _check_nonzeros(path: Path, arr: np.ndarray, nonzeros: int, pages: mmap.mmap | None = None) -> None:
    """x's nonzero values, counted block by block (`pages`: as `_blocks`), are those its entry records."""
    counted = sum(int(np.count_nonzero(block)) for _, block in _blocks(arr, pages))
    if counted != nonzeros:
        raise GraphInputError(f"{path}: x: holds {counted} nonzero values, the manifest says {nonzeros}")


def x_nonzeros(graph: Graph) -> int | None:
    """The nonzero values of a store's features as its manifest records them (gnnc.graph.storage.input_density
    reads them instead of counting), while `graph.x` is still the whole array mapped from the unchanged file
    (array_file); None for a graph held in memory, features replaced, or a store written without the count."""
    held = array_file(graph, COUNTED, graph.x) if isinstance(graph.x, torch.Tensor) else None
    return None if held is None else held[1].get("nonzeros")


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """A tensor over the mapped pages (no copy). torch warns that it could write to a read-only array: gnnc
    never writes into a graph's arrays (a write would fault, which the store's tests would show)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def open_store(path: str | os.PathLike, stamps: str | os.PathLike | None = None) -> Graph:
    """The graph a store holds, its arrays memory-mapped; GraphInputError naming the file at the first problem.
    `stamps`: the folder of verification stamps (module docstring); None checks every byte at every open."""
    root = Path(path)
    began = time.time_ns()
    folder = None if stamps is None else Path(stamps)
    manifest, digest = _manifest(root)
    where = root / MANIFEST
    entries = manifest["arrays"]
    fixed = ("src", "dst", "in.indptr", "in.indices", "in.eids", "out.indptr", "out.indices", "out.eids",
             "out.perm", "x", "y", *MASKS)
    for name in fixed:
        if name not in entries:
            raise GraphInputError(f"{where}: arrays: {name} missing")
    extra = [k for k in entries if k not in fixed and not k.startswith(edge_data.PREFIX)]
    if extra:
        raise GraphInputError(f"{where}: arrays: unknown array {extra[0]!r}")
    maps: list[mmap.mmap] = []
    file = {name: root / entry["file"] for name, entry in entries.items()}
    identities = {**file, MANIFEST: root / MANIFEST}
    verified = _stamped(folder, root, digest, identities)
    seen: dict[str, list[int]] = {} if folder is not None else None  # type: ignore[assignment]
    if seen is not None:
        seen[MANIFEST] = _identity(root / MANIFEST)
    a = {name: _open_array(root, name, entry, maps, verified, seen) for name, entry in entries.items()}
    # each file's identity once checked, what array_file compares later (a file replaced during the check differs
    # from the bytes checked: what then relies on the manifest's checksum, a plan's features, is checked by its reader)
    checked = {name: _identity(path) for name, path in file.items()}
    mapped = dict(zip(entries, maps))  # _open_array appends each array's mapping in this order
    n, e = manifest["num_nodes"], manifest["num_edges"]
    if n == 0 or e == 0:
        raise GraphInputError(f"{where}: empty graph ({n} vertices, {e} edges)")
    for name in ("src", "dst", "in.indices", "in.eids", "out.indices", "out.eids", "out.perm", "in.indptr",
                 "out.indptr"):
        # the CSR's tensors are int64 (as CSR.from_edges makes them); the edge list is in gnnc's index dtype
        allowed = ("int32", "int64") if name in ("src", "dst") else ("int64",)
        if str(a[name].dtype) not in allowed:
            raise GraphInputError(f"{file[name]}: {name}: expected {' or '.join(allowed)}, got {a[name].dtype}")
    # each array's pages are let go as it is checked, block by block: the check reads every index (48 bytes per
    # edge in all), and RSS counts a mapping's resident pages, so a process that only opened a papers100M-sized
    # store held them all. A stamped store's values were checked when it was stamped: shapes only
    if not verified:
        WORK["checked"] += 1
    for name in ("src", "dst", "in.indices", "in.eids", "out.indices", "out.eids", "out.perm"):
        _check_shape(file[name], name, a[name], (e,))
        if not verified:
            _check_range(file[name], name, a[name], 0, e if name.endswith(("eids", "perm")) else n, mapped[name])
    for name in ("in.indptr", "out.indptr"):
        _check_shape(file[name], name, a[name], (n + 1,))
        if not verified:
            _check_indptr(file[name], name, a[name], e, mapped[name])
    _check_shape(file["x"], "x", a["x"], (n, None))
    if a["x"].dtype != np.float32 or a["x"].shape[1] == 0:
        raise GraphInputError(f"{file['x']}: x: expected float32 [N, F] with F > 0")
    if not verified and "nonzeros" in entries["x"]:
        _check_nonzeros(file["x"], a["x"], entries["x"]["nonzeros"], mapped["x"])
    y = a["y"]
    if y.ndim == 1 and y.dtype == np.int64:
        _check_shape(file["y"], "y", y, (n,))
        if not verified:
            _check_range(file["y"], "y", y, UNLABELLED, 2**31, mapped["y"])
    elif not (y.ndim == 2 and y.dtype == np.float32 and y.shape[0] == n):
        raise GraphInputError(f"{file['y']}: y: expected int64 [{n}] or float32 [{n}, T], got {y.dtype} "
                              f"{list(y.shape)}")
    for m in MASKS:
        _check_shape(file[m], m, a[m], (n,))
        if a[m].dtype != np.bool_:
            raise GraphInputError(f"{file[m]}: {m}: expected bool, got {a[m].dtype}")
    edges = {}
    for name in entries:
        if name.startswith(edge_data.PREFIX):
            arr = a[name]
            if arr.dtype != np.float32 or arr.ndim not in (1, 2) or arr.shape[0] != e:
                raise GraphInputError(f"{file[name]}: {name}: expected float32 [{e}] or [{e}, d], got {arr.dtype} "
                                      f"{list(arr.shape)}")
            edges[name[len(edge_data.PREFIX):]] = _tensor(arr)
    graph = Graph(n, a["src"], a["dst"], _tensor(a["x"]), _tensor(y), *(_tensor(a[m]) for m in MASKS),
                  name=manifest["name"], edge_data=edges, stand_ins=dict(manifest["stand_ins"]))
    csr = CSR(_tensor(a["in.indptr"]), _tensor(a["in.indices"]), _tensor(a["in.eids"]), n, n)
    out = CSR(_tensor(a["out.indptr"]), _tensor(a["out.indices"]), _tensor(a["out.eids"]), n, n)
    out._cache["perm_from"] = _tensor(a["out.perm"])
    csr._cache["t"] = out
    # after the kernels' copies (CSR.release_pages); the mappings, not the graph: a cycle would keep them mapped
    csr._cache[RELEASE_PAGES] = lambda: _let_go(maps)
    graph._views[("csr", "plain")] = csr  # the stored CSR: Graph.csr would sort every edge again
    keep_mapped_files(graph, maps)
    graph._views[_SOURCES] = {name: (file[name], dict(entries[name]), checked[name], a[name].ctypes.data)
                              for name in entries}
    graph._views[_ROOT] = (root.resolve(), digest)
    if not verified:
        _stamp(folder, root, digest, seen, identities, began)
    return graph
