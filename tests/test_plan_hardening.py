"""A plan directory is data written by a compiler and read by anyone (issue 40, item 3): every malformed record
is a PlanError naming it (exit 2, no traceback), a plan never chooses a path, shards stay inside the plan, and
writing a plan replaces the old one whole or not at all."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES
from gnnc import api, cli
from gnnc.errors import GnncError, OutOfSpace, PlanError
from gnnc.plan import plan_file, shard_files
from gnnc.plan.plan_file import Plan
from gnnc.plan.shard_files import read_manifest

SPEC = "rmat:n=64"


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[int, Path]:
    """A GCN plan for one worker and one for two (plan.json, parts.npy and two shards)."""
    model, graph = api.load_model(EXAMPLES / "gcn.gnn"), api.load_graph(SPEC)
    root = tmp_path_factory.mktemp("plans")
    return {w: api.compile(model, graph, workers=w, graph_spec=SPEC).save(root / f"w{w}") for w in (1, 2)}


def _copy(plan: Path, into: Path, edit_json=None, ir: tuple[str, str] | None = None,
          edit_manifest=None) -> Path:
    """A copy of `plan` with plan.json, its IR or the shard manifest edited and every checksum recomputed."""
    shutil.copytree(plan, into)
    data = json.loads((into / "plan.json").read_text())
    if edit_manifest is not None:
        manifest = json.loads((into / "shards" / "manifest.json").read_text())
        edit_manifest(manifest)
        (into / "shards" / "manifest.json").write_text(json.dumps(manifest))
        data["shards"]["shards/manifest.json"] = hashlib.sha256((into / "shards" / "manifest.json").read_bytes()
                                                                 ).hexdigest()
    if ir is not None:
        assert ir[0] in data["ir"]
        data["ir"] = data["ir"].replace(*ir)
        data["ir_sha256"] = hashlib.sha256(data["ir"].encode()).hexdigest()
    if edit_json is not None:
        edit_json(data)
    (into / "plan.json").write_text(json.dumps(data))
    return into


def _refused(path: Path, *words: str, command: tuple[str, ...] = ("inspect", "--format", "explain"),
             capsys=None) -> None:
    """Plan.load refuses the plan with an error holding `words`, and the CLI exits 2 with it (no traceback)."""
    with pytest.raises(GnncError) as err:
        Plan.load(path)
    for w in words:
        assert w in str(err.value)
    if capsys is not None:
        capsys.readouterr()
        assert cli.main([command[0], str(path), *command[1:]]) == 2
        out = capsys.readouterr().err
        assert "Traceback" not in out and all(w in out for w in words)


# --- malformed records beside the IR ---------------------------------------------------------------------


def _set(path: list[Any], value: Any):
    def edit(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


@pytest.mark.parametrize("path,value,field", [
    (["partition"], "x", "'partition'"),
    (["partition"], [1], "'partition'"),
    (["partition", "method"], 5, "'partition.method'"),
    (["planner"], 7, "'planner'"),
    (["planner", "predicted_time_s"], "fast", "'planner.predicted_time_s'"),
    (["planner", "alternatives", 0, "strategies"], "depcache", "'planner.alternatives[0].strategies'"),
    (["planner", "segment_costs", 0, "layers"], [0, 9], "'planner.segment_costs[0].layers'"),
    (["planner", "schedule", "stages", 0, "pieces", 0, "layer"], 5, "'planner.schedule.stages[0].pieces[0].layer'"),
    (["planner", "schedule", "stages", 0, "pieces", 0, "time_s"], [0.0], "'start_s' and 'time_s'"),
    (["schedule_report"], "x", "'schedule_report'"),
    (["schedule_report", "segments", 0, "options"], None, "'schedule_report.segments[0].options'"),
    (["schedule_report", "grad_alternatives"], [{"time_s": 1}], "'schedule_report.grad_alternatives[0]'"),
], ids=lambda v: json.dumps(v)[:40])
def test_malformed_plan_records_are_named(plans, tmp_path, capsys, path, value, field) -> None:
    plan = _copy(plans[2], tmp_path / "p", edit_json=_set(path, value))
    _refused(plan, field, capsys=capsys)


def test_every_record_a_compiled_plan_holds_fits(plans) -> None:
    for plan in plans.values():
        Plan.load(plan)


# --- strategies ------------------------------------------------------------------------------------------


def test_an_unknown_strategy_is_refused(plans, tmp_path, capsys) -> None:
    # the shards' layout edited alike (checksums recomputed): it used to run, reporting "nonsense x2"
    def edit(manifest: dict) -> None:
        for entry in manifest["shards"]:
            for layer in entry["layout"]["layers"].values():
                layer["strategy"] = "nonsense"
    chosen = re.search(r"strategy=(\w+)", json.loads((plans[2] / "plan.json").read_text())["ir"])
    assert chosen is not None  # the planner's choice, whichever strategy it is
    plan = _copy(plans[2], tmp_path / "p", ir=(f"strategy={chosen[1]}", "strategy=nonsense"), edit_manifest=edit)
    _refused(plan, "strategy 'nonsense'", command=("run", "--epochs", "1"), capsys=capsys)


@pytest.mark.parametrize("name", ["nonsense", "depcomm"])
def test_a_one_worker_plan_runs_the_one_worker_strategy_only(plans, tmp_path, name) -> None:
    plan = _copy(plans[1], tmp_path / "p", ir=("edges=self_loops @14:7", f"edges=self_loops [strategy={name}] @14:7"))
    _refused(plan, f"strategy {name!r}")


# --- a plan chooses no path ------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["checkpoint_dir=evil", "resume=true", "device=cuda", "seed=3"])
def test_the_ir_training_line_holds_training_settings_only(plans, tmp_path, setting) -> None:
    plan = _copy(plans[1], tmp_path / "p", ir=("training epochs=200", f"training epochs=200, {setting}"))
    _refused(plan, setting.split("=")[0])
    assert not (Path.cwd() / "evil").exists()



# --- writing a plan --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled() -> Plan:
    model, graph = api.load_model(EXAMPLES / "gcn.gnn"), api.load_graph(SPEC)
    return api.compile(model, graph, workers=2, graph_spec=SPEC)


def test_a_missing_parent_directory_is_named(compiled, tmp_path, capsys) -> None:
    with pytest.raises(PlanError, match=f"directory {tmp_path / 'missing' / 'dir'} does not exist"):
        compiled.save(tmp_path / "missing" / "dir" / "plan")
    assert not (tmp_path / "missing").exists()
    assert cli.main(["compile", str(EXAMPLES / "gcn.gnn"), "--graph", SPEC, "-o",
                     str(tmp_path / "missing" / "plan")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _full_disk(monkeypatch, after: int) -> None:
    """The shard writer's new files (temporary ones, or in a plan being written the shards themselves:
    gnnc.files.temporary_for) fail with ENOSPC from the `after`-th on, as on a full disk."""
    real = shard_files.temporary_for
    calls = []

    def made(path):
        calls.append(path)
        if len(calls) > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path)
    monkeypatch.setattr(shard_files, "temporary_for", made)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_failed_recompile_keeps_the_old_plan(compiled, plans, tmp_path, monkeypatch) -> None:
    plan_dir = shutil.copytree(plans[2], tmp_path / "plan")
    before = _snapshot(plan_dir)
    _full_disk(monkeypatch, after=1)  # the first shard written, the second refused
    with pytest.raises(OutOfSpace, match="No space left") as err:
        compiled.save(plan_dir)
    assert err.value.exit_code == 1 and "TMPDIR" not in str(err.value)  # -o chose where, not TMPDIR
    assert _snapshot(plan_dir) == before  # old plan whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # the new one removed, nothing beside it
    Plan.load(plan_dir)


def test_a_failed_first_compile_leaves_nothing(compiled, tmp_path, monkeypatch) -> None:
    _full_disk(monkeypatch, after=0)
    with pytest.raises(OutOfSpace):
        compiled.save(tmp_path / "plan")
    assert list(tmp_path.iterdir()) == []


def test_a_recompile_replaces_the_plan_whole(compiled, plans, tmp_path) -> None:
    plan_dir = shutil.copytree(plans[2], tmp_path / "plan")
    (plan_dir / "shards" / "rank-00007.npz").write_bytes(b"left from an older plan")
    compiled.save(plan_dir)
    assert not (plan_dir / "shards" / "rank-00007.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
    assert Plan.load(plan_dir).shard_dir == plan_dir / "shards"


def test_a_directory_that_is_no_plan_is_not_replaced(compiled, tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PlanError, match="holds no plan"):
        compiled.save(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
