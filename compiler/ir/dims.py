"""Values of symbolic dims and numbers under a program's configuration.

Dims are sympy expressions (`hidden`, `heads*out`); the passes (sizes in the
cost model, predicted bytes) and the runtime (tensor shapes) both need their
values once the configuration binds every symbol, so this lives with the IR.
"""
from __future__ import annotations

from typing import Any

import sympy

from gnnc.errors import GnncError


def eval_dim(d: Any, config: dict[str, Any]) -> int:
    """A symbolic dim's value under the program's configuration."""
    expr = sympy.sympify(d)
    subs = {sympy.Symbol(k): v for k, v in config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    val = expr.subs(subs)
    if val.free_symbols:
        names = ", ".join(sorted(str(s) for s in val.free_symbols))
        raise GnncError(f"model parameter(s) {names} have no value: give a default or --set NAME=VALUE")
    return int(val)


def eval_number(v: Any, config: dict[str, Any]) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    expr = sympy.sympify(v).subs({sympy.Symbol(k): x for k, x in config.items()
                                  if isinstance(x, (int, float)) and not isinstance(x, bool)})
    return float(expr)
