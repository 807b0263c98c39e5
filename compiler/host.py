"""How much memory this machine can still give a run: the figure gnnc checks its allocations against.

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
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
