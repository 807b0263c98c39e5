"""The launcher: results come back by rank, failures stop every worker with one clear message.

Faults are real: a worker raises, SIGKILLs itself while its peers sit in a
collective, hangs before a collective, or its launcher is SIGKILLed. After
each, every worker pid must be gone (no orphans, no zombies) and no child of
this test process may remain. torchrun jobs (one node, and two nodes on
loopback) are joined through `join_torchrun`.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from _rank_pool import pool_pids
from conftest import process_alive as _alive
from gnnc.errors import GnncError
from gnnc.runtime.launch import (DistConfig, LaunchError, PortInUseError, WorkerFailedError,
                                 launch)

FAILURE_DEADLINE_S = 60.0


# --- helpers -----------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (read from /proc), except multiprocessing's resource tracker and the
    session's pool of ranks (tests/_rank_pool.py: other tests' jobs, kept for the next).

    The spawn start method starts one resource tracker per launcher process; it
    is not a worker and exits with the launcher.
    """
    pool = pool_pids()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != pid:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"multiprocessing.resource_tracker" not in cmdline and int(entry.name) not in pool:
            out.append(int(entry.name))
    return out


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait, without polling, until a process that is not our child exits (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_no_orphans(err: WorkerFailedError) -> None:
    assert all(code != 0 for code in err.exit_codes.values()), f"a rank exited 0: {err.exit_codes}"
    assert not [pid for pid in err.pids.values() if _alive(pid)], "a worker outlived the launcher"
    assert _children(os.getpid()) == [], "the launcher left child processes"


# --- worker functions (module level: spawned workers import them by name) ----------------------


def _sum_ranks(cfg: DistConfig, scale: float) -> tuple[int, int, float, int]:
    t = torch.tensor([float(cfg.rank)])
    dist.all_reduce(t)
    return cfg.rank, cfg.world_size, t.item() * scale, os.getpid()


def _raise_on_rank_1(cfg: DistConfig) -> None:
    dist.barrier()
    if cfg.rank == 1:
        raise ValueError("shard 7 has no training vertices")
    dist.all_reduce(torch.ones(1000))  # blocked here when rank 1 fails


def _sigkill_rank_2_mid_collective(cfg: DistConfig, stamp: str) -> None:
    dist.barrier()
    if cfg.rank == 2:
        dist.all_reduce(torch.ones(1 << 16), async_op=True)  # the collective is under way
        Path(stamp).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1 << 16))


def _raise_with_an_operation_in_flight(cfg: DistConfig) -> None:
    dist.barrier()
    if cfg.rank == 1:
        dist.all_reduce(torch.ones(10), async_op=True)  # rank 0 never joins this one
        raise ValueError("failed while an all_reduce was in flight")
    dist.recv(torch.zeros(1), src=1)  # never sent


def _hang_on_rank_1(cfg: DistConfig) -> None:
    dist.barrier()
    if cfg.rank == 1:
        threading.Event().wait()  # never enters the collective below
    dist.all_reduce(torch.ones(10))


def _print_pid_then_block(cfg: DistConfig) -> None:
    dist.barrier()
    os.write(1, f"READY {os.getpid()}\n".encode())  # one write: lines of two workers never interleave
    threading.Event().wait()


# --- local launches ----------------------------------------------------------------------------


def test_launch_returns_every_rank_result_in_rank_order() -> None:
    results = launch(_sum_ranks, 2, 0.5, timeout_s=30)
    assert [r[:3] for r in results] == [(0, 2, 0.5), (1, 2, 0.5)]  # (0 + 1) * 0.5
    pids = [r[3] for r in results]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert not [p for p in pids if _alive(p)]
    assert _children(os.getpid()) == []


def test_a_rank_that_raises_is_named_with_its_exception() -> None:
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        launch(_raise_on_rank_1, 2, timeout_s=30)
    elapsed = time.monotonic() - t0
    err = info.value
    assert isinstance(err, GnncError)
    assert err.rank == 1
    assert str(err).startswith("worker rank 1 of 2 failed: ValueError: shard 7 has no training vertices")
    assert elapsed < FAILURE_DEADLINE_S
    _assert_no_orphans(err)


def test_sigkill_mid_collective_stops_every_rank(tmp_path: Path) -> None:
    stamp = tmp_path / "killed_at"
    with pytest.raises(WorkerFailedError) as info:
        launch(_sigkill_rank_2_mid_collective, 4, str(stamp), timeout_s=30)
    after_kill = time.time() - float(stamp.read_text())
    err = info.value
    assert err.rank == 2 and err.cause == "killed by SIGKILL", str(err)
    assert err.exit_codes[2] == -signal.SIGKILL
    assert after_kill < FAILURE_DEADLINE_S, f"{after_kill:.1f} s from SIGKILL to the launcher's error"
    _assert_no_orphans(err)
    print(f"SIGKILL -> every worker exited and the launcher raised: {after_kill:.2f} s")


def test_a_rank_that_raises_with_work_in_flight_exits_at_once() -> None:
    # A graceful teardown would wait for the pending all_reduce until the timeout.
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        launch(_raise_with_an_operation_in_flight, 2, timeout_s=40)
    elapsed = time.monotonic() - t0
    assert info.value.rank == 1 and "in flight" in info.value.cause
    assert elapsed < 30, f"took {elapsed:.1f} s: the failed rank waited for the process-group timeout"
    _assert_no_orphans(info.value)


def test_a_hung_rank_ends_in_a_timeout_not_a_hang() -> None:
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        launch(_hang_on_rank_1, 3, timeout_s=3)
    elapsed = time.monotonic() - t0
    err = info.value
    assert "Timed out" in err.cause and "ranks [1] were still running" in err.cause, str(err)
    # The headline names the rank that hung, not a healthy rank that timed out waiting for it.
    assert err.rank == 1 and err.cause.startswith("hung"), str(err)
    assert err.exit_code == 1
    assert elapsed < FAILURE_DEADLINE_S
    _assert_no_orphans(err)


def test_port_in_use_is_reported_before_any_worker_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            launch(_sum_ranks, 2, 1.0, port=port)
        assert time.monotonic() - t0 < 5.0
    assert _children(os.getpid()) == []


def test_an_unpicklable_worker_is_refused_up_front() -> None:
    with pytest.raises(LaunchError, match="picklable"):
        launch(lambda cfg: cfg.rank, 2)
    assert _children(os.getpid()) == []


def test_a_killed_launcher_takes_its_workers_along(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_launch import _print_pid_then_block
        from gnnc.runtime.launch import launch
        if __name__ == "__main__":
            launch(_print_pid_then_block, 2, timeout_s=30)
    """))
    proc = subprocess.Popen([sys.executable, str(script), str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = []
        assert proc.stdout is not None
        for line in proc.stdout:  # blocks until each worker has started and printed
            if line.startswith("READY "):
                pids.append(int(line.split()[1]))
            if len(pids) == 2:
                break
        proc.kill()
        proc.wait()
        assert all(_wait_gone(pid, 30.0) for pid in pids), "a worker outlived its SIGKILLed launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- configuration from the environment --------------------------------------------------------


def test_config_reads_torchrun_variables_once() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29511", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    cfg = DistConfig.from_env(env, timeout_s=7)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.master_addr, cfg.master_port) == \
        (3, 4, 1, "127.0.0.1", 29511)
    assert cfg.store_hosted and cfg.backend == "gloo" and cfg.timeout.total_seconds() == 7
    assert cfg.store_prefix == "/worker/attempt_0"  # torchrun's agent store outlives restarts
    assert DistConfig.from_env(dict(env, TORCHELASTIC_RESTART_COUNT="2")).store_prefix == \
        "/worker/attempt_2"
    assert DistConfig.from_env(env, device="cuda").backend == "nccl"


@pytest.mark.parametrize("env,message", [
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK is not set"),
    ({"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "WORLD_SIZE='two'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "outside a world of size 2"),
])
def test_config_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        DistConfig.from_env(env)


# --- torchrun ----------------------------------------------------------------------------------

_TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from gnnc.runtime.launch import join_torchrun

    def work(cfg, out_dir):
        dist.barrier()
        if os.environ.get("FAIL_RANK") == str(cfg.rank):
            raise ValueError(f"rank {cfg.rank} fails on purpose")
        t = torch.tensor([float(cfg.rank)])
        dist.all_reduce(t)
        return {"rank": cfg.rank, "world_size": cfg.world_size, "sum": t.item(),
                "store_hosted": cfg.store_hosted, "dist_world": dist.get_world_size()}

    if __name__ == "__main__":
        out = join_torchrun(work, sys.argv[1], timeout_s=60)
        with open(os.path.join(sys.argv[1], f"rank{out['rank']}.json"), "w") as fh:
            json.dump(out, fh)
""")


def _torchrun(script: Path, out: Path, nnodes: int, port: int, **extra_env: str) -> subprocess.Popen:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **extra_env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-id", "gnnc-test", "--local-addr", "127.0.0.1", "--max-restarts", "0",
           str(script), str(out)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_join_a_torchrun_job_on_one_node(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(_TORCHRUN_SCRIPT)
    proc = _torchrun(script, tmp_path, 1, _free_port())
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    for r, res in enumerate(_results(tmp_path, 2)):
        assert res == {"rank": r, "world_size": 2, "sum": 1.0, "store_hosted": True, "dist_world": 2}


def test_a_failing_rank_stops_a_torchrun_job(tmp_path: Path) -> None:
    # torchrun's agent supervises joined jobs; join_torchrun records the exception for its summary.
    script = tmp_path / "job.py"
    script.write_text(_TORCHRUN_SCRIPT)
    t0 = time.monotonic()
    proc = _torchrun(script, tmp_path, 1, _free_port(), FAIL_RANK="1")
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < FAILURE_DEADLINE_S
    assert "ValueError: rank 1 fails on purpose" in log
    assert not list(tmp_path.glob("rank*.json"))  # the surviving rank did not finish either


def test_two_torchrun_nodes_on_loopback_make_one_world_of_four(tmp_path: Path) -> None:
    # Two agents meet at one c10d rendezvous on 127.0.0.1; measured about 7 s on
    # a 2-core machine, so it runs with the fast tests.
    script = tmp_path / "job.py"
    script.write_text(_TORCHRUN_SCRIPT)
    port = _free_port()
    nodes = [_torchrun(script, tmp_path, 2, port) for _ in range(2)]
    logs = [n.communicate(timeout=180)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(logs)
    results = _results(tmp_path, 4)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["dist_world"] == 4 and r["sum"] == 6.0 for r in results)
