"""Writing a plan and building its row sets without repeated work (issue 36: compile time).

A deep model's plan on a large graph spends seconds after the planner: every rank's row sets walk the graph's
edges per layer, and its shards (1.5 GB for GCNII x32 on an 89,000-vertex SBM) are written and checksummed.
The row sets walk each (edge view, row mask) once per rank; each shard is hashed as it is written (never read
back), its bytes and manifest the same as before.
"""
from __future__ import annotations

import hashlib
import io
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import gnnc
from conftest import EXAMPLES
from gnnc.files import file_sha256
from gnnc.plan import rows, shard_files
from gnnc.plan.shard_files import ShardWriter, verify_shards


def test_row_sets_walk_each_view_and_mask_once(monkeypatch) -> None:
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=16), graph, workers=4, strategy="hybrid")
    specs = rows.layer_specs(plan.program)
    want = rows.all_row_sets(graph, plan.parts, 4, specs, plan.cached)
    walks: Counter = Counter()
    walk = rows._sources

    def counted(indptr: np.ndarray, indices: np.ndarray, mask: np.ndarray) -> np.ndarray:
        walks[(len(indices), mask.tobytes())] += 1
        return walk(indptr, indices, mask)

    monkeypatch.setattr(rows, "_sources", counted)
    for rank in range(4):
        walks.clear()
        got = rows.rank_row_sets(graph, plan.parts, rank, specs, {k: v[rank] for k, v in (plan.cached or {}).items()})
        assert walks and max(walks.values()) == 1, f"rank {rank}: a view and mask walked {max(walks.values())} times"
        for field in ("held_in", "held_out", "halos"):
            for a, b in zip(getattr(got, field), getattr(want[rank], field)):
                assert (a is None and b is None) or np.array_equal(a, b)
        assert got.entries.keys() == want[rank].entries.keys() and got.orders.keys() == want[rank].orders.keys()
        assert all(np.array_equal(got.entries[k], want[rank].entries[k]) for k in got.entries)
        assert all(np.array_equal(got.orders[k], want[rank].orders[k]) for k in got.orders)


def test_shards_are_hashed_as_they_are_written_not_read_back(tmp_path: Path, monkeypatch) -> None:
    read_back = []
    monkeypatch.setattr(shard_files, "file_sha256", lambda path: read_back.append(path))
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4)
    plan.save(tmp_path / "plan")
    assert read_back == []  # each shard's sha256 was taken of its bytes as they went out
    monkeypatch.undo()
    manifest = verify_shards(tmp_path / "plan" / "shards")  # every checksum is its file's
    assert [e["part"] for e in manifest["shards"]] == [0, 1, 2, 3]


def _zipfile_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes np.savez's zipfile writes (zip64 headers forced, fixed timestamps): what shards were before
    ShardWriter wrote the zip itself, and what np.load reads."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(arr), allow_pickle=False)
    return f.getvalue()


def test_a_shard_is_the_bytes_zipfile_would_write(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 5)).astype(np.float32)
    arrays = {"x": a, "fortran": np.asfortranarray(a), "strided": a[:, ::2], "scalar": np.array(5),
              "empty": np.zeros((0, 3)), "mask": rng.random(9) > 0.5, "i32": np.arange(10, dtype=np.int32),
              "big_endian": np.arange(4, dtype=">i8"), "half": np.ones(3, np.float16), "text": np.array(["ab", "c"]),
              "long": rng.integers(0, 9, 300_000), "n\u00e4me": np.arange(3)}
    entry = shard_files.write_npz(tmp_path / "s.npz", 0, arrays)
    data = (tmp_path / "s.npz").read_bytes()
    assert data == _zipfile_npz(arrays)
    assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    with np.load(tmp_path / "s.npz", allow_pickle=False) as f:
        assert all(np.array_equal(f[k], v) and f[k].dtype == v.dtype for k, v in arrays.items())


def test_a_shard_that_fails_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Object arrays"):
        with ShardWriter() as writer:
            writer.write(tmp_path / "s0.npz", 0, {"a": np.arange(3)})
            writer.write(tmp_path / "s1.npz", 1, {"a": np.arange(3), "b": np.array([{}], dtype=object)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.npz"]


def test_a_shard_writer_lists_its_shards_in_writing_order(tmp_path: Path) -> None:
    arrays = [{"a": np.arange(n), "b": np.full((n, 3), n, dtype=np.float32)} for n in (5, 1, 4000)]
    with ShardWriter() as writer:
        for part, a in enumerate(arrays):
            writer.write(tmp_path / f"s{part}.npz", part, a, note=part * 2)
        entries = writer.entries()
    assert [(e["part"], e["file"], e["note"]) for e in entries] == [(0, "s0.npz", 0), (1, "s1.npz", 2),
                                                                     (2, "s2.npz", 4)]
    for e in entries:
        path = tmp_path / e["file"]
        assert e["sha256"] == file_sha256(path) and e["bytes"] == path.stat().st_size
    single = shard_files.write_npz(tmp_path / "one.npz", 0, arrays[2])
    assert single["sha256"] == entries[2]["sha256"]  # the same bytes as the writer's


def test_a_depcache_segments_row_sets_walk_each_edge_once(monkeypatch) -> None:
    """A depcache segment's rows grow layer by layer towards its start (each set holds the one after it): the
    in-edges of a row are read once per rank, not once per layer of a segment that reaches most of the graph
    (issue 34: three passes over nearly every edge per rank for three layers on the products stand-in)."""
    from conftest import random_graph

    graph = random_graph(2000, 20000, seed=3)
    world = 4
    parts = np.random.default_rng(0).integers(0, world, graph.num_nodes)
    specs = [rows.LayerSpec(f"l{k}", "self_loops", "depcache", 0) for k in range(3)]
    want = rows.all_row_sets(graph, parts, world, specs)
    walked = []
    walk = rows._sources

    def counted(indptr: np.ndarray, indices: np.ndarray, mask: np.ndarray) -> np.ndarray:
        walked.append(int(np.diff(indptr)[mask].sum()))
        return walk(indptr, indices, mask)

    monkeypatch.setattr(rows, "_sources", counted)
    edges = graph.csr("self_loops").nnz
    for rank in range(world):
        walked.clear()
        got = rows.rank_row_sets(graph, parts, rank, specs)
        assert sum(walked) <= edges, f"rank {rank}: {sum(walked)} in-edges read for a graph of {edges}"
        for field in ("held_in", "held_out"):
            assert all(np.array_equal(a, b) for a, b in zip(getattr(got, field), getattr(want[rank], field)))
        assert all(np.array_equal(a, b) for a, b in zip(got.halos, want[rank].halos))
        assert all(np.array_equal(got.orders[k], want[rank].orders[k]) for k in got.orders)
