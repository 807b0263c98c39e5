"""Cora and CiteSeer in the Planetoid format, loaded without trusting pickle.

The `ind.<name>.*` files are Python pickles of scipy matrices, numpy arrays
and a defaultdict of adjacency lists. A restricted unpickler admits exactly
those classes, so a tampered file cannot run code. The split is the standard
public one (PyG's `Planetoid(split='public')`): the first 20 per class for
training, the next 500 for validation, the 1000 listed test vertices; edges
are the adjacency lists without self-loops or duplicates, ordered as PyG's
processed `edge_index` (by destination, then source); features are
row-normalised by default (PyG's NormalizeFeatures: each row divided by its
sum, so it sums to 1), which is what the published GCN/GAT results and PyG's
examples train on; `normalize=False` (`planetoid:cora,normalize=false`)
keeps the raw 0/1 bag-of-words features, as `Planetoid(...)` without a
transform gives them. CiteSeer's test indices skip some vertices, which get
zero features and label 0, as in PyG.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from gnnc.errors import GraphInputError
from gnnc.graph import Graph

DATA_DIR = Path(__file__).resolve().parent / "datasets" / "planetoid"
NAMES = ("cora", "citeseer")
_ALLOWED = {
    ("scipy.sparse.csr", "csr_matrix"), ("scipy.sparse._csr", "csr_matrix"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("collections", "defaultdict"), ("__builtin__", "list"), ("builtins", "list"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise GraphInputError(f"planetoid file holds a {module}.{name}, which is not a numpy/scipy type "
                                  f"the format uses; refusing to load it")
        if module == "scipy.sparse.csr" or module == "scipy.sparse._csr":
            return sp.csr_matrix
        if module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            from numpy.core.multiarray import _reconstruct  # type: ignore[attr-defined]

            return _reconstruct
        if module in ("__builtin__", "builtins"):
            return list
        return super().find_class(module, name)


def _read(path: Path):
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, encoding="latin1").load()
    except FileNotFoundError:
        raise GraphInputError(f"{path}: missing Planetoid file") from None
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise GraphInputError(f"{path}: not a readable Planetoid file ({err})") from None


def load_planetoid(name: str, root: Path = DATA_DIR, normalize: bool = True) -> Graph:
    """The public split of `name`; `normalize`: divide each feature row by its sum (see the module docstring)."""
    name = name.lower()
    if name not in NAMES:
        raise GraphInputError(f"unknown Planetoid dataset '{name}' (known: {', '.join(NAMES)})")
    parts = {k: _read(root / f"ind.{name}.{k}") for k in ("x", "y", "tx", "ty", "allx", "ally", "graph")}
    test_index = np.loadtxt(root / f"ind.{name}.test.index", dtype=np.int64).reshape(-1)
    sorted_test = np.sort(test_index)
    tx, ty = parts["tx"].toarray(), np.asarray(parts["ty"])
    if name == "citeseer":  # isolated test vertices: zero rows for the missing indices
        lo, hi = int(test_index.min()), int(test_index.max())
        tx_ext = np.zeros((hi - lo + 1, tx.shape[1]), dtype=tx.dtype)
        ty_ext = np.zeros((hi - lo + 1, ty.shape[1]), dtype=ty.dtype)
        tx_ext[sorted_test - lo] = tx
        ty_ext[sorted_test - lo] = ty
        tx, ty = tx_ext, ty_ext
    x = np.concatenate([parts["allx"].toarray(), tx]).astype(np.float32)
    y = np.concatenate([np.asarray(parts["ally"]), ty]).argmax(1).astype(np.int64)
    x[test_index] = x[sorted_test]
    y[test_index] = y[sorted_test]
    n = len(y)
    n_train = int(np.asarray(parts["y"]).shape[0])
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][:n_train] = True
    masks[1][n_train:n_train + 500] = True
    masks[2][test_index] = True
    rows, cols = [], []
    for k, vs in parts["graph"].items():
        rows.extend([k] * len(vs))
        cols.extend(vs)
    e = np.array([rows, cols], dtype=np.int64)
    e = e[:, (e[0] != e[1]) & (e[0] < n) & (e[1] < n)]
    # coalesce as PyG's processed edge_index: duplicates removed, sorted by (dst, src)
    e = np.unique(e[1] * n + e[0])
    src, dst = e % n, e // n
    if normalize:
        x = x - x.min()  # NormalizeFeatures shifts to a zero minimum (a no-op on these 0/1 features), then
        rowsum = x.sum(1, keepdims=True)  # divides by the row sum clamped at 1
        x = x / np.maximum(rowsum, np.float32(1.0))
    return Graph(n, src, dst, torch.from_numpy(x), torch.from_numpy(y), *(torch.from_numpy(m) for m in masks),
                 name=name)
