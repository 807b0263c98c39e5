"""How much memory this machine can still give a run (the figure gnnc checks its allocations against), and
how torch takes it.

Why this module exists: a run that needs more memory than the machine has is
not refused by anyone; the kernel's out-of-memory killer ends it minutes
later with no word (`--set hidden=2000000` on Cora ran 112 s before it was
killed). gnnc compares what it is about to allocate (a graph whose vertex
ids imply 10^12 vertices, a run's predicted peak) with `available_memory()`
first and says what does not fit.

The figure is the smaller of the kernel's estimate of what can be allocated
without swapping (`MemAvailable` in /proc/meminfo) and what is left under
this process's cgroup limit (v2 `memory.max`, v1 `memory.limit_in_bytes`),
where a container or a Slurm job sets one. The cgroup's usage counts page
cache the kernel would drop under pressure; its inactive file pages are
subtracted, as `docker stats` does. On a system without these files the
figure is unknown (None) and nothing is refused on its account.
`resident_bytes()` is what this process holds already (a run in this process
needs only what its prediction adds to that).

Huge pages. glibc hands out blocks of 1 MiB and more fresh from the kernel
(gnnc.runtime.memory), page-faulted in 4 KiB at a time. torch's own switch,
THP_MEM_ALLOC_ENABLE=1, advises the kernel to back each tensor of 2 MiB or
more with transparent huge pages (madvise MADV_HUGEPAGE): one fault per 2 MiB
instead of one per 4 KiB, and the block still goes back to the system when
freed. torch reads it once, at its first allocation, so `use_huge_pages` runs
first thing in gnnc's command line (gnnc.cli) and in the benchmarks, and the
processes they start inherit it; a value the user set (0 turns it off) is
kept, and where the kernel's transparent huge pages are `never` the advice
does nothing. Measured on this machine (2 cores, torch 2.13, `gnnc run`): a
GCN on R-MAT with 200K vertices, hidden 128, training step 0.387 -> 0.238 s
and evaluation 0.161 -> 0.105 s, the process's page faults 1.60M -> 0.19M over
the run, its peak resident memory the same (1089.7 MB); a depcomm rank of a
2-worker GCN on a 16K-vertex SBM (hidden 256, local gloo) 100 -> 69 ms a step;
Cora, whose tensors are all under 2 MiB, unchanged.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

# glibc maps blocks of this size and more afresh and unmaps them when freed (the threshold gnnc.runtime.memory
# fixes, and the smallest block gnnc.runtime.block_cache keeps)
MMAP_THRESHOLD_BYTES = 1 << 20
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"  # torch's switch (c10's CPU allocator): 1 advises huge pages from 2 MiB up
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2^63


@dataclass(frozen=True)
class AvailableMemory:
    """Bytes a run may still allocate, and where the figure comes from (for messages)."""

    bytes: int
    source: str

    def __str__(self) -> str:
        return f"{format_bytes(self.bytes)} available ({self.source})"


def format_bytes(n: float) -> str:
    """`n` bytes for a message: 1.5 GiB, 23.4 TiB, 512 B."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def available_memory(proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> AvailableMemory | None:
    """What this process may still allocate (see the module docstring); None when the system does not say."""
    found = [m for m in (_meminfo(Path(proc) / "meminfo"), _cgroup(Path(proc) / "self" / "cgroup", Path(cgroup_root)))
             if m is not None]
    return min(found, key=lambda m: m.bytes) if found else None


def _meminfo(path: Path) -> AvailableMemory | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return AvailableMemory(int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo")
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup(self_cgroup: Path, root: Path) -> AvailableMemory | None:
    """Room left under this process's cgroup memory limit, v2 or v1; None without a limit."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            room = _room(root, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            room = _room(root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file")
        else:
            continue
        if room is not None:
            return room
    return None


def _room(mount: Path, path: str, limit_file: str, usage_file: str, inactive_key: str) -> AvailableMemory | None:
    # Inside a container the cgroup's own directory is usually the mount point itself.
    for folder in (mount / path.lstrip("/"), mount):
        try:
            limit_text = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= UNLIMITED:
            return None
        inactive = 0
        try:
            for line in (folder / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
        except (OSError, ValueError):
            pass
        return AvailableMemory(max(int(limit_text) - (usage - inactive), 0), f"cgroup {folder / limit_file}")
    return None


def resident_bytes() -> int | None:
    """This process's resident memory now (VmRSS); None where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def use_huge_pages(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn torch's huge-page advice on in this process and the ones it starts, unless the user set it; True
    when it is on. Before torch's first allocation, or it holds for the children only (module docstring). It
    lives here, not in gnnc.runtime, so that `gnnc check` and `--help` load no runtime."""
    env = os.environ if environ is None else environ
    env.setdefault(HUGE_PAGES, "1")
    return env[HUGE_PAGES] == "1"


# --- CPUs and OpenMP ------------------------------------------------------------------------------------------
# Why this part exists: torch (and gnnc's compiled kernels, runtime/kernels/native.c) use OpenMP, which by default
# starts a thread per CPU the machine has and lets a thread that reaches a barrier spin for its peers. A
# container's CPU quota or a taskset mask gives the process fewer CPUs than that, and on a shared machine the
# peers a thread spins for may not be running at all: measured on this 2-core machine under load (load average
# about 3.5), the Cora GCN demo took 246.7 ms an epoch with 2 spinning threads, 11.9 ms with one thread and
# 10.4 ms with passive waiting (2-4 ms quiet). So the thread count is what the process may really use, decided
# once (`choose_threads`). And a thread that waits for its peers spins only briefly before it sleeps
# (`set_wait_policy`): libgomp, which torch's CPU wheel links (torch/lib/libgomp.so.1) and which the compiled
# kernels share, spins 300,000 rounds by default (OMP_WAIT_POLICY unset; 3 ms by libgomp's own estimate) at every
# barrier and at the end of every parallel region, so under contention the spinners take the time slices the
# peers they wait for need. Measured with benchmarks/contention.py on this 2-core machine, shared (load 17-24;
# benchmarks/RESULTS-contention.md): the Cora demo beside a 2-thread torch matmul loop 105 ms an epoch with 1000
# rounds against 961 with OpenMP's 300,000, a 50K-vertex R-MAT GCN 1.39 s against 2.79; quiet (at real-time
# priority) both within the noise (Cora 8.1, 11.8, 8.1 ms in three runs against 7.0, 10.1, 10.0).

# OpenMP's standard switch, libgomp's spin rounds, Intel's and LLVM's time a thread spins (ms)
WAIT_POLICY, SPIN_COUNT, BLOCK_TIME = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"
# gnnc's default, for the OpenMP runtime torch links: 1000 libgomp rounds (10 us by its estimate: an epoch's next
# parallel region, a Python call away, still finds the threads awake), or Intel's/LLVM's shortest time but 0
# (not measured: this machine's torch links libgomp)
SHORT_SPIN = {SPIN_COUNT: "1000", BLOCK_TIME: "1"}
_OPENMP_LIBRARIES = {"libgomp": SPIN_COUNT, "libiomp5": BLOCK_TIME, "libomp": BLOCK_TIME}


@dataclass
class _WaitPolicy:
    """What `set_wait_policy` found when it ran in this process (its report needs it)."""

    late: bool = False  # OpenMP was already loaded: this process keeps what it read, its children take the setting


_WAIT = _WaitPolicy()


def set_wait_policy(environ: MutableMapping[str, str] | None = None, maps: str | Path = "/proc/self/maps") -> None:
    """Have OpenMP's waiting threads spin briefly, then sleep (`SHORT_SPIN`, for the runtime torch links), unless
    the user set a wait setting of any runtime (OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME): kept as given.
    OpenMP reads its settings once, when it is loaded (with torch), so gnnc's package runs this first thing, and
    the processes a run starts (spawned workers) inherit it; where torch was imported before gnnc, this process
    keeps OpenMP's default and `wait_policy` says so."""
    env = os.environ if environ is None else environ
    if any(name in env for name in (WAIT_POLICY, SPIN_COUNT, BLOCK_TIME)):
        return
    name = _torch_openmp()
    env[name] = SHORT_SPIN[name]
    _WAIT.late = _openmp_loaded(Path(maps))


def _torch_openmp() -> str:
    """The wait setting of the OpenMP runtime torch's wheel carries (torch/lib), found without importing torch;
    libgomp's where it carries none (a build linked against the system's GCC runtime)."""
    try:
        spec = importlib.util.find_spec("torch")
        folders = [Path(f) / "lib" for f in (spec.submodule_search_locations or [])] if spec else []
        names = [n for folder in folders if folder.is_dir() for n in os.listdir(folder)]
    except (ImportError, ValueError, OSError):
        names = []
    for library, setting in _OPENMP_LIBRARIES.items():
        if any(n.startswith(library + ".") for n in names):
            return setting
    return SPIN_COUNT


def _openmp_loaded(maps: Path) -> bool:
    """Whether an OpenMP runtime is mapped into this process already (it has read its settings)."""
    try:
        text = maps.read_text(errors="replace")
    except OSError:
        return False
    return any(f"/{library}." in text for library in _OPENMP_LIBRARIES)


# Below this many elements in an epoch's widest vertex tensor (vertices x the widest of the graph layers' outputs
# and the input features' nonzeros per vertex: gnnc.api.epoch_elements) a run takes one thread. torch and the
# compiled kernels split an operation between threads only above 32,768 elements (torch's grain size, native.c's
# PARALLEL_MIN), so on such a graph each parallel region gives a second thread some tens of microseconds of work,
# about what waking it costs (a thread that spins 1000 rounds is asleep by the next region). Measured on this
# 2-core machine, shared (load 8-23), with the timed epochs at real-time priority (the nearest it came to quiet):
# the Cora GCN demo (49,216) in three alternating runs each, 2 threads 12.8, 10.7, 11.7 ms an epoch (16.8 ms of CPU,
# 34 sleeps and wake-ups an epoch), 1 thread 11.4, 13.0, 11.3 (12.7 ms of CPU, none), OpenMP's 300,000-round spin on
# 2 threads 9.6, 11.4, 12.7 (26.1 ms of CPU); at normal priority (load 13-16) 2 threads 85 and 102 ms, 1 thread 48
# and 127. On the quiet machine the lead measured 1 thread 7.3, 6.0, 7.9 ms and OpenMP's spin 7.0, 6.6, 6.5 (gnnc
# run --json, 200 epochs). Above the line 2 threads gained or tied (one run each, real-time): Cora GAT (173,312)
# 27.9 against 31.5 ms, a 40K-vertex R-MAT GCN (hidden 16, 5.1M) 42.1 against 63.3, a 10K-vertex one (128 dense
# features: 1.28M) 18.3 against 18.6 at hidden 16 and 34.2 against 58.5 at 128. So one thread keeps a small
# epoch's quiet time (within the noise above) for a quarter less CPU than 2 threads and half of OpenMP's spin's,
# and never waits at a barrier under contention; the line is drawn low, below Cora's GAT.
SMALL_EPOCH_ELEMENTS = 1 << 17


@dataclass(frozen=True)
class ThreadChoice:
    """The threads each process of a run uses, and why (`gnnc run --json`'s `threads` and `threads_reason`)."""

    threads: int
    reason: str


def choose_threads(asked: int | None = None, ranks: int = 1, proc: str | Path = "/proc",
                   cgroup_root: str | Path = "/sys/fs/cgroup", affinity: set[int] | None = None,
                   elements: int | None = None) -> ThreadChoice:
    """`asked` (--threads) threads per process, or each of `ranks` processes on this machine its share of the
    CPUs this process may use (`usable_cpus`), rounded down and at least 1: ranks that oversubscribe the cores
    wait for one another at every barrier. One thread where the epoch is too small to share (`elements`, a
    process's widest vertex tensor: `SMALL_EPOCH_ELEMENTS`)."""
    if asked is not None:
        return ThreadChoice(asked, f"--threads {asked}")
    cpus, source = usable_cpus(proc, cgroup_root, affinity)
    if ranks > 1:
        cpus, source = max(1, cpus // ranks), f"{source}, shared by {ranks} ranks on this machine"
    if cpus > 1 and elements is not None and elements < SMALL_EPOCH_ELEMENTS:
        return ThreadChoice(1, f"1 thread of {cpus}: the epoch's widest vertex tensor has {elements:,} elements, "
                               f"under {SMALL_EPOCH_ELEMENTS:,} a second thread gains nothing ({source})")
    return ThreadChoice(cpus, source)


def usable_cpus(proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup",
                affinity: set[int] | None = None) -> tuple[int, str]:
    """How many CPUs this process may keep busy, and what says so: the CPUs its affinity mask allows
    (taskset, a Slurm or Kubernetes cpuset), or fewer under its cgroup's CPU quota, rounded down (a thread
    beyond the quota is throttled, with its peers spinning at the next barrier), at least 1."""
    mask = affinity if affinity is not None else os.sched_getaffinity(0)
    count, source = max(1, len(mask)), f"{len(mask)} CPU{'' if len(mask) == 1 else 's'} in this process's affinity mask"
    quota = cpu_quota(Path(proc) / "self" / "cgroup", Path(cgroup_root))
    if quota is not None and int(quota[0]) < count:
        count, source = max(1, int(quota[0])), f"cgroup CPU quota of {quota[0]:g} CPUs ({quota[1]})"
    return count, source


def cpu_quota(self_cgroup: Path, root: Path) -> tuple[float, str] | None:
    """The CPUs this process's cgroup (or one above it) may use per period, v2 `cpu.max` or v1
    `cpu.cfs_quota_us / cpu.cfs_period_us`, and the file that says so; None without a quota."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[float, str]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found += _quotas(root, path, "cpu.max", _v2_quota)
        elif "cpu" in controllers.split(","):
            found += (_quotas(root / controllers, path, "cpu.cfs_quota_us", _v1_quota)
                      or _quotas(root / "cpu", path, "cpu.cfs_quota_us", _v1_quota))
    return min(found) if found else None


def _quotas(mount: Path, path: str, name: str, read: Callable[[Path], float | None]) -> list[tuple[float, str]]:
    """Every quota from the process's own cgroup folder up to the mount: the tightest one holds. Inside a
    container the cgroup's own directory is usually the mount point itself."""
    folder, out = mount / path.lstrip("/"), []
    for candidate in (folder, *[p for p in folder.parents if p.is_relative_to(mount)]):
        quota = read(candidate)
        if quota is not None:
            out.append((quota, str(candidate / name)))
    return out


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or 100000)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1: no quota


def wait_policy(environ: MutableMapping[str, str] | None = None) -> str:
    """The OpenMP wait policy the processes of a run start with, as `gnnc run --json` states it."""
    env = os.environ if environ is None else environ
    given = [f"{name}={env[name]}" for name in (WAIT_POLICY, SPIN_COUNT, BLOCK_TIME) if name in env]
    if not given:
        return "OpenMP's default (spin, then sleep)"
    ours = len(given) == 1 and any(given[0] == f"{n}={v}" for n, v in SHORT_SPIN.items())
    policy = ", ".join(given) + (" (gnnc's default: spin briefly, then sleep)" if ours else " (set by the user)")
    if ours and _WAIT.late and environ is None:
        policy += "; this process loaded OpenMP before gnnc set it and keeps OpenMP's default"
    return policy
