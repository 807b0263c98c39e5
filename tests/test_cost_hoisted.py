"""The cost model prices what a run does per epoch on models outside the validation grid (issue 36 item 5).

GIN on the emulated cluster was predicted 2.7-3.1x above its measured epoch (bcast1d 9x): its first layer sums the
input features' rows (F wide) before any dense map, and that sum reads only the graph's inputs, so
gnnc.passes.hoist computes it, and exchanges its input, once per run; the formulas charged both every epoch.
And its MLP's second Linear (out x out) was priced as a second d_in x out map.
"""
from __future__ import annotations

import sympy

import gnnc
from conftest import EXAMPLES, random_graph
from gnnc.passes.cost import compute, registry
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.symbols import R_gemm, R_spmm, V, alpha, bw, d, kernel_factor, square_factor
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE


def _gin_shapes():
    graph = random_graph(n=200, e=1200, f=64, c=4)
    model = gnnc.load_model(EXAMPLES / "gin.gnn", hidden=16)
    plan = gnnc.compile(model, graph, workers=2, strategy="depcomm",
                        passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:DISTRIBUTED_PIPELINE.index("insert-comm")])
    _, _, shapes = planning_inputs(plan.program, graph, plan.parts, gnnc.api.resolve_cluster(None))
    return shapes


def test_a_hoisted_aggregation_and_its_exchange_cost_nothing_per_epoch() -> None:
    first, second = _gin_shapes()
    assert first.hoisted and not second.hoisted  # layer 0 sums x; layer 1 sums the previous layer's output
    for strategy in ("depcomm", "bcast1d"):
        cost = registry.segment_cost(strategy, 0, 1, [first])
        symbols = cost.free_symbols
        assert R_spmm not in symbols and bw not in symbols and alpha not in symbols, (strategy, cost.describe())
        assert cost.bytes == 0
        later = registry.segment_cost(strategy, 1, 2, [second])
        assert {R_spmm, bw} <= later.free_symbols  # the second layer's sum and exchange run every epoch
    assert registry.segment_cost("hybrid", 0, 1, [first]).bytes == 0


def test_an_mlps_later_dense_maps_read_the_output_width() -> None:
    _, second = _gin_shapes()  # linear(hidden -> classes), relu, linear(classes -> classes)
    assert second.gemms == 2 and second.square_gemms == 1
    # the later map at its own shape's slowdown (square_factor: classes x classes), the first at the layer's
    want = (2 * V * d(1) * d(2) / R_gemm * kernel_factor(1, "gemm_f")
            + 2 * V * d(2) * d(2) / R_gemm * square_factor(1, "gemm_f"))
    assert sympy.expand(compute.dense_map_time(1, second, V) - want) == 0
