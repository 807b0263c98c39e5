"""What a rank holds, and the pre-check's prediction of it (issue 35).

A rank runs no fused chain (gnnc.runtime.fusion runs in one process only): GAT's attention runs equation by equation
there, over the block patterns of the per-head SpMM (gnnc.runtime.kernels.cpu.pattern). Their construction held about
ten [nnz * heads] int64 temporaries at once (190 MiB on a 630K-edge part with 4 heads) and the pre-check priced none of
a rank's per-edge attention tensors: it predicted 0.49 GiB for a GAT rank that peaked at 0.80 GiB.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, ROOT
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


@pytest.mark.slow
def test_a_gat_rank_is_predicted_near_its_measured_peak(tmp_path: Path) -> None:
    """GAT (4 x 64, the products benchmark's) on 2 depcomm ranks of a 20K-vertex R-MAT: the largest rank's
    prediction against its measured peak. Before the per-edge attention terms it was 0.74 of it (379 MiB predicted,
    513 measured), with them 0.92."""
    graph = "rmat:n=20000,deg=20,features=50,classes=7,seed=0"
    r = subprocess.run([sys.executable, "-m", "gnnc", "run", str(EXAMPLES / "gat.gnn"), "--graph", graph,
                        "--set", "hidden=64", "--set", "heads=4", "--epochs", "2", "--nproc", "2",
                        "--strategy", "depcomm", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    measured, predicted = summary["peak_rss_bytes"], summary["predicted_peak_rss_bytes"]
    assert 0.85 * measured <= predicted <= 1.3 * measured, (predicted, measured)
