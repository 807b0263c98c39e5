"""A pool of gloo ranks kept for the whole test session (per pytest process: each xdist worker has its own).

`pooled_launch(fn, nproc, *args)` returns what `gnnc.runtime.launch.launch(fn, nproc, *args)` returns, but runs
`fn(cfg, *args)` on ranks started once and reused: a spawned rank pays ~3-4 CPU-s (torch, sympy, gnnc) before
it does anything, more than most of the one-step jobs the tests give it. Use it for jobs that succeed and whose
point is what the ranks compute; tests of what a launch does (start-up, failures, signals, exit codes, peak memory,
the environment a rank starts with) keep `launch`.

Between jobs each rank puts back what a fresh rank starts with (`_Fresh`: environment, working directory,
default dtype, threads, random states, autocast, grad mode, GNNC_NATIVE's reading) and all ranks check that
they finished the same job over the process group. A job that fails, a rank that dies or leaves a thread
running, a job no rank makes progress on (the stall rule of `launch`) or a broken group retires the ranks: the
next job starts new ones.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import threading
import time
from typing import Any, Callable, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from gnnc.runtime.kernels import native
from gnnc.runtime.launch import (LOOPBACK, RESULT_TYPES, STALL_MARGIN_S, STALL_POLL_S, DistConfig, _describe,
                                 _die_with_launcher, _exit_after_failure, _exit_now, _loopback_interface,
                                 _cpu_ticks, _serve_store, _terminate, check_plain, init_distributed, launch)

T = TypeVar("T")

# The process group's timeout: the longest a rank waits in a collective for a peer still computing. Hangs are
# caught sooner by the stall rule (every rank without CPU time for the job's timeout_s), and a failed rank is
# reported at once.
GROUP_TIMEOUT_S = 300.0
GRACE_S = 2.0  # after a rank's failure, how long the others may take to report theirs
# CPU ticks (1/100 s) per STALL_POLL_S below which a rank is idle: a rank waiting in a collective for a peer that
# never joined the group's connections uses ~0.5 a second (gloo's loop thread), one computing under a load of 20
# on 2 cores ~10
BUSY_TICKS = 2


class RankPoolError(RuntimeError):
    """A pooled job failed: the ranks' reports (the pool's ranks are retired)."""


class _Fresh:
    """What a freshly started rank holds, taken once the process group is up, put back after every job."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.dtype = torch.get_default_dtype()
        self.threads = torch.get_num_threads()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.rng = (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
        self.native_timeout_s = native._State.build_timeout_s
        self.affinity = os.sched_getaffinity(0)
        self.live = set(threading.enumerate())

    def restore(self) -> list[str]:
        """Put the state back; returns what cannot be put back (threads the job left running)."""
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        torch.set_default_dtype(self.dtype)
        torch.set_num_threads(self.threads)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.set_grad_enabled(True)
        if torch.is_autocast_enabled("cpu"):
            torch.set_autocast_enabled("cpu", False)
        torch.clear_autocast_cache()
        torch.random.set_rng_state(self.rng[0])
        np.random.set_state(self.rng[1])
        random.setstate(self.rng[2])
        native._State.off = None  # GNNC_NATIVE is read once per process: read it again, as a new rank would
        native._State.build_timeout_s = self.native_timeout_s
        os.sched_setaffinity(0, self.affinity)
        left = [t for t in threading.enumerate() if t not in self.live]
        for t in left:
            t.join(timeout=1.0)
        return [t.name for t in left if t.is_alive()]


def _same_job_everywhere(job: int, world: int) -> None:
    """Every rank finished job `job` and the group still carries a collective (a rank that skipped or added one
    would pair it with this)."""
    got = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(got, torch.tensor([job], dtype=torch.int64))
    if any(int(g[0]) != job for g in got):
        raise RuntimeError(f"the ranks are at different jobs after job {job}: {[int(g[0]) for g in got]}")


def _rank_main(local_rank: int, base: DistConfig, jobs: Any, results: Any, launcher_pid: int) -> None:
    """A pool rank: join the group, then run the jobs sent on `jobs` until None, each answered on `results`."""
    _die_with_launcher(launcher_pid)
    cfg = dataclasses.replace(base, rank=local_rank, local_rank=local_rank)
    try:
        native.bound_builds(cfg.timeout_s)
        init_distributed(cfg)
        fresh = _Fresh()
    except BaseException as exc:
        results.put((-1, local_rank, "failure", _describe(exc)))
        _exit_after_failure(exc)
    while (message := jobs.get()) is not None:
        job, payload = message
        try:
            fn, args = pickle.loads(payload)
            result = fn(cfg, *args)
            check_plain(result)
            buf = io.BytesIO()
            torch.save(result, buf)
            left = fresh.restore()
            _same_job_everywhere(job, cfg.world_size)
        except BaseException as exc:
            results.put((job, local_rank, "failure", _describe(exc)))
            _exit_after_failure(exc)
        results.put((job, local_rank, "result", (buf.getvalue(), left)))
        if left:
            _exit_now(0)  # threads cannot be stopped from outside: the pool starts new ranks for the next job
    _exit_now(0)


class RankPool:
    """`nproc` gloo ranks on this machine that run one job after another (see the module's docstring)."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.store = _serve_store(None, GROUP_TIMEOUT_S)
        base = DistConfig(rank=0, world_size=nproc, local_rank=0, master_addr=LOOPBACK, master_port=self.store.port,
                          device="cpu", timeout_s=GROUP_TIMEOUT_S, store_hosted=True,
                          gloo_ifname=_loopback_interface())
        ctx = multiprocessing.get_context("spawn")
        self.jobs = [ctx.SimpleQueue() for _ in range(nproc)]
        self.results = ctx.SimpleQueue()
        self.procs = [ctx.Process(target=_rank_main, args=(rank, base, self.jobs[rank], self.results, os.getpid()),
                                  name=f"gnnc-pool-rank-{rank}") for rank in range(nproc)]
        for p in self.procs:
            p.start()
        self.done = 0  # jobs run
        self.retired = False

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def run(self, fn: Callable[..., T], args: tuple, timeout_s: float) -> list[T]:
        """`fn(cfg, *args)` on every rank; the results by rank. Raises RankPoolError (and retires the ranks) when
        a rank fails or dies, or when no rank still at the job was busy (`_Busy`) for `timeout_s` + STALL_MARGIN_S
        (a hang)."""
        payload = pickle.dumps((fn, args))  # before anything is sent: an unpicklable job leaves the pool as it is
        self.done += 1
        job = self.done
        for q in self.jobs:
            q.put((job, payload))
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        left: dict[int, list[str]] = {}
        first_failure: float | None = None
        watch = _Busy(self.pids)
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs)}
        while len(results) + len(failures) < self.nproc:
            if first_failure is not None and time.monotonic() > first_failure + GRACE_S:
                break
            ready = multiprocessing.connection.wait([self.results._reader, *sentinels], STALL_POLL_S)
            if self.results._reader in ready:
                got_job, rank, kind, value = self.results.get()
                if kind == "failure":
                    failures[rank] = _report(value)
                    first_failure = first_failure or time.monotonic()
                elif got_job == job:
                    data, left[rank] = value
                    with torch.serialization.safe_globals(list(RESULT_TYPES)):
                        results[rank] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                continue  # read every report before looking at the processes that sent them
            for sentinel in [s for s in ready if s in sentinels]:
                rank = sentinels.pop(sentinel)
                self.procs[rank].join()
                if rank not in results and rank not in failures:
                    failures[rank] = f"exited with status {self.procs[rank].exitcode} without a report"
                    first_failure = first_failure or time.monotonic()
            silent = watch.silent_for({r for r in range(self.nproc) if r not in results and r not in failures})
            if first_failure is None and silent >= timeout_s + STALL_MARGIN_S:
                waiting = sorted(set(range(self.nproc)) - set(results))
                failures.update({r: f"no CPU time used for {silent:.0f} s (hung)" for r in waiting})
                break
        if failures or len(results) < self.nproc or any(left.values()):
            self.close()
        if failures or len(results) < self.nproc:
            missing = {r: "stopped after another rank's failure" for r in range(self.nproc)
                       if r not in results and r not in failures}
            raise RankPoolError(f"pooled job {getattr(fn, '__qualname__', fn)} on {self.nproc} ranks failed:\n" +
                                "\n".join(f"rank {r}: {text}" for r, text in sorted({**failures, **missing}.items())))
        return [results[rank] for rank in range(self.nproc)]

    def close(self) -> None:
        """Stop the ranks (a job in progress too) and the rendezvous store."""
        if self.retired:
            return
        self.retired = True
        for q, p in zip(self.jobs, self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    q.put(None)
        deadline = time.monotonic() + GRACE_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        _terminate([p for p in self.procs if p.is_alive()])
        del self.store


class _Busy:
    """When each rank last used BUSY_TICKS of CPU time within a poll (its own or its children's, per /proc)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        now = time.monotonic()
        self.ticks = [_cpu_ticks(pid) or 0 for pid in pids]
        self.last_busy = [now] * len(pids)
        self.sampled = now

    def silent_for(self, ranks: set[int]) -> float:
        """Seconds since any of `ranks` was last busy (sampled every STALL_POLL_S at most)."""
        now = time.monotonic()
        if now - self.sampled < STALL_POLL_S:
            return now - max(self.last_busy[r] for r in ranks) if ranks else 0.0
        self.sampled = now
        for rank in ranks:
            ticks = _cpu_ticks(self.pids[rank])
            if ticks is not None and ticks - self.ticks[rank] >= BUSY_TICKS:
                self.last_busy[rank] = now
            if ticks is not None:
                self.ticks[rank] = ticks
        return now - max(self.last_busy[r] for r in ranks) if ranks else 0.0


def _report(described: dict[str, Any]) -> str:
    return f"{described['type']}: {described['message']}\n{described['traceback']}"


_POOLS: dict[int, RankPool] = {}


def pooled_launch(fn: Callable[..., T], nproc: int, *args: Any, timeout_s: float = 60.0) -> list[T]:
    """`launch(fn, nproc, *args, timeout_s=timeout_s)` on this session's pool of `nproc` ranks (started on first
    use, restarted after a failure). GNNC_TEST_POOL=0 runs it through `launch` instead (new ranks per job)."""
    if os.environ.get("GNNC_TEST_POOL") == "0":
        return launch(fn, nproc, *args, timeout_s=timeout_s)
    pool = _POOLS.get(nproc)
    if pool is None or pool.retired:
        pool = _POOLS[nproc] = RankPool(nproc)
    return pool.run(fn, args, timeout_s)


def pool_pids() -> set[int]:
    """The ranks of this process's pools (children of this process that outlive the tests that started them)."""
    return {pid for pool in _POOLS.values() if not pool.retired for pid in pool.pids}


def close_pools() -> None:
    """Stop every pool of this process (at the session's end)."""
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


atexit.register(close_pools)  # after a session that did not reach pytest_sessionfinish, too
