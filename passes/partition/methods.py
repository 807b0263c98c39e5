"""The registry of partitioning methods: names, summaries and the module that runs each.

A module of its own, apart from `core`, because the CLI lists the methods
(`--partition`, `gnnc partition --method`) before it knows whether the
command will partition anything: reading the registry must not load torch,
numpy or the graph storage that running a method needs.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Method:
    """A registered partitioner: its name, a one-line summary and the module that runs it."""

    name: str
    summary: str
    module: str

    def runner(self) -> Callable[..., tuple[Any, dict[str, Any]]]:
        """The method's `run(inp, parts, seed, **options) -> (assignment, stats)`, its module imported now."""
        return importlib.import_module(self.module).run


METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in (
    Method("hash", "P3: vertex id hashed to a part, no preprocessing; edges stay with their destination",
           "gnnc.passes.partition.hash"),
    Method("chunk", "NeutronStar: contiguous id ranges balanced by vertices plus in-edges",
           "gnnc.passes.partition.chunk"),
    Method("metis", "METIS k-way (pymetis): edge-cut by default; G3's multi-constraint volume variant",
           "gnnc.passes.partition.metis"),
    Method("g3", "G3 Algorithm 1: multi-constraint METIS, then swaps that balance the remote sets |B_i|",
           "gnnc.passes.partition.g3"),
    Method("random", "MG-GCN: seeded symmetric random permutation, then uniform row blocks",
           "gnnc.passes.partition.random"),
    Method("fennel", "NeutronStar's streaming partitioner (Fennel): one pass in vertex order, O(N) memory; "
                     "options gamma (1.5), slack (1.1), batch (64)", "gnnc.passes.partition.fennel"),
)})
