"""The planner's validation grid in parts and without wasted passes (issue 36 item 5): benchmarks/cluster/grid.py
selects cases by name (`--cases`) and joins parts' JSON into one report (`--merge`); run_plans.py stops training,
after the first pass, an assignment measured far slower than the fastest (never the planner's choice).

No emulated cluster: the selection, the merge and the pass logic run on made-up rows.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "cluster"))
import grid  # noqa: E402  (benchmarks are scripts, not a package)
import run_plans  # noqa: E402


def test_cases_are_selected_by_globs_on_their_names() -> None:
    every = grid._chosen_cases(False, True)
    assert len(every) == 24
    gin = grid._chosen_cases(False, True, "gin/*")
    assert len(gin) == 12 and all(c.model == "gin" for c in gin)
    part = grid._chosen_cases(False, True, "gcnii/*/x4/*, */cora/*/400mbit")
    assert {c.name for c in part} == {c.name for c in every if (c.model == "gcnii" and c.workers == 4)
                                      or (c.graph == "cora" and c.bandwidth == "400mbit")}
    # parts by model cover the grid once
    assert sorted(c.name for p in ("gin/*", "gcnii/*") for c in grid._chosen_cases(False, True, p)) == sorted(
        c.name for c in every)


def _row(case: str, strategies: list[str], chosen: bool, predicted: float, measured: float) -> dict:
    model, graph, widths, workers, bandwidth = case.split("/")
    return {"case_name": case, "strategies": strategies, "chosen": chosen, "caches": False,
            "grid_case": {"graph": graph, "widths": widths, "model": model, "workers": int(workers[1:]),
                          "bandwidth": bandwidth},
            "predicted_epoch_s": predicted, "measured_epoch_s": measured, "measured_step_s": measured * 0.7,
            "measured_eval_s": measured * 0.3, "predicted_bytes": 10, "measured_bytes": 10,
            "predicted_memory_bytes": 2**20, "measured_peak_rss_bytes": 2**20, "passes": 4 if chosen else 1}


def test_parts_merge_into_one_report(tmp_path) -> None:
    profile = {"workers": 2, "bandwidth": "400mbit", "link_bytes_per_s": 5e7, "latency_s": 3e-3, "seconds": 40.0,
               "gemm_flops": None, "spmm_rate": None, "call_s": None}
    meta = {"command": "x", "cases": 1, "epochs": 6, "passes": 4, "drop_after_first": 2.5, "wall_s": 60.0,
            "cpus": 2, "load_before": "0.1", "load_after": "0.2"}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    grid.write_jsonl(a, [_row("gin/cora/F>H/x2/400mbit", ["hybrid"] * 2, True, 0.030, 0.032),
                         _row("gin/cora/F>H/x2/400mbit", ["bcast1d"] * 2, False, 0.300, 0.310)], [profile], meta)
    grid.write_jsonl(b, [_row("gcnii/cora/F>H/x2/400mbit", ["depcache"] * 4, True, 0.050, 0.090)], [profile],
                     {**meta, "wall_s": 120.0, "load_after": "0.3"})
    rows, profiles, metas = grid.read_jsonl([a, b])
    assert len(rows) == 3 and len(profiles) == 2 and len(metas) == 2
    merged = grid.merged_meta(metas, [a, b])
    assert merged["cases"] == 2 and merged["wall_s"] == 180.0 and merged["load_after"] == "0.3"
    text = grid.report(rows, profiles, merged)
    assert text.splitlines()[0] == ("planner: chosen within 10% of measured-fastest in 2/2; predicted within 25% "
                                    "in 1/2; bytes exact in 2/2")
    assert "bcast1d,bcast1d (first pass only)" in text


def test_a_plan_far_behind_after_the_first_pass_is_not_trained_again(monkeypatch) -> None:
    seconds = {"chosen": 0.10, "close": 0.12, "slow": 0.30}
    trained: list[str] = []

    def worker(cfg, job):
        trained.append(job)
        t = seconds[job]
        return SimpleNamespace(to_json=lambda: {"peak_rss_bytes": 1, "epoch_time_s": t},
                               history=[{"time_s": 9.0}] + [{"time_s": t, "eval_time_s": 0.0}] * 5)

    monkeypatch.setattr(run_plans, "worker", worker)
    monkeypatch.setattr(run_plans, "forget_peak_rss", lambda: None)
    cfg = SimpleNamespace(rank=0, world_size=1)
    jobs = [(name, name) for name in ("chosen", "close", "slow")]
    out = run_plans.train_each(cfg, jobs, passes=4, drop_after_first=2.5)
    assert trained.count("chosen") == 4 and trained.count("close") == 4 and trained.count("slow") == 1
    assert [r["passes"] for r in out] == [4, 4, 1]
    assert out[2]["epoch_time_s"] == 0.30  # its one pass's steady epochs
    # the planner's choice runs every pass however slow it measured
    trained.clear()
    seconds["chosen"], seconds["slow"] = 1.0, 0.29  # 8x the fastest; slow 2.4x
    out = run_plans.train_each(cfg, jobs, passes=4, drop_after_first=2.5)
    assert trained.count("chosen") == 4 and [r["passes"] for r in out] == [4, 4, 4]
    # without the option every plan runs every pass
    trained.clear()
    seconds["chosen"], seconds["slow"] = 0.10, 0.30
    run_plans.train_each(cfg, jobs, passes=4)
    assert trained.count("slow") == 4


def test_a_plan_predicted_long_trains_fewer_epochs_a_pass_never_under_three_timed() -> None:
    # the grid's default: 10 s a pass; 6 epochs (a warm-up and 5 timed) unless predicted above 2 s
    assert [run_plans.epochs_for(t, 6, 10.0) for t in (0.03, 1.2, 2.0, 2.6, 3.7, 19.0)] == [6, 6, 6, 5, 4, 4]
    assert run_plans.epochs_for(3.7, 6, None) == 6 and run_plans.epochs_for(None, 6, 10.0) == 6
    assert run_plans.epochs_for(50.0, 3, 10.0) == 3  # never more than asked for
