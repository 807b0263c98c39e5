"""Counter-based random numbers keyed by global ids.

Dropout must draw the same mask for a vertex (or edge) whatever rank holds
it, so distributed strategies compute exactly what one process computes. A
stateful generator cannot promise that; a hash of (seed, stream, global row
id, column) can. The hash is Chris Wellons' `lowbias32` integer mixer,
computed in int64 tensors with explicit 32-bit masking.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def stream_key(seed: int, *parts: int) -> int:
    """A 32-bit key for one random stream (e.g. seed, epoch, op index)."""
    k = torch.tensor(seed & _M32, dtype=torch.int64)
    for p in parts:
        k = _mix((k ^ ((int(p) * 0x9E3779B1) & _M32)) & _M32)
    return int(k)


def uniform(key: int, rows: torch.Tensor, width: int, col_offset: int = 0) -> torch.Tensor:
    """U[0,1) float32 of shape [len(rows), width]; entry (r, c) depends only on (key, rows[r], col_offset + c).

    `col_offset` places a feature slice (P3's layout) at its global columns.
    """
    rows = rows.to(torch.int64)
    rk = _mix(((rows * 0x9E3779B1) ^ key) & _M32)
    cols = _mix((torch.arange(col_offset, col_offset + width, dtype=torch.int64) * 0x85EBCA77 + 0x165667B1) & _M32)
    x = _mix(rk.unsqueeze(1) ^ cols.unsqueeze(0))
    return x.to(torch.float32) * (1.0 / 4294967296.0)


def dropout_mask(key: int, rows: torch.Tensor, shape: tuple[int, ...], p: float,
                 col_offset: int = 0) -> torch.Tensor:
    """The keep-mask scaled by 1/(1-p), shape [len(rows), *shape]."""
    width = 1
    for s in shape:
        width *= int(s)
    keep = uniform(key, rows, width, col_offset) >= p
    return (keep.to(torch.float32) * (1.0 / (1.0 - p))).reshape(len(rows), *shape)
