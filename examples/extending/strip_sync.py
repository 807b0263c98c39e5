"""A user-written pass: drop `sync` equations on a single worker.

On one worker a `sync` reduces nothing, so `strip-sync` replaces every use
of a sync's result with its input and deletes the equation. Load it with
`gnnc compile MODEL.gnn --plugin examples/extending/strip_sync.py --passes
infer-shapes,check,strip-sync --print-after strip-sync`, or by importing
this module in Python.
"""
from __future__ import annotations

import gnnc
from gnnc.ir import Program, Value


def _rename(v: Value, subst: dict[str, Value]) -> Value:
    return subst.get(v.name, v)


@gnnc.register_pass("strip-sync", "remove sync equations (a no-op on one worker)")
def strip_sync(program: Program, ctx) -> Program:
    if ctx.workers != 1:
        return program  # with several workers a sync is real communication
    subst: dict[str, Value] = {}
    layers = []
    for layer in program.layers:
        eqns = []
        for e in layer.eqns:
            e = e.replace(ins=tuple(_rename(v, subst) for v in e.ins))
            if e.op == "sync":
                subst[e.outs[0].name] = e.ins[0]
                continue
            eqns.append(e)
        layers.append(layer.replace(eqns=tuple(eqns),
                                    inputs=tuple(_rename(v, subst) for v in layer.inputs),
                                    outputs=tuple(_rename(v, subst) for v in layer.outputs)))
    return program.replace(layers=tuple(layers), logits=_rename(program.logits, subst),
                           loss=_rename(program.loss, subst))
