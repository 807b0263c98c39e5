"""benchmarks/scale.py's plan of the full papers100M on paper comes from the sampled runs measured (issue 34's last
must-show: "from the one-tenth runs' measured per-vertex and per-edge costs"): a worker's memory is the larger
rank's measured peak plus its measured growth per vertex over the vertices the fraction lacks, the CPU preset's
step the planner's scaled by the measured 2-rank step over the planner's prediction for those ranks, the GPU
preset's the planner's own. Before, the memory was counted from the arrays' sizes and no measured time entered."""
from __future__ import annotations

import math

import pytest

from test_scale_generator import _scale

GIB = 2**30


def _measured(one: float, rank: float, epoch_s: float) -> dict:
    return {"sage 1 process": {"rc": 0, "peak_bytes": int(one * GIB), "child_peaks": []},
            "sage 2 processes": {"rc": 0, "peak_bytes": int(rank * GIB), "load_before": "9.00 8.00 7.00",
                                 "child_peaks": [int(rank * GIB), int(rank / 2 * GIB), 10 << 20],
                                 "out": {"epoch_time_s": epoch_s}}}


def _predictions(scale) -> dict:
    out = {("local", 2): {"strategies": ["dp-sample"] * 3, "step_s": 0.5, "activation_bytes": 1 << 20}}
    for name in scale.PRESETS:
        for w in scale.WORKERS:
            out[(name, w)] = {"strategies": ["dp-sample"] * 3, "step_s": 0.1 / w, "activation_bytes": 2 << 20}
    return out


def test_the_plan_is_the_measured_peak_and_growth_and_the_calibrated_step() -> None:
    scale = _scale()
    runs = {0.01: _measured(1.0, 0.95, 30.0), 0.1: _measured(3.0, 2.95, 600.0)}
    train = 122_000  # 120 steps of 1024
    plan = scale.paper_plan(runs, 0.1, int(0.3 * GIB), train, _predictions(scale))
    n01, n1 = scale.sized(scale.PAPERS, 0.01)[0], scale.sized(scale.PAPERS, 0.1)[0]
    per_vertex = 2.0 * GIB / (n1 - n01)
    assert plan["per_vertex_bytes"] == pytest.approx(per_vertex)
    assert plan["per_worker_bytes"] == pytest.approx(2.95 * GIB + per_vertex * (scale.PAPERS[0] - n1), rel=1e-6)
    steps = math.ceil(train / 1024)
    assert plan["calibration"] == pytest.approx(600.0 / steps / 0.5)
    by = {(r["cluster"], r["workers"]): r for r in plan["rows"]}
    assert by[("cpu-cluster", 16)]["step_s"] == pytest.approx(0.1 / 16 * plan["calibration"])
    assert by[("dgx-a100", 64)]["step_s"] == pytest.approx(0.1 / 64)  # no GPU measured: the planner's own
    assert by[("dgx-a100", 64)]["epoch_full_s"] == pytest.approx(0.1 / 64 * plan["steps_full"])
    assert plan["steps_full"] == math.ceil(scale.PAPERS_SPLIT[0] * scale.PAPERS[0] / 1024)


def test_one_fraction_gives_the_upper_bound_and_no_runs_no_plan() -> None:
    scale = _scale()
    plan = scale.paper_plan({0.1: _measured(3.0, 2.95, 600.0)}, 0.1, int(0.3 * GIB), 122_000, _predictions(scale))
    n1 = scale.sized(scale.PAPERS, 0.1)[0]
    assert plan["per_vertex_bytes"] == pytest.approx(2.65 * GIB / n1, rel=1e-6)
    failed = _measured(3.0, 2.95, 600.0)
    failed["sage 2 processes"]["rc"] = -9
    with pytest.raises(SystemExit):
        scale.paper_plan({0.1: failed}, 0.1, int(0.3 * GIB), 122_000, _predictions(scale))
