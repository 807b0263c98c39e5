"""Work a compile does after the planner's search, counted (issue 36: the 64-layer GCNII example on Cora x4 within
1 s after load): the schedule pass's drawing of the predicted epoch, the IR verifier run after every pass, the IR
printed into the plan, and plan.json itself.

Each test counts one cost that the compile paid and no longer pays (counts, not timings: the machine is shared)
and says what it measured before; benchmarks/compile_time.py has the times (benchmarks/RESULTS-compile-time.md,
session 25).
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import sympy

import gnnc
from conftest import EXAMPLES, count_calls, random_graph
from gnnc.errors import PlanError
from gnnc.ir import Type
from gnnc.ir.verify import VerifyError, verify
from gnnc.passes import schedule as schedule_pass
from gnnc.passes.cost import evaluation
from gnnc.passes.cost.neutronstar import hybrid_values
from gnnc.passes.cost.schedule import predicted_schedule
from gnnc.plan import plan_meta
from gnnc.plan.plan_file import Plan


@pytest.fixture(scope="module")
def graph():
    return random_graph(n=300, e=1800, f=16, c=4)


def _drawn(monkeypatch, graph, model, **options):
    """(segments, priced plan) the schedule pass draws its predicted epoch from, for a compile on 4 workers."""
    seen = {}
    real = schedule_pass.predicted_schedule

    def grab(segments, priced, pieces=True):
        if pieces:
            seen["args"] = (segments, priced)
        return real(segments, priced, pieces)

    monkeypatch.setattr(schedule_pass, "predicted_schedule", grab)
    gnnc.compile(model, graph, workers=4, **options)
    monkeypatch.undo()
    return seen["args"]


def test_the_drawing_reads_each_terms_symbols_in_one_walk(monkeypatch, graph) -> None:
    """Each term of a stage is placed by what it does (the rates it divides by) and the layer it belongs to (the
    hops and widths it reads), both read off one walk of its symbols. A DepCache stage over 8 GCNII layers: each
    term's free symbols were found twice (once for each), through sympy's free_symbols (a set union per
    sub-expression): 548 free_symbols calls in a drawing of 152 stage terms at f7ba317, none now."""
    segments, priced = _drawn(monkeypatch, graph, gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8),
                              strategy="depcache")
    assert [(s.start, s.end) for s in segments] == [(0, 8)]  # one stage per direction, spanning every layer
    key = (0, 8, "depcache")
    terms = sum(len(sympy.Add.make_args(stage)) for stage in priced.formulas[key].stages)
    first = predicted_schedule(segments, priced)  # (the pieces' formulas compiled: they are kept)
    walks = {"n": 0}
    real = sympy.Basic.free_symbols

    def counted(self):
        walks["n"] += 1
        return real.fget(self)

    monkeypatch.setattr(sympy.Basic, "free_symbols", property(counted))
    again = predicted_schedule(segments, priced)
    monkeypatch.undo()
    assert again == first
    assert terms > 100 and walks["n"] <= terms // 10, (walks["n"], terms)
    layers = {p["layer"] for s in again["stages"] if s["kind"] == "segment" for p in s["pieces"]}
    assert set(range(8)) <= layers  # the terms still placed on their layers


def test_a_hybrid_drawing_makes_each_segments_symbol_table_once(monkeypatch, graph) -> None:
    """A Hybrid segment's pieces are evaluated with its selection's values over the inputs': that table is made
    once per segment, where each piece made its own (every symbol's row, the selection's broadcast per worker).
    GCN x4 Hybrid: one table per piece at f7ba317 (GIN x4: 18 for its 18 pieces), 1 now."""
    # a Hybrid segment with symbol values of its own (a selection that leaves rows to fetch); which one the
    # selection makes depends on the cost model: where every candidate caches all its rows (priced as DepCache, no
    # values of its own) the segment is drawn with communicate-all values, as the schedule pass gives a selection
    # it did not make (passes/schedule.py `_extra`)
    for name, on in (("gcn", graph), ("sage", graph), ("gin", random_graph(n=3000, e=9000, f=16, c=4))):
        segments, priced = _drawn(monkeypatch, on, gnnc.load_model(EXAMPLES / f"{name}.gnn"), allow=["hybrid"])
        hybrid = [s for s in segments if s.strategy == "hybrid" and priced.extras[(s.start, s.end, s.strategy)]]
        if hybrid:
            break
    else:
        seg, inp = segments[0], priced.inputs
        k, p = seg.end - seg.start, inp.workers
        values = hybrid_values(seg.start, np.stack([inp.remote] * k, 1), np.stack([inp.send] * k, 1),
                               np.zeros((p, k)), np.zeros((p, k)), np.zeros(p))
        priced = dataclasses.replace(priced, extras={**priced.extras, (seg.start, seg.end, seg.strategy): values})
        hybrid = [seg]
    made = count_calls(monkeypatch, evaluation, "per_worker")
    drawn = predicted_schedule(segments, priced)
    pieces = sum(len(s["pieces"]) for s in drawn["stages"] if s["strategy"] == "hybrid")
    assert pieces > len(hybrid) and made["n"] <= len(hybrid), (made["n"], pieces, len(hybrid))


def test_the_verifier_compares_no_type_of_a_value_used_as_defined(monkeypatch, graph) -> None:
    """The compile verifies the IR after each pass that changed it (11 times for the 64-layer example); a use of
    the very value its definition holds (the passes leave every use so) has that definition's type, and is not
    compared. GCNII x8 on 4 workers: 202 Type comparisons per verification at f7ba317, none now."""
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4)
    checked: dict = {}
    verify(plan.program, typed=True, checked=checked)  # (the type rules re-run once: not counted)
    compared = count_calls(monkeypatch, Type, "__eq__")
    verify(plan.program, typed=True, checked=checked)
    assert compared["n"] == 0, compared["n"]


def test_a_program_of_the_verified_programs_own_parts_is_not_verified_again(monkeypatch, graph) -> None:
    """Some passes make a new Program record of the very layers, inputs and results they were given (reorder-gemm,
    sink-bias, insert-comm when nothing moves); the verifier reads nothing else, so such a program passes as the
    last one did, unchecked. GCNII x8 on 4 workers: 11 verifications each checking every equation at f7ba317;
    now those of a program of the last one's parts check none (the 64-layer example: 3 of 11)."""
    import importlib

    from gnnc.passes import manager

    verify_module = importlib.import_module("gnnc.ir.verify")
    checks = {"n": 0}

    class Counted(tuple):
        def __contains__(self, item) -> bool:
            checks["n"] += 1
            return tuple.__contains__(self, item)

    monkeypatch.setattr(verify_module, "PRIMITIVES", Counted(verify_module.PRIMITIVES))
    per_call = []
    real = manager.verify

    def counted(program, *args, **kwargs):
        before = checks["n"]
        real(program, *args, **kwargs)
        per_call.append(checks["n"] - before)

    monkeypatch.setattr(manager, "verify", counted)
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4)
    assert len(per_call) >= 8 and per_call[0] > 0, per_call
    assert per_call.count(0) >= 2, per_call  # (was none: each verification checked every equation)


def test_passes_that_change_nothing_keep_the_records_they_were_given(graph) -> None:
    """hoist (run twice) and predict-bytes rebuilt every layer, equal to the given ones, when they had nothing to
    mark: the IR was then verified again whole. Now an unchanged equation, layer and program is the given record
    (hoist returns the program it was given: not verified again; predict-bytes keeps every layer without an
    exchange). The 64-layer example on Cora x4: 11 verifications, 8 checking equations at f7ba317 -> 9, 5."""
    seen = []
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4, strategy="depcache",
                 after=lambda name, program: seen.append((name, program)))
    names = [name for name, _ in seen]
    assert names.count("hoist") == 2 and "predict-bytes" in names
    for k, (name, program) in enumerate(seen):
        if name == "hoist":
            assert program is seen[k - 1][1], name  # GCNII hoists nothing
        if name == "predict-bytes":
            kept = [a is b for a, b in zip(seen[k - 1][1].layers, program.layers)]
            assert kept and all(kept), kept  # (DepCache: no exchange inside its layers)


def test_the_verifier_still_names_a_use_of_another_type(graph) -> None:
    """The shortcut above skips only a use that is its definition's value: a use of the same name with another
    type is still refused, naming both."""
    program = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4).program
    layer, k = next((layer, k) for layer in program.layers for k, e in enumerate(layer.eqns)
                    if e.ins and any(e.ins[0].name == o.name for q in layer.eqns[:k] for o in q.outs))
    eqn = layer.eqns[k]
    wrong = eqn.ins[0].replace(type=eqn.ins[0].type.replace(dtype="i64"))  # same name, another type
    bad = layer.replace(eqns=(*layer.eqns[:k], eqn.replace(ins=(wrong, *eqn.ins[1:])), *layer.eqns[k + 1:]))
    broken = program.replace(layers=tuple(bad if x is layer else x for x in program.layers))
    with pytest.raises(VerifyError, match="at its use but"):
        verify(broken, typed=True)


def test_the_ir_printer_prints_each_dim_once(monkeypatch, graph) -> None:
    """The plan holds the IR as text: every value's type prints its dims, a few distinct ones (`hidden`, `64`)
    on ~2,000 values of a deep model, each through sympy's printer (~10 us). A dim is printed once per process
    now. GCNII x8: 599 sympy prints for two IR texts at f7ba317, at most the distinct dims (here 3) now."""
    program = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4).program
    dims = {d for layer in program.layers for e in layer.eqns for v in (*e.ins, *e.outs) if v.type
            for d in v.type.shape}
    from sympy.printing import str as sympy_str
    printed = count_calls(monkeypatch, sympy_str, "sstr")
    text = str(program)
    text_again = str(program)
    assert text == text_again
    assert printed["n"] <= len(dims) + len(program.config), (printed["n"], len(dims))


@pytest.fixture(scope="module")
def saved(graph, tmp_path_factory):
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=4), graph, workers=4)
    return plan, plan.save(tmp_path_factory.mktemp("once") / "plan")


def test_plan_json_holds_the_predicted_schedule_once(saved) -> None:
    """The schedule pass's report and the planner's record hold one drawing of the predicted epoch; plan.json
    wrote it twice (the 64-layer example: ~140 KB each, encoded and written twice). Now once, under
    planner.schedule, the report naming where it is; a loaded plan has it in both places again."""
    plan, path = saved
    assert plan.meta.schedule_report["predicted"] is plan.meta.planner.schedule
    data = json.loads((path / "plan.json").read_text())
    assert "predicted" not in data["schedule_report"]
    assert data["schedule_report"]["predicted_in"] == "planner.schedule"
    assert data["planner"]["schedule"]["stages"]
    loaded = Plan.load(path)
    assert loaded.meta == plan.meta
    assert loaded.meta.schedule_report["predicted"] == plan.meta.planner.schedule
    assert "predicted_in" not in loaded.meta.schedule_report


def test_a_plan_with_both_copies_reads_as_before(saved, tmp_path) -> None:
    """A plan written before this change (both copies) loads the same, and is written once when saved again."""
    plan, path = saved
    data = json.loads((path / "plan.json").read_text())
    report = data["schedule_report"]
    del report["predicted_in"]
    report["predicted"] = data["planner"]["schedule"]
    (path.parent / "old").mkdir()
    old = _rewritten(path, path.parent / "old" / "plan", data)
    loaded = Plan.load(old)
    assert loaded.meta == plan.meta
    again = json.loads((loaded.save(tmp_path / "again") / "plan.json").read_text())
    assert "predicted" not in again["schedule_report"] and again["schedule_report"]["predicted_in"] == "planner.schedule"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["schedule_report"].update(predicted_in="planner.alternatives"),
     "'schedule_report.predicted_in' must be 'planner.schedule'"),
    (lambda d: d["schedule_report"].update(predicted=d["planner"]["schedule"]),
     "gives both 'predicted' and 'predicted_in'"),
    (lambda d: d["planner"].pop("schedule"), "names 'planner.schedule', which the plan does not hold"),
])
def test_a_schedule_report_pointing_nowhere_is_refused(saved, tmp_path, change, message) -> None:
    """plan.json is data anyone can edit: a report naming a copy the plan does not hold, or holding both, is a
    PlanError naming the field (exit 2)."""
    _plan, path = saved
    data = json.loads((path / "plan.json").read_text())
    change(data)
    with pytest.raises(PlanError, match=message):
        Plan.load(_rewritten(path, tmp_path / "plan", data))


def _rewritten(src, dst, data):
    """A copy of the plan directory `src` at `dst` with plan.json replaced by `data`."""
    shutil.copytree(src, dst)
    (dst / "plan.json").write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    return dst


def test_plan_json_encodes_a_plain_leaf_without_a_call(monkeypatch, saved) -> None:
    """The plan's records are walked into JSON values (`plan_meta._encode`: dataclasses to objects, tuples to
    lists); the numbers and strings inside a list or dict are taken as they are, not encoded one call each.
    GCNII x4 on 4 workers: 1,680 calls for 368 containers (two copies of the schedule) at f7ba317, one per
    container now."""
    plan, _path = saved
    calls = count_calls(monkeypatch, plan_meta, "_encode")
    data = plan.meta.to_json()
    monkeypatch.undo()
    graph_layers = len(plan.program.graph_layers())
    assert plan_meta.PlanMeta.from_json(json.loads(json.dumps(data)), graph_layers, PlanError) == plan.meta

    def containers(value) -> int:
        if isinstance(value, dict):
            return 1 + sum(containers(v) for v in value.values())
        if isinstance(value, list):
            return 1 + sum(containers(v) for v in value)
        return 0

    assert calls["n"] <= containers(data), (calls["n"], containers(data))
