"""The strategy registry (gnnc.plan.strategies) and every consumer of it agree.

A strategy is one descriptor, one cost formula (registered against it in
gnnc.passes.cost) and, per communication op it names, that exchange's
descriptor (gnnc.plan.comm_ops) and its runtime implementation
(`@implements_exchange`, gnnc.runtime.implementations); these tests fail when a
strategy is added to one place and not the others.
"""
from __future__ import annotations

import argparse

import pytest

from gnnc.cli import build_parser
from gnnc.errors import GnncError
from gnnc.ir.ops import COMM_OPS
from gnnc.passes.cost.layouts import boundary
from gnnc.passes.cost.registry import has_formula, register_cost, sampled_formula, segment_cost
from gnnc.passes.cost.symbols import LayerShape
from gnnc.plan.comm_ops import COMM_OP_DEFS
from gnnc.plan.sampled_shards import SAMPLED_LAYOUTS
from gnnc.plan.strategies import LAYOUTS, STRATEGIES, StrategyDef, names, strategy
from gnnc.runtime import distributed, pipeline  # noqa: F401 (they register gnnc's exchanges)
from gnnc.runtime.implementations import EXCHANGES


def test_the_registry_holds_the_strategies_design_md_names() -> None:
    assert set(STRATEGIES) == {"depcomm", "depcache", "hybrid", "pushpull", "bcast1d", "dp-sample", "pipeline",
                               "local"}
    # the planner's order, full-graph and sampled (--fanout)
    assert names(plannable=True, batching="full") == ("depcomm", "depcache", "hybrid", "bcast1d", "pushpull",
                                                      "pipeline")
    assert names(plannable=True, batching="sampled") == ("pushpull", "dp-sample")
    assert names(runnable=False) == ()
    assert names(single_worker=True) == ("local",)
    assert [s.name for s in STRATEGIES.values() if not s.exact] == ["pipeline"]
    assert [s.name for s in STRATEGIES.values() if s.span == "segment"] == ["depcache", "hybrid", "pipeline"]
    with pytest.raises(KeyError, match="known: depcomm"):
        strategy("ring")
    with pytest.raises(ValueError, match="layout 'diagonal'"):
        StrategyDef("x", "", "layer", "diagonal", "vertex")


@pytest.mark.parametrize("name", names(runnable=True))
def test_every_runnable_strategy_has_a_cost_formula_and_runtime_exchanges(name: str) -> None:
    sd = STRATEGIES[name]
    if "full" in sd.batching:
        assert has_formula(name)
        span = (0, 1) if sd.span == "layer" else (0, 2)
        cost = segment_cost(name, *span, [LayerShape()] * (span[1] - span[0]))
        assert cost.name.startswith(f"{name}[")
    if "sampled" in sd.batching and not sd.single_worker:  # one worker is not planned
        assert has_formula(name, "sampled")
        assert sampled_formula(name)(0, LayerShape()).name.startswith(f"{name}[")
        assert sd.layout_in in SAMPLED_LAYOUTS, f"{name}: the sampled runtime holds no {sd.layout_in} layout"
    for op in sd.comm_ops:
        assert op in COMM_OP_DEFS, f"{name}: no exchange descriptor for its op {op!r}"
        assert (op, "run") in EXCHANGES, f"{name}: no runtime exchange for its op {op!r}"
        assert op in COMM_OPS, f"{name}: {op!r} is not a communication op of the IR"
    assert sd.layout_in in LAYOUTS and sd.layout_out in LAYOUTS


def test_every_exchange_serves_a_strategy() -> None:
    # P3's sync of attention scores serves pushpull: insert-comm adds it where a pushpull layer has attention
    used = {op for sd in STRATEGIES.values() for op in sd.comm_ops} | {"sync_scores"}
    assert used == set(COMM_OPS) <= set(COMM_OP_DEFS)  # (a test may register a toy exchange beside them)
    assert used <= {op for op, role in EXCHANGES if role == "run"}


def test_a_strategy_without_a_formula_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no cost formula for strategy 'ring'"):
        segment_cost("ring", 0, 1, [LayerShape()])
    with pytest.raises(GnncError, match="not a strategy the planner chooses"):
        register_cost("local")


def test_transitions_follow_the_descriptors_layouts() -> None:
    # pushpull reads feature slices: entering it from vertex rows is an all-to-all; leaving it is free
    assert boundary("depcomm", "pushpull", 1).name == "vertex->feature"
    assert boundary("pushpull", "depcomm", 1).name == "vertex->vertex"


def _choices(command: str, flag: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return next(a for a in sub._actions if flag in a.option_strings).help


def test_the_cli_lists_exactly_the_registry() -> None:
    assert _choices("compile", "--allow").endswith(": " + ", ".join(names(plannable=True)))
    for command in ("compile", "run"):
        assert _choices(command, "--strategy").endswith(": " + ", ".join(STRATEGIES))
    parser = build_parser()
    assert parser.parse_args(["compile", "m.gnn", "--strategy", "depcomm,bcast1d"]).strategy == "depcomm,bcast1d"
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["compile", "m.gnn", "--allow", "depcomm,local"])
    assert err.value.code == 2


def test_approximate_strategies_and_schedules_are_refused_without_the_flag_by_their_descriptors() -> None:
    from gnnc.plan.approximation import approximations, require_exact
    from gnnc.plan.schedules import SCHEDULES

    inexact = [s.name for s in STRATEGIES.values() if not s.exact]
    assert inexact == ["pipeline"] and [s.name for s in SCHEDULES.values() if not s.exact] == ["2f2b"]
    assert approximations(["depcomm", "pushpull"], "sequential") == []
    with pytest.raises(GnncError, match="strategy pipeline: a layer reads the historical embeddings.*--approximate"):
        require_exact(["depcomm", "pipeline"], None, approximate=False)
    with pytest.raises(GnncError, match="schedule 2f2b: each minibatch's gradient"):
        require_exact(["pushpull"], "2f2b", approximate=False)
    require_exact(["pipeline"], "2f2b", approximate=True)
