"""Training precisions: the names `--precision` takes and the element sizes the planner prices.

Why this module exists: a run's precision decides how many bytes each exchanged
activation and gradient carries, so the planner (predict-bytes, the cost model)
and the runtime (autocast, the casts before each exchange) must agree on one
table. It sits in the plan layer, below both.

`fp32` is the default and exact. `bf16` and `fp16` run the dense and sparse
products in 16 bits under autocast, keep fp32 master weights (parameters and
their gradients stay fp32, so the gradient all-reduce carries 4 bytes per
element whatever the precision), and send every exchanged activation and its
gradient in the 16-bit type; `fp16` scales the loss (its range is too small
for raw gradients).
"""
from __future__ import annotations

from gnnc.errors import GnncError

PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_PRECISION = "fp32"
# bytes per element of the values a run computes in and exchanges
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# bytes per element of a parameter gradient (fp32 master weights at every precision)
GRAD_BYTES = 4


def check_precision(name: str) -> str:
    """`name` when it is a known precision, else a GnncError naming the choices."""
    if name not in PRECISIONS:
        raise GnncError(f"unknown precision '{name}' (known: {', '.join(PRECISIONS)})")
    return name


def element_bytes(name: str) -> int:
    """Bytes of one exchanged activation element at precision `name`."""
    return ELEMENT_BYTES[check_precision(name)]
