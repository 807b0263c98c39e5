"""gnnc: a compiler from GNN programs (.gnn) to distributed execution plans.

The Python API mirrors the command line:

    import gnnc
    model = gnnc.load_model("examples/gcn.gnn", hidden=32)
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(model, graph)
    result = gnnc.run(plan, graph, epochs=200)
    profile, path = gnnc.probe()  # measure this machine for the `local` cluster

`compile`, `run` and `probe` are what `gnnc compile`, `gnnc run` and `gnnc probe` call.

`import gnnc` loads nothing heavy: each name below is imported from its
module the first time it is used, so `import gnnc.ir` (or `gnnc check`)
does not pull in the planner, torch.distributed or the runtime.
"""
from __future__ import annotations

import importlib
from typing import Any

from gnnc.host import set_wait_policy

# Before anything imports torch, whose OpenMP runtime reads its wait policy once as it loads (gnnc.host).
set_wait_policy()

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Model", "Plan", "check", "compile", "load_graph", "load_model", "load_model_source", "partition",
                     "probe", "run", "to_torch"), "gnnc.api"),
    "elaborate": "gnnc.frontend.elaborate",
    "GnncError": "gnnc.errors",
    "register_pass": "gnnc.passes.manager",
    "parse_ir": "gnnc.ir.text",
    "register_cost": "gnnc.passes.cost.registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gnnc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
