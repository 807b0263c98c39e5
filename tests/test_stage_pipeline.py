"""stage-pipeline alone, FileCheck style, and what insert-comm and predict-bytes make of a pipeline; the
pipeline's annotations are data (a malformed one is refused by name).

The graph of tests/test_pass_filecheck.py: 4 vertices (edges 0->2, 1->2, 3->0), 2 workers; two chunks,
{0, 1} and {2, 3} (METIS on the whole graph).
"""
from __future__ import annotations

import pytest

from test_pass_filecheck import context, prepared

from gnnc.errors import PlanError
from gnnc.ir.text import parse_ir
from gnnc.plan.pipeline import boundary_values, schedule_of
from gnnc.testing import filecheck, run_pass


def staged(ctx, chunks: int = 2):
    ctx.approximate = True
    program = prepared(ctx, "choose-strategy{strategy=pipeline},assign-strategy")
    return run_pass(f"stage-pipeline{{chunks={chunks}}}", program, ctx=ctx)


def test_stage_pipeline_annotates_stages_chunks_and_gradients() -> None:
    """Two workers, two graph layers: one stage each; the dense layer between them ends stage 0."""
    ctx = context()
    out = staged(ctx)
    filecheck(out, """
        CHECK: layer d0 dense [stage=0]
        CHECK: layer l0 graph GCNConv
        CHECK-SAME: [chunk_history=false, chunks=2, groups=1, history_every=23, segment=0, shuffle_chunks=true, stage=0, strategy=pipeline]
        CHECK: layer d1 dense [stage=0]
        CHECK: layer l1 graph GCNConv
        CHECK-SAME: [chunk_history=false, chunks=2, groups=1, history_every=23, pipe_grad=true, segment=0, shuffle_chunks=true, stage=1, strategy=pipeline]
        CHECK: layer d2 dense [stage=1]
    """)
    sched = schedule_of(out)
    assert (sched.stages, sched.groups, sched.chunks, sched.pipe_grad) == (2, 1, 2, (True,))
    assert [v.name for v in boundary_values(out, sched.stage_of, 1)] == ["h.2"]
    assert sorted(map(int, ctx.results.pipeline.parts)) == [0, 0, 1, 1]  # two chunks of two


def test_insert_comm_and_predict_bytes_of_a_pipeline() -> None:
    """Each aggregation reads its input through the history; the step sends every vertex's boundary row
    forward and its gradient back: 2 x 4 rows x hidden x 4 bytes."""
    ctx = context()
    out = run_pass("insert-comm,predict-bytes", staged(ctx), ctx=ctx)
    filecheck(out, """
        CHECK: layer l0 graph
        CHECK: %l0.t^history:vertex:f32[hidden] = history[bytes_bwd=0, bytes_fwd=0](%l0.t)
        CHECK-NEXT: = spmm[reduce=sum](%l0.t^history,
        CHECK: layer l1 graph
        CHECK: %l1.t^history:vertex:f32[classes] = history[bytes_bwd=0, bytes_fwd=0](%l1.t)
    """)
    hidden = 16
    assert ctx.results.predicted_bytes == {"pipe": 2 * 4 * hidden * 4, "history": 0, "allreduce": 0}
    assert ctx.results.pipeline_bytes == {"pipe": 4 * hidden * 4, "history": 0}


def test_stage_pipeline_leaves_other_programs_alone() -> None:
    ctx = context("depcomm")
    before = prepared(ctx, "assign-strategy")
    assert run_pass("stage-pipeline", before, ctx=ctx) is before


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("chunks=2, groups=1", "chunks=0, groups=1", 1), "same positive integer 'chunks'"),
    (lambda t: t.replace("[stage=0]", "[stage=1]", 1), "stages must start at 0"),
    (lambda t: t.replace("pipe_grad=true, ", ""), "needs pipe_grad=true|false"),
])
def test_a_malformed_pipeline_is_refused_by_name(edit, message: str) -> None:
    text = str(staged(context()))
    with pytest.raises(PlanError, match=message):
        schedule_of(parse_ir(edit(text)))



def test_cli_refuses_the_pipeline_without_approximate_and_marks_it_with(capsys) -> None:
    import json

    from gnnc.cli import main

    args = ["compile", "examples/gcnii.gnn", "--set", "layers=4", "--graph", "rmat:n=300,deg=5,features=16,classes=4,"
            "seed=0", "--workers", "2", "--strategy", "pipeline"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "strategy pipeline: a layer reads the historical embedding" in err and "pass --approximate" in err
    assert "Traceback" not in err
    assert main([*args, "--approximate", "--json", "--explain"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["exact"] is False and summary["approximations"][0].startswith("strategy pipeline:")
    assert "approximate: strategy pipeline: a layer reads the historical embedding" in out
    assert "pipeline: 2 stages of 1 worker(s)" in out


def test_the_pipeline_refuses_ops_with_statistics_over_every_vertex() -> None:
    from gnnc import api
    from gnnc.errors import GnncError

    from test_pass_filecheck import tiny_graph

    source = """
layer Conv(in, out) with self_loops {
  transform t = linear(h, out)
  scatter   m = edge.gcn_norm * src.t
  gather    a = sum(m)
  apply     h = a
}
model M(features, hidden = 8, classes) {
  h = Conv(features, hidden)(x)
  h = batch_norm(h)
  h = Conv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
    model = api.load_model_source(source, "bn.gnn")
    with pytest.raises(GnncError, match="'batch_norm' .* cannot run in it"):
        api.compile(model, tiny_graph(), workers=2, strategy="pipeline", approximate=True)


def test_a_pipeline_shard_is_refused_for_another_pipeline(tmp_path) -> None:
    """A rank's shard holds its member's chunks: an IR edited to another chunk count or group size is refused
    before anything runs, naming what the shard was cut for."""
    import dataclasses

    from gnnc import api
    from gnnc.plan.pipeline_shards import load_pipeline_rank

    from test_pipeline import GRAPH

    plan = api.compile(api.load_model("examples/gcnii.gnn", layers=4), GRAPH, workers=2, strategy="pipeline",
                       approximate=True)
    shards = plan.write_shards(tmp_path / "shards")
    sched = schedule_of(plan.program)
    assert load_pipeline_rank(shards, 1, 2, sched).stage == 1
    with pytest.raises(PlanError, match=r"cut for another pipeline \(stage, member, stages, groups, chunks \[1, 0, 2, "
                                        r"1, 8\]\)"):
        load_pipeline_rank(shards, 1, 2, dataclasses.replace(sched, chunks=4))


def test_a_plans_pipeline_record_is_data_of_known_shape(tmp_path) -> None:
    import json

    from gnnc import api
    from gnnc.plan.plan_file import Plan

    from test_pipeline import GRAPH

    plan = api.compile(api.load_model("examples/gcnii.gnn", layers=4), GRAPH, workers=2, strategy="pipeline",
                       approximate=True)
    plan.save(tmp_path / "plan")
    assert Plan.load(tmp_path / "plan").meta.pipeline["stages"] == 2
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    data["pipeline"]["split"] = [[0, "two"]]
    (tmp_path / "plan" / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="'pipeline' must hold the stage, group, chunk and history counts"):
        Plan.load(tmp_path / "plan")
