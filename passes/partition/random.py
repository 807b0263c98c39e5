"""MG-GCN's partitioner: a seeded random symmetric permutation, then uniform row blocks.

MG-GCN splits the adjacency matrix into P row blocks and runs each SpMM in P
broadcast stages; stage j on GPU i multiplies tile A_ij, so a stage lasts as
long as its densest tile. Power-law graphs keep their hubs together in id
order (R-MAT's low ids), which makes a few tiles far denser than the rest;
permuting rows and columns by the same random permutation spreads them out.
With `permute=False` the blocks follow the identity order, for comparison.
The stats report the nnz of every tile of the P x P block grid.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnc.passes.partition.core import PartitionInput, tile_nnz


def run(inp: PartitionInput, parts: int, seed: int, permute: bool = True) -> tuple[np.ndarray, dict[str, Any]]:
    n = inp.num_nodes
    if permute:
        order = np.random.default_rng(seed).permutation(n)  # order[k]: the vertex at new position k
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
    else:
        position = np.arange(n, dtype=np.int64)
    assignment = position * parts // n  # uniform row blocks of the permuted order
    tiles = tile_nnz(inp.graph, assignment, parts)
    return assignment, {
        "permuted": bool(permute),
        "tile_nnz": tiles.tolist(),
        "max_mean_tile_nnz": float(tiles.max() / tiles.mean()) if tiles.sum() else 0.0,
    }
