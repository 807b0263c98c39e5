"""GAT's steady epochs take no memory afresh from the system (issue 42).

The fused attention's backward (runtime/kernels/native_kernels.inc) keeps [edges, 2 heads] of coefficients
between its two passes. It used to aligned_alloc them itself, outside torch's allocator: glibc maps every block
of 1 MiB and more afresh (gnnc fixes that threshold), so every epoch mapped E x 64 bytes (8 heads of floats) and
page-faulted them in again: ~9,700 of the ~9,700 minor faults an epoch of a 50K-vertex R-MAT GAT (deg 10, 550,000
edges). The scratch now comes from torch's allocator, whose block cache keeps it from one epoch to the next."""
from __future__ import annotations

import resource
import statistics

import pytest
from conftest import EXAMPLES, random_graph

import gnnc
from gnnc.runtime import block_cache
from gnnc.runtime.kernels import native
from gnnc.runtime.memory import heap_free_bytes


def test_a_steady_gat_epoch_faults_no_attention_scratch_in() -> None:
    if native.library() is None or heap_free_bytes() is None:
        pytest.skip(f"no compiled kernels ({native.status()}) or not glibc")
    n, e, heads = 4000, 64000, 8
    faults: list[int] = []

    def after(_rec: dict) -> None:
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

    graph = random_graph(n=n, e=e, f=32, c=4)
    gnnc.run(gnnc.load_model(EXAMPLES / "gat.gnn", hidden=8, heads=heads), graph, epochs=12, seed=0, threads=1,
             on_epoch=after)
    if not block_cache.install():
        pytest.skip("no block cache in this process: torch's blocks of 1 MiB and more are mapped afresh anyway")
    per_epoch = [b - a for a, b in zip(faults, faults[1:])]
    # the first layer's scratch alone, mapped afresh, is (e + n) x 2 heads x 4 bytes: ~1,060 pages an epoch here
    scratch_pages = (e + n) * 2 * heads * 4 // 4096
    assert statistics.median(per_epoch[3:]) < scratch_pages // 10, (per_epoch, scratch_pages)
