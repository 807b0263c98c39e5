"""The graph kernels the lowered IR calls: spmm, sddmm, edge_softmax.

One entry point per kernel checks its arguments (so a shape mistake in a pass
surfaces here with the shapes named, not deep inside torch.sparse) and picks
the implementation: torch's sparse CSR paths (`cpu.py`) on every device, which
on CUDA are cuSPARSE's SpMM (forward, and over the cached transpose backward)
and SDDMM and torch's segment reductions; the Triton kernels
(`triton_kernels.py`, the optional `gnnc[triton]` extra) only for the ops
`TRITON_OPS` names, where a GPU benchmark showed them faster
(`benchmarks/kernels.py --device cuda`, `make gpu-check`), and only when triton
imports and the dtype is one they take; otherwise the torch path. All are
differentiable with torch autograd.

Under autocast (`--precision bf16|fp16`) SpMM and SDDMM are products like a
dense matmul: their floating inputs are cast to the autocast type, as torch
casts a matmul's; the edge softmax runs in float32, as torch runs softmax.

Edge-valued tensors (weights, scores, SDDMM outputs) are in CSR order: entry k
belongs to the edge `csr.indices[k] -> d` with indptr[d] <= k < indptr[d+1].
Data held in the graph's edge order is permuted once with `csr.eids`.

The kernels are registered as the `kernels` variant of the IR ops `spmm`,
`sddmm` and `edge_softmax` (gnnc.runtime.implementations), beside the
interpreter's reference code for the same ops.
"""
from __future__ import annotations

from types import ModuleType

import torch

from gnnc.graph import CSR
from gnnc.ir import Eqn
from gnnc.ir.reducers import REDUCERS
from gnnc.runtime.implementations import implements
from gnnc.runtime.kernels import cpu, reducers
from gnnc.runtime.kernels.cpu import REDUCES, SDDMM_OPS

__all__ = ["spmm", "spmm_add_", "sddmm", "edge_softmax", "REDUCES", "SDDMM_OPS"]


# The reducers the Triton SpMM implements (triton_kernels.SpMM: sum, and mean as scaled weights).
_TRITON_REDUCES = ("sum", "mean")

# The ops whose Triton kernel runs on CUDA instead of torch's path, each because a GPU measured it faster at every
# size it was timed (benchmarks/RESULTS-gpu.md, `make gpu-check` on an H200): edge_softmax (fwd+bwd 0.0008 s against
# torch's 0.0046 at 200K vertices / 2M edges x 8 heads, 0.0070 against 0.1236 at 2.4M / 62M) and dropout (rng's mask
# drawn and applied in one pass, against torch's ~30 integer passes; its figures are in RESULTS-gpu.md). SpMM and
# SDDMM stay on cuSPARSE and torch's segment ops, which were faster or mixed.
TRITON_OPS: frozenset[str] = frozenset({"dropout", "edge_softmax"})


def _triton_for(op: str, *tensors: torch.Tensor) -> ModuleType | None:
    """The Triton backend for `op` when TRITON_OPS names it, every tensor is a float32/float64 CUDA tensor
    and triton imports; None otherwise (the torch path)."""
    if op not in TRITON_OPS:
        return None
    if not all(t.is_cuda and t.dtype in (torch.float32, torch.float64) for t in tensors):
        return None
    try:
        # Imported lazily: the project installs and runs on CPU without triton.
        from gnnc.runtime.kernels import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def dropout_backend(x: torch.Tensor) -> ModuleType | None:
    """The Triton dropout (`triton_kernels.dropout`, rng.dropout's bits) for a float32 CUDA x; None otherwise."""
    return _triton_for("dropout", x) if x.dtype == torch.float32 else None


def _autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The type autocast computes products in on `t`'s device, or None outside an autocast region."""
    kind = t.device.type
    if kind not in ("cpu", "cuda") or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return t if t is None or dtype is None or not t.is_floating_point() else t.to(dtype)


def _check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def spmm(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    """out[d] = reduce over the in-edges k of d of weight[k] * x[src_k]; shape [n_dst, *f].

    x is [n_src, *f] (f may be (F,) or (heads, D)); weight is None, [nnz] or
    [nnz, *W] with W the leading dims of f (per-head scalars times per-head
    vectors), in CSR order. reduce: a reducer of gnnc.ir.reducers with a row
    per vertex: 'sum', 'mean' (divides by the in-degree, duplicates counted),
    'max', 'min' (REDUCES: CSR kernels of their own), or another additive one
    ('std'), computed from its sums of powers of the messages by the sum kernel
    and finalised (gnnc.runtime.kernels.reducers). Rows without in-edges are 0
    for every reduce. Differentiable in x and weight.
    """
    r = REDUCERS.get(reduce)
    if r is None or r.per_edge:
        raise ValueError(f"unknown reduce {reduce!r}; expected one of "
                         f"{tuple(n for n, d in REDUCERS.items() if not d.per_edge)}")
    cast = _autocast_dtype(x)
    x, weight = _cast(x, cast), _cast(weight, cast)
    _check_float("x", x)
    if x.dim() < 1 or x.shape[0] != csr.n_src:
        raise ValueError(f"x has shape {tuple(x.shape)} but the CSR has {csr.n_src} source rows")
    if weight is not None:
        _check_float("weight", weight)
        if weight.shape[0] != csr.nnz:
            raise ValueError(f"weight has shape {tuple(weight.shape)} but the CSR has {csr.nnz} edges")
        if weight.dtype != x.dtype or weight.device != x.device:
            raise TypeError(f"weight ({weight.dtype}, {weight.device}) and x ({x.dtype}, {x.device}) differ")
        cpu.weight_heads(weight, tuple(x.shape[1:]))  # raises on a shape that does not broadcast per head
    if reduce not in REDUCES:  # an additive reducer without a kernel of its own: its sums, then its finalise
        sums = tuple(spmm(csr, reducers.power(x, k), None if weight is None else reducers.power(weight, k))
                     for k in r.powers)
        return reducers.finalise(reduce)(sums, csr.in_degree().to(device=x.device, dtype=sums[0].dtype))
    backend = _triton_for("spmm", x) if reduce in _TRITON_REDUCES else None
    if backend is not None:
        return backend.spmm(csr, x, weight, reduce)
    return cpu.spmm(csr, x, weight, reduce)


def spmm_add_(acc: torch.Tensor, csr: CSR, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """acc += spmm(csr, x, weight, "sum"), in place where the CPU kernel can (one buffer for a sum over
    source parts, gnnc.runtime.parts); elsewhere the product is added. Differentiable like spmm."""
    if acc.shape != (csr.n_dst, *x.shape[1:]):
        raise ValueError(f"accumulator has shape {tuple(acc.shape)}, the product {(csr.n_dst, *x.shape[1:])}")
    # in place only with MKL's types (no 16-bit ones, as under autocast or with 16-bit exchanged rows)
    in_place = x.device.type == "cpu" and _autocast_dtype(x) is None and x.dtype in cpu.MKL_DTYPES \
        and acc.dtype == x.dtype
    if not in_place or _triton_for("spmm", x) is not None:
        return acc + spmm(csr, x, weight, "sum")
    _check_float("x", x)
    if x.shape[0] != csr.n_src or (weight is not None and weight.shape[0] != csr.nnz):
        raise ValueError(f"x {tuple(x.shape)} / weight for a CSR of {csr.n_src} sources and {csr.nnz} edges")
    return cpu.spmm_add_(acc, csr, x, weight)


def sddmm(csr: CSR, a: torch.Tensor, b: torch.Tensor, op: str = "add") -> torch.Tensor:
    """e[k] = a[src_k] op b[dst_k] for every CSR entry k; shape [nnz, ...].

    a is [n_src, ...], b is [n_dst, ...]. 'add' and 'mul' broadcast per head
    (the shorter operand gets trailing unit dims: [n, H] with [n, H, D]);
    'dot' contracts the last dim of two equally shaped operands ([n, H, D] ->
    [nnz, H]). Differentiable in a and b.
    """
    if op not in SDDMM_OPS:
        raise ValueError(f"unknown sddmm op {op!r}; expected one of {SDDMM_OPS}")
    cast = _autocast_dtype(a)
    a, b = _cast(a, cast), _cast(b, cast)
    _check_float("a", a)
    _check_float("b", b)
    if a.dim() < 1 or a.shape[0] != csr.n_src:
        raise ValueError(f"a has shape {tuple(a.shape)} but the CSR has {csr.n_src} source rows")
    if b.dim() < 1 or b.shape[0] != csr.n_dst:
        raise ValueError(f"b has shape {tuple(b.shape)} but the CSR has {csr.n_dst} destination rows")
    if a.dtype != b.dtype or a.device != b.device:
        raise TypeError(f"a ({a.dtype}, {a.device}) and b ({b.dtype}, {b.device}) differ")
    if op == "dot" and (a.dim() < 2 or a.shape[1:] != b.shape[1:]):
        raise ValueError(f"sddmm 'dot' needs equal feature shapes with a last dim to contract, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    backend = _triton_for("sddmm", a, b)
    if backend is not None and (op == "dot" or a.shape[1:] == b.shape[1:]):
        return backend.sddmm(csr, a, b, op)
    return cpu.sddmm(csr, a, b, op)


def edge_softmax(csr: CSR, e: torch.Tensor) -> torch.Tensor:
    """Softmax of e [nnz, *h] over the in-edges of each destination (per head), numerically stable."""
    _check_float("e", e)
    if _autocast_dtype(e) is not None:
        e = e.float()
    if e.dim() < 1 or e.shape[0] != csr.nnz:
        raise ValueError(f"edge scores have shape {tuple(e.shape)} but the CSR has {csr.nnz} edges")
    backend = _triton_for("edge_softmax", e)
    if backend is not None:
        return backend.edge_softmax(csr, e)
    return cpu.edge_softmax(csr, e)


# ----- the kernels variant of the lowered IR's graph ops; `view` is the layer's GraphView

@implements("spmm", variant="kernels")
def _spmm_op(e: Eqn, ins: list[torch.Tensor], view, ctx) -> torch.Tensor:
    return spmm(view.csr, ins[0], ins[1] if len(ins) > 1 else None, reduce=e.attr("reduce"))


@implements("sddmm", variant="kernels")
def _sddmm_op(e: Eqn, ins: list[torch.Tensor], view, ctx) -> torch.Tensor:
    return sddmm(view.csr, ins[0], ins[1], op=e.attr("op"))


@implements("edge_softmax", variant="kernels")
def _edge_softmax_op(e: Eqn, ins: list[torch.Tensor], view, ctx) -> torch.Tensor:
    return edge_softmax(view.csr, ins[0])
