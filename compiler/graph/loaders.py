"""Graph inputs by name: `load_graph(spec)` turns a spec string into a Graph.

One entry point so that every command (`compile`, `run`, `partition`) and
the Python API accept the same graphs, validate them the same way and share
one on-disk cache. Specs:

* `planetoid:cora`, `planetoid:citeseer` — shipped with gnnc (public split),
  features row-normalised as PyG's NormalizeFeatures does;
  `planetoid:cora,normalize=false` keeps the raw 0/1 features.
* `rmat:n=..,deg=..,features=..,classes=..,seed=..`, `sbm:n=..,blocks=..,...`,
  `regress:n=..,targets=..,noise=..,...` (float targets), `proteins:n=..,tasks=..,edge_features=..,...`
  (multi-label targets and edge features) — generators (`gnnc.graph.generators`).
* `FILE.npz` — arrays `edge_index` [2, E] (integer), `x` [N, F] (numeric),
  `y` [N] (integer; or float with NaN for an unlabelled vertex, which is then in no mask;
  or [N, T] multi-label 0/1 targets), optional `train_mask`/`val_mask`/`test_mask` (bool [N];
  without them, a seeded 60/20/20 split, stated on stderr when a run trains
  on it; `FILE.npz,split_seed=N` picks the seed, 0 by default), optional edge
  data `edge_NAME` ([E] or [E, d]: `edge_weight`, `edge_attr`, ...; see
  gnnc.graph.edge_data). Every array's shape is read from its header and
  checked before the array is (a forged header cannot make a huge allocation).
* `FILE.pt` / `FILE.pth` — a PyG `Data` saved with `torch.save`, or a dict
  of tensors with the same field names; read with `torch.load(weights_only=True)`,
  so the file cannot run code (PyG's classes are replaced by inert stand-ins);
  its `edge_weight`, `edge_attr` and other `edge_*` fields are edge data.
  A sparse tensor (a sparse `x`) is made dense and a bf16 one float32.
* an OGB node-property dataset directory as OGB downloads it (`ogbn_arxiv/`:
  `raw/edge.csv.gz`, `raw/node-feat.csv.gz`, `raw/node-label.csv.gz`,
  optional `raw/edge-feat.csv.gz` as edge data `edge.attr`,
  `split/<name>/{train,valid,test}.csv.gz`; papers100M's `raw/data.npz`):
  see gnnc.graph.ogb. A vertex whose label is NaN is unlabelled (in no
  mask); a label file of T > 1 columns is multi-label.
* a graph store written by `gnnc convert` (gnnc.graph.store): memory-mapped.
* any other file — a SNAP-style edge list: one `src dst` pair per line
  (whitespace, tab or comma separated; lines starting with `#` or `%` are
  comments; a third column such as a weight is ignored). It carries no vertex
  data: N is the largest id + 1, x is one constant feature, y is all 0, and
  the graph records these as stand-ins (`Graph.stand_ins`): it can be
  partitioned and compiled, but training refuses it, naming what is missing.
  Errors name the file's line (`FILE:LINE: ...`, counted from 1).

A spec may end in options, `,key=value` each: `normalize=true|false` for
`planetoid:`, `split_seed=N` for a file without masks.

Edges are kept exactly as given, directed src -> dst: self-loops and duplicate
edges stay in the `plain` view (each duplicate is one more message, as in
PyG's message passing) and the `self_loops` view replaces every self-loop by
exactly one per vertex (see `gnnc.graph`). Undirected data must list
both directions, as PyG's datasets do.

Every problem with the input raises GraphInputError naming the field: ids out
of range or negative, NaN/inf features, label/feature row mismatch, wrong
dtype or shape, an empty graph, vertex ids or labels so large that the arrays
they imply cannot fit in the memory available (`gnnc.host`). Parsed files and
generated graphs are cached as `.npz` under `cache_dir`, keyed by the sha256
of the input's bytes (or of the generator spec), so loading the same input again does not re-parse it;
an entry that does not read back whole, or fails the checks its input passed, is built again. The cache
is used only where no other user can change it (gnnc.files.private_dir), with a warning otherwise.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import json
import pickle
import re
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncWarning, GraphInputError
from gnnc.files import atomic_writer, fd_path, private_dir
from gnnc.graph import Graph, edge_data, index_dtype
from gnnc.graph.storage import UNLABELLED
from gnnc.graph.generators import GENERATORS, generate, split_masks
from gnnc.graph.ogb import npz_members, ogb_files, read_ogb_dir
from gnnc.graph.store import is_store, open_store
from gnnc.graph.planetoid import load_planetoid
from gnnc.host import available_memory, format_bytes

# Bump when a loader's output for the same input bytes changes: old cache entries are then ignored.
# 2: stand-ins recorded; 3: edge data (edge_weight, edge_attr, ...) kept; 4: OGB directories: NaN labels,
# multi-label y, edge-feat, the reverse edges of undirected datasets
CACHE_FORMAT = 4
MASKS = ("train_mask", "val_mask", "test_mask")
SPLIT_SEED = 0  # the 60/20/20 split of inputs without masks (`,split_seed=N` after the spec picks another)
# what stands in for vertex data an input does not give (Graph.stand_ins)
NO_FEATURES = "it has no vertex features (x); each vertex gets one constant feature 1.0"
NO_LABELS = "it has no labels (y); each vertex gets label 0"
# the options a spec may end with (`,key=value`), per kind of spec
SPEC_OPTIONS = {"planetoid": ("normalize",), "file": ("split_seed",)}
_OPTION_TAIL = re.compile(r"^(?P<base>.+?)(?P<options>(?:,[A-Za-z_]+=[^,]*)+)$")
_EDGE_KEY = "edata."  # the cache's arrays of edge data


def made_up_split(seed: int) -> str:
    """The sentence a graph's `split` stand-in carries."""
    return (f"it has no train/val/test masks; a random 60/20/20 split stands in (seed {seed}; "
            f"append ',split_seed=N' to the graph spec for another)")


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/gnnc` when that is set, else `.gnnc-cache` in the current directory.

    The only place the environment is read; everything else takes the
    directory as a parameter.
    """
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "gnnc" if xdg else Path.cwd() / ".gnnc-cache"


def available_datasets() -> list[tuple[str, str]]:
    """(spec, one-line description) of the graphs gnnc can name, for `gnnc datasets`."""
    return [
        ("planetoid:cora", "Cora citation graph: 2708 vertices, 10556 edges, 1433 features, 7 classes "
                           "(public split; features row-normalised, each row sums to 1, as PyG's "
                           "NormalizeFeatures; ',normalize=false' keeps the raw 0/1 features)"),
        ("planetoid:citeseer", "CiteSeer citation graph: 3327 vertices, 9104 edges, 3703 features, 6 classes "
                               "(public split; row-normalised likewise, ',normalize=false' for raw)"),
        ("rmat:n=N,deg=D,features=F,classes=C,seed=S", "R-MAT power-law graph (a=0.57, b=0.19, c=0.19), "
                                                       "undirected, N*D edges"),
        ("sbm:n=N,blocks=B,deg=D,intra=P,features=F,classes=C,seed=S",
         "contextual stochastic block model: a fraction P of edges inside blocks, classes follow blocks"),
        ("regress:n=N,deg=D,features=F,targets=T,noise=E,seed=S",
         "node regression with a known target: T float targets, a smooth function of the neighbours' mean "
         "features plus the vertex's own, plus noise E (`loss = mse(...)`)"),
        ("proteins:n=N,deg=D,features=F,tasks=T,edge_features=K,seed=S",
         "like ogbn-proteins: T binary targets that K-dimensional edge features (edge.attr) predict and the "
         "features do not (`loss = bce(...)`; defaults 112 tasks, 8 edge features)"),
        ("FILE.npz", "arrays edge_index, x, y, optional train_mask/val_mask/test_mask (without them a "
                     "random 60/20/20 split, seed 0; 'FILE.npz,split_seed=N' for another) and edge_NAME "
                     "(edge_weight, edge_attr, ...)"),
        ("FILE.pt", "a PyG Data (or dict of tensors) saved with torch.save, edge_weight/edge_attr included"),
        ("DIR", "an OGB node-property dataset directory as OGB downloads it (raw/edge.csv.gz, "
                "raw/node-feat.csv.gz, raw/node-label.csv.gz, split/NAME/train.csv.gz, ...), or a graph store "
                "written by `gnnc convert`"),
        ("FILE", "an edge list: one 'src dst' pair per line (no features or labels: it can be "
                 "partitioned and compiled, not trained)"),
    ]


def load_graph(spec: str, cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> Graph:
    """The graph a spec names (see the module docstring); GraphInputError if it is unusable."""
    spec = str(spec)
    if spec.startswith("planetoid:"):
        name, options = _spec_options(spec.split(":", 1)[1], "planetoid", spec)
        return load_planetoid(name, normalize=_bool_option(options.get("normalize", "true"), "normalize", spec))
    kind = spec.partition(":")[0]
    if kind in GENERATORS:
        key = hashlib.sha256(f"generator:{spec}".encode()).hexdigest()
        return _cached(key, lambda: generate(spec), cache_dir, use_cache)
    tail = _OPTION_TAIL.match(spec)
    if tail is not None and not Path(spec).exists() and Path(tail.group("base")).exists():
        base, options = _spec_options(spec, "file", spec)
        graph = _load_file(base, cache_dir, use_cache)
        return _with_split_seed(graph, _int_option(options["split_seed"], "split_seed", spec), spec)
    return _load_file(spec, cache_dir, use_cache)


def _load_file(spec: str, cache_dir: str | os.PathLike | None, use_cache: bool) -> Graph:
    path = Path(spec)
    if not path.exists():
        raise GraphInputError(f"graph '{spec}': no such file or directory, and not a known spec "
                              f"(planetoid:NAME, rmat:..., sbm:...; see `gnnc datasets`)")
    if path.is_dir() and is_store(path):
        # memory-mapped: nothing to convert or cache; checked whole once, then stamped in the cache's folder
        return open_store(path, stamps=(Path(cache_dir) if cache_dir is not None else default_cache_dir())
                          if use_cache else None)
    if path.is_dir():
        files = ogb_files(path)
        key = _hash_files(files, path, "ogb")
        return _cached(key, lambda: load_ogb_dir(path), cache_dir, use_cache)
    suffix = path.name.lower()
    kind = "npz" if suffix.endswith(".npz") else "torch" if suffix.endswith((".pt", ".pth")) else "edge-list"
    key = _hash_files([path], path.parent, kind)
    return _cached(key, lambda: _load_by_kind(kind)(path), cache_dir, use_cache)


def _spec_options(text: str, kind: str, spec: str) -> tuple[str, dict[str, str]]:
    """`BASE,key=value,...` as BASE and its options; GraphInputError for an option `kind` does not take."""
    m = _OPTION_TAIL.match(text)
    if m is None:
        return text, {}
    options: dict[str, str] = {}
    for item in m.group("options")[1:].split(","):
        key, _, value = item.partition("=")
        if key not in SPEC_OPTIONS[kind]:
            raise GraphInputError(f"graph '{spec}': unknown option '{key}' "
                                  f"(known for this kind of graph: {', '.join(SPEC_OPTIONS[kind])})")
        options[key] = value
    return m.group("base"), options


def _bool_option(value: str, key: str, spec: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise GraphInputError(f"graph '{spec}': {key}={value}: expected true or false")
    return value.lower() == "true"


def _int_option(value: str, key: str, spec: str) -> int:
    if not value.isdigit():
        raise GraphInputError(f"graph '{spec}': {key}={value}: expected a non-negative integer")
    return int(value)


def _with_split_seed(graph: Graph, seed: int, spec: str) -> Graph:
    """`graph` with its made-up split drawn again from `seed`; refused for a graph that has its own split."""
    if "split" not in graph.stand_ins:
        raise GraphInputError(f"graph '{spec}': split_seed applies to a graph without train/val/test masks, "
                              f"and this one has its own")
    masks = split_masks(graph.num_nodes, np.random.default_rng(seed))
    train, val, test = (torch.from_numpy(m) for m in masks)
    return Graph(graph.num_nodes, graph.src, graph.dst, graph.x, graph.y, train, val, test, name=graph.name,
                 stand_ins={**graph.stand_ins, "split": made_up_split(seed)})


# --- validation ------------------------------------------------------------------------------------


def build_graph(edge_index: Any, x: Any, y: Any, masks: Mapping[str, Any] | None, name: str,
                source: str, num_nodes: int | None = None, edges: Mapping[str, Any] | None = None) -> Graph:
    """Validate raw arrays and make a Graph; `source` prefixes every message.

    edge_index: integer [2, E]; x: numeric [N, F]; y: integer [N] (or [N, 1]);
    masks: bool or 0/1 [N] each, all three or none (then a seeded 60/20/20
    split); edges: edge data by `edge.NAME` name ([E] or [E, d] each,
    gnnc.graph.edge_data). N comes from x. An input without features or
    labels passes None for x or y and gives `num_nodes`: stand-ins are made
    and recorded in `Graph.stand_ins`, as is a made-up split.
    """
    stand_ins: dict[str, str] = {}
    if x is None and num_nodes is not None:
        x = np.ones((num_nodes, 1), dtype=np.float32)
        stand_ins["x"] = NO_FEATURES
    if y is None and num_nodes is not None:
        y = np.zeros(len(x), dtype=np.int64)
        stand_ins["y"] = NO_LABELS
    ei = _array(edge_index, "edge_index", source)
    xa = _array(x, "x", source)
    ya = _array(y, "y", source)
    if xa.ndim != 2:
        raise GraphInputError(f"{source}: x: expected shape [N, F], got {list(xa.shape)}")
    if xa.dtype.kind not in "fiub":
        raise GraphInputError(f"{source}: x: expected a numeric dtype, got {xa.dtype}")
    n = int(xa.shape[0])
    if n == 0:
        raise GraphInputError(f"{source}: empty graph: x has 0 rows (no vertices)")
    if xa.shape[1] == 0:
        raise GraphInputError(f"{source}: x: has 0 columns (no features)")
    xf = np.ascontiguousarray(xa, dtype=np.float32)
    bad = ~np.isfinite(xf)
    if bad.any():
        r, c = (int(v[0]) for v in np.nonzero(bad))
        what = "NaN" if np.isnan(xf[r, c]) else "inf"
        raise GraphInputError(f"{source}: x: holds {what} at row {r}, column {c} "
                              f"({int(bad.sum())} non-finite values)")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphInputError(f"{source}: edge_index: expected shape [2, E], got {list(ei.shape)}")
    if ei.dtype.kind not in "iu":
        raise GraphInputError(f"{source}: edge_index: expected an integer dtype, got {ei.dtype}")
    if ei.shape[1] == 0:
        raise GraphInputError(f"{source}: empty graph: edge_index has no edges")
    _check_ids(ei, n, source)
    ya, unlabelled = _labels(ya, n, source)
    dt = index_dtype(n)
    src, dst = ei[0].astype(dt), ei[1].astype(dt)
    given = {k: v for k, v in (masks or {}).items() if v is not None}
    if given and set(given) != set(MASKS):
        missing = sorted(set(MASKS) - set(given))
        raise GraphInputError(f"{source}: {missing[0]}: missing (give all of {', '.join(MASKS)} or none)")
    if given:
        mask_arrays = [_mask(given[k], k, n, source) for k in MASKS]
    else:
        mask_arrays = list(split_masks(n, np.random.default_rng(SPLIT_SEED)))
        stand_ins["split"] = made_up_split(SPLIT_SEED)
    if unlabelled is not None:  # a vertex without a label is in no mask: no loss or metric reads its label
        mask_arrays = [m & ~unlabelled for m in mask_arrays]
    arrays = {k: _array(v, edge_data.PREFIX + k, source) for k, v in (edges or {}).items()}
    data = edge_data.validate(arrays, int(ei.shape[1]), source)
    return Graph(n, src, dst, torch.from_numpy(xf), torch.from_numpy(ya),
                 *(torch.from_numpy(m) for m in mask_arrays), name=name, stand_ins=stand_ins, edge_data=data)


def _real_targets(ya: np.ndarray) -> bool:
    """Float labels with a known value that is not a whole number: regression targets, not classes."""
    if ya.dtype.kind != "f":
        return False
    known = ya[np.isfinite(ya)]
    return bool((known != np.round(known)).any())


def _labels(ya: np.ndarray, n: int, source: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(y as the Graph holds it, which vertices have no label or None) from a file's y.

    [N] (or [N, 1]) class labels 0..C-1: integers, or floats whose NaN marks a vertex without a label (OGB
    writes NaN there) and whose other values are whole numbers; a label-less vertex gets UNLABELLED. [N, T]
    with T > 1, or floats of which one is not a whole number: float targets kept as float32 [N, T] (a [N] as
    one column), NaN for unknown: multi-label binary targets (ogbn-proteins' 112 tasks, 0/1) or regression
    targets; the model's loss says which it reads (gnnc.graph.storage.check_class_labels). A vertex with no
    known target is unlabelled.
    """
    if ya.ndim == 2 and ya.shape[1] == 1 and not _real_targets(ya):
        ya = ya[:, 0]
    if ya.ndim not in (1, 2):
        raise GraphInputError(f"{source}: y: expected shape [N] (classes) or [N, T] (multi-label), "
                              f"got {list(ya.shape)}")
    if ya.dtype.kind not in "iubf":
        raise GraphInputError(f"{source}: y: expected numeric labels, got dtype {ya.dtype}")
    if ya.shape[0] != n:
        raise GraphInputError(f"{source}: y: has {ya.shape[0]} rows but x has {n} (one label per vertex)")
    missing = np.isnan(ya) if ya.dtype.kind == "f" else None
    if ya.ndim == 1 and _real_targets(ya):  # one regression target per vertex: a column of them
        ya, missing = ya[:, None], missing[:, None]
    if ya.ndim == 2:
        known = ya[~missing] if missing is not None else ya
        if np.isinf(known).any():
            raise GraphInputError(f"{source}: y: targets must be finite numbers or NaN (unknown), got "
                                  f"{float(known[np.isinf(known)][0]):g}")
        unlabelled = missing.all(axis=1) if missing is not None else None
        return np.ascontiguousarray(ya, dtype=np.float32), unlabelled if unlabelled is not None and unlabelled.any() else None
    if missing is not None:
        known = ya[~missing]
        if np.isinf(known).any() or (known != np.round(known)).any():
            bad = np.nonzero(~missing & (np.isinf(ya) | (ya != np.round(ya))))[0][0]
            raise GraphInputError(f"{source}: y: expected integer class labels (or NaN for a vertex without "
                                  f"one), got {float(ya[bad]):g} at row {int(bad)}")
        ya = np.where(missing, UNLABELLED, ya).astype(np.int64)
        labelled = ~missing
    else:
        ya = ya.astype(np.int64, copy=False)  # int64 already (a stand-in): no second copy, which no check budgets
        labelled = None
    values = ya if labelled is None else ya[labelled]
    if len(values) and int(values.min()) < 0:
        row = int(np.nonzero(ya == int(values.min()))[0][0])
        raise GraphInputError(f"{source}: y: holds negative label {int(values.min())} at row {row}")
    if len(values):
        top = int(values.max())
        # every model scores each vertex against every class: [N, classes] float32, and its gradient
        _check_fits(2 * 4 * n * (top + 1), f"{source}: y: label {top} at row {int(np.argmax(ya))} makes "
                    f"{top + 1} classes (labels are 0..classes-1), so the class scores of the {n} vertices",
                    "number the classes from 0")
    return ya, None if missing is None or not missing.any() else missing


def labels_for_file(y: torch.Tensor) -> np.ndarray:
    """A Graph's y as a file holds it: NaN (OGB's mark) for a vertex without a label, so that reading the file
    back through build_graph gives the same graph (a negative label in a file is refused)."""
    if y.dim() == 1 and bool((y == UNLABELLED).any()):
        return np.where(y.numpy() == UNLABELLED, np.nan, y.numpy().astype(np.float64))
    return y.numpy()


def _array(value: Any, field: str, source: str) -> np.ndarray:
    if value is None:
        raise GraphInputError(f"{source}: {field}: missing")
    if isinstance(value, torch.Tensor):
        value = _tensor_values(value, field, source)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise GraphInputError(f"{source}: {field}: not an array ({err})") from None
    if arr.dtype == object:
        raise GraphInputError(f"{source}: {field}: expected a numeric array, got Python objects")
    return arr


def _tensor_values(t: torch.Tensor, field: str, source: str) -> np.ndarray:
    """A tensor's values as numpy. PyG users hold sparse features and bf16 tensors, which numpy cannot
    take: a sparse tensor is made dense (refused if that cannot fit in memory) and bf16 widened to float32,
    exactly; a dtype with no numpy equivalent (float8, quantized) is refused naming the field."""
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.layout != torch.strided:
        _check_fits(t.numel() * t.element_size(), f"{source}: {field}: a sparse {t.dtype} tensor of shape "
                    f"{list(t.shape)}, made dense,", "store it dense, or with fewer columns")
        t = _checked_sparse(t, field, source).to_dense()
    if t.dtype == torch.bfloat16:
        t = t.float()
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as err:
        raise GraphInputError(f"{source}: {field}: a tensor of dtype {t.dtype} numpy cannot read "
                              f"({str(err).splitlines()[0][:100]}); save it as float32") from None


def _checked_sparse(t: torch.Tensor, field: str, source: str) -> torch.Tensor:
    """A sparse tensor rebuilt with torch's invariant checks. torch.load does not check what it reads, and
    to_dense writes where the indices say: an index past the shape wrote outside the dense array."""
    try:
        if t.layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(t._indices(), t._values(), t.shape, check_invariants=True)
        if t.layout in (torch.sparse_csr, torch.sparse_bsr):
            compressed, plain = t.crow_indices(), t.col_indices()
        else:
            compressed, plain = t.ccol_indices(), t.row_indices()
        return torch.sparse_compressed_tensor(compressed, plain, t.values(), t.shape, layout=t.layout,
                                              check_invariants=True)
    except RuntimeError as err:
        raise GraphInputError(f"{source}: {field}: a sparse tensor whose indices do not fit its shape "
                              f"{list(t.shape)} ({str(err).splitlines()[0][:150]})") from None


def _check_ids(ei: np.ndarray, n: int, source: str) -> None:
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0:
        row, col = (int(v[0]) for v in np.nonzero(ei == lo))
        raise GraphInputError(f"{source}: edge_index: negative vertex id {lo} at [{row}, {col}]")
    if hi >= n:
        row, col = (int(v[0]) for v in np.nonzero(ei == hi))
        raise GraphInputError(f"{source}: edge_index: vertex id {hi} at [{row}, {col}] is out of range: "
                              f"x has {n} rows, so ids must be < {n}")


def _check_fits(nbytes: int, what: str | Callable[[], str], advice: str) -> None:
    """Refuse input whose implied arrays (`what` needs `nbytes`) exceed the memory available now; `what`
    may be a function, called only to refuse (finding an edge list's line costs a list of every line)."""
    room = available_memory()
    if room is not None and nbytes > room.bytes:
        said = what() if callable(what) else what
        raise GraphInputError(f"{said} would need {format_bytes(nbytes)}, more than the {room}; {advice}")


def _mask(value: Any, field: str, n: int, source: str) -> np.ndarray:
    m = _array(value, field, source)
    if m.ndim != 1 or m.shape[0] != n:
        raise GraphInputError(f"{source}: {field}: expected shape [{n}], got {list(m.shape)}")
    if m.dtype == bool:
        return np.ascontiguousarray(m)
    if m.dtype.kind in "iu" and np.isin(m, (0, 1)).all():
        return m.astype(bool)
    raise GraphInputError(f"{source}: {field}: expected booleans (or 0/1), got dtype {m.dtype}")


# --- loaders ---------------------------------------------------------------------------------------


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` (no pickled objects allowed; every shape checked before it is allocated).

    np.load allocates what a header declares and only then reads: a few bytes claiming 10^12 elements
    were an allocation of terabytes. npz_members checks each declared size against what its member holds
    (zipfile also enforces that when reading); here all arrays together must fit in the memory available.
    """
    members = npz_members(path)
    if members:
        largest = max(members.values(), key=lambda m: m.nbytes)
        _check_fits(sum(m.nbytes for m in members.values()),
                    f"{path}: its arrays (the largest {largest.name}, {format_bytes(largest.nbytes)})",
                    "load a smaller graph")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except ValueError as err:
        raise GraphInputError(f"{path}: not a readable .npz file ({err})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # a truncated or damaged archive
        raise GraphInputError(f"{path}: not a readable .npz file (truncated or damaged: {err})") from None


def load_npz(path: Path) -> Graph:
    """`edge_index`, `x`, `y` and optional masks from an `.npz` (no pickled objects allowed)."""
    arrays = read_npz(path)
    for field in ("edge_index", "x", "y"):
        if field not in arrays:
            raise GraphInputError(f"{path}: {field}: missing (the file has {', '.join(sorted(arrays)) or 'nothing'})")
    return build_graph(arrays["edge_index"], arrays["x"], arrays["y"], {k: arrays.get(k) for k in MASKS},
                       path.stem, str(path), edges=edge_data.edge_fields(arrays))


# What loading an edge list allocates per vertex once its edges are parsed, at its peak (tracemalloc,
# numpy's arrays included, N = 2M and 8M): 24 B, of which 15 stay (x float32 4, y int64 8, three bool
# masks 3) and 9 are build_graph's passing temporaries (the split's permutation, isfinite's mask); the
# check had budgeted only the 15 that stay. Per edge the load peaks at 58 B for 7.8 B of text (the text, its
# copy and the parser's buffers; 8 B stay, src and dst), all spent before N is known, so not budgeted here.
EDGE_LIST_BYTES_PER_VERTEX = 24


def load_edge_list(path: Path) -> Graph:
    """A SNAP-style edge list (see the module docstring): structure only."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise GraphInputError(f"{path}: not a readable edge list ({err})") from None
    text = text.replace(",", " ")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "empty input" is reported below, naming the file
            pairs = np.loadtxt(io.StringIO(text), dtype=np.int64, comments=("#", "%"), ndmin=2, usecols=(0, 1))
    except ValueError as err:
        raise GraphInputError(_bad_edge_line(path, text) or f"{path}: edge list: {err}") from None
    if pairs.size == 0:
        raise GraphInputError(f"{path}: empty graph: the edge list has no edges")
    ei = pairs.T
    if int(ei.min()) < 0:
        row = int(np.nonzero((ei < 0).any(axis=0))[0][0])
        raise GraphInputError(f"{path}:{_data_lines(text)[row]}: edge list: negative vertex id "
                              f"{int(ei[:, row].min())}")
    n = int(ei.max()) + 1
    # N is the largest id + 1: the stand-in features, labels and masks of every vertex up to it
    _check_fits(EDGE_LIST_BYTES_PER_VERTEX * n,
                lambda: f"{path}:{_data_lines(text)[int(np.argmax(ei.max(axis=0)))]}: edge list: vertex id "
                        f"{n - 1} makes N = {n} vertices (ids are 0..N-1), whose features, labels and masks",
                "number the vertices from 0")
    return build_graph(ei, None, None, None, path.stem, str(path), num_nodes=n)


def _data_lines(text: str) -> list[int]:
    """The line number (from 1) of every data row of an edge list, as np.loadtxt counts its rows."""
    return [k for k, line in enumerate(text.splitlines(), 1) if re.split(r"[#%]", line, maxsplit=1)[0].strip()]


def _bad_edge_line(path: Path, text: str) -> str | None:
    """`FILE:LINE: ...` for the first line of an edge list that is not `src dst`; None if every line is."""
    lines = text.splitlines()
    for k in _data_lines(text):
        fields = re.split(r"[#%]", lines[k - 1], maxsplit=1)[0].split()
        if len(fields) < 2:
            return f"{path}:{k}: edge list: expected 'src dst', got {' '.join(fields)!r}"
        for f in fields[:2]:
            if not re.fullmatch(r"[+-]?\d+", f):
                return f"{path}:{k}: edge list: {f!r} is not an integer vertex id"
    return None


def load_ogb_dir(root: Path) -> Graph:
    """An OGB node-property dataset directory as OGB's download lays it out (gnnc.graph.ogb)."""
    a = read_ogb_dir(root, read_npz)
    return build_graph(a.edge_index, a.x, a.y, a.masks, a.name, str(root), num_nodes=a.num_nodes, edges=a.edges)


class _DataStandIn:
    """Stands in for PyG's Data/GlobalStorage classes while `torch.load(weights_only=True)`
    reads a saved Data: the unpickler may only create allowed classes, and these
    ones just hold the attributes (no code of PyG's runs, none is imported)."""


def _stand_in(module: str, name: str) -> type:
    return type(name, (_DataStandIn,), {"__module__": module, "__qualname__": name})


PYG_CLASSES = (("torch_geometric.data.data", "Data"), ("torch_geometric.data.data", "DataEdgeAttr"),
               ("torch_geometric.data.data", "DataTensorAttr"), ("torch_geometric.data.storage", "GlobalStorage"),
               ("torch_geometric.data.storage", "NodeStorage"), ("torch_geometric.data.storage", "EdgeStorage"))


def load_torch(path: Path) -> Graph:
    """A PyG Data (or a dict of tensors) saved with torch.save, read with weights_only=True."""
    stand_ins = [_stand_in(m, n) for m, n in PYG_CLASSES]
    try:
        with torch.serialization.safe_globals(stand_ins):
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError, TypeError) as err:
        # a refused global, a corrupt archive or a truncated file: all mean "not loadable safely"
        raise GraphInputError(f"{path}: not a torch.save file gnnc can read safely "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    fields = _pyg_fields(obj)
    if fields is None:
        raise GraphInputError(f"{path}: expected a PyG Data or a dict of tensors, got {type(obj).__name__}")
    return _from_fields(fields, path.stem, str(path))


def _pyg_fields(obj: Any) -> dict[str, Any] | None:
    """The attribute dict of a (stand-in or real) Data, or a plain dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    store = getattr(obj, "_store", None)
    if store is not None:
        mapping = getattr(store, "_mapping", None)
        if isinstance(mapping, Mapping):
            return dict(mapping)
    return None


def _from_fields(fields: Mapping[str, Any], name: str, source: str,
                 required: tuple[str, ...] = ("edge_index", "x", "y"), num_nodes: int | None = None) -> Graph:
    """A Graph from PyG's field names (edge_index, x, y, masks); a field outside `required` may be
    absent, given `num_nodes`, and is then made up (see build_graph)."""
    for field in required:
        if fields.get(field) is None:
            raise GraphInputError(f"{source}: {field}: missing")
    return build_graph(fields["edge_index"], fields.get("x"), fields.get("y"), {k: fields.get(k) for k in MASKS},
                       name, source, num_nodes, edges=edge_data.edge_fields(fields))


def from_pyg(data: Any, name: str = "pyg") -> Graph:
    """A Graph from an in-memory PyG `Data` (duck-typed: edge_index, x, y, optional masks and edge_* fields)."""
    fields = {k: getattr(data, k, None) for k in ("edge_index", "x", "y", "edge_weight", "edge_attr", *MASKS)}
    fields.update({k: v for k, v in (_pyg_fields(data) or {}).items() if k.startswith(edge_data.PREFIX)})
    return _from_fields(fields, name, "PyG Data")


def _load_by_kind(kind: str) -> Any:
    return {"npz": load_npz, "torch": load_torch, "edge-list": load_edge_list}[kind]


# --- cache -----------------------------------------------------------------------------------------


def _hash_files(files: Iterable[Path], root: Path, kind: str) -> str:
    h = hashlib.sha256(f"{kind}:{CACHE_FORMAT}".encode())
    for f in files:
        h.update(str(f.relative_to(root)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _cached(key: str, build: Any, cache_dir: str | os.PathLike | None, use_cache: bool) -> Graph:
    """The graph stored under `key`, or `build()` stored there (atomically) for next time.

    The folder is used only when it and every directory above it are out of other users' reach
    (gnnc.files.private_dir): anyone who can write there could plant an entry for a spec (its key is the
    sha256 of the spec) that a run would train and score on. Otherwise the cache is passed over, with a
    warning. An entry read back is validated as the input it stands for was (`build_graph`).
    """
    if not use_cache:
        return build()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = f"graph-{key[:32]}.npz"
    try:
        with private_dir(folder) as fd:
            graph = _read_cached(Path(fd_path(fd, name)), key)
    except OSError as err:
        warnings.warn(GnncWarning(f"not using the graph cache {folder}: {err}"), stacklevel=3)
        return build()
    if graph is not None:
        return graph
    graph = build()
    try:
        with private_dir(folder) as fd:
            _write_cached(graph, Path(fd_path(fd, name)), key)
    except OSError as err:  # a read-only or full disk must not stop the load itself
        warnings.warn(GnncWarning(f"could not cache the converted graph in {folder}: {err}"), stacklevel=3)
    return graph


def _write_cached(graph: Graph, path: Path, key: str) -> None:
    with atomic_writer(path) as f:
        np.savez(f, key=np.array(key), name=np.array(graph.name), num_nodes=np.array(graph.num_nodes),
                 src=graph.src, dst=graph.dst, x=graph.x.numpy(), y=labels_for_file(graph.y),
                 stand_ins=np.array(json.dumps(graph.stand_ins, sort_keys=True)),
                 **{k: getattr(graph, k).numpy() for k in MASKS},
                 **{_EDGE_KEY + k: v.numpy() for k, v in graph.edge_data.items()})


def _read_cached(path: Path, key: str) -> Graph | None:
    """None when the entry is missing, unreadable or belongs to another key, or does not pass the checks
    of an input file (then it is rebuilt, with a warning for the latter).

    Every member is read whole, so the zip's CRC-32 catches a damaged one; the arrays then go through
    `build_graph`, the validation every loader's output goes through (NaN/inf features, vertex ids and
    labels out of range, shapes and dtypes), so a cached entry is held to what its input was.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            if str(f["key"]) != key:
                return None
            stand_ins = json.loads(str(f["stand_ins"]))
            a = {k: f[k] for k in ("name", "src", "dst", "x", "y", *MASKS)}
            edges = {k[len(_EDGE_KEY):]: f[k] for k in f.files if k.startswith(_EDGE_KEY)}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
    source = f"cached graph {path.name}"
    try:
        if not (isinstance(stand_ins, dict) and all(isinstance(v, str) for v in stand_ins.values())):
            raise GraphInputError(f"{source}: stand_ins: expected a JSON object of strings")
        if a["src"].shape != a["dst"].shape or a["src"].ndim != 1:
            raise GraphInputError(f"{source}: src, dst: expected two arrays of one shape [E]")
        graph = build_graph(np.stack([a["src"], a["dst"]]), a["x"], a["y"], {k: a[k] for k in MASKS},
                            str(a["name"]), source, edges=edges)
    except GraphInputError as err:
        warnings.warn(GnncWarning(f"ignoring {err}; converting the input again"), stacklevel=4)
        return None
    graph.stand_ins = stand_ins
    return graph
