"""Each distributed strategy on one machine: epoch time, bytes, compute/communication split, peak RSS.

Runs `gnnc run` as a user would (2 processes x 1 thread by default) and the
single-process run beside it, in one invocation, and prints one table:

    python benchmarks/distributed.py
    python benchmarks/distributed.py --graph rmat:n=100000,deg=10,features=128,classes=16,seed=0 --epochs 3
    python benchmarks/distributed.py --strategies depcomm@hash,hybrid

Epoch time is the median over epochs after the first (the slowest rank's);
bytes are the logical payload all ranks sent in one training step; the
split and peak RSS come from every rank's metrics records.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from device_arg import add_device_argument, resolve_device_or_exit

ROOT = Path(__file__).resolve().parent.parent


def run(model: str, graph: str, nproc: int, strategy: str | None, epochs: int, threads: int,
        partition: str | None = None, device: str = "cpu") -> dict:
    args = [model, "--graph", graph, "--nproc", str(nproc), "--device", device]
    if strategy:
        args += ["--strategy", strategy]
    if partition:
        args += ["--partition", partition]
    return run_gnnc(args, epochs, threads)


def run_gnnc(args: list[str], epochs: int, threads: int) -> dict:
    """`gnnc run ARGS` with metrics: its --json summary, the median split of the epochs after the first,
    and the largest rank's peak RSS; {"error": last line of stderr} when it fails."""
    with tempfile.TemporaryDirectory() as d:
        metrics = Path(d) / "m.jsonl"
        cmd = [sys.executable, "-m", "gnnc", "run", *args, "--epochs", str(epochs), "--metrics", str(metrics),
               "--json", "--no-progress"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if r.returncode != 0:
            return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steady = [rec for rec in records if rec["epoch"] > 0] or records
    per_rank_peak = max(rec.get("peak_rss_bytes", 0) for rec in records)
    return {**summary,
            "compute_s": statistics.median(rec.get("compute_s", 0.0) for rec in steady),
            "comm_s": statistics.median(rec.get("comm_s", 0.0) for rec in steady),
            "allreduce_s": statistics.median(rec.get("allreduce_s", 0.0) for rec in steady),
            "peak_rss_rank": per_rank_peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "gcn.gnn"))
    ap.add_argument("--graph", default="rmat:n=1000000,deg=10,features=128,classes=16,seed=0")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--strategies", default="depcomm,depcomm@hash,depcomm@g3,depcache,hybrid,bcast1d,pushpull+depcomm",
                    help="comma-separated; + joins per-layer strategies, @ names a partition (default: metis, "
                         "random for bcast1d)")
    add_device_argument(ap)
    args = ap.parse_args()
    device = resolve_device_or_exit(args.device)  # cuda: each rank takes its own GPU (NCCL)
    print(f"{args.graph}, {Path(args.model).name}, {args.nproc} processes x {args.threads} thread(s), "
          f"{args.epochs} epochs, device {device}")
    base = run(args.model, args.graph, 1, None, args.epochs, args.threads, device=device)
    rows = [("single process", base)]
    for s in args.strategies.split(","):
        strategy, _, partition = s.partition("@")  # "depcomm@hash": a partition other than the default
        rows.append((s, run(args.model, args.graph, args.nproc, strategy.replace("+", ","), args.epochs,
                            args.threads, partition or None, device)))
    print(f"{'strategy':18s} {'epoch s':>8s} {'compute s':>9s} {'comm s':>7s} {'allred s':>8s} "
          f"{'MB/epoch':>9s} {'peak RSS/rank MiB':>18s} {'vs single':>9s} {'test acc':>8s}")
    for name, r in rows:
        if "error" in r:
            print(f"{name:18s} error: {r['error']}")
            continue
        ratio = r["peak_rss_rank"] / base["peak_rss_rank"] if "error" not in base and base["peak_rss_rank"] else 0
        print(f"{name:18s} {r['epoch_time_s']:8.3f} {r['compute_s']:9.3f} {r['comm_s']:7.3f} {r['allreduce_s']:8.3f} "
              f"{r['bytes_sent_per_epoch'] / 1e6:9.1f} {r['peak_rss_rank'] / 2**20:18.0f} {ratio:9.2f} "
              f"{r['test_acc']:8.3f}")


if __name__ == "__main__":
    main()
