"""P3's partitioner: each vertex goes to the part its hashed id names.

P3 spends nothing on partitioning: a vertex's part is a hash of its id, so
any machine can compute the owner of any vertex without a table, and every
edge stays with its destination (the owner aggregates its in-edges). The
hash is seeded so different seeds give independent splits; it mixes the id
bits (splitmix64's finaliser) so that ids with a stride do not pile onto
one part, as `id % parts` would.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnc.passes.partition.core import PartitionInput

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 values: every output bit depends on every input bit."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):  # the multiplications wrap modulo 2^64 by design
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def hash_parts(ids: np.ndarray, parts: int, seed: int) -> np.ndarray:
    """The part of each id: mix64(id + seed * golden ratio) mod parts."""
    with np.errstate(over="ignore"):
        keys = ids.astype(np.uint64) + np.uint64(seed) * GOLDEN
    return (mix64(keys) % np.uint64(parts)).astype(np.int64)


def run(inp: PartitionInput, parts: int, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    assignment = hash_parts(np.arange(inp.num_nodes, dtype=np.uint64), parts, seed)
    sizes = np.bincount(assignment, minlength=parts)
    return assignment, {"vertex_balance": float(sizes.max() / sizes.mean())}
