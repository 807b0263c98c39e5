"""The pass manager's contract: typed options in the pipeline text, requirements, the analysis cache."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.errors import GnncError
from gnnc.passes.cost import inputs as cost_inputs
from gnnc.passes.manager import PassContext, parse_pipeline, register_pass, run_pipeline
from gnnc.passes.pipeline_text import option
from gnnc.testing import as_program

GCN = EXAMPLES / "gcn.gnn"
DIMS = {"features": 12, "classes": 4}


@dataclass(frozen=True)
class ProbeOptions:
    count: int = option(1, "an int")
    scale: float = option(1.0, "a float")
    loud: bool = option(False, "a bool")
    names: tuple[str, ...] = option((), "a list")


SEEN: list[ProbeOptions] = []


@register_pass("test-options", "records its options (a test pass)", options=ProbeOptions)
def _record(program, ctx, opts: ProbeOptions):
    SEEN.append(opts)
    return program


def test_pipeline_text_gives_typed_options() -> None:
    specs = parse_pipeline("infer-shapes, test-options{count=3 scale=0.5 loud=true names=a,b},check")
    assert [s.name for s in specs] == ["infer-shapes", "test-options", "check"]
    assert specs[1].options == ProbeOptions(count=3, scale=0.5, loud=True, names=("a", "b"))
    assert specs[1].given == {"count", "scale", "loud", "names"}
    assert str(specs[1]) == "test-options{count=3 loud=true names=a,b scale=0.5}"
    assert str(specs[0]) == "infer-shapes" and specs[0].options is None
    assert parse_pipeline("test-options")[0].options == ProbeOptions()  # the defaults
    assert parse_pipeline(str(specs[1]))[0] == specs[1]  # the text form reads back


def test_options_reach_the_pass() -> None:
    SEEN.clear()
    run_pipeline(as_program(GCN, DIMS), parse_pipeline("test-options{count=7}"))
    assert SEEN == [ProbeOptions(count=7)]


@pytest.mark.parametrize("text, message", [
    ("infer-shapes,bogus", "unknown pass 'bogus'"),
    ("test-options{colour=red}", "pass 'test-options' has no option 'colour' (options: count, scale, loud, names)"),
    ("test-options{count=many}", "pass 'test-options', option 'count': expected int, got 'many'"),
    ("test-options{scale=x}", "pass 'test-options', option 'scale': expected float, got 'x'"),
    ("test-options{loud=maybe}", "pass 'test-options', option 'loud': expected true or false, got 'maybe'"),
    ("test-options{count}", "pass 'test-options': option 'count' must be KEY=VALUE"),
    ("check{strict=true}", "pass 'check' takes no options, got '{strict=true}'"),
    ("test-options{count=1", "'{' without '}'"),
    ("test-options}", "'}' without '{'"),
    ("test-options{count=1}x", "text after the options of 'test-options'"),
    ("choose-strategy{allow=depcomm", "'{' without '}'"),
])
def test_pipeline_text_errors_name_the_culprit(text: str, message: str) -> None:
    with pytest.raises(GnncError) as info:
        parse_pipeline(text)
    assert message in info.value.message


def test_a_pass_refuses_to_run_without_what_it_requires() -> None:
    program = run_pipeline(as_program(GCN, DIMS), ["infer-shapes"])
    with pytest.raises(GnncError, match=r"pass 'insert-comm' requires that graph layers carry a strategy "
                                        r"attribute, which does not hold \(it runs first\): run assign-strategy"):
        run_pipeline(program, ["insert-comm"])
    with pytest.raises(GnncError, match=r"pass 'assign-strategy' requires that every value has a type, which does "
                                        r"not hold \(it runs first\): run infer-shapes before it"):
        run_pipeline(as_program(GCN, DIMS), ["assign-strategy"])
    with pytest.raises(GnncError, match=r"pass 'predict-bytes' requires that a partition of the graph over the "
                                        r"workers.* \(ran: infer-shapes, assign-strategy\)"):
        run_pipeline(as_program(GCN, DIMS), ["infer-shapes", "assign-strategy", "predict-bytes"])
    # once assign-strategy has run, insert-comm has what it needs
    run_pipeline(as_program(GCN, DIMS), ["infer-shapes", "assign-strategy", "insert-comm"], verify_each=True)


def test_unknown_requirement_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="requires unknown facts"):
        register_pass("test-bad-requires", "never registered", requires=("lowered-ish",))


def test_analysis_cache_keeps_what_a_pass_preserves() -> None:
    calls = []

    class Count:
        @classmethod
        def compute(cls, program, ctx):
            calls.append(program)
            return len(calls)

    ctx = PassContext()
    program = as_program(GCN, DIMS)
    assert ctx.analyses.get(Count, program) == 1 and ctx.analyses.get(Count, program) == 1
    ctx.analyses.keep_only((Count,))
    assert ctx.analyses.get(Count, program) == 1
    ctx.analyses.keep_only(())
    assert ctx.analyses.get(Count, program) == 2


def test_planning_inputs_are_computed_once_per_compile(monkeypatch) -> None:
    """choose-strategy and select-hybrid price on the same statistics: one computation, not two."""
    calls = []
    real = cost_inputs.planning_inputs

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(cost_inputs, "planning_inputs", counting)
    plan = api.compile(api.load_model(GCN), random_graph(), workers=2, allow=["hybrid"], cluster="neutronstar-ecs")
    assert [layer.attr("strategy") for layer in plan.program.graph_layers()] == ["hybrid", "hybrid"]
    assert plan.meta.hybrid and plan.meta.planner  # both passes used the inputs
    assert len(calls) == 1


def test_compile_options_need_a_pass_that_takes_them() -> None:
    with pytest.raises(GnncError, match=r"--allow: no pass of the pipeline \(infer-shapes, check, lower, "
                                        r"assign-strategy, insert-comm\) takes it"):
        api.compile(api.load_model(GCN), random_graph(), workers=2, allow=["depcomm"],
                    passes=["infer-shapes", "check", "lower", "assign-strategy", "insert-comm"])


def test_pipeline_text_options_win_over_the_compile_options() -> None:
    passes = parse_pipeline("infer-shapes,check,lower,choose-strategy{strategy=depcache},assign-strategy")
    plan = api.compile(api.load_model(GCN), random_graph(), workers=2, strategy="depcomm", passes=passes)
    assert [layer.attr("strategy") for layer in plan.program.graph_layers()] == ["depcache", "depcache"]
    assert plan.passes == ["infer-shapes", "check", "lower", "choose-strategy{strategy=depcache}", "assign-strategy"]
