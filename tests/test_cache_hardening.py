"""The caches gnnc loads code and data from (compiled libraries, converted graphs) stay out of other users'
reach, a cached library that is not whole is built again, and a compiler that hangs is bounded and killed.

The tests run as root here, so "another user" is uid 65534: root may chown a directory to it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from gnnc.errors import GnncWarning
from gnnc.files import UntrustedPathError, private_dir
from gnnc.graph import loaders
from gnnc.runtime.kernels import native

from conftest import EXAMPLES, ROOT

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
needs_cc = pytest.mark.skipif(native.find_compiler() is None, reason="no C compiler")


@pytest.fixture
def tiny(tmp_path: Path) -> native.Recipe:
    """A library that builds in a fraction of a second (the kernels take seconds), by the same recipe rules."""
    source = tmp_path / "tiny.c"
    source.write_text("int gnnc_tiny(void) { return 7; }\n")
    return native.Recipe("gnnc_tiny", (source,), native.KERNELS.compilers, ("-O0", "-fPIC", "-shared"), ((),), ())


# --- private directories (gnnc.files.private_dir) ---------------------------------------------------


def _refusal(path: Path) -> str:
    try:
        with private_dir(path):
            return ""
    except UntrustedPathError as err:
        return str(err)


@needs_root
def test_a_directory_anywhere_above_that_others_can_change_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by all, not sticky: its entries can be renamed by anyone
    assert _refusal(shared / "a" / "b") == f"{shared} is writable by other users (mode 777, not sticky)"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert _refusal(theirs / "c") == f"{theirs} is owned by uid {OTHER_UID}, not by this user or root (uid 0)"
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o770)
    assert "writable by other users (mode 770)" in _refusal(group)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot rename what is ours
    assert _refusal(sticky / "mine") == ""
    assert (sticky / "mine").stat().st_mode & 0o777 == 0o700
    os.symlink(tmp_path, sticky / "their-link")
    os.lchown(sticky / "their-link", OTHER_UID, OTHER_UID)  # a link another user made in a sticky directory
    assert "is a symbolic link of uid 65534" in _refusal(sticky / "their-link" / "x")
    os.symlink(sticky / "mine", tmp_path / "my-link")
    assert _refusal(tmp_path / "my-link") == ""  # a link of this user's is followed, its target checked


@needs_root
@pytest.mark.parametrize("setup", ["ancestor-writable", "ancestor-theirs"])
def test_the_native_cache_is_not_placed_below_a_directory_others_can_change(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setup: str) -> None:
    """The swap: with XDG_CACHE_HOME below a directory another user can write (or owns), they can exchange
    `gnnc/native` for their own directory between the check and the load. Only the last component used to be
    checked, so such a cache was taken."""
    above = tmp_path / "above"
    above.mkdir()
    if setup == "ancestor-writable":
        above.chmod(0o777)
    else:
        os.chown(above, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("XDG_CACHE_HOME", str(above / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert native.cache_dir() == tmp_path / "home" / ".cache" / "gnnc" / "native"
    monkeypatch.setenv("HOME", str(above / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(above))
    with pytest.raises(OSError) as refused:  # none private: the kernels are not built, status says why
        native.cache_dir()
    assert str(refused.value).startswith(f"no private directory to build in ({above / 'xdg' / 'gnnc' / 'native'}: "
                                         f"{above} is ")
    assert str(refused.value).count(f"{above} is ") == 3


@needs_cc
def test_the_library_loaded_is_the_file_built_in_the_directory_checked(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path, tiny: native.Recipe) -> None:
    """The directory is exchanged for another holding a library of the same name right after the build:
    what is loaded is still the file in the directory that was checked and opened (through its descriptor)."""
    cache, built = tmp_path / "cache", tmp_path / "built"
    real_open = native._open_whole
    swapped: list[str] = []

    def swap_then_open(name: str, dir_fd: int) -> int | None:
        if (cache / name).exists() and not swapped:  # the build is done: swap before the load opens it
            cache.rename(built)
            cache.mkdir(mode=0o700)
            shutil.copy(built / name, cache / name)  # the same bytes, another file
            swapped.append(name)
        return real_open(name, dir_fd)

    monkeypatch.setattr(native, "_open_whole", swap_then_open)
    lib, why = native.load(native.find_compiler(), cache, tiny)
    assert lib is not None, why
    (name,) = swapped
    (inode,) = [ino for (_, ino), (loaded, _) in native._State.loaded.items() if loaded is lib]
    assert inode == (built / name).stat().st_ino != (cache / name).stat().st_ino


@needs_cc
def test_a_link_planted_in_place_of_the_library_is_not_followed(tmp_path: Path, tiny: native.Recipe) -> None:
    (tmp_path / "one").mkdir(mode=0o700)
    first, why = native.build(native.find_compiler(), tmp_path / "one", tiny)
    assert first is not None, why
    elsewhere = tmp_path / "elsewhere.so"
    shutil.copy(first, elsewhere)
    cache = tmp_path / "two"
    cache.mkdir(mode=0o700)
    os.symlink(elsewhere, cache / first.name)  # the library's name is computable from public inputs
    path, why = native.build(native.find_compiler(), cache, tiny)
    assert path == cache / first.name and not path.is_symlink() and path.is_file(), why


@needs_cc
def test_a_truncated_library_in_the_cache_is_built_again(tmp_path: Path, tiny: native.Recipe) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    path, why = native.build(native.find_compiler(), cache, tiny)
    assert path is not None, why
    size = path.stat().st_size
    for cut in (size // 2, 100):  # a partly written file, and one too short for an ELF header
        (cache / "cut").write_bytes(path.read_bytes()[:cut])
        (cache / "cut").replace(path)  # not written in place: the file loaded below is mapped
        again, why = native.build(native.find_compiler(), cache, tiny)
        assert again == path and path.stat().st_size == size, why
        lib, why = native.load(native.find_compiler(), cache, tiny)
        assert lib is not None and lib.gnnc_tiny() == 7, why


# --- a compiler that hangs ----------------------------------------------------------------------------


def _hanging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A `cc` that starts a child and never returns; it writes its pid and its child's to the second path."""
    pids = tmp_path / "pids"
    cc = tmp_path / "bin" / "cc"
    cc.parent.mkdir()
    cc.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    cc.chmod(0o755)
    return cc, pids


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie not yet reaped by init
    except FileNotFoundError:
        return True


def _wait_for(path: Path, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) == 2:
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(f"{path} not written in {timeout_s} s")


def test_a_compiler_that_hangs_is_killed_with_its_children_at_the_deadline(tmp_path: Path) -> None:
    cc, pids = _hanging_compiler(tmp_path)
    start = time.monotonic()
    path, why = native.build(str(cc), tmp_path / "cache", timeout_s=2)
    assert path is None and time.monotonic() - start < 30
    # one flag set tried: a hang is not a flag's fault, and each would wait again
    assert why == ("cc was still building gnnc_native (-march=native -fopenmp) after 2 s; "
                   "it was killed with every process it started")
    compiler = _wait_for(pids, 5)
    # SIGKILL is delivered asynchronously: on a loaded machine the grandchild may still be running for a moment
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in compiler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in compiler)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock"]  # no .build-*.so left


def test_a_build_stopped_by_sigterm_kills_its_compiler_and_removes_its_output(tmp_path: Path) -> None:
    cc, pids = _hanging_compiler(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    code = ("import sys; from pathlib import Path; from gnnc.runtime.kernels import native; "
            "native.build(sys.argv[1], Path(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cc), str(cache)])
    try:
        compiler = _wait_for(pids, 60)
        assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")]  # the compiler's output
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM  # the signal still ends the process as it would have
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in compiler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in compiler)
    assert sorted(p.name for p in cache.iterdir()) == [".lock"]


@pytest.mark.slow
def test_a_run_whose_compilers_hang_says_so_and_trains_within_its_timeout(tmp_path: Path) -> None:
    """`gnnc run --nproc 2 --timeout T` with a `cc` and a `c++` that never return: each rank's build is
    bounded by T, the run trains on the torch code and says which build hung."""
    cc, _ = _hanging_compiler(tmp_path)
    shutil.copy(cc, cc.parent / "c++")
    env = {**os.environ, "PATH": f"{cc.parent}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gnnc", "run", str(EXAMPLES / "gcn.gnn"), "--graph",
                          "planetoid:cora", "--epochs", "1", "--nproc", "2", "--timeout", "8"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - start < 180
    assert "cc was still building gnnc_native (-march=native -fopenmp) after 8 s" in out.stderr
    assert "c++ was still building gnnc_block_cache" in out.stderr
    assert not list((tmp_path / "xdg" / "gnnc" / "native").glob(".build-*"))


# --- the graph cache -------------------------------------------------------------------------------


SPEC = "rmat:n=300,deg=4,features=8,classes=3,seed=5"


def _entry(cache: Path) -> Path:
    (entry,) = cache.glob("graph-*.npz")
    return entry


def _rewrite(entry: Path, **changes: np.ndarray) -> None:
    with np.load(entry) as f:
        arrays = {k: f[k] for k in f.files}
    arrays.update(changes)
    with open(entry, "wb") as f:
        np.savez(f, **arrays)


def _nan_at_7(x: np.ndarray) -> np.ndarray:
    return np.where(np.arange(x.size).reshape(x.shape) == 7, np.float32(np.nan), x)


@pytest.mark.parametrize("field, bad, message", [
    ("x", _nan_at_7, "x: holds NaN at row 0, column 7 (1 non-finite values)"),
    ("y", lambda y: np.where(np.arange(len(y)) == 3, -1, y), "y: holds negative label -1 at row 3"),
    ("src", lambda s: np.where(np.arange(len(s)) == 0, 10 ** 6, s).astype(s.dtype),
     "edge_index: vertex id 1000000 at [0, 0] is out of range: x has 300 rows, so ids must be < 300"),
], ids=["nan-feature", "negative-label", "vertex-id"])
def test_a_cached_graph_is_validated_as_its_input_was(tmp_path: Path, field: str, bad, message: str) -> None:
    """A cached entry used to skip the NaN/inf, label and vertex-id checks: planted NaN features, a negative
    label or an out-of-range id were trained on. Now the entry is refused, said, and built again."""
    cache = tmp_path / "cache"
    clean = loaders.load_graph(SPEC, cache_dir=cache)
    entry = _entry(cache)
    with np.load(entry) as f:
        _rewrite(entry, **{field: bad(f[field])})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        again = loaders.load_graph(SPEC, cache_dir=cache)
    assert np.array_equal(again.x.numpy(), clean.x.numpy()) and np.array_equal(again.y.numpy(), clean.y.numpy())
    assert np.array_equal(again.src, clean.src)
    assert [str(w.message) for w in said] == [
        f"warning: ignoring cached graph {entry.name}: {message}; converting the input again"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaders.load_graph(SPEC, cache_dir=cache)  # written again, whole: read back without a word


@needs_root
@pytest.mark.parametrize("setup", ["theirs", "group-writable", "world-writable-above"])
def test_a_graph_cache_others_can_write_is_not_used(tmp_path: Path, setup: str) -> None:
    """The poisoning: an entry planted for a spec (its key is the spec's sha256) whose labels are trivially
    learnable made a run report test accuracy 1.0000. A cache directory another user owns or can write, or
    below one they can, is neither read nor written."""
    cache = tmp_path / "above" / "cache"
    loaders.load_graph(SPEC, cache_dir=cache)
    entry = _entry(cache)
    with np.load(entry) as f:
        y = f["y"]
    _rewrite(entry, y=np.zeros_like(y))  # a valid graph, but not the one the spec generates
    if setup == "theirs":
        os.chown(cache, OTHER_UID, OTHER_UID)
    elif setup == "group-writable":
        cache.chmod(0o770)
    else:
        (tmp_path / "above").chmod(0o777)
    before = sorted(cache.iterdir())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        graph = loaders.load_graph(SPEC, cache_dir=cache)
    assert len(set(graph.y.tolist())) > 1  # generated from the spec, not the planted labels
    assert sorted(cache.iterdir()) == before  # and nothing written there
    why = {"theirs": f"{cache} is owned by uid {OTHER_UID}, not by this user (uid 0)",
           "group-writable": f"{cache} is writable by other users (mode 770)",
           "world-writable-above": f"{cache.parent} is writable by other users (mode 777, not sticky)"}[setup]
    assert [str(w.message) for w in said] == [f"warning: not using the graph cache {cache}: {why}"]
    assert all(isinstance(w.message, GnncWarning) for w in said)
