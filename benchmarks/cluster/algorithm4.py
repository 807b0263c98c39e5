"""NeutronStar's Algorithm 4 as written against gnnc's earlier reading, on the planner grid's cases (issue 38 item 5).

    python benchmarks/cluster/algorithm4.py                 # compile only: every grid case, both rules
    python benchmarks/cluster/algorithm4.py --run CASE ...  # and train the differing hybrid plans on the emulated
                                                            # cluster (needs root, as grid.py)

Why this exists: passes/planner/hybrid_greedy.py had claimed "as the paper does" for a rule that costs each
dependency's subtree alone (a vertex shared by two cached subtrees counted twice) and ends only a layer at the
memory limit ("walks"); Algorithm 4 as NeutronStar writes it keeps V_rep and ends the algorithm ("paper"). For
each case of grid.py (its graphs, widths, models and worker counts; the profile below stands in for the
probe's at each link speed) it compiles the planner's choice and the all-hybrid assignment under both rules
and prints, per rule, the hybrid selection (which candidate won, dependencies cached), its predicted epoch and
bytes per epoch (step + evaluation, what grid.py's C compares), and the planner's choice and its predicted
epoch. With --run, the all-hybrid plans of the named cases are trained on the emulated cluster under both rules
(grid.py's protocol, fewer passes): measured epoch and bytes beside the predictions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from emulated import EmulatedCluster, refuse_without_requirements
from grid import CASES, WIDTHS, GridCase
from runner import ROOT, compile_plan, measure_profile, prediction, run_plans

# What the grid's probes measured (benchmarks/RESULTS-planner.md's profiles, rounded): a dense map rate, an
# aggregation rate and a latency per worker count; the link is the case's bandwidth.
MEASURED = {2: {"gemm_rate": 70e9, "spmm_rate": 4.0e9, "latency": 3.0e-3},
            4: {"gemm_rate": 35e9, "spmm_rate": 1.4e9, "latency": 1.6e-3}}


def profile_for(case: GridCase):
    from gnnc.cluster import preset  # deferred: the script's help needs no gnnc
    from emulated import parse_rate

    rate = parse_rate(case.bandwidth) / 8
    return dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=rate, intra_bandwidth=rate,
                               workers=case.workers, **MEASURED[case.workers])


def compile_case(case: GridCase, rule: str, loaded: dict, profile=None) -> dict:
    """The planner's choice and the all-hybrid plan of `case` under `rule`, predicted."""
    from gnnc import api
    from gnnc.inspect_plan import predicted_epoch
    from gnnc.passes.planner import hybrid_greedy

    hybrid_greedy.DEFAULT_RULE = rule
    if case.graph_spec not in loaded:
        loaded[case.graph_spec] = api.load_graph(case.graph_spec)
    graph = loaded[case.graph_spec]
    model = api.load_model(ROOT / "examples" / f"{case.model}.gnn", **case.sets)
    cluster = profile if profile is not None else profile_for(case)
    out = {"case": case.name, "rule": rule}
    t0 = time.perf_counter()
    for what, strategy in (("planner", None), ("hybrid", "hybrid")):
        plan = api.compile(model, graph, workers=case.workers, strategy=strategy, partition="metis",
                           cluster=cluster, graph_spec=case.graph_spec)
        epoch = predicted_epoch(plan)
        out[what] = {"strategies": [layer.attr("strategy") for layer in plan.program.graph_layers()],
                     "epoch_s": epoch["epoch_time_s"],
                     "bytes": sum((plan.meta.predicted_bytes_per_step or {}).values())
                     + sum((plan.meta.predicted_eval_bytes_per_epoch or {}).values()),
                     "hybrid": [{"source": h["source"], "cached": sum(map(sum, h["cached_per_layer"])),
                                 "communicated": sum(map(sum, h["communicated_per_layer"])), "mu": h.get("mu")}
                                for h in plan.meta.hybrid or []]}
    out["compile_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="grid case names (default: all)")
    ap.add_argument("--run", action="store_true", help="train the all-hybrid plans on the emulated cluster")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json", metavar="FILE.jsonl")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.cases or c.name in args.cases]
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    loaded: dict = {}
    rows = []
    if not args.run:
        for case in cases:
            for rule in ("walks", "paper"):
                r = compile_case(case, rule, loaded)
                rows.append(r)
                h = r["hybrid"]
                print(f"{case.name} {rule}: planner {','.join(r['planner']['strategies'])} "
                      f"{r['planner']['epoch_s'] * 1e3:.2f} ms {r['planner']['bytes']} B; all-hybrid "
                      f"{h['epoch_s'] * 1e3:.2f} ms {h['bytes']} B {h['hybrid']} ({r['compile_s']:.0f} s)", flush=True)
    else:
        if refuse_without_requirements():
            return 2
        for case in cases:
            with tempfile.TemporaryDirectory(prefix="gnnc-alg4-") as tmp, \
                    EmulatedCluster(case.workers, case.bandwidth) as cluster:
                profile = measure_profile(case.workers, case.bandwidth, Path(tmp) / "profile.json", cluster=cluster)
                from gnnc import api
                from gnnc.passes.planner import hybrid_greedy
                if case.graph_spec not in loaded:
                    loaded[case.graph_spec] = api.load_graph(case.graph_spec)
                model = api.load_model(ROOT / "examples" / f"{case.model}.gnn", **case.sets)
                dirs, preds = [], []
                for rule in ("walks", "paper"):
                    hybrid_greedy.DEFAULT_RULE = rule
                    plan = compile_plan(model, loaded[case.graph_spec], case.graph_spec, case.workers, profile,
                                        Path(tmp) / rule, "hybrid")
                    dirs.append(Path(tmp) / rule)
                    preds.append(prediction(plan))
                runs = run_plans(cluster, dirs, args.epochs, run_id=f"gnnc-alg4-{os.getpid()}", passes=args.passes)
                for rule, pred, run in zip(("walks", "paper"), preds, runs):
                    row = {"case": case.name, "rule": rule, "predicted_epoch_s": pred["epoch_s"],
                           "measured_epoch_s": run["epoch_time_s"] + run["eval_time_s"],
                           "predicted_bytes": pred["bytes"] + pred["eval_bytes"],
                           "measured_bytes": run["bytes_sent_per_epoch"] + run["eval_bytes_sent_per_epoch"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
