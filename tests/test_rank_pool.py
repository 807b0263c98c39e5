"""The session's pool of gloo ranks (tests/_rank_pool.py): jobs run on the same ranks, see what a fresh rank
sees, and a job that breaks a rank or the group, leaves a thread behind or hangs retires the ranks: the next job
gets new ones."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from _rank_pool import _POOLS, RankPool, RankPoolError, pool_pids, pooled_launch


def _state(cfg) -> dict:
    """What a rank's job may change and the next one must not see changed."""
    from gnnc.runtime.kernels import native

    return {"pid": os.getpid(), "rank": cfg.rank, "dtype": str(torch.get_default_dtype()),
            "threads": torch.get_num_threads(), "native_off": native.turned_off(), "cwd": os.getcwd(),
            "env": os.environ.get("GNNC_POOL_TEST"), "grad": torch.is_grad_enabled(),
            "autocast": torch.is_autocast_enabled("cpu"), "precision": torch.get_float32_matmul_precision(),
            "draws": [torch.rand(2), float(np.random.rand()), random.random()],
            "sum": float(_all_reduce(cfg.rank + 1))}


def _all_reduce(value: float) -> torch.Tensor:
    t = torch.tensor([value])
    dist.all_reduce(t)
    return t


def _change_everything(cfg, where: str) -> dict:
    """A job that changes every piece of state the pool puts back (and reads GNNC_NATIVE once changed)."""
    from gnnc.runtime.kernels import native

    os.environ["GNNC_NATIVE"] = "0"
    os.environ["GNNC_POOL_TEST"] = "changed"
    assert native.turned_off()
    os.chdir(where)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("medium")
    torch.set_grad_enabled(False)
    torch.set_autocast_enabled("cpu", True)
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    return _state(cfg)


def _raise_on_rank_1(cfg) -> None:
    if cfg.rank == 1:
        raise ValueError("rank 1's job failed")
    _all_reduce(1.0)  # rank 0 waits for a peer that is gone


def _die(cfg) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as a segfault or the OOM killer would end it: no report


def _leave_a_thread(cfg) -> str:
    thread = threading.Thread(target=threading.Event().wait, name="left-behind", daemon=True)
    thread.start()
    return thread.name


def _hang(cfg) -> None:
    time.sleep(600)  # no CPU time: a stopped or deadlocked rank


def test_jobs_reuse_the_ranks_and_each_sees_a_fresh_rank(tmp_path) -> None:
    first = pooled_launch(_state, 2)
    changed = pooled_launch(_change_everything, 2, str(tmp_path))
    again = pooled_launch(_state, 2)
    assert [s["pid"] for s in first] == [s["pid"] for s in changed] == [s["pid"] for s in again] == _POOLS[2].pids
    assert [s["rank"] for s in again] == [0, 1] and again[0]["sum"] == 3.0
    assert changed[0]["dtype"] == "torch.float64" and changed[0]["env"] == "changed" and changed[0]["native_off"]
    for fresh, now in zip(first, again):
        draws = (fresh.pop("draws"), now.pop("draws"))
        assert torch.equal(draws[0][0], draws[1][0]) and draws[0][1:] == draws[1][1:]  # the random states too
        assert now == fresh


def test_a_failed_job_is_an_error_and_the_next_job_gets_new_ranks() -> None:
    pooled_launch(_state, 2)
    old = _POOLS[2]
    with pytest.raises(RankPoolError, match="rank 1: ValueError: rank 1's job failed") as failed:
        pooled_launch(_raise_on_rank_1, 2)
    # rank 0, waiting in a collective for rank 1, was stopped after the grace period
    assert "pooled job _raise_on_rank_1 on 2 ranks failed" in str(failed.value) and "rank 0: " in str(failed.value)
    assert old.retired and not any(p.is_alive() for p in old.procs)
    assert pooled_launch(_state, 2)[1]["rank"] == 1
    assert _POOLS[2] is not old and set(_POOLS[2].pids).isdisjoint(old.pids)


# one rank is enough for what the pool watches in each rank: a rank's start costs ~4 CPU-s
@pytest.mark.parametrize("job, says", [(_die, "rank 0: exited with status -9 without a report"),
                                       (_hang, "rank 0: no CPU time used for")])
def test_a_rank_that_dies_or_hangs_is_an_error_and_retires_the_ranks(job, says) -> None:
    pool = RankPool(1)
    try:
        t0 = time.monotonic()
        with pytest.raises(RankPoolError, match=says):
            pool.run(job, (), 2)
        assert time.monotonic() - t0 < 120 and pool.retired and not any(p.is_alive() for p in pool.procs)
    finally:
        pool.close()


def test_a_job_that_leaves_a_thread_returns_its_result_and_retires_the_ranks() -> None:
    pool = RankPool(1)
    try:
        assert pool.run(_leave_a_thread, (), 60) == ["left-behind"]
        assert pool.retired and not any(p.is_alive() for p in pool.procs)
    finally:
        pool.close()


def test_the_pools_ranks_are_not_children_a_launch_left_behind() -> None:
    """test_launch checks that a launch leaves no child of this process: the pool's ranks, kept for the next job,
    are not the launch's."""
    from test_launch import _children

    pooled_launch(_state, 2)
    assert set(_POOLS[2].pids) <= pool_pids() and not set(_children(os.getpid())) & pool_pids()
