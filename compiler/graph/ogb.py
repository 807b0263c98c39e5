"""OGB node-property datasets as OGB's download leaves them on disk, read into arrays.

Why this module exists: users come with `ogbn-*` directories that `ogb`
(or PyG's `PygNodePropPredDataset`) downloaded, as large as ogbn-products
(124M edge lines). The CSVs are read with pyarrow's CSV reader, which parses
blocks on every core where np.loadtxt uses one (on this project's 2-core
machine, shared, the two took about as long: 0.6-0.8 s for a million gzipped
edge lines), with gzip undone on the fly; the caller (`gnnc.graph.loaders`)
validates the arrays and caches the result, so a directory is parsed once.

The layout (OGB's `ogb/io/read_graph_raw.py` and its README):

  DIR/raw/edge.csv.gz          src,dst per line ([E, 2])
  DIR/raw/node-feat.csv.gz     [N, F] (optional: ogbn-proteins has none; one constant feature stands in)
  DIR/raw/node-label.csv.gz    [N, 1] classes, NaN for a vertex without a label; or [N, T] binary tasks
  DIR/raw/edge-feat.csv.gz     [E, D] (optional) -> edge data `edge.attr` (PyG's edge_attr)
  DIR/raw/num-node-list.csv.gz, num-edge-list.csv.gz   one line each: N and E
  DIR/split/<name>/{train,valid,test}.csv.gz           vertex ids, one a line (the first <name> by name)

ogbn-papers100M comes in OGB's binary form instead: `raw/data.npz`
(edge_index, node_feat, num_nodes_list, num_edges_list, optional edge_feat)
and `raw/node-label.npz` (node_label). A `.csv` without `.gz` is read too.

Undirected datasets store one direction of each edge; OGB adds the reverse
when it builds a dataset (`add_inverse_edge` in its master.csv), interleaving
each edge with its reverse, and so does gnnc for the datasets it knows by
their directory name (`ogbn_products` or `ogbn-products`: INVERSE_EDGES).
Any other directory's edges are taken as given, directed.

A heterogeneous dataset (ogbn-mag: raw/relations/, raw/node-feat/<type>/,
num-node-dict.csv.gz) is refused, naming what a homogeneous one would have.
"""
from __future__ import annotations

import gzip
import math
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnc.errors import GraphInputError
from gnnc.host import format_bytes

# OGB's master.csv `add_inverse_edge` of its homogeneous node-property datasets
INVERSE_EDGES = {"ogbn-products": True, "ogbn-proteins": True, "ogbn-arxiv": False, "ogbn-papers100M": False}
EDGE_FEATURES = "attr"  # the edge data OGB's edge_feat becomes (edge.attr, as PyG names it edge_attr)
SPLITS = (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test"))
_HETERO_MARKS = ("relations", "node-feat", "num-node-dict.csv.gz", "triplet-type-list.csv.gz")


@dataclass
class OgbArrays:
    """What a directory holds, unvalidated (loaders.build_graph checks it): the fields of a .npz."""

    name: str
    num_nodes: int
    edge_index: np.ndarray  # [2, E]
    x: np.ndarray | None  # [N, F], None when the dataset has no vertex features
    y: np.ndarray  # [N, 1] or [N, T], float (NaN: no label)
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    edges: dict[str, np.ndarray] = field(default_factory=dict)  # edge data by `edge.NAME` name


def is_ogb_dir(root: Path) -> bool:
    return (root / "raw").is_dir()


def dataset_name(root: Path) -> str:
    """`ogbn-products` for OGB's folder `ogbn_products` (its name with '_' for '-')."""
    return root.resolve().name.replace("_", "-")


def ogb_files(root: Path) -> list[Path]:
    """The files a load reads (their bytes key the cache); GraphInputError naming what is missing."""
    raw = root / "raw"
    _refuse_hetero(root)
    if (raw / "data.npz").is_file():
        files = [raw / "data.npz", _file(raw, "node-label", required=True, binary=True)]
    else:
        files = [_file(raw, name, required=name in ("edge", "node-label"))
                 for name in ("edge", "node-feat", "node-label", "edge-feat", "num-node-list", "num-edge-list")]
    split = split_dir(root)
    if split is not None:
        files += [_file(split, name, required=True) for _, name in SPLITS]
    return [f for f in files if f is not None]


def _refuse_hetero(root: Path) -> None:
    raw = root / "raw"
    marks = [m for m in _HETERO_MARKS if (raw / m).exists()]
    if marks and _file(raw, "edge", required=False) is None:
        raise GraphInputError(f"{root}: a heterogeneous OGB dataset (it has raw/{', raw/'.join(marks)}: several "
                              f"vertex and edge types, as ogbn-mag); gnnc reads homogeneous graphs, and "
                              f"raw/edge.csv.gz, raw/node-label.csv.gz and raw/num-node-list.csv.gz are missing")


def _file(folder: Path, name: str, required: bool, binary: bool = False) -> Path | None:
    candidates = [folder / f"{name}.npz"] if binary else [folder / f"{name}.csv.gz", folder / f"{name}.csv"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if required:
        raise GraphInputError(f"{folder / name}{'.npz' if binary else '.csv(.gz)'}: missing (an OGB node-property "
                              f"directory needs raw/edge and raw/node-label, or raw/data.npz and "
                              f"raw/node-label.npz; split/<name>/train, valid and test if split/ exists)")
    return None


def split_dir(root: Path) -> Path | None:
    split = root / "split"
    if not split.is_dir():
        return None
    names = sorted(p for p in split.iterdir() if p.is_dir())
    if not names:
        raise GraphInputError(f"{split}: has no split directory (expected split/<name>/train.csv.gz ...)")
    return names[0]


_NULLS = ["", "nan", "NaN", "NAN"]
CSV_BLOCK_BYTES = 1 << 24  # what pyarrow parses at a time (a block of a streamed file: about 1M edge lines)


def read_csv(path: Path, dtype: type, field_name: str) -> np.ndarray:
    """A headerless numeric CSV as a [rows, columns] array; an empty field or `nan` is NaN (a float dtype only).

    pyarrow parses in parallel blocks; each column is copied into one preallocated array, so the peak is
    the parsed table plus the result.
    """
    import pyarrow as pa  # deferred: a heavy import that only loading an OGB directory needs
    from pyarrow import csv

    try:
        table = csv.read_csv(path, read_options=csv.ReadOptions(autogenerate_column_names=True,
                                                                block_size=CSV_BLOCK_BYTES),
                             # pandas, which OGB writes its files with, writes a NaN label as an empty line
                             parse_options=csv.ParseOptions(ignore_empty_lines=False),
                             convert_options=csv.ConvertOptions(
                                 column_types=None, strings_can_be_null=False,
                                 null_values=_NULLS, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, EOFError, zlib.error) as err:
        message = str(err).splitlines()[0][:300]
        if isinstance(err, pa.ArrowInvalid) and "Empty CSV file" in message:
            return np.zeros((0, 1), dtype=dtype)
        raise GraphInputError(f"{path}: {field_name}: not a readable CSV of numbers ({message})") from None
    return _columns_array(table.columns, table.num_rows, dtype, path, field_name, 0)


def csv_blocks(path: Path, dtype: type, field_name: str) -> Iterator[np.ndarray]:
    """The rows of a headerless numeric CSV as [rows, columns] arrays of about CSV_BLOCK_BYTES of text each,
    checked as read_csv checks the whole file: what `gnnc convert` reads a file too large to hold with.

    Every column's type is set from the first line's column count (int64 for an integer dtype, float64
    otherwise), not inferred: a streamed file's types are inferred from its first block, and features
    written as `0`/`1` there and `0.5` further on would stop the read halfway.
    """
    import pyarrow as pa
    from pyarrow import csv

    columns = _first_line_columns(path, field_name)
    if columns == 0:
        return
    kind = pa.int64() if np.dtype(dtype).kind in "iu" else pa.float64()
    row = 0
    try:
        reader = csv.open_csv(path, read_options=csv.ReadOptions(autogenerate_column_names=True,
                                                                 block_size=CSV_BLOCK_BYTES),
                              parse_options=csv.ParseOptions(ignore_empty_lines=False),
                              convert_options=csv.ConvertOptions(
                                  column_types={f"f{j}": kind for j in range(columns)}, strings_can_be_null=False,
                                  null_values=_NULLS, quoted_strings_can_be_null=False))
        for batch in reader:
            yield _columns_array(batch.columns, batch.num_rows, dtype, path, field_name, row)
            row += batch.num_rows
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, EOFError, zlib.error) as err:
        message = str(err).splitlines()[0][:300]
        raise GraphInputError(f"{path}: {field_name}: not a readable CSV of numbers ({message}; in the block of "
                              f"rows from {row + 1})") from None


def _first_line_columns(path: Path, field_name: str) -> int:
    """The fields of a CSV's first line (0: an empty file)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            line = f.readline()
    except (OSError, EOFError, zlib.error) as err:
        raise GraphInputError(f"{path}: {field_name}: not a readable CSV of numbers ({err})") from None
    return line.count(b",") + 1 if line else 0


def _columns_array(columns: list, num_rows: int, dtype: type, path: Path, field_name: str,
                   first_row: int) -> np.ndarray:
    """pyarrow columns (of a table or a streamed block whose first row is `first_row`) as one [rows, columns]
    array of `dtype`; GraphInputError naming the line of a value that is not a number of that kind."""
    import pyarrow as pa

    out = np.empty((num_rows, len(columns)), dtype=dtype)
    kind = np.dtype(dtype).kind
    for j, column in enumerate(columns):
        if pa.types.is_null(column.type):  # every field of the column empty
            column = column.cast(pa.float64())
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            row, bad = next(((k, v) for k, v in enumerate(column.to_pylist()) if v is not None and not _number(v)),
                            (0, "?"))
            raise GraphInputError(f"{path}:{first_row + row + 1}: {field_name}: column {j + 1} holds "
                                  f"{str(bad)[:40]!r}, not a number")
        if column.null_count and kind != "f":
            row = int(np.nonzero(column.is_null().to_numpy(zero_copy_only=False))[0][0])
            raise GraphInputError(f"{path}:{first_row + row + 1}: {field_name}: an empty field or NaN, where a "
                                  f"number must be")
        values = column.to_numpy(zero_copy_only=False)  # nulls of a float column come back as NaN
        if kind in "iu" and values.dtype.kind == "f":
            raise GraphInputError(f"{path}: {field_name}: column {j + 1} holds non-integer values")
        out[:, j] = values
    return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_ogb_dir(root: Path, read_npz: Callable[[Path], dict[str, np.ndarray]]) -> OgbArrays:
    """The arrays of an OGB node-property directory (see the module docstring); `read_npz` reads the binary
    form's `.npz` files (gnnc.graph.loaders.read_npz: no pickle, every shape checked against the memory
    before it is allocated; the loaders pass theirs, since they import this module)."""
    ogb_files(root)  # refuses a heterogeneous or incomplete directory before anything is parsed
    raw = root / "raw"
    edge_feat = None
    if (raw / "data.npz").is_file():
        data = read_npz(raw / "data.npz")
        _require(raw / "data.npz", "edge_index", data)
        edge_index, x, edge_feat = data["edge_index"], data.get("node_feat"), data.get("edge_feat")
        y = _npz_labels(raw, read_npz)
        counts = {"num-node-list": data.get("num_nodes_list"), "num-edge-list": data.get("num_edges_list")}
    else:
        edges = read_csv(_file(raw, "edge", True), np.int64, "edge_index")
        if edges.shape[1] != 2:
            raise GraphInputError(f"{_file(raw, 'edge', True)}: edge_index: rows must be 'src,dst', "
                                  f"got {edges.shape[1]} columns")
        edge_index = edges.T
        feat_path = _file(raw, "node-feat", False)
        x = read_csv(feat_path, np.float32, "x") if feat_path is not None else None
        y = read_csv(_file(raw, "node-label", True), np.float64, "y")  # NaN: a vertex without a label
        edge_path = _file(raw, "edge-feat", False)
        edge_feat = read_csv(edge_path, np.float32, "edge_attr") if edge_path is not None else None
        counts = _csv_counts(raw)
    n = _count(counts["num-node-list"], "num-node-list", root)
    if n is None:
        n = len(x) if x is not None else len(y)
    if x is not None and len(x) != n:
        raise GraphInputError(f"{root}: x: node-feat has {len(x)} rows but num-node-list says {n}")
    e = _count(counts["num-edge-list"], "num-edge-list", root)
    if e is not None and edge_index.shape[-1] != e:
        raise GraphInputError(f"{root}: edge_index: raw/edge has {edge_index.shape[-1]} edges but num-edge-list "
                              f"says {e}")
    if edge_feat is not None and edge_feat.ndim == 1:
        edge_feat = edge_feat[:, None]
    name = dataset_name(root)
    if INVERSE_EDGES.get(name, False):
        edge_index, edge_feat = _with_inverse(edge_index, edge_feat)
    return OgbArrays(name, n, edge_index, x, y, split_masks(root, n),
                     {EDGE_FEATURES: edge_feat} if edge_feat is not None else {})


def _require(path: Path, key: str, members: Mapping[str, object]) -> None:
    """Refuses an `.npz` file without the member `key`, naming what it has."""
    if key not in members:
        raise GraphInputError(f"{path}: {key}: missing (has {', '.join(sorted(members))})")


def _npz_labels(raw: Path, read_npz: Callable[[Path], dict[str, np.ndarray]]) -> np.ndarray:
    """The binary layout's labels, raw/node-label.npz's `node_label` (NaN: a vertex without a label)."""
    labels = read_npz(raw / "node-label.npz")
    _require(raw / "node-label.npz", "node_label", labels)
    return labels["node_label"]


def _csv_counts(raw: Path) -> dict[str, np.ndarray | None]:
    """The CSV layout's per-graph count lists, None where the file is absent."""
    return {key: (read_csv(p, np.int64, key).ravel() if p is not None else None)
            for key in ("num-node-list", "num-edge-list") for p in [_file(raw, key, False)]}


def split_masks(root: Path, n: int) -> dict[str, np.ndarray]:
    """The split's masks by Graph field name ({} without split/), each vertex id checked against `n`."""
    masks = {}
    split = split_dir(root)
    if split is not None:
        for mask_name, file_name in SPLITS:
            path = _file(split, file_name, True)
            idx = read_csv(path, np.int64, mask_name).ravel()
            if len(idx) and (idx.min() < 0 or idx.max() >= n):
                bad = int(idx[(idx < 0) | (idx >= n)][0])
                raise GraphInputError(f"{path}: {mask_name}: vertex id {bad} is out of range (the graph has {n} "
                                      f"vertices)")
            mask = np.zeros(n, dtype=bool)
            mask[idx] = True
            masks[mask_name] = mask
    return masks


def _count(values: np.ndarray | None, what: str, root: Path) -> int | None:
    """The one graph's count from OGB's per-graph count list (a node-property dataset is one graph)."""
    if values is None:
        return None
    values = np.asarray(values).ravel()
    if len(values) != 1:
        raise GraphInputError(f"{root}: {what}: lists {len(values)} graphs; a node-property dataset is one graph")
    return int(values[0])


def _with_inverse(edge_index: np.ndarray, edge_feat: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Each edge followed by its reverse, the features repeated alike: OGB's add_inverse_edge, in its order."""
    both = np.repeat(edge_index, 2, axis=1)
    both[0, 1::2] = edge_index[1]
    both[1, 1::2] = edge_index[0]
    return both, (np.repeat(edge_feat, 2, axis=0) if edge_feat is not None else None)


# --- reading in blocks (gnnc convert) ---------------------------------------------------------------

NPZ_BLOCK_BYTES = 16 << 20  # what one read of an .npz member holds (twice: zipfile reads into a copy)
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@dataclass
class NpzMember:
    """One array of an .npz, read from the archive in blocks, never whole unless asked: OGB's own
    ogbn-papers100M data.npz is compressed (np.savez_compressed), so a member cannot be mapped in place."""

    path: Path
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool

    @property
    def nbytes(self) -> int:
        """What the array takes once read (Python ints: a forged shape cannot overflow)."""
        return math.prod(self.shape) * self.dtype.itemsize

    def elements(self, per_block: int) -> Iterator[np.ndarray]:
        """Its elements in the order they are stored (C or Fortran), `per_block` at a time (the last fewer)."""
        per_block = max(per_block, 1)
        total = math.prod(self.shape)
        try:
            with zipfile.ZipFile(self.path) as archive, archive.open(f"{self.name}.npy") as member:
                _npy_header(member)
                done = 0
                while done < total:
                    block = np.empty(min(per_block, total - done), dtype=self.dtype)
                    view = memoryview(block).cast("B")
                    got = 0
                    while got < len(view):
                        n = member.readinto(view[got:])
                        if not n:
                            raise EOFError(f"ends after {done + got // self.dtype.itemsize} of {total} values")
                        got += n
                    done += len(block)
                    yield block
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error, ValueError) as err:
            raise GraphInputError(f"{self.path}: {self.name}: not a readable .npz member (truncated or damaged: "
                                  f"{err})") from None

    def rows(self) -> Iterator[np.ndarray]:
        """Blocks of rows (axis 0) in C order, of about NPZ_BLOCK_BYTES each. A Fortran-order member of 2
        dimensions or more is stored column by column, so its rows are only whole once all of it is read:
        it is read whole (np.save writes a transposed view so; OGB's features are in C order)."""
        if self.fortran and len(self.shape) > 1:
            whole = np.concatenate(list(self.elements(math.prod(self.shape)))) if math.prod(self.shape) else \
                np.empty(0, self.dtype)
            yield np.ascontiguousarray(whole.reshape(self.shape, order="F"))
            return
        tail = self.shape[1:]
        per_row = max(math.prod(tail), 1)
        rows = max(NPZ_BLOCK_BYTES // (per_row * self.dtype.itemsize), 1)
        for block in self.elements(rows * per_row):
            yield block.reshape((-1, *tail))


def _npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version not in _NPY_HEADERS:
        raise ValueError(f".npy format version {version} is not supported")
    return _NPY_HEADERS[version](f)


def npz_members(path: Path) -> dict[str, NpzMember]:
    """The arrays of an .npz by name, their headers read and checked (an array of Python objects, which only
    pickle could read, is refused; a declared shape larger than the member holds too), nothing else read."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise GraphInputError(f"{path}: not an .npz file (no zip archive header; write it with numpy.savez)")
        members = {}
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                with archive.open(info) as member:
                    shape, fortran, dtype = _npy_header(member)
                    header = member.tell()
                if dtype.hasobject:
                    raise GraphInputError(f"{path}: {name}: holds an array that needs pickle to read (refused)")
                members[name] = NpzMember(path, name, dtype, tuple(shape), bool(fortran))
                if members[name].nbytes > info.file_size - header:  # np.load would allocate it before reading
                    raise GraphInputError(f"{path}: {name}: declares shape {list(shape)} of {dtype} "
                                          f"({format_bytes(members[name].nbytes)}) but holds "
                                          f"{format_bytes(info.file_size - header)}; the file is damaged or forged")
        return members
    except (EOFError, zipfile.BadZipFile, zlib.error) as err:  # a truncated or damaged archive
        raise GraphInputError(f"{path}: not a readable .npz file (truncated or damaged: {err})") from None
    except (OSError, ValueError) as err:
        raise GraphInputError(f"{path}: not a readable .npz file ({err})") from None


EdgeBlocks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]
RowBlocks = Callable[[], Iterator[np.ndarray]]


@dataclass
class OgbStream:
    """An OGB node-property directory as `gnnc convert` reads it: the per-vertex arrays whole (O(N): labels
    and the split), the edges, features and edge features as functions that yield blocks; unvalidated beyond
    the layout and the counts (gnnc.graph.ogb_store.write_ogb_store checks every block as build_graph would)."""

    name: str
    num_nodes: int  # the count file's; else the features' rows where known ahead, else the labels' rows
    nodes_from_count: bool
    y: np.ndarray
    masks: dict[str, np.ndarray]
    edges: EdgeBlocks  # (src, dst) blocks in edge order, each edge followed by its reverse where OGB adds it
    num_edges: int | None  # what `edges` yields in all, where a count or a header says it ahead
    x: RowBlocks | None  # [rows, F] blocks
    edge_feat: RowBlocks | None  # [rows, D] blocks, in the edges' order


def stream_ogb_dir(root: Path, read_npz: Callable[[Path], dict[str, np.ndarray]]) -> OgbStream:
    """What read_ogb_dir reads, with the edges, features and edge features left in the files to be read in
    blocks; `read_npz` reads node-label.npz (whole: one label per vertex)."""
    ogb_files(root)
    raw = root / "raw"
    name = dataset_name(root)
    inverse = INVERSE_EDGES.get(name, False)
    x_rows = None
    if (raw / "data.npz").is_file():
        members = npz_members(raw / "data.npz")
        _require(raw / "data.npz", "edge_index", members)
        edge_index, feat, efeat = members["edge_index"], members.get("node_feat"), members.get("edge_feat")
        if len(edge_index.shape) != 2 or edge_index.shape[0] != 2:
            raise GraphInputError(f"{root}: edge_index: expected shape [2, E], got {list(edge_index.shape)}")
        y = _npz_labels(raw, read_npz)
        counts = {key: (np.concatenate([np.empty(0, members[field].dtype), *members[field].elements(1 << 20)])
                        if field in members else None)
                  for key, field in (("num-node-list", "num_nodes_list"), ("num-edge-list", "num_edges_list"))}
        raw_edges: EdgeBlocks = lambda: _npz_edges(edge_index)  # noqa: E731
        x = (lambda: feat.rows()) if feat is not None else None
        if feat is not None:
            x_rows = feat.shape[0] if feat.shape else 0
        edge_rows = (lambda: (b if b.ndim == 2 else b[:, None] for b in efeat.rows())) if efeat is not None else None
        e_known = edge_index.shape[1]
    else:
        edge_path = _file(raw, "edge", True)
        raw_edges = lambda: _csv_edges(edge_path)  # noqa: E731
        feat_path, efeat_path = _file(raw, "node-feat", False), _file(raw, "edge-feat", False)
        x = (lambda: csv_blocks(feat_path, np.float32, "x")) if feat_path is not None else None
        edge_rows = (lambda: csv_blocks(efeat_path, np.float32, "edge_attr")) if efeat_path is not None else None
        y = read_csv(_file(raw, "node-label", True), np.float64, "y")
        counts = _csv_counts(raw)
        e_known = None
    n = _count(counts["num-node-list"], "num-node-list", root)
    from_count = n is not None
    if n is None:
        n = x_rows if x_rows is not None else len(y)
    elif x_rows is not None and x_rows != n:
        raise GraphInputError(f"{root}: x: node-feat has {x_rows} rows but num-node-list says {n}")
    e = _count(counts["num-edge-list"], "num-edge-list", root)
    if e is not None and e_known is not None and e_known != e:
        raise GraphInputError(f"{root}: edge_index: raw/edge has {e_known} edges but num-edge-list says {e}")

    def edges() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        seen = 0
        for src, dst in raw_edges():
            seen += len(src)
            if e is not None and seen > e:
                raise GraphInputError(f"{root}: edge_index: raw/edge has more edges than num-edge-list's {e}")
            yield _inverse_block(src, dst) if inverse else (src, dst)
        if e is not None and seen != e:
            raise GraphInputError(f"{root}: edge_index: raw/edge has {seen} edges but num-edge-list says {e}")

    def x_blocks() -> Iterator[np.ndarray]:
        rows = 0
        for block in x():
            rows += len(block)
            yield block
        if from_count and rows != n:
            raise GraphInputError(f"{root}: x: node-feat has {rows} rows but num-node-list says {n}")

    def edge_feat() -> Iterator[np.ndarray]:
        for block in edge_rows():
            yield np.repeat(block, 2, axis=0) if inverse else block

    total = e if e is not None else e_known
    return OgbStream(name, n, from_count, y, split_masks(root, n), edges,
                     None if total is None else total * (2 if inverse else 1), x_blocks if x is not None else None,
                     edge_feat if edge_rows is not None else None)


def _npz_edges(edge_index: NpzMember) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) blocks of a [2, E] member: in C order all sources come first, then all destinations (read
    twice, the sources' pass stopping at E); in Fortran order ([E, 2] transposed, as OGB's `.T` leaves it)
    each edge's pair is together."""
    e = edge_index.shape[1]
    per_block = NPZ_BLOCK_BYTES // max(edge_index.dtype.itemsize, 1)
    if edge_index.fortran:
        for block in edge_index.elements(per_block - per_block % 2):
            pairs = block.reshape(-1, 2)
            yield pairs[:, 0], pairs[:, 1]
        return
    # C order: the destinations start E values in; read them beside the sources from a second reader
    sources, targets = edge_index.elements(per_block), edge_index.elements(per_block)
    skipped = 0
    pending = np.empty(0, edge_index.dtype)
    while skipped < e:  # advance the second reader past the sources
        block = next(targets)
        take = min(len(block), e - skipped)
        skipped += take
        pending = block[take:]
    done = 0
    for block in sources:
        block = block[: e - done]
        if not len(block):
            break
        while len(pending) < len(block):
            pending = np.concatenate([pending, next(targets)])
        yield block, pending[: len(block)]
        pending = pending[len(block):]
        done += len(block)


def _csv_edges(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for block in csv_blocks(path, np.int64, "edge_index"):
        if block.shape[1] != 2:
            raise GraphInputError(f"{path}: edge_index: rows must be 'src,dst', got {block.shape[1]} columns")
        yield block[:, 0], block[:, 1]


def _inverse_block(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The block's edges each followed by its reverse (_with_inverse's order, block by block)."""
    s, d = np.repeat(src, 2), np.repeat(dst, 2)
    s[1::2], d[1::2] = dst, src
    return s, d
