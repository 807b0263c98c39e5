"""Re-predict a grid run's assignments with today's cost model, on the profiles the run measured.

    python benchmarks/cluster/repredict.py RUN.jsonl [--cases GLOB] [--json OUT.jsonl]

Why this exists: a grid run takes an hour of the emulated cluster; a change to the cost model is judged against
runs already measured by compiling the same assignments (each row's strategies, forced) with the profile measured
at that row's worker count and link speed, which `grid.py --json` keeps whole (its "profile" entry), and setting the
new prediction beside the old one and the measurement. Prints one line per run: old predicted, new predicted,
measured (ms) and measured/predicted old -> new; the planner's choice is compiled as the assignment it made (what
was measured), not chosen again.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
from pathlib import Path

from grid import read_jsonl
from runner import ROOT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="grid.py --json files")
    ap.add_argument("--cases", default="*", help="comma-separated globs of case names")
    ap.add_argument("--json", help="write each run with its new prediction as one JSON line")
    args = ap.parse_args(argv)
    from gnnc import api  # deferred: --help needs no gnnc
    from gnnc.cluster import ClusterProfile
    from gnnc.inspect_plan import predicted_epoch

    rows, profiles, _ = read_jsonl([Path(p) for p in args.runs])
    by_speed = {(p["workers"], p["bandwidth"]): p.get("profile") for p in profiles}
    globs = args.cases.split(",")
    graphs: dict[str, object] = {}
    out = []
    with tempfile.TemporaryDirectory(prefix="gnnc-repredict-") as tmp:
        for r in rows:
            case = r["case"]
            name = r.get("case_name") or case["name"]
            if not any(fnmatch.fnmatch(name, g) for g in globs):
                continue
            workers = case["hosts"] * case["nproc_per_host"]
            measured = by_speed.get((workers, case["bandwidth"]))
            if measured is None:
                print(f"{name}: no whole profile kept for x{workers} {case['bandwidth']} (a run before --json kept it)",
                      file=sys.stderr)
                continue
            path = Path(tmp) / f"x{workers}-{case['bandwidth']}.json"
            ClusterProfile.from_dict(measured).save(path)
            if case["graph"] not in graphs:
                graphs[case["graph"]] = api.load_graph(case["graph"])
            model = api.load_model(case["model"], **dict(s.split("=", 1) for s in case["sets"]))
            plan = api.compile(model, graphs[case["graph"]], workers=workers, strategy=",".join(r["strategies"]),
                               partition=case.get("partition") or "metis", cluster=str(path),
                               graph_spec=case["graph"])
            new = predicted_epoch(plan)["epoch_time_s"]
            old, got = r["predicted_epoch_s"], r["measured_epoch_s"]
            out.append({**r, "repredicted_epoch_s": new})
            print(f"{name:36s} {','.join(r['strategies']):40s} predicted {old * 1e3:8.1f} -> {new * 1e3:8.1f} ms, "
                  f"measured {got * 1e3:8.1f}: measured/predicted {got / old:.2f} -> {got / new:.2f}", flush=True)
    if out:
        for label, key in (("old", "predicted_epoch_s"), ("new", "repredicted_epoch_s")):
            ratios = [r["measured_epoch_s"] / r[key] for r in out]
            within = sum(abs(x - 1) <= 0.25 for x in ratios)
            print(f"{label}: measured/predicted median {statistics.median(ratios):.2f}, "
                  f"within 25% {within}/{len(ratios)}")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
