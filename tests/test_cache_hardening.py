"""The caches gnnc loads code and data from (compiled libraries, converted graphs) stay out of other users'
reach.

The tests run as root here, so "another user" is uid 65534: root may chown a directory to it.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from gnnc.errors import GnncWarning
from gnnc.files import UntrustedPathError, private_dir
from gnnc.graph import loaders

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")


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
