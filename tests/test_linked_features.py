"""A plan's shared features are its graph store's x file, copied by the kernel, not read, hashed and written again.

Ranks that each hold most of the graph's rows read them from one `features.npy` beside the shards; for a graph
opened from a store that file's bytes are the store's x.npy, byte for byte (the products compile read, hashed and
wrote its 0.98 GB again: 2.5 CPU s). Copied (gnnc.files.copy_into: copy_file_range, sendfile where refused) only
while the graph's x is still the array mapped from that file and the file is the one checked at open, with the
store's checksum; the store's file is only read (a hard link would change its change time, which the store's
verification stamp holds: the next open would check every byte again).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnc
from conftest import EXAMPLES
from gnnc import files
from gnnc.graph import store
from gnnc.plan import shard_files, shards

PLAN_FIELDS = ("bytes", "dtype", "sha256", "shape")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("store") / "cora"
    store.write_store(gnnc.load_graph("planetoid:cora"), root)
    return root


@pytest.fixture(scope="module")
def program():
    return gnnc.load_model(EXAMPLES / "gcnii.gnn")


def _save(program, graph, path: Path) -> dict:
    # the example's 64 layers, depcache x64: every rank holds most rows, so they read one shared features file
    gnnc.compile(program, graph, workers=4, strategy="depcache").save(path)
    return json.loads((path / "shards" / "manifest.json").read_text())


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.is_sparse else t


def _x_entry(root: Path) -> dict:
    return json.loads((root / store.MANIFEST).read_text())["arrays"]["x"]


def test_a_stores_features_are_copied_with_its_checksum(stored, program, tmp_path, monkeypatch) -> None:
    graph = store.open_store(stored)
    before = os.stat(stored / "x.npy")
    written = []  # x written out of memory (read, hashed, written: what a store's file is spared)
    real = shards._npy_writer
    monkeypatch.setattr(shards, "_npy_writer", lambda *args: written.append(args[1]) or real(*args))
    manifest = _save(program, graph, tmp_path / "plan")
    features = tmp_path / "plan" / "shards" / "features.npy"
    assert features.read_bytes() == (stored / "x.npy").read_bytes()
    x = _x_entry(stored)
    assert manifest["features"] == {"file": "features.npy", **{k: x[k] for k in PLAN_FIELDS}}
    assert written == []
    after = os.stat(stored / "x.npy")  # only read: the identity a verification stamp holds is unchanged
    assert (after.st_ino, after.st_nlink, after.st_mtime_ns, after.st_ctime_ns) == \
        (before.st_ino, before.st_nlink, before.st_mtime_ns, before.st_ctime_ns)
    assert os.stat(features).st_ino != after.st_ino
    # what a rank loads is what it loads from features written out of memory
    held = _save(program, gnnc.load_graph("planetoid:cora"), tmp_path / "held")
    assert written == ["features"] and held["features"] == manifest["features"]
    for rank in range(4):
        got = shards.load_rank(tmp_path / "plan" / "shards", rank, 4)
        want = shards.load_rank(tmp_path / "held" / "shards", rank, 4)
        assert got.inputs.keys() == want.inputs.keys()
        assert all(torch.equal(_dense(got.inputs[k]), _dense(want.inputs[k])) for k in want.inputs)


def test_features_replaced_after_the_open_are_written_from_memory(stored, program, tmp_path) -> None:
    root = tmp_path / "store"
    shutil.copytree(stored, root)
    graph = store.open_store(root)
    # another x.npy put in place by rename (what a store's writer does): the graph's x is the old file's bytes
    data = bytearray((root / "x.npy").read_bytes())
    data[-1] ^= 1
    (root / "x.new").write_bytes(bytes(data))
    os.replace(root / "x.new", root / "x.npy")
    assert store.array_file(graph, "x", graph.x) is None
    manifest = _save(program, graph, tmp_path / "plan")
    assert manifest["features"]["sha256"] == _x_entry(stored)["sha256"]  # the graph's bytes, not the new file's
    shards.load_rank(tmp_path / "plan" / "shards", 0, 4)  # its checksum is its own bytes'


def test_an_x_that_is_not_the_mapped_file_is_not_copied(stored) -> None:
    graph = store.open_store(stored)
    assert store.array_file(graph, "x", graph.x) == (stored / "x.npy", _x_entry(stored))
    assert store.array_file(graph, "x", graph.x.clone()) is None  # the same values, not the file's pages
    assert store.array_file(graph, "x", graph.x[1:]) is None
    assert store.array_file(graph, "x", graph.x.to_sparse()) is None  # features made sparse after the open
    assert store.array_file(gnnc.load_graph("planetoid:cora"), "x", graph.x) is None  # a graph held in memory


@pytest.mark.parametrize("refusal", [None, errno.EXDEV, errno.ENOSYS])
def test_the_kernel_copies_every_byte(tmp_path, monkeypatch, refusal) -> None:
    src = tmp_path / "src.bin"
    data = np.random.default_rng(0).integers(0, 256, 3_000_001, dtype=np.uint8).tobytes()
    src.write_bytes(data)
    if refusal is not None:  # copy_file_range refused (another file system, an old kernel): sendfile
        def refuse(*args, **kwargs):
            raise OSError(refusal, os.strerror(refusal))
        monkeypatch.setattr(files.os, "copy_file_range", refuse)
    with open(tmp_path / "copy.bin", "wb") as f:
        assert files.copy_into(src, f) == len(data)
    assert (tmp_path / "copy.bin").read_bytes() == data


def test_a_copy_is_put_in_place_by_the_shard_writer(tmp_path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"features")
    with shard_files.ShardWriter() as writer:
        writer.write(tmp_path / "rank-00000.npz", 0, {"a": np.arange(3)})
        writer.copy(tmp_path / "features.npy", src)
        entries = writer.entries()
    assert [e["part"] for e in entries] == [0]  # a copy has no manifest entry of its own
    assert (tmp_path / "features.npy").read_bytes() == b"features"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.npy", "rank-00000.npz", "src.bin"]
