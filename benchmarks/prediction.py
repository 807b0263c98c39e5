"""The planner's predicted epoch beside the measured one, on this machine, per strategy.

A cost model earns its keep by ranking strategies as runs do, so this
benchmark probes this machine (`gnnc probe`, or a profile given with
--profile), compiles one plan per strategy for that profile (the planner
restricted to the strategy with --allow, so the plan carries its prediction),
runs each plan on local gloo processes, and prints, in one table, the
predicted and the measured epoch, their ratio, and both rankings:

    python benchmarks/prediction.py
    python benchmarks/prediction.py --graph rmat:n=100000,deg=10,features=128,classes=16,seed=0 --epochs 4

Runs on this 2-core machine vary by 15% or more, so each plan runs
--repeats times, the strategies taking turns (so a slow spell hits all of
them), and the table gives the median run and the spread of the runs.

The measured epoch (median after the first, slowest rank) also holds what
the cost model does not price: the evaluation forward pass, dropout, the
loss and the optimizer step. The compute and communication columns are the
runtime's own split of it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from device_arg import add_device_argument, resolve_device_or_exit
from distributed import ROOT, run_gnnc


def gnnc(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"gnnc {' '.join(args)} failed:\n{r.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "gcn.gnn"))
    ap.add_argument("--graph", default="rmat:n=200000,deg=10,features=128,classes=16,seed=0")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--partition", default="hash")
    ap.add_argument("--profile", help="a cluster profile JSON (default: measure this machine with gnnc probe)")
    ap.add_argument("--strategies", default="depcomm,depcache,hybrid,bcast1d")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each plan, taking turns")
    add_device_argument(ap)
    args = ap.parse_args()
    device = resolve_device_or_exit(args.device)  # probed, priced and run on the same device
    with tempfile.TemporaryDirectory() as d:
        profile = args.profile
        if profile is None:
            profile = str(Path(d) / "probe.json")
            # one thread: each rank of `gnnc run` computes with one
            gnnc("probe", "--threads", "1", "-o", profile, "--device", device)
        print(f"{args.graph}, {Path(args.model).name}, {args.nproc} processes, {args.partition} partition, "
              f"{args.epochs} epochs, profile {Path(profile).name}, device {device}")
        plans = {}
        for strategy in args.strategies.split(","):
            plan = Path(d) / f"plan-{strategy}"
            gnnc("compile", args.model, "--graph", args.graph, "--workers", str(args.nproc), "--partition",
                 args.partition, "--cluster", profile, "--allow", strategy, "-o", str(plan))
            plans[strategy] = (plan, json.loads((plan / "plan.json").read_text())["planner"]["predicted_time_s"])
        runs: dict[str, list[dict]] = {strategy: [] for strategy in plans}
        for _ in range(args.repeats):
            for strategy, (plan, _predicted) in plans.items():
                runs[strategy].append(run_gnnc([str(plan), "--nproc", str(args.nproc), "--device", device],
                                               args.epochs, 1))
    print(f"{'strategy':10s} {'predicted s':>11s} {'measured s':>10s} {'runs min-max s':>15s} "
          f"{'measured/predicted':>18s} {'compute s':>9s} {'comm s':>7s}")
    rows = []
    for name, (_, predicted) in plans.items():
        errors = [r for r in runs[name] if "error" in r]
        if errors:
            print(f"{name:10s} {predicted:11.4f} error: {errors[0]['error']}")
            continue
        ordered = sorted(runs[name], key=lambda r: r["epoch_time_s"])
        r = ordered[len(ordered) // 2]
        rows.append((name, predicted, r))
        spread = f"{ordered[0]['epoch_time_s']:.3f}-{ordered[-1]['epoch_time_s']:.3f}"
        print(f"{name:10s} {predicted:11.4f} {r['epoch_time_s']:10.4f} {spread:>15s} "
              f"{r['epoch_time_s'] / predicted:18.2f} {r['compute_s']:9.4f} {r['comm_s']:7.4f}")
    ok = [(name, predicted, r["epoch_time_s"]) for name, predicted, r in rows]
    print("ranking, predicted:", " < ".join(n for n, _, _ in sorted(ok, key=lambda x: x[1])))
    print("ranking, measured: ", " < ".join(n for n, _, _ in sorted(ok, key=lambda x: x[2])))


if __name__ == "__main__":
    main()
