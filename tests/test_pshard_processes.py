"""A plan's shards built and written by several processes (gnnc.plan.shards.write_plan_shards over
gnnc.parallel.map_processes, issue 34: the products compile's structures and shard files used one of two cores).

The same files, byte for byte, as one process writes; a child that fails makes the save fail with its error,
leaves no plan, no half-written directory and no process behind; small graphs fork nothing. Each test fails on
ca3da6e (no `PROCESS_EDGES`, no `processes` argument, no `shard_processes`/`rank_groups`)."""
from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from conftest import EXAMPLES
from gnnc import api
from gnnc.errors import InternalError
from gnnc.graph.loaders import load_graph
from gnnc.plan import shards


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _children() -> set[int]:
    """This process's child processes (every thread's), from /proc (other tests' may be running: compare)."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as fh:
            out += [int(x) for x in fh.read().split()]
    return set(out)


def _writers(monkeypatch: pytest.MonkeyPatch, marks: Path) -> None:
    """Each rank's structures leave a file naming the process that built them (children's memory is their own)."""
    real = shards.rank_arrays
    marks.mkdir()

    def marked(graph, parts, rank, *args, **kwargs):
        (marks / f"{rank}-{os.getpid()}").touch()
        return real(graph, parts, rank, *args, **kwargs)

    monkeypatch.setattr(shards, "rank_arrays", marked)
    features = shards.write_features
    monkeypatch.setattr(shards, "write_features", lambda out, graph: (marks / f"x-{os.getpid()}").touch() or
                        features(out, graph))


CASES = [("sage", "depcache", 0), ("sage", "depcache", 5), ("gcn", "hybrid", 1), ("gcn", "hybrid", 7),
         ("gat", "depcomm", 2), ("gin", "bcast1d", 3), ("sage", None, 4)]


@pytest.mark.parametrize("model,strategy,seed", CASES)
def test_two_processes_write_the_files_one_writes(model: str, strategy: str | None, seed: int, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans of generated graphs (R-MAT, several seeds; depcache, hybrid, depcomm's halos, bcast1d's blocks, the
    planner's choice) saved with 1 and 2 processes: every file equal, every rank built once and the shared
    features' file written once, by the children."""
    graph = load_graph(f"rmat:n=1500,deg=8,features=6,classes=3,seed={seed}")
    plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph, workers=4, strategy=strategy, threads=1)
    monkeypatch.setattr(shards, "PROCESS_EDGES", 0)  # a small graph: forced onto processes
    _writers(monkeypatch, tmp_path / "marks")
    before = _children()
    dataclasses.replace(plan, threads=1).save(tmp_path / "one")
    one = sorted(p.name for p in (tmp_path / "marks").iterdir())
    assert {int(m.split("-")[1]) for m in one} == {os.getpid()}
    for m in one:
        (tmp_path / "marks" / m).unlink()
    dataclasses.replace(plan, threads=2).save(tmp_path / "two")
    two = sorted(p.name for p in (tmp_path / "marks").iterdir())
    shared = (tmp_path / "one" / "shards" / "features.npy").is_file()
    assert shared or strategy != "depcache"  # depcache's ranks read the shared features
    assert sorted(m.split("-")[0] for m in two) == ["0", "1", "2", "3"] + (["x"] if shared else [])
    pids = {int(m.split("-")[1]) for m in two}
    assert os.getpid() not in pids and len(pids) == 2, two  # the features' file too, in a child
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    assert _children() <= before, _children() - before


def test_a_plan_saved_by_processes_loads_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest the parent writes from the children's entries lists every shard in rank order, and each
    rank's shard loads against it (size, sha256)."""
    graph = load_graph("rmat:n=1200,deg=6,features=5,classes=3,seed=9")
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy="depcache", threads=2)
    assert plan.threads == 2
    monkeypatch.setattr(shards, "PROCESS_EDGES", 0)
    plan.save(tmp_path / "plan")
    manifest = shards.read_manifest(tmp_path / "plan" / "shards")
    assert [e["part"] for e in manifest["shards"]] == [0, 1, 2, 3]
    for rank in range(4):
        data = shards.load_rank(tmp_path / "plan" / "shards", rank, 4)
        assert data.lg.n_owned == int((plan.parts == rank).sum())


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_child_fails_the_save_and_leaves_nothing(how: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A child's exception is the save's (an InternalError where it was killed by a signal); no plan directory,
    no hidden half-written one, no process left."""
    graph = load_graph("rmat:n=1500,deg=8,features=6,classes=3,seed=11")
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy="depcache", threads=2)
    monkeypatch.setattr(shards, "PROCESS_EDGES", 0)
    parent = os.getpid()
    real = shards.rank_arrays

    def failing(graph, parts, rank, *args, **kwargs):
        if os.getpid() != parent and rank == 2:  # only in a child: one process would write the plan
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("rank 2 cannot be built")
        return real(graph, parts, rank, *args, **kwargs)

    monkeypatch.setattr(shards, "rank_arrays", failing)
    before = _children()
    with pytest.raises(ValueError if how == "raise" else InternalError) as err:
        plan.save(tmp_path / "plan")
    assert ("rank 2 cannot be built" if how == "raise" else "SIGKILL") in str(err.value)
    assert list(tmp_path.iterdir()) == []  # neither the plan nor `Plan.save`'s hidden new directory
    assert _children() <= before, _children() - before


def test_small_graphs_fork_nothing() -> None:
    """`shard_processes`: one process below `PROCESS_EDGES` structure edges or with one thread; else up to one
    per rank and as many as the memory available holds. A small plan's save (Cora for 4 workers) stays in this
    process with any thread count."""
    assert shards.shard_processes(2, [shards.PROCESS_EDGES // 8] * 4) == 1
    assert shards.shard_processes(1, [shards.PROCESS_EDGES] * 4) == 1
    assert shards.shard_processes(2, [shards.PROCESS_EDGES] * 4) == 2
    assert shards.shard_processes(16, [shards.PROCESS_EDGES] * 4) == 4
    # memory: each process beyond the first holds one rank's arrays, RANK_BYTES_PER_EDGE per edge of the largest
    rank = shards.RANK_BYTES_PER_EDGE * shards.PROCESS_EDGES
    assert shards.shard_processes(16, [shards.PROCESS_EDGES] * 4, available=2 * rank) == 3
    assert shards.shard_processes(16, [shards.PROCESS_EDGES] * 4, available=rank - 1) == 1
    assert shards.shard_processes(2, [shards.PROCESS_EDGES] * 4, available=100 * rank) == 2
    graph = load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy="depcache", threads=2)
    specs, sets = plan.row_sets
    assert shards.shard_processes(plan.threads, shards.rank_edges(graph, specs, sets, 4)) == 1


def test_rank_groups_balance_edges() -> None:
    """Ranks split by edges, largest first into the lightest group, each group in rank order; all ranks once."""
    assert shards.rank_groups([10, 1, 1, 1, 9, 2], 2) == [[0, 1, 2], [3, 4, 5]]
    assert shards.rank_groups([5, 5, 5], 1) == [[0, 1, 2]]
    assert shards.rank_groups([3, 2], 4) == [[0], [1]]
    groups = shards.rank_groups([7, 3, 8, 1, 4, 4, 6, 2], 2)
    assert sorted(r for g in groups for r in g) == list(range(8))
    assert [sum([7, 3, 8, 1, 4, 4, 6, 2][r] for r in g) for g in groups] == [18, 17]
