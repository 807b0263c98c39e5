"""The schedule pass alone: the decisions it writes into the IR, how it prices them, golden IR on Cora.

FileCheck cases run it on IR prepared up to predict-bytes (tests/test_pass_filecheck.py's tiny graph
and Cora); golden cases keep the whole text after it (GNNC_UPDATE_GOLDEN=1 rewrites them). The IR it
writes must read back exactly (the plan stores it as text) and what it decides must be what the cost
model prices (gnnc.passes.cost.scheduled reads the same annotations).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, check_golden

import gnnc
from gnnc.errors import GnncError, PlanError
from gnnc.ir.text import parse_ir
from gnnc.passes.context import PassContext
from gnnc.passes.cost.scheduled import grad_buckets, program_segments, segment_options
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.passes.partition.core import Partition
from gnnc.plan.schedule_attrs import check_schedule
from gnnc.testing import filecheck, run_pass

UP_TO_SCHEDULE = DISTRIBUTED_PIPELINE[:-1]


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


def _model(name: str, **overrides):
    # a path relative to the repository, so the printed `source` line is the same on every machine
    return gnnc.load_model_source((EXAMPLES / f"{name}.gnn").read_text(), f"examples/{name}.gnn", **overrides)


def scheduled(graph, name: str, strategy: str, schedule: str = "schedule", workers: int = 2, **overrides):
    """(IR text after the schedule pass, the plan) for `name` on `graph` with a schedule pipeline entry."""
    out: dict[str, str] = {}
    plan = gnnc.compile(_model(name, **overrides), graph, workers=workers, strategy=strategy,
                        passes=DEFAULT_PIPELINE + UP_TO_SCHEDULE + [schedule],
                        after=lambda n, p: out.__setitem__(n, str(p)) if n == "schedule" else None)
    return out["schedule"], plan


# --- what it writes ----------------------------------------------------------------------------------


def test_gcn_halo_overlapped_its_reader_split(cora) -> None:
    """DepComm: the halo posted right after the map that makes its rows, in ring order; the sum runs per part."""
    text, _ = scheduled(cora, "gcn", "depcomm")
    filecheck(text, """
        CHECK: attrs grad_overlap=true
        CHECK: layer l0 graph GCNConv
        CHECK-SAME: [grad_bucket=0, strategy=depcomm]
        CHECK: %l0.t:vertex:f32[hidden] = linear
        CHECK-NEXT: %l0.t^halo:vertex:f32[hidden] = halo[{{.*}}method=ring, overlap=true](%l0.t)
        CHECK-NEXT: %l0.m~1:edge:f32[] = edata[name=gcn_norm, split=true]()
        CHECK-NEXT: %l0.a:vertex:f32[hidden] = spmm[reduce=sum, split=true](%l0.t^halo, %l0.m~1)
        CHECK-NEXT: %l0.s:vertex:f32[hidden] = sync[reduce=sum](%l0.a)
    """)


def test_gat_every_edge_op_split_the_feature_halo_posted_before_the_attention(cora) -> None:
    """GAT: both halos overlap; the scores, their softmax and the dropout on edges run per part."""
    text, _ = scheduled(cora, "gat", "depcomm")
    filecheck(text, """
        CHECK: layer l0 graph GATConv
        CHECK: %l0.z:vertex:f32[heads,hidden] = linear
        CHECK-NEXT: %l0.z^halo:vertex:f32[heads,hidden] = halo[{{.*}}overlap=true](%l0.z)
        CHECK: %l0.e~2^v^halo:vertex:f32[heads] = halo[{{.*}}overlap=true](%l0.e~2^v)
        CHECK: sddmm[op=add, split=true]
        CHECK: leaky_relu[slope=0.2, split=true]
        CHECK: edge_softmax[split=true]
        CHECK: dropout[p=0.6, split=true]
        CHECK: %l0.a:vertex:f32[heads,hidden] = spmm[reduce=sum, split=true](%l0.z^halo, %l0.m~1)
        CHECK-NEXT: concat(%l0.a)
    """)


def test_sage_bcast1d_staged(cora) -> None:
    """MG-GCN: the broadcast staged, its one reader (the mean) per block."""
    text, _ = scheduled(cora, "sage", "bcast1d")
    filecheck(text, """
        CHECK: bcast_rows[{{.*}}staged=true](%l0.t~1^g)
        CHECK-NEXT: spmm[reduce=mean, split=true](%l0.t~1^g^bcast_rows)
    """)


def test_nothing_overlapped_when_told(cora) -> None:
    text, _ = scheduled(cora, "gcn", "depcomm,bcast1d", "schedule{overlap=off staged=off grad_overlap=off}")
    filecheck(text, """
        CHECK: attrs grad_overlap=false
        CHECK: halo[{{.*}}method=ring, overlap=false]
        CHECK-NOT: split=true
        CHECK: bcast_rows[{{.*}}staged=false]
        CHECK-NOT: split=true
    """)


def test_ring_paced_exchanges_are_not_overlapped(cora) -> None:
    """ring_paced completes inside its start: overlapping it is not a choice, and the report says why."""
    text, plan = scheduled(cora, "gcn", "depcomm", "schedule{method=ring_paced}")
    assert "method=ring_paced, overlap=false" in text and "ring_paced, overlap=true" not in text
    assert "ring_paced" in plan.meta.schedule_report["segments"][0]["why"]


TWO_READERS = """
layer Twice(in, out) {
  scatter   m = src.h
  gather    a = sum(m)
  scatter   n = src.h
  gather    c = max(n)
  transform t = linear(concat(a, c), out)
  apply     h = t
}
model M(features, classes) {
  h = Twice(features, classes)(x)
  loss = cross_entropy(h, y, mask = train)
}
"""


def test_a_broadcast_read_twice_is_gathered_not_staged(cora) -> None:
    """A staged block is read once and dropped; a value two aggregations read is gathered first."""
    model = gnnc.load_model_source(TWO_READERS, "twice.gnn")
    out: dict[str, str] = {}
    plan = gnnc.compile(model, cora, workers=2, strategy="bcast1d",
                        after=lambda n, p: out.__setitem__(n, str(p)) if n == "schedule" else None)
    assert "staged=false" in out["schedule"] and "split=true" not in out["schedule"]
    assert "read by 2 equations" in plan.meta.schedule_report["segments"][0]["why"]


def test_bins_mark_the_per_bin_equations(cora) -> None:
    """G3's bins: the layer annotated, the aggregation and everything after it run per bin; the dense
    map that makes the exchanged rows and the halo run once (eager: the halo still overlaps)."""
    text, _ = scheduled(cora, "gcn", "depcomm", "schedule{bins=4}")
    filecheck(text, """
        CHECK: layer l0 graph GCNConv
        CHECK-SAME: [bin_order=boundary_bfs, bins=4, grad_bucket=0, strategy=depcomm]
        CHECK: linear[bias=false, out=hidden](%h, %l0.linear0.weight)
        CHECK-NEXT: halo[{{.*}}overlap=true](%l0.t)
        CHECK-NEXT: edata[bin=true, name=gcn_norm]()
        CHECK-NEXT: spmm[bin=true, reduce=sum](%l0.t^halo, %l0.m~1)
        CHECK-NEXT: sync[bin=true, reduce=sum]
        CHECK-NEXT: bias[bin=true]
    """)


def test_bucket_bytes_split_the_gradients_by_layer(cora) -> None:
    """Buckets hold whole layers, the last layers first (backward finishes them first)."""
    text, plan = scheduled(cora, "gcn", "depcomm", "schedule{bucket_bytes=1000}")
    program = plan.program
    buckets = {layer.name: layer.attr("grad_bucket") for layer in program.layers if layer.params}
    assert buckets == {"l1": 0, "l0": 1}  # l1's 16x7 weights fit 1000 bytes; l0's 1433x16 get their own
    sizes, ready = grad_buckets(program)
    assert sizes == [16 * 7 + 7, 1433 * 16 + 16] and ready == (1, 0)


# --- priced by the cost model, read back by it -------------------------------------------------------


def test_each_choice_is_priced_and_the_cheaper_taken(cora) -> None:
    _, plan = scheduled(cora, "gcn", "depcomm,bcast1d")
    segments = plan.meta.schedule_report["segments"]
    for seg in segments:
        times = {tuple(sorted(a["options"].items())): a["time_s"] for a in seg["alternatives"]}
        assert len(times) == (3 if "chunked" in seg["options"] else 2)  # chunks only of an overlapped halo
        assert seg["time_s"] == min(times.values()) == times[tuple(sorted(seg["options"].items()))]
    # on Cora a chunk's dispatch costs more than the little exchange it would hide
    assert segments[0]["options"] == {"overlap": True, "chunked": False, "bins": 1}
    assert segments[1]["options"] == {"staged": True}


@pytest.mark.parametrize("name", ["gcn", "sage", "gin", "gat"])
def test_a_segment_runs_and_is_priced_with_the_options_chosen(cora, name: str) -> None:
    """Every segment's options read back from the annotated IR are its cheapest alternative's, and priced as
    that one: a hoisted exchange (never split) does not turn a segment's later halos' overlap off in the price.
    GIN's Hybrid segment from layer 0 hoists the input features' halo; the schedule priced the segment without
    overlap although it chose, and the runtime runs, layer 1's halo split (session 26)."""
    _, plan = scheduled(cora, name, "hybrid", workers=4)
    for seg, entry in zip(program_segments(plan.program), plan.meta.schedule_report["segments"]):
        best = min(entry["alternatives"], key=lambda a: a["time_s"])
        layers = plan.program.graph_layers()[seg.start:seg.end]
        assert segment_options(layers, seg.strategy) == entry["options"] == best["options"]
        assert entry["time_s"] == best["time_s"]


def test_the_prediction_follows_the_annotations(cora) -> None:
    """The predicted epoch is drawn from what the IR says: overlap off costs more, and the segments'
    options read back from the IR are the ones the report priced."""
    _, on = scheduled(cora, "gat", "depcomm")
    _, off = scheduled(cora, "gat", "depcomm", "schedule{overlap=off}")
    assert off.meta.schedule_report["predicted_time_s"] > on.meta.schedule_report["predicted_time_s"]
    for plan, overlap in ((on, True), (off, False)):
        for seg, entry in zip(program_segments(plan.program), plan.meta.schedule_report["segments"]):
            layers = plan.program.graph_layers()[seg.start:seg.end]
            assert segment_options(layers, seg.strategy) == entry["options"] == {"overlap": overlap,
                                                                                 "chunked": False, "bins": 1}


def test_the_planner_prediction_is_redrawn_from_the_schedule(cora) -> None:
    plan = gnnc.compile(_model("gcn"), cora, workers=2, cluster="neutronstar-ecs")
    planner = plan.meta.planner
    assert planner.predicted_time_s == planner.schedule["time_s"] == plan.meta.schedule_report["predicted_time_s"]


def test_memory_cap_bins_as_few_as_meet_it(cora) -> None:
    _, free = scheduled(cora, "gat", "depcomm")
    _, most = scheduled(cora, "gat", "depcomm", "schedule{bins=1024}")
    peak, least = free.meta.schedule_report["activation_bytes"], most.meta.schedule_report["activation_bytes"]
    cap = int((peak + least) / 2)
    text, capped = scheduled(cora, "gat", "depcomm", f"schedule{{memory_cap={cap}}}")
    report = capped.meta.schedule_report
    assert report["activation_bytes"] <= cap < peak and f"memory_cap={cap}" in text
    bins = [layer.attr("bins", 1) for layer in capped.program.graph_layers()]
    assert max(bins) > 1
    # one bin fewer somewhere would not meet the cap: the greedy doubles one layer at a time from 1
    assert report["predicted_time_s"] > free.meta.schedule_report["predicted_time_s"]  # bins recompute in backward


def test_memory_cap_doubles_the_layer_that_sets_the_peak() -> None:
    """A third of the unbinned peak on a skewed graph: no binned layer could run in half its bins and
    stay under the cap (the greedy doubles the layer whose doubling lowers the peak most; doubling by
    what a layer keeps took the first layer to many more bins than the cap needs)."""
    from gnnc.cluster import resolve_cluster
    from gnnc.passes.cost.inputs import planning_inputs
    from gnnc.passes.cost.activations import estimate

    graph = gnnc.load_graph("rmat:n=10000,deg=40,features=64,classes=8,seed=0")
    _, free = scheduled(graph, "gat", "depcomm")
    cap = int(free.meta.schedule_report["activation_bytes"] / 3)
    text, capped = scheduled(graph, "gat", "depcomm", f"schedule{{memory_cap={cap}}}")
    inputs = planning_inputs(capped.program, graph, capped.parts, resolve_cluster(None))[1]
    assert float(estimate(capped.program, inputs).peak.max()) <= cap
    halved = 0
    for layer in capped.program.graph_layers():
        k = layer.attr("bins", 1)
        if k >= 4:  # half of it still bins (the per-bin equations keep their marks)
            head = next(line for line in text.splitlines() if line.startswith(f"layer {layer.name} "))
            fewer = parse_ir(text.replace(head, head.replace(f"bins={k},", f"bins={k // 2},")))
            assert float(estimate(fewer, inputs).peak.max()) > cap, layer.name
            halved += 1
    assert halved


def test_a_cap_bins_cannot_meet_is_refused_with_what_stays(cora) -> None:
    with pytest.raises(GnncError, match=r"--memory-cap 1000: .* kept whatever the bins"):
        scheduled(cora, "gcn", "depcomm", "schedule{memory_cap=1000}")


@pytest.mark.parametrize("text, message", [
    ("schedule{overlap=maybe}", "overlap must be one of auto, on, off"),
    ("schedule{method=star}", "method must be one of ring, ring_paced, all_to_all"),
    ("schedule{bins=-1}", "bins must be between"),
])
def test_bad_options_are_named(cora, text: str, message: str) -> None:
    with pytest.raises(GnncError, match=message):
        scheduled(cora, "gcn", "depcomm", text)


# --- the text is data --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, strategy, schedule", [
    ("gat", "depcomm,bcast1d", "schedule"), ("gcn", "hybrid", "schedule{bins=3}"),
    ("sage", "bcast1d", "schedule{overlap=off staged=off grad_overlap=off}")])
def test_scheduled_ir_reads_back_exactly(cora, name: str, strategy: str, schedule: str) -> None:
    text, plan = scheduled(cora, name, strategy, schedule)
    assert parse_ir(text) == plan.program and str(parse_ir(text)) == text
    check_schedule(parse_ir(text))


@pytest.mark.parametrize("edit, message", [
    (("bins=3", "bins=0"), "bins must be a positive integer"),
    (("method=ring,", "method=star,"), "method must be one of"),
    (("overlap=true", "overlap=7"), "overlap must be true or false"),
    (("grad_overlap=true", "grad_overlap=1"), "grad_overlap must be true or false"),
    (("grad_bucket=0", "grad_bucket=2"), r"buckets must be numbered 0..1, got \[0, 2\]"),
])
def test_malformed_schedule_annotations_are_refused(cora, edit, message: str) -> None:
    text, _ = scheduled(cora, "gcn", "depcomm", "schedule{bins=3}")
    with pytest.raises(PlanError, match=message):
        check_schedule(parse_ir(text.replace(*edit, 1)))


# --- golden IR ---------------------------------------------------------------------------------------

GOLDEN = {  # case -> (example, strategies, schedule pipeline entry)
    "gcn-depcomm": ("gcn", "depcomm", "schedule"),
    "gat-depcomm": ("gat", "depcomm", "schedule"),
    "sage-bcast1d": ("sage", "bcast1d", "schedule"),
    "gin-bins": ("gin", "depcomm", "schedule{bins=2 bucket_bytes=40000}"),
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_golden(case: str, cora) -> None:
    name, strategy, schedule = GOLDEN[case]
    text, _ = scheduled(cora, name, strategy, schedule)
    check_golden({"schedule": text}, case)


def test_schedule_pass_alone_on_the_tiny_graph() -> None:
    """Run alone after predict-bytes (tests/test_pass_filecheck.py's graph): it needs nothing else."""
    from test_pass_filecheck import PREPARED, GCN, DIMS, tiny_graph
    from gnnc.cluster import resolve_cluster

    ctx = PassContext(graph=tiny_graph(), workers=2,
                      partition=Partition(np.array([0, 0, 1, 1], dtype=np.int64), 2, "given"),
                      cluster=resolve_cluster(None))
    ctx.results.strategy = "depcomm"
    program = run_pass(PREPARED + ",assign-strategy,insert-comm,predict-bytes", str(GCN), dims=DIMS, ctx=ctx,
                       prepare=False)
    out = run_pass("schedule", program, ctx=ctx)
    filecheck(out, """
        CHECK: attrs grad_overlap=true
        CHECK: halo[bytes_bwd=192, bytes_fwd=192, method=ring, overlap=true](%l0.t)
        CHECK: spmm[reduce=sum, split=true](%l0.t^halo, %l0.m~1)
    """)
    assert ctx.results.schedule_report["segments"][0]["options"] == {"overlap": True, "chunked": False, "bins": 1}


# --- the command line --------------------------------------------------------------------------------


def test_compile_memory_cap_and_explain(cora, tmp_path, capsys) -> None:
    from gnnc.cli import main

    _, free = scheduled(cora, "gat", "depcomm")
    _, most = scheduled(cora, "gat", "depcomm", "schedule{bins=1024}")
    cap = int((free.meta.schedule_report["activation_bytes"] + most.meta.schedule_report["activation_bytes"]) / 2)
    args = ["compile", str(EXAMPLES / "gat.gnn"), "--graph", "planetoid:cora", "--workers", "2",
            "--strategy", "depcomm", "--explain", "-o", str(tmp_path / "plan")]
    assert main(args + ["--memory-cap", f"{cap / 2**10}K"]) == 0
    out = capsys.readouterr().out
    assert "schedule (predicted" in out and " bins" in out and f"under the memory cap of {cap / 2**20:.1f} MiB" in out
    assert "gradient all-reduce: 1 bucket(s), during backward" in out
    plan = gnnc.Plan.load(tmp_path / "plan")
    assert plan.program.attr("memory_cap") == cap
    assert main(["run", str(tmp_path / "plan"), "--memory-cap", "5M"]) == 2
    assert "recompile it with --memory-cap" in capsys.readouterr().err
    assert main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--memory-cap", "5M"]) == 2
    assert "--nproc N" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--memory-cap", "lots"])
    assert exit_.value.code == 2 and "expected a number of bytes" in capsys.readouterr().err


def test_a_training_step_reports_its_activation_memory(tmp_path) -> None:
    """One process: how far the step raised the resident set (Linux), steady epochs only; the metrics have
    the base it is measured above and the step's CPU seconds."""
    import json

    from conftest import random_graph

    graph = random_graph(n=400, e=3000, f=64, c=4)
    result = gnnc.run(gnnc.load_model(EXAMPLES / "gcn.gnn", hidden=64), graph, epochs=3, seed=0,
                      metrics=str(tmp_path / "m.jsonl"))
    assert result.activation_peak_bytes > 0 and all("activation_peak_bytes" in r for r in result.history)
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert all(r["step_base_bytes"] > 2**20 and 0 < r["cpu_s"] for r in records)
