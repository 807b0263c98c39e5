"""The graph partitioners: one registry (`METHODS`) and one entry point (`partition_graph`).

Every method lives in a module of its own here (hash, chunk, metis, g3,
random; g3's hub start in hub_split), answering `run(inp, parts, seed,
**options)`; `core` holds the registry, the shared `Partition` record and
the other splits of a graph (feature slices, GNNPipe's chunks); `stats`
measures what each part of a split owns, needs and sends, which is what the
planner prices. The CLI takes its `--partition`/`--method` choices from
`METHODS`, so a new partitioner is one module plus one registry line.
"""
from gnnc.passes.partition.core import (METHODS, Method, Partition, PartitionInput,  # noqa: F401
                                        partition_graph)
