"""Sparse input features times a weight matrix, through CSR products.

Why this exists: bag-of-words features (Cora, CiteSeer: about 1% nonzero) stay
a sparse COO tensor (gnnc.graph.storage.sparse_if_sparse), and
`torch.sparse.mm` on a COO matrix takes the slow general path: on Cora
(2,708 x 1,433, 49K nonzeros) times [1433, 16], 1.07 ms, and its backward
(the transpose times the gradient) 1.17 ms, against 0.04 ms for the same
product with the matrix in CSR (MKL's CSR kernel; 2 threads). A Cora epoch
runs three such products (training forward, its backward, evaluation), so
they were most of it.

`sparse_features_mm(x, w)` multiplies the CSR of x and, for the backward
(w's gradient x^T @ grad), the CSR of x^T. Both structures (row pointers,
the transpose's order) depend only on the nonzeros' positions, which stay the
same epoch after epoch (dropout changes values, not indices), so they are
kept for the last indices seen; each call only arranges the values. The sums run
in another order than the COO kernel's, so results move in the last bits.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from gnnc.runtime.kernels.cpu import sparse_csr


class _Layout:
    """The last nonzero layout's CSR structure: (the indices it was built from, x's row pointers, the
    transpose's order perm and row pointers).

    The indices tensor is held, so its storage cannot be freed and reused by other indices while the entry
    lives: the same storage means the same positions (nothing writes a sparse tensor's indices in place)."""

    entry: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def _layout(indices: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x's row pointers, x^T's entry order, x^T's row pointers) of coalesced COO `indices`, kept for the last."""
    hit = _Layout.entry
    if hit is not None and hit[0].untyped_storage().data_ptr() == indices.untyped_storage().data_ptr() \
            and hit[0].storage_offset() == indices.storage_offset() and hit[0].shape == indices.shape:
        return hit[1], hit[2], hit[3]
    perm = torch.argsort(indices[1], stable=True)  # by column, rows ascending within one: x^T's CSR order
    _Layout.entry = (indices, _row_pointers(indices[0], shape[0]), perm, _row_pointers(indices[1], shape[1]))
    return _Layout.entry[1:]


def _row_pointers(rows: torch.Tensor, n: int) -> torch.Tensor:
    """CSR row pointers of entries whose row ids are `rows` (sorted or not: only the counts matter)."""
    return torch.cat([rows.new_zeros(1), torch.cumsum(torch.bincount(rows, minlength=n), 0)])


class _SparseFeaturesMM(torch.autograd.Function):
    """x [n, f] (sparse COO, coalesced, no gradient) @ w [f, out]; the backward gives w's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        indices, values = x.indices(), x.values()  # coalesced: rows ascending, then columns (CSR's order)
        ctx.save_for_backward(indices, values)
        ctx.shape = tuple(x.shape)
        crow, _, _ = _layout(indices, ctx.shape)
        return torch.sparse.mm(sparse_csr(crow, indices[1], values, ctx.shape), w)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        indices, values = ctx.saved_tensors
        n, f = ctx.shape
        _, perm, crow_t = _layout(indices, ctx.shape)
        xt = sparse_csr(crow_t, indices[0].index_select(0, perm), values.index_select(0, perm), (f, n))
        return None, torch.sparse.mm(xt, grad.contiguous())


def sparse_features_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w for sparse COO features x; through CSR products (module docstring) when x needs no gradient."""
    if x.requires_grad or x.dim() != 2 or w.dim() != 2:
        return torch.sparse.mm(x, w)
    return _SparseFeaturesMM.apply(x.coalesce(), w)
