"""A graph store is checked whole once, then trusted through a verification stamp while its files keep their
identity (gnnc.graph.store: issue 34, the sha256 of every array at every open was ~8 CPU s of a products-size
compile); any change of a file, of the manifest, or a stamp folder others could write to, checks it whole again."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from gnnc.errors import GraphInputError
from gnnc.graph import store
from gnnc.graph.generators import rmat
from gnnc.graph.loaders import load_graph


@pytest.fixture()
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """A store, a private stamp folder, and the list each file_sha256 call of the store appends its file to."""
    root, stamps = tmp_path / "s", tmp_path / "cache"
    store.write_store(rmat(300, 5.0, seed=1), root)
    hashed: list[str] = []
    real = store.file_sha256
    monkeypatch.setattr(store, "file_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    # the files were just written: stamp them anyway (the settle rule has its own test)
    monkeypatch.setattr(store, "STAMP_SETTLE_S", -1.0, raising=False)
    return root, stamps, hashed


def _same_graph(a, b) -> None:
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    for t in ("indptr", "indices", "eids"):
        assert np.array_equal(getattr(a.csr(), t).numpy(), getattr(b.csr(), t).numpy())


def test_second_open_reads_no_checksum(stored) -> None:
    """Fails on f7ba317: every open hashed every array (no stamps)."""
    root, stamps, hashed = stored
    first = load_graph(str(root), cache_dir=stamps)
    arrays = len(json.loads((root / store.MANIFEST).read_text())["arrays"])
    assert len(hashed) == arrays
    hashed.clear()
    second = load_graph(str(root), cache_dir=stamps)
    assert hashed == []
    _same_graph(first, second)


def test_a_changed_file_is_checked_again_and_refused(stored) -> None:
    root, stamps, hashed = stored
    load_graph(str(root), cache_dir=stamps)
    data = bytearray((root / "x.npy").read_bytes())
    data[-1] ^= 0xFF
    with open(root / "x.npy", "r+b") as f:  # in place: same inode, same size
        f.write(bytes(data))
    hashed.clear()
    with pytest.raises(GraphInputError, match="x.npy"):
        load_graph(str(root), cache_dir=stamps)
    assert "x.npy" in hashed


def test_an_edited_manifest_is_not_trusted(stored) -> None:
    root, stamps, hashed = stored
    load_graph(str(root), cache_dir=stamps)
    manifest = json.loads((root / store.MANIFEST).read_text())
    manifest["name"] = "renamed"
    (root / store.MANIFEST).write_text(json.dumps(manifest))
    hashed.clear()
    assert load_graph(str(root), cache_dir=stamps).name == "renamed"
    assert len(hashed) == len(manifest["arrays"])


def test_no_stamp_without_a_cache_or_in_a_folder_others_can_write(stored, tmp_path: Path) -> None:
    root, stamps, hashed = stored
    for _ in range(2):
        load_graph(str(root), use_cache=False)
        store.open_store(root)
    assert len(hashed) == 4 * len(json.loads((root / store.MANIFEST).read_text())["arrays"])
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    hashed.clear()
    load_graph(str(root), cache_dir=shared)
    load_graph(str(root), cache_dir=shared)
    assert len(hashed) == 2 * len(json.loads((root / store.MANIFEST).read_text())["arrays"])
    assert not any(shared.iterdir())


def test_files_changed_just_before_the_check_are_not_stamped(stored, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write in the clock tick of the check could leave the file's times as checked ("racily clean")."""
    root, stamps, hashed = stored
    monkeypatch.setattr(store, "STAMP_SETTLE_S", 3600.0)
    load_graph(str(root), cache_dir=stamps)
    hashed.clear()
    load_graph(str(root), cache_dir=stamps)
    assert hashed  # checked again: nothing was stamped
