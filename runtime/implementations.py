"""The runtime's table from op name to the torch code that runs it.

The compiler defines each op once (gnnc.ir.ops); the runtime registers how to
run it here, with `@implements("relu")`. An op may have two variants: the
`reference` one (plain torch over index vectors, always present: the exact
interpreter every strategy is compared with) and a `kernels` one (the graph
kernels of gnnc.runtime.kernels, which choose CPU or CUDA/Triton code for the
tensors' device). The interpreter asks for the kernels variant when its
context says `use_kernels` and falls back to the reference one.

An implementation is called as `fn(eqn, inputs, view, ctx)`: the equation (its
attributes, its output's type), its input tensors in order, the layer's
GraphView (None in dense layers) and the ExecContext.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from gnnc.errors import GnncError
from gnnc.ir import Eqn
from gnnc.ir.ops import op_def

Impl = Callable[[Eqn, list[torch.Tensor], Any, Any], torch.Tensor]
VARIANTS = ("reference", "kernels")


@dataclass(frozen=True)
class Implementation:
    fn: Impl
    sparse_input: bool  # takes sparse COO inputs as they are; otherwise they are densified first


IMPLEMENTATIONS: dict[tuple[str, str], Implementation] = {}


def implements(*ops: str, variant: str = "reference", sparse_input: bool = False) -> Callable[[Impl], Impl]:
    """Register the decorated function as the `variant` implementation of each op named."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown implementation variant {variant!r} (known: {', '.join(VARIANTS)})")

    def register(fn: Impl) -> Impl:
        for op in ops:
            op_def(op)  # an implementation of an op gnnc.ir.ops does not define is a typo
            if (op, variant) in IMPLEMENTATIONS:
                raise ValueError(f"op '{op}' already has a {variant} implementation")
            IMPLEMENTATIONS[(op, variant)] = Implementation(fn, sparse_input)
        return fn

    return register


def implementation(op: str, use_kernels: bool) -> Implementation:
    """The implementation to run `op` with: the kernels variant when asked for and present."""
    impl = IMPLEMENTATIONS.get((op, "kernels")) if use_kernels else None
    impl = impl or IMPLEMENTATIONS.get((op, "reference"))
    if impl is None:
        raise GnncError(f"the runtime has no implementation of op '{op}'")
    return impl
