"""Sparse input features times a weight (gnnc.runtime.kernels.sparse_features) against float64.

The CSR products replace torch.sparse.mm on the COO features; the backward's transpose order is kept for the
last nonzero layout, so a dropout's new values over the same positions must reuse it and new positions must not.
"""
from __future__ import annotations

import pytest
import torch

from test_kernels import seed_of

from gnnc.runtime.kernels import sparse_features
from gnnc.runtime.kernels.sparse_features import sparse_features_mm

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-11, atol=1e-12)}


def _features(n: int, f: int, density: float, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    dense = (torch.rand(n, f, generator=g) < density).to(dtype) * torch.randn(n, f, generator=g, dtype=dtype)
    dense[n // 2] = 0  # a row with no nonzero
    return dense


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,f,out,density", [(300, 200, 16, 0.02), (37, 500, 7, 0.1), (2, 3, 4, 0.5), (50, 40, 1, 0.0)])
def test_product_and_weight_gradient_equal_float64(dtype, n, f, out, density) -> None:
    g = torch.Generator().manual_seed(seed_of("sparse_features", dtype, n, f, out, density))
    dense = _features(n, f, density, dtype, g)
    w = torch.randn(f, out, dtype=dtype, generator=g, requires_grad=True)
    grad = torch.randn(n, out, dtype=dtype, generator=g)
    y = sparse_features_mm(dense.to_sparse_coo().coalesce(), w)
    y.backward(grad)
    torch.testing.assert_close(y.double(), dense.double() @ w.detach().double(), **TOL[dtype])
    torch.testing.assert_close(w.grad.double(), dense.double().t() @ grad.double(), **TOL[dtype])


def test_new_values_reuse_the_transpose_order_and_new_positions_do_not() -> None:
    g = torch.Generator().manual_seed(seed_of("sparse_features_cache"))
    x = _features(120, 90, 0.05, torch.float64, g).to_sparse_coo().coalesce()
    grad = torch.randn(120, 5, dtype=torch.float64, generator=g)

    def weight_grad(features: torch.Tensor) -> torch.Tensor:
        w = torch.zeros(90, 5, dtype=torch.float64, requires_grad=True)
        sparse_features_mm(features, w).backward(grad)
        return w.grad

    weight_grad(x)
    kept = sparse_features._Layout.entry
    # dropout's result: the same indices tensor, other values
    dropped = torch.sparse_coo_tensor(x.indices(), x.values() * 2.0, x.shape, is_coalesced=True, check_invariants=True)
    torch.testing.assert_close(weight_grad(dropped), dropped.to_dense().t() @ grad)
    assert sparse_features._Layout.entry is kept
    other = _features(120, 90, 0.05, torch.float64, g).to_sparse_coo().coalesce()
    torch.testing.assert_close(weight_grad(other), other.to_dense().t() @ grad)
    assert sparse_features._Layout.entry is not kept
