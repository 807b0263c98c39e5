"""torch.optim's SGD, Adam and AdamW as training takes them: the same classes without their torch._dynamo wrappers.

torch.optim wraps Optimizer's add_param_group (which __init__ calls), zero_grad, state_dict and load_state_dict in
`torch._disable_dynamo`, and each optimizer's step in `_use_grad_for_differentiable`; both import torch._dynamo
(and sympy with it) on their first call: 1.4-1.7 CPU-s that every training process paid at start (each rank of a
distributed run, every `gnnc run`, every test that trains). Outside torch.compile, which gnnc never applies to a
step, those wrappers add nothing but that import to the function they wrap: the disabling is a no-op when no frame
is being compiled, and the step wrapper runs the step with autograd set to the optimizer's `differentiable` flag
(False here) between two graph breaks (no-ops when not compiling). So these subclasses call the wrapped functions
themselves (functools.wraps keeps them as `__wrapped__`): updates, state and state_dict are torch.optim's own, bit
for bit (tests/test_optimizers.py compares them; tests/test_optim_startup.py checks that a run imports no dynamo).
Step hooks, the profiler's names and the LR schedulers see the classes as torch's: they are subclasses, named alike.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

import torch
import torch.optim
from torch.optim import Optimizer

O = TypeVar("O", bound=Optimizer)

# Optimizer's own methods behind torch._disable_dynamo, undecorated; a torch whose method carries no wrapper
# keeps its own (still right, only the import is paid)
_UNDISABLED = {name: getattr(getattr(Optimizer, name), "__wrapped__", getattr(Optimizer, name))
               for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict")}


def _eager_step(base: type[Optimizer]) -> Callable[..., Any]:
    # inspect.unwrap: the class's step may already carry the profiler hook torch adds on the first instance
    step = inspect.unwrap(base.step)

    def eager_step(self: Optimizer, closure: Callable[[], float] | None = None) -> float | None:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, closure)

    eager_step.__doc__ = step.__doc__
    return eager_step


def _eager(base: type[O]) -> type[O]:
    return type(base.__name__, (base,), {**_UNDISABLED, "step": _eager_step(base), "__module__": __name__,
                                          "__qualname__": base.__name__, "__doc__": base.__doc__})


# named as torch names them, so that pickle finds them here
SGD = _eager(torch.optim.SGD)
Adam = _eager(torch.optim.Adam)
AdamW = _eager(torch.optim.AdamW)
