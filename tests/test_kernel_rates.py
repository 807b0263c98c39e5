"""Kernel rates by width: the probe's table (gnnc.cluster.KernelRate), its interpolation, the per-layer
factors the cost formulas price each dense map and aggregation with, and the fit that reads them."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from conftest import random_graph
from gnnc import api
from gnnc.cluster import KERNELS, ClusterProfile, KernelRate, preset
from gnnc.errors import GnncError
from gnnc.passes.cost.compute import compute_backward, compute_forward, dense_map_time, spmm_time
from gnnc.passes.cost.fit import fit_profile, per_unit_work
from gnnc.passes.cost.symbols import (R_gemm, R_spmm, LayerShape, d, heads, kernel_factor, kernel_factors,
                                      square_factor)


def _grid(rate) -> list[KernelRate]:
    """A dense map's three products at k, n in {8, 64} and the aggregation at widths 8 and 64, with one value
    per edge (k 0) and with 8 heads of per-head values (k 8), rate(kernel, k, n)."""
    out = [KernelRate(kernel, k, n, rate(kernel, k, n)) for kernel in ("gemm_f", "gemm_dw", "gemm_dx")
           for k in (8, 64) for n in (8, 64)]
    return out + [KernelRate(kernel, k, n, rate(kernel, k, n)) for kernel in ("spmm_f", "spmm_b", "spmm_dw")
                  for k in (0, 8) for n in (8, 64)]


def _narrow_is_slow(kernel: str, k: int, n: int) -> float:
    """A made-up machine: a dense map writing 8-wide rows runs at a quarter of the rate (its weight gradient
    at an eighth), an aggregation of 8-wide rows at half; backward aggregations a little slower, the gradient
    of the edge values slower still; with per-head values (k heads) a third of that."""
    if kernel.startswith("gemm"):
        return 80e9 / ((8 if kernel == "gemm_dw" else 4) if n == 8 else 1)
    return {"spmm_f": 8e9, "spmm_b": 6e9, "spmm_dw": 4e9}[kernel] / (2 if n == 8 else 1) / (3 if k else 1)


PROFILE = replace(preset("g3"), kernel_rates=tuple(_grid(_narrow_is_slow)))


def test_the_slowdown_is_the_fastest_rate_of_its_kind_over_the_rate_at_these_widths() -> None:
    p = PROFILE
    assert p.kernel_slowdown("gemm_f", 64, 64) == pytest.approx(1.0)
    assert p.kernel_slowdown("gemm_f", 64, 8) == pytest.approx(4.0)
    assert p.kernel_slowdown("gemm_dw", 64, 8) == pytest.approx(8.0)
    assert p.kernel_slowdown("gemm_dx", 8, 64) == pytest.approx(1.0)
    assert p.kernel_slowdown("spmm_f", 0, 8) == pytest.approx(2.0)
    # the backward aggregation against the fastest forward one: its own rate is slower
    assert p.kernel_slowdown("spmm_b", 0, 64) == pytest.approx(8 / 6)
    # between the widths timed: log-linear (16 is a third of the way from 8 to 64 in log width)
    assert p.kernel_slowdown("gemm_f", 64, 16) == pytest.approx(4.0 ** (2 / 3))
    # beyond them, the edge's rate
    assert p.kernel_slowdown("gemm_f", 1433, 4) == pytest.approx(4.0)
    assert p.kernel_slowdown("spmm_f", 0, 512) == pytest.approx(1.0)
    assert preset("g3").kernel_slowdown("gemm_dw", 64, 8) == 1.0  # no table: one rate for every width
    with pytest.raises(ValueError, match="no kernel"):
        p.kernel_slowdown("conv", 8, 8)


def test_a_table_with_a_missing_corner_takes_the_nearest_shape_timed() -> None:
    p = replace(preset("g3"), kernel_rates=(KernelRate("gemm_f", 8, 8, 10e9), KernelRate("gemm_f", 64, 64, 80e9)))
    assert p.kernel_slowdown("gemm_f", 10, 8) == pytest.approx(8.0)
    assert p.kernel_slowdown("gemm_f", 60, 50) == pytest.approx(1.0)


def test_kernel_rates_round_trip_and_a_bad_entry_is_named() -> None:
    data = json.loads(PROFILE.to_json())
    assert len(data["kernel_rates"]) == 24 and "kernel_rates" not in json.loads(preset("g3").to_json())
    assert ClusterProfile.from_dict(data) == PROFILE
    good = {"kernel": "gemm_f", "k": 8, "n": 8, "rate": 1e9}
    for bad, message in (({**good, "kernel": "conv"}, "'kernel' must be one of"),
                         ({**good, "kernel": "spmm_f", "k": -1}, "'k' must be 0 or a head count for an aggregation"),
                         ({**good, "n": 0}, "'n' must be a positive integer"),
                         ({**good, "rate": -1.0}, "'rate' must be a positive number"),
                         ({**good, "rate": math.inf}, "'rate' must be a positive number"),
                         ({"kernel": "gemm_f", "k": 8}, "must be an object with the fields")):
        with pytest.raises(GnncError, match=f"kernel_rates' entry 0: {message}|kernel_rates' entry 0 {message}"):
            ClusterProfile.from_dict({**data, "kernel_rates": [bad]}, "p.json")
    with pytest.raises(GnncError, match="entry 1: gemm_f at k=8, n=8 is listed twice"):
        ClusterProfile.from_dict({**data, "kernel_rates": [good, good]}, "p.json")


def test_each_kernel_is_priced_at_its_layers_widths() -> None:
    """A 64 -> 8 layer (a model's last, gemm first) on the made-up machine: its forward dense map 4x, its
    weight gradient 8x and its input gradient 4x the FLOP at R_gemm, its aggregation of 8-wide rows 2x
    forward and 8/3x backward; a GAT layer's aggregation runs one head at a time."""
    shape = LayerShape(gemm_first=True, input_grad=True)
    dims, n_heads = (64.0, 8.0), (1.0,)
    values = {d(0): 64, d(1): 8, heads(0): 1, R_gemm: 80e9, R_spmm: 8e9,
              **kernel_factors([shape], dims, n_heads, PROFILE.kernel_slowdown)}
    flop = 2 * 1000 * 64 * 8
    assert float(dense_map_time(0, shape, 1000).subs(values)) == pytest.approx(4 * flop / 80e9)
    assert float(compute_backward(0, shape, 1000, 0).subs(values)) == pytest.approx(
        8 * flop / 80e9 + PROFILE.kernel_slowdown("gemm_dx", 64, 8) * flop / 80e9)
    assert float(spmm_time(0, 5000, 8).subs(values)) == pytest.approx(2 * 5000 * 8 / 8e9)
    assert float(spmm_time(0, 5000, 8, "b").subs(values)) == pytest.approx(5000 * 8 / 6e9 * 2)
    assert float(compute_forward(0, shape, 1000, 5000).subs(values)) == pytest.approx(
        4 * flop / 80e9 + 2 * 5000 * 8 / 8e9)
    gat = LayerShape(gemm_first=True, attention=True, mean_heads=True)
    widths = gat.kernel_widths(1, (64.0, 64.0, 8.0), (8.0, 1.0))
    assert widths["gemm_f"] == (64.0, 8.0) and widths["spmm_f"] == (1.0, 8.0)  # 1 head: timed as k 0
    assert PROFILE.kernel_slowdown("spmm_f", 1.0, 8.0) == pytest.approx(2.0)
    hidden = LayerShape(gemm_first=True, attention=True)  # 8 heads of 8 concatenated: 64 wide, 8 per head
    assert hidden.kernel_widths(0, (64.0, 64.0, 8.0), (8.0, 1.0))["spmm_f"] == (8.0, 8.0)
    assert PROFILE.kernel_slowdown("spmm_f", 4.0, 8.0) == pytest.approx(6.0)  # the head count timed nearest: 8
    # attention's coefficients come from parameters: its aggregation's backward also forms their gradient, a dot
    # per edge and head of 8-wide rows (4e9/2/3 multiply-adds/s here), besides the transpose product (6e9/2/3)
    values.update({d(1): 64, heads(0): 8, **kernel_factors([hidden], (64.0, 64.0), (8.0,), PROFILE.kernel_slowdown)})
    assert float((compute_backward(0, hidden, 0, 5000)).subs(values)) == pytest.approx(
        5000 * 64 / 1e9 + 5000 * 64 / (4e9 / 6))
    assert float((compute_backward(0, replace(hidden, attention=False), 0, 5000)).subs(values)) == pytest.approx(
        5000 * 64 / 1e9)  # edge values without a gradient (GCN's): the transpose product alone
    # a layer the inputs give no shape for is priced at the one rate
    assert kernel_factors([], (64.0, 8.0), (1.0,), PROFILE.kernel_slowdown) == {
        **{kernel_factor(0, k): 1.0 for k in KERNELS}, **{square_factor(0, k): 1.0 for k in KERNELS if k[:4] == "gemm"}}


def test_the_planner_values_every_layers_factors_from_the_profile() -> None:
    from gnnc.passes.cost.inputs import planning_inputs
    import numpy as np

    graph = random_graph(200, 1000, f=64, c=8, seed=0)
    program = api.compile(api.load_model("examples/gcn.gnn", hidden=64), graph).program
    _, inputs, shapes = planning_inputs(program, graph, np.zeros(graph.num_nodes, np.int64), PROFILE, 1)
    table = inputs.table
    assert float(table[kernel_factor(0, "gemm_f")][0]) == pytest.approx(1.0)  # 64 -> 64
    assert float(table[kernel_factor(1, "gemm_f")][0]) == pytest.approx(4.0)  # 64 -> 8
    assert float(table[kernel_factor(1, "spmm_f")][0]) == pytest.approx(2.0)  # aggregates the 8-wide rows
    plain = planning_inputs(program, graph, np.zeros(graph.num_nodes, np.int64), preset("g3"), 1)[1].table
    assert float(plain[kernel_factor(1, "gemm_dw")][0]) == 1.0


def test_the_fit_returns_the_rates_at_the_fastest_widths() -> None:
    """Layer timings made from known rates at the fastest widths, each kernel slowed by the table at the probe's
    widths: the fit, given the table, returns those rates exactly; without it, the slow layer's time is read
    into the one pair."""
    from gnnc.runtime.probe import PROBE_MODEL, PROBE_WIDTHS

    features, hidden, classes = PROBE_WIDTHS
    model = api.load_model_source(PROBE_MODEL, "<probe>", features=features, hidden=hidden, classes=classes)
    program = api.compile(model, random_graph(50, 200, f=features, c=classes, seed=0)).program
    table = _grid(_narrow_is_slow)
    work = per_unit_work(program, kernel_rates=table)
    assert work != per_unit_work(program)  # the probe's last layer (64 -> 16) is slower per FLOP
    t_v, t_e = 2 / 80e9, 1 / 8e9
    samples = [(n, [e, e], [t_v * wv * n + t_e * we * e for wv, we, _ in work])
               for n, e in ((30_000, 150_000), (30_000, 510_000), (90_000, 450_000), (90_000, 990_000))]
    fitted = fit_profile(program, samples, PROBE_WIDTHS, 1e9, kernel_rates=table)
    assert (fitted["t_v"], fitted["t_e"]) == pytest.approx((t_v, t_e), rel=1e-6)
    assert [KernelRate(**r) for r in fitted["kernel_rates"]] == table
    # layers that run 1.5x slower than their kernels alone, plus a fixed cost each: the one factor, in the
    # table's ratio of the two rates
    in_situ = [(n, edges, [1.5 * t + 2e-4 for t in seconds]) for n, edges, seconds in samples]
    slower = fit_profile(program, in_situ, PROBE_WIDTHS, 1e9, kernel_rates=table)
    assert (slower["t_v"], slower["t_e"]) == pytest.approx((1.5 * t_v, 1.5 * t_e), rel=1e-6)
    blind = fit_profile(program, samples, PROBE_WIDTHS, 1e9)
    assert (blind["t_v"], blind["t_e"]) != pytest.approx((t_v, t_e), rel=0.01) and "kernel_rates" not in blind


def test_the_probe_times_every_kernel_at_every_width() -> None:
    from gnnc.runtime.probe import kernel_rate_samples

    rates = [KernelRate(**r) for r in kernel_rate_samples(1, widths=(8, 32), rows=512, graph=(400, 4.0), repeats=1,
                                                          attention=((2, 8),))]
    assert sorted((r.kernel, r.k, r.n) for r in rates) == sorted(
        [(kernel, k, n) for kernel in ("gemm_f", "gemm_dw", "gemm_dx") for k in (8, 32) for n in (8, 32)]
        + [(kernel, k, n) for kernel in ("spmm_f", "spmm_b", "spmm_dw") for k, n in ((0, 8), (0, 32), (2, 8))])
    assert all(math.isfinite(r.rate) and r.rate > 1e5 for r in rates)
    replace(preset("g3"), kernel_rates=tuple(rates))  # a valid profile field
