"""`gnnc probe` measures this machine and writes a profile the planner can load, NeutronStar's
T_v, T_e, T_c included (fitted to a short test training through gnnc's own executor)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _rank_pool import pooled_launch
from conftest import ROOT
from gnnc.cluster import OP_CLASSES, ClusterProfile, LayerUnitCosts, load_cluster, preset
from gnnc.passes.cost.fit import fit_unit_costs
from gnnc.runtime.probe import PROBE_WIDTHS


def test_probe_writes_a_loadable_profile(tmp_path) -> None:
    out = tmp_path / "probe.json"
    # one thread: the fit's timings are then not at the mercy of other jobs sharing the cores
    r = subprocess.run([sys.executable, "-m", "gnnc", "probe", "-o", str(out), "--threads", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    profile = load_cluster(str(out))
    assert profile.name == "local"
    for field in ("gemm_rate", "spmm_rate", "memory_bandwidth", "intra_bandwidth"):
        assert getattr(profile, field) > 1e6, field
    assert 0 < profile.latency < 1.0
    # NeutronStar's constants, one entry per layer width of the probe's 2-layer GCN
    features, hidden, classes = PROBE_WIDTHS
    assert [(u.d_in, u.d_out, u.row_width) for u in profile.unit_costs] == [(features, hidden, hidden),
                                                                         (hidden, classes, classes)]
    for u in profile.unit_costs:
        assert u.T_c == pytest.approx(u.row_width * 4 / profile.intra_bandwidth)
        assert 0 < u.T_v + u.T_e and u.T_v < 1e-3 and u.T_e < 1e-3  # some work per row, far below a ms
    assert profile.t_c == pytest.approx(1 / profile.intra_bandwidth)
    assert "NeutronStar unit costs" in r.stderr and f"{features}->{hidden}" in r.stderr
    # every other op's class, fitted beside them (issue 16), and the forward alone for the evaluation pass
    rates = {r.op: r for r in profile.op_rates}
    assert set(rates) == set(OP_CLASSES), set(OP_CLASSES) - set(rates)
    assert 0 < rates["elementwise"].forward < 1e-6 and 0 < rates["call"].forward < 1e-2
    assert profile.t_v_forward is not None and profile.t_e_forward is not None
    assert "other ops" in r.stderr and "forward alone" in r.stderr
    # the kernels at several widths: each timed shape once, and the factors the planner prices layers with
    kernels = {(k.kernel, k.k, k.n) for k in profile.kernel_rates}
    assert len(kernels) == len(profile.kernel_rates) and ("gemm_dw", 256, 8) in kernels and ("spmm_b", 0, 8) in kernels
    assert min(profile.kernel_slowdown("gemm_f", 64, n) for n in (8, 64, 256)) >= 1.0 - 1e-9  # interpolated in logs
    assert "kernels by width" in r.stderr
    assert json.loads(r.stdout) == json.loads(out.read_text())  # stdout stays the profile's JSON
    # the planner prices a plan for several local processes with the fitted figures
    from gnnc import api

    graph = api.load_graph("rmat:n=300,deg=5,features=16,classes=3,seed=0")
    plan = api.compile(api.load_model(ROOT / "examples" / "gcn.gnn"), graph, workers=2, cluster=profile)
    assert profile.workers == os.cpu_count() and plan.meta.planner.predicted_time_s > 0


def test_the_fit_recovers_known_constants() -> None:
    t_v, t_e, const = 7.5e-7, 2.0e-8, 1.2e-4
    vertices = [2000, 2000, 6000, 6000, 9000]
    edges = [10_000, 50_000, 30_000, 78_000, 40_000]
    seconds = [t_v * v + t_e * e + const for v, e in zip(vertices, edges)]
    fit = fit_unit_costs(vertices, edges, seconds)
    assert (fit.T_v, fit.T_e, fit.const) == pytest.approx((t_v, t_e, const), rel=1e-6)
    assert fit.rms < 1e-12

    # 1% noise moves them by little
    rng = np.random.default_rng(0)
    noisy = [s * (1 + 0.01 * rng.standard_normal()) for s in seconds]
    fit = fit_unit_costs(vertices, edges, noisy)
    assert fit.T_v == pytest.approx(t_v, rel=0.15) and fit.T_e == pytest.approx(t_e, rel=0.15)


def test_the_fit_keeps_every_constant_non_negative() -> None:
    # times that an unconstrained fit explains with a negative intercept
    vertices, edges = [1000, 2000, 4000, 8000], [5000, 10_000, 20_000, 40_000]
    seconds = [1e-6 * v + 1e-8 * e - 1e-4 for v, e in zip(vertices, edges)]
    unconstrained = np.linalg.lstsq(np.stack([vertices, edges, np.ones(4)], 1), seconds, rcond=None)[0]
    assert unconstrained[2] < 0
    fit = fit_unit_costs(vertices, edges, seconds)
    assert min(fit.T_v, fit.T_e, fit.const) >= 0 and fit.T_v + fit.T_e > 0
    with pytest.raises(ValueError):
        fit_unit_costs([1, 2], [3, 4], [5, 6])


def test_the_cost_model_rates_reproduce_the_timings_they_are_fitted_to() -> None:
    """t_v, t_e (per unit of work) from per-layer timings made with known values, through the model's work."""
    from gnnc.passes.cost.fit import joint_rates

    work = [(16384.0, 128.0, 64), (3072.0, 32.0, 16)]  # the probe GCN's per-vertex and per-edge work units
    t_v, t_e, consts = 4.6e-11, 1.5e-10, (0.0, 1e-4)
    samples = []
    for n, e in ((2000, 10_000), (2000, 50_000), (6000, 30_000), (6000, 78_000)):
        samples.append((n, [e, e], [t_v * wv * n + t_e * we * e + c for (wv, we, _), c in zip(work, consts)]))
    assert joint_rates(samples, work) == pytest.approx((t_v, t_e), rel=1e-6)


def test_profiles_with_and_without_unit_costs_load() -> None:
    old = preset("g3").to_dict()
    assert "unit_costs" not in old  # a profile without a fit is written as before this field existed
    assert ClusterProfile.from_dict(old) == preset("g3")
    fitted = ClusterProfile.from_dict({**old, "unit_costs": [
        {"d_in": 128, "d_out": 64, "row_width": 64, "T_v": 7e-7, "T_e": 2e-8, "T_c": 1e-7, "const": 0}]})
    assert fitted.unit_costs == (LayerUnitCosts(128, 64, 64, 7e-7, 2e-8, 1e-7, 0.0),)
    assert ClusterProfile.from_dict(json.loads(fitted.to_json())) == fitted
    from gnnc.errors import GnncError

    with pytest.raises(GnncError, match="unit_costs"):
        ClusterProfile.from_dict({**old, "unit_costs": [{"d_in": 128, "T_v": -1}]})
    with pytest.raises(GnncError, match="'T_e' must be a non-negative"):
        ClusterProfile.from_dict({**old, "unit_costs": [
            {"d_in": 1, "d_out": 1, "row_width": 1, "T_v": 1e-7, "T_e": -1e-9, "T_c": 1e-7}]})


def test_the_layer_timings_run_each_equation_as_a_rank_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's layer timings do not fuse chains (gnnc.runtime.fusion): the fit takes the other ops' time,
    timed equation by equation, off them, and the distributed ranks it prices run equations one by one."""
    from gnnc import api
    from gnnc.runtime import fusion
    from gnnc.runtime.probe import PROBE_MODEL, layer_times

    graph = api.load_graph("rmat:n=200,deg=4,features=8,classes=3,seed=0")
    program = api.compile(api.load_model_source(PROBE_MODEL, "<probe>", features=8, hidden=8, classes=3), graph).program
    assert fusion.find_chains(program)  # there is something it could have fused
    ran = []
    monkeypatch.setattr(fusion, "run", lambda *args: ran.append(args) or False)
    both, alone = layer_times(program, graph, repeats=1)
    assert len(both) == len(alone) == 2 and not ran


def test_a_timed_sample_spans_many_calls_of_a_short_op() -> None:
    """A rate on a core shared with another rank is its throughput: a sample of a short call runs it as many times
    as fill MIN_SAMPLE_S (a single call would mostly run whole inside one scheduler slice, at full speed); a call
    longer than that is a sample of its own."""
    import time

    from gnnc.runtime.probe import MIN_SAMPLE_S, _median_time

    calls = []

    def short() -> None:
        calls.append(1)
        time.sleep(0.001)

    t = _median_time(short, repeats=3)
    assert 0.001 <= t < MIN_SAMPLE_S and len(calls) > 1 + 3 * 2  # several calls a sample
    calls.clear()

    def long() -> None:
        calls.append(1)
        time.sleep(MIN_SAMPLE_S * 1.5)

    assert _median_time(long, repeats=3) >= MIN_SAMPLE_S * 1.5 and len(calls) == 1 + 3


def _kernels_together(cfg) -> tuple[int, float]:
    """One rank of `test_the_ranks_time_each_kernel_together`: how many timings it started, and when its last
    one started (after rank 1 slept before it)."""
    import time

    import torch.distributed as dist

    from gnnc.runtime import probe

    starts: list[float] = []

    def barrier() -> None:
        if cfg.rank == 1 and len(starts) == 3:
            time.sleep(0.5)  # rank 1 late for the fourth timing: rank 0 must wait for it
        dist.barrier()
        starts.append(time.monotonic())

    with probe.timing_together(barrier):
        probe.kernel_rate_samples(1, widths=(8,), rows=256, graph=(200, 4.0), repeats=1, attention=((2, 8),))
    return len(starts), starts[3] - starts[2]


def test_the_ranks_time_each_kernel_together() -> None:
    """`gnnc probe --network` times each kernel on every rank at the same moment, as a job's ranks compute: every
    timing starts after the barrier (3 dense products and 2 x 3 aggregations here), so a late rank holds the
    others' next timing back."""
    (n0, gap0), (n1, gap1) = pooled_launch(_kernels_together, 2, timeout_s=120)
    assert n0 == n1 == 3 + 2 * 3
    assert gap0 >= 0.45 and gap1 >= 0.45


def _rank_timings(scale: float, layer: float) -> dict:
    """One rank's probe timings (the shape `gnnc probe --network` gathers): every op, copy, Adam step and kernel
    at `scale` seconds, the layers at `layer`."""
    return {"layers": [(100, [400, 400], [layer, 2 * layer]), (300, [900, 900], [3 * layer, layer])],
            "forward": [(100, [400, 400], [layer / 2, layer]), (300, [900, 900], [layer, layer / 2])],
            "ops": {"dispatch": [("relu", 1, 8, 64, scale, scale)], "eqns": [("relu", 1, 100, 6400, scale, 2 * scale)],
                    "copies": [(1000, scale, scale)], "adam": [(64, 2, scale)]},
            "kernels": [{"kernel": "gemm_f", "k": 8, "n": 8, "rate": 1.0 / scale}]}


def test_a_jobs_probe_takes_the_slowest_ranks_layers_and_the_median_of_every_other_timing() -> None:
    """A job's step waits at each layer's exchange for its slowest rank, so each layer timing (taken on every rank
    at once) is the slowest rank's; the single ops and kernels, timed at each rank's own moment, the median."""
    from gnnc.runtime.probe import across_ranks

    got = across_ranks([_rank_timings(1.0, 5.0), _rank_timings(3.0, 2.0), _rank_timings(2.0, 9.0)])
    assert got["layers"] == [(100, [400, 400], [9.0, 18.0]), (300, [900, 900], [27.0, 9.0])]
    assert got["forward"] == [(100, [400, 400], [4.5, 9.0]), (300, [900, 900], [9.0, 4.5])]
    assert got["ops"] == {"dispatch": [("relu", 1, 8, 64, 2.0, 2.0)], "eqns": [("relu", 1, 100, 6400, 2.0, 4.0)],
                          "copies": [(1000, 2.0, 2.0)], "adam": [(64, 2, 2.0)]}
    assert got["kernels"] == [{"kernel": "gemm_f", "k": 8, "n": 8, "rate": 0.5}]
    assert across_ranks([_rank_timings(1.0, 5.0)])["layers"] == _rank_timings(1.0, 5.0)["layers"]


def test_ranks_that_timed_different_things_are_refused() -> None:
    from gnnc.runtime.probe import across_ranks

    other = _rank_timings(1.0, 1.0)
    other["layers"][0] = (101, [400, 400], [1.0, 1.0])
    with pytest.raises(ValueError, match="the ranks timed different layers"):
        across_ranks([_rank_timings(1.0, 1.0), other])
    other = _rank_timings(1.0, 1.0)
    other["kernels"][0]["n"] = 16
    with pytest.raises(ValueError, match="different kernels"):
        across_ranks([_rank_timings(1.0, 1.0), other])
    with pytest.raises(ValueError, match="no rank"):
        across_ranks([])
