"""The graph partitioners: one registry (`METHODS`) and one entry point (`partition_graph`).

Every method lives in a module of its own here (hash, chunk, metis, g3,
random; g3's hub start in hub_split), answering `run(inp, parts, seed,
**options)`; `methods` holds the registry, `core` the shared `Partition`
record, `partition_graph` and the other splits of a graph (feature slices,
GNNPipe's chunks); `stats` measures what each part of a split owns, needs and
sends, which is what the planner prices. The CLI takes its
`--partition`/`--method` choices from `METHODS`, so a new partitioner is one
module plus one registry line.

The registry is imported here at once; the names from `core` (which loads
torch) only when first used, so listing the methods costs nothing.
"""
from __future__ import annotations

import importlib
from typing import Any

from gnnc.passes.partition.methods import METHODS, Method  # noqa: F401

_FROM_CORE = ("Partition", "PartitionInput", "partition_graph")


def __getattr__(name: str) -> Any:
    if name not in _FROM_CORE:
        raise AttributeError(f"module 'gnnc.passes.partition' has no attribute {name!r}")
    value = getattr(importlib.import_module("gnnc.passes.partition.core"), name)
    globals()[name] = value  # later lookups skip this function
    return value
