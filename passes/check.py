"""check: the rules a typed program must follow beyond its types.

A scatter statement yields one message per edge (an edge value); transform,
sync and apply statements yield vertex values; a graph layer's output is a
vertex value with one feature dim, so layers compose; a layer whose
definition declares a parameter `in` is called with the width of its input
there (`GCNConv(64, classes)(h)` with a 32-wide `h` is reported at the call).
Statement results are
the equations whose outputs carry the statement's name (temporaries have `~`).
`infer-shapes` applies the same rules as it types each statement, so the
user hears of the first broken one; this pass checks a whole typed program
(one built by hand, say).
"""
from __future__ import annotations

from typing import Any

import sympy

from gnnc.errors import GnncTypeError
from gnnc.ir import Eqn, Layer, Program
from gnnc.ir.core import fmt_dim
from gnnc.ir.expr import as_expr
from gnnc.ir.ops import fmt_shape
from gnnc.passes.manager import PassContext, register_pass

_STATEMENT_DOMAIN = {"scatter": "edge", "transform": "vertex", "sync": "vertex", "apply": "vertex"}


def check_statement(e: Eqn) -> None:
    """The result of a statement has the domain its primitive promises."""
    out = e.outs[0]
    want = _STATEMENT_DOMAIN.get(e.prim)
    if want is None or "~" in out.name or "^" in out.name or out.type is None:
        return
    if out.type.domain != want:
        if e.prim == "scatter":
            msg = ("a scatter statement must produce an edge value (one message per edge); "
                   "read vertex values through src.X or dst.X")
        else:
            msg = f"a {e.prim} statement must produce a vertex value, got a {out.type.domain} value"
        raise GnncTypeError(msg, e.loc)


def check_layer_output(layer: Layer) -> None:
    """A graph layer outputs one vertex value with one feature dim."""
    if layer.kind != "graph" or not layer.outputs:
        return
    out = layer.outputs[0]
    if out.type is not None and (out.type.domain != "vertex" or len(out.type.shape) != 1):
        loc = next((e.loc for e in layer.eqns if out in e.outs), layer.loc)
        raise GnncTypeError(f"layer '{layer.op}' must output a vertex value with one feature dim, "
                            f"got {out.type.domain} {fmt_shape(out.type.shape)}; "
                            f"use concat(...) or mean_heads(...) over heads", loc)


def check_declared_input(layer: Layer, config: dict[str, Any]) -> None:
    """A graph layer's declared `in` is its input's width, when both are known to differ it is an error."""
    declared = dict(layer.args).get("in")
    if layer.kind != "graph" or declared is None or isinstance(declared, bool) or not layer.inputs:
        return
    x = layer.inputs[0].type
    if x is None or x.domain != "vertex" or len(x.shape) != 1:
        return
    width = x.shape[0]
    values = {sympy.Symbol(k): v for k, v in config.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    gap = (as_expr(declared) - width).subs(values)
    if gap.is_number and gap != 0:
        raise GnncTypeError(f"layer '{layer.op}' is called with in = {_shown(declared, values)} but its input is "
                            f"{_shown(width, values)} wide", layer.loc)


def _shown(d: Any, values: dict) -> str:
    """A dim as written, with its value when the configuration gives one: `hidden (16)`."""
    text = fmt_dim(as_expr(d))
    value = as_expr(d).subs(values)
    return text if not value.is_number or fmt_dim(value) == text else f"{text} ({fmt_dim(value)})"


@register_pass("check", "check statement domains, layer outputs and declared input widths (no rewrite)")
def check(program: Program, ctx: PassContext) -> Program:
    config = program.config_dict()
    for layer in program.layers:
        if layer.kind == "graph":
            for e in layer.eqns:
                check_statement(e)
        check_layer_output(layer)
        check_declared_input(layer, config)
    return program
