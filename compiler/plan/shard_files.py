"""Per-part shards of a partitioned graph on disk, with checksums.

A worker of a distributed run should load only its own part: its vertices'
rows, their in-edges, and the table of which rows it receives from and sends
to each other part. `write_shards` writes one `.npz` per part and a
`manifest.json` holding every shard's sha256; `read_shard` checks the
manifest and the shard's size and checksum before it reads a single array,
so a missing, truncated or altered shard fails with PlanError up front
instead of as a wrong answer later. Every file is written to a temporary
name and moved into place (os.replace), so a crash never leaves a half
shard under the real name.

A partition's directory (`gnnc partition -o DIR`) also holds `assignment.npy`, the part of every vertex
(int64 [N]), listed with its size and sha256 in the manifest's `assignment`: `gnnc compile --partition-from DIR`
reads the split from it (`read_assignment`) without reading a shard.

Shard arrays (part i, n_i owned vertices, r_i remote ones):
  global_ids [n_i]      owned vertices, increasing global id (local rows 0..n_i-1)
  remote_ids [r_i]      B_i ordered by (owner, global id): local columns n_i.. (the order owners send in)
  remote_owner [r_i]    the part owning each remote row
  indptr [n_i+1], indices [nnz]  in-edges of the owned vertices grouped by destination; indices are
                        local columns (owned rows first, then remote rows)
  edge_ids [nnz]        each edge's position in the graph's edge order (per-edge data lookups)
  send_ptr [P+1], send_idx  rows sent to part j: local rows send_idx[send_ptr[j]:send_ptr[j+1]],
                        ordered by global id (the order j expects them in)
  x, y, train_mask, val_mask, test_mask   the owned vertices' data
  edata.<NAME> [nnz] or [nnz, d]  the graph's edge data `edge.NAME` of those edges, in the same order
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.files import atomic_writer, file_sha256, into_place, temporary_for
from gnnc.errors import PlanError, write_failure
from gnnc.graph import Graph
from gnnc.graph.store import release_pages

SHARD_FORMAT = 1
MANIFEST = "manifest.json"
ASSIGNMENT = "assignment.npy"  # a partition directory's split, every vertex's part
ARRAYS = ("global_ids", "remote_ids", "remote_owner", "indptr", "indices", "edge_ids", "send_ptr", "send_idx",
          "x", "y", "train_mask", "val_mask", "test_mask")
EDGE_DATA = "edata."  # prefix of the arrays of edge data


@dataclass(frozen=True, eq=False)
class Shard:
    """One part's slice of the graph (see the module docstring for each array)."""

    part: int
    parts: int
    num_nodes: int
    global_ids: np.ndarray
    remote_ids: np.ndarray
    remote_owner: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray
    send_ptr: np.ndarray
    send_idx: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    edge_data: dict[str, np.ndarray] = field(default_factory=dict)  # `edge.NAME` of the shard's edges

    def sends_to(self, part: int) -> np.ndarray:
        """Local rows this part sends to `part` each layer."""
        return self.send_idx[self.send_ptr[part]:self.send_ptr[part + 1]]

    def global_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of this shard's edges in global ids."""
        columns = np.concatenate([self.global_ids, self.remote_ids])
        dst = np.repeat(self.global_ids, np.diff(self.indptr))
        return columns[self.indices], dst


def _write_error(path: Path, err: OSError) -> Exception:
    # a run's shards go to a directory of their own in the temporary directory, which the user may not know
    # fills up (a plan's are in the plan: -o chose where)
    in_temp = Path(path).resolve().parent.parent == Path(tempfile.gettempdir()).resolve()
    hint = " (a run writes its shards in the temporary directory: TMPDIR chooses another)" if in_temp else ""
    return write_failure(err, f"the shard file {path}{hint}")  # the cause: Plan.save names its plan


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    try:
        with atomic_writer(path) as f:
            write(f)
    except OSError as err:
        raise _write_error(path, err) from err


_DATE = (1980, 1, 1, 0, 0, 0)  # every member's timestamp: the same arrays give the same bytes (plans are deterministic)
_BLOCK = 1 << 20  # bytes hashed and written at a time: a block is still in the cache when the write copies it


def _npy_member(arr: Any) -> tuple[bytes, memoryview]:
    """An array's .npy file as np.save writes it: the header (format 1.0, 2.0 when 1.0 cannot hold it) and the
    data in C order (a Fortran-ordered array's in its own order, as its header says), the data a view of the
    array's memory where it is contiguous, not a copy."""
    arr = np.asanyarray(arr)
    if arr.dtype.hasobject:
        raise ValueError("Object arrays cannot be saved when allow_pickle=False")
    fmt = np.lib.format
    head = io.BytesIO()
    try:
        fmt.write_array_header_1_0(head, fmt.header_data_from_array_1_0(arr))
    except ValueError:  # a header over 64 KiB (np.save moves to format 2.0 then)
        head = io.BytesIO()
        fmt.write_array_header_2_0(head, fmt.header_data_from_array_1_0(arr))
    data = arr.T if arr.flags.f_contiguous and not arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return head.getvalue(), memoryview(data.reshape(-1).view(np.uint8))


class _ZipOut:
    """A .npz (a zip of stored .npy members) written front to back, byte for byte what np.savez's zipfile writes
    with zip64 headers forced: each member's CRC is taken from the array's memory before its header, so nothing
    is seeked back over, the array is never copied into bytes, and the file's sha256 is taken as it is written
    (the shard is not read back to be hashed)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._members: list[zipfile.ZipInfo] = []

    def _put(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for i in range(0, len(view), _BLOCK):
            block = view[i:i + _BLOCK]
            self.sha256.update(block)
            self._f.write(block)
        self.size += len(view)

    def member(self, name: str, arr: Any) -> None:
        head, data = _npy_member(arr)
        info = zipfile.ZipInfo(f"{name}.npy", date_time=_DATE)
        info.external_attr = 0o600 << 16  # zipfile's default for a member it writes: ?rw-------
        info.CRC = zlib.crc32(data, zlib.crc32(head))
        info.file_size = info.compress_size = len(head) + len(data)
        info.header_offset = self.size
        self._put(info.FileHeader(True))
        self._put(head)
        self._put(data)
        self._members.append(info)

    def close(self) -> None:
        """The central directory and the end records, as zipfile's `_write_end_record` writes them."""
        start = self.size
        for info in self._members:
            dt = info.date_time
            dosdate, dostime = (dt[0] - 1980) << 9 | dt[1] << 5 | dt[2], dt[3] << 11 | dt[4] << 5 | dt[5] // 2
            size, offset, zip64 = info.file_size, info.header_offset, []
            if size > zipfile.ZIP64_LIMIT:
                zip64 += [size, size]  # stored: its compressed size is its size
                size = 0xFFFFFFFF
            if offset > zipfile.ZIP64_LIMIT:
                zip64.append(offset)
                offset = 0xFFFFFFFF
            extra = struct.pack("<HH" + "Q" * len(zip64), 1, 8 * len(zip64), *zip64) if zip64 else b""
            least = zipfile.ZIP64_VERSION if zip64 else 0
            name, flags = info._encodeFilenameFlags()
            self._put(struct.pack(zipfile.structCentralDir, zipfile.stringCentralDir,
                                  max(least, info.create_version), info.create_system,
                                  max(least, info.extract_version), info.reserved, flags, info.compress_type,
                                  dostime, dosdate, info.CRC, size, size, len(name), len(extra), 0, 0,
                                  info.internal_attr, info.external_attr, offset) + name + extra)
        end = self.size
        count, central, offset = len(self._members), end - start, start
        if count > zipfile.ZIP_FILECOUNT_LIMIT or offset > zipfile.ZIP64_LIMIT or central > zipfile.ZIP64_LIMIT:
            self._put(struct.pack(zipfile.structEndArchive64, zipfile.stringEndArchive64, 44, 45, 45, 0, 0, count,
                                  count, central, offset))
            self._put(struct.pack(zipfile.structEndArchive64Locator, zipfile.stringEndArchive64Locator, 0, end, 1))
            count, central, offset = min(count, 0xFFFF), min(central, 0xFFFFFFFF), min(offset, 0xFFFFFFFF)
        self._put(struct.pack(zipfile.structEndArchive, zipfile.stringEndArchive, 0, 0, count, count, central, offset,
                              0))


def _savez(f: Any, arrays: dict[str, np.ndarray]) -> tuple[str, int]:
    """Write `arrays` as a .npz into the open file `f`, as np.savez would with fixed entry timestamps (plans are
    deterministic); returns the bytes' (sha256, size)."""
    out = _ZipOut(f)
    for name, arr in arrays.items():
        out.member(name, arr)
    out.close()
    return out.sha256.hexdigest(), out.size


def _into_place(f: Any, tmp: str, path: Path) -> None:
    """gnnc.files.into_place on the writer's thread, so the disk's work overlaps the next shard's; its
    failure named as the shard's."""
    try:
        into_place(f, tmp, path)
    except OSError as err:
        raise _write_error(path, err) from err


class ShardWriter:
    """Writes shards one after another, each atomically (a temporary file renamed into place once it is on the
    disk), hashing each as it writes it: a plan's shards can be gigabytes (GCNII x32 on an 89,000-vertex SBM:
    1.6 GB), and reading them back to hash them cost a copy of every byte. A thread of its own waits for each
    file to reach the disk and renames it while the caller builds the next; `entries()` waits for them.

        with ShardWriter() as writer:
            for part ...: writer.write(path, part, arrays, **extra)
            entries = writer.entries()
    """

    _PENDING = 4  # shards written but not yet on the disk at most (each holds an open file)

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnnc-shard-sync")
        self._written: list[tuple[dict[str, Any] | None, Future[None], Any, str]] = []

    def write(self, path: Path, part: int, arrays: dict[str, np.ndarray], **extra: Any) -> None:
        """Write one shard; its manifest entry (size, sha256 and `extra`) comes from `entries()`."""
        self._fill(path, lambda f: _savez(f, arrays),
                   lambda written: {"part": part, "file": path.name, "bytes": written[1], "sha256": written[0], **extra})

    def _fill(self, path: Path, fill: Callable[[Any], Any],
              entry: Callable[[Any], dict[str, Any]] | None = None) -> None:
        """`fill` the new file `path` (through gnnc.files' temporary), then hand it to the thread that puts it in
        place, listed with its manifest entry (`entry` of `fill`'s result; none without). Nothing is left of it on
        an error."""
        if len(self._written) >= self._PENDING:
            self._written[-self._PENDING][1].result()
        try:
            fd, tmp = temporary_for(path)  # (in a plan being written: the file itself, gnnc.files)
        except OSError as err:
            raise _write_error(path, err) from err
        f = os.fdopen(fd, "wb")
        try:
            out = fill(f)
        except BaseException as err:
            f.close()
            Path(tmp).unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise _write_error(path, err) from err
            raise
        self._written.append((None if entry is None else entry(out), self._pool.submit(_into_place, f, tmp, path), f,
                              tmp))

    def entries(self) -> list[dict[str, Any]]:
        """Every written shard's manifest entry, in writing order, once each (and each copy) is in place."""
        for _, placed, _, _ in self._written:
            placed.result()
        return [entry for entry, _, _, _ in self._written if entry is not None]

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _, placed, f, tmp in self._written:  # a shard never put in place (an error before it) leaves nothing
            if placed.cancelled():
                f.close()
                Path(tmp).unlink(missing_ok=True)


_INT32 = np.iinfo(np.int32)
_SMALL = 4096  # bytes up to which arrays of equal values are stored once (a layer's halo counts, its empty lists)


def pack_arrays(arrays: dict[str, np.ndarray], wide: frozenset[str] | set[str] = frozenset()
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(the arrays a plan shard stores, its "packing": how `unpack_arrays` gives `arrays` back exactly).

    Why: a rank's layer structures share memory where their values are the same (the deeper layers of a
    depcache segment are prefixes of its first layer's in-edges; layers whose rows saturate share one structure;
    every layer of a segment holds the segment's row order), and a shard wrote each layer's copy: the gcnii
    example's 64 layers on Cora wrote one structure 64 times per rank (133 MB of plan for 17). An array whose
    memory begins where an array stored before it begins (same dtype and row shape, no longer), or a small one
    (`_SMALL`) equal to one stored before, is stored as a reference, "refs": {name: [stored name, rows]} (its
    values are that array's first rows). An int64 array whose values fit in int32 (ids, columns, edge ids,
    offsets of any graph under 2^31 vertices and edges) is stored as int32, listed in "int32": half the bytes
    to checksum and write. `wide` names int32 arrays that stand for int64 ones (gnnc.plan.shards: a structure's
    columns gathered as int32 for the shard): packed as those int64 arrays would be, byte for byte, without
    widening them to narrow them again."""
    out: dict[str, np.ndarray] = {}
    refs: dict[str, list[Any]] = {}
    narrowed: list[str] = []
    starts: dict[tuple[int, str, tuple[int, ...]], tuple[str, int]] = {}  # (address, dtype, row shape) -> stored
    small: dict[tuple[str, tuple[int, ...], bytes], str] = {}  # (dtype, shape, values) -> stored
    for name, arr in arrays.items():
        a = np.asarray(arr)
        stands = name in wide
        if stands and a.dtype != np.int32:
            raise ValueError(f"{name}: packed as an int64 array held as int32, but it is {a.dtype}")
        dtype = np.dtype(np.int64).str if stands else a.dtype.str  # the array's own, for references and equality
        key = (dtype, a.shape, a.astype(np.int64).tobytes() if stands else a.tobytes()) \
            if a.ndim and a.size * np.dtype(dtype).itemsize <= _SMALL else None
        if key in small:
            refs[name] = [small[key], len(a)]
            continue
        at = (a.__array_interface__["data"][0], dtype, a.shape[1:]) \
            if a.ndim and a.size and a.flags.c_contiguous else None
        held = starts.get(at)
        if held is not None and len(a) <= held[1]:
            refs[name] = [held[0], len(a)]
            continue
        if key is not None:
            small[key] = name
        if at is not None and held is None:  # `arrays` keeps every array alive meanwhile: no address is reused
            starts[at] = (name, len(a))
        if stands:
            out[name] = a
            narrowed.append(name)
        elif a.dtype == np.int64 and a.ndim and (not a.size or (_INT32.min <= a.min() and a.max() <= _INT32.max)):
            out[name] = a.astype(np.int32)
            narrowed.append(name)
        else:
            out[name] = a
    return out, {"refs": refs, "int32": narrowed}


def unpack_arrays(arrays: dict[str, np.ndarray], packing: Any, where: str) -> dict[str, np.ndarray]:
    """The arrays `pack_arrays` was given, from what it stored and its packing (PlanError if they do not fit): the
    int32 ones widened back to int64, each reference a view of the first rows of the array it names (one copy in
    memory, as the compiler held them)."""
    refs = packing.get("refs", {}) if isinstance(packing, dict) else None
    narrowed = packing.get("int32", []) if isinstance(packing, dict) else None
    if not isinstance(refs, dict) or not isinstance(narrowed, list):
        raise PlanError(f"{where}: malformed packing of the shard's arrays (compile the plan again)")
    out = dict(arrays)
    for name in narrowed:
        if not isinstance(name, str) or name not in out or out[name].dtype != np.int32:
            raise PlanError(f"{where}: the packing lists {str(name)[:60]!r} as int32, which the shard does not hold")
        out[name] = out[name].astype(np.int64)
    for name, ref in refs.items():
        ok = isinstance(ref, list) and len(ref) == 2 and ref[0] in arrays and isinstance(ref[1], int) \
            and not isinstance(ref[1], bool) and 0 <= ref[1] <= len(out[ref[0]]) and name not in arrays
        if not ok:
            raise PlanError(f"{where}: the packing's reference {str(name)[:60]!r} -> {str(ref)[:60]} names no "
                            f"stored array's rows")
        out[name] = out[ref[0]][:ref[1]]
    return out


def write_npz(path: Path, part: int, arrays: dict[str, np.ndarray], **extra: Any) -> dict[str, Any]:
    """Write one shard atomically; returns its manifest entry (size, sha256 and `extra`)."""
    with ShardWriter() as writer:
        writer.write(path, part, arrays, **extra)
        return writer.entries()[0]


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """The manifest, written last: a directory without one holds no usable shards."""
    manifest = {"format": SHARD_FORMAT, **manifest}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))  # compact: json's C encoder (plan.json's)
    _atomic_write(out / MANIFEST, lambda f: f.write(text.encode()))


def load_npz(shard_dir: str | os.PathLike, manifest: dict[str, Any], part: int,
             names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The arrays of part's shard (all, or `names`), read only after its size and checksum match."""
    path = verify_shard(shard_dir, manifest, part)
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in (names if names is not None else f.files)}
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
        raise PlanError(f"{path}: shard of part {part} is unreadable ({err})") from None


def write_shards(graph: Graph, assignment: np.ndarray, parts: int, out_dir: str | os.PathLike,
                 method: str = "", meta: dict[str, Any] | None = None,
                 progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write one shard per part and the manifest into `out_dir`; returns the manifest.

    `meta` (JSON-serialisable) is stored in the manifest as is (partition
    stats, for instance); `progress(i)` is called after shard i is written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = graph.num_nodes
    part = np.asarray(assignment, dtype=np.int64)
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    by_part = np.argsort(part[dst], kind="stable")  # edges grouped by the owner of their destination
    bounds = np.searchsorted(part[dst][by_part], np.arange(parts + 1))
    remote: list[np.ndarray] = []
    for i in range(parts):
        sel = by_part[bounds[i]:bounds[i + 1]]
        s = src[sel]
        b = np.sort(s[part[s] != i])
        b = b[np.concatenate([[True], b[1:] != b[:-1]])] if len(b) else b  # unique, by sorting
        remote.append(b[np.lexsort((b, part[b]))])
    x, y = graph.x.numpy(), graph.y.numpy()
    masks = [m.numpy() for m in (graph.train_mask, graph.val_mask, graph.test_mask)]
    local = np.full(n, -1, dtype=np.int64)
    with ShardWriter() as writer:
        for i in range(parts):
            owned = np.nonzero(part == i)[0]
            sel = by_part[bounds[i]:bounds[i + 1]]
            sel = sel[np.lexsort((sel, dst[sel]))]  # by destination, then edge order
            local[owned] = np.arange(len(owned))
            local[remote[i]] = len(owned) + np.arange(len(remote[i]))
            counts = np.bincount(local[dst[sel]], minlength=len(owned))
            indptr = np.zeros(len(owned) + 1, dtype=np.int64)
            np.cumsum(counts, out=indptr[1:])
            indices = local[src[sel]]
            send = [np.zeros(0, dtype=np.int64) if j == i else local[remote[j][part[remote[j]] == i]]
                    for j in range(parts)]
            send = [np.sort(s) for s in send]  # remote[j] restricted to owner i is already by global id
            send_ptr = np.zeros(parts + 1, dtype=np.int64)
            np.cumsum([len(s) for s in send], out=send_ptr[1:])
            arrays = {
                "global_ids": owned, "remote_ids": remote[i], "remote_owner": part[remote[i]],
                "indptr": indptr, "indices": indices, "edge_ids": sel.astype(np.int64),
                "send_ptr": send_ptr, "send_idx": np.concatenate(send) if send else np.zeros(0, np.int64),
                "x": x[owned], "y": y[owned], "train_mask": masks[0][owned], "val_mask": masks[1][owned],
                "test_mask": masks[2][owned],
                **{EDGE_DATA + k: v.numpy()[sel] for k, v in graph.edge_data.items()},
            }
            local[owned] = -1
            local[remote[i]] = -1
            writer.write(out / f"part-{i:05d}.npz", i, arrays)
            del arrays
            release_pages(graph)  # a store's graph: this part's rows are written, the next part reads its own
            if progress is not None:
                progress(i)
        entries = writer.entries()
    manifest = {
        "kind": "partition", "graph": graph.name, "num_nodes": n, "num_edges": graph.num_edges,
        "num_features": graph.num_features, "parts": parts, "method": method, "meta": meta or {},
        "shards": entries, "assignment": _write_assignment(out / ASSIGNMENT, part),
    }
    write_manifest(out, manifest)
    return read_manifest(out)


def _write_assignment(path: Path, part: np.ndarray) -> dict[str, Any]:
    """The part of every vertex as one .npy beside the shards (its manifest entry: file, bytes, sha256), so that
    `gnnc compile --partition-from DIR` reads the split in one checked file instead of every shard whole."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(part, dtype=np.int64), allow_pickle=False)
    data = buf.getvalue()
    _atomic_write(path, lambda f: f.write(data))
    return {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_assignment(shard_dir: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """(the part of every vertex, the manifest) of a `gnnc partition` directory, checked: the manifest's kind,
    the file's size and sha256, an int64 vector of num_nodes parts in [0, parts). PlanError otherwise."""
    manifest = read_manifest(shard_dir)
    if manifest.get("kind") != "partition":
        raise PlanError(f"{shard_dir}: these are a plan's shards, not a partition's (`gnnc partition -o DIR` "
                        f"writes one)")
    entry = manifest.get("assignment")
    if not isinstance(entry, dict) or entry.get("file") != ASSIGNMENT:
        raise PlanError(f"{shard_dir}: the partition lists no {ASSIGNMENT} (written by an older gnnc): run "
                        f"`gnnc partition` again")
    path = Path(shard_dir) / ASSIGNMENT
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PlanError(f"{path}: unreadable ({err.strerror or err})") from None
    if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise PlanError(f"{path}: truncated or altered (its size or sha256 is not the manifest's)")
    try:
        part = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as err:
        raise PlanError(f"{path}: not a .npy array ({err})") from None
    parts, n = manifest["parts"], manifest.get("num_nodes")
    if part.dtype != np.int64 or part.shape != (n,) or (len(part) and (part.min() < 0 or part.max() >= parts)):
        raise PlanError(f"{path}: must hold the part (0..{parts - 1}, int64) of each of the {n} vertices")
    return part, manifest


def read_manifest(shard_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a shard directory; PlanError if it is missing or malformed."""
    path = Path(shard_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: missing shard manifest (is {shard_dir} the output of `gnnc partition` or a plan's shards?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlanError(f"{path}: unreadable shard manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != SHARD_FORMAT:
        raise PlanError(f"{path}: not a shard manifest of format {SHARD_FORMAT}")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or len(shards) != manifest.get("parts"):
        raise PlanError(f"{path}: the manifest lists {len(shards) if isinstance(shards, list) else 'no'} shards "
                        f"for {manifest.get('parts')} parts")
    for i, entry in enumerate(shards):
        _check_entry(entry, i, path)
    return manifest


def _check_entry(entry: Any, part: int, path: Path) -> None:
    """A manifest's entry of one shard: its part, the name of its file in the shard directory, size and sha256.

    The file is named, never a path: a manifest is data, and a path in it (`/etc/shadow`, `../x`) would have
    the reader open and describe a file outside the plan."""
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(entry, dict):
        raise PlanError(f"{path}: shard entry {part} must be an object (part, file, bytes, sha256), got "
                        f"{str(entry)[:60]!r}")
    name = entry.get("file")
    if not (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name):
        raise PlanError(f"{path}: shard entry {part}: 'file' must name a file in the shard directory, got "
                        f"{str(name)[:60]!r}")
    digest = entry.get("sha256")
    if entry.get("part") != part or not count(entry.get("bytes")) or not (
            isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise PlanError(f"{path}: shard entry {part} must hold part {part}, its size in bytes and its sha256")


def verify_shard(shard_dir: str | os.PathLike, manifest: dict[str, Any], part: int) -> Path:
    """The path of part's shard after checking it exists with the manifest's size and sha256."""
    parts = manifest["parts"]
    if not 0 <= part < parts:
        raise PlanError(f"{shard_dir}: no shard for part {part} (the manifest has parts 0..{parts - 1})")
    entry = manifest["shards"][part]
    path = Path(shard_dir) / entry["file"]  # a plain name (read_manifest)
    if path.is_symlink() and path.resolve().parent != Path(shard_dir).resolve():
        raise PlanError(f"{path}: shard of part {part} is a link out of the shard directory; refused")
    if not path.is_file():
        raise PlanError(f"{path}: shard of part {part} is missing")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise PlanError(f"{path}: shard of part {part} is truncated or altered: {size} bytes, "
                        f"the manifest says {entry.get('bytes')}")
    digest = file_sha256(path)
    if digest != entry.get("sha256"):
        raise PlanError(f"{path}: shard of part {part} does not match its checksum "
                        f"(sha256 {digest[:12]}..., the manifest says {str(entry.get('sha256'))[:12]}...)")
    return path


def verify_shards(shard_dir: str | os.PathLike) -> dict[str, Any]:
    """Check every shard against the manifest; returns the manifest."""
    manifest = read_manifest(shard_dir)
    for part in range(manifest["parts"]):
        verify_shard(shard_dir, manifest, part)
    return manifest


def read_shard(shard_dir: str | os.PathLike, part: int) -> Shard:
    """Part's shard, read only after its size and checksum match the manifest."""
    manifest = read_manifest(shard_dir)
    arrays = load_npz(shard_dir, manifest, part)
    edges = {k[len(EDGE_DATA):]: arrays.pop(k) for k in list(arrays) if k.startswith(EDGE_DATA)}
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise PlanError(f"{shard_dir}: shard of part {part} lacks {', '.join(missing)}")
    return Shard(part=part, parts=manifest["parts"], num_nodes=manifest["num_nodes"], edge_data=edges,
                 **{k: arrays[k] for k in ARRAYS})


def assemble(shard_dir: str | os.PathLike) -> Graph:
    """The whole graph back from its shards (edges in the original order); checks every shard first."""
    manifest = verify_shards(shard_dir)
    shards = [read_shard(shard_dir, i) for i in range(manifest["parts"])]
    n, e = manifest["num_nodes"], manifest["num_edges"]
    src = np.empty(e, dtype=np.int64)
    dst = np.empty(e, dtype=np.int64)
    f = manifest["num_features"]
    x = np.empty((n, f), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    masks = [np.empty(n, dtype=bool) for _ in range(3)]
    edges = {k: np.empty((e,) + v.shape[1:], dtype=v.dtype) for k, v in shards[0].edge_data.items()}
    for sh in shards:
        s, d = sh.global_edges()
        src[sh.edge_ids], dst[sh.edge_ids] = s, d
        for k, v in edges.items():
            v[sh.edge_ids] = sh.edge_data[k]
        x[sh.global_ids], y[sh.global_ids] = sh.x, sh.y
        for m, own in zip(masks, (sh.train_mask, sh.val_mask, sh.test_mask)):
            m[sh.global_ids] = own
    return Graph(n, src, dst, torch.from_numpy(x), torch.from_numpy(y), *(torch.from_numpy(m) for m in masks),
                 name=manifest["graph"], edge_data={k: torch.from_numpy(v) for k, v in edges.items()})
