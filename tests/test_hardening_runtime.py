"""Issue 20, the runtime's part: what an operator and an attacker meet when running gnnc.

Each test drives `gnnc run` as a user would: the rendezvous store listens on
loopback only; SIGTERM and SIGHUP stop the workers and clean up; resume
refuses a different run; two jobs cannot share a checkpoint directory; exit
codes mean bad input (2), a failed worker (1) or a signal (128+N); metrics
have one record per epoch after a resume; a NaN loss, an empty training mask
and `--nproc 0` are reported; a hung rank is named within `--timeout`.
Multi-process runs use a small generated graph and 2 ranks. What a command decides (resume's refusals, the
lock's message, the input checks) runs through gnnc.cli.main in this process (conftest.gnnc_in_process); what
only a process shows (signals, a killed or hung rank, exit 1) starts `python -m gnnc`.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, ROOT, gnnc_in_process
from gnnc.errors import GnncError
from gnnc.runtime.launch import DistConfig, WorkerFailedError, launch

GCN = str(EXAMPLES / "gcn.gnn")
SMALL = "rmat:n=400,deg=4,features=8,classes=3,seed=0"
OTHER = "rmat:n=400,deg=4,features=8,classes=3,seed=1"  # same sizes, other edges and features
START_DEADLINE_S = 180.0


# --- a job running in the background ----------------------------------------------------------


def _start(tmp_path: Path, *extra: str, nproc: int = 2) -> tuple[subprocess.Popen, Path]:
    """Start a long `gnnc run` with TMPDIR in `tmp_path`; return once its first epoch is recorded."""
    metrics = tmp_path / "run.jsonl"
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "gnnc", "run", GCN, "--graph", SMALL, "--nproc", str(nproc),
                             "--epochs", "100000", "--metrics", str(metrics), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_DEADLINE_S
    while not (metrics.exists() and metrics.stat().st_size > 0):
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training started:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("training did not start")
        time.sleep(0.2)
    return proc, tmp


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _workers(launcher: int) -> list[int]:
    """The launcher's worker processes (spawned interpreters, not the resource tracker), in start order."""
    out = []
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is None or int(stat[1]) != launcher:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            out.append(int(entry.name))
    return sorted(out)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


# --- item 2: loopback only ------------------------------------------------------------------------


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.exists() else []:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def _listeners() -> dict[int, str]:
    """Listening TCP sockets of this machine: inode -> local address (hex, as /proc/net/tcp* write it)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                out[int(fields[9])] = fields[1].split(":")[0]
    return out


LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def assert_listens_on_loopback_only(launcher: int, workers: list[int]) -> None:
    pids = [launcher, *workers]
    assert len(pids) == 3, pids
    listening = _listeners()
    mine = {inode: listening[inode] for pid in pids for inode in _socket_inodes(pid) if inode in listening}
    assert mine, "found no listening socket of the job (the rendezvous store listens somewhere)"
    wide = {inode: addr for inode, addr in mine.items() if addr not in LOOPBACK_HEX}
    assert not wide, f"sockets of the job listen beyond loopback: {wide}"


# --- item 3: SIGTERM and SIGHUP --------------------------------------------------------------------


# The running job's sockets are checked (item 2) before the signal: a job of its own cost a launch (3 processes).
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_the_job_listens_on_loopback_only_and_a_signal_to_the_launcher_stops_workers_and_cleans_up(
        tmp_path: Path, signum: int) -> None:
    proc, tmp = _start(tmp_path)
    workers = _workers(proc.pid)
    assert len(workers) == 2 and list(tmp.glob("gnnc-*")), "expected workers and the job's temporary dirs"
    try:
        assert_listens_on_loopback_only(proc.pid, workers)
    except AssertionError:
        _stop(proc)
        raise
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == f"stopped by {signal.Signals(signum).name}", err
    assert "Traceback" not in err
    assert not list(tmp.glob("gnnc-launch-*")) and not list(tmp.glob("gnnc-shards-*")), list(tmp.iterdir())
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived the launcher"


# --- item 4: resume checks it is the same run ---------------------------------------------------------


def test_resume_refuses_a_different_run_and_applies_more_epochs(tmp_path: Path) -> None:
    ck = str(tmp_path / "ck")
    base = ["run", GCN, "--checkpoint", ck, "--checkpoint-every", "2"]
    first = gnnc_in_process(*base, "--graph", SMALL, "--epochs", "4", "--json")
    assert first.returncode == 0, first.stderr
    r = gnnc_in_process(*base, "--graph", SMALL, "--epochs", "4", "--lr", "0.05", "--seed", "3", "--resume")
    assert r.returncode == 2 and "lr: 0.01 in the checkpoint, 0.05 now" in r.stderr and "seed: 0" in r.stderr, \
        r.stderr
    assert "Traceback" not in r.stderr
    r = gnnc_in_process(*base, "--graph", OTHER, "--epochs", "4", "--resume")  # same dims, another graph
    assert r.returncode == 2 and "graph_content" in r.stderr and "graph:" in r.stderr, r.stderr
    r = gnnc_in_process(*base, "--graph", SMALL, "--epochs", "4", "--set", "hidden=17", "--resume")
    assert r.returncode == 2 and "program" in r.stderr, r.stderr
    r = gnnc_in_process(*base, "--graph", SMALL, "--epochs", "2", "--resume")  # 4 epochs are done
    assert r.returncode == 2 and "4 epochs done" in r.stderr, r.stderr
    more = gnnc_in_process(*base, "--graph", SMALL, "--epochs", "6", "--resume", "--json")
    assert more.returncode == 0, more.stderr
    assert "--epochs changed from 4 to 6, applied" in more.stderr
    # The report's history is this run's: the best epoch is one of its 6, and the first 4 are the saved ones.
    assert 0 <= json.loads(more.stdout.splitlines()[-1])["best_epoch"] < 6


# --- item 5: one job per checkpoint directory --------------------------------------------------------


def test_a_second_job_on_the_same_checkpoint_directory_exits_2_naming_the_holder(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    holder, _ = _start(tmp_path, "--checkpoint", str(ck), nproc=1)
    try:
        r = gnnc_in_process("run", GCN, "--graph", SMALL, "--epochs", "2", "--checkpoint", str(ck))
        assert r.returncode == 2, r.stderr
        assert "is in use by another run" in r.stderr and f"pid {holder.pid} on" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert holder.poll() is None, "the first job must go on"
    finally:
        _stop(holder)
    r = gnnc_in_process("run", GCN, "--graph", SMALL, "--epochs", "2", "--checkpoint", str(ck))  # the lock died with it
    assert r.returncode == 0, r.stderr


# --- item 9: exit codes --------------------------------------------------------------------------------


def _raise_runtime_error_on_rank_1(cfg: DistConfig) -> None:
    if cfg.rank == 1:
        raise RuntimeError("an internal bug")


def _raise_gnnc_error_on_rank_1(cfg: DistConfig) -> None:
    if cfg.rank == 1:
        raise GnncError("bad input found by a worker")


def test_a_worker_crash_is_1_and_a_worker_gnnc_error_is_2() -> None:
    with pytest.raises(WorkerFailedError) as crash:
        launch(_raise_runtime_error_on_rank_1, 2, timeout_s=30)
    assert crash.value.rank == 1 and crash.value.exit_code == 1, str(crash.value)
    with pytest.raises(WorkerFailedError) as bad:
        launch(_raise_gnnc_error_on_rank_1, 2, timeout_s=30)
    assert bad.value.rank == 1 and bad.value.exit_code == 2, str(bad.value)


def test_a_sigkilled_worker_makes_the_run_exit_1_naming_its_rank(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path)
    try:
        workers = _workers(proc.pid)
        os.kill(workers[1], signal.SIGKILL)  # one of the two ranks (process order need not be rank order)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 1, err
        m = re.search(r"worker rank (\d) of 2 failed: killed by SIGKILL", err)
        assert m is not None, err  # only the killed rank dies of SIGKILL (the launcher stops the other one)
    finally:
        _stop(proc)


# --- item 11: the smaller ones ------------------------------------------------------------------------


def test_a_resumed_run_leaves_one_metrics_record_per_epoch(tmp_path: Path) -> None:
    # 6 epochs with a save after epoch 3 (every 4): as if killed after epoch 5, the resume reruns 4 and 5.
    metrics, ck = str(tmp_path / "m.jsonl"), str(tmp_path / "ck")
    base = ["run", GCN, "--graph", SMALL, "--checkpoint", ck, "--checkpoint-every", "4", "--metrics", metrics]
    assert gnnc_in_process(*base, "--epochs", "6").returncode == 0
    r = gnnc_in_process(*base, "--epochs", "8", "--resume")
    assert r.returncode == 0, r.stderr
    epochs = [json.loads(line)["epoch"] for line in Path(metrics).read_text().splitlines()]
    assert epochs == list(range(8)), epochs


def _npz(path: Path, scale: float = 1.0, train: bool = True) -> str:
    rs = np.random.default_rng(0)
    n = 60
    mask = np.zeros(n, bool)
    mask[:20] = train
    x = np.sign(rs.standard_normal((n, 4))).astype(np.float32) * np.float32(scale)
    np.savez(path, edge_index=rs.integers(0, n, (2, 240)), x=x, y=rs.integers(0, 3, n),
             train_mask=mask, val_mask=~mask, test_mask=~mask)
    return str(path)


def test_a_loss_that_becomes_nan_stops_the_run_naming_the_epoch(tmp_path: Path) -> None:
    # in this process: exit 1 from a process is the killed and the hung rank's (real processes above)
    r = gnnc_in_process("run", GCN, "--graph", _npz(tmp_path / "huge.npz", scale=3e38), "--epochs", "5")
    assert r.returncode == 1, r.stderr
    assert "training stopped at epoch 0: the loss is nan" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_empty_training_mask_is_refused_before_training(tmp_path: Path) -> None:
    r = gnnc_in_process("run", GCN, "--graph", _npz(tmp_path / "untrained.npz", train=False), "--epochs", "5", "--json")
    assert r.returncode == 2, r.stderr
    assert "no training vertex" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""  # no report with a loss of -0.0


def test_nproc_0_is_named_as_nproc() -> None:
    r = gnnc_in_process("run", GCN, "--graph", SMALL, "--nproc", "0")
    assert r.returncode == 2 and "--nproc must be at least 1, not 0" in r.stderr, r.stderr
    assert "--workers" not in r.stderr


def test_a_hung_rank_is_named_within_the_timeout(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, "--timeout", "5")
    try:
        workers = _workers(proc.pid)
        t0 = time.monotonic()
        os.kill(workers[1], signal.SIGSTOP)  # one of the two ranks (process order need not be rank order)
        _, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - t0
        assert proc.returncode == 1, err
        # the headline blames the stopped rank: the one still running when the other gave up waiting for it
        m = re.search(r"worker rank (\d) of 2 failed: hung: rank (\d) gave up waiting for it", err)
        assert m is not None and m.group(1) != m.group(2), err
        assert f"ranks [{m.group(1)}] were still running and were terminated" in err, err
        assert f"rank {m.group(2)}: exit status 1" in err, err
        assert elapsed < 5 + 25, f"{elapsed:.1f} s from SIGSTOP to the end of the run"
        assert not [pid for pid in workers if _alive(pid)], "a worker outlived the launcher"
    finally:
        _stop(proc)
