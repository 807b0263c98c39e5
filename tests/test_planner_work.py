"""Work a compile does before writing its plan, counted (issue 36: compile time after load and partition).

Each test counts one cost that a deep model's compile paid over and over and no longer pays (counts, not
timings: the machine is shared); each says what it measured before. benchmarks/compile_time.py has the times.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import sympy

import gnnc
from conftest import EXAMPLES, count_calls, random_graph
from gnnc.passes.cost import neutronstar
from gnnc.passes.cost import schedule as cost_schedule
from gnnc.passes.planner import segment_dp
from test_planner_speed import random_segment_costs

verify_module = importlib.import_module("gnnc.ir.verify")  # the module (gnnc.ir.verify is also its function)


@pytest.fixture(scope="module")
def graph():
    return random_graph(n=300, e=1800, f=16, c=4)


def _numpy_calls_inside_hybrid_values_of(monkeypatch, name: str) -> dict[str, int]:
    """Counts the calls of `np.<name>` made while `hybrid_values_of` runs (read back as `calls["n"]`): the
    function is replaced where the cost module defines it and where the Hybrid planner imported it."""
    calls = {"n": 0, "on": False, "runs": 0}
    real, real_values_of = getattr(np, name), neutronstar.hybrid_values_of

    def counted(*args, **kwargs):
        calls["n"] += calls["on"]
        return real(*args, **kwargs)

    def values_of(*args, **kwargs):
        calls["on"] = True
        calls["runs"] += 1
        try:
            return real_values_of(*args, **kwargs)
        finally:
            calls["on"] = False

    monkeypatch.setattr(np, name, counted)
    monkeypatch.setattr(neutronstar, "hybrid_values_of", values_of)
    from gnnc.passes.planner import hybrid
    monkeypatch.setattr(hybrid, "hybrid_values_of", values_of)
    return calls


@pytest.fixture
def stage_splits(monkeypatch) -> dict[str, int]:
    """{"n": how many times a stage was split into pieces (cost.schedule._stage_items) since the test began}."""
    return count_calls(monkeypatch, cost_schedule, "_stage_items")


def _equations(program) -> int:
    return sum(len(layer.eqns) for layer in program.layers)


def test_the_ir_verifier_reruns_each_equations_type_rule_once(monkeypatch, graph) -> None:
    """The compile verifies the IR after each of its ~15 passes; a pass rebuilds a few layers and keeps the other
    (immutable) equations, whose type rules are not re-run. GCNII x8: 1,796 type rules before (every equation
    after every pass), 150 now for a final program of 126 equations."""
    calls = []
    real = verify_module.check_types
    monkeypatch.setattr(verify_module, "check_types", lambda e, where: calls.append(e) or real(e, where))
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4)
    assert len(calls) <= 2 * _equations(plan.program), (len(calls), _equations(plan.program))


def test_a_memory_cap_that_drops_no_label_fills_the_dp_table_once(monkeypatch) -> None:
    """The alternatives show the fastest assignment regardless of the cap, from a table filled without it; when
    the cap dropped no label, the capped table is that table, and the DP is not run again (the 64-layer GCNII
    example on Cora: 508,064 label comparisons before, 254,032 now). Same result as without a cap."""
    layers = 16
    seg_cost = random_segment_costs(layers, 1)
    counted = count_calls(monkeypatch, segment_dp, "_dominates")
    free = segment_dp.solve(layers, ["depcomm", "depcache"], seg_cost)
    without = counted["n"]
    counted["n"] = 0
    capped = segment_dp.solve(layers, ["depcomm", "depcache"], seg_cost, memory_cap=1e9)
    assert counted["n"] == without  # was 2x: the table filled again without the cap
    assert capped == free


def test_a_cap_that_binds_still_shows_the_fastest_assignment_regardless_of_it() -> None:
    """The uncapped fill still runs when the cap dropped a label: the alternatives hold the faster plan that
    does not fit."""
    seg_cost = {(0, 1, "a"): (1.0, 10.0), (1, 2, "a"): (1.0, 10.0), (0, 1, "b"): (2.0, 1.0),
                (1, 2, "b"): (2.0, 1.0)}
    result = segment_dp.solve(2, ["a", "b"], seg_cost, memory_cap=5.0)
    assert result.best.strategies == ("b", "b")
    assert any(alt.strategies == ("a", "a") and not alt.fits(5.0) for alt in result.alternatives)


def test_hybrid_selections_are_priced_without_a_value_conversion_per_selection(monkeypatch, graph) -> None:
    """`hybrid_values_of` prices every Hybrid span's selections layer by layer, their values side by side: each
    value (already one float64 per worker) is stacked as it is, and a layer's symbols are looked up per name,
    not gathered from every selection's O(L) values (O(L³) for a deep model's spans). GCNII x16 x4: 2,224
    np.broadcast_to calls before (one per symbol and selection, and per symbol of the inputs), 168 after that,
    none since the inputs' columns are reshaped views and a layer's values come in the grid's shape."""
    calls = _numpy_calls_inside_hybrid_values_of(monkeypatch, "broadcast_to")
    layers = 16
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=layers), graph, workers=4, allow=["hybrid"])
    assert calls["runs"] > 0 and calls["n"] <= 16 * layers, calls


def test_the_cost_symbols_are_made_once(monkeypatch, graph) -> None:
    """A Symbol() call runs sympy's assumption handling; the per-layer symbols (widths, Hybrid's rows, op
    times, kernel factors) are made once per process. A second compile of GCNII x16 makes none in its search
    (2,098 before: four per layer of every Hybrid selection, and the inputs' table)."""
    from gnnc.passes import choose_strategy

    model = gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=16)
    gnnc.compile(model, graph, workers=4)
    made = {"n": 0}
    real_new = sympy.Symbol.__new__
    search = choose_strategy.choose

    def counted_search(*args, **kwargs):
        def new(cls, *a, **k):
            made["n"] += 1
            return real_new(cls, *a, **k)

        sympy.Symbol.__new__ = new
        try:
            return search(*args, **kwargs)
        finally:
            sympy.Symbol.__new__ = real_new

    monkeypatch.setattr(choose_strategy, "choose", counted_search)
    gnnc.compile(model, graph, workers=4)
    assert made["n"] <= 20, made["n"]


def test_the_schedule_pass_splits_each_stage_into_pieces_once(stage_splits, graph) -> None:
    """The schedule pass compares the gradient all-reduce after and during backward by their times, which are
    the stages' own; only the schedule it keeps is split into pieces (its drawing). GCN x4 depcomm: 22 stages split before (three drawings), 7 now."""
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4, strategy="depcomm")
    report = plan.meta.schedule_report
    drawn = [s for s in report["predicted"]["stages"] if s["pieces"]]
    assert drawn and stage_splits["n"] <= len(drawn), (stage_splits["n"], len(drawn))
    times = {a["grad_overlap"]: a["time_s"] for a in report["grad_alternatives"]}
    assert times[report["grad_overlap"]] == report["predicted_time_s"]


def test_constants_are_evaluated_under_their_own_symbols_only(monkeypatch) -> None:
    """Elaboration evaluates a deep model's constants (a few hundred) under its configuration: sympy's subs is
    given the expression's own symbols, or not called for a number (it sorted every configuration key each
    time: the 64-layer GCNII example's elaboration spent half its time there). GCNII x16: 43 calls before, each
    given every parameter, 18 now."""
    given = []
    real = sympy.Basic.subs

    def subs(self, *args, **kwargs):
        given.append((self.free_symbols, set(args[0]) if args and isinstance(args[0], dict) else None))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sympy.Basic, "subs", subs)
    gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=16).program()
    assert given  # the hidden width's and the layer count's uses
    assert all(keys is None or keys <= free for free, keys in given), [k - f for f, k in given if k][:3]


def test_the_planners_own_schedule_is_drawn_only_when_read(stage_splits, graph) -> None:
    """choose-strategy's drawing of its choice is what the plan keeps only where no schedule pass redraws it (a
    pipeline plan): it is drawn when read. GCN x4 planned: 30 stages split at 64a7480 (four drawings: the
    planner's and the schedule pass's three), one drawing's now."""
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4)
    drawn = [s for s in plan.meta.planner.schedule["stages"] if s["pieces"]]
    assert drawn and stage_splits["n"] <= len(drawn), (stage_splits["n"], len(drawn))
    assert plan.meta.planner.schedule == plan.meta.schedule_report["predicted"]


def test_a_pass_that_returns_its_program_leaves_it_verified(monkeypatch, graph) -> None:
    """The IR is verified after every pass that changed it; an analysis pass returns the (immutable) program it
    was given, verified already. GCNII x8 x4: 15 verifications before (the input's and each of 14 passes'), 11 now
    (10 passes change it)."""
    from gnnc.passes import manager

    calls = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda program, *a, **k: calls.append(program) or real(program, *a, **k))
    seen = []
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4,
                 after=lambda name, program: seen.append(program))
    changed = sum(1 for a, b in zip(seen, seen[1:]) if a is not b) + 1
    assert len(calls) <= 1 + changed < 1 + len(seen), (len(calls), changed, len(seen))


def test_a_dp_insertion_compares_a_new_label_with_few_of_its_cells(monkeypatch) -> None:
    """A cell's labels are kept in increasing time (decreasing memory): a new label is compared with the one that
    may dominate it and with the run it dominates, found by bisection, not with every label twice. This table:
    1,060,891 comparisons for 23,657 insertions before (45 each); the 64-layer GCNII example on Cora x4 254,032
    for 8,454. The same table, labels, best and alternatives (checked against the old insertion on 3,000 random
    tables with ties, both memory rules, with and without a cap)."""
    layers = 24
    seg_cost = random_segment_costs(layers, 2, ("depcomm", "bcast1d"))
    counts = {"insert": 0, "compare": 0}
    insert, dominates = segment_dp._insert, segment_dp._dominates

    def counted_insert(labels, new) -> None:
        counts["insert"] += 1
        insert(labels, new)

    def counted_dominates(a, b) -> bool:
        counts["compare"] += 1
        return dominates(a, b)

    monkeypatch.setattr(segment_dp, "_insert", counted_insert)
    monkeypatch.setattr(segment_dp, "_dominates", counted_dominates)
    segment_dp.solve(layers, ["depcomm", "bcast1d", "depcache"], seg_cost)
    assert counts["compare"] <= 3 * counts["insert"], counts


def _algorithm_4_inputs(layers: int, t_x: float):
    """Worker 0's Algorithm 4 inputs on a random graph cut in 4, every layer alike: a row costs 1, an edge
    nothing, a fetched row 3.5, so a subtree passes the fetch within 3 hops unless V_rep holds its rows; an input
    row costs `t_x`."""
    from gnnc.passes.partition.stats import compute_stats
    from gnnc.passes.planner import hybrid_greedy as hg

    graph = random_graph(n=300, e=1800, f=8, c=3)
    parts = np.random.default_rng(1).integers(0, 4, graph.num_nodes)
    deps = hg.dependencies_from_stats(compute_stats(graph, parts, layers), 0, layers)
    costs = hg.UnitCosts(np.ones(layers), np.zeros(layers), np.full(layers, 3.5), t_x, np.ones(layers + 1), 1.0)
    return hg.in_trees(graph, "plain", parts, 0), deps, costs


@pytest.mark.parametrize("t_x", [0.0, 10.0])
def test_algorithm_4_measures_a_deep_models_alike_layers_once(monkeypatch, t_x: float) -> None:
    """Line 6 measures every dependency at each layer; a layer whose measure would repeat the last one's (the
    same roots, unit costs, exclusions) reads it back, and an equal expansion is not sorted again. The same
    subtrees are expanded for 24 layers as for 8 (before: about one expansion per layer and hop, 30 -> 110 here;
    GCNII x32 on the 89,000-vertex SBM x8 448 -> 68, and 57 of 267 measures made), whether V_rep grows at every
    layer (free inputs: a root V_rep holds below stops costing) or never (dear inputs: every measure is read back
    from the 5th layer on); and the run is the one measuring every layer gives."""
    from gnnc.passes.planner import hybrid_greedy as hg

    expanded, measured = [], []
    real_expand, real_read_back = hg._expand, hg._Measures.read_back
    monkeypatch.setattr(hg, "_expand", lambda *a: expanded.append(1) or real_expand(*a))

    def read_back(*args):
        last = real_read_back(*args)
        measured.append(last is None)
        return last

    monkeypatch.setattr(hg._Measures, "read_back", read_back)
    runs = {}
    for layers in (8, 24):
        trees, deps, costs = _algorithm_4_inputs(layers, t_x)
        expanded.clear()
        measured.clear()
        runs[layers] = (hg.paper_run(trees, deps.layer, deps.vertex, costs, float("inf"), layers), len(expanded),
                        sum(measured))
    (run, made, measures), (_, shallow, shallow_measures) = runs[24], runs[8]
    assert 0 < made == shallow, (made, shallow)  # the layers beyond the 8th expand nothing new
    if t_x > 0:  # and measure nothing new
        assert measures == shallow_measures < 8, (measures, shallow_measures)
    assert (run.rep_when.min() < 24) == (t_x == 0.0)  # whether V_rep grew
    monkeypatch.setattr(hg._Measures, "KEPT_BYTES", 0)  # the same run with nothing kept (too large), so measured
    expanded.clear()
    again = hg.paper_run(trees, deps.layer, deps.vertex, costs, float("inf"), 24)
    for name in ("rep_when", "added_rows", "added_edges", "used_after"):
        assert np.array_equal(getattr(run, name), getattr(again, name)), name
    assert len(expanded) > 2 * made  # the run compared with measured every layer


def test_the_l_hop_levels_stop_where_every_part_has_reached_every_vertex() -> None:
    """The statistics' L-hop levels move every part's frontier one hop per step (gnnc.plan.distances) until none
    moves: a 32-layer model on a graph a few hops wide steps a few levels, not 32 (GCNII x32 on the 89,000-vertex
    SBM: 6). The levels beyond are empty, as the brute force in test_graph_stats says."""
    from gnnc.passes.partition import stats
    from gnnc.plan import distances

    graph = random_graph(n=300, e=1800, f=8, c=3)
    parts = np.random.default_rng(0).integers(0, 4, graph.num_nodes)
    before = dict(distances.WORK)
    got = stats.compute_stats(graph, parts, 32)
    steps = distances.WORK["levels"] - before["levels"]
    reached = int(np.flatnonzero(got.lhop_vertices.sum(axis=0))[-1])
    assert distances.WORK["tables"] - before["tables"] == 1
    assert steps == reached + 1 < 32, (steps, reached)  # the last step finds nothing new
    assert got.lhop_vertices.sum() == 4 * (graph.num_nodes - 3) + 3  # every vertex but the 3 isolated, per part


def test_segment_spans_are_checked_up_to_the_first_refusal(monkeypatch, graph) -> None:
    """A segment strategy may hold the spans from a start up to the first layer it may not hold (GCNII's from
    layer 0 only): the search finds them once for every segment strategy, each start's ends tried up to the
    first refusal. The 64-layer GCNII example x4: 4,160 legality checks before (every span, for depcache and
    hybrid), 127 now."""
    from gnnc.passes.planner import search

    calls = []
    real = search.segment_can_start_at
    monkeypatch.setattr(search, "segment_can_start_at", lambda *a: calls.append(a[1:]) or real(*a))
    layers = 16
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=layers), graph, workers=4)
    assert len(calls) <= 2 * layers, len(calls)


def test_a_second_compile_prices_its_pipelines_without_partitioning_again(monkeypatch, graph) -> None:
    """--approximate prices a pipeline per group size, each on METIS chunks of the whole graph cut again per group
    member (GCNII x32 on the 89,000-vertex SBM x8: 27 METIS runs, ~3 CPU-s), and its formula: both are kept, the
    chunks with the graph (a pure function of it), the formula by its options (a list option made it afresh,
    ~0.3 CPU-s per size). A second compile of the same model on the same graph partitions nothing and builds no
    formula for them; the same plan."""
    from gnnc.passes.cost import registry
    from gnnc.passes.planner import pipeline

    model = gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    first = gnnc.compile(model, graph, workers=4, cluster="gnnpipe", approximate=True)
    partitioned, built = [], []
    real_partition, real_build = pipeline.partition_graph, registry._build_segment_cost
    monkeypatch.setattr(pipeline, "partition_graph", lambda *a, **k: partitioned.append(a) or real_partition(*a, **k))
    monkeypatch.setattr(registry, "_build_segment_cost", lambda *a, **k: built.append(a[0]) or real_build(*a, **k))
    second = gnnc.compile(model, graph, workers=4, cluster="gnnpipe", approximate=True)
    assert partitioned == [] and "pipeline" not in built, (len(partitioned), built)
    priced = [c for c in second.meta.planner.segment_costs if c["strategy"] == "pipeline"]
    assert priced and priced == [c for c in first.meta.planner.segment_costs if c["strategy"] == "pipeline"]


def test_the_dp_builds_no_labels_strategy_order_without_a_tie() -> None:
    """A label's per-layer strategy order (an O(L) tuple, read by the tie-breaking rule only when two labels have
    equal time and memory) is built from its parents when first read, not on every extension: on costs without
    ties no label builds it. Before: every label held it (8,454 tuples of up to 64 entries in the 64-layer GCNII
    example's fills on Cora x4; the fills' CPU 0.080 -> 0.053 s, the same tables)."""
    layers = 24
    seg_cost = random_segment_costs(layers, 3, ("depcomm", "bcast1d"))
    result = segment_dp.solve(layers, ["depcomm", "bcast1d", "depcache"], seg_cost, memory_cap=1e9)
    labels = [lab for cell in result.table.values() for lab in cell]
    assert len(labels) > 100
    assert not [lab for lab in labels if "order" in vars(lab) or "ends" in vars(lab)]
    for lab in labels:  # read when asked: the per-layer positions of its strategies
        assert len(lab.order) == lab.segment[1] and lab.ends[-1] == lab.segment[1]


def test_a_compiled_formula_reads_its_symbols_without_a_python_call_each() -> None:
    """A compiled formula (gnnc.passes.cost.evaluation) reads a symbol by an itemgetter and starts a sum's or
    product's fold from its number, not by a Python function per leaf: evaluating a sum of 40 products of a
    number and a symbol runs one Python frame per product (43 in all). Before: 130 (a closure per product, per
    symbol and per number); the 64-layer GCNII example on Cora x4 read ~49,000 symbols and ~6,000 numbers so.
    The values are the same floats, folded in the same order."""
    import sys

    from gnnc.passes.cost.evaluation import compile_expr
    from gnnc.passes.cost.symbols import Rows

    xs = sympy.symbols("x0:40", positive=True)
    expr = sympy.Add(*[sympy.Rational(2 * i + 1, 97) * x for i, x in enumerate(xs)])
    run = compile_expr(expr)
    rng = np.random.default_rng(0)
    values = Rows({x: rng.uniform(0.5, 2.0, 4) for x in xs})
    frames = []
    sys.setprofile(lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None)
    try:
        got = run(values, 4)
    finally:
        sys.setprofile(None)
    assert len(frames) <= 45, len(frames)
    want = None
    for term in expr.args:  # the same fold: sympy's order of the terms, each product number first, in float64
        number, x = term.args
        product = np.multiply(float(number), values[x])
        want = product if want is None else np.add(want, product)
    assert np.array_equal(got, want)


def test_hybrid_selections_per_layer_values_are_read_as_one_column_per_layer(monkeypatch, graph) -> None:
    """`hybrid_values` keeps the [workers, layers] arrays a selection's values come from (`HybridValues.dense`);
    `hybrid_values_of` lays every selection's out once ([kind, selection, worker, layer]) and reads a layer's
    CR/CS/RV/RE of all its selections by one indexing each, where it stacked one row per (selection, symbol):
    O(L²) Python calls for a deep model's spans. GCNII x16 x4, Hybrid only: 130 np.stack calls before (one per
    symbol and layer, each of one row per selection), 2 now (the replicated rows RX, per segment start); the
    64-layer example on Cora x4: hybrid_values_of 0.121 -> 0.084 CPU-s (LOADED, load 6-7).
    Same segment costs (checked on that compile against the start commit)."""
    calls = _numpy_calls_inside_hybrid_values_of(monkeypatch, "stack")
    inner = neutronstar.evaluate_alike

    def not_counted(*args, **kwargs):  # its stacks are one per alike formula group and symbol, whatever the layers
        on, calls["on"] = calls["on"], False  # (all layers evaluated at once: tests/test_depcache_spans_work.py)
        try:
            return inner(*args, **kwargs)
        finally:
            calls["on"] = on
    monkeypatch.setattr(neutronstar, "evaluate_alike", not_counted)
    layers = 16
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=layers), graph, workers=4, allow=["hybrid"])
    assert calls["n"] <= layers // 2, calls["n"]


def test_the_passes_run_with_the_older_objects_set_aside_from_the_collector(graph) -> None:
    """While the passes run, the objects alive before them (sympy's, numpy's, the formulas kept across compiles:
    ~500,000 for the 64-layer GCNII example) are frozen (`gc.freeze`), so a full collection the passes trigger
    does not scan them again; they are unfrozen after. Before: none frozen, and a full collection (~0.25 CPU-s
    on that example, LOADED) fell in about one compile in three on Cora x4."""
    import gc

    assert gc.get_freeze_count() == 0
    seen = []
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=2,
                 after=lambda name, program: seen.append(gc.get_freeze_count()))
    assert seen and min(seen) > 10_000, seen[:3]
    assert gc.get_freeze_count() == 0  # unfrozen after: their cycles are collected as before


def test_ir_records_are_replaced_without_walking_their_fields_each_time(monkeypatch, graph) -> None:
    """`_Record.replace` (every IR record: Value, Eqn, Layer, Program...) keeps each class's field names and
    builds the new record through its __init__ (its __post_init__ still checks it), where dataclasses.replace
    walked the fields per call: GCNII x8, dataclasses.fields calls during the compile counted (703 before, one
    per replace; 5,241 for the 64-layer example on Cora x4), a handful now."""
    import dataclasses

    calls = count_calls(monkeypatch, dataclasses, "fields")
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4)
    assert calls["n"] <= 20, calls["n"]
    from gnnc.ir import Value
    with pytest.raises(TypeError, match="no field"):
        Value("x", None).replace(nme="y")


def test_a_costs_stage_maxima_are_one_reduction() -> None:
    """`CompiledCost.on_table` takes every stage's slowest worker in one `max(axis=1)`, not one `row.max()` per
    stage (the planner evaluates ~200 costs of ~10 stages per compile of the 64-layer GCNII example): a cost of
    12 stages calls max twice (the stages, the memory), where it called it 13 times. The same floats."""
    import sys

    from gnnc.passes.cost.evaluation import CompiledCost
    from gnnc.passes.cost.symbols import Cost, Rows

    xs = sympy.symbols("s0:12", positive=True)
    cost = Cost("twelve", tuple(x * (i + 1) for i, x in enumerate(xs)), xs[0], xs[1])
    rng = np.random.default_rng(2)
    table = Rows({x: rng.uniform(0.5, 2.0, 4) for x in xs})
    compiled = CompiledCost(cost)
    maxima = []
    sys.setprofile(lambda frame, event, arg: maxima.append(1) if event == "c_call" and
                   getattr(arg, "__name__", "") == "max" else None)
    try:
        value = compiled.on_table(table, 4)
    finally:
        sys.setprofile(None)
    assert len(maxima) <= 2, len(maxima)
    assert value.time == sum(float(row.max()) for row in value.stage_times)
