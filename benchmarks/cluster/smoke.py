"""Smoke run of the planner's validation on the emulated cluster: one training job at two bandwidths.

For each bandwidth it measures the cluster (`gnnc probe --network` on 2
emulated hosts; the first bandwidth's probe also measures host 0's own rates,
the second keeps them), then compiles the case with that profile and trains
it under torchrun on both hosts (run_plans.py: what `gnnc run PLAN` runs),
and prints the predicted and the measured epoch (the training step and the
evaluation after it), bytes and peak memory side by side:

    sudo python benchmarks/cluster/smoke.py
    sudo python benchmarks/cluster/smoke.py --bandwidths 1gbit,10gbit --strategy depcomm --json out.jsonl

It needs what the emulated cluster needs (root, iproute2, taskset; see
emulated.py). The validation grid (grid.py) runs many cases the same way.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from emulated import refuse_without_requirements
from runner import ROOT, Case, CaseFailed, measure_profile, run_case

# Communication-heavy on purpose: half of every vertex's edges leave its block (8 blocks of 2,500),
# 256-wide features and hidden rows: a DepComm epoch moves tens of MB, so the link's rate shows.
GRAPH = "sbm:n=20000,blocks=8,deg=10,intra=0.5,features=256,classes=8,seed=0"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "gcn.gnn"))
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--set", action="append", default=["hidden=256"], metavar="NAME=VALUE")
    ap.add_argument("--bandwidths", default="1gbit,10gbit")
    ap.add_argument("--strategy", default="depcomm", help="per graph layer, or 'planner' for the planner's choice")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--json", metavar="FILE.jsonl", help="also write one JSON line per case")
    args = ap.parse_args(argv)
    if refuse_without_requirements():
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnc-smoke-") as tmp:
        base = None
        for bandwidth in args.bandwidths.split(","):
            profile = measure_profile(2, bandwidth, Path(tmp) / f"cluster-{bandwidth}.json", base)
            base = base or profile
            case = Case(args.model, args.graph, bandwidth, strategy=None if args.strategy == "planner" else args.strategy,
                        sets=tuple(args.set), epochs=args.epochs)
            try:
                rows.append(run_case(case, profile))
            except CaseFailed as err:
                print(f"error: {bandwidth}: {err}", file=sys.stderr)
                return 1
            measured_link = json.loads(profile.read_text())["inter_bandwidth"]
            rows[-1]["measured_link_bytes_per_s"] = measured_link
            _print(rows[-1])
    if args.json:
        with open(args.json, "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


def _print(row: dict) -> None:
    c = row["case"]
    print(f"{c['bandwidth']:>7s} shaped, {row['measured_link_bytes_per_s'] * 8 / 1e9:.2f} Gb/s measured; "
          f"{','.join(row['strategies'])}: epoch predicted {row['predicted_epoch_s'] * 1e3:.1f} ms, measured "
          f"{row['measured_epoch_s'] * 1e3:.1f} ms ({row['measured_epoch_s'] / row['predicted_epoch_s']:.2f}x); "
          f"bytes predicted {row['predicted_bytes'] / 1e6:.3f} MB, measured {row['measured_bytes'] / 1e6:.3f} MB; "
          f"peak memory predicted {row['predicted_memory_bytes'] / 2**20:.0f} MiB, measured RSS "
          f"{row['measured_peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    sys.exit(main())
