"""Give freed tensor memory back to the operating system, epoch after epoch.

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

Huge pages take most of that price back for blocks of 2 MiB and more:
gnnc.host.use_huge_pages (torch's own switch, set by gnnc's command line
before torch loads). The block cache (gnnc.runtime.block_cache) takes the
rest: torch's blocks of 1 MiB and more are kept for the next epoch instead
of being unmapped, within the largest live set seen. `set_up_allocator`
does both, first thing in every process that trains.
"""
from __future__ import annotations

import ctypes
import ctypes.util

from gnnc.host import MMAP_THRESHOLD_BYTES

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
# The heap's free top is given back to the system only above this. glibc's default, 128 KiB, stays fixed once the
# mmap threshold is (its dynamic scheme would have raised it to twice the largest block freed): an epoch's blocks
# under 1 MiB then went back at its end and were page-faulted in again the next epoch (a 3000-vertex GCN at hidden
# 64, whose activations are 768 KB: its heap grew and shrank by 2.3 MB an epoch, 532 minor faults an epoch against
# none kept). A process keeps at most this much freed heap beyond what it uses.
TRIM_THRESHOLD_BYTES = 8 << 20


def set_up_allocator() -> None:
    """Fix glibc's mmap and trim thresholds in this process and install the block cache (where each can be)."""
    from gnnc.runtime import block_cache  # deferred: it may build its library

    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    block_cache.install()


def release_free_heap() -> None:
    """Give the heap's free pages back (glibc malloc_trim): blocks under the mmap threshold that were
    freed stay resident otherwise, so a step that reuses them would seem to allocate nothing. (The
    block cache's kept blocks stay: a measurement subtracts them, `block_cache.kept_bytes`.) Between jobs,
    not every epoch: the next epoch page-faults every trimmed page in again (`heap_free_bytes`)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_free_bytes() -> int | None:
    """Bytes free in glibc's heaps (every arena; glibc mallinfo2, 2.33 and later), None elsewhere: freed
    blocks under the mmap threshold that the heap keeps, resident once touched. An epoch's activation
    measurement subtracts them from its base instead of trimming them (`release_free_heap`): trimmed each
    epoch, they were page-faulted in again every epoch (measured on this 2-core machine, loaded, Cora GCN:
    543-577 minor faults an epoch against 1; its CPU per epoch the same within the load's noise, a mean of
    19.5 ms either way over 3 alternating runs of 300 epochs)."""
    libc = _libc()
    info = getattr(libc, "mallinfo2", None) if libc is not None else None
    if info is None:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


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
