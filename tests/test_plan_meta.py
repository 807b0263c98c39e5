"""PlanMeta, what plan.json keeps beside the IR: one typed record with one JSON round trip.

Plan.load used to copy a whitelist of plan.json's keys into a dict, so a record the compiler wrote but the list
forgot (workers_considered) was silently dropped, and a key nobody knew was silently ignored.
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from conftest import EXAMPLES
import gnnc
from gnnc import cli
from gnnc.errors import PlanError
from gnnc.graph.sampling import SamplingConfig
from gnnc.plan.plan_file import Plan
from gnnc.plan.plan_meta import Partition, PlanMeta, PlannerRecord, WorkersTried

SEGMENT = {"layers": [0, 2], "strategy": "depcomm", "time_s": 0.5, "bytes": 10, "memory_bytes": 20}
STAGE = {"direction": "forward", "kind": "layer", "strategy": "depcomm", "layers": [0], "segment": [0, 2],
         "start_s": 0.0, "time_s": 0.5, "pieces": [{"layer": 0, "op": "spmm", "track": "compute", "overlap": None,
                                                    "start_s": [0.0, 0.0], "time_s": [0.5, 0.4]}]}
# every field set to something other than its default (checked below, so a new field needs a value here)
FULL = PlanMeta(
    partition=Partition("metis", 2, 3, of="pipeline chunks"),
    planner=PlannerRecord(strategies=["depcomm", "depcomm"], predicted_time_s=0.5, predicted_memory_bytes=1024,
                          cluster="dgx-a100",
                          alternatives=[{"strategies": ["depcomm", "depcomm"], "time_s": 0.5, "bytes": 10,
                                         "memory_bytes": 20, "formulas": {"depcomm[0:2]": "t"}}],
                          crossovers=["depcomm overtakes depcache above 1 Gb/s"], segments=[[0, 2, "depcomm"]],
                          segment_costs=[SEGMENT],
                          schedule={"time_s": 0.5, "workers": 2, "per": "worker", "cluster": "dgx-a100",
                                    "stages": [STAGE]}),
    precision="bf16",
    sampling=SamplingConfig((4, 3), 16),
    schedule="sequential",
    predicted_bytes_per_step={"halo": 8},
    predicted_bytes_per_epoch={"pull": 4},
    predicted_eval_bytes_per_epoch={"halo": 2},
    approximations=("the history is one step old",),
    hybrid=[{"layers": [0, 2], "cached_per_layer": [[0, 1]]}],
    schedule_report={"predicted_time_s": 0.5, "notes": ["overlap off"]},
    pipeline={"stages": 2, "groups": 1, "chunks": 2, "history_every": 1, "history_reads_per_layer": 0,
              "split": [[0, 1], [1, 2]], "bubble": {"stretch": 1.5, "idle_fraction": 0.25}},
    workers_considered=(WorkersTried(1, 0.7), WorkersTried(2, None)),
    graph_stand_ins={"y": "zeros (the graph has no labels)"},
)


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def test_every_field_round_trips_through_json() -> None:
    assert all(getattr(FULL, f.name) != _default(f) for f in dataclasses.fields(PlanMeta))
    data = json.loads(json.dumps(FULL.to_json()))
    assert set(data) == {f.name for f in dataclasses.fields(PlanMeta)}
    assert PlanMeta.from_json(data, 2, PlanError) == FULL


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), gnnc.load_graph("planetoid:cora"),
                        graph_spec="planetoid:cora")
    return plan, plan.save(tmp_path_factory.mktemp("meta") / "plan")


def test_plan_load_keeps_every_field(saved, tmp_path) -> None:
    plan = dataclasses.replace(saved[0], meta=FULL)
    plan.save(tmp_path / "plan")
    assert Plan.load(tmp_path / "plan").meta == FULL


def test_defaults_are_not_written() -> None:
    # an fp32 exact plan of one worker is the file it always was: no precision, approximations or partition keys
    assert PlanMeta().to_json() == {}
    assert Partition("metis", 2, 0).to_json() == {"method": "metis", "parts": 2, "seed": 0}


@pytest.mark.parametrize("key,value,message", [
    ("colour", "blue", "unknown field 'colour'"),
    ("partition", {"method": "metis", "parts": 2, "seed": 0, "colour": 1}, "unknown field 'partition.colour'"),
    ("hybrid", "x", "'hybrid' must be a list"),
    ("workers_considered", [{"workers": 1, "time_s": "fast"}], "'workers_considered[0].time_s' must be a number"),
    ("planner", {"strategies": ["local"], "predicted_time_s": 1.0}, "'planner' lacks 'predicted_memory_bytes'"),
    ("graph_stand_ins", {"y": 3}, "'graph_stand_ins' must map field names to descriptions"),
])
def test_a_bad_field_is_named_exit_2(saved, tmp_path, capsys, key, value, message) -> None:
    shutil.copytree(saved[1], tmp_path / "plan")
    path = tmp_path / "plan" / "plan.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Plan.load(tmp_path / "plan")
    assert cli.main(["inspect", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
