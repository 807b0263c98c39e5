"""Work a compile does after the planner's search, counted (issue 36: the 64-layer GCNII example on Cora x4 within
1 s after load): the schedule pass's drawing of the predicted epoch, the IR verifier run after every pass, the IR
printed into the plan, and plan.json itself.

Each test counts one cost that the compile paid and no longer pays (counts, not timings: the machine is shared)
and says what it measured before; benchmarks/compile_time.py has the times (benchmarks/RESULTS-compile-time.md,
session 25).
"""
from __future__ import annotations

import pytest
import sympy

import gnnc
from conftest import EXAMPLES, random_graph
from gnnc.ir import Type
from gnnc.ir.verify import VerifyError, verify
from gnnc.passes import schedule as schedule_pass
from gnnc.passes.cost import evaluation
from gnnc.passes.cost.schedule import predicted_schedule


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
    GIN x4 Hybrid (a selection that leaves rows to fetch): 18 tables for its 18 pieces at f7ba317, 1 now."""
    sparse = random_graph(n=3000, e=9000, f=16, c=4)  # (on the denser graph the selection caches every row)
    segments, priced = _drawn(monkeypatch, sparse, gnnc.load_model(EXAMPLES / "gin.gnn"), allow=["hybrid"])
    hybrid = [s for s in segments if s.strategy == "hybrid" and priced.extras[(s.start, s.end, s.strategy)]]
    assert hybrid  # a segment with symbol values of its own (not one priced as DepCache)
    made = {"n": 0}
    real = evaluation.per_worker

    def counted(*args, **kwargs):
        made["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "per_worker", counted)
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
    compared = {"n": 0}
    real = Type.__eq__

    def counted(self, other):
        compared["n"] += 1
        return real(self, other)

    monkeypatch.setattr(Type, "__eq__", counted)
    verify(plan.program, typed=True, checked=checked)
    assert compared["n"] == 0, compared["n"]


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
    printed = {"n": 0}
    from sympy.printing import str as sympy_str
    real = sympy_str.sstr

    def counted(*args, **kwargs):
        printed["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(sympy_str, "sstr", counted)
    text = str(program)
    text_again = str(program)
    assert text == text_again
    assert printed["n"] <= len(dims) + len(program.config), (printed["n"], len(dims))
