"""Passes registered by name, and the manager that runs a pipeline of them.

A pass is a function `(Program, PassContext) -> Program`, registered with a
short name and a one-line summary (`gnnc compile --passes a,b --print-after b`
names them). The manager can verify the IR after every pass and, when an
invariant breaks, says which pass broke it and which passes ran before.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir_verify import VerifyError, verify

PassFn = Callable[[Program, "PassContext"], Program]


@dataclass
class PassContext:
    """What passes may consult besides the IR: graph statistics, cluster, options."""

    graph: Any = None  # gnnc.runtime.graph.Graph, when compiling for one
    stats: Any = None  # partition statistics, when planning
    cluster: Any = None  # cluster profile, when planning
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PassInfo:
    name: str
    summary: str
    fn: PassFn
    typed_after: bool  # whether every value has a type once this pass has run


_REGISTRY: dict[str, PassInfo] = {}
# sink-bias after reorder-gemm: reorder-gemm leaves the bias of a moved map as a `bias` op, which it then sinks
DEFAULT_PIPELINE: list[str] = ["infer-shapes", "check", "lower", "reorder-gemm", "sink-bias"]
# after the default pipeline when compiling for several workers
DISTRIBUTED_PIPELINE: list[str] = ["choose-strategy", "assign-strategy", "select-hybrid", "insert-comm",
                                   "predict-bytes"]


def register_pass(name: str, summary: str, typed_after: bool = True) -> Callable[[PassFn], PassFn]:
    """Decorator: make `fn` runnable as pass `name` (names are unique)."""

    def deco(fn: PassFn) -> PassFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"a pass named {name!r} is already registered")
        _REGISTRY[name] = PassInfo(name, summary, fn, typed_after)
        return fn

    return deco


def _load_builtin() -> None:
    # Importing the modules registers their passes.
    from gnnc.passes import (assign_strategy, check, choose_strategy, infer_shapes,  # noqa: F401
                             insert_comm, lower, predict_bytes, reorder_gemm, select_hybrid, sink_bias)


def passes() -> dict[str, PassInfo]:
    _load_builtin()
    return dict(_REGISTRY)


def parse_pipeline(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = passes()
    for n in names:
        if n not in known:
            raise GnncError(f"unknown pass '{n}' (known: {', '.join(sorted(known))})")
    return names


def run_pipeline(program: Program, names: list[str], ctx: PassContext | None = None,
                 verify_each: bool = False, after: Callable[[str, Program], None] | None = None) -> Program:
    """Run passes in order; `after(name, program)` sees the IR after each."""
    ctx = ctx or PassContext()
    known = passes()
    done: list[str] = []
    if verify_each:
        verify(program)
    for name in names:
        info = known[name]
        program = info.fn(program, ctx)
        done.append(name)
        if verify_each:
            try:
                verify(program, typed=info.typed_after)
            except VerifyError as err:
                raise VerifyError(f"after pass '{name}' (ran: {', '.join(done)}): {err.message}") from None
        if after is not None:
            after(name, program)
    return program
