"""Counter-based random numbers keyed by global ids.

Dropout must draw the same mask for a vertex (or edge) whatever rank holds
it, so distributed strategies compute exactly what one process computes. A
stateful generator cannot promise that; a hash of (seed, stream, global row
id, global column) can. The hash is Chris Wellons' `lowbias32` integer mixer:
per row and per pair of columns one 32-bit hash, whose two 16-bit halves
give the two columns' draws (int32 arithmetic, half the hashing of one per
column). Draws are therefore multiples of 1/65536: a dropout probability p
acts as round(65536 p) / 65536, within 8e-6 of p.

Everything here is torch integer arithmetic (int64 and int32 multiply, shift,
mask, xor) on the device of the ids given, so a mask is drawn where it is used
(on a GPU, no host round trip) and is the same on every device.

On CPU tensors dropout runs as one compiled loop (gnnc.runtime.kernels.native: hash, keep test and
scale per element, the same bits as the torch code here), and its backward draws the mask again
instead of keeping it: no mask is stored between the passes.

The dropout of a value that needs no gradient (a graph's input features) can be drawn again whole: its result
carries how (`Redraw`), and a product with a weight (`matmul_redrawn`, the executor's linear) keeps that
instead of the dropped-out [vertices, features] tensor its weight's gradient reads, drawing it again in the
backward (GCN with 100 features: 400 bytes per vertex fewer kept between the passes, the same gradient to
the bit).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from gnnc.ir import Eqn
from gnnc.runtime import kernels
from gnnc.runtime.kernels import native

_M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B - (1 << 32)  # the same 32-bit constant as a signed int32


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on uint32 values held in int64."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * (_C2 & _M32)) & _M32
    return x ^ (x >> 16)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors: multiplication wraps mod 2^32; shifts are made logical by masks."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _C1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _C2
    return x ^ ((x >> 16) & 0xFFFF)


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def stream_key(seed: int, *parts: int) -> int:
    """A 32-bit key for one random stream (e.g. seed, epoch, op)."""
    k = torch.tensor(seed & _M32, dtype=torch.int64)
    for p in parts:
        k = _mix64((k ^ ((int(p) * 0x9E3779B1) & _M32)) & _M32)
    return int(k)


def draws16(key: int, rows: torch.Tensor, width: int, col_offset: int = 0) -> torch.Tensor:
    """Integers in [0, 65536), int32 [len(rows), width]; entry (r, c) depends only on (key, rows[r], col_offset + c)."""
    rows = rows.to(torch.int64)
    rk = _as_int32(_mix64(((rows * 0x9E3779B1) ^ key) & _M32))
    first = col_offset - col_offset % 2
    pairs = (col_offset + width - first + 1) // 2
    pair_ids = torch.arange(first // 2, first // 2 + pairs, dtype=torch.int64, device=rows.device)
    ck = _as_int32(_mix64((pair_ids * 0x85EBCA77 + 0x165667B1) & _M32))
    h = _mix32(rk.unsqueeze(1) ^ ck.unsqueeze(0))
    both = torch.stack([h & 0xFFFF, (h >> 16) & 0xFFFF], dim=2).reshape(len(rows), 2 * pairs)
    skip = col_offset - first
    return both[:, skip:skip + width]


def draws16_at(key: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """`draws16` at given (row id, global column) pairs only: what a sparse input's nonzeros need."""
    rk = _as_int32(_mix64(((rows.to(torch.int64) * 0x9E3779B1) ^ key) & _M32))
    cols = cols.to(torch.int64)
    ck = _as_int32(_mix64(((cols // 2) * 0x85EBCA77 + 0x165667B1) & _M32))
    h = _mix32(rk ^ ck)
    return (h >> (16 * (cols % 2)).to(torch.int32)) & 0xFFFF


def uniform(key: int, rows: torch.Tensor, width: int, col_offset: int = 0) -> torch.Tensor:
    """U[0,1) float32 on the 1/65536 grid, shape [len(rows), width]."""
    return draws16(key, rows, width, col_offset).to(torch.float32) * (1.0 / 65536.0)


def keep_mask(key: int, rows: torch.Tensor, width: int, p: float, col_offset: int = 0) -> torch.Tensor:
    """Which entries dropout keeps, bool [len(rows), width].

    Drawn in blocks of rows: the hash's int64/int32 temporaries are several
    times the mask's size, and a mask of a large input would otherwise
    multiply the peak memory of the step that draws it.
    """
    keep = torch.empty(len(rows), width, dtype=torch.bool, device=rows.device)
    thresh = threshold(p)
    for b in _blocks(len(rows), width, rows.device):
        torch.ge(draws16(key, rows[b], width, col_offset), thresh, out=keep[b])
    return keep


def _blocks(n: int, width: int, device: torch.device) -> list[slice]:
    step = max(1, (MASK_BLOCK if device.type == "cpu" else DEVICE_MASK_BLOCK) // max(width, 1))
    return [slice(i, i + step) for i in range(0, n, step)]


def dropout_mask(key: int, rows: torch.Tensor, shape: tuple[int, ...], p: float,
                 col_offset: int = 0) -> torch.Tensor:
    """The keep-mask scaled by 1/(1-p), float [len(rows), *shape]."""
    width = math.prod(int(s) for s in shape)
    return (keep_mask(key, rows, width, p, col_offset) * (1.0 / (1.0 - p))).reshape(len(rows), *shape)


def dropout(x: torch.Tensor, key: int, rows: torch.Tensor, p: float, col_offset: int = 0) -> torch.Tensor:
    """x times its dropout mask (row r's draws keyed by rows[r]); equal to `x * dropout_mask(...)`.

    Compiled (native.c) on the CPU, one Triton kernel for float32 on CUDA (kernels.TRITON_OPS); elsewhere the
    mask is kept as bool (a quarter of a float mask) and only when x needs a gradient, and the product is formed
    block by block, so dropping out a large input costs its output and little else.
    """
    scale = 1.0 / (1.0 - p)
    if native.usable(x) is not None and len(x) and x[0].numel():
        out = _NativeDropout.apply(x, native.int64(rows), key, threshold(p), scale, col_offset)
    elif (fused := kernels.dropout_backend(x)) is not None:
        out = fused.dropout(x, rows, key, threshold(p), scale, col_offset)
    else:
        keep = keep_mask(key, rows, x[0].numel() if len(x) else 0, p, col_offset).reshape(x.shape)
        out = _Dropout.apply(x, keep, scale)
    if not x.requires_grad:
        out._gnnc_redraw = Redraw(x, key, rows, p, col_offset)
    return out


@dataclass(frozen=True)
class Redraw:
    """How a dropout's result is drawn again: `dropout(x, key, rows, p, col_offset)` of an `x` that needs no
    gradient. Holding it holds x, which is what the dropout read (a graph's features: held anyway)."""

    x: torch.Tensor
    key: int
    rows: torch.Tensor
    p: float
    col_offset: int

    def tensor(self) -> torch.Tensor:
        with torch.no_grad():
            return dropout(self.x, self.key, self.rows, self.p, self.col_offset)


def redraw_of(t: torch.Tensor) -> Redraw | None:
    """How `t` can be drawn again, when it is the result of `dropout` of a value that needs no gradient."""
    return getattr(t, "_gnnc_redraw", None)


def matmul_redrawn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w for a dropout's result x that `redraw_of` can draw again: the backward draws x again for w's
    gradient instead of keeping it. Otherwise (no recipe, x not 2-D, under autocast, whose products a custom
    backward would not cast alike) the plain product."""
    redraw = redraw_of(x)
    autocast = torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type)
    if redraw is None or x.dim() != 2 or w.dim() != 2 or x.requires_grad or autocast:
        return x @ w
    return _RedrawnMatmul.apply(x, w, redraw)


class _RedrawnMatmul(torch.autograd.Function):
    """x @ w keeping only how x is drawn; w's gradient is x.t() @ grad, as autograd's mm forms it (the same bits)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, redraw: Redraw) -> torch.Tensor:
        ctx.redraw = redraw  # not saved tensors: a graph input and ids, which the run holds anyway
        return x @ w

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.needs_input_grad[1]:
            return None, None, None
        return None, ctx.redraw.tensor().t().mm(grad), None


def threshold(p: float) -> int:
    """A 16-bit draw d keeps its element when d >= threshold(p)."""
    return int(round(p * 65536))


def dropout_at(values: torch.Tensor, key: int, rows: torch.Tensor, ids: torch.Tensor, cols: torch.Tensor,
               p: float) -> torch.Tensor:
    """Dropout of a sparse input's nonzeros: values[k] kept by the draw at (ids[rows[k]], cols[k]) and scaled.

    Equal to the dense dropout of the same tensor at those entries (`draws16_at`). Compiled for values that
    need no gradient (a graph's input features); otherwise torch ops, differentiable in values.
    """
    scale = 1.0 / (1.0 - p)
    lib = native.usable(values)
    if lib is not None and values.dim() == 1 and not values.requires_grad:
        out = torch.empty_like(values)
        if len(values):
            native.fn(lib, "dropout_at", values.dtype)(
                native.ptr(values.detach().contiguous()), native.ptr(out), native.ptr(native.int64(rows)),
                native.ptr(native.int64(cols)), native.ptr(native.int64(ids)), len(values), key, threshold(p),
                scale, native.threads())
        return out
    draws = draws16_at(key, ids[rows], cols)
    return values * ((draws >= threshold(p)).to(values.dtype) * scale)


def _native_dropout(x: torch.Tensor, rows: torch.Tensor, key: int, thresh: int, scale: float,
                    col_offset: int) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    width = x[0].numel()
    lib = native.usable(x)
    status = native.fn(lib, "dropout", x.dtype)(native.ptr(x), native.ptr(out), native.ptr(rows), len(x), width,
                                                key, col_offset, thresh, scale, native.threads())
    if status != 0:
        raise MemoryError("dropout: no memory for the column keys")
    return out


class _NativeDropout(torch.autograd.Function):
    """Compiled dropout; its backward is the same masked scale of the gradient, drawn again (nothing saved)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor, key: int, thresh: int, scale: float,
                col_offset: int) -> torch.Tensor:
        ctx.args = (key, thresh, scale, col_offset)
        ctx.save_for_backward(rows)
        return _native_dropout(x, rows, key, thresh, scale, col_offset)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        return _native_dropout(grad, rows, *ctx.args), None, None, None, None, None


def _masked_scale(x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(x)
    width = math.prod(x.shape[1:])  # not reshape(n, -1): a rank may hold no row (an empty part)
    x2, k2, o2 = x.reshape(len(x), width), keep.reshape(len(x), width), out.view(len(x), width)
    for b in _blocks(len(x), width, x.device):
        torch.mul(x2[b], k2[b], out=o2[b])
        o2[b].mul_(scale)
    return out


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(keep)
        return _masked_scale(x.contiguous(), keep, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return _masked_scale(grad.contiguous(), keep, ctx.scale), None, None


# elements per block of a dropout mask: its hash's int32 temporaries stay at 512 KiB, below the mmap
# threshold of runtime/memory.py. With 1 MiB blocks each temporary was mmapped and page-faulted anew,
# and dropout took 60% of a GCN epoch on a 100,000-vertex graph (477 ms; 269 ms with these blocks).
MASK_BLOCK = 1 << 17
# On a GPU a block costs its kernel launches, not its pages: the hash is about 30 elementwise kernels per block, and
# with the CPU's blocks a GCN epoch on 200,000 vertices x 128 features (benchmarks/vs_pyg.py) drew 588 blocks, 0.40 s
# of its 0.45 s on an H200 (PyG's epoch: 0.018 s). Blocks of 2^24 elements keep each int32 temporary at 64 MiB.
DEVICE_MASK_BLOCK = 1 << 24


def dropout_stream(e: Eqn) -> int:
    """A dropout's RNG stream: keyed by the name of the value it produces, which passes that
    insert or move equations (communication, rewrites) keep."""
    return zlib.crc32(e.outs[0].name.encode())
