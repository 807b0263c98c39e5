"""The whole epoch priced (issue 16): every op of the IR counted per row and per edge, sparse input features,
the evaluation pass, the optimizer step and the count reductions; op rates fitted by `gnnc probe`; the bytes
and the time the evaluation pass adds, against what a run counts."""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import sympy

from conftest import EXAMPLES, ROOT, gnnc_in_process, random_graph
from gnnc import api
from gnnc.cluster import KERNELS, OP_CLASSES, ClusterProfile, OpRate, preset
from gnnc.errors import GnncError
from gnnc.passes.cost.epoch import evaluation_of, optimizer_cost, with_evaluation
from gnnc.passes.cost.fit import fit_op_rates, fit_profile, other_ops_seconds, per_unit_work
from gnnc.passes.cost.compute import dense_map_time
from gnnc.passes.cost.neutronstar import depcomm
from gnnc.passes.cost.ops import SPARSE_INPUT_OPS, class_of, op_class, program_op_work, sparse_values
from gnnc.passes.cost.registry import segment_cost
from gnnc.passes.cost.symbols import (B, E, E_r, P, R_gemm, R_gemm_e, R_spmm, R_spmm_e, S, T_copy_b,
                                      T_copy_f, T_opt, T_opt_call, V, LayerOpWork, LayerShape, alpha, b, bw, d,
                                      kernel_factor, op_time)

GCN = EXAMPLES / "gcn.gnn"


def _program(model=GCN, graph=None, **sets):
    graph = graph or random_graph(60, 300, f=32, c=4, seed=1)
    return api.compile(api.load_model(model, **sets), graph).program


# --- what is counted ---------------------------------------------------------------------------------


def test_every_op_has_a_class() -> None:
    classes = {class_of(op, 2) for op in ("relu", "elu", "bias", "add", "mean_heads", "dot", "silu", "softplus")}
    assert classes == {"elementwise"}  # every activation, a plugin's (define_activation) too
    assert [class_of(op, 1) for op in ("dropout", "cross_entropy", "sddmm", "edge_softmax", "src")] == [
        "dropout", "loss", "attention", "attention", "copy"]
    assert {class_of(op, 1) for op in ("linear", "spmm", "gather", "halo", "fetch", "bcast_rows")} == {None}
    assert class_of("concat", 1) == "free" and class_of("concat", 2) == "elementwise"  # heads side by side: a view
    assert set(c for c in OP_CLASSES) >= {"elementwise", "dropout", "attention", "loss", "copy", "optimizer", "call"}


def test_the_sparse_input_ops_are_the_executors() -> None:
    """The cost model's list of ops run on sparse input features as they are matches the implementations."""
    from gnnc.runtime.implementations import implementation

    sparse = {op for op in ("dropout", "linear", "relu", "bias", "spmm", "sddmm", "cross_entropy", "add")
              if implementation(op, False).sparse_input}
    assert sparse == set(SPARSE_INPUT_OPS)


def test_gcn_op_work_by_hand() -> None:
    """examples/gcn.gnn: dropout(x) on layer 0's input rows (no backward: x has no gradient); bias after the
    aggregation; relu and dropout of the dense layer after layer 0 on its output rows; the loss after layer 1."""
    program = _program(hidden=16)  # features 32, classes 4
    l0, l1 = program_op_work(program)
    assert sorted(l0.forward) == [("in", "dropout", 32.0), ("in", "dropout_row", 1.0), ("out", "dropout", 16.0),
                                  ("out", "dropout_row", 1.0), ("out", "elementwise", 32.0)]  # bias + relu
    assert sorted(l0.backward) == [("out", "dropout", 16.0), ("out", "dropout_row", 1.0),
                                   ("out", "elementwise", 32.0)]
    assert sorted(l1.forward) == [("out", "elementwise", 4.0), ("out", "loss", 4.0)]
    # ops run: layer 0 with the dense layers around it (dropout; linear, edata, spmm, sync, bias; relu, dropout)
    assert (l0.calls_forward, l1.calls_forward) == (8, 6)
    assert l0.calls_backward == 6 and l1.calls_backward == 5  # all but dropout(x) and edata


def test_gat_attention_work_is_counted_per_element_and_per_edge() -> None:
    """examples/gat.gnn with 8 heads: its score and softmax cost 8 elements per edge each, and 1 edge each
    (`attention_row`); the output layer's, of 1 head, 1 and 1. The edge dropout likewise per edge."""
    program = _program(EXAMPLES / "gat.gnn", hidden=4, heads=8)
    l0, l1 = program_op_work(program)
    edge0 = {cls: n for side, cls, n in l0.forward if side == "edge"}
    assert edge0 == {"attention": 16.0, "attention_row": 2.0, "dropout": 8.0, "dropout_row": 1.0,
                     "elementwise": 8.0}  # sddmm + softmax; dropout; leaky_relu
    assert {cls: n for side, cls, n in l1.forward if side == "edge"}["attention"] == 2.0
    assert {cls: n for side, cls, n in l0.backward if side == "edge"}["attention_row"] == 2.0


def test_op_work_prices_at_the_profiles_rates() -> None:
    rates = (OpRate("elementwise", 2e-9, 3e-9), OpRate("dropout", 5e-9, 1e-9), OpRate("dropout_row", 7e-9, 0.0),
             OpRate("call", 1e-5, 2e-5))
    profile = dataclasses.replace(preset("g3"), op_rates=rates)
    work = LayerOpWork(forward=(("in", "dropout", 32.0), ("in", "dropout_row", 1.0), ("out", "elementwise", 16.0)),
                       backward=(("out", "elementwise", 16.0),), calls_forward=5, calls_backward=3)
    assert work.seconds(profile, "in", "f") == pytest.approx(32 * 5e-9 + 7e-9)
    assert work.seconds(profile, "out", "b") == pytest.approx(16 * 3e-9)
    assert work.seconds(profile, "in", "e") == 0.0  # evaluation: dropout is the identity
    assert work.seconds(profile, "out", "e") == pytest.approx(16 * 2e-9)
    assert (work.seconds(profile, "call", "f"), work.seconds(profile, "call", "b"),
            work.seconds(profile, "call", "e")) == pytest.approx((5e-5, 6e-5, 5e-5))


def test_without_a_measurement_the_rates_come_from_the_memory_bandwidth() -> None:
    g3 = preset("g3")
    assert g3.op_rate("elementwise", "forward") == pytest.approx(8 / g3.memory_bandwidth)
    assert g3.op_rate("optimizer", "forward") == pytest.approx(28 / g3.memory_bandwidth)
    assert g3.op_rate("call", "backward") > 0
    measured = dataclasses.replace(g3, op_rates=(OpRate("elementwise", 1e-9, 2e-9),))
    assert measured.op_rate("elementwise", "backward") == 2e-9
    with pytest.raises(ValueError):
        g3.op_rate("nope", "forward")


def test_profiles_carry_their_op_rates() -> None:
    old = preset("g3").to_dict()
    assert "op_rates" not in old
    fitted = ClusterProfile.from_dict({**old, "op_rates": [{"op": "dropout", "forward": 5e-9, "backward": 2e-9}]})
    assert fitted.op_rates == (OpRate("dropout", 5e-9, 2e-9),)
    assert ClusterProfile.from_dict(fitted.to_dict()) == fitted
    with pytest.raises(GnncError, match="'op' must be one of"):
        ClusterProfile.from_dict({**old, "op_rates": [{"op": "warp", "forward": 1.0, "backward": 1.0}]})
    with pytest.raises(GnncError, match="'backward' must be a non-negative"):
        ClusterProfile.from_dict({**old, "op_rates": [{"op": "loss", "forward": 1.0, "backward": -1.0}]})


def test_sparse_input_features_are_priced_per_nonzero() -> None:
    """Cora's bag of words is held sparse: dropout draws at its nonzeros, the first dense map is a
    sparse-dense product (LayerShape.sparse_gemms at the SpMM rate), and SAGE's aggregation densifies it."""
    from gnnc.passes.cost.inputs import planning_inputs

    graph = api.load_graph("planetoid:cora")
    program = _program(GCN, graph)
    _, inputs, shapes = planning_inputs(program, graph, np.zeros(graph.num_nodes, np.int64), preset("g3"), 1)
    density = inputs.input_density
    assert 0.005 < density < 0.05 and "x" in sparse_values(program)
    assert shapes[0].sparse_gemms == 1 and shapes[1].sparse_gemms == 0
    l0 = program_op_work(program, input_density=density)[0]
    assert ("in", "dropout", pytest.approx(1433 * density)) in l0.forward
    table = {s: v[0] for s, v in inputs.table.items()}
    product = float(dense_map_time(0, shapes[0], 2708).subs(table))
    assert product == pytest.approx(2708 * density * 1433 * 16 / table[R_spmm])  # nonzeros x d_out at the SpMM rate
    assert float(dense_map_time(0, shapes[1], 2708).subs(table)) == pytest.approx(2 * 2708 * 1433 * 16 / table[R_gemm])
    sage = _program(EXAMPLES / "sage.gnn", graph)  # reorder-gemm put both dense maps before the mean: sparse
    sage_shapes = planning_inputs(sage, graph, np.zeros(graph.num_nodes, np.int64), preset("g3"), 1)[2]
    assert sage_shapes[0].sparse_gemms == 2
    dense_first = api.load_model_source("""
layer Conv(in, out) with self_loops {
  transform t = linear(h, out, bias = false)
  scatter   m = edge.gcn_norm * src.t
  gather    a = sum(m)
  apply     h = a
}
model M(features, hidden = 16, classes) {
  h = relu(dropout(x, 0.5))
  h = Conv(features, hidden)(h)
  h = Conv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}""", "m.gnn")
    first = program_op_work(api.compile(dense_first, graph).program, input_density=density)[0]
    # the dropout at x's nonzeros, kept sparse; relu on it densified (every element written), then on every element
    assert [e for e in first.forward if e[0] == "in"] == [("in", "dropout", pytest.approx(1433 * density)),
                                                         ("in", "dropout_row", pytest.approx(1433 * density)),
                                                         ("in", "elementwise", 2 * 1433.0)]


# --- where it is priced ------------------------------------------------------------------------------


def test_depcomm_charges_the_other_ops_on_its_rows_edges_and_copies() -> None:
    values = {V: 100, E: 600, B: 40, S: 30, E_r: 200, d(0): 64, d(1): 16, b: 4, bw: 1e6, alpha: 0.0, P: 2,
              R_gemm: 1e8, R_spmm: 1e7, T_copy_f: 1e-9, T_copy_b: 2e-9,
              op_time(0, "in", "f"): 1e-7, op_time(0, "out", "f"): 2e-7, op_time(0, "edge", "f"): 3e-8,
              op_time(0, "call", "f"): 1e-4, op_time(0, "in", "b"): 0.0, op_time(0, "out", "b"): 4e-7,
              op_time(0, "edge", "b"): 5e-8, op_time(0, "call", "b"): 2e-4,
              # the dense layers' maps, per input row (the one before layer 0) and output row (the one after it)
              op_time(0, "dense_in", "f"): 3e-6, op_time(0, "dense_out", "f"): 5e-6,
              op_time(0, "dense_in", "b"): 7e-6, op_time(0, "dense_out", "b"): 1.1e-5,
              **{kernel_factor(0, k): 1.0 for k in KERNELS}}
    bare = {**values, **{k: 0 for k in values if k.name.startswith("T")}}
    c = depcomm(0, LayerShape(gemm_first=True, input_grad=False), overlap=False)
    fwd = float(c.stages[0].subs(values)) - float(c.stages[0].subs(bare))
    # the halo's rows packed and assembled (B + S), and the layer's V output rows summed part by part into one
    # zero-filled buffer (compute.halo_buffers), both at the forward copy rate
    assert fwd == pytest.approx(100 * 1e-7 + 100 * 2e-7 + 600 * 3e-8 + 1e-4 + (30 + 40) * 16 * 1e-9
                                + 100 * 16 * 1e-9 + 100 * (3e-6 + 5e-6))
    bwd = float(c.stages[1].subs(values)) - float(c.stages[1].subs(bare))
    # backward: the halo's gradient for the V held rows zero-filled, then added to their other gradient (2 passes)
    assert bwd == pytest.approx(100 * 4e-7 + 600 * 5e-8 + 2e-4 + (30 + 40) * 16 * 2e-9 + 2 * 100 * 16 * 2e-9
                                + 100 * (7e-6 + 1.1e-5))


def test_the_evaluation_pass_is_the_forward_again_without_dropout() -> None:
    c = depcomm(1, LayerShape())
    priced = with_evaluation(c, 1, 2)
    assert priced.evaluation == 1 and priced.training_stages == c.stages
    (ev,) = priced.evaluation_stages
    swap = {op_time(1, s, "f"): op_time(1, s, "e") for s in ("in", "out", "edge", "call", "dense_in", "dense_out")}
    assert ev == c.stages[0].xreplace({**swap, R_gemm: R_gemm_e, R_spmm: R_spmm_e})  # kernels at forward rates
    # no training-forward op left; the kernels keep their forward width factors (the same products run)
    assert not any(s.name.startswith("T") and s.name.endswith("_f_1") for s in ev.free_symbols)
    assert kernel_factor(1, "gemm_f") in ev.free_symbols and kernel_factor(1, "gemm_dw") not in ev.free_symbols
    assert with_evaluation(priced, 1, 2) is priced  # once
    # a segment's forward stages: depcache's one, hybrid's one per layer
    shapes = [LayerShape(), LayerShape()]
    assert segment_cost("depcache", 0, 2, shapes).evaluation == 1
    assert segment_cost("hybrid", 0, 2, shapes).evaluation == 2
    assert evaluation_of((sympy.Symbol("x"),), range(0)) == (sympy.Symbol("x"),)


def test_the_optimizer_step() -> None:
    opt = optimizer_cost(1000.0, 4)
    assert float(opt.stages[0].subs({T_opt: 2e-9, T_opt_call: 1e-5})) == pytest.approx(1000 * 2e-9 + 4e-5)


def test_the_predicted_epoch_is_the_step_and_the_evaluation(tmp_path) -> None:
    graph = random_graph(200, 1200, f=32, c=4, seed=2)
    plan = api.compile(api.load_model(GCN), graph, workers=2, allow=["depcomm"])
    from gnnc.inspect_plan import predicted_epoch

    epoch = predicted_epoch(plan)
    assert epoch["epoch_time_s"] == pytest.approx(plan.meta.planner.predicted_time_s)
    assert epoch["step_time_s"] + epoch["eval_time_s"] == pytest.approx(epoch["epoch_time_s"])
    assert 0 < epoch["eval_time_s"] < epoch["step_time_s"]
    stages = plan.meta.planner.schedule["stages"]
    assert [s["kind"] for s in stages if s["direction"] == "evaluation"] == ["segment", "segment"]
    assert [s["kind"] for s in stages][-3:] == ["optimizer", "segment", "segment"]
    # the evaluation moves every exchange's forward rows once more
    step = plan.meta.predicted_bytes_per_step
    assert sum(plan.meta.predicted_eval_bytes_per_epoch.values()) * 2 == step["halo"]


# --- fitted by gnnc probe ----------------------------------------------------------------------------


def test_the_op_fit_recovers_known_rates() -> None:
    call_f, call_b = 1.5e-5, 2.5e-5
    rates = {"elementwise": (1.5e-9, 3e-9), "loss": (1e-9, 4e-9)}
    drop, drop_row = (6e-9, 3e-9), (2e-8, 1e-8)
    att, att_row = (1e-9, 2e-9), (4e-9, 3e-9)
    eqns = []
    for n in (100_000, 400_000, 2_000_000):
        for op, cls in (("relu", "elementwise"), ("bias", "elementwise"), ("cross_entropy", "loss")):
            eqns.append((op, 2, n // 16, n, call_f + n * rates[cls][0], call_b + n * rates[cls][1]))
        for width in (1, 64):  # narrow edge values and wide vertex ones: per element and per row
            rows = n // width
            eqns.append(("dropout", 1, rows, n, call_f + n * drop[0] + rows * drop_row[0],
                         call_b + n * drop[1] + rows * drop_row[1]))
        for op_heads in (1, 2):  # the probe's attention layers: edges of one head and of two
            edges = n // op_heads
            eqns.append(("edge_softmax", 1, edges, n, call_f + n * att[0] + edges * att_row[0],
                         call_b + n * att[1] + edges * att_row[1]))
        eqns.append(("linear", 2, n // 16, n, 1.0, 2.0))  # a kernel: not an op rate
    dispatch = [("relu", 1, 4, 64, call_f, call_b), ("bias", 2, 4, 64, call_f, call_b),
                ("dropout", 1, 4, 64, call_f * 9, call_b)]  # the median: one op's dispatch
    copies = [(n, n * 2e-9, n * 1e-9) for n in (10_000, 1_000_000)]
    adam = [(e, t, e * 6e-9 + t * 2e-5) for e, t in ((10_000, 1), (1_000_000, 1), (1_000_000, 16), (64, 32))]
    fitted = {r.op: r for r in fit_op_rates({"dispatch": dispatch, "eqns": eqns, "copies": copies, "adam": adam})}
    for cls, (f, bk) in rates.items():
        assert (fitted[cls].forward, fitted[cls].backward) == pytest.approx((f, bk), rel=1e-6)
    assert (fitted["dropout"].forward, fitted["dropout"].backward) == pytest.approx(drop, rel=1e-6)
    assert (fitted["dropout_row"].forward, fitted["dropout_row"].backward) == pytest.approx(drop_row, rel=1e-6)
    assert (fitted["attention"].forward, fitted["attention"].backward) == pytest.approx(att, rel=1e-6)
    assert (fitted["attention_row"].forward, fitted["attention_row"].backward) == pytest.approx(att_row, rel=1e-6)
    assert (fitted["call"].forward, fitted["call"].backward) == pytest.approx((call_f, call_b))
    assert (fitted["copy"].forward, fitted["copy"].backward) == pytest.approx((2e-9, 1e-9))
    assert (fitted["optimizer"].forward, fitted["optimizer_call"].forward) == pytest.approx((6e-9, 2e-5), rel=1e-6)


def test_the_layer_fit_takes_the_other_ops_off_first() -> None:
    """Layer timings made of known kernel rates plus the other ops at known rates: t_v, t_e come back exact
    once the other ops are taken off; left on, they would be read as kernel time."""
    from gnnc.runtime.probe import PROBE_MODEL, PROBE_WIDTHS

    features, hidden, classes = PROBE_WIDTHS
    model = api.load_model_source(PROBE_MODEL, "<probe>", features=features, hidden=hidden, classes=classes)
    program = api.compile(model, random_graph(50, 200, f=features, c=classes, seed=0)).program
    rates = [OpRate("elementwise", 2e-9, 3e-9), OpRate("call", 2e-5, 3e-5)]
    work = per_unit_work(program)
    t_v, t_e = 5e-11, 2e-10
    bare = [(n, [e, e], [t_v * wv * n + t_e * we * e for wv, we, _ in work])
            for n, e in ((30_000, 150_000), (30_000, 510_000), (90_000, 450_000), (90_000, 990_000))]
    other = other_ops_seconds(program, bare, rates)
    assert all(o > 0 for row in other for o in row)
    samples = [(n, es, [t + o for t, o in zip(ts, os)]) for (n, es, ts), os in zip(bare, other)]
    fitted = fit_profile(program, samples, PROBE_WIDTHS, 1e9, rates)
    assert (fitted["t_v"], fitted["t_e"]) == pytest.approx((t_v, t_e), rel=1e-6)
    assert [r["op"] for r in fitted["op_rates"]] == ["elementwise", "call"]
    unfitted = fit_profile(program, samples, PROBE_WIDTHS, 1e9)
    assert unfitted["t_v"] > t_v * 1.01 or unfitted["t_e"] > t_e * 1.01


# --- the planner refuses what cannot fit -------------------------------------------------------------


def test_the_planner_keeps_room_for_the_weights_refuses_what_cannot_fit_and_warns_near_it() -> None:
    """A worker holds the weights, their gradients and Adam's two moments whatever the assignment: the planner's
    memory cap is what is left for the layers; a model whose weights alone do not fit is refused, and a choice
    above 80% of a worker's memory is warned of."""
    from gnnc.passes.cost.memory import parameter_sizes

    graph = random_graph(400, 2000, f=64, c=4, seed=3)
    model = api.load_model(GCN, hidden=256)
    plan = api.compile(model, graph, workers=2, allow=["depcomm"])
    weights = 4 * sum(s.bytes for s in parameter_sizes(plan.program))
    layers = plan.meta.planner.predicted_memory_bytes
    assert weights == 4 * 4 * (64 * 256 + 256 + 256 * 4 + 4)
    with pytest.raises(GnncError, match="the weights, their gradients and Adam's moments take"):
        api.compile(model, graph, workers=2, allow=["depcomm"],
                    cluster=dataclasses.replace(preset("neutronstar-ecs"), memory_per_worker=weights * 0.9))
    with pytest.raises(GnncError, match="fits the memory cap"):  # room for the weights, not for the layers
        api.compile(model, graph, workers=2, allow=["depcomm"],
                    cluster=dataclasses.replace(preset("neutronstar-ecs"), memory_per_worker=weights + layers / 2))
    near = dataclasses.replace(preset("neutronstar-ecs"), memory_per_worker=(weights + layers) / 0.9)
    with pytest.warns(UserWarning, match="90% of the memory per worker of cluster"):
        api.compile(model, graph, workers=2, cluster=near, allow=["depcomm"])


def test_the_cli_refuses_it_with_exit_2(tmp_path) -> None:
    profile = tmp_path / "tiny.json"
    dataclasses.replace(preset("neutronstar-ecs"), memory_per_worker=1e4).save(profile)
    r = gnnc_in_process("compile", str(GCN), "--graph", "rmat:n=300,deg=5,features=16,classes=3,seed=0",
                        "--workers", "2", "--cluster", str(profile), "--set", "hidden=64")
    assert r.returncode == 2 and "Adam's moments take" in r.stderr and "Traceback" not in r.stderr


# --- what a run counts -------------------------------------------------------------------------------


def test_a_run_sends_what_predict_bytes_counted_for_its_step_and_its_evaluation(tmp_path) -> None:
    """Every rank's exchanges, the step's and the evaluation's apart, equal predict-bytes' counts (one launch of
    2 processes trains each plan in turn, as the validation grid's torchrun job does)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "cluster"))
    from run_plans import train_each  # noqa: E402  (benchmarks are scripts, not a package)
    from gnnc.runtime.distributed import DistJob
    from gnnc.runtime.launch import launch
    from gnnc.runtime.train import TrainConfig

    graph = random_graph(300, 1800, f=24, c=4, seed=4)
    model = api.load_model(GCN, hidden=8)
    plans, jobs = [], []
    for k, strategy in enumerate(("depcomm", "pushpull,depcomm", "depcomm,depcache", "bcast1d", "hybrid")):
        plan = api.compile(model, graph, workers=2, strategy=strategy, partition="metis")
        plan.save(tmp_path / f"p{k}")
        plan = api.Plan.load(tmp_path / f"p{k}")
        plans.append(plan)
        jobs.append((str(k), DistJob(str(plan.program), str(plan.shard_dir),
                                     TrainConfig.resolve(plan.program, epochs=2, progress=False))))
    rows = launch(train_each, 2, jobs, 2)[0]  # twice, the second time in reverse order, as the grid trains them
    for plan, row in zip(plans, rows):
        assert row["passes"] == 2 and row["epochs_timed"] == 2
        step, ev = plan.meta.predicted_bytes_per_step, plan.meta.predicted_eval_bytes_per_epoch
        assert row["bytes_sent_per_epoch"] == sum(step.values()), row["strategies"]
        assert row["eval_bytes_sent_per_epoch"] == sum(ev.values()), row["strategies"]
        assert (sum(ev.values()) > 0) == (step.get("halo", 0) + step.get("bcast_rows", 0) + step.get("reduce_scatter", 0)
                                          > 0)  # a hybrid that caches everything exchanges nothing
        assert row["eval_time_s"] > 0


def test_one_process_times_its_evaluation_and_sends_nothing() -> None:
    result = api.run(api.load_model(GCN, hidden=8), random_graph(100, 500, f=16, c=3, seed=5), epochs=3)
    assert result.eval_time_s > 0 and result.eval_bytes_sent_per_epoch == 0
    assert all("eval_time_s" in r and r["eval_bytes_sent"] == 0 for r in result.history)
