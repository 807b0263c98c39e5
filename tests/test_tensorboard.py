"""`gnnc plot RUN.jsonl --tensorboard DIR` (issue 41, item 4): a run's metrics as TensorBoard scalars.

The event file, read back with TensorBoard's own EventAccumulator, holds per epoch what the metrics file holds: the
loss (the ranks' shares added), the task's metrics (accuracies; RMSE and MAE of a regression), the learning rate
and the slowest rank's step time. Without the tensorboard package the command is exit 2 naming it and how to
install it.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from conftest import gnnc_in_process

ROOT = Path(__file__).resolve().parents[1]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def event_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event,) = directory.iterdir()  # one event file, nothing left of its staging
    acc = EventAccumulator(str(event))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory) -> Path:
    """A node regression's metrics, 4 epochs under a cosine schedule (the rate changes every epoch)."""
    path = tmp_path_factory.mktemp("run") / "run.jsonl"
    ran = gnnc_in_process("run", str(ROOT / "examples" / "node_regression.gnn"), "--graph",
                          "regress:n=300,deg=4,features=8,targets=1,noise=0.1,seed=0", "--epochs", "4",
                          "--schedule-lr", "cosine", "--metrics", str(path))
    assert ran.returncode == 0, ran.stderr
    return path


def test_the_metrics_file_holds_the_rate_and_the_tasks_metrics(regression_run: Path) -> None:
    """What the event file is made from: gnnc.runtime.train writes them in each record's extra."""
    recs = records(regression_run)
    assert [r["extra"]["lr"] for r in recs][0] == pytest.approx(0.01)
    assert len({r["extra"]["lr"] for r in recs}) == 4
    assert all(math.isfinite(r["extra"][f"{s}_{m}"]) for r in recs for s in ("train", "val", "test")
               for m in ("rmse", "mae"))


def test_the_event_file_holds_the_metrics_files_scalars(regression_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    ran = gnnc_in_process("plot", str(regression_run), "--tensorboard", str(tmp_path / "tb"))
    assert ran.returncode == 0, ran.stderr
    got = event_scalars(tmp_path / "tb")
    recs = records(regression_run)
    want = {"loss": [(r["epoch"], r["loss"]) for r in recs], "lr": [(r["epoch"], r["extra"]["lr"]) for r in recs],
            "time/epoch_s": [(r["epoch"], r["epoch_s"]) for r in recs],
            **{f"{m}/{s}": [(r["epoch"], r["extra"][f"{s}_{m}"]) for r in recs]
               for s in ("train", "val", "test") for m in ("rmse", "mae")}}
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [e for e, _ in got[tag]] == [e for e, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # float32 there
    assert not regression_run.with_suffix(".png").exists()  # the figure only with -o


def test_ranks_losses_add_up_and_accuracies_are_rank_0s(tmp_path: Path) -> None:
    """A run on two processes: each rank's record holds its share of the loss; the step time is the slowest's."""
    pytest.importorskip("tensorboard")
    path = tmp_path / "two.jsonl"
    lines = [{"epoch": e, "rank": k, "world_size": 2, "loss": 0.5 + e + k, "epoch_s": 0.1 * (k + 1) + e,
              "train_acc": 0.25 * e, "val_acc": 0.5, "test_acc": 0.125 * e, "extra": {"lr": 0.01 / (e + 1)}}
             for e in range(3) for k in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert gnnc_in_process("plot", str(path), "--tensorboard", str(tmp_path / "tb")).returncode == 0
    got = event_scalars(tmp_path / "tb")
    assert sorted(got) == ["acc/test", "acc/train", "acc/val", "loss", "lr", "time/epoch_s"]
    assert got["loss"] == [(e, pytest.approx(2.0 + 2 * e)) for e in range(3)]
    assert got["time/epoch_s"] == [(e, pytest.approx(0.2 + e)) for e in range(3)]
    assert got["acc/train"] == [(e, pytest.approx(0.25 * e)) for e in range(3)]


def test_without_tensorboard_it_is_exit_2_naming_the_package(regression_run: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    ran = gnnc_in_process("plot", str(regression_run), "--tensorboard", str(tmp_path / "tb"))
    assert ran.returncode == 2, ran.stderr
    assert "needs the tensorboard package: pip install tensorboard" in ran.stderr and "Traceback" not in ran.stderr
    assert not (tmp_path / "tb").exists()
