"""Issue 36 item 5 (session 26): two prices found wrong by measuring the extended grid's kernels alone.

1. An MLP's later dense maps (`LayerShape.square_gemms`: GIN's second Linear, out x out) were priced at the
   slowdown of the layer's first map (d_in x out): GIN 32 -> 512's 512 x 512 map at the 32 x 512 map's slowdown,
   1.65 on the extended grid's 2-worker profiles, where it ran alone at the table's fastest rate (35 GFLOP/s, one
   thread, 8,000 rows: 34.9/36.2/35.5 forward/dW/dX against 23.8/25.2/24.1 for 32 x 512). And their input
   gradient, which the first map's weight gradient needs, was priced only when the layer's own input has a
   gradient (GIN's first layer reads x: none).
2. Algorithm 4's unit cost of a replicated input row (t_x) was 0 at a segment starting at layer 0, though the
   dense layer before layer 0 (GCNII's dropout of x and its input map) runs on every such row, as the Hybrid
   formula charges it (on RX); its share now moves from the first layer's t_v to t_x.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.cluster import KernelRate, preset
from gnnc.passes.cost.compute import compute_backward, compute_forward, dense_backward_time, dense_map_time, row_ops
from gnnc.passes.cost.evaluation import evaluate
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.neutronstar import hybrid_unit_costs
from gnnc.passes.cost.symbols import R_gemm, LayerShape, d, heads, kernel_factors

# a dense map 32 x 512 at half the rate of 512 x 512 (the fastest): its slowdown 2, the square map's 1
RATES = tuple(KernelRate(kernel, k, n, rate) for kernel in ("gemm_f", "gemm_dw", "gemm_dx")
              for k, n, rate in ((32, 512, 1e10), (512, 512, 2e10), (32, 32, 1e10), (512, 32, 1e10)))
PROFILE = dataclasses.replace(preset("g3"), kernel_rates=RATES)
GIN_FIRST = LayerShape(gemms=2, square_gemms=1, gemm_first=False, input_grad=False)  # GIN(32, 512) reading x


def _values(shape: LayerShape) -> dict:
    dims = (32.0, 512.0)
    return {d(0): 32.0, d(1): 512.0, heads(0): 1.0, R_gemm: 2e10,
            **kernel_factors([shape], dims, (1.0,), PROFILE.kernel_slowdown)}


def test_an_mlps_later_map_is_priced_at_its_own_shape() -> None:
    """Forward: 32 x 512 at slowdown 2, 512 x 512 at 1 (the old price: both at 2)."""
    rows = 1000
    got = float(dense_map_time(0, GIN_FIRST, rows).subs(_values(GIN_FIRST)))
    first, square = 2 * rows * 32 * 512, 2 * rows * 512 * 512
    assert got == pytest.approx(first / 2e10 * 2 + square / 2e10)


def test_an_mlps_later_map_has_an_input_gradient_whatever_the_layers_input() -> None:
    """Backward of GIN's first layer (x has no gradient): both maps' weight gradients, and the square map's
    input gradient (the first map's weight gradient reads it); not the first map's input gradient."""
    rows = 1000
    got = float(dense_backward_time(0, GIN_FIRST, rows).subs(_values(GIN_FIRST)))
    first, square = 2 * rows * 32 * 512, 2 * rows * 512 * 512
    assert got == pytest.approx(first / 2e10 * 2 + square / 2e10 + square / 2e10)
    # a layer whose input has a gradient: every map's input gradient, as before
    later = dataclasses.replace(GIN_FIRST, input_grad=True)
    both = float(dense_backward_time(0, later, rows).subs(_values(later)))
    assert both == pytest.approx(2 * (first / 2e10 * 2 + square / 2e10))


def test_layers_without_later_maps_keep_their_price() -> None:
    """A GCN layer's map: one factor at its widths, as before (the reference plans of GCN, SAGE, GAT, GCNII keep
    their graph layers' kernel prices)."""
    gcn = LayerShape(gemm_first=False)
    values = _values(gcn)
    assert float(compute_forward(0, gcn, 10, 0).subs(values)) == pytest.approx(2 * 10 * 32 * 512 / 2e10 * 2)
    assert float(compute_backward(0, gcn, 10, 0).subs(values)) == pytest.approx(2 * (2 * 10 * 32 * 512 / 2e10 * 2))


def test_a_replicated_input_row_costs_the_work_before_the_first_aggregation() -> None:
    """GCNII (dense input map before layer 0): t_x at a segment from layer 0 is the first layer's work per input
    row (its "in" ops with the dense layer before it, and no map of its own before the aggregation), and the
    first layer's t_v no longer holds it; later layers' t_v and every t_e are unchanged. Old: t_x = 0."""
    graph = random_graph(120, 600, f=48, c=4, seed=3)
    program = api.compile(api.load_model(EXAMPLES / "gcnii.gnn", layers=2, hidden=8), graph).program
    parts = np.arange(graph.num_nodes) % 2
    _, inputs, shapes = planning_inputs(program, graph, parts, preset("g3"), 2)
    unit = hybrid_unit_costs(inputs, 0, shapes)
    in_row = float(np.max(evaluate(row_ops(0, 1, 0, "f") + row_ops(0, 1, 0, "b"), inputs)))
    assert not shapes[0].gemm_first and in_row > 0  # GCNII aggregates first; the 48 -> 8 map and x's dropout
    assert unit["t_x"] == pytest.approx(in_row, rel=1e-12)
    per_row = float(np.max(evaluate(compute_forward(0, shapes[0], 1, 0) + compute_backward(0, shapes[0], 1, 0)
                                    + row_ops(0, 1, 1, "f") + row_ops(0, 1, 1, "b"), inputs)))
    assert unit["t_v"][0] == pytest.approx(per_row - in_row, rel=1e-9)  # the old t_v[0] was per_row
    # a segment after layer 0 pays the fetch of the row besides (and its gradient)
    later = hybrid_unit_costs(inputs, 1, shapes[1:])
    assert later["t_x"] > 0
