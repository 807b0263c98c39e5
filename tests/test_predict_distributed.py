"""`gnnc predict M --graph G --nproc N` (issue 41, item 2 on N processes).

The saved model is compiled for N workers and each rank computes its vertices' rows; rank 0 writes them in global
order. The values equal one process's `gnnc predict` (1e-5 relative) on 2 and 4 gloo processes: the logits of a
GraphSAGE on another graph than it was trained on (inductive), a named intermediate value (evaluated layer-wise,
in chunks of rows, as on a large graph), and a value P3's push-pull holds as feature slices (its layer is planned
on rows instead). Bad input is exit 2 before any process
starts; a killed worker is exit 1 and a SIGTERM 128+15, every process stopped and no file written.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import gnnc_in_process

import gnnc.api
from gnnc.runtime import layerwise
from gnnc.runtime import predict as predict_runtime
from gnnc.runtime.predict import in_feature_phase

ROOT = Path(__file__).resolve().parents[1]
SAGE = str(ROOT / "examples" / "sage.gnn")
TRAIN = "sbm:n=400,features=16,classes=4,seed=1"
OTHER = "sbm:n=300,features=16,classes=4,seed=2"  # another graph, the same feature width


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "sage.m"
    ran = gnnc_in_process("run", SAGE, "--graph", TRAIN, "--epochs", "3", "--save-model", str(path))
    assert ran.returncode == 0, ran.stderr
    return path


def predicted(model: Path, graph: str, out: Path, *extra: str) -> np.ndarray:
    ran = gnnc_in_process("predict", str(model), "--graph", graph, "-o", str(out), *extra)
    assert ran.returncode == 0, ran.stderr
    return np.load(out)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# the 4-process case evaluates layer-wise, in chunks of 64 rows (as a graph larger than CHUNK_ROWS would)
@pytest.mark.parametrize("nproc, graph, output, chunk", [(2, OTHER, "logits", None), (4, TRAIN, "l0", 64)])
def test_n_processes_give_one_process_values(model: Path, nproc: int, graph: str, output: str, chunk: int | None,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = predicted(model, graph, tmp_path / "one.npy", "--output", output)
    if chunk is not None:
        monkeypatch.setattr(predict_runtime, "CHUNK_ROWS", chunk)
    many = predicted(model, graph, tmp_path / "many.npy", "--output", output, "--nproc", str(nproc))
    assert many.shape == one.shape and many.dtype == one.dtype
    assert rel(many, one) < 1e-5


@pytest.mark.parametrize("output, chunked", [("logits", False), ("l0", True), ("l0.t~2", False)])
def test_one_process_evaluates_a_large_graph_layer_wise(model: Path, output: str, chunked: bool, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Above CHUNK_ROWS vertices a value computed equation by equation runs in chunks of rows
    (gnnc.runtime.layerwise), unchanged; the logits run as fused chains (no edge value held), and a value computed
    inside a layer (l0.t~2), which a chunked layer does not keep, is computed on whole layers."""
    whole = predicted(model, OTHER, tmp_path / "whole.npy", "--output", output)
    calls: list[bool] = []
    run_chunked = layerwise.run_layer_chunked

    def spy(*args, **kwargs):
        calls.append(run_chunked(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(layerwise, "run_layer_chunked", spy)
    monkeypatch.setattr(predict_runtime, "CHUNK_ROWS", 64)
    assert rel(predicted(model, OTHER, tmp_path / "chunks.npy", "--output", output), whole) < 1e-5
    assert (calls != [] and all(calls)) == chunked, calls


def test_a_value_push_pull_holds_as_slices_is_planned_on_rows(model: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under P3's push-pull a rank holds a first-layer value before the pull as a feature slice or a partial sum of
    every vertex, not as rows: asked for such a value, predict plans the layer with a row strategy instead."""
    compile_ = gnnc.api.compile
    allowed = []

    def pushpull_first(*args, allow=None, **kw):
        allowed.append(allow)
        return compile_(*args, allow=allow, strategy=None if allow else "pushpull,depcomm", **kw)

    monkeypatch.setattr(gnnc.api, "compile", pushpull_first)
    pushpull = compile_(gnnc.api.load_model(SAGE), gnnc.api.load_graph(OTHER), workers=2, strategy="pushpull,depcomm")
    assert "l0.t~2" in in_feature_phase(pushpull.program) and "l1.t~2" not in in_feature_phase(pushpull.program)
    many = predicted(model, OTHER, tmp_path / "many.npy", "--output", "l0.t~2", "--nproc", "2")
    assert allowed[0] is None and "pushpull" not in allowed[1]
    monkeypatch.undo()
    assert rel(many, predicted(model, OTHER, tmp_path / "one.npy", "--output", "l0.t~2")) < 1e-5


@pytest.mark.parametrize("extra, message", [
    (["--graph", OTHER, "--output", "l7", "--nproc", "2"], "--output l7: model GraphSAGE has no layer or vertex value"),
    (["--graph", "planetoid:cora", "--nproc", "2"], "the model expects 16 input features but graph 'cora' has 1433"),
    (["--graph", OTHER, "--nproc", "0"], "argument --nproc: must be at least 1"),
    (["--graph", OTHER, "--output", "y", "--nproc", "2"], "--output y: a graph input"),
    (["--graph", OTHER, "--nproc", "301"], "--nproc 301: more workers than the graph's 300 vertices"),
])
def test_bad_input_is_exit_2_before_any_process_starts(model: Path, extra: list[str], message: str,
                                                       tmp_path: Path) -> None:
    ran = gnnc_in_process("predict", str(model), *extra, "-o", str(tmp_path / "x.npy"))
    assert ran.returncode == 2 and message in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and not (tmp_path / "x.npy").exists()


def test_an_unwritable_output_is_refused_before_the_work(model: Path, tmp_path: Path) -> None:
    ran = gnnc_in_process("predict", str(model), "--graph", OTHER, "--nproc", "2", "-o",
                          str(tmp_path / "missing" / "x.npy"))
    assert ran.returncode == 2 and "-o" in ran.stderr and "does not exist" in ran.stderr, ran.stderr


def _ranks(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if "spawn_main" in _cmdline(int(p)) and "resource_tracker" not in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.parametrize("victim, signum, code", [("rank", signal.SIGKILL, 1),
                                                   ("launcher", signal.SIGTERM, 128 + signal.SIGTERM)])
def test_a_killed_worker_or_launcher_stops_every_process(model: Path, victim: str, signum: int, code: int,
                                                         tmp_path: Path) -> None:
    """A rank killed: exit 1 naming it; the command stopped by SIGTERM: exit 128+15 (as `gnnc run`). Either way
    every rank is stopped and no file is written."""
    out = tmp_path / "x.npy"
    proc = subprocess.Popen([sys.executable, "-m", "gnnc", "predict", str(model), "--graph", OTHER, "--nproc", "2",
                             "-o", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    deadline = time.time() + 120
    while time.time() < deadline and len(ranks) < 2 and proc.poll() is None:
        ranks = _ranks(proc.pid)
        time.sleep(0.05)
    assert len(ranks) == 2, f"expected two ranks, found {ranks}: {proc.communicate()[1] if proc.poll() is not None else ''}"
    # while the ranks start (importing torch takes seconds): before anything is written
    os.kill(ranks[-1] if victim == "rank" else proc.pid, signum)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == code, err
    assert ("rank 1" in err and "SIGKILL" in err) if victim == "rank" else "stopped by SIGTERM" in err, err
    assert "Traceback" not in err
    assert not any(_alive(p) for p in ranks) and not out.exists()
