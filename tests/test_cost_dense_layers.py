"""The dense layers' dense maps priced (issue 36 item 5): a `linear` outside a graph layer (GCNII's input map
features -> hidden before its first graph layer, its classifier after the last) is counted in the IR and charged
on the rows each strategy computes, as the layer's other ops are (sides dense_in, dense_out of `op_time`).

Why: no formula priced them, and DepCache runs the input map on every row of its L-hop neighbourhood: on the
extended grid's 16,000-vertex SBM at 4 workers (GCNII x4, 512 -> 32) that is all 16,000 rows per worker, 4x
DepComm's, and DepCache measured 1.37-1.60x its prediction where DepComm measured 0.97-1.08x
(benchmarks/RESULTS-planner-extended.md, "Session 25 (PRICE)")."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.cluster import KernelRate, preset
from gnnc.passes.cost.evaluation import evaluate
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.ops import program_op_work
from gnnc.passes.cost.registry import segment_cost
from gnnc.passes.cost.symbols import LayerOpWork, hop_vertices, op_time
from gnnc.passes.cost.compute import row_ops

GCNII = EXAMPLES / "gcnii.gnn"


def _gcnii(features: int = 48, hidden: int = 8, layers: int = 2):
    graph = random_graph(120, 600, f=features, c=4, seed=3)
    model = api.load_model(GCNII, layers=layers, hidden=hidden)
    return graph, api.compile(model, graph).program


def test_gcniis_dense_maps_are_counted() -> None:
    """The input map (features -> hidden, reading x: no input gradient) on layer 0's input rows, the classifier
    (hidden -> classes, its input needs a gradient) on the last layer's output rows; the graph layers' own maps
    are their formulas' (not counted here)."""
    _, program = _gcnii()
    first, last = program_op_work(program)
    assert first.dense_maps == (("in", 48.0, 8.0, None, False),)
    assert last.dense_maps == (("out", 8.0, 4.0, None, True),)
    assert program_op_work(program, dense=False)[0].dense_maps == ()  # `gnnc probe`'s layers alone: none


def test_dense_map_seconds_at_the_gemm_rate() -> None:
    """Forward 2·k·n FLOP per row, backward the weight gradient and the input gradient where there is one,
    evaluation at the forward rate; each at the profile's kernel slowdown for those widths."""
    profile = dataclasses.replace(preset("g3"), gemm_rate=1e10, t_v=None, t_v_forward=4e-10)  # forward 5e9
    work = LayerOpWork(dense_maps=(("in", 512.0, 32.0, None, False), ("out", 32.0, 8.0, None, True)))
    flop_in, flop_out = 2 * 512 * 32, 2 * 32 * 8
    assert work.seconds(profile, "dense_in", "f") == pytest.approx(flop_in / 1e10)
    assert work.seconds(profile, "dense_in", "b") == pytest.approx(flop_in / 1e10)  # dW only: x has no gradient
    assert work.seconds(profile, "dense_in", "e") == pytest.approx(flop_in / 5e9)
    assert work.seconds(profile, "dense_out", "b") == pytest.approx(2 * flop_out / 1e10)  # dW and dX
    assert work.seconds(profile, "in", "f") == 0.0  # the other ops' sides are as they were
    slow = dataclasses.replace(profile, kernel_rates=(KernelRate("gemm_f", 512, 32, 1e10),
                                                      KernelRate("gemm_f", 64, 64, 2e10)))
    assert slow.kernel_slowdown("gemm_f", 512, 32) == pytest.approx(2.0)
    assert work.seconds(slow, "dense_in", "f") == pytest.approx(2 * flop_in / 1e10)
    sparse = LayerOpWork(dense_maps=(("in", 1000.0, 16.0, 0.02, False),))  # bag of words: rho·k·n at the SpMM rate
    assert sparse.seconds(profile, "dense_in", "f") == pytest.approx(0.02 * 1000 * 16 / profile.rates_at("fp32")[1])


def test_depcache_pays_the_input_map_on_its_neighbourhood() -> None:
    """DepCache's segment reads h^0 on HV_k rows: the input map runs there (forward, dW, the evaluation's
    forward); DepComm's layer 0 on V. The old model priced neither (the difference below was 0)."""
    graph, program = _gcnii(features=64, hidden=8, layers=2)
    parts = np.arange(graph.num_nodes) % 2
    _, inputs, shapes = planning_inputs(program, graph, parts, preset("g3"), 2)
    per_row = sum(float(inputs.table[op_time(0, "dense_in", p)][0]) for p in "fbe")
    assert per_row > 0
    cache = segment_cost("depcache", 0, 2, shapes)
    without = dataclasses.replace(inputs, op_work=tuple(dataclasses.replace(w, dense_maps=()) for w in inputs.op_work))
    extra = sum(evaluate(s, inputs) - evaluate(s, without) for s in cache.stages)
    hv2 = np.asarray(inputs.table[hop_vertices(2)])
    # layer 1's classifier (8 -> 4) on V rows, forward, backward (dW, dX) and evaluation, beside the input map
    out_per_row = sum(float(inputs.table[op_time(1, "dense_out", p)][0]) for p in "fbe")
    v = np.asarray(inputs.vertices)
    assert extra == pytest.approx(hv2 * per_row + v * out_per_row, rel=1e-9)
    comm = segment_cost("depcomm", 0, 1, shapes[:1])
    extra_comm = sum(evaluate(s, inputs) - evaluate(s, without) for s in comm.stages)
    assert extra_comm == pytest.approx(v * per_row, rel=1e-9)


def test_gnnpipe_prices_its_dense_layers_once() -> None:
    """GNNPipe's stages price the dense layers themselves (DF_s, DB_s): its graph layers' row ops leave them out."""
    assert row_ops(0, 10, 10, "f", dense_maps=False).free_symbols.isdisjoint(
        {op_time(0, "dense_in", "f"), op_time(0, "dense_out", "f")})
    assert op_time(0, "dense_in", "f") in row_ops(0, 10, 10, "f").free_symbols


def test_a_hybrid_pays_the_ops_before_its_aggregation_on_the_rows_it_replicates() -> None:
    """A Hybrid segment's first layer computes its recomputed rows from the RX replicated input rows: the ops
    before its aggregation (GCNII: the dense layer before layer 0, dropout and the 512 -> 32 map of x) run on them,
    whatever rows it recomputes. The old formula charged them on its recomputed output rows RV (0 for a selection
    that replicates only x, the extended grid's gcnii/sbm x4 Hybrid, measured 1.17-1.55x its prediction); later
    layers on the rows recomputed one layer down."""
    import sympy

    from gnnc.passes.cost.neutronstar import hybrid
    from gnnc.passes.cost.symbols import RX, LayerShape, recompute_rows

    shapes = [LayerShape(gemm_first=False, input_grad=False), LayerShape(gemm_first=False)]
    cost = hybrid(0, 2, shapes, overlap=False)  # (overlapped, the recomputation sits inside the halo's Max)
    fwd0 = cost.stages[0]
    share = sympy.diff(fwd0, op_time(0, "dense_in", "f"))  # the rows the dense layer before layer 0 runs on
    assert sympy.simplify(share - (sympy.Symbol("V_i", nonnegative=True) + RX)) == 0
    assert sympy.diff(cost.stages[1], op_time(1, "in", "f")).has(recompute_rows(0))  # layer 1: RV_0's rows
