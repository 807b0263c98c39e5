"""Per-epoch, per-rank metrics of a run, appended to a JSON-lines file.

Why this module exists: `gnnc run --metrics FILE.jsonl` records, for every
epoch and every rank, the loss, the accuracies, where the time went (compute,
communication, gradient all-reduce), the bytes each op sent per layer and the
peak RSS; `--json` and the benchmarks summarise those records, and the cost
model's predictions are checked against them.

The choice: rank 0 gathers every rank's record each epoch
(`torch.distributed.gather_object`) and writes one line per rank, in rank
order. One writer means lines of different ranks never interleave and the
file is on rank 0's machine even when the ranks are on several. Each line is
written by a single `os.write` on an O_APPEND descriptor and flushed to the
OS before the next epoch starts, so a crashed run leaves complete lines; a
line torn by a crash inside that write (or a full disk) is cut off when the
file is opened again, and `read_metrics` ignores one at the end. A resumed
run runs again the epochs after its checkpoint, so it first drops their
records (the file is rewritten atomically): each epoch appears once.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gnnc.files import atomic_write
from gnnc.runtime import block_cache
from gnnc.runtime.comm import CommStats
from gnnc.runtime.memory import heap_free_bytes, release_free_heap


def _status_bytes(field: str) -> int | None:
    """A memory line of /proc/self/status (VmHWM, VmRSS) in bytes; None where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _HighWater:
    """The kernel keeps one high-water mark per process, and `reset_peak_rss` clears it; what it held
    before the last clear is kept here, so `peak_rss_bytes` stays the process's peak (one per process,
    like the counter it extends)."""

    before_reset = 0


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far.

    On Linux it is VmHWM, the high-water mark of this process's own memory
    since it was exec'd (and the largest it held before any `reset_peak_rss`).
    getrusage's ru_maxrss is not: it keeps the peak of
    the image exec replaced, and a worker spawned by fork + exec starts as a
    copy of its launcher, so ru_maxrss would report the launcher's size
    (measured: 2.4 GiB for a rank whose own peak was 1.5 GiB, when the
    launcher had partitioned the graph).
    """
    hwm = _status_bytes("VmHWM")
    if hwm is not None:
        return max(hwm, _HighWater.before_reset)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def reset_peak_rss() -> int | None:
    """Start a new high-water mark of this process's memory (Linux: /proc/self/clear_refs); returns the
    resident bytes now, the base a later `peak_rss_since` is measured from, or None where it cannot."""
    # the base is what live data holds, not freed pages the heap kept (counted, not trimmed: a trim each epoch
    # made the next epoch fault them in again, gnnc.runtime.memory.heap_free_bytes)
    kept_heap = heap_free_bytes()
    if kept_heap is None:
        release_free_heap()
    hwm = _status_bytes("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # 5: reset the peak resident set size to the current one (proc(5))
    except OSError:
        return None
    _HighWater.before_reset = max(_HighWater.before_reset, hwm or 0)
    now = _status_bytes("VmRSS")
    # nor the blocks the block cache keeps for the step (it reuses them: resident already, yet its own)
    return None if now is None else max(now - block_cache.kept_bytes() - (kept_heap or 0), 0)


def forget_peak_rss() -> None:
    """Start this process's peak over: for a process that runs several jobs one after another (the
    planner's validation grid, benchmarks/cluster), so that each job's `peak_rss_bytes` is its own (the
    block cache's kept blocks, sized for the last job, are given back first)."""
    block_cache.empty()
    release_free_heap()  # and the heap's free pages: the next job's base starts from what is live
    reset_peak_rss()
    _HighWater.before_reset = 0


def peak_rss_since(base: int | None) -> int:
    """How far this process's resident memory rose above `base` (from `reset_peak_rss`) since then:
    what a training step allocated at its peak, its activation memory (0 where it cannot be measured)."""
    hwm = _status_bytes("VmHWM")
    if base is None or hwm is None:
        return 0
    return max(hwm - base, 0)


def reset_peak_memory(device: torch.device) -> int | None:
    """`reset_peak_rss` for a run on `device`: on CUDA the allocator's peak is reset instead, and the base is
    the bytes allocated now (the allocator's own counters: no wait for the GPU)."""
    if device.type != "cuda":
        return reset_peak_rss()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_memory_since(device: torch.device, base: int | None) -> int:
    """`peak_rss_since` for a run on `device`: on CUDA how far the allocator's peak rose above `base`."""
    if device.type != "cuda":
        return peak_rss_since(base)
    return max(torch.cuda.max_memory_allocated(device) - (base or 0), 0)


@dataclass
class EpochRecord:
    """What one rank measured in one epoch; times in seconds, sizes in bytes."""

    epoch: int
    rank: int
    world_size: int
    loss: float | None = None
    train_acc: float | None = None
    val_acc: float | None = None
    test_acc: float | None = None
    epoch_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0  # blocked in communication ops other than the gradient all-reduce
    allreduce_s: float = 0.0
    pipe_s: float = 0.0  # of comm_s: blocked in pipeline send/recv, waiting on the neighbouring stages
    bubble_fraction: float = 0.0  # pipe_s / epoch_s: the pipeline's bubble as this stage saw it
    bytes_sent: int = 0
    bytes_by_op: dict[str, int] = field(default_factory=dict)  # "label/op/direction" -> bytes
    seconds_by_op: dict[str, float] = field(default_factory=dict)  # "label/op/direction" -> seconds blocked
    peak_rss_bytes: int = 0
    activation_peak_bytes: int = 0  # how far the training step raised resident memory (peak_rss_since)
    # the resident set at the step's start, what activation_peak_bytes is measured above: what the first
    # step builds and keeps (kernels' cached structure) shows as the next step's larger base
    step_base_bytes: int = 0
    # the process's CPU seconds in the step (every thread): well under epoch_s, the rank waited for a core
    # or a peer (a loaded machine shows it in every rank, a slower peer in the others)
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_stats(cls, epoch: int, rank: int, world_size: int, stats: CommStats, *,
                   epoch_s: float, loss: float | None = None, train_acc: float | None = None,
                   val_acc: float | None = None, test_acc: float | None = None,
                   extra: dict[str, Any] | None = None, activation_peak_bytes: int = 0,
                   step_base_bytes: int = 0, cpu_s: float = 0.0) -> "EpochRecord":
        """A record from this epoch's CommStats; compute time is what communication did not take.

        A pipeline stage waits on its neighbours inside its send/recv ops (gnnc.runtime.comm's `pipe`):
        that time, over the epoch's, is the stage's measured bubble (GPipe predicts (S-1)/(K+S-1) of
        the epoch idle, K chunks through S stages; the plan's `pipeline.bubble`), transfer included.
        """
        allreduce_s = stats.total_seconds("allreduce")
        comm_s = stats.total_seconds() - allreduce_s
        pipe_s = stats.total_seconds("pipe")
        return cls(epoch=epoch, rank=rank, world_size=world_size, loss=loss, train_acc=train_acc,
                   val_acc=val_acc, test_acc=test_acc, epoch_s=epoch_s,
                   compute_s=max(0.0, epoch_s - comm_s - allreduce_s), comm_s=comm_s,
                   allreduce_s=allreduce_s, pipe_s=pipe_s, bubble_fraction=pipe_s / epoch_s if epoch_s > 0 else 0.0,
                   bytes_sent=stats.total_bytes(),
                   bytes_by_op={k: int(v["bytes"]) for k, v in stats.as_dict().items()},
                   seconds_by_op={k: float(v["seconds"]) for k, v in stats.as_dict().items()},
                   peak_rss_bytes=peak_rss_bytes(), activation_peak_bytes=int(activation_peak_bytes),
                   step_base_bytes=int(step_base_bytes), cpu_s=cpu_s, extra=dict(extra or {}))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MinibatchRecord:
    """What one rank measured in one minibatch of a sampled run (gnnc.runtime.minibatch); a metrics file
    holds them beside the EpochRecords, marked `"kind": "minibatch"`.

    Per graph layer (first layer first): the block's sampled source vertices, destination vertices and
    edges of this rank's seeds. `loss`: this rank's share of the step's loss (the shares add up to it;
    a device tensor until the epoch's records are taken, then read with one another).
    `phase_s`: seconds per phase (sample, gather, forward_m, forward_d, backward_d, backward_m,
    allreduce, step). `bytes_by_op`: what the communication ops sent between this minibatch's
    sampling and its optimizer step, by "label/op/direction" as in EpochRecord (under the pipelined
    schedule that window also holds its neighbours' exchanges).
    """

    epoch: int
    batch: int
    rank: int
    world_size: int
    seeds: int
    sampled_vertices: list[int]
    sampled_dst: list[int]
    sampled_edges: list[int]
    loss: float | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    bytes_by_op: dict[str, int] = field(default_factory=dict)
    kind: str = "minibatch"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def epoch_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-epoch records of a metrics file (without the per-minibatch ones of a sampled run)."""
    return [r for r in records if r.get("kind") != "minibatch"]


def _drop_epochs_from(path: Path, first: int) -> None:
    """Rewrite `path` (atomically) without the records of epoch `first` and later."""
    kept = []
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            epoch = json.loads(line).get("epoch")
        except (ValueError, AttributeError):
            epoch = None  # not a record of ours: left as it is
        if not (isinstance(epoch, int) and epoch >= first):
            kept.append(line)
    atomic_write(path, b"".join(kept))


def _cut_torn_tail(path: Path) -> None:
    """Truncate `path` after its last newline: a crash inside a write may have torn the last line."""
    with open(path, "rb+") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size == 0:
            return
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            fh.seek(pos - step)
            chunk = fh.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                end = pos - step + nl + 1
                if end != size:
                    fh.truncate(end)
                return
            pos -= step
        fh.truncate(0)


class MetricsLog:
    """Gathers every rank's EpochRecord on rank 0 and appends them to `path`.

    `log` is a collective when torch.distributed is initialised: every rank
    calls it once per epoch, with the same `path`-or-None choice. Without a
    path nothing is gathered or written. `drop_from_epoch` (a resumed run's
    first epoch) removes the records of that epoch and later ones first.
    """

    def __init__(self, path: str | Path | None, *, group: dist.ProcessGroup | None = None,
                 drop_from_epoch: int | None = None):
        self.path = Path(path) if path is not None else None
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self._fd: int | None = None
        if self.path is not None and self.rank == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                _cut_torn_tail(self.path)
                if drop_from_epoch is not None:
                    _drop_epochs_from(self.path, drop_from_epoch)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, record: EpochRecord) -> list[dict[str, Any]] | None:
        """Append every rank's record for this epoch; rank 0 gets them back, the others None."""
        got = self.log_many([record])
        return None if got is None else [rec for recs in got for rec in recs]

    def log_many(self, records: list[Any]) -> list[list[dict[str, Any]]] | None:
        """Append every rank's records (EpochRecord or MinibatchRecord, one gather for all), rank by rank."""
        if self.path is None:
            return None
        mine = [r.to_json() for r in records]
        if self.distributed and self.world_size > 1:
            gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dst = 0 if self.group is None else dist.get_global_rank(self.group, 0)
            dist.gather_object(mine, gathered, dst=dst, group=self.group)
        else:
            gathered = [mine]
        if self.rank != 0 or gathered is None:
            return None
        if self._fd is None:
            raise ValueError(f"metrics file {self.path} is closed")
        for recs in gathered:
            for rec in recs:
                line = (json.dumps(rec, sort_keys=True, allow_nan=True) + "\n").encode()
                # One write per line: a crash leaves whole lines before it.
                os.write(self._fd, line)
        return gathered

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (a crash inside its write) is ignored."""
    lines = Path(path).read_bytes().split(b"\n")
    # What follows the last newline is empty, or a line torn by a crash.
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The `gnnc run --json` numbers from a run's records.

    epoch_time_s: median over epochs after the first of the slowest rank's
    epoch time; bytes_sent_per_epoch: bytes of all ranks, median over epochs;
    losses and accuracies: rank 0's last epoch; peak_rss_bytes: max over ranks;
    activation_peak_bytes: max over ranks and the epochs after the first.
    """
    records = epoch_records(records)
    if not records:
        return {}
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        by_epoch.setdefault(rec["epoch"], []).append(rec)
    epochs = sorted(by_epoch)
    timed = epochs[1:] or epochs
    last = min(by_epoch[epochs[-1]], key=lambda r: r["rank"])
    return {
        "epoch_time_s": statistics.median(max(r["epoch_s"] for r in by_epoch[e]) for e in timed),
        "bytes_sent_per_epoch": int(statistics.median_low(sum(r["bytes_sent"] for r in by_epoch[e])
                                                          for e in epochs)),
        "train_loss": last.get("loss"),
        "val_acc": last.get("val_acc"),
        "test_acc": last.get("test_acc"),
        "world_size": last.get("world_size"),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in records),
        "activation_peak_bytes": max((r.get("activation_peak_bytes", 0) for e in timed for r in by_epoch[e]),
                                     default=0),
        "epochs": len(epochs),
    }
