"""Pricing a hybrid segment: NeutronStar's Algorithm 4, communicate-all or cache-all, whichever predicts less.

Why this module exists: choose-strategy prices a `hybrid` segment with the
selection select-hybrid will make, and select-hybrid makes it; both call
`select` here, which runs Algorithm 4 (gnnc.passes.planner.hybrid_greedy) on
the partition's statistics with unit costs from the cost model
(gnnc.passes.cost.neutronstar.hybrid_unit_costs) and keeps the cheapest of its
selection, fetching everything and caching everything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.passes.cost.evaluation import compile_cost
from gnnc.passes.cost.neutronstar import hybrid_unit_costs, hybrid_values
from gnnc.passes.cost.registry import planner_cost, segment_cost
from gnnc.passes.planner import hybrid_greedy as hg


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


def select(stats, inputs, shapes, memory_cap: float | None, start: int, end: int, formula=None,
           cache_all_value=None) -> Selection:
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
    greedy's. `formula`: the hybrid formula when the caller has built it already; `cache_all_value`: DepCache's
    value on [start, end) when the caller has priced it already (the planner prices each segment once).
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
            value = cache_all_value if cache_all_value is not None else compile_cost(cost)(inputs)
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
