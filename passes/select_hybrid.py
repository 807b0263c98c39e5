"""select-hybrid: decide, per worker and layer, which remote dependencies a Hybrid segment caches.

A `hybrid` segment (NeutronStar) communicates some remote dependencies and
recomputes the others from a replicated subtree. Which ones is
NeutronStar's Algorithm 4 (gnnc.passes.hybrid_greedy), run on the
partition's statistics with unit costs from the cost model and the cluster
profile (gnnc.passes.cost.neutronstar.hybrid_unit_costs); the caches of a worker
share its memory (`memory_per_worker`). Algorithm 4 decides worker by worker
and layer by layer, so its selection can predict more than fetching
everything or caching everything: `select` prices all three as the runtime
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

from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.passes import hybrid_greedy as hg
from gnnc.passes.choose_strategy import PlanningInputs # reason: a cycle; choose-strategy prices with select()
from gnnc.passes.cost.evaluation import compile_cost
from gnnc.passes.cost.neutronstar import hybrid_unit_costs, hybrid_values
from gnnc.passes.cost.registry import planner_cost, segment_cost
from gnnc.passes.manager import PassContext, register_pass
from gnnc.plan.rows import layer_specs, segments


def hybrid_segments(program: Program) -> list[tuple[int, int]]:
    """(start, end) of every hybrid segment, from the layers' `segment` attributes (assign-strategy)."""
    specs = layer_specs(program)
    return [(a, b) for a, b in segments(specs) if specs[a].strategy == "hybrid"]


@dataclass
class Selection:
    """A hybrid segment's selection: the cached ids per layer and worker, and its predicted cost."""

    cached: dict[int, list[np.ndarray]]
    source: str  # "greedy" (Algorithm 4), "communicate-all" or "cache-all"
    values: dict[Any, np.ndarray] | None  # the hybrid formula's symbols (cost.neutronstar.hybrid_values); None
    # when the formula that priced it needs none (cache-all, priced as depcache)
    time: float
    received: np.ndarray  # [workers, layers] rows communicated
    value: Any = None  # the formula's cost.evaluation.CostValue with this selection
    formula: Any = None  # the Cost that priced it: the hybrid formula, or depcache's for cache-all


def select(stats, inputs, shapes, memory_cap: float | None, start: int, end: int, formula=None) -> Selection:
    """Algorithm 4 over graph layers [start, end), unless communicating or caching everything predicts less.

    Each candidate is priced as the runtime will execute it, so the segment
    the planner prices is the one that runs: Algorithm 4's selection and
    communicate-all (exactly depcomm there) by the planner's own
    `cost.neutronstar.hybrid` formula; cache-all by DepCache's formula,
    because caching every dependency gives each worker DepCache's rows (the
    nested L-hop neighbourhood, gnnc.plan.rows) and an empty halo, and the
    hybrid formula's per-dependency subtrees count a row shared by two
    subtrees twice (an upper bound fit for Algorithm 4's choices, not for
    pricing). Hence a Hybrid segment never predicts more than DepComm, nor
    than DepCache where DepCache fits `memory_cap` (issue 16). Ties keep the
    greedy's. `formula`: the hybrid formula when the caller has built it already.
    """
    world = inputs.workers
    unit = hybrid_unit_costs(inputs, start, shapes[start:end])
    costs = hg.UnitCosts(unit["t_v"], unit["t_e"], unit["t_c"], unit["t_x"], unit["row_bytes"], unit["edge_bytes"])
    deps = [hg.dependencies_from_stats(stats, r, end - start) for r in range(world)]
    cap = memory_cap if memory_cap else float("inf")
    if formula is None:
        formula = segment_cost("hybrid", start, end, shapes[start:end])
    priced = compile_cost(formula)
    candidates = [hg.select(deps, costs, unit["own_time"], cap),
                  hg.predict(deps, costs, unit["own_time"], [np.zeros(len(d), bool) for d in deps],
                             source="communicate-all"),
                  hg.predict(deps, costs, unit["own_time"], [np.ones(len(d), bool) for d in deps],
                             source="cache-all")]
    cache_all = planner_cost("depcache", start, end, shapes[start:end])
    best: Selection | None = None
    for cand in candidates:
        if cand.source == "cache-all":
            values, cost = None, cache_all
            value = compile_cost(cost)(inputs)
            if value.memory > cap:
                continue  # the DP would refuse the segment: leave the choice to the selections that fit
        else:
            values = hybrid_values(start, cand.comm_received, cand.comm_sent, cand.recompute_rows,
                                   cand.recompute_edges, cand.replicated_inputs)
            cost, value = formula, priced(inputs, values)
        if best is None or value.time < best.time:
            cached = {start + m: [np.sort(np.asarray(dep.vertex)[np.asarray(mask) & (np.asarray(dep.layer) == m)])
                                  .astype(np.int64) for dep, mask in zip(deps, cand.cached)]
                      for m in range(end - start)}
            best = Selection(cached, cand.source, values, value.time, cand.comm_received, value, cost)
    assert best is not None
    return best


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
        sel = select(planned.stats, planned.inputs, planned.shapes, ctx.cluster.memory_per_worker, start, end)
        cached.update(sel.cached)
        values[(start, end)] = sel.values
        report.append({"layers": [start, end], "source": sel.source, "predicted_time_s": sel.time,
                       "cached_per_layer": [[int(len(ids)) for ids in sel.cached[k]] for k in range(start, end)],
                       "communicated_per_layer": [[int(x) for x in sel.received[:, m]] for m in range(end - start)]})
    ctx.results.hybrid_cached = cached
    ctx.results.hybrid_selection = report
    ctx.results.hybrid_values = values
    return program
