"""Graph inputs by name: `load_graph(spec)` turns a spec string into a Graph.

Specs: `planetoid:cora`, `planetoid:citeseer` (shipped with gnnc).
"""
from __future__ import annotations

from gnnc.errors import GraphInputError
from gnnc.runtime.graph import Graph


def available_datasets() -> list[tuple[str, str]]:
    return [("planetoid:cora", "Cora citation graph: 2708 vertices, 1433 features, 7 classes (public split)"),
            ("planetoid:citeseer", "CiteSeer citation graph: 3327 vertices, 3703 features, 6 classes (public split)")]


def load_graph(spec: str) -> Graph:
    if spec.startswith("planetoid:"):
        from gnnc.runtime.planetoid import load_planetoid

        return load_planetoid(spec.split(":", 1)[1])
    raise GraphInputError(f"unknown graph '{spec}' (see `gnnc datasets`)")
