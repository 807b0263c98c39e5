"""A user's cost function: price depcomm for a network 100 times slower than the preset says.

Loaded with `--plugin examples/extending/slow_network.py`, it replaces the
planner's depcomm formula; `gnnc compile --explain` names it beside every
alternative that uses it.
"""
from __future__ import annotations

import gnnc
from gnnc.passes.cost.neutronstar import depcomm
from gnnc.passes.cost.symbols import bw, Cost


@gnnc.register_cost("depcomm")
def depcomm_on_a_slow_network(start: int, end: int, shapes):
    base = depcomm(start, shapes[0])
    # communication stages carry the bandwidth symbol: divide it by 100 there
    return Cost(base.name, tuple(s.subs(bw, bw / 100) for s in base.stages), base.bytes, base.memory)
