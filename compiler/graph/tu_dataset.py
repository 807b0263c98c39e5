"""Datasets of many small graphs (graph classification): the TUDataset layout on disk, and a seeded generator.

A `GraphDataset` holds every graph of the dataset in one block-diagonal array form, as PyG's `InMemoryDataset`
collates them: node features `x` [N, F], directed edges `src`/`dst` (global node ids, each edge inside one graph),
`ptr` [G+1] (graph g owns nodes ptr[g]..ptr[g+1]-1) and one class label per graph `y` [G].

Specs (`load_graph_dataset`):

* `tu:DIR` -- a dataset in the TUDataset layout (https://chrsmrrs.github.io/datasets/docs/format/), the files of
  dataset NAME (DIR's last component, or the NAME of `tu:DIR/NAME` when DIR/NAME_A.txt exists) in DIR or in
  DIR/raw (as PyG keeps them): NAME_A.txt (one `row, col` edge per line, 1-based node ids), NAME_graph_indicator.txt
  (the 1-based graph of every node, non-decreasing), NAME_graph_labels.txt (one integer per graph), and optional
  NAME_node_labels.txt (integer labels, one-hot encoded) and NAME_node_attributes.txt (comma-separated floats).
  As PyG's `TUDataset(use_node_attr=True)`: x is [attributes | one-hot node labels] (node labels shifted to start
  at 0, one column per label value), self-loops are removed and duplicate edges merged, graph labels are mapped to
  0..C-1 in sorted order. Without node attributes or labels every node gets one constant feature 1.0. The files
  are read as text (no pickle, nothing evaluated); a bad file raises GraphInputError naming the file, the line
  and the field (exit 2).
* `graphs:n=G,seed=S,noise=P` -- gnnc's generator (`generate_graphs`): G graphs of 12 to 28 nodes, a third of each
  class, whose class is the random-graph model that drew the graph's structure: 0 Erdos-Renyi (edge probability
  4/(n-1)), 1 Barabasi-Albert (each new node attaches to 2 nodes chosen in proportion to their degree), 2
  Watts-Strogatz (ring lattice of degree 4, each edge rewired with probability 0.2). All three have a mean degree
  of about 4 and every node the one feature 1.0, so the class is learnable from structure alone (degree spread,
  clustering); then a fraction P of labels (default 0.1) is replaced by another class at random, so no model
  exceeds about 1 - P accuracy. Seeded: the same spec gives the same dataset on every machine.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnc.errors import GraphInputError
from gnnc.files import atomic_write, read_text_input

MAX_ONE_HOT = 1 << 16  # node label values one-hot encoded, at most (TU datasets have tens)
MAX_TU_FILE_BYTES = 1 << 30  # a TU text file larger than this is refused (the largest TU datasets are far smaller)
GRAPH_SPECS = ("tu:", "graphs:")
GENERATOR_CLASSES = ("erdos_renyi", "barabasi_albert", "watts_strogatz")
MIN_NODES, MAX_NODES, MEAN_DEGREE, WS_REWIRE = 12, 28, 4, 0.2


@dataclass
class GraphDataset:
    """Many small graphs in one block-diagonal form (see the module docstring)."""

    name: str
    x: np.ndarray  # float32 [N, F]
    src: np.ndarray  # int64 [E] global node ids
    dst: np.ndarray  # int64 [E]
    ptr: np.ndarray  # int64 [G + 1]
    y: np.ndarray  # int64 [G], 0..num_classes-1

    @property
    def num_graphs(self) -> int:
        return int(len(self.y))

    @property
    def num_nodes(self) -> int:
        return int(self.ptr[-1])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1 if len(self.y) else 0

    @property
    def num_targets(self) -> int:
        return 1  # one class label per graph (what gnnc.model_file.graph_dims binds `targets` to)

    @property
    def edge_data(self) -> dict:
        return {}  # no edge data yet: what gnnc.model_file.edge_shapes asks of a graph

    def graph_of_nodes(self) -> np.ndarray:
        """The graph of every node, int64 [N]."""
        return np.repeat(np.arange(self.num_graphs, dtype=np.int64), np.diff(self.ptr))

    def edge_ptr(self) -> np.ndarray:
        """Edges sorted by graph: graph g's edges are edge_ptr[g]..edge_ptr[g+1]-1 (the dataset keeps them so)."""
        return np.searchsorted(self.src, self.ptr, side="left").astype(np.int64)


def is_graph_dataset_spec(spec: object) -> bool:
    """Whether a --graph spec names a dataset of many graphs (graph classification) rather than one graph."""
    return isinstance(spec, str) and spec.startswith(GRAPH_SPECS)


def load_graph_dataset(spec: str) -> GraphDataset:
    """The dataset a `tu:` or `graphs:` spec names (module docstring); GraphInputError when it is unusable."""
    if spec.startswith("graphs:"):
        return generate_graphs(spec)
    if spec.startswith("tu:"):
        return read_tu(spec[len("tu:"):])
    raise GraphInputError(f"graph dataset '{spec}': expected tu:DIR or graphs:n=...,seed=...")


# ----- the TUDataset layout ------------------------------------------------------------------------------------


def _tu_files(where: str) -> tuple[Path, str]:
    """(directory holding NAME_A.txt, NAME) for `tu:DIR` or `tu:DIR/NAME`."""
    path = Path(where)
    candidates = [(path, path.name), (path / "raw", path.name), (path.parent, path.name)]
    for directory, name in candidates:
        if (directory / f"{name}_A.txt").is_file():
            return directory, name
    raise GraphInputError(f"graph dataset 'tu:{where}': no {path.name}_A.txt in {path}, {path / 'raw'} or "
                          f"{path.parent} (the TUDataset layout: NAME_A.txt, NAME_graph_indicator.txt, "
                          f"NAME_graph_labels.txt)")


def _rows(path: Path, field: str, width: int | None, kind: type) -> np.ndarray:
    """A TU text file as a [lines, width] array (width None: one value per line -> [lines]); errors name the file,
    the line and the field."""
    text = read_text_input(path, f"{path.name} ({field})", MAX_TU_FILE_BYTES)
    values: list[list[float | int]] = []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if width is not None and len(parts) != width or width is None and len(parts) != 1:
            raise GraphInputError(f"{path}:{k}: {field}: expected {width or 1} comma-separated value"
                                  f"{'s' if (width or 1) > 1 else ''}, got {len(parts)}: {line.strip()!r}")
        try:
            row = [kind(p) for p in parts]
        except ValueError:
            want = "an integer" if kind is int else "a number"
            raise GraphInputError(f"{path}:{k}: {field}: expected {want}, got {line.strip()!r}") from None
        if kind is float and not all(math.isfinite(v) for v in row):
            raise GraphInputError(f"{path}:{k}: {field}: NaN or infinite value {line.strip()!r}")
        values.append(row)
    if not values:
        raise GraphInputError(f"{path}: {field}: the file is empty")
    out = np.asarray(values, dtype=np.int64 if kind is int else np.float64)
    return out[:, 0] if width is None else out


def _width(path: Path) -> int:
    """Columns of the first non-empty line of a comma-separated file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                return len(line.split(","))
    return 1


def read_tu(where: str) -> GraphDataset:
    """A TUDataset directory (module docstring), read as PyG's TUDataset(use_node_attr=True) reads it."""
    directory, name = _tu_files(where)
    f = {k: directory / f"{name}_{k}.txt" for k in ("A", "graph_indicator", "graph_labels", "node_labels",
                                                   "node_attributes")}
    for k in ("graph_indicator", "graph_labels"):
        if not f[k].is_file():
            raise GraphInputError(f"{f[k]}: {k}: missing (the TUDataset layout needs {name}_{k}.txt)")
    indicator = _rows(f["graph_indicator"], "graph_indicator", None, int)
    n = len(indicator)
    if indicator.min() < 1 or np.any(np.diff(indicator) < 0) or np.any(np.diff(indicator) > 1) or indicator[0] != 1:
        bad = int(np.flatnonzero((np.diff(indicator) < 0) | (np.diff(indicator) > 1))[0]) + 2 \
            if len(indicator) > 1 and np.any((np.diff(indicator) < 0) | (np.diff(indicator) > 1)) else 1
        raise GraphInputError(f"{f['graph_indicator']}:{bad}: graph_indicator: graph ids must start at 1 and go up "
                              f"by at most 1 from one node to the next (each graph's nodes contiguous)")
    num_graphs = int(indicator[-1])
    labels = _rows(f["graph_labels"], "graph_labels", None, int)
    if len(labels) != num_graphs:
        raise GraphInputError(f"{f['graph_labels']}: graph_labels: {len(labels)} labels for {num_graphs} graphs "
                              f"(graph_indicator names {num_graphs})")
    _, y = np.unique(labels, return_inverse=True)
    edges = _rows(f["A"], "A", 2, int) - 1
    bad = np.flatnonzero((edges < 0).any(1) | (edges >= n).any(1))
    if len(bad):
        raise GraphInputError(f"{f['A']}:{int(bad[0]) + 1}: A: node id {int(edges[bad[0]].max()) + 1 if edges[bad[0]].max() >= n else int(edges[bad[0]].min()) + 1} "
                              f"out of range 1..{n} (graph_indicator lists {n} nodes)")
    graph = indicator - 1
    cross = np.flatnonzero(graph[edges[:, 0]] != graph[edges[:, 1]])
    if len(cross):
        raise GraphInputError(f"{f['A']}:{int(cross[0]) + 1}: A: edge joins nodes of graphs "
                              f"{int(graph[edges[cross[0], 0]]) + 1} and {int(graph[edges[cross[0], 1]]) + 1}")
    columns = []
    if f["node_attributes"].is_file():
        attrs = _rows(f["node_attributes"], "node_attributes", _width(f["node_attributes"]), float)
        if len(attrs) != n:
            raise GraphInputError(f"{f['node_attributes']}: node_attributes: {len(attrs)} rows for {n} nodes")
        columns.append(attrs.astype(np.float32))
    if f["node_labels"].is_file():
        nl = _rows(f["node_labels"], "node_labels", _width(f["node_labels"]), int)
        if len(nl) != n:
            raise GraphInputError(f"{f['node_labels']}: node_labels: {len(nl)} rows for {n} nodes")
        nl = nl - nl.min(0)
        widest = int(nl.max())
        if widest >= MAX_ONE_HOT:  # one column per label value: a stray huge label must not allocate N x 10^9
            row = int(np.argmax(nl.max(1)))
            raise GraphInputError(f"{f['node_labels']}:{row + 1}: node_labels: labels span {widest + 1} values; "
                                  f"one-hot encoding takes at most {MAX_ONE_HOT}")
        for c in range(nl.shape[1]):
            columns.append(np.eye(int(nl[:, c].max()) + 1, dtype=np.float32)[nl[:, c]])
    x = np.concatenate(columns, 1) if columns else np.ones((n, 1), np.float32)
    src, dst = _coalesce(edges[:, 0], edges[:, 1], n)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(graph, minlength=num_graphs))]).astype(np.int64)
    return GraphDataset(name, x, src, dst, ptr, y.astype(np.int64))


def _coalesce(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges without self-loops or duplicates, sorted by (source, destination): PyG's remove_self_loops + coalesce."""
    keep = src != dst
    keys = np.unique(src[keep].astype(np.int64) * n + dst[keep])
    return (keys // n).astype(np.int64), (keys % n).astype(np.int64)


def write_tu(ds: GraphDataset, directory: str | os.PathLike, name: str | None = None) -> Path:
    """Write `ds` in the TUDataset layout (node features as NAME_node_attributes.txt); returns the directory."""
    name = name or ds.name
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    graph = ds.graph_of_nodes()

    def lines(rows) -> bytes:
        return ("\n".join(rows) + "\n").encode()

    atomic_write(out / f"{name}_A.txt", lines(f"{s + 1}, {d + 1}" for s, d in zip(ds.src, ds.dst)))
    atomic_write(out / f"{name}_graph_indicator.txt", lines(str(g + 1) for g in graph))
    atomic_write(out / f"{name}_graph_labels.txt", lines(str(int(v)) for v in ds.y))
    atomic_write(out / f"{name}_node_attributes.txt", lines(", ".join(repr(float(v)) for v in row) for row in ds.x))
    return out


# ----- gnnc's generator ------------------------------------------------------------------------------------------

_GEN_PARAMS = {"n": (int, 600), "seed": (int, 0), "noise": (float, 0.1)}


def _gen_options(spec: str) -> dict[str, float | int]:
    options: dict[str, float | int] = {k: d for k, (_, d) in _GEN_PARAMS.items()}
    body = spec[len("graphs:"):]
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        if key not in _GEN_PARAMS or not eq:
            raise GraphInputError(f"graph dataset '{spec}': unknown option '{item}' (known: "
                                  f"{', '.join(f'{k}=' for k in _GEN_PARAMS)})")
        kind = _GEN_PARAMS[key][0]
        try:
            options[key] = kind(value)
        except ValueError:
            raise GraphInputError(f"graph dataset '{spec}': {key}={value}: expected "
                                  f"{'an integer' if kind is int else 'a number'}") from None
    if not 3 <= int(options["n"]) <= 1_000_000:
        raise GraphInputError(f"graph dataset '{spec}': n={options['n']}: expected 3 to 1000000 graphs")
    if not 0.0 <= float(options["noise"]) < 1.0 or int(options["seed"]) < 0:
        raise GraphInputError(f"graph dataset '{spec}': noise must be in [0, 1) and seed non-negative")
    return options


def _erdos_renyi(n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    p = MEAN_DEGREE / (n - 1)
    i, j = np.triu_indices(n, 1)
    keep = rng.random(len(i)) < p
    return list(zip(i[keep].tolist(), j[keep].tolist()))


def _barabasi_albert(n: int, rng: np.random.Generator, m: int = MEAN_DEGREE // 2) -> list[tuple[int, int]]:
    edges = [(a, b) for a in range(m + 1) for b in range(a + 1, m + 1)]  # a small clique to attach to
    ends = [v for e in edges for v in e]  # every node once per incident edge: degree-proportional draws
    for v in range(m + 1, n):
        chosen: set[int] = set()
        while len(chosen) < m:
            chosen.add(ends[int(rng.integers(len(ends)))])
        for u in sorted(chosen):
            edges.append((u, v))
            ends += [u, v]
    return edges


def _watts_strogatz(n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    half = MEAN_DEGREE // 2
    edges = {(i, (i + j) % n) for i in range(n) for j in range(1, half + 1)}
    out: set[tuple[int, int]] = set()
    for a, b in sorted(edges):
        if rng.random() < WS_REWIRE:  # rewired to a random other end; a self-loop or a duplicate is dropped
            b = int(rng.integers(n))
        if a != b:
            out.add((min(a, b), max(a, b)))
    return sorted(out)


def generate_graphs(spec: str = "graphs:") -> GraphDataset:
    """The generator of the module docstring: `graphs:n=600,seed=0,noise=0.1`."""
    options = _gen_options(spec)
    count, seed, noise = int(options["n"]), int(options["seed"]), float(options["noise"])
    rng = np.random.default_rng(seed)
    classes = len(GENERATOR_CLASSES)
    true = np.arange(count) % classes
    rng.shuffle(true)
    draw = (_erdos_renyi, _barabasi_albert, _watts_strogatz)
    src, dst, sizes = [], [], []
    offset = 0
    for c in true:
        n = int(rng.integers(MIN_NODES, MAX_NODES + 1))
        pairs = np.asarray(draw[int(c)](n, rng), dtype=np.int64).reshape(-1, 2)
        a = np.concatenate([pairs[:, 0], pairs[:, 1]]) + offset
        b = np.concatenate([pairs[:, 1], pairs[:, 0]]) + offset
        src.append(a)
        dst.append(b)
        sizes.append(n)
        offset += n
    flip = rng.random(count) < noise
    y = true.copy()
    y[flip] = (true[flip] + rng.integers(1, classes, int(flip.sum()))) % classes
    s, d = _coalesce(np.concatenate(src), np.concatenate(dst), offset)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec)
    return GraphDataset(name, np.ones((offset, 1), np.float32), s, d, ptr, y.astype(np.int64))
