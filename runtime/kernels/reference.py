"""Float64 reference implementations of the graph kernels, for tests only.

Written to be obviously right rather than fast: a loop over destinations
(SpMM, edge softmax) or a gather per edge (SDDMM), in float64, differentiated
by plain torch autograd. They share no code with the kernels they check.
"""
from __future__ import annotations

import torch

from gnnc.graph import CSR


def _per_head(w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """w [E] or [E, *W] against m [E, *W, *rest]: trailing unit dims on w."""
    if w.dim() > 1 and w[0].numel() == 1:
        w = w.reshape(-1)
    return w.reshape(tuple(w.shape) + (1,) * (m.dim() - w.dim()))


def spmm(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    x = x.to(torch.float64)
    w = None if weight is None else weight.to(torch.float64)
    rows = []
    for d in range(csr.n_dst):
        lo, hi = int(csr.indptr[d]), int(csr.indptr[d + 1])
        if lo == hi:
            rows.append(x.new_zeros(x.shape[1:]))
            continue
        m = x[csr.indices[lo:hi]]
        if w is not None:
            m = m * _per_head(w[lo:hi], m)
        if reduce == "sum":
            rows.append(m.sum(0))
        elif reduce == "mean":
            rows.append(m.mean(0))
        elif reduce == "max":
            rows.append(m.amax(0))
        elif reduce == "min":
            rows.append(m.amin(0))
        else:
            raise ValueError(reduce)
    if not rows:
        return x.new_zeros((0,) + tuple(x.shape[1:]))
    return torch.stack(rows)


def sddmm(csr: CSR, a: torch.Tensor, b: torch.Tensor, op: str = "add") -> torch.Tensor:
    dst = torch.repeat_interleave(torch.arange(csr.n_dst), csr.indptr[1:] - csr.indptr[:-1])
    ea = a.to(torch.float64)[csr.indices]
    eb = b.to(torch.float64)[dst]
    if op == "dot":
        return (ea * eb).sum(-1)
    while ea.dim() < eb.dim():
        ea = ea.unsqueeze(-1)
    while eb.dim() < ea.dim():
        eb = eb.unsqueeze(-1)
    if op == "add":
        return ea + eb
    if op == "mul":
        return ea * eb
    raise ValueError(op)


def edge_softmax(csr: CSR, e: torch.Tensor) -> torch.Tensor:
    e = e.to(torch.float64)
    parts = []
    for d in range(csr.n_dst):
        lo, hi = int(csr.indptr[d]), int(csr.indptr[d + 1])
        if hi > lo:
            parts.append(torch.softmax(e[lo:hi], dim=0))
    if not parts:
        return e.clone()
    return torch.cat(parts)
