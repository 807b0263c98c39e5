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

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnnc.errors import GraphInputError

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


def read_csv(path: Path, dtype: type, field_name: str) -> np.ndarray:
    """A headerless numeric CSV as a [rows, columns] array; an empty field or `nan` is NaN (a float dtype only).

    pyarrow parses in parallel blocks; each column is copied into one preallocated array, so the peak is
    the parsed table plus the result.
    """
    import pyarrow as pa  # deferred: a heavy import that only loading an OGB directory needs
    from pyarrow import csv

    try:
        table = csv.read_csv(path, read_options=csv.ReadOptions(autogenerate_column_names=True, block_size=1 << 24),
                             # pandas, which OGB writes its files with, writes a NaN label as an empty line
                             parse_options=csv.ParseOptions(ignore_empty_lines=False),
                             convert_options=csv.ConvertOptions(
                                 column_types=None, strings_can_be_null=False,
                                 null_values=["", "nan", "NaN", "NAN"], quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, EOFError, zlib.error) as err:
        message = str(err).splitlines()[0][:300]
        if isinstance(err, pa.ArrowInvalid) and "Empty CSV file" in message:
            return np.zeros((0, 1), dtype=dtype)
        raise GraphInputError(f"{path}: {field_name}: not a readable CSV of numbers ({message})") from None
    out = np.empty((table.num_rows, table.num_columns), dtype=dtype)
    kind = np.dtype(dtype).kind
    for j, column in enumerate(table.columns):
        if pa.types.is_null(column.type):  # every field of the column empty
            column = column.cast(pa.float64())
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            row, bad = next(((k, v) for k, v in enumerate(column.to_pylist()) if v is not None and not _number(v)),
                            (0, "?"))
            raise GraphInputError(f"{path}:{row + 1}: {field_name}: column {j + 1} holds {str(bad)[:40]!r}, "
                                  f"not a number")
        if column.null_count and kind != "f":
            row = int(np.nonzero(column.is_null().to_numpy(zero_copy_only=False))[0][0])
            raise GraphInputError(f"{path}:{row + 1}: {field_name}: an empty field or NaN, where a number must be")
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
        if "edge_index" not in data:
            raise GraphInputError(f"{raw / 'data.npz'}: edge_index: missing (has {', '.join(sorted(data))})")
        edge_index, x, edge_feat = data["edge_index"], data.get("node_feat"), data.get("edge_feat")
        label_path = raw / "node-label.npz"
        labels = read_npz(label_path)
        if "node_label" not in labels:
            raise GraphInputError(f"{label_path}: node_label: missing (has {', '.join(sorted(labels))})")
        y = labels["node_label"]
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
        counts = {name: (read_csv(p, np.int64, name).ravel() if p is not None else None)
                  for name in ("num-node-list", "num-edge-list") for p in [_file(raw, name, False)]}
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
    return OgbArrays(name, n, edge_index, x, y, masks,
                     {EDGE_FEATURES: edge_feat} if edge_feat is not None else {})


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
