"""hoist: mark the computations of the graph's inputs that no parameter and no dropout touch, computed once.

SGC's K propagations of the input features (`A^K x`), GIN's first
aggregation of `x` and any other computation that reads only the graph's
inputs (`x`, the labels and masks, edge data, constants) through ops whose
result does not change between steps (not dropout, not batch_norm: the
`varies_per_step` trait) gives the same value in every epoch. This pass marks
each such equation `hoisted=true`; the runtime computes a marked equation in
the first forward pass of a run and serves it from a per-run cache after
that (gnnc.runtime.executor keeps the values a later step reads, nothing
more). The result is exact: the same logits and gradients as without it, as
nothing that needs a gradient flows through a marked value.

Communication ops among them (the halo of `x` that GIN's first aggregation
reads) are marked too: a distributed run's every rank computes the same
marked equations on its own rows in the same first step, so their
collectives match, and each rank caches its rows of the results. That makes
hoisting exact for every strategy, and later steps send none of those bytes
(predict-bytes leaves them out of a step's total).

Equations without inputs (constants, edge data) are not marked: they cost
nothing to recompute. The pass is idempotent and recomputes the marks from
scratch, so it runs again after insert-comm to mark the exchanges that pass
inserted.
"""
from __future__ import annotations

import operator

from gnnc.ir import Eqn, Program
from gnnc.ir.ops import op_def
from gnnc.passes.manager import PassContext, register_pass

ATTR = "hoisted"


def _without_mark(e: Eqn) -> Eqn:
    if e.attr(ATTR) is None:
        return e
    return e.replace(attrs=tuple((k, v) for k, v in e.attrs if k != ATTR))


@register_pass("hoist", "mark parameter-free, dropout-free computations of the graph's inputs: computed once per run",
               requires=("typed",))
def hoist(program: Program, ctx: PassContext) -> Program:
    static = {v.name for v in program.inputs}  # values that are the same in every step
    layers = []
    for layer in program.layers:
        eqns = []
        for given in layer.eqns:
            e = _without_mark(given)
            inputs_static = all(v.name in static for v in e.ins)
            if inputs_static and not op_def(e.op).varies_per_step:
                static.update(o.name for o in e.outs)
                if e.ins:  # a constant or edge data alone is not worth a cache entry
                    e = e.with_attrs(**{ATTR: True})
            # an equation marked as it was is kept, and so is a layer of such, and a program of such (the pass
            # runs twice in a compile: records equal to the given ones made the IR verified again for nothing)
            eqns.append(given if e is given or e == given else e)
        kept = all(map(operator.is_, eqns, layer.eqns))
        layers.append(layer if kept else layer.replace(eqns=tuple(eqns)))
    if all(map(operator.is_, layers, program.layers)):
        return program
    return program.replace(layers=tuple(layers))
