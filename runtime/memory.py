"""Give freed tensor memory back to the operating system, epoch after epoch, and fault it in by huge pages.

glibc serves large allocations with mmap and returns them on free, but the
first time such a block is freed it raises its mmap threshold to that size
(the "dynamic threshold"). From then on tensors of up to that size come
from the heap, whose freed pages stay with the process: a training loop
that allocates and frees the same large activations every epoch sees its
resident memory grow epoch after epoch (measured: a rank of a 1M-vertex
GCN went from 1.8 to 2.7 GiB over four epochs; with a fixed threshold it
stays at 1.8). Fixing the threshold (mallopt M_MMAP_THRESHOLD) turns the
dynamic adjustment off. Elsewhere (no glibc) this does nothing.

The price: a block of 1 MiB or more is page-faulted in and zeroed again at
every use, so code that loops over blocks of a large tensor keeps its
temporaries below the threshold (`rng.MASK_BLOCK`). A 32 MiB threshold
(glibc's largest) was tried: a 1M-vertex depcomm rank then peaked at 2.4
GiB instead of 1.6.

Huge pages take that price back. torch's own switch, THP_MEM_ALLOC_ENABLE=1,
advises the kernel to back each tensor of 2 MiB or more with transparent
huge pages (madvise MADV_HUGEPAGE): one fault per 2 MiB instead of one per 4
KiB, and the block still goes back to the system when freed. torch reads it
once, at its first allocation, so `use_huge_pages` runs first thing in
gnnc's command line (gnnc.cli) and in the benchmarks, and the processes
they start inherit it; a value the user set (0 turns it off) is kept, and
where the kernel's transparent huge pages are `never` the advice does
nothing. Measured on this machine (2 cores, torch 2.13, `gnnc run`): a GCN
on R-MAT with 200K vertices, hidden 128, training step 0.387 -> 0.238 s and
evaluation 0.161 -> 0.105 s, the process's page faults 1.60M -> 0.19M over
the run, its peak resident memory the same (1089.7 MB); a depcomm rank of a
2-worker GCN on a 16K-vertex SBM (hidden 256, local gloo) 100 -> 69 ms a
step; Cora, whose tensors are all under 2 MiB, unchanged.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import MutableMapping

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20  # blocks of 1 MiB and more are mmapped, and unmapped when freed
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"  # torch's switch (c10's CPU allocator): 1 advises huge pages from 2 MiB up


def use_huge_pages(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn torch's huge-page advice on in this process and the ones it starts, unless the user set it; True
    when it is on. Before torch's first allocation, or it holds for the children only (module docstring)."""
    env = os.environ if environ is None else environ
    env.setdefault(HUGE_PAGES, "1")
    return env[HUGE_PAGES] == "1"


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold in this process; True if it took effect."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def release_free_heap() -> None:
    """Give the heap's free pages back (glibc malloc_trim): blocks under the mmap threshold that were
    freed stay resident otherwise, so a step that reuses them would seem to allocate nothing."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _LIBC:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name is not None else None
            _LIBC.append(libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt")
                         else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
