"""select-hybrid: decide, per worker and layer, which remote dependencies a Hybrid segment caches.

A `hybrid` segment (NeutronStar) communicates some remote dependencies and
recomputes the others from a replicated subtree. Which ones is
NeutronStar's Algorithm 4 (gnnc.passes.hybrid_greedy), run on the
partition's statistics with unit costs from the cost model and the cluster
profile (gnnc.passes.cost_model.hybrid_unit_costs); the caches of a worker
share its memory (`memory_per_worker`). The selection is data, not IR: it
goes to `ctx.options["hybrid_cached"]` ({layer: [global ids per worker]}),
where predict-bytes and the plan's shards read it, and its prediction to
`ctx.options["hybrid_selection"]`. The segment starts at the first graph
layer (see gnnc.runtime.partitioned), so its input is static and caching a
layer-0 dependency only replicates its input row.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnc.ir import Program
from gnnc.pass_manager import PassContext, register_pass


def hybrid_segment(program: Program) -> int:
    """Number of leading graph layers that run `hybrid` (0 when none)."""
    k = 0
    for layer in program.graph_layers():
        if layer.attr("strategy") != "hybrid":
            break
        k += 1
    return k


def select(program: Program, graph, parts: np.ndarray, profile, end: int) -> tuple[Any, dict[int, list[np.ndarray]]]:
    """Algorithm 4 over graph layers [0, end): the HybridResult and the cached ids per layer and worker."""
    from gnnc.passes import cost_model as cm
    from gnnc.passes import hybrid_greedy as hg
    from gnnc.passes.choose_strategy import layer_dims, layer_shape
    from gnnc.passes.graph_stats import compute_stats
    from gnnc.passes.predict_bytes import param_dependent

    layers = program.graph_layers()
    world = int(parts.max()) + 1
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers[:end]) else "plain"
    stats = compute_stats(graph, parts, max(end, 1), view)
    dims, heads = layer_dims(program)
    inputs = cm.CostInputs.from_stats(stats, dims, profile.for_workers(world), heads=heads)
    needs_grad = param_dependent(program)
    shapes = [layer_shape(layer, needs_grad) for layer in layers[:end]]
    unit = cm.hybrid_unit_costs(inputs, 0, shapes)
    costs = hg.UnitCosts(unit["t_v"], unit["t_e"], unit["t_c"], unit["t_x"], unit["row_bytes"], unit["edge_bytes"])
    deps = [hg.dependencies_from_stats(stats, r, end) for r in range(world)]
    cap = profile.memory_per_worker if profile.memory_per_worker else float("inf")
    result = hg.choose(deps, costs, unit["own_time"], memory_cap=cap)
    cached: dict[int, list[np.ndarray]] = {}
    for m in range(end):
        cached[m] = [np.sort(np.asarray(dep.vertex)[np.asarray(mask) & (np.asarray(dep.layer) == m)]).astype(np.int64)
                     for dep, mask in zip(deps, result.cached)]
    return result, cached


def _check_given(cached: Any, end: int, world: int, n: int) -> None:
    from gnnc.errors import GnncError

    if not isinstance(cached, dict) or any(not 0 <= int(m) < end for m in cached):
        raise GnncError(f"hybrid_cached: expected {{layer: [ids per worker]}} for graph layers 0..{end - 1}")
    for m, per_worker in cached.items():
        if len(per_worker) != world:
            raise GnncError(f"hybrid_cached[{m}]: {len(per_worker)} workers' selections for {world} workers")
        for ids in per_worker:
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                raise GnncError(f"hybrid_cached[{m}]: a vertex id outside 0..{n - 1}")


@register_pass("select-hybrid", "choose the dependencies a hybrid segment caches (NeutronStar's Algorithm 4)")
def select_hybrid(program: Program, ctx: PassContext) -> Program:
    end = hybrid_segment(program)
    parts = ctx.options.get("parts")
    if end == 0 or parts is None or ctx.graph is None:
        return program
    if "hybrid_cached" in ctx.options:  # a selection given by the caller (gnnc.compile(hybrid_cached=...))
        _check_given(ctx.options["hybrid_cached"], end, int(ctx.options.get("workers", 1)), ctx.graph.num_nodes)
        return program
    from gnnc.cluster import load_cluster, preset

    spec = ctx.options.get("cluster")
    profile = (load_cluster(spec) if isinstance(spec, str) else spec) if spec else preset("neutronstar-ecs")
    result, cached = select(program, ctx.graph, parts, profile, end)
    ctx.options["hybrid_cached"] = cached
    ctx.options["hybrid_selection"] = {
        "source": result.source, "predicted_time_s": result.time,
        "cached_per_layer": [[int(len(ids)) for ids in cached[m]] for m in range(end)],
        "communicated_per_layer": [[int(x) for x in result.comm_received[:, m]] for m in range(end)],
    }
    return program
