"""Values of symbolic dims and numbers under a program's configuration.

Dims are sympy expressions (`hidden`, `heads*out`); the passes (sizes in the
cost model, predicted bytes) and the runtime (tensor shapes) both need their
values once the configuration binds every symbol, so this lives with the IR.
A dim or number given as text is read by `gnnc.ir.expr`, never evaluated.
"""
from __future__ import annotations

from typing import Any

import sympy

from gnnc.errors import GnncError
from gnnc.ir.core import dim
from gnnc.ir.expr import parse_expr


def eval_dim(d: Any, config: dict[str, Any]) -> int:
    """A symbolic dim's value under the program's configuration."""
    expr = dim(d)
    # a number or one bound name (nearly every dim) without sympy's subs, which the planner's and the
    # schedule's pricing called thousands of times on a deep model
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        bound = config.get(expr.name)
        if isinstance(bound, int) and not isinstance(bound, bool):
            return bound
    val = expr.subs(_bound(config))
    if val.free_symbols:
        names = ", ".join(sorted(str(s) for s in val.free_symbols))
        raise GnncError(f"model parameter(s) {names} have no value: give a default or --set NAME=VALUE")
    return int(val)


def eval_number(v: Any, config: dict[str, Any]) -> float:
    """A number attribute's value (`dropout[p=...]`, `const[value=...]`) under the configuration."""
    if isinstance(v, (int, float)):
        return float(v)
    expr = parse_expr(v, "number") if isinstance(v, str) else v
    return float(expr.subs(_bound(config)))


def _bound(config: dict[str, Any]) -> dict[sympy.Symbol, int | float]:
    """The configuration's numeric values by symbol (booleans and unbound names left out)."""
    return {sympy.Symbol(k): v for k, v in config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
