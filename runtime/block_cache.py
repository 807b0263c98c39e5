"""Reuse torch's large CPU blocks from one epoch to the next instead of taking fresh memory for each.

Why: glibc maps every block of 1 MiB and more afresh and unmaps it when freed (gnnc.runtime.memory fixes
that threshold so a run's memory does not grow epoch after epoch), so every activation of every epoch is
page-faulted in and zeroed by the kernel again, and on this project's virtual machines what that costs
varies from run to run. Measured (2 cores, R-MAT 200K vertices / 2M edges, hidden 128, huge pages on,
gnnc's epoch = training step + evaluation, ten epochs): without the cache the process spent 0.12-0.60 s
of system time per epoch (GCN, SAGE, GAT) and GAT's epochs ranged 1.02-2.05 s; with it 0.000-0.078 s,
and 0.79-0.84 s; peak RSS +1% to +16%.

The cache is torch's CPU allocator (c10::SetCPUAllocator) from `block_cache.cpp`, built and loaded like
the compiled kernels (gnnc.runtime.kernels.native: same private cache directory, same lock, same checks
of the file loaded, same bound on the compiler's time). GNNC_NATIVE=0
turns both off, GNNC_BLOCK_CACHE=0 the cache alone (to measure without it). Blocks under 1 MiB go to
torch's allocator as before; a freed larger block is kept and handed to the next request it fits with
at most an eighth to spare. What it holds stays within a quarter above the largest live set seen, and
within MAX_SLACK_BYTES above it: on a request no kept block fits, kept blocks are freed (largest first)
until the memory held, this block included, is within that bound. A training loop asks for the same sizes
every epoch and finds them kept after its first epochs; a run's peak grows by what the kept blocks add at
its peak, at most the smaller of a quarter of its large blocks' high-water mark and MAX_SLACK_BYTES.
`empty()` gives every kept block back (between the jobs of one process, for one).

Why the bound in bytes: the 200K-vertex cases the cache is for (benchmarks/contention.py) keep 74 MiB (GCN,
hidden 128) and 88 MiB (GAT, 8 x 16) beyond their largest live set in steady state, with 0 misses an epoch; a
quarter alone kept 1.9 GiB beyond GCN's live set at ogbn-products' size (14.33 GiB peak against 12.46
without the cache, at the same epoch time: there faulting a few blocks in again costs little beside a
53 s epoch, issue 35). MAX_SLACK_BYTES leaves the 200K cases about three times what they use.

Where the library cannot be built (no C++ compiler or no torch headers), torch's allocator stays.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from gnnc.host import MMAP_THRESHOLD_BYTES
from gnnc.runtime.kernels import native

SOURCE = Path(__file__).with_name("block_cache.cpp")
ENV_SWITCH = "GNNC_BLOCK_CACHE"  # 0 keeps torch's allocator (read once, when a process sets up its allocator)
MIN_BYTES = MMAP_THRESHOLD_BYTES  # the blocks glibc maps afresh
MAX_SLACK_BYTES = 256 << 20  # the most the cache keeps beyond the largest live set (the module's docstring)


def recipe() -> native.Recipe:
    """The C++ build against the torch this process runs (its headers, its libc10, its C++ ABI)."""
    root = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return native.Recipe(
        f"gnnc_block_cache_torch{torch.__version__.replace('+', '_')}",  # a new torch builds anew
        (SOURCE,),
        ("c++", "g++", "clang++"),
        ("-O2", "-std=c++17", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{root / 'include'}"),
        ((),),
        (f"-L{root / 'lib'}", "-lc10", f"-Wl,-rpath,{root / 'lib'}"),
    )


@dataclass(frozen=True)
class Stats:
    """Bytes in blocks torch holds and in blocks kept for reuse, the largest live set, hits and misses."""

    live: int
    cached: int
    high: int
    hits: int
    misses: int


class _State:
    lib: ctypes.CDLL | None = None
    reason: str = "not installed"  # why the cache is not in use
    tried: bool = False


def install() -> bool:
    """Make the cache torch's CPU allocator in this process (once; later calls say whether it is)."""
    if _State.tried:
        return _State.lib is not None
    _State.tried = True
    if native.turned_off():
        _State.reason = f"turned off {native.turned_off()}"
        return False
    off = native.switched_off(ENV_SWITCH)
    if off:
        _State.reason = f"turned off {off}"
        return False
    compiler = native.find_compiler(recipe())
    if compiler is None:
        _State.reason = "no C++ compiler (c++, g++ or clang++) on PATH"
        return False
    try:
        lib, why = native.load(compiler, native.cache_dir(), recipe())
    except OSError as err:  # no private directory to build in, or none to write there
        lib, why = None, str(err)
    if lib is None:
        _State.reason = why
        return False
    try:
        lib.gnnc_block_cache_install.restype = ctypes.c_int
        lib.gnnc_block_cache_install.argtypes = [ctypes.c_int64, ctypes.c_int64]
        lib.gnnc_block_cache_stats.argtypes = [ctypes.c_void_p]
        lib.gnnc_block_cache_empty.argtypes = []
        lib.gnnc_block_cache_raw_round_trip.argtypes = [ctypes.c_int64]
    except AttributeError as err:
        _State.reason = f"the library does not match its source: {err}"
        return False
    if lib.gnnc_block_cache_install(MIN_BYTES, MAX_SLACK_BYTES) != 1:
        _State.reason = "torch kept another allocator"
        return False
    _State.lib = lib
    return True


def empty() -> None:
    """Free every kept block (and start the high-water mark over at what is live)."""
    if _State.lib is not None:
        _State.lib.gnnc_block_cache_empty()


def stats() -> Stats | None:
    """The cache's counts, or None when it is not installed."""
    if _State.lib is None:
        return None
    out = (ctypes.c_int64 * 5)()
    _State.lib.gnnc_block_cache_stats(out)
    return Stats(*out)


def kept_bytes() -> int:
    """Bytes in blocks kept for reuse: resident, but not what live data holds (0 without the cache)."""
    now = stats()
    return now.cached if now is not None else 0


def status() -> str:
    """One line for run summaries and benchmarks."""
    return "block cache" if _State.lib is not None else f"torch's allocator ({_State.reason})"
