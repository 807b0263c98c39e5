"""Graph kernels on torch's sparse CSR paths: the CPU backend (and the fallback on any device).

Message passing written as "gather x[src], multiply, scatter to dst"
materialises one row per edge: for a 2M-edge graph at 128 features that is a
1 GB tensor written and read again, forward and backward, which is why PyG's
default path takes seconds per epoch on a CPU. torch already ships row-parallel
CSR kernels that read each source row once per edge and never build that
tensor (MKL's `mkl_sparse_?_mm` behind `torch.sparse.mm`, the vectorised
`spmm_reduce` kernel behind `torch.sparse.mm(..., reduce=)`, and
`torch.sparse.sampled_addmm` for SDDMM). This module wraps them in
`torch.autograd.Function`s whose backward passes are again CSR products:

* spmm:  out = A @ x with A[d, s] = w[k]; d out/d x = A^T @ grad (a SpMM over the
  transpose, whose structure is built once per graph and cached on the CSR), and
  d out/d w[k] = <grad[dst_k], x[src_k]> (an SDDMM, `sampled_addmm`).
* per-head weights (GAT: w [nnz, H] and x [n, H, D]) use a *block* structure
  with one row per (vertex, head) and one column per (vertex, head), so x and
  the output are free reshapes to [n*H, D] and one CSR product handles every
  head; nothing of shape [nnz, H, D] is ever built.
* mean is a sum whose edge weights are divided by the destination's degree
  (an [nnz] product, not a pass over the [n, F] output).
* max/min use the `spmm_reduce` kernel, which also returns, per output element,
  the edge that won; torch's matching backward kernel routes the gradient
  through that index.
* edge_softmax uses segment reductions over the CSR's contiguous rows.

Everything cached lives in `csr._cache` under keys starting with `KEY`, so it is
built once per graph (and per device and head count) and freed with the graph.
Edge tensors are in CSR order (entry k of `csr.indices`) throughout.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch
from torch.autograd.function import once_differentiable

from gnnc.graph import CSR

KEY = "gnnc.kernels"
REDUCES = ("sum", "mean", "max", "min")  # the reducers SpMM has CSR kernels for (others: kernels.spmm)
SDDMM_OPS = ("add", "mul", "dot")

# MKL's CSR x dense product is faster for narrow dense operands and torch's own
# row-parallel spmm_reduce kernel for wide ones (measured on this project's
# 200K-vertex, 2M-edge benchmark graph with 2 threads: MKL 0.048 s vs 0.061 s at
# width 16, 0.056 vs 0.079 at 32; spmm_reduce 0.099 vs 0.110 at 64, 0.185 vs
# 0.262 at 128, 0.326 vs 0.393 at 256).
_REDUCE_KERNEL_MIN_WIDTH = 64

# Types MKL's CSR product takes (torch 2.13: "addmm_out_sparse_csr_impl_mkl" not implemented for 'BFloat16').
MKL_DTYPES = (torch.float32, torch.float64)
# Types torch.sparse.sampled_addmm takes (torch 2.13, CPU: "Expected self to be a floating-point or complex
# tensor, but got BFloat16"); 16-bit SDDMM-dots are computed in float32 and rounded once.
_SAMPLED_DTYPES = (torch.float32, torch.float64)

# The private op behind torch.sparse.mm(..., reduce=) that also returns the
# winning edge of max/min; without it max/min take the generic path.
_HAS_MM_REDUCE_IMPL = hasattr(torch.ops.aten, "_sparse_mm_reduce_impl")


# ---------------------------------------------------------------------------
# Per-graph caches
# ---------------------------------------------------------------------------

def cached(csr: CSR, key: tuple, build: Callable[[], Any]) -> Any:
    """`csr._cache[(KEY, *key)]`, built by `build()` on first use."""
    full = (KEY,) + key
    if full not in csr._cache:
        csr._cache[full] = build()
    return csr._cache[full]


def structure(csr: CSR, name: str, device: torch.device) -> torch.Tensor:
    """One int64 structure tensor of the graph on `device`, copied there once.

    Names: `indptr`, `indices`, `dst` (destination of each CSR entry),
    `t_indptr`, `t_indices` (the transpose: sources' out-edges, with their
    destinations), `t_perm` (entry k of the transpose is entry t_perm[k] here),
    `t_place` (its inverse: entry k here is entry t_place[k] of the transpose),
    `edge_ids` (0..nnz-1).
    """
    def build() -> torch.Tensor:
        if name == "indptr":
            t = csr.indptr
        elif name == "indices":
            t = csr.indices
        elif name == "dst":
            t = csr.dst_index()
        elif name == "t_indptr":
            t = csr.transpose().indptr
        elif name == "t_indices":
            t = csr.transpose().indices
        elif name == "t_perm":
            t = csr.transpose()._cache["perm_from"]
        elif name == "t_place":
            perm = structure(csr, "t_perm", device)
            t = torch.empty_like(perm)
            t[perm] = torch.arange(perm.numel(), device=device)
        elif name == "edge_ids":
            t = torch.arange(csr.nnz, device=device)
        else:
            raise KeyError(name)
        return t.to(device=device, dtype=torch.int64)

    return cached(csr, ("structure", name, str(device)), build)


def inv_degree(csr: CSR, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """1 / in-degree per destination (1 for empty rows, whose sums are 0 anyway)."""
    return cached(csr, ("inv_degree", str(device), dtype),
                  lambda: (1.0 / csr.in_degree().clamp(min=1).to(torch.float64)).to(device=device, dtype=dtype))


def sparse_csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR is "beta"; the paths used
        # here are the ones torch_geometric itself relies on.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class Pattern:
    """One orientation of a graph's structure as the parts of a torch sparse CSR matrix.

    Rows are destinations (or, transposed, sources). With `heads` H > 1 the
    pattern is the block structure used for per-head edge weights: row r*H + h,
    column c*H + h, holding the entries of row r in their order, so that x
    [n, H, D] is the dense matrix x.view(n*H, D). `perm[p]` is the flat index,
    into an edge tensor [nnz, H] in the *graph's* CSR order, of entry p (None
    when that is the identity), so `values = w.reshape(-1)[perm]`.
    """

    __slots__ = ("crow", "col", "perm", "shape", "heads", "_ones", "_constant")

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, perm: torch.Tensor | None,
                 shape: tuple[int, int], heads: int):
        self.crow, self.col, self.perm, self.shape, self.heads = crow, col, perm, shape, heads
        self._ones: dict[torch.dtype, torch.Tensor] = {}
        # the last matrix built from edge values that need no gradient (a GCN's norms, the same tensor every
        # step): (those values, their version, the matrix), so that a transposed pattern permutes them once
        self._constant: tuple[torch.Tensor, int, torch.Tensor] | None = None

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def values(self, weight: torch.Tensor) -> torch.Tensor:
        """Edge values [nnz, *] in graph CSR order -> this pattern's entry order."""
        flat = weight.reshape(-1)
        return flat if self.perm is None else flat.index_select(0, self.perm)

    def to_edges(self, values: torch.Tensor) -> torch.Tensor:
        """Inverse of `values`: this pattern's entry order -> flat graph CSR order."""
        if self.perm is None:
            return values
        return torch.empty_like(values).index_copy_(0, self.perm.long(), values)

    def matrix(self, weight: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The sparse matrix with these edge values (all ones, cached, when None)."""
        if weight is not None:
            if weight.requires_grad or self.perm is None:  # nothing to save: values is weight itself
                return sparse_csr(self.crow, self.col, self.values(weight), self.shape)
            hit = self._constant
            if hit is None or hit[0] is not weight or hit[1] != weight._version:
                hit = self._constant = (weight, weight._version,
                                        sparse_csr(self.crow, self.col, self.values(weight), self.shape))
            return hit[2]
        if dtype not in self._ones:
            ones = torch.ones(self.nnz, dtype=dtype, device=self.col.device)
            self._ones[dtype] = sparse_csr(self.crow, self.col, ones, self.shape)
        return self._ones[dtype]


def _index_dtype(*sizes: int) -> torch.dtype:
    # MKL and spmm_reduce take int32 indices directly; int64 would be narrowed
    # (copied) by MKL on every call.
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64


def pattern(csr: CSR, transposed: bool, heads: int, device: torch.device) -> Pattern:
    """The (cached) pattern of `csr` or its transpose, with `heads` heads, on `device`."""
    def build() -> Pattern:
        if transposed:
            built = "t" not in csr._cache
            t = csr.transpose()
            crow, col, perm = t.indptr, t.indices, t._cache["perm_from"]
            if built:
                # the pattern keeps the columns narrowed and the permutation: the int64 transpose built for it here
                # (its sources and edge ids, 16 bytes per edge: 1.9 GiB at ogbn-products' size) is not kept too
                # (issue 35); what reads the transpose itself (attention, a device copy) builds it again
                del csr._cache["t"]
            rows, cols = csr.n_src, csr.n_dst
        else:
            crow, col, perm = csr.indptr, csr.indices, None
            rows, cols = csr.n_dst, csr.n_src
        nnz = int(col.numel())
        itype = _index_dtype(nnz * heads, rows * heads + 1, cols * heads)
        if heads > 1:
            crow, col, perm = _block(crow, col, perm, rows, nnz, heads, itype)
        # a transposed pattern's permutation only gathers edge values (`values`: index_select takes int32), never
        # scatters them back (`to_edges`, whose index_copy_ wants int64, serves the untransposed ones): narrowed
        # with the columns, 4 bytes per edge less (0.47 GiB at ogbn-products' size, issue 35)
        ptype = itype if transposed else torch.int64
        built = Pattern(crow.to(device=device, dtype=itype), col.to(device=device, dtype=itype),
                        None if perm is None else perm.to(device=device, dtype=ptype),
                        (rows * heads, cols * heads), heads)
        csr.release_pages()  # a stored CSR's int64 pages, read for the copies above, are not read again (issue 35)
        return built

    return cached(csr, ("pattern", transposed, heads, str(device)), build)


# block entries computed at a time by `_block`: its int64 temporaries stay at a few MiB each. Built whole, they were
# about ten [nnz * heads] int64 tensors at once: measured on a 630K-edge part with 4 heads (GAT on a rank, which runs
# no fused chain), 190 MiB above the pattern's 10 MiB of columns, most of a rank's peak (issue 35)
BLOCK_CHUNK = 1 << 18


def _block(crow: torch.Tensor, col: torch.Tensor, perm: torch.Tensor | None, rows: int, nnz: int,
           heads: int, itype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block structure with one row per (row, head); see `Pattern`. Columns come as `itype`."""
    dev = crow.device  # built where the structure is; the sizes are known, so nothing is read back
    bcrow = torch.zeros(rows * heads + 1, dtype=torch.int64, device=dev)
    bcrow[1:] = torch.cumsum((crow[1:] - crow[:-1]).repeat_interleave(heads), 0)
    bcol = torch.empty(nnz * heads, dtype=itype, device=dev)
    bperm = torch.empty(nnz * heads, dtype=torch.int64, device=dev)
    for start in range(0, nnz * heads, BLOCK_CHUNK):
        p = torch.arange(start, min(start + BLOCK_CHUNK, nnz * heads), device=dev)
        brow = torch.searchsorted(bcrow, p, right=True) - 1  # the block row of each block entry (empty rows skipped)
        r, h = brow // heads, brow % heads
        k = crow[r] + (p - bcrow[brow])  # the base entry it copies
        bcol[start:start + p.numel()] = col[k].long() * heads + h  # int64 first: a rank's columns may be int32
        bperm[start:start + p.numel()] = (k if perm is None else perm[k]) * heads + h
    return bcrow, bcol, bperm


def weight_heads(weight: torch.Tensor | None, feat_shape: tuple[int, ...]) -> int:
    """How many heads a per-edge weight splits the features into (1: one scalar per edge).

    A weight [nnz, *W] multiplies x [n, *W, *rest] per head: W must be the
    leading feature dims (a per-head scalar times a per-head vector). A weight
    whose trailing dims hold one element ([nnz, 1]) is a plain scalar.
    """
    if weight is None or weight.dim() <= 1:
        return 1
    wshape = tuple(weight.shape[1:])
    if math.prod(wshape) == 1:
        return 1
    if tuple(feat_shape[:len(wshape)]) != wshape:
        raise ValueError(f"edge weight of shape {tuple(weight.shape)} does not match features of shape "
                         f"{tuple(feat_shape)}: its trailing dims must be the features' leading dims")
    return math.prod(wshape)


# ---------------------------------------------------------------------------
# Primitives (no autograd): products over a pattern
# ---------------------------------------------------------------------------

def _blocks(t: torch.Tensor, n: int, heads: int) -> torch.Tensor:
    """t [n, *f] as the dense [n * heads, F / heads] operand of a (block) pattern."""
    return t.reshape(n * heads, math.prod(t.shape[1:]) // heads)


def _mm(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CSR x dense: on CPU MKL or torch's spmm_reduce kernel by width (MKL has no 16-bit types); cuSPARSE elsewhere."""
    if x.device.type == "cpu" and (x.shape[1] >= _REDUCE_KERNEL_MIN_WIDTH or x.dtype not in MKL_DTYPES):
        return torch.sparse.mm(a, x, "sum")
    return torch.sparse.mm(a, x)


def spmm_sum(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None, transposed: bool = False) -> torch.Tensor:
    """sum_k w[k] * x[col_k] per row of `csr` (or of its transpose); x contiguous."""
    rows, cols = (csr.n_src, csr.n_dst) if transposed else (csr.n_dst, csr.n_src)
    heads = weight_heads(weight, tuple(x.shape[1:]))
    pat = pattern(csr, transposed, heads, x.device)
    xb = _blocks(x, cols, heads)
    if pat.nnz == 0 or xb.shape[1] == 0:
        return x.new_zeros((rows,) + tuple(x.shape[1:]))
    out = _mm(pat.matrix(weight, x.dtype), xb)
    shape = (rows,) + tuple(x.shape[1:])
    if out.shape == shape:
        return out
    if out.device.type != "cpu":
        return out.view(shape)  # no fused chain runs off the CPU (gnnc.runtime.fusion) to write over it
    # not a view on the CPU: SpMM's result may be overwritten by the next equation (gnnc.runtime.fusion), and
    # autograd forbids writing over a view made inside a custom Function (SpMM), so the head-shaped result is a
    # tensor of its own over the product's memory
    out = out.contiguous()
    return out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), shape)


def sampled_dot(csr: CSR, a: torch.Tensor, b: torch.Tensor, heads: int) -> torch.Tensor:
    """e[k, h] = <a[src_k, h, :], b[dst_k, h, :]>, flat [nnz * heads] in CSR order.

    `torch.sparse.sampled_addmm` evaluates (b @ a^T) only at the pattern's
    entries, so no [nnz, D] tensor is built.
    """
    pat = pattern(csr, False, heads, a.device)
    if pat.nnz == 0:
        return a.new_zeros(0)
    dtype = a.dtype
    if dtype not in _SAMPLED_DTYPES:
        a, b = a.float(), b.float()
    bb = _blocks(b, csr.n_dst, heads)
    ab = _blocks(a, csr.n_src, heads)
    s = torch.sparse.sampled_addmm(pat.matrix(None, a.dtype), bb, ab.t(), beta=0.0)
    return pat.to_edges(s.values()).to(dtype)


def _unsqueeze_to(w: torch.Tensor, dim: int) -> torch.Tensor:
    return w.reshape(tuple(w.shape) + (1,) * (dim - w.dim()))


# ---------------------------------------------------------------------------
# SpMM
# ---------------------------------------------------------------------------

class SpMM(torch.autograd.Function):
    """out[d] = reduce_{k in row d} weight[k] * x[src_k]; see `spmm`."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, x: torch.Tensor, weight: torch.Tensor | None, reduce: str) -> torch.Tensor:
        need_x, need_w = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        ctx.csr, ctx.reduce, ctx.x_shape = csr, reduce, tuple(x.shape)
        ctx.w_shape = None if weight is None else tuple(weight.shape)
        ctx.heads = weight_heads(weight, tuple(x.shape[1:]))
        if reduce in ("sum", "mean"):
            # mean is a sum with every weight divided by its row's degree: an
            # [nnz] product instead of a pass over the [n_dst, F] output, and the
            # backward over the transpose takes the same scaled weights.
            scaled = _mean_weight(csr, weight, x) if reduce == "mean" else weight
            # Each gradient needs only the other operand.
            ctx.save_for_backward(x if need_w else None, scaled if need_x else None)
            return spmm_sum(csr, x, scaled)
        out, arg = _spmm_extreme(csr, x, weight, reduce, need_x or need_w)
        ctx.save_for_backward(x, weight, arg)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        csr: CSR = ctx.csr
        need_x, need_w = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad = grad.contiguous()
        if ctx.reduce in ("sum", "mean"):
            x, scaled = ctx.saved_tensors
            gx = spmm_sum(csr, grad, scaled, transposed=True) if need_x else None
            gw = None
            if need_w:
                gw = sampled_dot(csr, x, grad, ctx.heads)
                if ctx.reduce == "mean":
                    gw = (gw.view(csr.nnz, ctx.heads) * _edge_inv_degree(csr, gw.device, gw.dtype).unsqueeze(1))
                gw = gw.reshape(ctx.w_shape)
            return None, gx, gw, None
        x, weight, arg = ctx.saved_tensors
        gx, gw = _spmm_extreme_backward(csr, grad, x, weight, arg, ctx.heads, ctx.reduce, ctx.w_shape,
                                        need_x, need_w)
        return None, gx, gw, None


class SpMMAdd(torch.autograd.Function):
    """acc += sum_{k in row d} weight[k] * x[src_k], in place: a sum accumulated over source parts.

    A staged or split aggregation (gnnc.runtime.parts) adds each part's product into one buffer
    (MKL's CSR product with beta = 1) instead of allocating the product and adding it; backward
    passes the gradient to `acc` and, for x and weight, is SpMM's.
    """

    @staticmethod
    def forward(ctx: Any, acc: torch.Tensor, csr: CSR, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        need_x, need_w = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        ctx.csr, ctx.w_shape = csr, None if weight is None else tuple(weight.shape)
        ctx.heads = weight_heads(weight, tuple(x.shape[1:]))
        ctx.save_for_backward(x if need_w else None, weight if need_x else None)
        pat = pattern(csr, False, ctx.heads, x.device)
        xb = _blocks(x, csr.n_src, ctx.heads)
        if pat.nnz and xb.shape[1]:
            acc.view(csr.n_dst * ctx.heads, -1).addmm_(pat.matrix(weight, x.dtype), xb)
        ctx.mark_dirty(acc)
        return acc

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        csr: CSR = ctx.csr
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        gx = spmm_sum(csr, grad, weight, transposed=True) if ctx.needs_input_grad[2] else None
        gw = sampled_dot(csr, x, grad, ctx.heads).reshape(ctx.w_shape) if ctx.needs_input_grad[3] else None
        return grad, None, gx, gw


def spmm_add_(acc: torch.Tensor, csr: CSR, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """acc += the weighted sum of x over each row's in-edges, in place (see SpMMAdd)."""
    return SpMMAdd.apply(acc, csr, x.contiguous(), None if weight is None else weight.contiguous())


def _edge_inv_degree(csr: CSR, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """1 / in-degree of each CSR entry's destination, [nnz]."""
    # each row's value repeated over its entries, not gathered by the int64 destination of every entry: that index
    # would stay cached (8 bytes per edge, 0.9 GiB at ogbn-products' size) for a mean that never reads it again
    return cached(csr, ("edge_inv_degree", str(device), dtype),
                  lambda: inv_degree(csr, device, dtype).repeat_interleave(structure(csr, "indptr", device).diff(),
                                                                           output_size=csr.nnz))


def _mean_weight(csr: CSR, weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    scale = _edge_inv_degree(csr, x.device, x.dtype)
    if weight is None:
        return scale
    return weight * _unsqueeze_to(scale, weight.dim())


def _spmm_extreme(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None, reduce: str,
                  want_arg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """max/min through torch's spmm_reduce kernel; `arg` [rows*heads, D] is the winning block entry."""
    heads = weight_heads(weight, tuple(x.shape[1:]))
    pat = pattern(csr, False, heads, x.device)
    xb = _blocks(x, csr.n_src, heads)
    shape = (csr.n_dst,) + tuple(x.shape[1:])
    if pat.nnz == 0 or xb.shape[1] == 0:
        return x.new_zeros(shape), None
    a = pat.matrix(weight, x.dtype)
    op = "amax" if reduce == "max" else "amin"
    if not want_arg:
        return torch.sparse.mm(a, xb, op).view(shape), None
    # The kernel fills `arg` only when autograd would need it, so ask as autograd
    # would; the graph it records is dropped at once.
    with torch.enable_grad():
        out, arg = torch.ops.aten._sparse_mm_reduce_impl(a, xb.detach().requires_grad_(), op)
    if arg.numel() != out.numel():
        raise RuntimeError("torch's _sparse_mm_reduce_impl returned no argmax; this torch version "
                           "needs gnnc.runtime.kernels.cpu.generic_spmm for max/min")
    return out.detach().view(shape), arg


def _spmm_extreme_backward(csr: CSR, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                           arg: torch.Tensor | None, heads: int, reduce: str, w_shape: tuple | None,
                           need_x: bool, need_w: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Route each output element's gradient to the edge that won it (torch's own backward kernel)."""
    if arg is None:  # no edges (or no features): every output was 0 and constant
        return (torch.zeros_like(x) if need_x else None,
                grad.new_zeros(w_shape) if need_w else None)
    pat = pattern(csr, False, heads, grad.device)
    gvals, gx = torch.ops.aten._sparse_mm_reduce_impl_backward(
        pat.matrix(weight, grad.dtype), _blocks(grad, csr.n_dst, heads), _blocks(x, csr.n_src, heads),
        "amax" if reduce == "max" else "amin", arg, [need_w, need_x])
    return (gx.view(x.shape) if need_x else None,
            pat.to_edges(gvals.values()).view(w_shape) if need_w else None)


def generic_spmm(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None, reduce: str) -> torch.Tensor:
    """Gather-multiply-scatter on any device, differentiated by autograd.

    Builds [nnz, *f]; used only where no CSR kernel exists (max/min off the CPU).
    """
    src = structure(csr, "indices", x.device)
    dst = structure(csr, "dst", x.device)
    m = x.index_select(0, src)
    if weight is not None:
        heads = weight_heads(weight, tuple(x.shape[1:]))
        w = weight.reshape(-1) if heads == 1 else weight
        m = m * _unsqueeze_to(w, m.dim())
    shape = (csr.n_dst,) + tuple(x.shape[1:])
    if reduce in ("sum", "mean"):
        out = x.new_zeros(shape).index_add(0, dst, m)
        if reduce == "mean":
            out = out * _unsqueeze_to(inv_degree(csr, x.device, x.dtype), out.dim())
        return out
    idx = _unsqueeze_to(dst, m.dim()).expand_as(m)
    # include_self=False on zeros: rows without in-edges stay 0
    return x.new_zeros(shape).scatter_reduce(0, idx, m, "amax" if reduce == "max" else "amin", include_self=False)


def spmm(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    """CSR-kernel SpMM (validated arguments expected; see gnnc.runtime.kernels.spmm)."""
    x = x.contiguous()
    weight = None if weight is None else weight.contiguous()
    if reduce in ("max", "min") and not (x.device.type == "cpu" and _HAS_MM_REDUCE_IMPL):
        return generic_spmm(csr, x, weight, reduce)
    return SpMM.apply(csr, x, weight, reduce)


# ---------------------------------------------------------------------------
# SDDMM
# ---------------------------------------------------------------------------

class SDDMMDot(torch.autograd.Function):
    """e[k, ...] = <a[src_k, ..., :], b[dst_k, ..., :]>; both gradients are SpMMs weighted by grad e."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.csr = csr
        ctx.save_for_backward(a, b)
        lead = tuple(a.shape[1:-1])
        return sampled_dot(csr, a, b, math.prod(lead)).view((csr.nnz,) + lead)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        a, b = ctx.saved_tensors
        grad = grad.contiguous()
        # grad_a[s] = sum over out-edges k of s of grad[k] * b[dst_k]: SpMM over the transpose
        ga = spmm_sum(ctx.csr, b, grad, transposed=True) if ctx.needs_input_grad[1] else None
        gb = spmm_sum(ctx.csr, a, grad) if ctx.needs_input_grad[2] else None
        return None, ga, gb


def align(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head broadcast as the executor does it: pad the shorter operand with trailing unit dims."""
    while a.dim() < b.dim():
        a = a.unsqueeze(-1)
    while b.dim() < a.dim():
        b = b.unsqueeze(-1)
    return a, b


def sddmm(csr: CSR, a: torch.Tensor, b: torch.Tensor, op: str = "add") -> torch.Tensor:
    """e[k] = a[src_k] op b[dst_k] (validated arguments expected; see gnnc.runtime.kernels.sddmm)."""
    if op == "dot":
        return SDDMMDot.apply(csr, a.contiguous(), b.contiguous())
    # add/mul produce [nnz, *f] anyway, so gathering both operands costs no more
    # than the output; autograd's index_select backward is an index_add.
    ea = a.index_select(0, structure(csr, "indices", a.device))
    eb = b.index_select(0, structure(csr, "dst", b.device))
    ea, eb = align(ea, eb)
    return ea + eb if op == "add" else ea * eb


# ---------------------------------------------------------------------------
# Edge softmax
# ---------------------------------------------------------------------------

class EdgeSoftmax(torch.autograd.Function):
    """Softmax of e over the in-edges of each destination; backward s * (g - sum_row(s * g))."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, e: torch.Tensor) -> torch.Tensor:
        ctx.csr = csr
        if e.shape[0] == 0:
            ctx.save_for_backward(e)
            return e.clone()
        offsets = structure(csr, "indptr", e.device)
        dst = structure(csr, "dst", e.device)
        # Subtracting the row max keeps exp() finite; empty rows get -inf but
        # are never gathered.
        mx = torch.segment_reduce(e, "max", offsets=offsets, unsafe=True)
        out = e - mx.index_select(0, dst)
        out.exp_()
        den = torch.segment_reduce(out, "sum", offsets=offsets, unsafe=True)
        out.div_(den.index_select(0, dst))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (s,) = ctx.saved_tensors
        if s.shape[0] == 0:
            return None, grad.clone()
        csr: CSR = ctx.csr
        sg = s * grad
        dot = torch.segment_reduce(sg, "sum", offsets=structure(csr, "indptr", s.device), unsafe=True)
        return None, sg.sub_(s * dot.index_select(0, structure(csr, "dst", s.device)))


def edge_softmax(csr: CSR, e: torch.Tensor) -> torch.Tensor:
    """Segment softmax (validated arguments expected; see gnnc.runtime.kernels.edge_softmax)."""
    return EdgeSoftmax.apply(csr, e.contiguous())
