"""`--recompute`: a training forward keeps each graph layer's inputs only, and runs the layer again in the backward.

Why: between the passes a layer keeps what its backward reads (its aggregated rows, GAT's z and scores, an
activation's result), a few [vertices, width] tensors per layer. Under torch.utils.checkpoint (use_reentrant=False)
a graph layer, with the dense layers after it (`regions`), keeps nothing but its inputs (which the region before
produced, or the graph's features), and its backward first runs its forward again, keeping for that layer alone what it keeps without recomputation: one layer's
worth at a time instead of every layer's, for one more forward pass per step.

The recomputation computes the same values: dropout's masks are keyed by (seed, epoch, op, global id)
(gnnc.runtime.rng), not by a generator's state, and hoisted values come from the run's cache. Two things a forward
does besides computing are kept from happening twice: an op's running state (batch_norm's statistics) is updated in
the first run only, and a fused chain never writes over one of the layer's inputs (ExecContext.protected), which
its recomputation reads again. One process only: a rank's layers exchange rows with the other ranks.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from gnnc.ir import Layer


def regions(layers: Sequence[Layer]) -> list[tuple[Layer, ...]]:
    """The layers in the runs one checkpoint each takes: a graph layer with the dense layers after it, up to the next
    graph layer (and the first with those before it). A region's input is then what a graph layer's first product
    reads anyway (the previous region's activation and dropout, written over the aggregation as without
    recomputation).

    The first region (the one reading the graph's features) runs once, without a checkpoint (gnnc.runtime.executor's
    forward): its backward is the step's last, and run again there its forward holds its product and its aggregation
    beside its output's gradient, three [vertices, width] tensors where its backward without recomputation holds
    two (that gradient and its input's); what it keeps besides its output, which the next region keeps anyway as
    its input, is one layer's worth. Measured on the products-sized R-MAT at 0.05 (GCN, hidden 256): recomputing it
    raised the step's peak by one [vertices, 256] tensor above the run without --recompute (issue 35)."""
    out: list[tuple[Layer, ...]] = []
    current: list[Layer] = []
    for layer in layers:
        if layer.kind == "graph" and any(x.kind == "graph" for x in current):
            out.append(tuple(current))
            current = []
        current.append(layer)
    return out + [tuple(current)] if current else out


def run_recomputed(interp: Any, layers: tuple[Layer, ...], env: dict[str, torch.Tensor],
                   params: dict[str, torch.Tensor], ctx: Any) -> None:
    """`interp.run_layer` of each of `layers` under one checkpoint: the same values into `env`, the same values
    forgotten after (`interp.drop_dead`)."""
    eqns = [(layer, k, e) for layer in layers for k, e in enumerate(layer.eqns)]
    inside = {e.outs[0].name for _, _, e in eqns}
    names = list(dict.fromkeys(v.name for _, _, e in eqns for v in e.ins if v.name not in inside and v.name in env))
    dying = {n for layer, k, _ in eqns for n in interp._dying.get((layer.name, k), ())}
    outs = [e.outs[0].name for _, _, e in eqns if e.outs[0].name not in dying]
    runs = [0]

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        local = dict(zip(names, tensors))
        first = runs[0] == 0
        runs[0] += 1
        # the recomputation leaves the running state alone (updated once, by the first run) and, as the first
        # run, every input as it found it
        run_ctx = dataclasses.replace(ctx, protected=tuple(t for t in tensors if isinstance(t, torch.Tensor)
                                                           and t.layout == torch.strided),
                                      **({} if first else {"state": None}))
        for layer in layers:
            interp.run_layer(layer, local, params, run_ctx)
        return tuple(local[n] for n in outs)

    results = checkpoint(run, *(env[n] for n in names), use_reentrant=False)
    env.update(zip(outs, results))
    for layer in layers:
        interp.drop_dead(env, layer)
