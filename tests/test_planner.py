"""The planner's decisions on graphs with the seed papers' statistics, and its contract.

Presets come from datasheets (compiler/cluster.py); nothing here tunes them.
"""
from __future__ import annotations

import time

import pytest

from conftest import EXAMPLES, gnnc_in_process
from gnnc import api

GOOGLE_LIKE = "sbm:n=200000,blocks=64,deg=6,intra=0.9,features=512,classes=16,seed=0"


def test_mg_gcn_cora_on_dgx_a100_is_not_distributed() -> None:
    graph = api.load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, workers="auto", cluster="dgx-a100")
    assert plan.workers == 1
    considered = plan.meta.workers_considered
    assert [c.workers for c in considered] == [1, 2, 4, 8]
    assert considered[0].time_s == min(c.time_s for c in considered)


def test_a_saved_auto_plan_explains_the_worker_counts_it_considered(tmp_path) -> None:
    # Plan.load kept a whitelist of plan.json's records that lacked workers_considered, so a saved
    # `--workers auto` plan's explanation lost its line.
    from gnnc.inspect_plan import render
    from gnnc.plan.plan_file import Plan

    graph = api.load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, workers="auto", cluster="dgx-a100",
                       graph_spec="planetoid:cora")
    plan.save(tmp_path / "plan")
    unsaved, saved = render(plan, "explain"), render(Plan.load(tmp_path / "plan"), "explain")
    assert "workers considered: 1: " in unsaved
    assert saved == unsaved


def test_neutronstar_google_like_graph_gets_depcache_and_a_bandwidth_crossover() -> None:
    graph = api.load_graph(GOOGLE_LIKE)
    assert 5.5 < graph.num_edges / graph.num_nodes < 6.5
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=256), graph, workers=8, partition="metis",
                       cluster="neutronstar-ecs", allow=["depcache", "depcomm"], explain=True)
    # NeutronStar compares whole-model strategies: DepCache wins. The DP also finds that caching the first
    # layer and exchanging the narrow (16 classes wide, GeMM first) rows of the second is cheaper still.
    assert [layer.attr("strategy") for layer in plan.program.graph_layers()] == ["depcache", "depcomm"]
    planner = plan.meta.planner
    times = {tuple(a["strategies"]): a["time_s"] for a in planner.alternatives}
    assert times[("depcache", "depcache")] < times[("depcomm", "depcomm")]
    assert times[("depcache", "depcomm")] < times[("depcache", "depcache")]
    assert planner.crossovers and planner.crossovers[0].startswith("depcomm overtakes depcache above")
    # the crossover is where the two predictions meet: above it depcomm must win
    gbps = float(planner.crossovers[0].split("above ")[1].split(" Gb/s")[0])
    from gnnc.cluster import preset

    import dataclasses

    twice = gbps * 2 * 1e9 / 8  # bytes/s, twice the crossover
    fast = dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=twice, intra_bandwidth=twice)
    faster = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=256), graph, workers=8, partition="metis",
                         cluster=fast, allow=["depcache", "depcomm"])
    times = {tuple(a["strategies"]): a["time_s"] for a in faster.meta.planner.alternatives}
    assert times[("depcomm", "depcomm")] < times[("depcache", "depcache")]



P3_GRAPH = "sbm:n=20000,blocks=16,deg=50,intra=0.5,features={F},classes=4,seed=0"  # avg degree 50, as P3's


def _p3_plan(features: int, hidden: int, passes: list[str] | None, allow: list[str] | None):
    graph = api.load_graph(P3_GRAPH.format(F=features))
    return api.compile(api.load_model(EXAMPLES / "sage.gnn", hidden=hidden), graph, workers=16, partition="hash",
                       cluster="p3", passes=passes, allow=allow, explain=True)


@pytest.mark.parametrize("features", [100, 128, 256])
def test_p3_pushes_and_pulls_layer_1_in_its_own_setting(features: int) -> None:
    """P3 (section 3.2) weighs its feature-sliced first layer against data parallelism that pulls the raw
    F-wide features of remote neighbours, with graphs too large to replicate. That is depcomm with the
    aggregation before the dense map (no `reorder-gemm`), and no depcache: the decision P3 reports comes out.
    """
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

    p3_baseline = [p for p in DEFAULT_PIPELINE if p != "reorder-gemm"] + DISTRIBUTED_PIPELINE
    allow = ["depcomm", "pushpull", "bcast1d"]
    planner = _p3_plan(features, 32, p3_baseline, allow).meta.planner
    assert planner.strategies == ["pushpull", "depcomm"]
    if features == 100:  # the hidden layer as wide as the features: pulling features is cheaper again
        assert _p3_plan(features, 256, p3_baseline, allow).meta.planner.strategies[0] != "pushpull"
        # --explain says where between the two: the width at which layer 1's two formulas meet
        [line] = [c for c in planner.crossovers if c.startswith("pushpull beats depcomm on layer 1 while")]
        assert 32 < float(line.rsplit("< ", 1)[1]) < 256


def test_with_gemm_first_depcomm_never_moves_more_than_pushpull() -> None:
    """Why the default pipeline does not choose pushpull for P3's layer: with the dense map first, depcomm
    exchanges hidden-wide rows of the |B_i| <= N - |V_i| remote vertices a worker reads, while pushpull
    reduces hidden-wide partials of all N - |V_i| vertices it does not own (forward and backward alike)."""
    planner = _p3_plan(100, 32, None, ["depcomm", "pushpull"]).meta.planner
    layer1 = {c["strategy"]: c for c in planner.segment_costs if c["layers"] == [0, 1]}
    assert 0 < layer1["depcomm"]["bytes"] <= layer1["pushpull"]["bytes"]
    assert planner.strategies[0] == "depcomm"

@pytest.mark.parametrize("seed", range(6))
def test_hybrid_allowed_is_never_predicted_slower_than_the_best_pure_strategy(seed: int) -> None:
    """Random graphs, widths, worker counts and bandwidths: allowing hybrid never makes the plan slower."""
    import dataclasses

    import numpy as np

    from gnnc.cluster import preset

    rs = np.random.default_rng(seed)
    n, deg = int(rs.integers(300, 1500)), int(rs.integers(2, 20))
    graph = api.load_graph(f"sbm:n={n},blocks=8,deg={deg},intra={rs.uniform(0.3, 0.95):.2f},features="
                           f"{int(rs.integers(8, 300))},classes=4,seed={seed}")
    model = api.load_model(EXAMPLES / "gcn.gnn", hidden=int(rs.integers(8, 300)))
    bw = float(rs.uniform(1e8, 2e10))
    cluster = dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=bw, intra_bandwidth=bw)
    workers = int(rs.choice([2, 4, 8]))

    def predicted(allow):
        plan = api.compile(model, graph, workers=workers, partition="metis", cluster=cluster, allow=allow)
        return plan.meta.planner.predicted_time_s, plan

    pure = min(predicted([s])[0] for s in ("depcomm", "depcache"))
    with_hybrid, plan = predicted(["depcomm", "depcache", "hybrid"])
    assert with_hybrid <= pure * (1 + 1e-12)
    only_hybrid, _ = predicted(["hybrid"])
    assert only_hybrid <= predicted(["depcomm"])[0] * (1 + 1e-12)  # communicate-all is depcomm


def test_explain_and_json_list_every_alternative(tmp_path) -> None:
    r = gnnc_in_process("compile", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--workers", "4",
                        "--cluster", "neutronstar-ecs", "--explain", "--json")
    assert r.returncode == 0, r.stderr
    assert "<- chosen" in r.stdout and "depcomm x2" in r.stdout
    # the per-layer table prices every legal strategy of every layer, pushpull included for GCN's first
    import re

    table = r.stdout.split("per layer and segment")[1]
    for strategy in ("depcomm", "depcache", "hybrid", "bcast1d", "pushpull"):
        assert re.search(rf"^  l0 +{strategy} ", table, re.M), strategy
    assert not re.search(r"^  l1 +pushpull ", table, re.M)  # P3's layer is the first only
    import json

    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["predicted"]["epoch_time_s"] > 0
    assert {tuple(a["strategies"]) for a in summary["alternatives"]} >= {("depcomm", "depcomm")}


def test_illegal_strategy_on_the_cli_exits_2_naming_the_op() -> None:
    r = gnnc_in_process("compile", str(EXAMPLES / "gin.gnn"), "--graph", "planetoid:cora", "--workers", "2",
                        "--strategy", "pushpull,depcomm")
    assert r.returncode == 2
    assert "cannot run pushpull: 'linear'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # a speed goal: runs with the benchmarks (make bench), not in the unit suite
def test_planning_a_10m_edge_graph_for_8_workers_is_fast() -> None:
    graph = api.load_graph("rmat:n=1000000,deg=10,features=16,classes=4,seed=0")
    parts = api.partition_vertices(graph, 8, "hash")
    from gnnc.passes.planner.search import choose
    from gnnc.cluster import preset

    model = api.load_model(EXAMPLES / "gcn.gnn")
    program = api.compile(model, graph).program
    t0 = time.perf_counter()
    report = choose(program, graph, parts, preset("neutronstar-ecs"), None)
    elapsed = time.perf_counter() - t0
    print(f"planning took {elapsed:.2f} s: {report.strategies}")
    assert elapsed < 10


def test_segments_that_would_drop_gcniis_initial_residual_are_never_priced() -> None:
    """A depcache or hybrid segment entered after layer 0 fetches one input's rows on entry; GCNII's
    layers also read x0, so only segments from layer 0 are legal for it, while GCN may enter anywhere."""
    graph = api.load_graph("rmat:n=300,deg=5,features=16,classes=3,seed=2")

    def entries(model: str, **params) -> set[int]:
        plan = api.compile(api.load_model(EXAMPLES / model, **params), graph, workers=4, partition="metis",
                           allow=["depcomm", "depcache", "hybrid"])
        return {c["layers"][0] for c in plan.meta.planner.segment_costs
                if c["strategy"] in ("depcache", "hybrid")}

    assert entries("gcnii.gnn", layers=4) == {0}
    assert entries("gcn.gnn") == {0, 1}
