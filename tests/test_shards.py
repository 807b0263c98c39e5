"""Shards: they reassemble into the graph, agree on who sends what, and refuse to load when damaged."""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnc.errors import OutOfSpace, PlanError
from gnnc.passes.partition.stats import compute_stats
from gnnc.plan import shard_files as shards_mod
from gnnc.plan.shard_files import assemble, read_shard, verify_shards, write_shards
from tests.conftest import random_graph


def _same_graph(a, b) -> None:
    assert a.num_nodes == b.num_nodes
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)  # same edges, same order
    for field in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(4, 40), st.integers(0, 120), st.integers(1, 5), st.integers(0, 10_000))
def test_shards_reassemble_into_the_graph(tmp_path_factory, n: int, e: int, parts: int, seed: int) -> None:
    g = random_graph(n=n, e=e, f=3, seed=seed)
    part = np.random.default_rng(seed).integers(0, parts, n)
    out = tmp_path_factory.mktemp("shards")
    write_shards(g, part, parts, out, "test")
    _same_graph(assemble(out), g)


def test_send_and_receive_tables_agree(tmp_path) -> None:
    g = random_graph(n=60, e=300, seed=3)
    part = np.random.default_rng(0).integers(0, 4, 60)
    write_shards(g, part, 4, tmp_path)
    shards = [read_shard(tmp_path, i) for i in range(4)]
    stats = compute_stats(g, part, 1)
    for j, sh in enumerate(shards):
        assert np.array_equal(sh.remote_ids, stats.deps(j)[0])  # the rows j needs, in sending order
        for i in range(4):
            if i == j:
                continue
            expected = sh.remote_ids[sh.remote_owner == i]  # what j receives from i, in order
            sent = shards[i].global_ids[shards[i].sends_to(j)]
            assert np.array_equal(sent, expected)
        assert all(len(sh.sends_to(k)) == stats.send_matrix[j, k] for k in range(4))


def _written(tmp_path):
    g = random_graph(n=30, e=100, seed=1)
    write_shards(g, np.arange(30) % 3, 3, tmp_path, "hash")
    return tmp_path


def test_no_temporary_files_are_left(tmp_path) -> None:
    out = _written(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["assignment.npy", "manifest.json", "part-00000.npz",
                                                    "part-00001.npz", "part-00002.npz"]


def _no_array_reads(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("read an array before checking the shard")

    monkeypatch.setattr(shards_mod.np, "load", refuse)


def test_altered_shard_is_refused_before_reading(tmp_path, monkeypatch) -> None:
    out = _written(tmp_path)
    path = out / "part-00001.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    read_shard(out, 0)  # the other shards are fine
    _no_array_reads(monkeypatch)
    with pytest.raises(PlanError, match="part-00001.npz: shard of part 1 does not match its checksum"):
        read_shard(out, 1)
    with pytest.raises(PlanError, match="does not match its checksum"):
        verify_shards(out)


def test_truncated_shard(tmp_path, monkeypatch) -> None:
    out = _written(tmp_path)
    path = out / "part-00002.npz"
    path.write_bytes(path.read_bytes()[:100])
    _no_array_reads(monkeypatch)
    with pytest.raises(PlanError, match="shard of part 2 is truncated or altered: 100 bytes"):
        read_shard(out, 2)


def test_missing_shard_and_manifest(tmp_path) -> None:
    out = _written(tmp_path)
    (out / "part-00000.npz").unlink()
    with pytest.raises(PlanError, match="shard of part 0 is missing"):
        read_shard(out, 0)
    with pytest.raises(PlanError, match="no shard for part 3"):
        read_shard(out, 3)
    (out / "manifest.json").unlink()
    with pytest.raises(PlanError, match="missing shard manifest"):
        read_shard(out, 1)


def test_mismatched_manifest(tmp_path) -> None:
    out = _written(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][1]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PlanError, match="part 1 does not match its checksum"):
        read_shard(out, 1)
    manifest["parts"] = 5
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PlanError, match="lists 3 shards for 5 parts"):
        read_shard(out, 0)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(PlanError, match="unreadable shard manifest"):
        read_shard(out, 0)


def _manifest_edited(out, edit) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest["shards"])
    (out / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("entry", ["part-00001.npz", 7, None], ids=["string", "int", "null"])
def test_a_manifest_entry_that_is_not_an_object_is_named(tmp_path, entry) -> None:
    out = _written(tmp_path)
    _manifest_edited(out, lambda shards: shards.__setitem__(1, entry))
    with pytest.raises(PlanError, match="shard entry 1 must be an object"):
        read_shard(out, 0)


@pytest.mark.parametrize("name", ["/etc/shadow", "../manifest.json", "sub/part-00001.npz", "", ".."])
def test_a_shard_file_is_a_name_in_the_shard_directory(tmp_path, monkeypatch, name) -> None:
    out = _written(tmp_path)
    _manifest_edited(out, lambda shards: shards[1].__setitem__("file", name))
    opened = []
    monkeypatch.setattr(shards_mod, "file_sha256", lambda path: opened.append(path))
    with pytest.raises(PlanError, match="'file' must name a file in the shard directory"):
        read_shard(out, 1)
    assert opened == []  # nothing outside was opened or its size reported


def test_a_shard_linked_out_of_the_directory_is_refused(tmp_path) -> None:
    out = _written(tmp_path / "shards")
    outside = tmp_path / "outside.npz"
    outside.write_bytes((out / "part-00001.npz").read_bytes())  # even with the right size and checksum
    (out / "part-00001.npz").unlink()
    (out / "part-00001.npz").symlink_to(outside)
    with pytest.raises(PlanError, match="a link out of the shard directory"):
        read_shard(out, 1)
    (out / "inside.npz").symlink_to(out / "part-00002.npz")  # a link inside the directory is only a name
    _manifest_edited(out, lambda shards: shards[2].__setitem__("file", "inside.npz"))
    read_shard(out, 2)


def test_a_full_temporary_directory_is_named(tmp_path, monkeypatch) -> None:
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(shards_mod.tempfile, "mkstemp", full)  # every shard's temporary file is made by it
    monkeypatch.setattr(shards_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    g = random_graph(n=30, e=100, seed=1)
    with pytest.raises(OutOfSpace, match="No space left on device.*TMPDIR|TMPDIR.*No space left") as err:
        write_shards(g, np.arange(30) % 3, 3, tmp_path / "run", "hash")
    assert err.value.exit_code == 1
    assert list((tmp_path / "run").iterdir()) == []


def test_a_disk_that_fills_while_a_shard_is_written_leaves_nothing(tmp_path, monkeypatch) -> None:
    put = shards_mod._ZipOut._put

    def filling(self, data) -> None:
        if self.size > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        put(self, data)
    monkeypatch.setattr(shards_mod._ZipOut, "_put", filling)
    g = random_graph(n=300, e=2000, seed=1)
    with pytest.raises(OutOfSpace, match="No space left on device") as err:
        write_shards(g, np.arange(300) % 3, 3, tmp_path / "run", "hash")
    assert err.value.exit_code == 1
    assert list((tmp_path / "run").iterdir()) == []  # no shard, no temporary file
