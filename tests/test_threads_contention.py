"""benchmarks/contention.py's timing (issue 42): a case warms up until its epoch time is steady, is timed within a
budget, and PyG's rows state its epoch with and without its dense input dropout."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import contention  # noqa: E402
from contention import MIN_TIMED, Timing  # noqa: E402


def _feed(timing: Timing, epochs: list[float]) -> int:
    """Epochs fed until the timing says done; how many it took."""
    for n, seconds in enumerate(epochs, 1):
        if timing.add(seconds):
            return n
    raise AssertionError("never done")


def test_warm_up_lasts_until_the_epoch_is_steady() -> None:
    # a 200K-vertex graph's first epochs fault its memory in: 2 warm-up epochs timed the slow ones
    timing = Timing(warmup=2, warmup_s=0.0, epochs=4, budget_s=1000.0)
    _feed(timing, [3.0, 2.0, 1.2, 0.6, 0.33, 0.32, 0.33, 0.31, 0.32, 0.33])
    assert timing.warm_at == 6 and timing.row()["epochs"] == 4
    assert timing.row()["epoch_s"] == 0.325  # the steady epochs only
    assert timing.row()["first_s"] == 3.0


def test_warm_up_lasts_its_minimum_epochs_and_seconds() -> None:
    timing = Timing(warmup=3, warmup_s=0.0, epochs=2, budget_s=1000.0)
    _feed(timing, [1.0] * 10)
    assert timing.warm_at == 3
    timing = Timing(warmup=1, warmup_s=2.5, epochs=2, budget_s=1000.0)
    _feed(timing, [1.0] * 10)
    assert timing.warm_at == 3


def test_the_budget_bounds_a_case_but_leaves_a_median() -> None:
    # never steady: the warm-up stops at a third of the budget, the case at the budget with MIN_TIMED epochs
    timing = Timing(warmup=2, warmup_s=0.0, epochs=100, budget_s=30.0)
    taken = _feed(timing, [5.0, 10.0] * 20)
    assert timing.row()["warmup_s"] >= 10.0 and timing.warm_at == 2
    assert sum(timing.times) >= 30.0 and taken == 2 + MIN_TIMED
    # epochs longer than the budget itself: still MIN_TIMED timed ones
    timing = Timing(warmup=1, warmup_s=0.0, epochs=100, budget_s=10.0)
    assert _feed(timing, [20.0] * 10) == 1 + MIN_TIMED


def test_pyg_is_stated_with_and_without_its_input_dropout() -> None:
    quiet = {"epoch_s": 0.140, "input_dropout_s": 0.100, "threads": 2, "epochs": 20, "warmup": 10,
             "load_before": "1.0", "load_after": "1.0"}
    loaded = {**quiet, "epoch_s": 0.240, "input_dropout_s": 0.120}
    rows = {("pyg", "torch's defaults", "quiet"): {"cora-gcn": quiet},
            ("pyg", "torch's defaults", "torch"): {"cora-gcn": loaded}}
    lines = contention.table(rows, ["cora-gcn"], [], ["quiet", "torch"])
    pyg = next(line for line in lines if "| PyG |" in line)
    less = next(line for line in lines if "PyG less its input dropout" in line)
    assert "140.0 [20 after 10]" in pyg and "240.0 (1.71x)" in pyg
    assert "40.0 [20 after 10]" in less and "120.0 (3.00x)" in less


def test_gnnc_only_has_no_pyg_rows() -> None:
    row = {"epoch_s": 0.01, "threads": 1, "epochs": 100, "warmup": 20, "load_before": "1.0", "load_after": "1.0"}
    lines = contention.table({("gnnc", "default", "quiet"): {"cora-gcn": row}}, ["cora-gcn"], ["default"], ["quiet"])
    assert len(lines) == 3 and "| cora-gcn | default | 1 | 10.0 [100 after 20] |" in lines[2]


def test_counters_are_per_epoch_medians_of_the_timed_epochs() -> None:
    # the warm-up's counters (the first epoch faults its memory in) stay out of the medians
    timing = Timing(warmup=2, warmup_s=0.0, epochs=3, budget_s=1000.0)
    warm = {k: 1000.0 for k in contention.COUNTERS}
    steady = [{**{k: 0.0 for k in contention.COUNTERS}, "cpu_ms": cpu, "minflt": 900.0} for cpu in (1400.0, 1500.0,
                                                                                                    1300.0)]
    for seconds, counted in zip([3.0, 0.75, 0.75, 0.74, 0.76, 0.75], [warm, warm, warm, *steady]):
        timing.add(seconds, counted)
    row = timing.row()
    assert row["epochs"] == 3 and row["counters"]["cpu_ms"] == 1400.0 and row["counters"]["minflt"] == 900.0
    r = {**row, "threads": 2, "load_before": "1.0", "load_after": "1.0"}
    lines = contention.counter_table({("gnnc", "default", "quiet"): {"rmat-gcn": r}}, ["rmat-gcn"], ["default"],
                                     ["quiet"])
    # CPU time over the epoch's: the cores the epoch kept busy (1400 ms in a 750 ms epoch: 1.87)
    assert "| rmat-gcn | default | quiet | 750.0 | 1400 (1.87) | 0 | 900 | 0 | 0 | 0 | 0 |" in lines


def test_counters_count_this_process_cpu_and_faults() -> None:
    import mmap

    counters = contention.Counters()
    spent = sum(i * i for i in range(300_000))  # some CPU
    with mmap.mmap(-1, 8 << 20) as fresh:  # 8 MiB never touched: a fault per page as it is written
        for offset in range(0, len(fresh), 4096):
            fresh[offset] = 1
    taken = counters.take()
    assert spent > 0 and taken["cpu_ms"] > 0 and taken["minflt"] >= 1024  # 2048 pages, fewer if huge-paged
    assert taken["steal_ms"] >= 0 and set(taken) == set(contention.COUNTERS)
    # the machine's busy time counts this process's too (ticks, so to within a few of them)
    assert taken["others_ms"] > -50 * 1000 / os.sysconf("SC_CLK_TCK")
