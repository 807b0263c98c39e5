"""Named per-edge data from a graph file: what `edge.NAME` reads in a .gnn layer.

Why this module exists: edge weights and edge features come in with the graph
(an `.npz` array or a PyG `Data` field), must be checked like every other
field, must follow the edges into the `self_loops` view, and must reach every
worker of a distributed run with the edges it holds. One naming rule, one
validation and one self-loop rule live here; the loaders, the views, the
plan's shards and elaboration all ask this module.

Naming: every field `edge_NAME` of the input other than `edge_index` is edge
data `edge.NAME`: `edge_weight` is `edge.weight`, PyG's `edge_attr` is
`edge.attr`, an npz array `edge_type` is `edge.type`. A field of shape [E] is
one number per edge (a scalar edge value); one of shape [E, d] is a d-wide
vector per edge. `edge_weight` must be one number per edge ([E], or [E, 1]),
and not negative: it is the weight `gcn_norm` normalises by (deg^-1/2 of each
vertex's weighted in-degree, as PyG's gcn_norm), and a negative weight could
make a degree negative, its root NaN, and training end in "loss is nan". A
signed quantity belongs in another field (`edge_sign`), which is read as
`edge.sign` with no normalisation and may hold any finite value.
`gcn_norm` is computed by gnnc (from the weights, when the graph has them),
so `edge_gcn_norm` is refused.

Self-loops: the `self_loops` view removes every self-loop and adds one per
vertex, as PyG's `add_remaining_self_loops` does. A vertex that had a
self-loop keeps that loop's values (the last one in edge order when it had
several); a new loop gets weight 1 (GCNConv's fill value) and, for every
other field, the mean of the values on the vertex's in-edges (PyG's
`fill_value="mean"`, what GATConv uses; 0 for a vertex without in-edges).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError, GraphInputError
from gnnc.ir.dims import eval_dim
from gnnc.ir.ops import EDGE_DATA as COMPUTED  # edge data gnnc derives from the structure (and the weights)

PREFIX = "edge_"
WEIGHT = "weight"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def edge_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The edge data among a file's fields, by `edge.NAME` name (`edge_weight` -> `weight`)."""
    return {k[len(PREFIX):]: v for k, v in fields.items()
            if k.startswith(PREFIX) and k != "edge_index" and v is not None}


def validate(raw: Mapping[str, np.ndarray], num_edges: int, source: str) -> dict[str, torch.Tensor]:
    """Edge data (arrays, by `edge.NAME` name) checked against the edge count: float32 [E] or [E, d],
    finite; errors name the field."""
    out: dict[str, torch.Tensor] = {}
    for name in sorted(raw):
        field = PREFIX + name
        if name in COMPUTED:
            raise GraphInputError(f"{source}: {field}: '{name}' is computed by gnnc from the edges "
                                  f"(and edge_weight); rename the field")
        if not _NAME.match(name):
            raise GraphInputError(f"{source}: {field}: '{name}' is not a usable name "
                                  f"(letters, digits and '_', starting with a letter)")
        arr = raw[name]
        if arr.dtype.kind not in "fiub":
            raise GraphInputError(f"{source}: {field}: expected a numeric dtype, got {arr.dtype}")
        if name == WEIGHT and arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.ndim not in (1, 2) or (name == WEIGHT and arr.ndim != 1):
            want = "[E]" if name == WEIGHT else "[E] or [E, d]"
            raise GraphInputError(f"{source}: {field}: expected shape {want}, got {list(arr.shape)}")
        if arr.shape[0] != num_edges:
            raise GraphInputError(f"{source}: {field}: has {arr.shape[0]} rows but edge_index has "
                                  f"{num_edges} edges (one row per edge)")
        if arr.ndim == 2 and arr.shape[1] == 0:
            raise GraphInputError(f"{source}: {field}: has 0 columns")
        data = np.ascontiguousarray(arr, dtype=np.float32)
        bad = ~np.isfinite(data)
        if bad.any():
            at = np.argwhere(bad)[0]
            what = "NaN" if np.isnan(data[tuple(at)]) else "inf"
            raise GraphInputError(f"{source}: {field}: holds {what} at edge {int(at[0])} "
                                  f"({int(bad.sum())} non-finite values)")
        if name == WEIGHT and (data < 0).any():
            at = int(np.argmax(data < 0))
            raise GraphInputError(f"{source}: {field}: negative weight {data[at]:g} at edge {at} "
                                  f"({int((data < 0).sum())} negative); edge weights must be >= 0, as gcn_norm "
                                  f"takes deg^-1/2 of their sums (PyG's GCNConv too); put signed values in "
                                  f"another field, e.g. edge_sign, read as edge.sign")
        out[name] = torch.from_numpy(data)
    return out


def width(values: torch.Tensor) -> int | None:
    """The per-edge width of a field: None for one number per edge, d for [E, d]."""
    return None if values.dim() == 1 else int(values.shape[1])


def shapes(data: Mapping[str, torch.Tensor]) -> dict[str, int | None]:
    """Each field's per-edge width (None: a number per edge), what elaboration types `edge.NAME` by."""
    return {name: width(v) for name, v in data.items()}


def last_loop_of_each_vertex(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(vertex, edge id) of every vertex's last self-loop in edge order."""
    loops = np.nonzero(src == dst)[0]
    if len(loops) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rev = loops[::-1]
    vertices, first = np.unique(src[rev], return_index=True)
    return vertices.astype(np.int64), rev[first].astype(np.int64)


def with_self_loops(name: str, values: torch.Tensor, src: np.ndarray, dst: np.ndarray, n: int) -> torch.Tensor:
    """A field in the `self_loops` view's edge order: the non-loop edges' values, then one loop per vertex."""
    keep = torch.from_numpy(src != dst)
    loop_shape = (n,) + tuple(values.shape[1:])
    if name == WEIGHT:
        loop = torch.ones(loop_shape, dtype=values.dtype)
    else:  # the mean over each vertex's in-edges, PyG's fill_value="mean"
        idx = torch.as_tensor(dst, dtype=torch.int64)
        total = torch.zeros(loop_shape, dtype=torch.float64).index_add(0, idx, values.double())
        count = torch.bincount(idx, minlength=n).clamp(min=1).double()
        loop = (total / count.view(-1, *([1] * (values.dim() - 1)))).to(values.dtype)
    vertices, eids = last_loop_of_each_vertex(src, dst)
    loop[torch.from_numpy(vertices)] = values[torch.from_numpy(eids)]
    return torch.cat([values[keep], loop])


def read_by(program: Any) -> dict[str, Any]:
    """The graph's edge data a program reads (`edata` equations), with the width each expects (None: scalar)."""
    out: dict[str, Any] = {}
    for layer in program.layers:
        for e in layer.eqns:
            if e.op == "edata" and e.attr("name") not in COMPUTED:
                out[e.attr("name")] = e.attr("width")
    return out


def check_fits(program: Any, data: Mapping[str, torch.Tensor], graph_name: str, config: Mapping[str, Any]) -> None:
    """Every `edge.NAME` the program reads is in the graph with the width the program was compiled for."""
    for name, want in read_by(program).items():
        if name not in data:
            have = ", ".join(f"edge_{k}" for k in sorted(data)) or "none"
            raise GnncError(f"the model reads edge.{name} but graph '{graph_name}' has no edge_{name} "
                            f"(its edge data: {have})")
        got = width(data[name])
        need = None if want is None else eval_dim(want, dict(config))
        if got != need:
            def say(w: int | None) -> str:
                return "one number per edge" if w is None else f"{w} numbers per edge"
            raise GnncError(f"the model reads edge.{name} as {say(need)} but graph '{graph_name}' has "
                            f"{say(got)}")
