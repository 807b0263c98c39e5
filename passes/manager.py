"""Passes registered by name, and the manager that runs a pipeline of them.

A pass is a function `(Program, PassContext) -> Program`, or `(Program,
PassContext, options) -> Program` when it declares an options dataclass;
it is registered with a short name, a one-line summary, its options and the
facts it requires (`gnnc compile --passes 'a{k=v},b' --print-after b` names
them). Before each pass the manager checks what it requires and refuses,
naming the pass that establishes the missing fact, instead of letting a pass
silently do nothing; it can verify the IR after every pass and, when an
invariant breaks, says which pass broke it and which passes ran before.
"""
from __future__ import annotations

import gc
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from gnnc.errors import GnncError
from gnnc.ir import Program, VerifyError, all_values, verify
from gnnc.passes.context import PassContext, PassResults  # noqa: F401  (re-exported: passes import them here)
from gnnc.passes.pipeline_text import PassSpec, parse_options, split_pipeline
from gnnc.passes.pipelines import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE  # noqa: F401  (re-exported)

PassFn = Callable[..., Program]


@dataclass(frozen=True)
class Fact:
    """Something a pass may require to hold before it runs, and the pass (or input) that makes it hold."""

    name: str
    description: str
    holds: Callable[[Program, PassContext], bool]
    established_by: str


FACTS: dict[str, Fact] = {f.name: f for f in (
    Fact("typed", "every value has a type",
         lambda p, ctx: all(v.type is not None for v in all_values(p)), "run infer-shapes before it"),
    Fact("strategies", "graph layers carry a strategy attribute",
         lambda p, ctx: all(layer.attr("strategy") is not None for layer in p.graph_layers()),
         "run assign-strategy before it"),
    Fact("partition", "a partition of the graph over the workers",
         lambda p, ctx: ctx.partition is not None and ctx.graph is not None,
         "compile for several workers with a graph: --workers N --graph G"),
)}


@dataclass(frozen=True)
class PassInfo:
    name: str
    summary: str
    fn: PassFn
    typed_after: bool  # whether every value has a type once this pass has run
    options: type | None = None  # a frozen dataclass of the pass's options (pipeline_text.option fields)
    requires: tuple[str, ...] = ()  # FACTS that must hold before it runs
    preserves: tuple[type, ...] = ()  # analyses still valid after it changes the program


_REGISTRY: dict[str, PassInfo] = {}


def register_pass(name: str, summary: str, typed_after: bool = True, options: type | None = None,
                  requires: tuple[str, ...] = (), preserves: tuple[type, ...] = ()) -> Callable[[PassFn], PassFn]:
    """Decorator: make `fn` runnable as pass `name` (names are unique).

    `options`: a frozen dataclass of the pass's options; `fn` then takes it as
    a third argument. `requires`: names of FACTS that must hold before it runs.
    `preserves`: analysis classes a change of the program by this pass leaves valid.
    """
    unknown = [r for r in requires if r not in FACTS]
    if unknown:
        raise ValueError(f"pass {name!r} requires unknown facts {unknown} (known: {', '.join(FACTS)})")

    def deco(fn: PassFn) -> PassFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"a pass named {name!r} is already registered")
        takes = len(inspect.signature(fn).parameters)
        if takes != (3 if options is not None else 2):
            raise ValueError(f"pass {name!r}: takes (program, ctx{', options' if options else ''}), "
                             f"not {takes} arguments")
        _REGISTRY[name] = PassInfo(name, summary, fn, typed_after, options, tuple(requires), tuple(preserves))
        return fn

    return deco


# The built-in passes: pass name -> the module of gnnc.passes that registers it. A module is imported when its
# pass is first named (the pass modules import register_pass from here, so this one cannot import them at its
# top), and only then: `gnnc check` runs two passes and must not load the planner (sympy formulas, torch).
_BUILTIN_MODULES: dict[str, str] = {
    "infer-shapes": "infer_shapes", "check": "check", "lower": "lower", "reorder-gemm": "reorder_gemm",
    "sink-bias": "sink_bias", "choose-strategy": "choose_strategy", "assign-strategy": "assign_strategy",
    "select-hybrid": "select_hybrid", "insert-comm": "insert_comm", "predict-bytes": "predict_bytes", "hoist": "hoist",
    "schedule": "schedule",
    "stage-pipeline": "stage_pipeline",
}


def _load_builtin() -> None:
    for module in _BUILTIN_MODULES.values():
        importlib.import_module(f"gnnc.passes.{module}")


def passes() -> dict[str, PassInfo]:
    _load_builtin()
    return dict(_REGISTRY)


def _info(name: str) -> PassInfo | None:
    """The registered pass `name` (a built-in one's module imported now); None if no pass has that name."""
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(f"gnnc.passes.{_BUILTIN_MODULES[name]}")
    return _REGISTRY.get(name)


def parse_pipeline(text: str) -> list[PassSpec]:
    """`a,b{key=value key=value},c` as the passes to run with their typed options (GnncError names a typo)."""
    specs = []
    for name, option_text in split_pipeline(text):
        info = _info(name)
        if info is None:
            raise GnncError(f"unknown pass '{name}' (known: {', '.join(sorted(passes()))})")
        specs.append(parse_options(name, info.options, option_text))
    return specs


def as_spec(item: str | PassSpec) -> PassSpec:
    """A pipeline entry given by name (its default options) or already parsed."""
    return item if isinstance(item, PassSpec) else parse_pipeline(item)[0]


def _check_requires(info: PassInfo, program: Program, ctx: PassContext, done: list[str]) -> None:
    for name in info.requires:
        fact = FACTS[name]
        if not fact.holds(program, ctx):
            ran = f" (ran: {', '.join(done)})" if done else " (it runs first)"
            raise GnncError(f"pass '{info.name}' requires that {fact.description}, which does not hold"
                            f"{ran}: {fact.established_by}")


_frozen = {"depth": 0}  # run_pipeline calls under way that froze the collector's older objects (outermost does)


def run_pipeline(program: Program, pipeline: list[str] | list[PassSpec], ctx: PassContext | None = None,
                 verify_each: bool = False, after: Callable[[str, Program], None] | None = None) -> Program:
    """Run passes in order; `after(name, program)` sees the IR after each.

    The objects alive when it starts (sympy's and numpy's modules, the cost formulas kept across compiles:
    ~500,000 in a compile of the 64-layer GCNII example) are set aside from the cyclic garbage collector while
    the passes run (`gc.freeze`, undone at the end): a full collection the passes' allocations trigger scans
    only what the passes made, where it scanned all of them (~0.25 CPU-s each, about one compile in three of
    that example on Cora x4). Cycles among the older objects are collected after, as before."""
    outermost = _frozen["depth"] == 0
    if outermost:
        gc.freeze()
    _frozen["depth"] += 1
    try:
        return _run_pipeline(program, pipeline, ctx, verify_each, after)
    finally:
        _frozen["depth"] -= 1
        if outermost:
            gc.unfreeze()


def _run_pipeline(program: Program, pipeline: list[str] | list[PassSpec], ctx: PassContext | None,
                  verify_each: bool, after: Callable[[str, Program], None] | None) -> Program:
    ctx = ctx or PassContext()
    done: list[str] = []
    checked: dict[int, Any] = {}  # equations whose type rules verify re-ran already (they are immutable)
    verified: tuple[Program, bool] | None = None  # the last program verified, and whether typed
    if verify_each:
        verify(program)
        verified = (program, False)
    for spec in map(as_spec, pipeline):
        info = _info(spec.name)
        if info is None:
            raise GnncError(f"unknown pass '{spec.name}' (known: {', '.join(sorted(passes()))})")
        _check_requires(info, program, ctx, done)
        before = program
        program = info.fn(program, ctx) if info.options is None else info.fn(program, ctx, spec.options)
        if program is not before:
            ctx.analyses.keep_only(info.preserves)
        done.append(spec.name)
        # a pass that returned the program it was given (an analysis) leaves it as verified (it is immutable)
        if verify_each and not (verified is not None and verified[0] is program
                                and (verified[1] or not info.typed_after)):
            try:
                verify(program, typed=info.typed_after, checked=checked)
            except VerifyError as err:
                raise VerifyError(f"after pass '{spec.name}' (ran: {', '.join(done)}): {err.message}") from None
            verified = (program, info.typed_after)
        if after is not None:
            after(spec.name, program)
    return program
