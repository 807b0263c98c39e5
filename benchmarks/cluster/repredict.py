"""Re-predict a grid run's assignments with today's cost model, on the profiles the run measured.

    python benchmarks/cluster/repredict.py RUN.jsonl [RUN2.jsonl ...] [--cases GLOB] [--no-choice] [--json OUT.jsonl]
        [--size-rates PROFILE.json]

Why this exists: a grid run takes an hour of the emulated cluster; a change to the cost model is judged against
runs already measured by compiling the same assignments (each row's strategies, forced) with the profile measured
at that row's worker count and link speed, which `grid.py --json` keeps whole (its "profile" entry), and setting the
new prediction beside the old one and the measurement. Prints one line per run: old predicted, new predicted,
measured (ms) and measured/predicted old -> new.

The planner's choice is also made again on each case's profile (unless --no-choice): where the new choice was
measured in the run (the same strategies, and the same predicted bytes, so that a Hybrid's selection is the one
run), whether it measured within 10% of the case's fastest. The summary line's three counts (grid.py's A, B, C)
are then printed as measured (old) and as re-estimated on the same measurements (new): A counts the cases whose new
choice was measured and within 10%, B those whose new choice was measured and predicted within 25% of it, C those
whose every re-compiled assignment predicts the bytes measured; a new choice that was not measured is listed apart
(neither counted nor a miss: it needs a run).

--size-rates: a profile (`gnnc probe`'s) whose `size_rates` (gnnc.cluster.SizeRate: the working-set factors) are
set into every recorded profile, which keeps its other figures: runs recorded before the probe measured them
re-predicted with the size term (indicative only: the factors were measured on another occasion, and by one process
where the grid's probe times every rank at once).

Each file's rows are re-predicted on that file's own profiles: two parts of one grid (`--merge`'s inputs) each
probed the machines again, so the same worker count and link speed has a profile per part.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # grid, runner: beside this script

from grid import by_case, read_jsonl, summary  # noqa: E402
from runner import ROOT  # noqa: E402

WITHIN_CHOSEN = 1.10  # grid.summary's A: the choice within 10% of the fastest measured
WITHIN_PREDICTED = 0.25  # and its B: predicted within 25% of measured


def same_plan(row: dict[str, Any]) -> bool:
    """Whether a row's assignment compiled again is the plan that was run: the same strategies (forced) and the
    same predicted bytes (predict-bytes counts exchanges, which no cost model changes; a forced Hybrid's selection
    is the cost model's, and another selection exchanges other rows)."""
    return row["repredicted_bytes"] == row["predicted_bytes"]


def new_summary(cases: dict[str, list[dict[str, Any]]], choices: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """grid.summary's A, B, C re-estimated from the new predictions (`repredicted_epoch_s`,
    `repredicted_bytes` on each row) and the new choice of each case (`choices[name]`: its "strategies",
    "bytes" and "epoch_s"; absent when not made: the measured choice, re-predicted): A and B count a case only
    where its new choice was measured (a row with the same strategies and bytes); `unmeasured` lists the others.
    C: cases whose every re-compiled plan that was run (`same_plan`) predicts the bytes measured; `reselected`
    lists the rows whose forced Hybrid selected other rows (a plan not run: neither a hit nor a miss)."""
    a, b, c, unmeasured = [], [], [], []
    reselected = [f"{r['case_name']} {','.join(r['strategies'])}" for runs in cases.values() for r in runs
                  if not same_plan(r)]
    for name, runs in cases.items():
        if all(r["repredicted_bytes"] == r["measured_bytes"] for r in runs if same_plan(r)):
            c.append(name)
        choice = choices.get(name)
        if choice is None:
            chosen = next(r for r in runs if r["chosen"])
            new = chosen.get("repredicted_epoch_s")
        else:
            chosen = next((r for r in runs if r["strategies"] == choice["strategies"]
                           and r["predicted_bytes"] == choice["bytes"]), None)
            new = choice["epoch_s"]
        if chosen is None:
            unmeasured.append(name)
            continue
        fastest = min(r["measured_epoch_s"] for r in runs)
        if chosen["measured_epoch_s"] <= WITHIN_CHOSEN * fastest:
            a.append(name)
        if new is not None and abs(new - chosen["measured_epoch_s"]) <= WITHIN_PREDICTED * chosen["measured_epoch_s"]:
            b.append(name)
    return {"A": len(a), "B": len(b), "C": len(c), "N": len(cases), "within_10": a, "within_25": b, "exact": c,
            "unmeasured": unmeasured, "reselected": reselected}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="grid.py --json files")
    ap.add_argument("--cases", default="*", help="comma-separated globs of case names")
    ap.add_argument("--no-choice", action="store_true", help="do not make the planner's choice again")
    ap.add_argument("--json", help="write each run with its new prediction as one JSON line")
    ap.add_argument("--size-rates", help="a profile whose size_rates replace every recorded profile's")
    args = ap.parse_args(argv)
    sizes = json.loads(Path(args.size_rates).read_text())["size_rates"] if args.size_rates else None
    from gnnc import api  # deferred: --help needs no gnnc
    from gnnc.cluster import ClusterProfile
    from gnnc.inspect_plan import predicted_epoch

    globs = args.cases.split(",")
    graphs: dict[str, object] = {}
    out: list[dict[str, Any]] = []
    choices: dict[str, dict[str, Any]] = {}

    def predict(plan: Any) -> tuple[float, int]:
        """(epoch seconds, bytes of the step and the evaluation) as runner.prediction counts them."""
        bytes_ = (sum((plan.meta.predicted_bytes_per_step or {}).values())
                  + sum((plan.meta.predicted_eval_bytes_per_epoch or {}).values()))
        return predicted_epoch(plan)["epoch_time_s"], int(bytes_)

    with tempfile.TemporaryDirectory(prefix="gnnc-repredict-") as tmp:
        for part, run in enumerate(args.runs):
            rows, profiles, _ = read_jsonl([Path(run)])
            by_speed = {(p["workers"], p["bandwidth"]): p.get("profile") for p in profiles}
            for name, runs in by_case(rows).items():
                if not any(fnmatch.fnmatch(name, g) for g in globs):
                    continue
                case = runs[0]["case"]
                workers = case["hosts"] * case["nproc_per_host"]
                measured = by_speed.get((workers, case["bandwidth"]))
                if measured is None:
                    print(f"{name}: no whole profile kept for x{workers} {case['bandwidth']} (a run before --json "
                          "kept it)", file=sys.stderr)
                    continue
                path = Path(tmp) / f"p{part}-x{workers}-{case['bandwidth']}.json"
                if sizes is not None:
                    measured = {**measured, "size_rates": sizes}
                ClusterProfile.from_dict(measured).save(path)
                if case["graph"] not in graphs:
                    graphs[case["graph"]] = api.load_graph(case["graph"])
                model = api.load_model(case["model"], **dict(s.split("=", 1) for s in case["sets"]))

                def compiled(strategy: str | None) -> Any:
                    return api.compile(model, graphs[case["graph"]], workers=workers, strategy=strategy,
                                       partition=case.get("partition") or "metis", cluster=str(path),
                                       graph_spec=case["graph"])

                for r in runs:
                    new, new_bytes = predict(compiled(",".join(r["strategies"])))
                    old, got = r["predicted_epoch_s"], r["measured_epoch_s"]
                    out.append({**r, "repredicted_epoch_s": new, "repredicted_bytes": new_bytes})
                    print(f"{name:36s} {','.join(r['strategies']):40s} predicted {old * 1e3:8.1f} -> {new * 1e3:8.1f} "
                          f"ms, measured {got * 1e3:8.1f}: measured/predicted {got / old:.2f} -> {got / new:.2f}",
                          flush=True)
                if not args.no_choice:
                    plan = compiled(None)
                    epoch, bytes_ = predict(plan)
                    strategies = [layer.attr("strategy") for layer in plan.program.graph_layers()]
                    choices[name] = {"strategies": strategies, "bytes": bytes_, "epoch_s": epoch}
                    before = next(r for r in runs if r["chosen"])["strategies"]
                    print(f"{name:36s} choice {','.join(before)} -> {','.join(strategies)} "
                          f"(predicted {epoch * 1e3:.1f} ms)", flush=True)
    if out:
        run = [r for r in out if same_plan(r)]  # the rows whose new prediction is of the plan that was run
        for label, key in (("old", "predicted_epoch_s"), ("new", "repredicted_epoch_s")):
            ratios = [r["measured_epoch_s"] / r[key] for r in run]
            # grid.report's count: the prediction within 25% of the measurement
            within = sum(abs(r[key] - r["measured_epoch_s"]) <= WITHIN_PREDICTED * r["measured_epoch_s"] for r in run)
            print(f"{label}: measured/predicted median {statistics.median(ratios):.2f}, "
                  f"every run predicted within 25% {within}/{len(ratios)} (the plans run, compiled again)")
        cases = by_case(out)
        old = summary(out)
        new = new_summary(cases, choices)
        for label, s in (("old (as measured)", old), ("new (re-estimated)", new)):
            print(f"{label}: chosen within 10% {s['A']}/{s['N']}; predicted within 25% {s['B']}/{s['N']}; "
                  f"bytes exact {s['C']}/{s['N']}")
            for what, key in (("chosen not within 10%", "within_10"), ("predicted not within 25%", "within_25")):
                misses = sorted(set(cases) - set(s[key]) - set(s.get("unmeasured", ())))
                print(f"  {what}: {', '.join(misses) or 'none'}")
        if new["unmeasured"]:
            print(f"  new choice not measured in the run (needs a run): {', '.join(sorted(new['unmeasured']))}")
        if new["reselected"]:
            print(f"  forced Hybrid selecting other rows (a plan not run): {'; '.join(new['reselected'])}")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
