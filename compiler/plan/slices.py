"""P3's feature slices: which columns of the input features each worker holds in a pushpull layer.

The planner prices them, the shard writer slices the features with them and
the runtime's layout changes (vertex <-> feature) follow them: one
definition, in the plan layer below all three.
"""
from __future__ import annotations

from gnnc.errors import GnncError


def feature_slices(num_features: int, parts: int) -> list[tuple[int, int]]:
    """P3's split of the feature dimension: `parts` contiguous [start, stop) column ranges.

    Bounds are F*k//parts, so widths differ by at most one and F need not
    divide by the part count (the wider slices come where the rounding puts
    them; with F < parts some slices are empty). The runtime's shards
    (gnnc.plan.shards) slice the features with it.
    """
    if parts < 1:
        raise GnncError(f"parts must be a positive integer, got {parts!r}")
    if num_features < 0:
        raise GnncError(f"the feature count must be non-negative, got {num_features}")
    bounds = [num_features * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)]
