"""A plan's shared features are its graph store's x file, linked, not read, hashed and written again (issue 34).

Ranks that each hold most of the graph's rows read them from one `features.npy` beside the shards; for a graph
opened from a store that file's bytes are the store's x.npy, byte for byte (the products compile read, hashed and
wrote its 0.98 GB again: 2.5 CPU s and a GB to the disk). Linked only while the graph's x is still the array
mapped from that file and the file is the one checked at open; copied by the kernel where a link is refused.
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
from gnnc.plan import shards


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


def test_a_stores_features_are_linked_with_its_checksum(stored, program, tmp_path) -> None:
    graph = store.open_store(stored)
    manifest = _save(program, graph, tmp_path / "plan")
    features = tmp_path / "plan" / "shards" / "features.npy"
    assert os.stat(features).st_ino == os.stat(stored / "x.npy").st_ino  # the file itself, no byte written
    x = _x_entry(stored)
    assert manifest["features"] == {"file": "features.npy", **{k: x[k] for k in ("bytes", "dtype", "sha256", "shape")}}
    # what a rank loads is what it loads from features written out of memory
    held = _save(program, gnnc.load_graph("planetoid:cora"), tmp_path / "held")
    assert held["features"]["sha256"] == manifest["features"]["sha256"]
    for rank in range(4):
        got = shards.load_rank(tmp_path / "plan" / "shards", rank, 4)
        want = shards.load_rank(tmp_path / "held" / "shards", rank, 4)
        assert got.inputs.keys() == want.inputs.keys()
        assert all(torch.equal(_dense(got.inputs[k]), _dense(want.inputs[k])) for k in want.inputs)


def test_features_replaced_after_the_open_are_written(stored, program, tmp_path) -> None:
    root = tmp_path / "store"
    shutil.copytree(stored, root)
    graph = store.open_store(root)
    # another x.npy put in place by rename (what a store's writer does): the graph's x is the old file's bytes
    shutil.copy(root / "x.npy", root / "x.new")
    os.replace(root / "x.new", root / "x.npy")
    assert store.array_file(graph, "x", graph.x) is None
    _save(program, graph, tmp_path / "plan")
    assert os.stat(tmp_path / "plan" / "shards" / "features.npy").st_ino != os.stat(root / "x.npy").st_ino
    assert os.stat(tmp_path / "plan" / "shards" / "features.npy").st_nlink == 1
    shards.load_rank(tmp_path / "plan" / "shards", 0, 4)  # its checksum is its own bytes'


def test_an_x_that_is_not_the_mapped_file_is_not_linked(stored) -> None:
    graph = store.open_store(stored)
    assert store.array_file(graph, "x", graph.x) == (stored / "x.npy", _x_entry(stored))
    assert store.array_file(graph, "x", graph.x.clone()) is None  # the same values, not the file's pages
    assert store.array_file(graph, "x", graph.x[1:]) is None
    assert store.array_file(gnnc.load_graph("planetoid:cora"), "x", graph.x) is None  # a graph held in memory


@pytest.mark.parametrize("refusal", [errno.EXDEV, errno.EPERM])
def test_a_refused_link_is_a_copy(tmp_path, monkeypatch, refusal) -> None:
    src = tmp_path / "src.bin"
    data = np.random.default_rng(0).integers(0, 256, 3_000_001, dtype=np.uint8).tobytes()
    src.write_bytes(data)

    def refuse(*args, **kwargs):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(files.os, "link", refuse)
    assert files.place_file(src, tmp_path / "copy.bin") is False
    assert (tmp_path / "copy.bin").read_bytes() == data
    assert os.stat(tmp_path / "copy.bin").st_ino != os.stat(src).st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_link_replaces_the_file_atomically(tmp_path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"new")
    (tmp_path / "out.bin").write_bytes(b"old")
    assert files.place_file(src, tmp_path / "out.bin") is True
    assert (tmp_path / "out.bin").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin", "src.bin"]
