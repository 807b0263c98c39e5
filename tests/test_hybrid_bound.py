"""A Hybrid segment never predicts more than DepComm or DepCache on the same span (issue 16), DepCache with the
empty halo a Hybrid plan runs when it caches everything (session 25: `depcache(halo=True)`, measured slower than
DepCache).

Hybrid chooses, per dependency, between caching and fetching; its choices include
fetching everything (DepComm's rows) and caching everything (DepCache's rows), so
the planner's price for it must never exceed the cheaper of the two. Seen broken:
`--explain` on Cora x 4 priced hybrid over both layers at 0.610 ms and 12.8 MiB
against depcache's 0.020 ms and 8.6 MiB while it fetched 0 bytes, because every
empty exchange paid (P-1) message start-ups and caching everything was priced by
per-dependency subtrees that count shared rows twice.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.cluster import preset
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.registry import segment_cost
from gnnc.passes.planner.hybrid import select

MODELS = ("gcn", "sage", "gat", "gin")
_PROGRAMS: dict[tuple[str, int, int], object] = {}


def _program(model: str, hidden: int, graph):
    """The lowered program the planner prices (compiled once per model, width and feature count)."""
    key = (model, hidden, graph.num_features)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = api.compile(api.load_model(EXAMPLES / f"{model}.gnn", hidden=hidden), graph).program
    return _PROGRAMS[key]


def _pure_times(inputs, shapes, start: int, end: int) -> tuple[float, float, float]:
    """DepComm over the span (layer by layer), DepCache over it with a Hybrid's empty halo (what caching every
    dependency runs), as the planner prices them (the evaluation pass included): (depcomm time, that time, its
    memory)."""
    comm = sum(evaluate_cost(segment_cost("depcomm", k, k + 1, shapes[k:k + 1]), inputs).time
               for k in range(start, end))
    cache = evaluate_cost(segment_cost("depcache", start, end, shapes[start:end], halo=True), inputs)
    return comm, cache.time, cache.memory


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), model=st.sampled_from(MODELS), workers=st.integers(2, 4),
       n=st.integers(30, 160), degree=st.integers(1, 8), features=st.sampled_from([4, 16, 64, 300]),
       hidden=st.sampled_from([2, 8, 32, 128]), gbit=st.floats(0.1, 100.0),
       latency_us=st.sampled_from([0.0, 5.0, 50.0, 500.0]), cap_mib=st.sampled_from([None, 0.05, 0.5, 8.0]))
def test_hybrid_never_predicts_more_than_depcomm_or_depcache(seed, model, workers, n, degree, features, hidden,
                                                            gbit, latency_us, cap_mib) -> None:
    graph = random_graph(n, n * degree, f=features, seed=seed % 1000)
    parts = np.random.default_rng(seed).integers(0, workers, graph.num_nodes)
    parts[:workers] = np.arange(workers)  # every worker owns a vertex
    cap = 1e15 if cap_mib is None else cap_mib * 2**20
    profile = dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=gbit * 1e9 / 8,
                                  intra_bandwidth=gbit * 1e9 / 8, latency=latency_us * 1e-6, memory_per_worker=cap)
    program = _program(model, hidden, graph)
    stats, inputs, shapes = planning_inputs(program, graph, parts, profile)
    layers = len(shapes)
    for start in range(layers):
        for end in range(start + 1, layers + 1):
            chosen = select(stats, inputs, shapes, cap, start, end, graph=graph, parts=parts)
            comm, cache, cache_memory = _pure_times(inputs, shapes, start, end)
            assert chosen.time <= comm * (1 + 1e-9) + 1e-15, (start, end, chosen.source)
            if cache_memory <= cap:  # DepCache is a choice only where it fits the memory cap
                assert chosen.time <= cache * (1 + 1e-9) + 1e-15, (start, end, chosen.source)


def test_cora_x4_hybrid_costs_no_more_than_depcache() -> None:
    """The case the issue reports: GCN on Cora, 4 workers, the default cluster (50 us per message)."""
    graph = api.load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4,
                       allow=["depcomm", "depcache", "hybrid"])
    costs = {(tuple(c["layers"]), c["strategy"]): c for c in plan.meta.planner.segment_costs}
    hybrid, cache = costs[((0, 2), "hybrid")], costs[((0, 2), "depcache")]
    assert hybrid["bytes"] == 0  # it fetches nothing: it caches every dependency
    assert hybrid["memory_bytes"] <= cache["memory_bytes"]
    # before the fix: 0.610 ms and 12.8 MiB against 0.020 ms and 8.6 MiB (the kernels' and exchanges' price; with
    # every op and the evaluation pass priced since, both are 0.485 ms); since session 25 caching everything pays
    # its empty halo's buffers too (DepCache + halo_buffers: 0.2% here, at the preset's 320 GB/s copies)
    assert cache["time_s"] <= hybrid["time_s"] <= cache["time_s"] * 1.005
    for layer in (0, 1):  # and on one layer, never above the cheaper pure strategy (DepCache: with its halo)
        one = {s: costs[((layer, layer + 1), s)]["time_s"] for s in ("hybrid", "depcomm", "depcache")}
        assert one["hybrid"] <= min(one["depcomm"], one["depcache"] * 1.005) * (1 + 1e-9)
