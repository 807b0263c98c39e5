"""Checkpoints: a crash mid-write keeps the old one, a round trip restores training exactly,
and a damaged file is a clear CheckpointError. Also the metrics file, which makes the
same promise (a crash leaves complete lines only)."""
from __future__ import annotations

import errno
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from _rank_pool import pooled_launch
from gnnc.errors import GnncError, OutOfSpace
from gnnc.files import atomic_write
from gnnc.runtime import checkpoint
from gnnc.runtime.checkpoint import (MAGIC, Checkpointer, CheckpointError,
                                     load_state, resume_or_start, save_state)
from gnnc.runtime.comm import CommStats
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.metrics import EpochRecord, MetricsLog, read_metrics, summarize


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(5, 4)  # draws from the global RNG, as dropout would
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def test_resume_continues_exactly_where_the_run_stopped(tmp_path: Path) -> None:
    # Reference: 4 uninterrupted steps. Interrupted: 2 steps, save, clobber, resume, 2 steps.
    model, opt = _model_and_optimizer(0)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    for _ in range(4):
        _train_step(model, opt)
    want = [p.detach().clone() for p in model.parameters()]
    want_draws = (torch.rand(3), random.random(), np.random.rand())

    model, opt = _model_and_optimizer(0)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    ckpt = Checkpointer(tmp_path, every=2)
    for epoch in range(2):
        _train_step(model, opt)
        ckpt.maybe_save(epoch, model, opt, extra={"best_val": 0.5})
    assert [ckpt.due(e) for e in range(4)] == [False, True, False, True]

    model, opt = _model_and_optimizer(99)  # a fresh process: other weights, other RNG
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    seen: dict = {}
    start = resume_or_start(Checkpointer(tmp_path, every=2), True, model, opt,
                            on_resume=lambda e, extra: seen.update(extra))
    assert start == 2 and seen == {"best_val": 0.5}
    for _ in range(2):
        _train_step(model, opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), want))
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], want_draws[0]) and draws[1:] == want_draws[1:]


def test_rng_streams_are_restored(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, model, opt)
    want = (torch.rand(4), random.random(), np.random.rand(2))
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    ckpt.resume(model, opt)
    got = (torch.rand(4), random.random(), np.random.rand(2))
    assert torch.equal(got[0], want[0]) and got[1] == want[1] and np.array_equal(got[2], want[2])


def test_only_the_newest_saves_are_kept(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path, keep=2)
    for epoch in range(5):
        ckpt.save(epoch, model, opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-000003", "epoch-000004",
                                                         "latest-rank-0.json"]
    assert ckpt.latest_epoch() == 4


_CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from gnnc.runtime import checkpoint

    directory = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 1024)  # 2 MiB of weights: the file takes several writes
    ckpt = checkpoint.Checkpointer(directory)
    ckpt.save(0, model, None)
    with torch.no_grad():
        model.weight.add_(1.0)
    real_write = os.write
    def write_then_die(fd, data):
        real_write(fd, data[: len(data) // 2])  # half a chunk reaches the disk, then the crash
        os.kill(os.getpid(), signal.SIGKILL)
    os.write = write_then_die
    ckpt.save(1, model, None)
""")


def test_a_crash_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(_CRASH_SCRIPT)
    run_dir = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr  # it really died inside the second save
    partial = list((run_dir / "epoch-000001").glob(".rank-0.ckpt.*.tmp"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size  # the torn temporary file
    assert not (run_dir / "epoch-000001" / "rank-0.ckpt").exists()

    torch.manual_seed(0)
    model = torch.nn.Linear(512, 1024)
    want = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.zero_()
    ckpt = Checkpointer(run_dir)
    start, _ = ckpt.resume(model, None)
    assert start == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), want))
    ckpt.save(1, model, None)  # the next save of that epoch clears the torn file
    assert not list((run_dir / "epoch-000001").glob("*.tmp"))


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    atomic_write(path, b"old")
    atomic_write(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[: len(b) // 2], "checksum does not match"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 0x01]), "checksum does not match"),
    (lambda b: b[: len(MAGIC) + 5], "truncated"),
    (lambda b: b"PK\x03\x04" + b[4:], "is not a gnnc checkpoint"),
])
def test_a_damaged_checkpoint_is_a_clear_error(tmp_path: Path, damage, message: str) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    path = ckpt.save(0, model, opt)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as info:
        ckpt.resume(model, opt)
    assert isinstance(info.value, GnncError) and str(path) in str(info.value)


def test_missing_or_mismatched_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        Checkpointer(tmp_path / "empty").resume(model, opt)
    with pytest.raises(CheckpointError, match="needs --checkpoint"):
        resume_or_start(None, True, model, opt)
    Checkpointer(tmp_path).save(0, model, opt)
    other, other_opt = torch.nn.Linear(2, 2), None
    with pytest.raises(CheckpointError, match="does not fit this model"):
        Checkpointer(tmp_path).resume(other, other_opt)
    marker = tmp_path / "latest-rank-0.json"
    marker.write_text(json.dumps({"epoch": 0, "world_size": 4}))
    with pytest.raises(CheckpointError, match="written by 4 ranks; this run has 1"):
        Checkpointer(tmp_path).resume(model, opt)
    save_state(tmp_path / "x.ckpt", {"no_epoch": 1})
    with pytest.raises(CheckpointError, match="holds no training state"):
        load_state(tmp_path / "x.ckpt")


def _distributed_checkpoints(cfg: DistConfig, directory: str) -> tuple[int | None, int, int]:
    """Two ranks save three epochs; then rank 1's marker is set back one save, as a crash
    between the barrier and its marker update would leave it."""
    torch.manual_seed(cfg.rank)  # each rank holds its own shard of the state
    model = torch.nn.Linear(3, 3)
    ckpt = Checkpointer(directory, every=1, keep=2)
    for epoch in range(3):
        ckpt.save(epoch, model, None)
    dist.barrier()
    latest = ckpt.latest_epoch()
    if cfg.rank == 1:
        (Path(directory) / "latest-rank-1.json").write_text(json.dumps({"epoch": 1, "world_size": 2}))
    dist.barrier()
    with torch.no_grad():
        model.weight.zero_()
    start, _ = Checkpointer(directory).resume(model, None)
    torch.manual_seed(cfg.rank)
    return latest, start, int(torch.equal(model.weight, torch.nn.Linear(3, 3).weight))


def _each_two_rank_case(cfg: DistConfig, root: str) -> dict[str, Any]:
    """The three cases below, each in its own directory: one launch of 2 ranks instead of three."""
    return {"newest": _distributed_checkpoints(cfg, f"{root}/newest"),
            "metrics": _log_two_epochs(cfg, f"{root}/m.jsonl"),
            "fallback": _distributed_fallback(cfg, f"{root}/fallback")}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Where the 2-rank cases wrote, and what each rank returned (by case)."""
    root = tmp_path_factory.mktemp("two-ranks")
    for case in ("newest", "fallback"):
        (root / case).mkdir()
    return root, pooled_launch(_each_two_rank_case, 2, str(root), timeout_s=60)


def test_ranks_resume_from_the_newest_save_all_of_them_finished(two_ranks) -> None:
    root, results = two_ranks
    # latest 2; after the marker rollback, epoch 1 -> start 2
    assert [r["newest"] for r in results] == [(2, 2, 1), (2, 2, 1)]
    assert sorted(p.name for p in (root / "newest" / "epoch-000001").iterdir()) == ["rank-0.ckpt", "rank-1.ckpt"]


# --- metrics files: the same promise, complete lines only --------------------------------------
# (kept here with the other crash-safe run files; the brief lists no test module for metrics)


def _log_two_epochs(cfg: DistConfig, path: str) -> list[dict] | None:
    stats = CommStats()
    out = None
    with MetricsLog(path) as log:
        for epoch in range(2):
            stats.reset()
            stats.add_bytes("layer0", "halo", "fwd", 100 * (cfg.rank + 1))
            rec = EpochRecord.from_stats(epoch, cfg.rank, cfg.world_size, stats, epoch_s=0.5 + epoch,
                                         loss=1.0 / (epoch + 1), val_acc=0.5, test_acc=0.25)
            out = log.log(rec)
    return out


def test_rank_0_writes_one_line_per_rank_and_epoch(two_ranks) -> None:
    root, ranks = two_ranks
    path = root / "m.jsonl"
    results = [r["metrics"] for r in ranks]
    assert results[1] is None and [r["rank"] for r in results[0]] == [0, 1]
    records = read_metrics(path)
    assert [(r["epoch"], r["rank"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["bytes_by_op"] for r in records[:2]] == [{"layer0/halo/fwd": 100}, {"layer0/halo/fwd": 200}]
    assert all(r["peak_rss_bytes"] > 1 << 20 for r in records)
    summary = summarize(records)
    assert summary["bytes_sent_per_epoch"] == 300 and summary["epoch_time_s"] == 1.5
    assert summary["train_loss"] == 0.5 and summary["world_size"] == 2 and summary["epochs"] == 2


def test_a_torn_metrics_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with MetricsLog(path) as log:
        log.log(EpochRecord(epoch=0, rank=0, world_size=1, loss=2.0))
    with open(path, "ab") as fh:  # a crash inside the next write left half a line
        fh.write(b'{"epoch": 1, "rank": 0, "lo')
    assert [r["epoch"] for r in read_metrics(path)] == [0]
    with MetricsLog(path) as log:  # reopening cuts the torn tail before appending
        log.log(EpochRecord(epoch=1, rank=0, world_size=1, loss=1.0))
    assert [(r["epoch"], r["loss"]) for r in read_metrics(path)] == [(0, 2.0), (1, 1.0)]
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 2


def test_peak_rss_is_this_process_not_the_image_it_replaced() -> None:
    """A process exec'd from a large one reports its own peak, not its parent's (ru_maxrss would)."""
    import subprocess
    import sys

    from gnnc.runtime.metrics import peak_rss_bytes

    code = ("import os, sys\nbuf = bytearray(600 << 20)\nfor i in range(0, len(buf), 4096): buf[i] = 1\n"
            "os.execv(sys.executable, [sys.executable, '-c', "
            "'from gnnc.runtime.metrics import peak_rss_bytes; print(peak_rss_bytes())'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) < 400 << 20, int(out) / 2**20  # the 600 MiB buffer belonged to the replaced image
    assert peak_rss_bytes() > 1 << 20


# --- issue 40: what a checkpoint holds is checked before it is applied; resume passes over a bad save ----


def _history(epochs: int) -> list[dict]:
    return [{"epoch": e, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "time_s": 0.1,
             "bytes_sent": 0} for e in range(epochs)]


def _edit(path: Path, edit) -> None:
    """Change a saved state and write it back with a valid checksum (as an attacker or a bug would)."""
    state = load_state(path)
    edit(state)
    save_state(path, state)


@pytest.mark.parametrize("edit,message", [
    (lambda s: s["extra"].__setitem__("history", 5), "history must be a list"),
    (lambda s: s["extra"].__setitem__("history", ["x"]), "history record 0 must map"),
    (lambda s: s["extra"].__setitem__("history", [{"epoch": 0}]), "history record 0 must map"),
    (lambda s: s["extra"]["history"][0].__setitem__("epoch", 7), "history record 0 is of epoch 7"),
    (lambda s: s["rng"]["numpy"].__setitem__("keys", torch.zeros(3, dtype=torch.int64)), "624 integers"),
    (lambda s: s["rng"]["numpy"].__setitem__("pos", 10 ** 30), "numpy position"),
    (lambda s: s["rng"]["numpy"].__setitem__("kind", "PCG64"), "not MT19937"),
    (lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(3)), "'exp_avg' is (3,)"),
    (lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", "x"), "'exp_avg' is str"),
    (lambda s: s["optimizer"]["param_groups"][0].__setitem__("lr", "x"), "'lr' is 'x'"),
    (lambda s: s["optimizer"].__setitem__("state", 5), "must hold 'state' and 'param_groups'"),
    (lambda s: s.__setitem__("optimizer", [1]), "must hold 'state' and 'param_groups'"),
], ids=["history-int", "history-str", "record-fields", "record-epoch", "np-keys", "np-pos", "np-kind",
        "opt-shape", "opt-str", "opt-lr", "opt-state", "opt-list"])
def test_a_checkpoint_with_bad_contents_is_named(tmp_path: Path, edit, message: str) -> None:
    model, opt = _model_and_optimizer(0)
    _train_step(model, opt)  # Adam's per-parameter state exists
    path = Checkpointer(tmp_path).save(0, model, opt, extra={"history": _history(1)})
    _edit(path, edit)
    with pytest.raises(CheckpointError, match=re.escape(message)) as info:
        Checkpointer(tmp_path).resume(*_model_and_optimizer(1))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("damage", ["corrupt", "deleted"])
def test_resume_passes_over_a_bad_newest_save(tmp_path: Path, damage: str) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, model, opt, extra={"history": _history(1)})
    want = [p.detach().clone() for p in model.parameters()]
    _train_step(model, opt)
    newest = ckpt.save(1, model, opt, extra={"history": _history(2)})
    if damage == "corrupt":
        newest.write_bytes(newest.read_bytes()[:-1] + bytes([newest.read_bytes()[-1] ^ 1]))
    else:
        newest.unlink()  # what the old message advised
    model, opt = _model_and_optimizer(5)
    again = Checkpointer(tmp_path)
    start, extra = again.resume(model, opt)
    assert start == 1 and len(extra["history"]) == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), want))
    assert len(again.resume_notes) == 1 and "resuming from the checkpoint of epoch 0" in again.resume_notes[0]
    assert str(newest) in again.resume_notes[0]


def test_resume_with_no_readable_save_says_why(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    for epoch in range(2):
        path = ckpt.save(epoch, model, opt)
        path.write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be resumed from: .*epoch-000001.*epoch-000000"):
        Checkpointer(tmp_path).resume(model, opt)


def _distributed_fallback(cfg: DistConfig, directory: str) -> tuple[int, list[str]]:
    """Two ranks save epochs 0 and 1; rank 1's file of epoch 1 is then corrupt: both must resume after epoch 0."""
    model = torch.nn.Linear(3, 3)
    ckpt = Checkpointer(directory, every=1, keep=2)
    for epoch in range(2):
        ckpt.save(epoch, model, None)
    dist.barrier()
    if cfg.rank == 1:
        (Path(directory) / "epoch-000001" / "rank-1.ckpt").write_bytes(b"junk")
    dist.barrier()
    again = Checkpointer(directory)
    start, _ = again.resume(model, None)
    return start, again.resume_notes


def test_ranks_pass_over_a_save_one_of_them_cannot_read(two_ranks) -> None:
    (start0, notes0), (start1, notes1) = [r["fallback"] for r in two_ranks[1]]
    assert start0 == start1 == 1
    assert "another rank could not read" in notes0[0] and "rank-1.ckpt is not a gnnc checkpoint" in notes1[0]


@pytest.mark.parametrize("kind", ["file", "dangling link", "read-only"])
def test_an_unusable_checkpoint_directory_is_named_before_training(tmp_path: Path, monkeypatch, kind: str) -> None:
    target = tmp_path / "ckpt"
    if kind == "file":
        target.write_text("not a directory")
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere")
    else:  # root writes through any mode bits: the kernel's answer on a read-only mount, raised for it
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))
        monkeypatch.setattr(checkpoint.Path, "mkdir", read_only)
    with pytest.raises(CheckpointError, match=f"--checkpoint {target}: ") as info:
        Checkpointer(target).lock()
    assert info.value.exit_code == 2


def test_a_full_disk_keeps_the_saves_before_it(tmp_path: Path, monkeypatch) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    first = ckpt.save(0, model, opt)
    before = first.read_bytes()

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(checkpoint, "atomic_write", full)
    with pytest.raises(OutOfSpace, match="cannot write the checkpoint of epoch 1 .*No space left") as info:
        ckpt.save(1, model, opt)
    assert info.value.exit_code == 1
    monkeypatch.undo()
    assert first.read_bytes() == before
    assert Checkpointer(tmp_path).resume(model, opt)[0] == 1


def test_a_whole_file_that_is_not_this_ranks_state_is_refused_not_passed_over(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, model, opt)
    newest = ckpt.save(1, model, opt)
    _edit(newest, lambda s: s.__setitem__("rank", 3))  # it reads whole: someone put it there
    with pytest.raises(CheckpointError, match="belongs to rank 3"):
        Checkpointer(tmp_path).resume(model, opt)
