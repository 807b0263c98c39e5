"""A plan is written into its new hidden directory without a rename and a directory fsync per file (issue 36:
compile time), yet every file and directory of it is on the disk before the swap makes it the plan.

gnnc.files.fresh_directory: inside the directory Plan.save fills and swaps in whole, each file is written under its
own name and fsynced once, each directory that received files is fsynced once, all before the swap's rename; the
swap's directory is fsynced after it. The gcnii example on Cora x4 wrote 8 files with 17 fsyncs and 8 renames;
now 11 fsyncs (8 files, the plan's two directories, the swap) and no rename but the swap's.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import gnnc
from conftest import EXAMPLES
from gnnc import files
from gnnc.plan.plan_file import Plan


@pytest.fixture(scope="module")
def plan() -> Plan:
    graph = gnnc.load_graph("planetoid:cora")
    return gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4, graph_spec="planetoid:cora")


def _record(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync (of the path its descriptor names), rename and replace, in order, in every thread."""
    events: list[tuple[str, str]] = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def synced(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def renamed(a, b) -> None:
        events.append(("rename", os.path.realpath(a)))  # the hidden new plan's name, swapped in
        rename(a, b)

    def replaced(a, b) -> None:
        events.append(("replace", os.path.realpath(b)))
        replace(a, b)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "rename", renamed)
    monkeypatch.setattr(os, "replace", replaced)
    return events


def test_a_new_plan_is_fsynced_once_per_file_and_directory_before_the_swap(plan, tmp_path, monkeypatch) -> None:
    events = _record(monkeypatch)
    out = plan.save(tmp_path / "plan")
    monkeypatch.undo()
    written = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(written) >= 4  # parts, plan.json, shards and their manifest
    kinds = [kind for kind, _ in events]
    assert kinds.count("replace") == 0  # no temporary file renamed into place (8 for this plan before)
    assert kinds.count("rename") == 1  # the swap
    swap = kinds.index("rename")
    before = [path for kind, path in events[:swap] if kind == "fsync"]
    after = [path for kind, path in events[swap + 1:] if kind == "fsync"]
    hidden = Path(events[swap][1])
    # each file once, each of the plan's two directories once, nothing else
    assert sorted(before) == sorted([str(hidden / p.relative_to(out)) for p in written]
                                    + [str(hidden), str(hidden / "shards")])
    assert after == [str(out.parent)]  # the swap's own directory, once
    for p in written:  # the modes tempfile.mkstemp gave them before
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert Plan.load(out).workers == 4


def test_outside_a_plan_being_written_a_file_is_still_renamed_into_place(tmp_path, monkeypatch) -> None:
    events = _record(monkeypatch)
    files.atomic_write(tmp_path / "x.bin", b"data")
    monkeypatch.undo()
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]  # the file, its rename, its directory
    assert (tmp_path / "x.bin").read_bytes() == b"data"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_a_failed_write_in_a_fresh_directory_fsyncs_nothing_more(tmp_path, monkeypatch) -> None:
    fresh = tmp_path / ".new"
    fresh.mkdir()
    events = _record(monkeypatch)
    with pytest.raises(RuntimeError):
        with files.fresh_directory(fresh):
            files.atomic_write(fresh / "a", b"1")
            raise RuntimeError("interrupted")
    monkeypatch.undo()
    assert events == [("fsync", str(fresh / "a"))]  # the file only: no directory made durable for a failed plan
    assert not files._FRESH  # the directory is no longer treated as fresh
    events = _record(monkeypatch)
    files.atomic_write(fresh / "b", b"2")  # written the usual way again
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
