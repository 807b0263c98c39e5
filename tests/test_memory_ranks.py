"""What a rank holds, and the pre-check's prediction of it (issue 35).

A rank runs no fused chain (gnnc.runtime.fusion runs in one process only): GAT's attention runs equation by equation
there, over the block patterns of the per-head SpMM (gnnc.runtime.kernels.cpu.pattern). Their construction held about
ten [nnz * heads] int64 temporaries at once (190 MiB on a 630K-edge part with 4 heads) and the pre-check priced none of
a rank's per-edge attention tensors: it predicted 0.49 GiB for a GAT rank that peaked at 0.80 GiB.
"""
from __future__ import annotations

import torch

from gnnc.runtime.kernels import cpu


def _block_whole(crow: torch.Tensor, col: torch.Tensor, perm: torch.Tensor | None, rows: int, nnz: int,
                 heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block structure built whole, as before the chunked construction: the reference it must equal."""
    deg = crow[1:] - crow[:-1]
    bdeg = deg.repeat_interleave(heads)
    bcrow = torch.zeros(rows * heads + 1, dtype=torch.int64)
    bcrow[1:] = torch.cumsum(bdeg, 0)
    brow = torch.repeat_interleave(torch.arange(rows * heads), bdeg, output_size=nnz * heads)
    r, h = brow // heads, brow % heads
    k = crow[r] + (torch.arange(nnz * heads) - bcrow[brow])
    base = k if perm is None else perm[k]
    return bcrow, col[k] * heads + h, base * heads + h


def test_the_chunked_block_pattern_equals_the_whole_one(monkeypatch) -> None:
    """Chunks that cut rows and heads, empty rows (the first and last too), with and without a permutation."""
    gen = torch.Generator().manual_seed(0)
    rows, cols = 50, 40
    deg = torch.randint(0, 6, (rows,), generator=gen)
    deg[0] = deg[-1] = deg[7] = 0
    crow = torch.zeros(rows + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(deg, 0)
    nnz = int(crow[-1])
    col = torch.randint(0, cols, (nnz,), generator=gen)
    for chunk in (7, 64, 1 << 18):
        monkeypatch.setattr(cpu, "BLOCK_CHUNK", chunk)
        for heads in (2, 3, 8):
            for perm in (None, torch.randperm(nnz, generator=gen)):
                want = _block_whole(crow, col, perm, rows, nnz, heads)
                got = cpu._block(crow, col, perm, rows, nnz, heads, torch.int32)
                assert got[1].dtype == torch.int32
                for a, b in zip(got, want):
                    assert torch.equal(a.long(), b)

