"""How the runtime finalises each additive reducer of gnnc.ir.reducers, and the aggregations built on it.

A reducer whose partials add (`ReducerDef.combine == "add"`) is computed the
same way everywhere: per row, the sums over its in-edges of message**k for
each k of its `powers` (index_add over per-edge messages in the reference
interpreter, the CSR sum kernel in the kernels, one such sum per source part
of a split exchange, gnnc.runtime.parts), then its finalise, registered here
with `@finalises(name)`, from those sums and the row's whole in-degree. So a
new additive reducer is its `define_reducer` plus one finalise. max and min
combine by their extreme and have no finalise: `aggregate` reduces them with
scatter_reduce, the kernels with torch's spmm_reduce (gnnc.runtime.kernels.cpu).
A row without in-edges aggregates to 0 for every reducer.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from gnnc.errors import GnncError
from gnnc.ir.reducers import reducer

# (the sums of message**k per row for each k of the reducer's powers, the in-degree per row) -> the result
Finalise = Callable[[tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]
FINALISE: dict[str, Finalise] = {}


def finalises(name: str) -> Callable[[Finalise], Finalise]:
    """Register the decorated function as the finalise of the additive reducer `name`."""
    r = reducer(name)  # a finalise of a reducer gnnc.ir.reducers does not define is a typo
    if r.combine != "add":
        raise ValueError(f"reducer '{name}' combines by {r.combine}, not by adding partial sums: no finalise")

    def register(fn: Finalise) -> Finalise:
        if name in FINALISE:
            raise ValueError(f"reducer '{name}' already has a finalise")
        FINALISE[name] = fn
        return fn

    return register


def finalise(name: str) -> Finalise:
    fn = FINALISE.get(name)
    if fn is None:
        raise GnncError(f"the runtime has no implementation of reducer '{name}'")
    return fn


def per_row(deg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The in-degree [n] as a column that broadcasts over `like`'s feature dims, at least 1 (empty rows' sums
    are 0)."""
    return deg.clamp(min=1).view(-1, *([1] * (like.dim() - 1)))


def power(m: torch.Tensor, k: int) -> torch.Tensor:
    """m**k, as a product for k = 2 (what PyG's variance computes: x * x)."""
    return m if k == 1 else m * m if k == 2 else m ** k


@finalises("sum")
def _sum(sums: tuple[torch.Tensor, ...], deg: torch.Tensor) -> torch.Tensor:
    return sums[0]


@finalises("mean")
def _mean(sums: tuple[torch.Tensor, ...], deg: torch.Tensor) -> torch.Tensor:
    return sums[0] / per_row(deg, sums[0])


_STD_MIN_VAR = 1e-5


@finalises("std")
def _std(sums: tuple[torch.Tensor, ...], deg: torch.Tensor) -> torch.Tensor:
    """PyG's StdAggregation: E[m^2] - E[m]^2 (each a mean over the in-edges), its square root where it exceeds
    1e-5 and 0 elsewhere (rows without in-edges and single-edge rows included: no undefined gradient at 0)."""
    n = per_row(deg, sums[0])
    mean, mean2 = sums[0] / n, sums[1] / n
    out = (mean2 - mean * mean).clamp(min=_STD_MIN_VAR).sqrt()
    return out.masked_fill(out <= math.sqrt(_STD_MIN_VAR), 0.0)


def aggregate(name: str, m: torch.Tensor, dst: torch.Tensor, n: int, deg: torch.Tensor) -> torch.Tensor:
    """The reference aggregation of per-edge messages m [nnz, *f] into rows [n, *f] by reducer `name`."""
    r = reducer(name)
    shape = (n,) + tuple(m.shape[1:])
    if r.combine == "add":
        sums = tuple(torch.zeros(shape, dtype=m.dtype, device=m.device).index_add(0, dst, power(m, k))
                     for k in r.powers)
        return finalise(name)(sums, deg)
    if r.combine in ("max", "min"):
        idx = dst.view(-1, *([1] * (m.dim() - 1))).expand_as(m)
        # rows without in-edges stay 0, as PyG's max/min aggregation gives
        return torch.zeros(shape, dtype=m.dtype, device=m.device).scatter_reduce(
            0, idx, m, "amax" if r.combine == "max" else "amin", include_self=False)
    raise AssertionError(f"reducer '{name}' has no aggregation of a row per vertex")
