"""gnnc's compiled CPU kernels: `native.c`, built on first use with the system's C compiler, loaded with ctypes.

Why compiled code: dropout keyed by global ids (gnnc.runtime.rng) is a hash per element, and as
torch integer ops it took a dozen passes over int32 temporaries per mask (56% of a 200K-vertex GCN
epoch); GAT's attention as torch ops writes and reads six [edges, heads] tensors forward and more
backward. One C loop does each in one pass. Plain C with OpenMP, no torch headers and no pybind:
it compiles in 1.3 s of CPU (a torch C++ extension compiles torch's headers first), so nothing has to
be shipped prebuilt. Built with -fopenmp, the library needs `libgomp.so.1`, which torch's wheel has
already loaded under that name: both share one OpenMP runtime, its threads and the wait policy gnnc sets before
torch loads it (gnnc.host.set_wait_policy).

The library is built once per source, compiler and CPU into a private cache directory (`cache_dir`: it
and every directory above it out of other users' reach, gnnc.files.private_dir), and everything in it is
done through one descriptor of that directory: the build, the check of the file and the load of that very
file (through /proc/self/fd), so that no path is looked up again after it was checked. One process builds
at a time (a lock file); the library is written under a temporary name, sealed with its own sha256 and
renamed into place, so concurrent workers never load half a file, and a file that is not whole (truncated
by a full disk or a crash) is built again. A compiler runs in its own process group, within the build's
time (`bound_builds`: a rank's is the run's --timeout), and is killed with every process it started when
that time is up or the process is stopped (SIGTERM, SIGHUP, Ctrl-C), its half-written output removed.
When it cannot be built (no compiler, no headers, no private directory, a compiler that hangs) or
`GNNC_NATIVE=0` is set, every caller takes its torch implementation, which computes the same values more
slowly; `status()` says which and why (`gnnc run` shows it). Every kernel here has such a twin and the
tests compare the two, and run the models both ways.

Only CPU tensors of float32 or float64 come here; other devices and types take the torch code.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gnnc.files import fd_path, private_dir


@dataclass(frozen=True)
class Recipe:
    """How one library is built: `sources[0]` is compiled (the rest are files it includes; all are hashed
    into the library's name), by the first of `compilers` on PATH, with `flags` and then the first of
    `flag_sets` that builds; `libraries` come last on the command line."""

    name: str
    sources: tuple[Path, ...]
    compilers: tuple[str, ...]
    flags: tuple[str, ...]
    flag_sets: tuple[tuple[str, ...], ...]
    libraries: tuple[str, ...]


SOURCE = Path(__file__).with_name("native.c")
KERNELS = Recipe(
    "gnnc_native",
    (SOURCE, Path(__file__).with_name("native_kernels.inc")),  # native.c includes the kernels
    ("cc", "gcc", "clang"),
    # -O3 vectorises the hash loops; no -ffast-math: sums keep their order, so results are reproducible.
    ("-O3", "-std=c11", "-fPIC", "-shared"),
    # Tried in order: the first that builds is used (a compiler without OpenMP still gives one thread).
    (("-march=native", "-fopenmp"), ("-fopenmp",), ()),
    ("-lm",),
)
DTYPES = (torch.float32, torch.float64)
# How long one library's build may take (the wait for another process's build, then every flag set) where no
# run's timeout bounds it (`bound_builds`): the kernels compile in 1.3 s of CPU, the block cache in 3.
DEFAULT_BUILD_TIMEOUT_S = 300.0
# Appended to a built library with the sha256 of what precedes it (the loader maps only what the ELF headers
# name, so trailing bytes are inert): a truncated or damaged file fails the check and is built again.
SEAL = b"\n#gnnc-sha256:"
_SEAL_LEN = len(SEAL) + 64
# What stops a build as it stops the process; SIGINT is Python's KeyboardInterrupt already.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOPPED = "stopped by a signal"  # why there is no library when a stop signal's handler let the process go on

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_U32 = ctypes.c_uint32
_INT = ctypes.c_int
# C signature of each exported function, with a scalar type for its T arguments filled in per dtype.
_SIGNATURES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "dropout": (_INT, (_P, _P, _P, _I64, _I64, _U32, _I64, _U32, "T", _INT)),
    "dropout_at": (None, (_P, _P, _P, _P, _P, _I64, _U32, _U32, "T", _INT)),
    "epilogue": (_INT, (_P, _P, _P, _P, _I64, _I64, _INT, "T", _P, _U32, _I64, _U32, "T", _INT)),
    "epilogue_backward": (_INT, (_P, _P, _P, _I64, _I64, _INT, "T", _P, _U32, _I64, _U32, "T", _INT)),
    "attention": (_INT, (_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, "T", _P, _U32, _I64, _U32, "T", _INT)),
    "head_dots": (None, (_P, _P, _P, _P, _P, _I64, _I64, _I64, _INT)),
    "exp": (None, (_P, _P, _I64)),
    "attention_backward": (_INT, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64,
                                  _I64, _I64, _I64, "T", _P, _U32, _I64, _U32, "T", _INT)),
}


class _State:
    """The loaded library (or why there is none), once per process."""

    lib: ctypes.CDLL | None = None
    reason: str = ""  # why the library is not loaded, once tried
    tried: bool = False
    off: str | None = None  # why the kernels are turned off ("": they are on); None: GNNC_NATIVE not read yet
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    # Every library this process loaded, by (device, inode), with the descriptor it was loaded through. The
    # descriptor stays open: dlopen knows a library by the name it was given, and a later library loaded
    # through the same /proc/self/fd/N, its number reused, would be taken for this one.
    loaded: dict[tuple[int, int], tuple[ctypes.CDLL, int]] = {}


# GNNC_NATIVE=0 turns the compiled kernels off (the torch implementations run), read once per process.
ENV_SWITCH = "GNNC_NATIVE"


def turned_off() -> str:
    """Why the compiled kernels are turned off, or "" when they are on."""
    if _State.off is None:
        _State.off = switched_off(ENV_SWITCH)
    return _State.off


def switched_off(name: str) -> str:
    """Why the environment variable `name` turns something off (its value 0, false, no or off), or "" if not."""
    value = os.environ.get(name, "1").strip().lower()
    return f"by {name}={value}" if value in ("0", "false", "no", "off") else ""


def cache_dir() -> Path:
    """Where the library is built: `$XDG_CACHE_HOME/gnnc/native` (default `~/.cache/gnnc/native`), or
    `$TMPDIR/gnnc-native-<uid>` where that is not private. Created 0700; refused unless it is this user's,
    writable by nobody else, and reached through directories only this user or root can change
    (gnnc.files.private_dir: a library loaded from there runs as this user)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    candidates = [Path(xdg) / "gnnc" / "native"] if xdg else []
    try:
        candidates.append(Path.home() / ".cache" / "gnnc" / "native")
    except RuntimeError:  # no home directory
        pass
    candidates.append(Path(tempfile.gettempdir()) / f"gnnc-native-{os.getuid()}")
    problems = []
    for path in candidates:
        try:
            with private_dir(path) as fd:
                if not os.access(".", os.W_OK | os.X_OK, dir_fd=fd):
                    raise OSError(f"{path} is not writable")
            return path
        except OSError as err:
            problems.append(f"{path}: {err}")
    raise OSError(f"no private directory to build in ({'; '.join(problems)})")


def bound_builds(timeout_s: float) -> None:
    """Give every later build in this process at most `timeout_s` (a rank's: the run's --timeout, which
    bounds its collectives too): a compiler still running then is killed and the torch code runs."""
    _State.build_timeout_s = timeout_s


def find_compiler(recipe: Recipe = KERNELS) -> str | None:
    for name in recipe.compilers:
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (the library is built with -march=native for this CPU)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def build(compiler: str, out_dir: Path, recipe: Recipe = KERNELS,
          timeout_s: float | None = None) -> tuple[Path | None, str]:
    """Compile `recipe` into the private directory `out_dir` (cached by source, compiler, flags and CPU; a
    cached file that is not whole is built again); the library's path, or None and why. Waiting for another
    process's build and compiling take at most `timeout_s` together (default: `bound_builds`'s)."""
    name, why = None, STOPPED  # unless the build runs to its end
    with _signals_unwind(), private_dir(out_dir) as dir_fd:
        name, why = _build(compiler, dir_fd, out_dir, recipe, timeout_s)
    return (out_dir / name if name is not None else None), why


def load(compiler: str, out_dir: Path, recipe: Recipe = KERNELS) -> tuple[ctypes.CDLL | None, str]:
    """`build`, then load what was built, both through one descriptor of `out_dir` opened once: the file is
    opened there without following links, checked (this user's, whole) and that very file is loaded, through
    /proc/self/fd, not by its name. The library, or None and why."""
    name, why, fd = None, STOPPED, None  # unless the build runs to its end
    with _signals_unwind(), private_dir(out_dir) as dir_fd:
        name, why = _build(compiler, dir_fd, out_dir, recipe, None)
        if name is not None:
            fd = _open_whole(name, dir_fd)
    if name is None:
        return None, f"the build failed ({why})"
    if fd is None:
        return None, f"{out_dir / name} changed after it was built"
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _State.loaded:
        os.close(fd)
        return _State.loaded[st.st_dev, st.st_ino][0], ""
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError as err:
        os.close(fd)
        return None, f"{out_dir / name} does not load: {err}"
    _State.loaded[st.st_dev, st.st_ino] = lib, fd
    return lib, ""


def _build(compiler: str, dir_fd: int, out_dir: Path, recipe: Recipe,
           timeout_s: float | None) -> tuple[str | None, str]:
    """The name of `recipe`'s library in `dir_fd`, built if need be, or None and why."""
    budget = _State.build_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + budget
    with _build_lock(dir_fd, deadline) as locked:
        if locked:
            name, why = _build_locked(compiler, dir_fd, recipe, deadline, budget)
        else:
            name, why = None, f"another process was still building in {out_dir} after {budget:g} s"
    return name, why


class _Stopped(BaseException):
    """A stop signal came during a build: unwinds it, so that its compiler is killed and its output removed
    before the signal takes its course (the default action would end the process with both left behind)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """While building, SIGTERM and SIGHUP raise _Stopped; once the build has cleaned up, the signal is
    delivered again to whatever handled it before (the default ends the process, the launcher's unwinds)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread takes signals; a build elsewhere still ends at its deadline
        return

    def stop(signum: int, frame: object) -> None:
        for s in previous:  # once: a second signal must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        raise _Stopped(signum)

    # A signal ignored (nohup) stays so; one whose handler Python did not install cannot be given back.
    taken = [s for s in _STOP_SIGNALS if signal.getsignal(s) not in (signal.SIG_IGN, None)]
    previous = {s: signal.signal(s, stop) for s in taken}
    try:
        yield
    except _Stopped as stopped:
        for s, handler in previous.items():
            signal.signal(s, handler)
        previous = {}
        signal.raise_signal(stopped.signum)  # its course; returns only where it is ignored or handled
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _build_lock(dir_fd: int, deadline: float) -> Iterator[bool]:
    """An exclusive lock on `.lock` while building, or False when another process holds it past `deadline`:
    workers started together compile once, the others wait and find the library. The rename into place is
    atomic on its own; the lock saves work."""
    fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        yield _lock(fd, deadline)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, deadline: float) -> bool:
    try:
        import fcntl  # deferred: POSIX only; without it builds still rename atomically
    except ImportError:
        return True
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        except OSError:  # a file system without locks (some NFS): build unlocked, the rename stays atomic
            return True


def _build_locked(compiler: str, dir_fd: int, recipe: Recipe, deadline: float,
                  budget: float) -> tuple[str | None, str]:
    source = b"\0".join(p.read_bytes() for p in recipe.sources)
    cc = Path(compiler)
    errors = []
    for extra in recipe.flag_sets:
        flags = recipe.flags + extra
        key = hashlib.sha256(b"\0".join([source, str(cc).encode(), str(cc.stat().st_mtime_ns).encode(),
                                         " ".join(flags).encode(), platform.machine().encode(),
                                         _cpu_flags().encode()])).hexdigest()[:20]
        target = f"{recipe.name}_{key}.so"
        found = _open_whole(target, dir_fd)
        if found is not None:
            os.close(found)
            return target, ""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target, dir_fd=dir_fd)  # not whole (truncated, damaged): built again
        tmp = f".build-{secrets.token_hex(8)}.so"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd))
        try:
            command = [compiler, *flags, str(recipe.sources[0]), "-o", fd_path(dir_fd, tmp), *recipe.libraries]
            code, stderr = _run_compiler(command, deadline)
            if code is None:  # a hang is no flag's fault: the next flag set would hang as well
                errors.append(f"{cc.name} was still building {recipe.name} ({' '.join(extra) or 'plain'}) "
                              f"after {budget:g} s; it was killed with every process it started")
                break
            if code == 0:
                _seal(tmp, dir_fd)
                os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # atomic: all or nothing
                return target, ""
            lines = stderr.strip().splitlines()
            first = next((line for line in lines if "error" in line), lines[-1] if lines else "?")
            errors.append(f"{' '.join(extra) or 'plain'}: {first.strip()}")
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(str(err))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
    return None, "; ".join(errors)


def _run_compiler(command: list[str], deadline: float) -> tuple[int | None, str]:
    """The compiler's exit status and stderr, or None when it was still running at `deadline`. It runs in a
    process group of its own, which is killed whole if it outlives the deadline or this build is stopped
    (a compiler's driver starts the compiler proper, the assembler and the linker)."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        return None, ""
    finally:
        if proc.returncode is None:  # not reaped yet, so its group id cannot have been reused
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stderr.close()  # not read to its end: a process that left the group may hold it open
            proc.wait()


def _seal(name: str, dir_fd: int) -> None:
    """Make the built file this user's alone and append its seal (SEAL and the sha256 of what precedes it)."""
    fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"the compiler's output {name} is not a regular file")
        os.fchmod(fd, 0o700)  # the linker made it with the umask's mode
        digest = hashlib.sha256(_read_all(fd)).hexdigest().encode()
        os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, SEAL + digest)
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_whole(name: str, dir_fd: int) -> int | None:
    """A descriptor of library `name` in `dir_fd` when it is this user's regular file, writable by no one
    else and whole (its seal matches); None otherwise (missing, truncated, damaged, not gnnc's)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    data = _read_all(fd) if stat.S_ISREG(st.st_mode) else b""
    whole = (st.st_uid == os.getuid() and not st.st_mode & 0o022 and len(data) > _SEAL_LEN
             and data[-_SEAL_LEN:-64] == SEAL
             and hashlib.sha256(data[:-_SEAL_LEN]).hexdigest().encode() == data[-64:])
    if not whole:
        os.close(fd)
        return None
    return fd


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _load() -> None:
    _State.tried = True
    compiler = find_compiler()
    if compiler is None:
        _State.reason = "no C compiler (cc, gcc or clang) on PATH"
        return
    try:
        lib, why = load(compiler, cache_dir())
    except OSError as err:  # no private directory to build in, or none to write there
        lib, why = None, str(err)
    if lib is None:
        _State.reason = why
        return
    try:
        for name, (restype, args) in _SIGNATURES.items():
            for suffix, scalar in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
                fn = getattr(lib, f"gnnc_{name}_{suffix}")
                fn.restype = restype
                fn.argtypes = [scalar if a == "T" else a for a in args]
    except AttributeError as err:
        _State.reason = f"the library does not match its source: {err}"
        return
    _State.lib = lib


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None when it cannot be or is turned off (see `status`)."""
    if turned_off():
        return None
    if not _State.tried:
        _load()
    return _State.lib


def status() -> str:
    """One line for run summaries and benchmarks: "compiled", or which implementation runs instead and why."""
    if turned_off():
        return f"torch (compiled kernels turned off {turned_off()})"
    if library() is not None:
        return "compiled"
    return f"torch (compiled kernels unavailable: {_State.reason})"


class disabled:
    """`with native.disabled():` runs the torch implementations (for tests and measurements)."""

    def __enter__(self) -> None:
        self._was = turned_off()
        _State.off = "in this block"

    def __exit__(self, *exc: Any) -> None:
        _State.off = self._was


def usable(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The library, when every tensor is a CPU tensor of one float type it handles."""
    first = tensors[0]
    if first.device.type != "cpu" or first.dtype not in DTYPES:
        return None
    if any(t.device.type != "cpu" or t.dtype != first.dtype for t in tensors[1:]):
        return None
    return library()


def fn(lib: ctypes.CDLL, name: str, dtype: torch.dtype) -> Any:
    """The exported function `name` for `dtype` (f32 or f64)."""
    return getattr(lib, f"gnnc_{name}_{'f32' if dtype == torch.float32 else 'f64'}")


def ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def threads() -> int:
    return torch.get_num_threads()


# The alignment a kernel's scratch gets (`scratch`): one cache line, as the kernels lay their per-edge rows out.
CACHE_LINE = 64


def scratch(numel: int, like: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Uninitialised room for `numel` elements of `like`'s dtype, and the address of the first of them, aligned to
    a cache line. From torch's allocator, not malloc in the kernel: the block cache (gnnc.runtime.block_cache)
    keeps a large block from one epoch to the next, where glibc maps every block of 1 MiB and more afresh and the
    kernel faults its pages in again each time. The tensor must live as long as the address is used."""
    extra = CACHE_LINE // like.element_size()  # torch's CPU allocator aligns to 64 already; a block need not be
    buf = torch.empty(numel + extra, dtype=like.dtype, device=like.device)
    return buf, -(-buf.data_ptr() // CACHE_LINE) * CACHE_LINE


def int64(t: torch.Tensor) -> torch.Tensor:
    """Contiguous int64 (ids and structure handed to C)."""
    return t.to(torch.int64).contiguous()
