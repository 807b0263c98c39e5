"""Graph kernels for CUDA tensors, written in Triton.

torch's CUDA sparse paths (cuSPARSE) cover a weighted SpMM but not the
per-head weights GAT needs, nor a fused edge softmax; the gather/scatter
fallback materialises [nnz, F] and uses atomics. These kernels are
row-parallel over the CSR (one program per destination and feature block), so
every output row is written exactly once, without atomics, and deterministic:

* `spmm`: out[d, f] = sum_k w[k, f // D] * x[src_k, f] (optionally / deg);
  its x-gradient is the same kernel over the transpose, its weight-gradient
  the SDDMM-dot kernel.
* `sddmm`: e[k] = a[src_k] op b[dst_k] (add, mul), or per-head dot products.
* `edge_softmax`: one program per destination computes the row max and sum
  online in one pass and writes the normalised scores in a second; the
  backward is fused the same way.
* `dropout`: gnnc.runtime.rng's counter-based mask (the same bits) drawn,
  tested and applied in one pass over x; its backward is the same pass over
  the gradient (nothing saved), as the CPU's compiled dropout does. torch's
  integer ops draw it in about 30 passes over int32 temporaries.

This module imports `triton` at the top; `gnnc.runtime.kernels` imports it only
for CUDA tensors, so the package works without triton. Run with
TRITON_INTERPRET=1 (set before import) the kernels execute on CPU tensors,
which is how the test suite checks them on machines without a GPU.
Supported dtypes: float32 (accumulated in float32) and float64.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from gnnc.graph import CSR
from gnnc.runtime.kernels.cpu import inv_degree, structure, weight_heads


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------

@triton.jit
def _spmm_rows(indptr_ptr, idx_ptr, x_ptr, w_ptr, out_ptr, F, D, HEADS,
               HAS_W: tl.constexpr, MEAN: tl.constexpr, IS_F64: tl.constexpr,
               BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """out[row, f] = sum_{k in row} w[k, f // D] * x[idx[k], f]; one program per (row, feature block)."""
    row = tl.program_id(0)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    lo = tl.load(indptr_ptr + row)
    hi = tl.load(indptr_ptr + row + 1)
    if IS_F64:
        acc = tl.zeros([BLOCK_F], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_E):
        k = start + tl.arange(0, BLOCK_E)
        kmask = k < hi
        src = tl.load(idx_ptr + k, mask=kmask, other=0).to(tl.int64)
        m2 = kmask[:, None] & fmask[None, :]
        v = tl.load(x_ptr + src[:, None] * F + f[None, :], mask=m2, other=0.0)
        if HAS_W:
            w = tl.load(w_ptr + k[:, None].to(tl.int64) * HEADS + (f // D)[None, :], mask=m2, other=0.0)
            v = v * w
        acc += tl.sum(v.to(acc.dtype), axis=0)
    if MEAN:
        acc = acc / tl.maximum(hi - lo, 1).to(acc.dtype)
    tl.store(out_ptr + row.to(tl.int64) * F + f, acc.to(out_ptr.dtype.element_ty), mask=fmask)


@triton.jit
def _sddmm_elementwise(src_ptr, dst_ptr, a_ptr, b_ptr, out_ptr, NNZ, F,
                       OP_MUL: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """out[k, f] = a[src_k, f] (+ or *) b[dst_k, f]; one program per (edge block, feature block)."""
    k = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    kmask = k < NNZ
    m2 = kmask[:, None] & (f < F)[None, :]
    s = tl.load(src_ptr + k, mask=kmask, other=0).to(tl.int64)
    d = tl.load(dst_ptr + k, mask=kmask, other=0).to(tl.int64)
    av = tl.load(a_ptr + s[:, None] * F + f[None, :], mask=m2, other=0.0)
    bv = tl.load(b_ptr + d[:, None] * F + f[None, :], mask=m2, other=0.0)
    if OP_MUL:
        r = av * bv
    else:
        r = av + bv
    tl.store(out_ptr + k[:, None].to(tl.int64) * F + f[None, :], r, mask=m2)


@triton.jit
def _sddmm_dot(src_ptr, dst_ptr, a_ptr, b_ptr, out_ptr, NNZ, HEADS, D, IS_F64: tl.constexpr,
               BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[k, h] = sum_j a[src_k, h, j] * b[dst_k, h, j]; one program per (edge block, head)."""
    k = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    h = tl.program_id(1)
    kmask = k < NNZ
    s = tl.load(src_ptr + k, mask=kmask, other=0).to(tl.int64)
    d = tl.load(dst_ptr + k, mask=kmask, other=0).to(tl.int64)
    if IS_F64:
        acc = tl.zeros([BLOCK_E], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for j0 in range(0, D, BLOCK_D):
        j = j0 + tl.arange(0, BLOCK_D)
        m2 = kmask[:, None] & (j < D)[None, :]
        av = tl.load(a_ptr + (s[:, None] * HEADS + h) * D + j[None, :], mask=m2, other=0.0)
        bv = tl.load(b_ptr + (d[:, None] * HEADS + h) * D + j[None, :], mask=m2, other=0.0)
        acc += tl.sum((av * bv).to(acc.dtype), axis=1)
    tl.store(out_ptr + k.to(tl.int64) * HEADS + h, acc.to(out_ptr.dtype.element_ty), mask=kmask)


@triton.jit
def _softmax_fwd(indptr_ptr, e_ptr, out_ptr, H, IS_F64: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_H: tl.constexpr):
    """Row-wise softmax of e [nnz, H]: an online max/sum pass, then a normalising pass."""
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    hmask = h < H
    lo = tl.load(indptr_ptr + row)
    hi = tl.load(indptr_ptr + row + 1)
    if IS_F64:
        mx = tl.full([BLOCK_H], float("-inf"), tl.float64)
        total = tl.zeros([BLOCK_H], dtype=tl.float64)
    else:
        mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_E):
        k = start + tl.arange(0, BLOCK_E)
        m2 = (k < hi)[:, None] & hmask[None, :]
        v = tl.load(e_ptr + k[:, None].to(tl.int64) * H + h[None, :], mask=m2, other=float("-inf")).to(mx.dtype)
        new = tl.maximum(mx, tl.max(v, axis=0))
        # lanes with nothing seen yet (padding heads) keep -inf; shift them by 0
        # so no inf - inf appears
        safe = tl.where(new == float("-inf"), 0.0, new)
        total = total * tl.exp(mx - safe) + tl.sum(tl.exp(v - safe[None, :]), axis=0)
        mx = new
    safe = tl.where(mx == float("-inf"), 0.0, mx)
    inv = 1.0 / tl.where(total > 0, total, 1.0)
    for start in range(lo, hi, BLOCK_E):
        k = start + tl.arange(0, BLOCK_E)
        m2 = (k < hi)[:, None] & hmask[None, :]
        off = k[:, None].to(tl.int64) * H + h[None, :]
        v = tl.load(e_ptr + off, mask=m2, other=0.0).to(mx.dtype)
        tl.store(out_ptr + off, (tl.exp(v - safe[None, :]) * inv[None, :]).to(out_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _softmax_bwd(indptr_ptr, s_ptr, g_ptr, out_ptr, H, IS_F64: tl.constexpr, BLOCK_E: tl.constexpr,
                 BLOCK_H: tl.constexpr):
    """grad_e = s * (g - sum_row(s * g)), per head; one program per row."""
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    hmask = h < H
    lo = tl.load(indptr_ptr + row)
    hi = tl.load(indptr_ptr + row + 1)
    if IS_F64:
        dot = tl.zeros([BLOCK_H], dtype=tl.float64)
    else:
        dot = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_E):
        k = start + tl.arange(0, BLOCK_E)
        m2 = (k < hi)[:, None] & hmask[None, :]
        off = k[:, None].to(tl.int64) * H + h[None, :]
        s = tl.load(s_ptr + off, mask=m2, other=0.0).to(dot.dtype)
        g = tl.load(g_ptr + off, mask=m2, other=0.0).to(dot.dtype)
        dot += tl.sum(s * g, axis=0)
    for start in range(lo, hi, BLOCK_E):
        k = start + tl.arange(0, BLOCK_E)
        m2 = (k < hi)[:, None] & hmask[None, :]
        off = k[:, None].to(tl.int64) * H + h[None, :]
        s = tl.load(s_ptr + off, mask=m2, other=0.0).to(dot.dtype)
        g = tl.load(g_ptr + off, mask=m2, other=0.0).to(dot.dtype)
        tl.store(out_ptr + off, (s * (g - dot[None, :])).to(out_ptr.dtype.element_ty), mask=m2)


# ---------------------------------------------------------------------------
# Launchers: plain tensors in, `out` written (allocated when not given)
# ---------------------------------------------------------------------------

@triton.jit
def _lowbias32(x):
    """rng._mix64: lowbias32 on uint32 values held in int64 (products wrap; the mask keeps the low 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _dropout(x_ptr, rows_ptr, out_ptr, N, W, key, col_offset, thresh, scale,
             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[r, c] = x[r, c] * scale where rng.draws16(key, rows, W, col_offset)[r, c] >= thresh, else 0."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = r < N
    m2 = rmask[:, None] & (c < W)[None, :]
    row = tl.load(rows_ptr + r, mask=rmask, other=0).to(tl.int64)
    rk = _lowbias32(((row * 0x9E3779B1) ^ key) & 0xFFFFFFFF)
    col = c.to(tl.int64) + col_offset
    ck = _lowbias32(((col // 2) * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF)
    h = _lowbias32(rk[:, None] ^ ck[None, :])
    keep = ((h >> ((col % 2) * 16)[None, :]) & 0xFFFF) >= thresh
    off = r[:, None].to(tl.int64) * W + c[None, :]
    v = tl.load(x_ptr + off, mask=m2, other=0.0)
    tl.store(out_ptr + off, tl.where(keep, v * scale, 0.0), mask=m2)


def _pow2(n: int, cap: int) -> int:
    return max(1, min(cap, triton.next_power_of_2(max(int(n), 1))))


def _check_dtype(t: torch.Tensor) -> bool:
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the Triton kernels take float32 or float64, got {t.dtype}")
    return t.dtype == torch.float64


def launch_spmm(indptr: torch.Tensor, indices: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                mean: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row-parallel SpMM: x [n_src, F], weight None or [nnz, heads] (heads divides F) -> out [rows, F]."""
    rows, feats = indptr.numel() - 1, x.shape[1]
    heads = 1 if weight is None else weight.shape[1]
    if out is None:
        out = torch.empty((rows, feats), dtype=x.dtype, device=x.device)
    if rows == 0 or feats == 0:
        return out
    block_f = _pow2(feats, 128)
    _spmm_rows[(rows, triton.cdiv(feats, block_f))](
        indptr, indices, x, x if weight is None else weight, out, feats, feats // heads, heads,
        HAS_W=weight is not None, MEAN=mean, IS_F64=_check_dtype(x), BLOCK_E=32, BLOCK_F=block_f)
    return out


def launch_sddmm(src: torch.Tensor, dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """a [n_src, F], b [n_dst, F] -> out [nnz, F] with a[src] + b[dst] ('add') or * ('mul')."""
    nnz, feats = src.numel(), a.shape[1]
    if out is None:
        out = torch.empty((nnz, feats), dtype=a.dtype, device=a.device)
    if nnz == 0 or feats == 0:
        return out
    _check_dtype(a)
    block_f = _pow2(feats, 64)
    _sddmm_elementwise[(triton.cdiv(nnz, 64), triton.cdiv(feats, block_f))](
        src, dst, a, b, out, nnz, feats, OP_MUL=op == "mul", BLOCK_E=64, BLOCK_F=block_f)
    return out


def launch_sddmm_dot(src: torch.Tensor, dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """a [n_src, H, D], b [n_dst, H, D] -> out [nnz, H] of per-head dot products."""
    nnz, heads, depth = src.numel(), a.shape[1], a.shape[2]
    if out is None:
        out = torch.empty((nnz, heads), dtype=a.dtype, device=a.device)
    if nnz == 0 or heads == 0:
        return out
    _sddmm_dot[(triton.cdiv(nnz, 64), heads)](
        src, dst, a, b, out, nnz, heads, depth, IS_F64=_check_dtype(a), BLOCK_E=64, BLOCK_D=_pow2(depth, 64))
    return out


def launch_softmax(indptr: torch.Tensor, e: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """e [nnz, H] -> softmax over each row's entries, per head."""
    if out is None:
        out = torch.empty_like(e)
    rows, heads = indptr.numel() - 1, e.shape[1]
    if rows == 0 or e.shape[0] == 0 or heads == 0:
        return out
    _softmax_fwd[(rows,)](indptr, e, out, heads, IS_F64=_check_dtype(e), BLOCK_E=32, BLOCK_H=_pow2(heads, 1024))
    return out


def launch_softmax_backward(indptr: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """s, g [nnz, H] -> s * (g - row sum of s * g)."""
    if out is None:
        out = torch.empty_like(s)
    rows, heads = indptr.numel() - 1, s.shape[1]
    if rows == 0 or s.shape[0] == 0 or heads == 0:
        return out
    _softmax_bwd[(rows,)](indptr, s, g, out, heads, IS_F64=_check_dtype(s), BLOCK_E=32,
                          BLOCK_H=_pow2(heads, 1024))
    return out


def launch_dropout(x: torch.Tensor, rows: torch.Tensor, key: int, thresh: int, scale: float, col_offset: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """x [n, W] float32, rows [n] int64 -> x with rng's dropout mask (key, rows, col_offset) applied and scaled."""
    if x.dtype != torch.float32:  # the scale is a float32 argument: float64 would be scaled off by its rounding
        raise TypeError(f"the Triton dropout takes float32, got {x.dtype}")
    n, width = x.shape
    if out is None:
        out = torch.empty_like(x)
    if n == 0 or width == 0:
        return out
    block_c = _pow2(width, 128)
    _dropout[(triton.cdiv(n, 16), triton.cdiv(width, block_c))](
        x, rows, out, n, width, key, col_offset, thresh, scale, BLOCK_R=16, BLOCK_C=block_c)
    return out


# ---------------------------------------------------------------------------
# Autograd functions and entry points (same contracts as gnnc.runtime.kernels)
# ---------------------------------------------------------------------------

def _edge_sum(csr: CSR, values: torch.Tensor, by_source: bool) -> torch.Tensor:
    """Sum edge rows [nnz, F] per destination (or per source) with the SpMM kernel.

    The kernel gathers x[idx[k]]; with the edge ids as idx it sums edge data,
    row-parallel and without atomics.
    """
    dev = values.device
    if by_source:
        return launch_spmm(structure(csr, "t_indptr", dev), structure(csr, "t_perm", dev), values, None)
    return launch_spmm(structure(csr, "indptr", dev), structure(csr, "edge_ids", dev), values, None)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """t as a 2-D [n, everything else] tensor (reshape(n, -1) fails when n is 0)."""
    return t.reshape(n, math.prod(t.shape[1:]))


def _transposed_weight(csr: CSR, weight: torch.Tensor) -> torch.Tensor:
    return weight.index_select(0, structure(csr, "t_perm", weight.device)).contiguous()


class SpMM(torch.autograd.Function):
    """Sum/mean SpMM; d/dx is the same kernel over the transpose, d/dweight the SDDMM-dot kernel."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, x: torch.Tensor, weight: torch.Tensor | None, reduce: str) -> torch.Tensor:
        heads = weight_heads(weight, tuple(x.shape[1:]))
        x2 = _rows(x, csr.n_src)
        w2 = None if weight is None else weight.reshape(csr.nnz, heads)
        dev = x.device
        out = launch_spmm(structure(csr, "indptr", dev), structure(csr, "indices", dev), x2, w2, reduce == "mean")
        ctx.csr, ctx.mean, ctx.heads = csr, reduce == "mean", heads
        ctx.x_shape, ctx.w_shape = tuple(x.shape), None if weight is None else tuple(weight.shape)
        ctx.save_for_backward(x2 if ctx.needs_input_grad[2] else None, w2 if ctx.needs_input_grad[1] else None)
        return out.view((csr.n_dst,) + tuple(x.shape[1:]))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        csr: CSR = ctx.csr
        x2, w2 = ctx.saved_tensors
        dev = grad.device
        g2 = _rows(grad, csr.n_dst)
        if ctx.mean:
            g2 = g2 * inv_degree(csr, dev, g2.dtype).unsqueeze(1)
        g2 = g2.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[1]:
            wt = None if w2 is None else _transposed_weight(csr, w2)
            gx = launch_spmm(structure(csr, "t_indptr", dev), structure(csr, "t_indices", dev), g2, wt)
            gx = gx.view(ctx.x_shape)
        if ctx.needs_input_grad[2]:
            h = ctx.heads
            gw = launch_sddmm_dot(structure(csr, "indices", dev), structure(csr, "dst", dev),
                                  x2.view(csr.n_src, h, x2.shape[1] // h),
                                  g2.view(csr.n_dst, h, g2.shape[1] // h)).view(ctx.w_shape)
        return None, gx, gw, None


class SDDMM(torch.autograd.Function):
    """add/mul/dot SDDMM; the gradients are row sums of edge data (SpMM kernel) or weighted SpMMs."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, a: torch.Tensor, b: torch.Tensor, op: str) -> torch.Tensor:
        dev = a.device
        src, dst = structure(csr, "indices", dev), structure(csr, "dst", dev)
        ctx.csr, ctx.op, ctx.a_shape, ctx.b_shape = csr, op, tuple(a.shape), tuple(b.shape)
        ctx.save_for_backward(a, b)
        if op == "dot":
            lead = tuple(a.shape[1:-1])
            heads = math.prod(lead)
            depth = a.shape[-1]
            out = launch_sddmm_dot(src, dst, a.reshape(csr.n_src, heads, depth), b.reshape(csr.n_dst, heads, depth))
            return out.view((csr.nnz,) + lead)
        out = launch_sddmm(src, dst, _rows(a, csr.n_src), _rows(b, csr.n_dst), op)
        return out.view((csr.nnz,) + tuple(a.shape[1:]))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        csr: CSR = ctx.csr
        a, b = ctx.saved_tensors
        dev = grad.device
        need_a, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        ga = gb = None
        if ctx.op == "dot":
            heads = math.prod(ctx.a_shape[1:-1])
            g2 = grad.reshape(csr.nnz, heads).contiguous()
            if need_a:  # grad_a[s] = sum over out-edges of g[k] * b[dst_k]
                ga = launch_spmm(structure(csr, "t_indptr", dev), structure(csr, "t_indices", dev),
                                 _rows(b, csr.n_dst), _transposed_weight(csr, g2)).view(ctx.a_shape)
            if need_b:
                gb = launch_spmm(structure(csr, "indptr", dev), structure(csr, "indices", dev),
                                 _rows(a, csr.n_src), g2).view(ctx.b_shape)
            return None, ga, gb, None
        g2 = _rows(grad, csr.nnz).contiguous()
        if need_a:
            ea = g2 if ctx.op == "add" else g2 * _rows(b, csr.n_dst).index_select(0, structure(csr, "dst", dev))
            ga = _edge_sum(csr, ea.contiguous(), by_source=True).view(ctx.a_shape)
        if need_b:
            eb = g2 if ctx.op == "add" else g2 * _rows(a, csr.n_src).index_select(0, structure(csr, "indices", dev))
            gb = _edge_sum(csr, eb.contiguous(), by_source=False).view(ctx.b_shape)
        return None, ga, gb, None


class EdgeSoftmax(torch.autograd.Function):
    """Fused row softmax; saves only its output for the fused backward."""

    @staticmethod
    def forward(ctx: Any, csr: CSR, e: torch.Tensor) -> torch.Tensor:
        e2 = _rows(e, csr.nnz)
        out = launch_softmax(structure(csr, "indptr", e.device), e2)
        ctx.csr = csr
        ctx.save_for_backward(out)
        return out.view(e.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (s2,) = ctx.saved_tensors
        csr: CSR = ctx.csr
        g2 = grad.reshape(s2.shape).contiguous()
        return None, launch_softmax_backward(structure(csr, "indptr", s2.device), s2, g2).view(grad.shape)


class Dropout(torch.autograd.Function):
    """Fused dropout; its backward draws the mask again over the gradient (rows are ids, not activations)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: torch.Tensor, key: int, thresh: int, scale: float,
                col_offset: int) -> torch.Tensor:
        ctx.args = (key, thresh, scale, col_offset)
        ctx.save_for_backward(rows)
        return launch_dropout(_rows(x, len(x)), rows, *ctx.args).view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (rows,) = ctx.saved_tensors
        g = grad.contiguous()
        return launch_dropout(_rows(g, len(g)), rows, *ctx.args).view(grad.shape), None, None, None, None, None


def dropout(x: torch.Tensor, rows: torch.Tensor, key: int, thresh: int, scale: float,
            col_offset: int) -> torch.Tensor:
    """rng.dropout's result for a float32 x (see gnnc.runtime.rng.dropout)."""
    return Dropout.apply(x.contiguous(), rows.to(device=x.device, dtype=torch.int64).contiguous(), key, thresh,
                         scale, col_offset)


def spmm(csr: CSR, x: torch.Tensor, weight: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    """Sum/mean SpMM (validated arguments expected; see gnnc.runtime.kernels.spmm)."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"the Triton SpMM implements sum and mean, not {reduce!r}")
    return SpMM.apply(csr, x.contiguous(), None if weight is None else weight.contiguous(), reduce)


def sddmm(csr: CSR, a: torch.Tensor, b: torch.Tensor, op: str = "add") -> torch.Tensor:
    """SDDMM for equal feature shapes (validated arguments expected; see gnnc.runtime.kernels.sddmm)."""
    if op != "dot" and a.shape[1:] != b.shape[1:]:
        raise ValueError(f"the Triton SDDMM needs equal feature shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
    return SDDMM.apply(csr, a.contiguous(), b.contiguous(), op)


def edge_softmax(csr: CSR, e: torch.Tensor) -> torch.Tensor:
    """Fused edge softmax (validated arguments expected; see gnnc.runtime.kernels.edge_softmax)."""
    return EdgeSoftmax.apply(csr, e.contiguous())
