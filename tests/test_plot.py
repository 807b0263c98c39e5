"""`gnnc plot RUN.jsonl`: the curves of a --metrics file (issue 41, item 4).

The curves are the run's own numbers (its history: the loss as the ranks' shares added, the accuracies), a run
on several processes gets each rank's step split, and a bad file is exit 2 naming the file and the line.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gnnc
from gnnc.cli import main
from gnnc.plot import curves, read_records

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head.startswith(PNG)
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> tuple[Path, list[dict]]:
    path = tmp_path_factory.mktemp("plot") / "run.jsonl"
    result = gnnc.run(gnnc.load_model(EXAMPLES / "gcn.gnn"), "planetoid:cora", epochs=6, metrics=str(path))
    return path, result.history


def record(epoch: int, rank: int, loss: float, compute: float, comm: float, allreduce: float,
           pipe: float = 0.0) -> dict:
    """An EpochRecord's JSON as a rank of a run on two processes writes it."""
    return {"epoch": epoch, "rank": rank, "world_size": 2, "loss": loss, "train_acc": 0.5, "val_acc": 0.1 * epoch,
            "test_acc": 0.2, "epoch_s": compute + comm + allreduce, "compute_s": compute, "comm_s": comm,
            "allreduce_s": allreduce, "pipe_s": pipe, "bytes_sent": 10, "bytes_by_op": {}, "extra": {}}


def test_the_curves_are_the_runs_history(run_file, tmp_path: Path, capsys) -> None:
    path, history = run_file
    c = curves(read_records(path))
    assert c.epochs == [r["epoch"] for r in history] and c.world_size == 1 and not c.split
    assert c.loss == pytest.approx([r["loss"] for r in history], abs=1e-6)
    assert c.accuracy["test"] == [r["test_acc"] for r in history]
    best = max(history, key=lambda r: (r["val_acc"], -r["epoch"]))
    assert c.epochs[c.best] == best["epoch"]
    out = tmp_path / "curves.png"
    assert main(["plot", str(path), "-o", str(out), "--json"]) == 0
    stdout = capsys.readouterr().out
    assert f"wrote {out}: 6 epochs; best validation accuracy" in stdout
    assert json.loads(stdout.splitlines()[-1])["best_epoch"] == best["epoch"]
    assert png_size(out) == (1040, 420)  # two panels of 5.2 x 4.2 inches at 100 dpi


def test_a_distributed_run_gets_each_ranks_time_split(tmp_path: Path) -> None:
    path = tmp_path / "dist.jsonl"
    lines = [record(0, 0, 0.9, 9.0, 9.0, 9.0), record(0, 1, 1.0, 9.0, 9.0, 9.0),  # epoch 0: left out of the split
             record(1, 0, 0.6, 0.10, 0.04, 0.02, pipe=0.01), record(1, 1, 0.7, 0.08, 0.06, 0.02),
             {"kind": "minibatch", "epoch": 1, "batch": 0, "rank": 0, "world_size": 2},
             record(2, 0, 0.5, 0.12, 0.04, 0.02, pipe=0.03), record(2, 1, 0.5, 0.08, 0.02, 0.02)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    c = curves(read_records(path))
    assert c.epochs == [0, 1, 2] and c.world_size == 2
    assert c.loss == pytest.approx([1.9, 1.3, 1.0])  # the ranks' shares added
    assert c.split["compute"] == pytest.approx([0.11, 0.08])
    assert c.split["communication"] == pytest.approx([0.02, 0.04])  # pipeline waits are their own part
    assert c.split["pipeline wait"] == pytest.approx([0.02, 0.0])
    assert c.split["gradient all-reduce"] == pytest.approx([0.02, 0.02])
    assert main(["plot", str(path)]) == 0
    assert png_size(tmp_path / "dist.png") == (1560, 420)  # a third panel


@pytest.mark.parametrize("content, message", [
    (None, "run.jsonl: no such file"),
    (b"", "run.jsonl: holds no epoch record"),
    (b'{"epoch": 0, "rank": 0, "world_size": 1, "loss": 1.0}\n{"epoch": 1,\n{"epoch": 2}\n',
     "run.jsonl:2: not a JSON line"),
    (b'{"loss": 1.0}\n', "run.jsonl:1: not a gnnc metrics record (no whole number 'epoch'"),
    (b'[1, 2]\n', "run.jsonl:1: not a gnnc metrics record (a JSON list)"),
    (b'{"epoch": 0, "rank": 0, "world_size": 1}\n{"epoch": 1, "rank": 0, "world_size": 1, "loss": "low"}\n',
     "run.jsonl:2: 'loss' is 'low', not a number"),
])
def test_a_bad_file_is_exit_2_naming_its_line(content: bytes | None, message: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    if content is not None:
        path.write_bytes(content)
    assert main(["plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run.png").exists()


def test_a_torn_last_line_is_passed_over(run_file, tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    path.write_bytes(run_file[0].read_bytes() + b'{"epoch": 6, "rank": 0, "wor')
    assert len(curves(read_records(path)).epochs) == 6


def test_an_output_that_cannot_be_written_is_exit_2(run_file, tmp_path: Path, capsys) -> None:
    assert main(["plot", str(run_file[0]), "-o", str(tmp_path / "no" / "such" / "dir.png")]) == 2
    assert "cannot write the figure" in capsys.readouterr().err


def test_plot_loads_no_torch(run_file, tmp_path: Path) -> None:
    code = ("import sys; from gnnc.cli import main\n"
            f"rc = main(['plot', {str(run_file[0])!r}, '-o', {str(tmp_path / 'c.png')!r}])\n"
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stderr
