"""Checkpoints of a training run, written so that a crash never costs the last good one.

Why this module exists: `gnnc run --checkpoint DIR` saves the model, the
optimizer, the epoch and every RNG state each K epochs, and `--resume`
continues from the newest checkpoint that every rank finished writing. A
checkpoint that cannot be trusted (truncated, altered, not ours) raises
`CheckpointError` with the file and the reason, never a pickle traceback.

Layout (each rank writes only its own files, so a directory shared by all
ranks and one directory per machine both work):

  DIR/epoch-000009/rank-0.ckpt     rank 0's state after epoch 9
  DIR/latest-rank-0.json           {"epoch": 9, "world_size": 2}: rank 0's newest complete save

A save is: write the rank's file atomically (a temporary file in the same
directory, fsync, os.replace, fsync of the directory); a barrier, so that
every rank's file exists; then each rank moves its own `latest` marker. A
crash before the barrier leaves every marker on the previous save; a crash
after it may leave the markers one save apart, so `resume` takes the oldest
epoch named by any rank (an all-reduce MIN), and the `keep` >= 2 newest saves
stay on disk. A save some rank cannot read (corrupt, deleted) is passed over for
the newest one every rank reads, and the run says so. A write that fails for
lack of space is OutOfSpace (exit 1: the machine's state, not bad input), the
saves before it whole; a --checkpoint that is no writable directory is refused
before the first epoch (exit 2). File format: MAGIC, the SHA-256 of the payload, the payload
(torch.save of plain containers and tensors, loaded with weights_only=True).

A checkpoint also holds the run's fingerprint (graph, program, training
settings); `--resume` refuses one taken by a different run and names the
fields that differ, except a changed epoch count, which it applies and says
so. A checkpoint without a fingerprint (an older gnnc's) is refused too:
nothing shows it is this run's. A payload holding anything but tensors and
plain containers is refused without being run (`weights_only=True`). Each rank holds an exclusive lock on `DIR/lock-rank-R` for the run
(flock: released by the kernel however the process ends), so a second job
pointed at the same directory stops before it writes, naming the holder;
the run removes its lock files as it ends, refused or done.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import io
import json
import os
import pickle
import random
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.files import atomic_write
from gnnc.errors import GnncError, write_failure
from gnnc.runtime.comm import collective_device

MAGIC = b"GNNC-CHECKPOINT-1\n"
_DIGEST = 32  # SHA-256
_EPOCH_DIR = re.compile(r"^epoch-(\d{6,})$")


class CheckpointError(GnncError):
    """A checkpoint is missing, corrupt, or belongs to a different run shape."""


class CheckpointUnreadable(CheckpointError):
    """A checkpoint file is missing or damaged (its bytes are not what a save wrote): resume passes over it. A
    file that reads whole but holds something else (code, another rank's state) is refused instead: it was put
    there."""


# --- which run a checkpoint belongs to ---------------------------------------------------------


def content_digest(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of the bytes, dtypes and shapes of `tensors` (sparse ones by indices and values).

    BLAKE2b reads about 1 GB/s: a rank's features cost a fraction of one epoch.
    """
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        parts = (t.coalesce().indices(), t.coalesce().values()) if t.is_sparse else (t,)
        for part in parts:
            flat = part.detach().cpu().contiguous().reshape(-1)
            h.update(f"{part.dtype}{tuple(part.shape)};".encode())
            h.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    return h.hexdigest()


# Fields a resumed run may change on purpose: applied, and said so.
_APPLIED = ("epochs",)


def check_same_run(saved: Mapping[str, Any] | None, current: Mapping[str, Any], next_epoch: int,
                   where: Path) -> list[str]:
    """Refuse to resume a different run; return a line for each deliberate change it applies.

    `saved` and `current` are fingerprints: flat dicts of what defines the
    run (graph identity, program digest, training settings). A field that
    differs is refused with its old and new value, except `epochs`, which
    may change as long as it does not end before the epochs already done.
    """
    if saved is None:
        # Resuming it anyway could mix another run's weights and history into this one, silently.
        raise CheckpointError(f"cannot resume from {where}: it holds no run fingerprint (written by an older "
                              "gnnc), so nothing shows it belongs to this run; give a new --checkpoint directory "
                              "to start afresh")
    differ = [k for k in sorted(set(saved) | set(current))
              if k not in _APPLIED and saved.get(k) != current.get(k)]
    if differ:
        shown = "; ".join(f"{k}: {_show(saved.get(k))} in the checkpoint, {_show(current.get(k))} now"
                          for k in differ)
        raise CheckpointError(f"cannot resume from {where}: it was written by a different run ({shown}); "
                              "use the same settings, or a new --checkpoint directory to start afresh")
    notes = []
    old, new = saved.get("epochs"), current.get("epochs")
    if old != new:
        if new is not None and new < next_epoch:
            raise CheckpointError(f"cannot resume from {where}: it has {next_epoch} epochs done, more than "
                                  f"--epochs {new}; ask for at least {next_epoch}")
        notes.append(f"resuming after epoch {next_epoch - 1}: --epochs changed from {old} to {new}, "
                     f"applied: {new - next_epoch} more epochs to run")
    return notes


def _show(value: Any) -> str:
    """A fingerprint value in a message: digests shortened, the rest as written."""
    if isinstance(value, str) and len(value) >= 32 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "..."
    return "absent" if value is None else repr(value)


# --- one job per directory ---------------------------------------------------------------------


class DirectoryLock:
    """An exclusive flock on `directory/lock-rank-R`, holding who took it: pid, host, start time."""

    def __init__(self, directory: str | Path, rank: int = 0):
        self.path = Path(directory) / f"lock-rank-{rank}"
        while True:
            fd = _open_lock(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise CheckpointError(f"checkpoint directory {self.path.parent} is in use by another run "
                                      f"({holder}); wait for it to finish or give another --checkpoint") from None
            except OSError as exc:
                os.close(fd)
                raise CheckpointError(f"cannot lock checkpoint directory {self.path.parent}: {exc.strerror}") from None
            # `release` removes the file while holding it: a lock taken on a file its holder removed meanwhile
            # guards nothing, so it is taken again on the file now at the path.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        # Rewritten in place under the lock (the file itself is never replaced: the lock lives on its inode).
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            # Removed while still held (see __init__), so a run, refused or done, leaves no lock file behind;
            # a killed run's file stays, unlocked, and the next run takes it over.
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, the checkpoint directory made first: taken before the first epoch, so a
    --checkpoint that is a file, a dangling link or a directory this user cannot write fails here, named, not
    as a traceback at the first save."""
    directory = path.parent
    if directory.is_symlink() and not directory.exists():
        raise CheckpointError(f"--checkpoint {directory}: a link to {os.readlink(directory)}, which does not "
                              "exist; give a directory")
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"--checkpoint {directory}: not a directory; give a directory (made if missing)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CheckpointError(f"--checkpoint {directory}: cannot write checkpoints there: "
                              f"{exc.strerror or exc}") from None


def _read_holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"null")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "its holder has not written its name yet"


# --- RNG state ---------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from: torch (CPU and CUDA), Python's, NumPy's global one."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # NumPy's tuple holds an ndarray, which weights_only loading refuses: store its parts.
        "numpy": {"kind": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """random.setstate needs tuples; serialisation may have turned them into lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


# --- one file ----------------------------------------------------------------------------------


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write one checkpoint file: MAGIC, SHA-256 of the payload, payload."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    atomic_write(Path(path), MAGIC + hashlib.sha256(payload).digest() + payload)


def load_state(path: Path) -> dict[str, Any]:
    """Read a file written by `save_state`; CheckpointError says what is wrong with a bad one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointUnreadable(f"checkpoint {path} does not exist") from None
    except OSError as exc:
        raise CheckpointUnreadable(f"cannot read checkpoint {path}: {exc.strerror}") from None
    if not data.startswith(MAGIC):
        raise CheckpointUnreadable(f"{path} is not a gnnc checkpoint (it does not start with {MAGIC!r})")
    head = len(MAGIC) + _DIGEST
    if len(data) < head:
        raise CheckpointUnreadable(f"checkpoint {path} is truncated ({len(data)} bytes)")
    digest, payload = data[len(MAGIC):head], data[head:]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointUnreadable(f"checkpoint {path} is corrupt: its checksum does not match its contents "
                              "(truncated or altered)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # A global other than tensors and plain containers: gnnc never writes one, so it was put there.
        # torch's message suggests loading it with the safety off, which would run it: not repeated.
        refused = str(exc).split("Trying to load unsupported GLOBAL ", 1)[-1].split(" whose ")[0].splitlines()[0][:120]
        raise CheckpointError(f"checkpoint {path} holds something other than tensors and plain values "
                              f"({refused}): refused, a checkpoint is data; it was not written by gnnc") from None
    except (RuntimeError, EOFError, ValueError, TypeError, AttributeError, ImportError, KeyError, IndexError) as exc:
        # Checksum fine but unreadable: written by an incompatible version.
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    wanted = {"epoch": int, "rank": int, "world_size": int, "model": dict, "rng": dict, "extra": dict}
    if not isinstance(state, dict) or any(not isinstance(state.get(k), t) for k, t in wanted.items()):
        raise CheckpointError(f"checkpoint {path} holds no training state (it needs "
                              f"{', '.join(wanted)}; it was not written by this version of gnnc)")
    return state


# --- a run's checkpoints -----------------------------------------------------------------------


class Checkpointer:
    """Saves every `every` epochs into `directory` and resumes from the newest complete save.

    Rank and world size come from torch.distributed when it is initialised
    (one process otherwise); saving and resuming are then collectives, called
    by every rank.
    """

    def __init__(self, directory: str | Path, *, every: int = 1, keep: int = 2,
                 group: dist.ProcessGroup | None = None, fingerprint: Mapping[str, Any] | None = None):
        if every < 1:
            raise CheckpointError(f"checkpoints every {every} epochs: the interval must be at least 1")
        if keep < 2:
            # Markers of different ranks may be one save apart after a crash; the
            # older save must still exist.
            raise CheckpointError(f"keep must be at least 2, not {keep}")
        self.directory = Path(directory)
        self.every = every
        self.keep = keep
        self.group = group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        # What defines this run; saved with every checkpoint and checked on resume when given.
        self.fingerprint = dict(fingerprint) if fingerprint is not None else None
        self.resume_notes: list[str] = []  # changes the last `resume` applied on purpose

    def lock(self) -> DirectoryLock:
        """Take this rank's lock on the directory for the run; CheckpointError names another holder."""
        return DirectoryLock(self.directory, self.rank)

    def due(self, epoch: int) -> bool:
        """Whether the save after `epoch` (counted from 0) is one of the every-K ones."""
        return (epoch + 1) % self.every == 0

    def _file(self, epoch: int) -> Path:
        return self.directory / f"epoch-{epoch:06d}" / f"rank-{self.rank}.ckpt"

    def _marker(self) -> Path:
        return self.directory / f"latest-rank-{self.rank}.json"

    def _barrier(self) -> None:
        if self.distributed and self.world_size > 1:
            dist.barrier(group=self.group)

    def save(self, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             extra: dict[str, Any] | None = None) -> Path:
        """Write this rank's state after `epoch`; returns the file. Every rank must call it."""
        path = self._file(epoch)
        try:  # a full disk fails the write of the new file only: the saves before it stay whole
            path.parent.mkdir(parents=True, exist_ok=True)
            for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a crash mid-write
                stale.unlink(missing_ok=True)
            save_state(path, {
                "epoch": epoch, "rank": self.rank, "world_size": self.world_size,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "rng": capture_rng_state(), "extra": extra or {},
                **({"fingerprint": self.fingerprint} if self.fingerprint is not None else {}),
            })
        except OSError as err:
            raise write_failure(err, f"the checkpoint of epoch {epoch} ({path})") from None
        self._barrier()  # every rank's file of this epoch now exists
        try:
            atomic_write(self._marker(), json.dumps({"epoch": epoch, "world_size": self.world_size}).encode())
        except OSError as err:
            raise write_failure(err, f"the checkpoint marker {self._marker()}") from None
        self._prune()
        return path

    def maybe_save(self, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                   extra: dict[str, Any] | None = None) -> Path | None:
        return self.save(epoch, model, optimizer, extra) if self.due(epoch) else None

    def _prune(self) -> None:
        """Delete this rank's files older than the `keep` newest saves."""
        epochs = sorted(self._saved_epochs())
        for epoch in epochs[:-self.keep]:
            path = self._file(epoch)
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # other ranks' files may still be there
                path.parent.rmdir()

    def _saved_epochs(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        out = []
        for entry in self.directory.iterdir():
            m = _EPOCH_DIR.match(entry.name)
            if m and (entry / f"rank-{self.rank}.ckpt").exists():
                out.append(int(m.group(1)))
        return out

    def latest_epoch(self) -> int | None:
        """The newest epoch every rank saved, or None (a collective when distributed)."""
        marker = self._marker()
        mine = -1
        if marker.exists():
            try:
                info = json.loads(marker.read_text())
                mine = int(info["epoch"])
                saved_world = int(info["world_size"])
            except (ValueError, KeyError, TypeError):
                raise CheckpointError(f"checkpoint marker {marker} is corrupt; delete it to resume "
                                      "from the newest epoch-* directory by hand") from None
            if saved_world != self.world_size:
                raise CheckpointError(f"the checkpoints in {self.directory} were written by {saved_world} "
                                      f"ranks; this run has {self.world_size}")
        if self.distributed and self.world_size > 1:
            t = torch.tensor([mine], dtype=torch.int64, device=collective_device(self.group))
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
            mine = int(t.item())
        return None if mine < 0 else mine

    def resume(self, model: torch.nn.Module,
               optimizer: torch.optim.Optimizer | None) -> tuple[int, dict[str, Any]]:
        """Restore the newest save every rank can read; returns (the next epoch to run, the saved `extra`).

        A save that is corrupt or missing on any rank is passed over for the one before it (the `keep` >= 2
        newest stay on disk for this), and `resume_notes` says which and why; a save that reads but belongs to
        another run or model, or that holds anything but data, is refused, not passed over.
        """
        newest = self.latest_epoch()
        if newest is None:
            raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
        epoch, state, problems = self._newest_readable(newest)
        path = self._file(epoch)
        if epoch < newest:
            self.resume_notes.append(f"resuming from the checkpoint of epoch {epoch}, the newest every rank can "
                                     f"read: {'; '.join(problems)}")
        if self.fingerprint is not None:  # before the weights: a different model must be named, not misfit
            self.resume_notes += check_same_run(state.get("fingerprint"), self.fingerprint, epoch + 1, path)
        _check_extra(state["extra"], epoch, path)
        if optimizer is not None:
            if state.get("optimizer") is None:
                raise CheckpointError(f"checkpoint {path} holds no optimizer state")
            _check_optimizer_state(state["optimizer"], optimizer, path)
        try:
            model.load_state_dict(state["model"])
            if optimizer is not None:
                optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {exc}") from None
        try:
            _check_numpy_state(state["rng"]["numpy"])
            restore_rng_state(state["rng"])
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError, OverflowError) as exc:
            raise CheckpointError(f"checkpoint {path} holds no usable RNG state "
                                  f"({type(exc).__name__}: {exc})") from None
        return epoch + 1, state["extra"]

    def _newest_readable(self, newest: int) -> tuple[int, dict[str, Any], list[str]]:
        """The newest epoch up to `newest` whose file every rank reads whole, this rank's state of it, and what
        was wrong with the newer ones here (a collective when distributed: every rank loops alike)."""
        problems: dict[int, str] = {}
        limit = newest
        while True:
            mine, state = -1, None
            for epoch in sorted({e for e in self._saved_epochs() if e <= limit} | {limit}, reverse=True):
                if epoch in problems:
                    continue
                try:
                    state = self._load(epoch)
                    mine = epoch
                    break
                except CheckpointUnreadable as exc:
                    problems[epoch] = exc.message
            agreed = self._min_over_ranks(mine)
            if agreed < 0:
                raise CheckpointError(f"no checkpoint in {self.directory} can be resumed from: "
                                      f"{'; '.join(problems.values()) or 'another rank has none it can read'}")
            if agreed == limit:  # every rank read this epoch's file (so `state` is this rank's of it)
                assert state is not None and mine == agreed
                return agreed, state, [problems[e] for e in sorted(problems, reverse=True) if e > agreed] or \
                    ["another rank could not read its newer one"]
            limit = agreed

    def _load(self, epoch: int) -> dict[str, Any]:
        path = self._file(epoch)
        state = load_state(path)
        if state.get("world_size") != self.world_size or state.get("rank") != self.rank or state.get("epoch") != epoch:
            raise CheckpointError(f"checkpoint {path} belongs to rank {state.get('rank')} of "
                                  f"{state.get('world_size')} after epoch {state.get('epoch')}, not rank {self.rank} "
                                  f"of {self.world_size} after epoch {epoch}")
        return state

    def _min_over_ranks(self, value: int) -> int:
        if self.distributed and self.world_size > 1:
            t = torch.tensor([value], dtype=torch.int64, device=collective_device(self.group))
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
            return int(t.item())
        return value


# --- what a checkpoint holds, checked before anything of it is applied -------------------------

# The numbers of an epoch record in `extra["history"]` (the training loop's), each read back on resume; the
# task's metrics (train_acc, val_rmse, ...: gnnc.runtime.task_metrics) are numbers too, named by the task.
HISTORY_FIELDS = ("epoch", "loss", "time_s", "bytes_sent")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_extra(extra: dict[str, Any], epoch: int, path: Path) -> None:
    """`extra` holds the run's history: one record per epoch done, numbers by name (the summary reads them)."""
    history = extra.get("history", [])
    if not isinstance(history, list):
        raise CheckpointError(f"checkpoint {path}: its history must be a list of epoch records, got "
                              f"{type(history).__name__}")
    for i, rec in enumerate(history):
        # numbers, and flags (`evaluated`: whether --eval-every evaluated that epoch)
        if not (isinstance(rec, dict) and all(isinstance(k, str) and (_number(v) or isinstance(v, bool))
                                              for k, v in rec.items())
                and all(k in rec and _number(rec[k]) for k in HISTORY_FIELDS)):
            raise CheckpointError(f"checkpoint {path}: history record {i} must map {', '.join(HISTORY_FIELDS)} "
                                  f"to numbers, got {str(rec)[:80]}")
        if not isinstance(rec["epoch"], int) or not 0 <= rec["epoch"] <= epoch:
            raise CheckpointError(f"checkpoint {path}: history record {i} is of epoch {rec['epoch']!r}, not one of "
                                  f"the epochs 0..{epoch} it saved")


def _check_numpy_state(n: Any) -> None:
    """NumPy's legacy MT19937 state as capture_rng_state stores it (set_state overflows or indexes out of range
    on other values instead of saying what is wrong)."""
    keys = n["keys"]
    if n["kind"] != "MT19937":
        raise ValueError(f"numpy generator {n['kind']!r} is not MT19937")
    if not (isinstance(keys, torch.Tensor) and keys.shape == (624,) and not keys.is_floating_point()
            and not keys.is_complex() and bool(((keys >= 0) & (keys < 2 ** 32)).all())):
        raise ValueError("numpy keys must be 624 integers of 32 bits")
    if not (isinstance(n["pos"], int) and 0 <= n["pos"] <= 624 and n["has_gauss"] in (0, 1)
            and _number(n["cached_gaussian"])):
        raise ValueError("numpy position, gauss flag or cached gaussian out of range")


def _check_optimizer_state(saved: Any, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The saved optimizer state has this optimizer's shape: its groups with the same parameters and settings
    of the same kinds, and per parameter tensors of its shape (or scalars, as Adam's step). torch loads any
    dict and fails at the first step instead."""
    live = optimizer.state_dict()

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: its optimizer state {what}")

    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise bad("must hold 'state' and 'param_groups'")
    if len(saved["param_groups"]) != len(live["param_groups"]):
        raise bad(f"has {len(saved['param_groups'])} parameter groups; this optimizer has "
                  f"{len(live['param_groups'])}")
    params: dict[Any, torch.Tensor] = {}
    for k, (group, want, tensors) in enumerate(zip(saved["param_groups"], live["param_groups"],
                                                   optimizer.param_groups)):
        if not isinstance(group, dict) or group.get("params") != want["params"]:
            raise bad(f"group {k} does not hold this optimizer's parameters")
        params.update(zip(want["params"], tensors["params"]))
        for key, value in want.items():
            if key != "params" and not _same_kind(group.get(key), value):
                raise bad(f"group {k}: '{key}' is {group.get(key)!r}, not of the kind of {value!r}")
    for index, per in saved["state"].items():
        if index not in params or not isinstance(per, dict):
            raise bad(f"names parameter {index!r}, which this optimizer does not have")
        for key, value in per.items():
            if not isinstance(value, torch.Tensor) or value.is_complex() or (
                    value.dim() > 0 and (value.shape != params[index].shape or not value.is_floating_point())):
                shown = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise bad(f"of parameter {index}: '{key}' is {shown}, not a scalar or a tensor of shape "
                          f"{tuple(params[index].shape)}")


def _same_kind(saved: Any, live: Any) -> bool:
    """An optimizer setting of the live one's kind (a number for a number, a flag for a flag, ...)."""
    if isinstance(live, bool) or live is None:
        return isinstance(saved, bool) or saved is None
    if _number(live):
        return _number(saved) or (isinstance(saved, torch.Tensor) and saved.numel() == 1)
    if isinstance(live, (tuple, list)):
        return isinstance(saved, (tuple, list)) and len(saved) == len(live) and all(map(_same_kind, saved, live))
    return type(saved) is type(live)


def resume_or_start(checkpointer: Checkpointer | None, resume: bool, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None,
                    on_resume: Callable[[int, dict[str, Any]], None] | None = None) -> int:
    """The first epoch to run: 0, or after the newest checkpoint when `--resume` is given."""
    if not resume:
        return 0
    if checkpointer is None:
        raise CheckpointError("--resume needs --checkpoint DIR")
    start, extra = checkpointer.resume(model, optimizer)
    if on_resume is not None:
        on_resume(start, extra)
    return start
