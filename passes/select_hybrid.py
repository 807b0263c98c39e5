"""select-hybrid: decide, per worker and layer, which remote dependencies a Hybrid segment caches.

A `hybrid` segment (NeutronStar) communicates some remote dependencies and
recomputes the others from a replicated subtree. Which ones is
NeutronStar's Algorithm 4 (gnnc.passes.planner.hybrid_greedy), run on the
partition's statistics with unit costs from the cost model and the cluster
profile (gnnc.passes.cost.neutronstar.hybrid_unit_costs); the caches of a worker
share its memory (`memory_per_worker`). Algorithm 4 decides worker by worker
and layer by layer, so its selection can predict more than fetching
everything or caching everything: `select` (gnnc.passes.planner.hybrid) prices all three as the runtime
runs them and keeps the fastest, so a Hybrid segment never costs more than
DepComm, nor than DepCache where it fits. The selection is data, not IR: it
goes to `ctx.results.hybrid_cached` ({layer: [global ids per worker]}),
where predict-bytes and the plan's shards read it, and its prediction to
`ctx.results.hybrid_selection`, one entry per hybrid segment. At layer 0
the input is static, so caching a layer-0 dependency only replicates its
input row; a segment that starts later fetches its cached rows' inputs on
entry (gnnc.plan.rows).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.passes.cost.inputs import PlanningInputs
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.planner.hybrid import select
from gnnc.plan.rows import layer_specs, segments


def hybrid_segments(program: Program) -> list[tuple[int, int]]:
    """(start, end) of every hybrid segment, from the layers' `segment` attributes (assign-strategy)."""
    specs = layer_specs(program)
    return [(a, b) for a, b in segments(specs) if specs[a].strategy == "hybrid"]


def _check_given(cached: Any, layers: list[int], world: int, n: int) -> None:
    if not isinstance(cached, dict) or any(int(m) not in layers for m in cached):
        raise GnncError(f"hybrid_cached: expected {{graph layer: [ids per worker]}} for the hybrid layers {layers}")
    for m, per_worker in cached.items():
        if len(per_worker) != world:
            raise GnncError(f"hybrid_cached[{m}]: {len(per_worker)} workers' selections for {world} workers")
        for ids in per_worker:
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                raise GnncError(f"hybrid_cached[{m}]: a vertex id outside 0..{n - 1}")


@register_pass("select-hybrid", "choose the dependencies a hybrid segment caches (NeutronStar's Algorithm 4)",
               requires=("strategies",))
def select_hybrid(program: Program, ctx: PassContext) -> Program:
    spans = hybrid_segments(program)
    if not spans or ctx.partition is None or ctx.graph is None:
        return program
    hybrid_layers = [k for a, b in spans for k in range(a, b)]
    if ctx.hybrid_cached is not None:  # a selection given by the caller (gnnc.compile(hybrid_cached=...))
        _check_given(ctx.hybrid_cached, hybrid_layers, ctx.workers, ctx.graph.num_nodes)
        ctx.results.hybrid_cached = ctx.hybrid_cached
        return program

    planned = ctx.analyses.get(PlanningInputs, program)
    cached: dict[int, list[np.ndarray]] = {}
    report = []
    values = {}
    for start, end in spans:
        sel = select(planned.stats, planned.inputs, planned.shapes, ctx.cluster.memory_per_worker, start, end,
                     graph=ctx.graph, parts=ctx.parts, processes=ctx.threads)
        cached.update(sel.cached)
        values[(start, end)] = sel.values
        report.append({"layers": [start, end], "source": sel.source, "predicted_time_s": sel.time,
                       "cached_per_layer": [[int(len(ids)) for ids in sel.cached[k]] for k in range(start, end)],
                       "communicated_per_layer": [[int(x) for x in sel.received[:, m]] for m in range(end - start)],
                       **({"mu": [round(float(x), 6) for x in sel.mu]} if sel.mu is not None else {})})
    ctx.results.hybrid_cached = cached
    ctx.results.hybrid_selection = report
    ctx.results.hybrid_values = values
    return program
