"""Inputs and launches a hostile user tried (issue 40, item 3): unbounded text inputs, every rank stopped,
sampled runs past the memory check, and the launcher's refusals of a bad environment."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from conftest import EXAMPLES, ROOT, process_alive

from gnnc import cli
from gnnc.cluster import load_profile
from gnnc.errors import GnncError
from gnnc.files import read_text_input
from gnnc.model_file import load_model
from gnnc.runtime.checkpoint import CheckpointError, DirectoryLock
from gnnc.runtime.launch import DistConfig, LaunchError, WorkerFailedError, launch


def gnnc(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
         memory_limit: int | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; `memory_limit` bounds its address space, so a command that reads without end fails fast
    (MemoryError) instead of taking the machine's memory."""
    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=None if env is None else {**os.environ, **env}, preexec_fn=limit)


# --- unbounded text inputs ---------------------------------------------------------------------------


def test_check_dev_zero_is_refused_at_once() -> None:
    # Before: read /dev/zero until the OOM killer (22.5 GB); here until the 2 GiB limit, then a traceback.
    r = gnnc("check", "/dev/zero", timeout=60, memory_limit=2 << 30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: /dev/zero: is a device; gnnc reads only regular files"


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Bound a call that would block forever without the fix (SIGALRM raises in the main thread)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_model_file_fifo_directory_and_size(tmp_path) -> None:
    fifo = tmp_path / "model.gnn"
    os.mkfifo(fifo)
    # Before: open() of a FIFO with no writer blocked forever.
    with alarm(10), pytest.raises(GnncError, match=r"model.gnn: is a FIFO; gnnc reads only regular files"):
        load_model(fifo)
    with pytest.raises(GnncError, match=r": is a directory"):
        load_model(tmp_path)
    big = tmp_path / "big.gnn"
    big.write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(GnncError, match=r"big.gnn: larger than 16 MiB"):
        load_model(big)
    big.write_bytes(b"\xff\xfe")
    with pytest.raises(GnncError, match=r"big.gnn: not UTF-8 text"):
        load_model(big)


def test_cluster_profile_uses_the_same_bounded_reader(tmp_path) -> None:
    fifo = tmp_path / "cluster.json"
    os.mkfifo(fifo)
    with alarm(10), pytest.raises(GnncError, match=r"cluster profile .*cluster.json: is a FIFO"):
        load_profile(fifo)
    big = tmp_path / "c.json"
    big.write_bytes(b" " * 100)
    with pytest.raises(GnncError, match=r"larger than 0 MiB"):
        read_text_input(big, str(big), limit=99)
    assert read_text_input(big, str(big), limit=100) == " " * 100


# --- every rank stopped --------------------------------------------------------------------------


def _stop_every_rank(cfg: DistConfig) -> None:
    dist.barrier()
    os.kill(os.getpid(), signal.SIGSTOP)  # as `kill -STOP` of every worker: no collective is left to time out
    dist.all_reduce(torch.ones(1))


def test_every_rank_stopped_is_a_hang_the_launcher_reports() -> None:
    # Before: the launcher waited forever (the alarm ends the test; launch's cleanup stops the workers).
    t0 = time.monotonic()
    with alarm(45), pytest.raises(WorkerFailedError) as info:
        launch(_stop_every_rank, 2, timeout_s=2)
    err = info.value
    assert time.monotonic() - t0 < 60
    assert err.exit_code == 1 and err.cause.startswith("hung"), str(err)
    lines = str(err).splitlines()
    assert lines[0].startswith("worker ranks [0, 1] of 2 hung: none made progress"), str(err)
    assert lines[1:] == [f"  rank {r}: pid {err.pids[r]}, stopped" for r in (0, 1)]
    assert not [pid for pid in err.pids.values() if process_alive(pid)], "a worker outlived the launcher"


# --- lock files ----------------------------------------------------------------------------------


def test_a_run_removes_its_checkpoint_lock_files(tmp_path) -> None:
    # Before: a refused 4-rank run (`--resume` with nothing to resume) left DIR/lock-rank-0..3 behind.
    locks = [DirectoryLock(tmp_path / "ck", rank) for rank in range(4)]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [f"lock-rank-{r}" for r in range(4)]
    with pytest.raises(CheckpointError, match="is in use by another run"):
        DirectoryLock(tmp_path / "ck", 0)  # held: a second job stops, naming the holder
    for lock in locks:
        lock.release()
    assert list((tmp_path / "ck").iterdir()) == []
    # a killed run's file is taken over, and removed in turn
    (tmp_path / "ck" / "lock-rank-0").write_text("{}")
    DirectoryLock(tmp_path / "ck", 0).release()
    assert list((tmp_path / "ck").iterdir()) == []


def test_a_lock_on_a_removed_file_is_taken_again(tmp_path, monkeypatch) -> None:
    """The holder removes its file as it releases: a job that opened that file just before takes its lock on
    the file at the path now, not on the removed one (which would let two jobs hold 'the' lock)."""
    first = DirectoryLock(tmp_path, 0)
    stale = os.open(tmp_path / "lock-rank-0", os.O_RDWR)  # opened before the release, locked after it
    first.release()
    real_open = os.open
    calls = []

    def open_stale_first(path, flags, mode=0o777, **kw):
        calls.append(path)
        return stale if len(calls) == 1 else real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", open_stale_first)
    second = DirectoryLock(tmp_path, 0)
    monkeypatch.undo()
    assert len(calls) == 2 and (tmp_path / "lock-rank-0").exists()
    with pytest.raises(CheckpointError, match="is in use by another run"):
        DirectoryLock(tmp_path, 0)
    second.release()


# --- a torchrun rank's environment and signals -----------------------------------------------------


@pytest.mark.parametrize("env,message", [
    ({"MASTER_PORT": "99999"}, r"environment variable MASTER_PORT=99999 is not a TCP port \(1 to 65535\)"),
    ({"MASTER_PORT": "0"}, r"MASTER_PORT=0 is not a TCP port"),
    ({"MASTER_ADDR": "no-such-host.invalid"},
     r"environment variable MASTER_ADDR='no-such-host.invalid': cannot resolve it \("),
])
def test_a_bad_rendezvous_address_is_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    # Before: port 99999 became 34463 (mod 2**16) and the rank waited there; the name failed with a traceback.
    base = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(LaunchError, match=message) as info:
        DistConfig.from_env({**base, **env})
    assert info.value.exit_code == 2


_RANK_SCRIPT = """
import sys
from gnnc.runtime.launch import join_torchrun, stop_on_signals

def work(cfg):
    return cfg.rank

if __name__ == "__main__":
    with stop_on_signals():  # as `gnnc run` is
        print("READY", flush=True)
        join_torchrun(work, timeout_s=120)
"""


@pytest.mark.parametrize("rank", [0, 1], ids=["serving-waits-for-peer", "client-waits-for-server"])
def test_sigterm_stops_a_rank_waiting_at_the_rendezvous_at_once(tmp_path, rank: int) -> None:
    # Before: honoured only when the store's 120 s wait ended, exit 1 with two tracebacks.
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    port = _free_port()
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "READY\n"
        time.sleep(3)  # torch.distributed imported, the rank at the rendezvous: serving the store, or dialling it
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert time.monotonic() - t0 < 10
        assert err.strip() == f"gnnc: rank {rank} of 2 stopped by SIGTERM", err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nproc_beyond_the_graph_names_the_flag(capsys) -> None:
    # Before: "parts (10000) exceeds the number of vertices (2708)", naming no flag.
    code = cli.main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--nproc", "10000",
                     "--epochs", "1"])
    assert code == 2
    assert capsys.readouterr().err == "error: --nproc 10000: more workers than the graph's 2708 vertices\n"
