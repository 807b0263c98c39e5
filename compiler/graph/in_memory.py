"""Graphs a Python user already holds: a PyG `Data`, a networkx graph, a dict of arrays.

`gnnc.load_graph(obj)` (and `gnnc.compile`, `gnnc.run`, `gnnc.partition`,
which call it) takes any of them, so a user need not write a file first.
Each is turned into PyG's field names (`edge_index`, `x`, `y`,
`train_mask`/`val_mask`/`test_mask`, plus `edge_weight` where the input has
weights) and validated by the loaders' one `build_graph`, so every input
meets the same checks and messages.

networkx is never imported here: a networkx graph can only exist once the
user has imported networkx, so the check looks it up in `sys.modules`.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from gnnc.errors import GraphInputError
from gnnc.graph.loaders import MASKS, _from_fields, from_pyg
from gnnc.graph.storage import Graph

NODE_FIELDS = ("x", "y", *MASKS)
ACCEPTED = ("a graph spec (planetoid:cora, a file or directory; see `gnnc datasets`), a gnnc Graph, "
            "a PyG Data, a networkx graph (node attributes x, y and optional masks) or a dict of arrays "
            f"({', '.join(('edge_index', *NODE_FIELDS))})")


def as_graph(obj: Any) -> Graph:
    """A Graph from an in-memory object (see the module docstring); GraphInputError naming what is accepted."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, Mapping):
        return from_dict(obj)
    if is_networkx(obj):
        return from_networkx(obj)
    if hasattr(obj, "edge_index"):
        return from_pyg(obj)
    raise GraphInputError(f"cannot use a {type(obj).__module__}.{type(obj).__name__} as a graph: expected {ACCEPTED}")


def is_networkx(obj: Any) -> bool:
    nx = sys.modules.get("networkx")
    return nx is not None and isinstance(obj, nx.Graph)


def from_dict(arrays: Mapping[str, Any], name: str = "dict") -> Graph:
    """A Graph from a dict with the `.npz` fields: edge_index, x, y, optional masks (arrays or tensors)."""
    unknown = [k for k in arrays if not isinstance(k, str)]
    if unknown:
        raise GraphInputError(f"dict of arrays: keys must be field names (edge_index, x, y, ...), got {unknown[0]!r}")
    return _from_fields(arrays, name, "dict of arrays")


def from_networkx(g: Any, name: str = "networkx") -> Graph:
    """A Graph from a networkx graph, vertices numbered in `g.nodes` order (as PyG's from_networkx).

    An undirected graph gives every edge in both directions (a self-loop
    once); a multigraph keeps parallel edges. Node attributes `x` (a vector
    per node), `y` (an integer class) and the masks become those fields when
    every node has them; a graph whose nodes carry none of `x` or `y` loads
    with stand-ins (see `Graph.stand_ins`: it can be compiled, not trained).
    The edge attribute `weight`, when every edge has one, is passed on as
    `edge_weight`, PyG's name for it.
    """
    source = "networkx graph"
    nodes = list(g.nodes)
    if not nodes:
        raise GraphInputError(f"{source}: empty graph: it has no nodes")
    index = {v: i for i, v in enumerate(nodes)}
    directed = g if g.is_directed() else g.to_directed()
    edges = list(directed.edges(data=True))
    fields: dict[str, Any] = {
        "edge_index": np.array([[index[u] for u, _, _ in edges], [index[v] for _, v, _ in edges]],
                               dtype=np.int64).reshape(2, len(edges)),
    }
    for field in NODE_FIELDS:
        values = [g.nodes[v].get(field) for v in nodes]
        missing = [v for v, value in zip(nodes, values) if value is None]
        if len(missing) == len(nodes):
            continue
        if missing:
            raise GraphInputError(f"{source}: {field}: node {missing[0]!r} has no attribute '{field}' "
                                  f"({len(nodes) - len(missing)} of {len(nodes)} nodes have one: give it to "
                                  f"every node or to none)")
        fields[field] = _stack(values, field, source)
    weights = [data.get("weight") for _, _, data in edges]
    if edges and all(w is not None for w in weights):
        fields["edge_weight"] = np.asarray(weights, dtype=np.float64)
    return _from_fields(fields, name, source, required=("edge_index",), num_nodes=len(nodes))


def _stack(values: list[Any], field: str, source: str) -> np.ndarray:
    """One array of the per-node values (tensors, arrays, lists or scalars)."""
    try:
        return np.stack([np.asarray(v.detach().cpu() if hasattr(v, "detach") else v) for v in values])
    except ValueError as err:  # rows of different lengths
        raise GraphInputError(f"{source}: {field}: the nodes' values do not stack into one array ({err})") from None
