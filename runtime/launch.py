"""Start gnnc's workers on this machine, or join a torchrun job, with torch.distributed ready.

Why this module exists: `gnnc run` starts one process per worker on this
machine (gloo on CPU, NCCL on CUDA) or joins a job that torchrun started on
several machines, and a worker that fails must stop every worker with one
clear message, never a hang. The variables a launcher sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) are read
in exactly one place, `DistConfig.from_env`; the rest of the runtime receives
a `DistConfig`.

Why a small supervisor rather than torch's elastic agent for local runs:
measured with torch 2.13 on this machine (gloo, 2 CPUs),
`elastic_launch(LaunchConfig(max_restarts=0, ...), fn)` stops every worker
within about 2 s of a failure, but its `ChildFailedError` carries only the
first failed process its poll happens to find. When rank 1 raised (or was
SIGKILLed) and rank 0 died a moment later of gloo's "Connection closed by
peer", the agent blamed rank 0 in 3 of 3 runs with the fork start method and
in 2 of 3 SIGKILL runs with 4 workers, and it does not expose the exit codes
of the workers it terminated. The supervisor below starts the processes with
`torch.multiprocessing`, observes every exit code, lets each worker report its
own exception, and picks the root cause by explicit rules (`_root_cause`).
Jobs across machines still use torchrun and its agent; `join_torchrun` joins
them.

Each local worker also asks Linux to SIGKILL it when the launcher dies
(PR_SET_PDEATHSIG), so a launcher killed by the user leaves no orphans, and
every process group gets a finite timeout so no collective waits forever.
That timeout needs a rank left to wait: when every rank is stopped or frozen
(`kill -STOP`, a cgroup freezer), the launcher sees that none has used CPU
time for the timeout (plus STALL_MARGIN_S), stops them all and names them.
SIGTERM and SIGHUP (what `timeout`, Slurm, `docker stop` and a closed
terminal send) are turned into `StoppedBySignal` while a launch runs, so they
unwind like Ctrl-C: the workers are stopped and temporary files removed.

Nothing listens beyond this machine for a local launch: the rendezvous store
is served on a socket bound to 127.0.0.1 (TCPStore on its own binds every
interface whatever host it is given) and gloo is pinned to the loopback
interface. Under torchrun, a rank that serves the store binds MASTER_ADDR, and
gloo listens on the interface that reaches MASTER_ADDR (gnnc.runtime.netif),
unless GLOO_SOCKET_IFNAME names one.

A worker hands its result back as a file in the launcher's private temporary
directory, written with torch.save and read with `torch.load(weights_only=True)`:
tensors, plain containers and the RunResult a training rank returns (`RESULT_TYPES`,
the one class the reader is allowed to build, from its fields), so even that file is
data, never code.

Exit codes keep one meaning in one process and in N: `WorkerFailedError`
carries 2 only when the root cause is a worker's GnncError (bad input), and 1
for a crash, a killed or a hung worker.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import errno
import io
import json
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch.distributed.elastic.multiprocessing.errors import record

from gnnc.files import atomic_write
from gnnc.errors import GnncError
from gnnc.runtime.kernels import native
from gnnc.runtime.main_guard import check_main_guard
from gnnc.runtime.netif import cannot_resolve, interface_toward
from gnnc.runtime.peers import PeerTable, diagnose, exchange_addresses
from gnnc.runtime.train import RunResult

P = ParamSpec("P")
T = TypeVar("T")

# Long enough for a slow rank to finish loading its shard before the first
# collective, short enough that a hung peer is reported within a minute
# (`gnnc run --timeout` changes it).
DEFAULT_TIMEOUT_S = 60.0
# After the first worker fails, how long the others may take to fail on their
# own (so their own errors are recorded) before they are terminated.
DEFAULT_GRACE_S = 2.0
# How long terminated workers get between SIGTERM and SIGKILL.
STOP_TIMEOUT_S = 5.0
# A rank silent for the timeout is named by a peer whose collective timed out waiting for it; the launcher
# itself calls the job hung only when no rank has used any CPU time for the timeout plus this margin (every
# rank stopped or frozen, so none is left to time out), leaving the peers' own report the first chance.
STALL_MARGIN_S = 5.0
# How often the launcher reads its workers' CPU time while none has failed.
STALL_POLL_S = 1.0
LOOPBACK = "127.0.0.1"
# How often a rank waiting at the rendezvous looks again (and so how soon it honours SIGTERM there).
RENDEZVOUS_POLL_S = 0.1
# Turned into StoppedBySignal while a launch runs; SIGINT is Python's KeyboardInterrupt already.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class LaunchError(GnncError):
    """The workers could not be started or did not finish."""


class PortInUseError(LaunchError):
    """The requested rendezvous port is already taken by another program."""


class RendezvousTimeout(LaunchError):
    """Some ranks never reached the rendezvous store within the timeout: a failed run (exit 1), as a hang is."""

    exit_code = 1


class WorkerFailedError(LaunchError):
    """A worker raised, crashed, hung or was killed; every worker has been stopped.

    `rank` and `cause` name the root cause; `exit_codes` maps every rank to its
    exit status (negative: killed by that signal) and `pids` to its process id.
    `exit_code` is what the command exits with: the root cause's own when it
    is a GnncError (2 for bad input), 1 for anything else.
    """

    def __init__(self, message: str, *, rank: int, cause: str,
                 exit_codes: Mapping[int, int], pids: Mapping[int, int], exit_code: int = 1):
        super().__init__(message)
        self.rank = rank
        self.cause = cause
        self.exit_codes = dict(exit_codes)
        self.pids = dict(pids)
        self.exit_code = exit_code


class StoppedBySignal(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like KeyboardInterrupt (not an Exception, so nothing swallows it).

    The command exits with 128 + `signum`, the shell's convention for a signal.
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _RaiseOnce:
    """A signal handler that raises StoppedBySignal on the first signal and ignores later ones.

    A second SIGTERM (docker stop repeats it) must not interrupt the cleanup
    the first one started.
    """

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: object) -> None:
        if not self.fired:
            self.fired = True
            raise StoppedBySignal(signum)


@contextlib.contextmanager
def stop_on_signals() -> Any:
    """Within this block SIGTERM and SIGHUP raise StoppedBySignal in the main thread.

    Nested blocks share the outer handler; outside the main thread (where
    Python cannot install handlers) the block changes nothing.
    """
    if threading.current_thread() is not threading.main_thread() or \
            any(isinstance(signal.getsignal(s), _RaiseOnce) for s in STOP_SIGNALS):
        yield
        return
    handler = _RaiseOnce()
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def until_signal(body: Callable[[], int]) -> int:
    """`body()` with SIGTERM and SIGHUP unwinding it like Ctrl-C (workers stopped, temporary files removed):
    its exit code, or 128 + N after signal N, said on stderr. What `gnnc run` and `gnnc predict` run in."""
    try:
        with stop_on_signals():
            return body()
    except StoppedBySignal as stop:
        print(str(stop), file=sys.stderr)
        return stop.exit_code


@dataclass(frozen=True)
class DistConfig:
    """Where this worker stands in the job, and how to reach the others.

    `store_hosted` is true when the rendezvous store at master_addr:master_port
    is served by a launcher (ours, or torchrun's agent with
    TORCHELASTIC_USE_AGENT_STORE), so every rank connects as a client; when
    false, rank 0 serves it. `gloo_ifname` pins gloo to one network interface
    (the loopback one for local runs, so nothing leaves this machine).
    `store_prefix` keeps each torchrun restart attempt's keys apart in the
    agent's long-lived store, as torch's env:// rendezvous does.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    device: str = "cpu"
    timeout_s: float = DEFAULT_TIMEOUT_S
    store_hosted: bool = False
    gloo_ifname: str | None = None
    store_prefix: str = ""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise LaunchError(f"device must be 'cpu' or 'cuda', not {self.device!r}")
        if not 0 <= self.rank < self.world_size:
            raise LaunchError(f"rank {self.rank} is outside a world of size {self.world_size}")
        if self.timeout_s <= 0:
            raise LaunchError(f"the process-group timeout must be positive, not {self.timeout_s}")

    @property
    def backend(self) -> str:
        """gloo for CPU tensors, NCCL for CUDA tensors."""
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, device: str = "cpu",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> "DistConfig":
        """Read the variables torchrun (or any env:// launcher) sets; the only place that does."""
        env = os.environ if environ is None else environ

        def need_int(name: str) -> int:
            if name not in env:
                raise LaunchError(
                    f"environment variable {name} is not set: this process was not started by "
                    "torchrun (use `gnnc run --nproc N` to start workers on this machine)")
            try:
                return int(env[name])
            except ValueError:
                raise LaunchError(f"environment variable {name}={env[name]!r} is not an integer") from None

        rank = need_int("RANK")
        world_size = need_int("WORLD_SIZE")
        port = need_int("MASTER_PORT")
        local_rank = need_int("LOCAL_RANK") if "LOCAL_RANK" in env else 0
        hosted = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        attempt = need_int("TORCHELASTIC_RESTART_COUNT") if "TORCHELASTIC_RESTART_COUNT" in env else 0
        if not 1 <= port <= 65535:
            # TCPStore would take it modulo 2**16 and wait on another port
            raise LaunchError(f"environment variable MASTER_PORT={env['MASTER_PORT']} is not a TCP port "
                              "(1 to 65535)")
        if "MASTER_ADDR" not in env:
            raise LaunchError("environment variable MASTER_ADDR is not set: this process was not "
                              "started by torchrun")
        cfg = cls(rank=rank, world_size=world_size, local_rank=local_rank,
                  master_addr=env["MASTER_ADDR"], master_port=port, device=device,
                  timeout_s=timeout_s, store_hosted=hosted,
                  store_prefix=f"/worker/attempt_{attempt}" if hosted else "")
        problem = cannot_resolve(cfg.master_addr)
        if problem is not None:
            # said now: a client rank would otherwise retry the name until the timeout
            raise LaunchError(f"environment variable MASTER_ADDR={cfg.master_addr!r}: cannot resolve it "
                              f"({problem})")
        # gloo listens where the job's peers can reach it: the interface named in GLOO_SOCKET_IFNAME,
        # else the one that carries this machine's traffic to the rendezvous host (gloo's own default,
        # what the hostname resolves to, is loopback on many machines and in every network namespace).
        ifname = env.get("GLOO_SOCKET_IFNAME") or interface_toward(cfg.master_addr, port)
        return dataclasses.replace(cfg, gloo_ifname=ifname)


def started_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a job torchrun (or another env:// launcher) started."""
    env = os.environ if environ is None else environ
    return all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_distributed(cfg: DistConfig, store: dist.Store | None = None) -> None:
    """Create the default process group described by `cfg`.

    `store` is an already connected rendezvous store; without one, a TCPStore
    at master_addr:master_port is served by rank 0 (or by the launcher when
    `cfg.store_hosted`) and joined by the others.
    """
    if dist.is_initialized():
        raise LaunchError("torch.distributed is already initialised in this process")
    if cfg.gloo_ifname is not None:
        # gloo reads the interface only from the environment; set it before the
        # process group exists.
        os.environ["GLOO_SOCKET_IFNAME"] = cfg.gloo_ifname
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise LaunchError(f"rank {cfg.rank}: the run asks for CUDA but this machine has no usable GPU")
        if cfg.local_rank >= torch.cuda.device_count():
            raise LaunchError(f"rank {cfg.rank}: local rank {cfg.local_rank} has no GPU of its own (this machine "
                              f"has {torch.cuda.device_count()}; each rank takes GPU LOCAL_RANK)")
        torch.cuda.set_device(cfg.local_rank)
    if store is None:
        store = _connect_store(cfg, serve=cfg.rank == 0 and not cfg.store_hosted)
        if cfg.store_prefix:
            store = dist.PrefixStore(cfg.store_prefix, store)
    _check_same_device(store, cfg)
    dist.init_process_group(cfg.backend, store=store, rank=cfg.rank,
                            world_size=cfg.world_size, timeout=cfg.timeout)


def _check_same_device(store: dist.Store, cfg: DistConfig) -> None:
    """Refuse a job whose ranks run on different devices (a torchrun job across machines with and without GPUs,
    or `--device auto` resolving differently on them): gloo and NCCL ranks cannot form one group, and would
    otherwise hang until the timeout. Every rank reads every rank's device from the rendezvous store first."""
    store.set(f"gnnc/device/{cfg.rank}", cfg.device)
    keys = [f"gnnc/device/{r}" for r in range(cfg.world_size)]
    deadline = time.monotonic() + cfg.timeout_s
    # Polled, not one blocking get: a signal's Python handler runs only between bytecodes, so a rank blocked
    # in the store's C++ wait would honour SIGTERM only after the timeout.
    while not store.check(keys):
        if time.monotonic() >= deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise RendezvousTimeout(f"rank {cfg.rank}: ranks {missing} of {cfg.world_size} did not reach the "
                                    f"rendezvous at {cfg.master_addr}:{cfg.master_port} within {cfg.timeout_s:g} s")
        time.sleep(RENDEZVOUS_POLL_S)
    devices = {r: store.get(key).decode() for r, key in enumerate(keys)}
    if len(set(devices.values())) > 1:
        by_device: dict[str, list[int]] = {}
        for r, d in devices.items():
            by_device.setdefault(d, []).append(r)
        shown = "; ".join(f"{d}: ranks {ranks}" for d, ranks in sorted(by_device.items()))
        raise LaunchError(f"the job mixes devices ({shown}): every rank must run on the same device; "
                          "pass the same --device (cpu or cuda) to every rank")


def run_worker(fn: Callable[Concatenate[DistConfig, P], T], cfg: DistConfig,
               *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `fn(cfg, *args)` with the process group up, and tear it down after.

    If `fn` raises, the group is left as it is: tearing it down (or letting
    the interpreter's shutdown do it) waits for operations still in flight
    with peers, up to the timeout. Measured: a rank that raised with an
    async all_reduce posted took the whole 20 s timeout to exit. Callers end
    the process with `_exit_after_failure` instead.
    """
    native.bound_builds(cfg.timeout_s)  # a compiler that hangs is a hung rank: bounded like a collective
    init_distributed(cfg)
    result = fn(cfg, *args, **kwargs)
    dist.destroy_process_group()
    return result


def _exit_after_failure(exc: BaseException) -> NoReturn:
    """End this worker at once, with a non-zero status, skipping the teardown that may block.

    The status means what the command's would: 2 (a GnncError's code) for bad
    input, 1 for anything else, 130 after Ctrl-C.
    """
    _exit_now(130 if isinstance(exc, KeyboardInterrupt) else exc.exit_code if isinstance(exc, GnncError) else 1)


def _exit_now(code: int) -> NoReturn:
    """Flush what this process printed and end it without the interpreter's teardown."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def join_torchrun(fn: Callable[Concatenate[DistConfig, P], T], *args: P.args,
                  device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S,
                  **kwargs: P.kwargs) -> T:
    """Run `fn(cfg, *args)` as one rank of a job started by torchrun; returns this rank's result.

    torchrun's agent supervises the processes; a failed rank makes it stop the
    others, and the process-group timeout bounds every collective meanwhile.
    `record` writes the exception to the file torchrun names in
    TORCHELASTIC_ERROR_FILE, so torchrun's failure summary shows it.

    A job across machines can lose a link, and then gloo says only that it
    timed out: the ranks exchange their addresses once the group is up, and a
    rank whose collective fails asks which peers still answer
    (gnnc.runtime.peers) and names the others in its last line on stderr.
    """
    cfg = DistConfig.from_env(device=device, timeout_s=timeout_s)
    tables: list[PeerTable] = []

    def with_peer_table(cfg: DistConfig, *args: P.args, **kwargs: P.kwargs) -> T:
        if cfg.world_size > 1:
            tables.append(exchange_addresses(cfg.master_addr, cfg.master_port))
        return fn(cfg, *args, **kwargs)

    try:
        return record(run_worker)(with_peer_table, cfg, *args, **kwargs)
    except StoppedBySignal as exc:  # SIGTERM from torchrun's agent, Slurm or the user: not a crash
        print(f"gnnc: rank {cfg.rank} of {cfg.world_size} {exc}", file=sys.stderr)
        _exit_now(exc.exit_code)
    except BaseException as exc:
        if isinstance(exc, GnncError):
            print(f"error: {exc}", file=sys.stderr)  # as the CLI says it
        else:
            traceback.print_exception(exc)
        if tables and _is_communication_error(exc):
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            print(f"gnnc: rank {cfg.rank} of {cfg.world_size} stops: a collective failed ({first}); "
                  f"{diagnose(tables[0], cfg.rank)}", file=sys.stderr)
        _exit_after_failure(exc)


def end_joined_rank(code: int) -> NoReturn:
    """End a torchrun rank whose command is done, skipping the interpreter's teardown.

    As for a local worker (`_worker_entry`), the teardown runs the destructors
    of torch.distributed's C++ objects, whose threads can race it: seen as a
    rank that had finished its run dying of SIGABRT ("terminate called without
    an active exception") in 1 of 14 runs across two emulated hosts, which
    torchrun then reports as the job's failure.
    """
    _exit_now(code)


def launch(fn: Callable[..., T], nproc: int, *args: Any, device: str = "cpu",
           port: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
           start_method: str = "spawn", grace_s: float = DEFAULT_GRACE_S) -> list[T]:
    """Run `fn(cfg, *args)` in `nproc` new processes on this machine; return the results by rank.

    `fn` must be importable by name (a module-level function) and return
    tensors, numbers, strings, None and lists, tuples and dicts of them
    (`check_plain`). The rendezvous store is served by this process on 127.0.0.1 at
    `port`, or at a free port chosen by the OS when `port` is None. If any
    worker raises, crashes, is killed or hangs (no progress within
    `timeout_s`; every rank silent, `_supervise`), the others are stopped and `WorkerFailedError` names the
    rank and the cause; a taken port raises `PortInUseError` before any
    process starts. SIGTERM or SIGHUP stops the workers and raises
    `StoppedBySignal` after the cleanup.
    """
    if nproc < 1:
        raise LaunchError(f"need at least one worker, not {nproc}")
    if start_method not in ("spawn", "forkserver"):
        # Not "fork": this process serves the store from a background thread,
        # and forking a multi-threaded process can deadlock the child.
        raise LaunchError(f"start method must be 'spawn' or 'forkserver', not {start_method!r}")
    try:
        pickle.dumps((fn, args))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        # Checked before any process starts: a failure half-way through
        # starting them would leave the first ones running unsupervised.
        raise LaunchError(f"the worker function and its arguments must be picklable "
                          f"(a module-level function): {exc}") from exc
    check_main_guard(nproc, start_method)  # a 'spawn' worker would run an unguarded script's call again
    with stop_on_signals():
        return _launch(fn, nproc, args, device, port, timeout_s, start_method, grace_s)


def _launch(fn: Callable[..., T], nproc: int, args: tuple, device: str, port: int | None,
            timeout_s: float, start_method: str, grace_s: float) -> list[T]:
    store = _serve_store(port, timeout_s)
    base = DistConfig(rank=0, world_size=nproc, local_rank=0, master_addr=LOOPBACK,
                      master_port=store.port, device=device, timeout_s=timeout_s,
                      store_hosted=True, gloo_ifname=_loopback_interface())
    run_dir = Path(tempfile.mkdtemp(prefix="gnnc-launch-"))
    try:
        ctx = torch_mp.start_processes(_worker_entry, args=(fn, base, args, str(run_dir), os.getpid()),
                                       nprocs=nproc, join=False, start_method=start_method)
        try:
            exit_codes, terminated, stall = _supervise(ctx.processes, grace_s, timeout_s + STALL_MARGIN_S)
        finally:
            # Whatever happened here (even KeyboardInterrupt), no worker outlives the launcher.
            _terminate([p for p in ctx.processes if p.is_alive()])
        pids = {rank: int(p.pid) for rank, p in enumerate(ctx.processes)}
        if stall is not None:
            raise _stall_error(stall, exit_codes, pids)
        if any(code != 0 for code in exit_codes.values()):
            reports = {rank: _read_report(run_dir, rank, ctx.error_files[rank], exit_codes[rank])
                       for rank in range(nproc)}
            raise _failure_error(exit_codes, terminated, reports, pids)
        return [_read_result(run_dir, rank) for rank in range(nproc)]
    finally:
        del store  # stop serving the rendezvous store
        shutil.rmtree(run_dir, ignore_errors=True)


# --- the worker side -----------------------------------------------------------------------------


def _worker_entry(local_rank: int, fn: Callable[..., Any], base: DistConfig, args: tuple,
                  run_dir: str, launcher_pid: int) -> None:
    """Body of a local worker process (torch.multiprocessing calls it with the local rank)."""
    (Path(run_dir) / f"started-{local_rank}").touch()  # how the launcher tells a start-up failure (_read_report)
    _die_with_launcher(launcher_pid)
    cfg = dataclasses.replace(base, rank=local_rank, local_rank=local_rank)
    directory = Path(run_dir)
    try:
        result = run_worker(fn, cfg, *args)
        check_plain(result)  # what torch.load(weights_only=True) reads back
        buf = io.BytesIO()
        torch.save(result, buf)
        atomic_write(directory / f"result-{cfg.rank}.pt", buf.getvalue())
    except BaseException as exc:
        # The launcher prints the root cause's traceback; this report is how it learns it.
        atomic_write(directory / f"failure-{cfg.rank}.json", json.dumps(_describe(exc)).encode())
        _exit_after_failure(exc)
    # The result is written and the process group is down. The interpreter's teardown would now run the
    # destructors of torch.distributed's C++ objects, whose threads can race it: seen as a rank that
    # finished its work and then died of SIGABRT ("terminate called without an active exception").
    _exit_now(0)


def _die_with_launcher(launcher_pid: int) -> None:
    """Have Linux SIGKILL this worker when the launcher dies, so a killed launcher leaves no orphans."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != launcher_pid:
        # The launcher died before the request took effect.
        os._exit(1)


def _describe(exc: BaseException) -> dict[str, Any]:
    """What a worker reports about the exception that ends it."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "communication": _is_communication_error(exc),
        "gnnc_error": isinstance(exc, GnncError),
        "exit_code": exc.exit_code if isinstance(exc, GnncError) else 1,
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
        "time": time.time(),
    }


def _is_communication_error(exc: BaseException) -> bool:
    """True for errors that usually follow another rank's failure (peer gone, timeout).

    gloo raises plain RuntimeErrors such as "[.../gloo/transport/tcp/pair.cc:553]
    Connection closed by peer" or "Timed out waiting 3000ms for recv operation";
    torch's own wrappers raise DistError subclasses.
    """
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    markers = ("gloo/transport", "Connection closed by peer", "Connection reset by peer",
               "Timed out waiting", "NCCL", "ProcessGroup")
    return isinstance(exc, RuntimeError) and any(m in text for m in markers)


# --- the launcher side ---------------------------------------------------------------------------


def _serve_store(port: int | None, timeout_s: float) -> dist.TCPStore:
    """Serve the rendezvous store on 127.0.0.1 only; port None lets the OS pick a free one."""
    try:
        listener = _listening_socket(LOOPBACK, 0 if port is None else port)
    except PortInUseError:
        raise PortInUseError(
            f"port {port} on {LOOPBACK} is already in use; pick another port or leave it "
            "unset to let the system choose a free one") from None
    return _store_on(listener, LOOPBACK, None, datetime.timedelta(seconds=timeout_s))


def _connect_store(cfg: DistConfig, serve: bool) -> dist.TCPStore:
    if serve:
        # Serve on the endpoint the user gave (MASTER_ADDR), not on every interface.
        try:
            listener = _listening_socket(cfg.master_addr, cfg.master_port)
        except PortInUseError:
            raise PortInUseError(f"MASTER_PORT {cfg.master_port} on {cfg.master_addr} is already "
                                 "in use") from None
        return _store_on(listener, cfg.master_addr, cfg.world_size, cfg.timeout)
    # Wait for the store's server with plain sockets, so that SIGTERM is honoured meanwhile (see
    # _check_same_device; TCPStore's own retries run in C++, and log every failed attempt with a stack).
    deadline = time.monotonic() + cfg.timeout_s
    while True:
        try:
            socket.create_connection((cfg.master_addr, cfg.master_port),
                                     timeout=min(1.0, max(deadline - time.monotonic(), 0.05))).close()
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousTimeout(f"rank {cfg.rank} cannot reach the rendezvous store at "
                                        f"{cfg.master_addr}:{cfg.master_port} within {cfg.timeout_s:g} s "
                                        f"({exc.strerror or exc})") from None
            time.sleep(RENDEZVOUS_POLL_S)
    try:
        return dist.TCPStore(cfg.master_addr, cfg.master_port, cfg.world_size, False,
                             timeout=cfg.timeout, wait_for_workers=False)
    except dist.DistNetworkError as exc:
        raise LaunchError(f"rank {cfg.rank} cannot reach the rendezvous store at "
                          f"{cfg.master_addr}:{cfg.master_port}: {exc}") from exc


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port` only; PortInUseError when the port is taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve the rendezvous address {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore's own listener does
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is already in use") from None
        raise LaunchError(f"cannot listen on {host}:{port} for the rendezvous store: {exc.strerror}") from None
    return sock


def _store_on(listener: socket.socket, host: str, world_size: int | None,
              timeout: datetime.timedelta) -> dist.TCPStore:
    """Serve a TCPStore on an already listening socket, which the store then owns."""
    port = listener.getsockname()[1]
    fd = listener.detach()
    try:
        return dist.TCPStore(host, port, world_size, True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=fd)
    except dist.DistNetworkError as exc:
        os.close(fd)
        raise LaunchError(f"cannot serve the rendezvous store on {host}:{port}: {exc}") from exc


def _loopback_interface() -> str | None:
    """The name of the loopback interface, so local gloo traffic stays on 127.0.0.1."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


@dataclass(frozen=True)
class Stall:
    """Every rank still running had used no CPU time (its own or its children's) for `silent_s` seconds:
    `states` maps each to what Linux said it was doing ("stopped", "sleeping", ...)."""

    silent_s: float
    states: dict[int, str]


def _supervise(procs: list[Any], grace_s: float,
               stall_after_s: float | None = None) -> tuple[dict[int, int], set[int], Stall | None]:
    """Wait for the workers; after the first failure give the others `grace_s`, then stop them.

    While none has failed, the workers' CPU time is read every STALL_POLL_S: when no rank still running has
    used any for `stall_after_s`, every rank is stopped and the Stall is returned (a job whose ranks are all
    SIGSTOPped or frozen would otherwise wait forever: no collective of theirs can time out).
    Returns every rank's exit code, the ranks this launcher had to terminate (their exit codes are our
    SIGTERM/SIGKILL, not their own failure) and the Stall, if that is why.
    """
    alive = {p.sentinel: rank for rank, p in enumerate(procs)}
    exit_codes: dict[int, int] = {}
    first_failure: float | None = None
    watch = _ProgressWatch({rank: p.pid for rank, p in enumerate(procs)}) if stall_after_s is not None else None
    stall: Stall | None = None
    while alive:
        if first_failure is not None:
            timeout: float | None = max(0.0, first_failure + grace_s - time.monotonic())
        else:
            timeout = STALL_POLL_S if watch is not None and watch.works else None
        ready = multiprocessing.connection.wait(list(alive), timeout)
        if not ready and first_failure is not None:
            break  # the grace period is over
        for sentinel in ready:
            rank = alive.pop(sentinel)
            procs[rank].join()
            exit_codes[rank] = procs[rank].exitcode
            if exit_codes[rank] != 0 and first_failure is None:
                first_failure = time.monotonic()
        if first_failure is None and alive and watch is not None and stall_after_s is not None:
            silent = watch.silent_for(set(alive.values()))
            if silent >= stall_after_s:
                stall = Stall(silent, {rank: _process_state(procs[rank].pid) for rank in sorted(alive.values())})
                break
    terminated = set(alive.values())
    _terminate([procs[rank] for rank in terminated])
    for rank in terminated:
        exit_codes[rank] = procs[rank].exitcode
    return exit_codes, terminated, stall


class _ProgressWatch:
    """When each worker last used CPU time, its own or its children's (a compiler it waits for), per /proc.

    CPU time is the one sign of progress that needs nothing from the worker: a rank that is stopped
    (SIGSTOP, a debugger), frozen or blocked uses none, and neither does a rank waiting in a collective, whose
    timeout then speaks for it. Where /proc is missing, `works` is false and nothing is watched.
    """

    def __init__(self, pids: Mapping[int, int]):
        self.pids = dict(pids)
        now = time.monotonic()
        self.ticks = {rank: _cpu_ticks(pid) for rank, pid in self.pids.items()}
        self.works = all(t is not None for t in self.ticks.values())
        self.last_progress = {rank: now for rank in self.pids}

    def silent_for(self, ranks: set[int]) -> float:
        """Seconds since the last CPU time any of `ranks` used (0 when one is using some now)."""
        now = time.monotonic()
        for rank in ranks:
            ticks = _cpu_ticks(self.pids[rank])
            if ticks is not None and ticks != self.ticks[rank]:
                self.ticks[rank], self.last_progress[rank] = ticks, now
        return now - max(self.last_progress[r] for r in ranks) if ranks else 0.0


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _cpu_ticks(pid: int, depth: int = 0) -> int | None:
    """User and system CPU time of `pid`, of its reaped children and of its live descendants, in clock ticks."""
    fields = _proc_stat(pid)
    if fields is None:
        return None
    total = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime (stat fields 14-17)
    if depth < 8:
        for task in _listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    children = fh.read().split()
            except OSError:
                continue
            total += sum(_cpu_ticks(int(child), depth + 1) or 0 for child in children)
    return total


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _process_state(pid: int) -> str:
    """What Linux says process `pid` is doing, in words."""
    fields = _proc_stat(pid)
    code = fields[0] if fields else "?"
    return {"T": "stopped", "t": "stopped by a debugger", "S": "sleeping", "D": "waiting on I/O",
            "R": "running", "Z": "exited"}.get(code, f"state {code}")


def _stall_error(stall: Stall, exit_codes: Mapping[int, int], pids: Mapping[int, int]) -> WorkerFailedError:
    """The job's failure when every rank went silent: each named, with its state, all of them stopped."""
    ranks = sorted(stall.states)
    lines = [f"worker ranks {ranks} of {len(exit_codes)} hung: none made progress (used any CPU time) for "
             f"{stall.silent_s:.0f} s, so no collective of theirs could time out; the launcher stopped them "
             "(raise --timeout if a rank needs longer between collectives)"]
    lines += [f"  rank {r}: pid {pids[r]}, {stall.states[r]}" for r in ranks]
    lines += [f"  rank {r}: exit status {code}" for r, code in sorted(exit_codes.items()) if r not in stall.states]
    return WorkerFailedError("\n".join(lines), rank=ranks[0], cause=f"hung: no progress for {stall.silent_s:.0f} s",
                             exit_codes=exit_codes, pids=pids, exit_code=1)


def _terminate(procs: list[Any]) -> None:
    """SIGTERM, then SIGKILL what is still alive after STOP_TIMEOUT_S; reap everything."""
    for p in procs:
        if p.is_alive():
            p.terminate()
            # A stopped worker (SIGSTOP, a debugger) acts on SIGTERM only once continued.
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def _read_report(run_dir: Path, rank: int, error_file: str | None, exit_code: int) -> dict[str, Any] | None:
    """The exception rank `rank` reported, or torch.multiprocessing's traceback file, or what a rank that
    exited before gnnc's worker code started can be said to have done, or None."""
    path = run_dir / f"failure-{rank}.json"
    if path.exists():
        return json.loads(path.read_text())
    if error_file and os.path.exists(error_file):
        # The worker failed before our wrapper could report (torch.multiprocessing
        # pickles the traceback text into this file).
        with open(error_file, "rb") as fh:
            text = _TextOnly(fh).load()
        last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        return {"type": last.split(":")[0], "message": last, "communication": False,
                "gnnc_error": False, "traceback": text[-4000:], "time": 0.0}
    if exit_code > 0 and not (run_dir / f"started-{rank}").exists():
        # It died while Python set the process up, before _worker_entry: with 'spawn' that is the re-import of
        # the main module (a script without `if __name__ == "__main__":`, or one that fails on import).
        return {"type": "WorkerStartError", "communication": False, "gnnc_error": False, "time": 0.0,
                "message": f"exited with status {exit_code} before gnnc's worker code started: each worker "
                           "first imports the main module again (the 'spawn' start method), so a script must "
                           "keep its top-level code under `if __name__ == \"__main__\":`; its stderr above "
                           "shows what failed",
                "traceback": "(none reported: see the worker's stderr above)"}
    return None


class _TextOnly(pickle.Unpickler):
    """Reads torch.multiprocessing's error file, a pickled str: no global (so no callable) may be loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: the error file holds text only")


# what a worker may return besides plain data: dataclasses of plain fields, rebuilt from those fields on reading
RESULT_TYPES = (RunResult,)


def check_plain(value: Any, where: str = "the result") -> None:
    """Raise TypeError unless `value` is tensors, numbers, strings, None, and lists, tuples and dicts of them, or
    one of RESULT_TYPES whose fields are."""
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
        return
    if type(value) in RESULT_TYPES:
        for f in dataclasses.fields(value):
            check_plain(getattr(value, f.name), f"{where}.{f.name}")
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where}: a worker's result may use str and int keys only, not {type(key).__name__}")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}: a worker's result "
                    "holds tensors, numbers, strings, None, lists, tuples and dicts only")


def _read_result(run_dir: Path, rank: int) -> Any:
    path = run_dir / f"result-{rank}.pt"
    if not path.exists():
        raise LaunchError(f"rank {rank} exited cleanly but left no result")
    with torch.serialization.safe_globals(list(RESULT_TYPES)):
        return torch.load(path, map_location="cpu", weights_only=True)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _root_cause(exit_codes: Mapping[int, int], terminated: set[int],
                reports: Mapping[int, dict[str, Any] | None]) -> tuple[int, str]:
    """Pick the rank whose failure explains the others, and describe it.

    In order: an exception that is not a communication error (the earliest);
    a signal this launcher did not send (a SIGKILL from outside, a segfault);
    a non-zero exit without any report; then a communication error, which
    means a peer died or hung: when some ranks were still running after the
    others gave up waiting (a timeout), the first of those hung and is named,
    otherwise the earliest communication error.
    """
    failed = [r for r, c in sorted(exit_codes.items()) if c != 0 and r not in terminated]
    own = [(reports[r]["time"], r) for r in failed
           if reports[r] is not None and not reports[r]["communication"]]
    if own:
        rank = min(own)[1]
        rep = reports[rank]
        return rank, f"{rep['type']}: {rep['message']}"
    for r in failed:
        if exit_codes[r] < 0 and reports[r] is None:
            return r, f"killed by {_signal_name(exit_codes[r])}"
    for r in failed:
        if reports[r] is None:
            return r, f"exited with status {exit_codes[r]} without reporting an exception (see its stderr)"
    comm = [(reports[r]["time"], r) for r in failed if reports[r] is not None]
    if comm:
        first = min(comm)[1]
        rep = reports[first]
        message = rep["message"].splitlines()[0][:300] if rep["message"] else ""
        hung = sorted(terminated)
        if hung:
            return hung[0], (f"hung: rank {first} gave up waiting for it ({rep['type']}: {message}); "
                             f"ranks {hung} were still running and were terminated (raise --timeout "
                             "if a rank needs longer between collectives)")
        return first, f"{rep['type']}: {rep['message']}"
    rank = min(exit_codes, key=lambda r: (exit_codes[r] == 0, r))
    return rank, f"exited with status {exit_codes[rank]}"


def _failure_error(exit_codes: Mapping[int, int], terminated: set[int],
                   reports: Mapping[int, dict[str, Any] | None],
                   pids: Mapping[int, int]) -> WorkerFailedError:
    rank, cause = _root_cause(exit_codes, terminated, reports)
    world = len(exit_codes)
    lines = [f"worker rank {rank} of {world} failed: {cause}"]
    for r in sorted(exit_codes):
        if r == rank:
            continue
        code = exit_codes[r]
        how = (f"stopped by the launcher ({_signal_name(code)})" if r in terminated and code < 0
               else f"exit status {code}" if code >= 0 else f"killed by {_signal_name(code)}")
        rep = reports.get(r)
        if rep is not None:
            how += f" after {rep['type']}: {rep['message'].splitlines()[0][:200] if rep['message'] else ''}"
        lines.append(f"  rank {r}: {how}")
    rep = reports.get(rank) if rank not in terminated else None
    if rep is not None and not rep.get("gnnc_error"):
        lines.append(f"traceback of rank {rank}:\n{rep['traceback'].rstrip()}")
    # Bad input (a worker's GnncError) keeps its code; a crash, a kill or a hang is 1.
    exit_code = int(rep.get("exit_code", 2)) if rep is not None and rep.get("gnnc_error") else 1
    return WorkerFailedError("\n".join(lines), rank=rank, cause=cause, exit_codes=exit_codes, pids=pids,
                             exit_code=exit_code)
