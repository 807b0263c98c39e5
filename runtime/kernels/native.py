"""gnnc's compiled CPU kernels: `native.c`, built on first use with the system's C compiler, loaded with ctypes.

Why compiled code: dropout keyed by global ids (gnnc.runtime.rng) is a hash per element, and as
torch integer ops it took a dozen passes over int32 temporaries per mask (56% of a 200K-vertex GCN
epoch); GAT's attention as torch ops writes and reads six [edges, heads] tensors forward and more
backward. One C loop does each in one pass. Plain C with OpenMP, no torch headers and no pybind:
it compiles in 1.3 s of CPU (a torch C++ extension compiles torch's headers first), so nothing has to
be shipped prebuilt. Built with -fopenmp, the library needs `libgomp.so.1`, which torch's wheel has
already loaded under that name: both share one OpenMP runtime and its threads.

The library is built once per source, compiler and CPU into a private cache directory (`cache_dir`:
owned by this user, not writable by others, checked before anything is loaded from it). One process
builds at a time (a lock file); the library is written under a temporary name and renamed into place,
so concurrent workers never load half a file. When it cannot be built (no compiler, no headers, no
writable directory) or `GNNC_NATIVE=0` is set, every caller takes its torch implementation, which
computes the same values more slowly; `status()` says which and why (`gnnc run` shows it). Every
kernel here has such a twin and the tests compare the two, and run the models both ways.

Only CPU tensors of float32 or float64 come here; other devices and types take the torch code.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


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
    "attention_backward": (_INT, (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64,
                                  _I64, _I64, "T", _P, _U32, _I64, _U32, "T", _INT)),
}


class _State:
    """The loaded library (or why there is none), once per process."""

    lib: ctypes.CDLL | None = None
    reason: str = ""  # why the library is not loaded, once tried
    tried: bool = False
    off: str | None = None  # why the kernels are turned off ("": they are on); None: GNNC_NATIVE not read yet


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
    `$TMPDIR/gnnc-native-<uid>` where that cannot be made. Created 0700; refused unless this user owns it
    and nobody else can write it (a library loaded from there runs as this user)."""
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
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                raise OSError(f"{path} is not a private directory of this user")
            if not os.access(path, os.W_OK | os.X_OK):
                raise OSError(f"{path} is not writable")
            return path
        except OSError as err:
            problems.append(str(err))
    raise OSError("; ".join(problems))


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


def build(compiler: str, out_dir: Path, recipe: Recipe = KERNELS) -> tuple[Path | None, str]:
    """Compile `recipe` (cached by source, compiler, flags and CPU); the library's path, or None and why."""
    with _build_lock(out_dir):
        return _build_locked(compiler, out_dir, recipe)


class _build_lock:
    """An exclusive lock on `out_dir/.lock` while building: workers started together compile once, the
    others wait and find the library. The rename into place is atomic on its own; the lock saves work."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> None:
        try:
            import fcntl  # deferred: POSIX only; without it builds still rename atomically
        except ImportError:
            return
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some NFS): build unlocked, the rename stays atomic
            pass

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock


def _build_locked(compiler: str, out_dir: Path, recipe: Recipe) -> tuple[Path | None, str]:
    source = b"\0".join(p.read_bytes() for p in recipe.sources)
    cc = Path(compiler)
    errors = []
    for extra in recipe.flag_sets:
        flags = recipe.flags + extra
        key = hashlib.sha256(b"\0".join([source, str(cc).encode(), str(cc.stat().st_mtime_ns).encode(),
                                         " ".join(flags).encode(), platform.machine().encode(),
                                         _cpu_flags().encode()])).hexdigest()[:20]
        target = out_dir / f"{recipe.name}_{key}.so"
        if target.exists():
            return target, ""
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".build-", suffix=".so")
        os.close(fd)
        try:
            r = subprocess.run([compiler, *flags, str(recipe.sources[0]), "-o", tmp, *recipe.libraries],
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                os.replace(tmp, target)  # atomic: a reader sees no library or the whole of it
                return target, ""
            lines = r.stderr.strip().splitlines()
            first = next((line for line in lines if "error" in line), lines[-1] if lines else "?")
            errors.append(f"{' '.join(extra) or 'plain'}: {first.strip()}")
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(str(err))
        finally:
            Path(tmp).unlink(missing_ok=True)
    return None, "; ".join(errors)


def _load() -> None:
    _State.tried = True
    compiler = find_compiler()
    if compiler is None:
        _State.reason = "no C compiler (cc, gcc or clang) on PATH"
        return
    try:
        path, why = build(compiler, cache_dir())
    except OSError as err:  # no private directory to build in, or none to write there
        path, why = None, str(err)
    if path is None:
        _State.reason = f"the build failed ({why})"
        return
    try:
        lib = ctypes.CDLL(str(path))
        for name, (restype, args) in _SIGNATURES.items():
            for suffix, scalar in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
                fn = getattr(lib, f"gnnc_{name}_{suffix}")
                fn.restype = restype
                fn.argtypes = [scalar if a == "T" else a for a in args]
    except (OSError, AttributeError) as err:
        _State.reason = f"{path} does not load: {err}"
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


def int64(t: torch.Tensor) -> torch.Tensor:
    """Contiguous int64 (ids and structure handed to C)."""
    return t.to(torch.int64).contiguous()
