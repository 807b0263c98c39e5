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

Exchanges (the communication ops gnnc.plan.comm_ops describes) register
beside the ops, with `@implements_exchange("halo")`: the worker that runs a plan binds
them to its rank (`ctx.comm`, gnnc.runtime.distributed.Exchange) and the
interpreter runs every exchange equation through that binding. Besides the
exchange itself (role "run": `fn(binding, x, eqn)`), an exchange that can
deliver its rows in parts (its descriptor's split_flag) registers how to post
them ("parts": `fn(binding, x, eqn) -> PartStream`) and where each part's
source rows start ("bounds": `fn(layer_graph, block_rows) -> offsets`).
GNNPipe's worker calls its `history` exchange with its own arguments, for a
chunk ("run") and for every chunk at once ("refresh").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from gnnc.errors import GnncError
from gnnc.ir import Eqn
from gnnc.ir.ops import op_def
from gnnc.plan.comm_ops import comm_op

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
    impl = impl or IMPLEMENTATIONS.get((op, "reference")) or (_EXCHANGE if op_def(op).comm else None)
    if impl is None:
        raise GnncError(f"the runtime has no implementation of op '{op}'")
    return impl


EXCHANGE_ROLES = ("run", "parts", "bounds", "refresh")
EXCHANGES: dict[tuple[str, str], Callable[..., Any]] = {}


def implements_exchange(op: str, role: str = "run") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as exchange `op`'s implementation of `role` (module docstring)."""
    if role not in EXCHANGE_ROLES:
        raise ValueError(f"unknown exchange role {role!r} (known: {', '.join(EXCHANGE_ROLES)})")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        comm_op(op)  # an exchange gnnc.plan.comm_ops does not describe is a typo
        if (op, role) in EXCHANGES:
            raise ValueError(f"exchange '{op}' already has a {role} implementation")
        EXCHANGES[(op, role)] = fn
        return fn

    return register


def exchange_implementation(op: str, role: str = "run") -> Callable[..., Any]:
    """How this runtime runs exchange `op` in `role`."""
    fn = EXCHANGES.get((op, role))
    if fn is None:
        raise GnncError(f"the runtime has no {role} implementation of exchange '{op}'")
    return fn


def _exchange(e: Eqn, ins: list[torch.Tensor], view: Any, ctx: Any) -> torch.Tensor:
    """Every exchange equation, as the interpreter runs it: through the rank's binding of the exchanges."""
    if ctx.comm is None:
        raise GnncError(f"op '{e.op}' needs the distributed runtime (gnnc run --nproc N)")
    return ctx.comm.exchange(e.op, ins[0], e)


_EXCHANGE = Implementation(_exchange, sparse_input=False)
