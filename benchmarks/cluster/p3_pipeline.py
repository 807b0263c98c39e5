"""P3's 2F2B pipeline against the sequential schedule on the emulated cluster (issue 38 item 3, P3 section 3.3).

    python benchmarks/cluster/p3_pipeline.py                       # 4 hosts at 400 Mb/s (needs root, as grid.py)
    python benchmarks/cluster/p3_pipeline.py --hosts 2 --bandwidth 1gbit --epochs 4 --passes 2

Why this exists: sampled push-pull (gnnc.runtime.minibatch_dist) runs P3's 2F2B schedule, whose accuracy
benchmarks/minibatch.py measures; its speed needs a network. This compiles GraphSAGE with push-pull on P3's
contextual SBM (benchmarks/minibatch.py's: F = 128, average degree 50, fan-out (25, 10), batch 1000) for both
schedules, saves both plans with their shards, and trains them one after another in one torchrun job across the
emulated hosts (one rank each), `--passes` times, every other pass in reverse order (run_plans.py's protocol:
each plan's epoch is the median of its steady epochs over the passes). It prints, per schedule, the training
epoch (evaluation apart), the test accuracy at the best validation epoch and after the last, and the bytes per
epoch, with the load average before and after. Under torchrun (`--rank`) this file is also each host's rank.
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
from typing import Any

GRAPH = "sbm:n=16000,blocks=16,deg=50,intra=0.7,features=128,classes=16,seed=0"
SCHEDULES = ("sequential", "2f2b")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def train_each(cfg, jobs: list[tuple[str, Any]], passes: int) -> list[dict[str, Any]] | None:
    """Every plan's sampled run, `passes` times (run_plans.pass_order); rank 0 returns each plan's summary."""
    from gnnc.runtime.metrics import forget_peak_rss
    from gnnc.runtime.minibatch_dist import sampled_worker
    from run_plans import combined, pass_order

    runs: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for i, k in enumerate(pass_order(len(jobs), passes)):
        name, job = jobs[k]
        forget_peak_rss()
        # every rank's per-minibatch records (their phases: how long each waited for its structure push)
        summary = sampled_worker(cfg, dataclasses.replace(job, metrics_path=f"{name}/metrics-{i}.jsonl"))
        if summary is not None:
            runs[k].append({"plan": name, **summary.to_json(), "history": summary.history})
    return [combined(r) for r in runs] if cfg.rank == 0 else None


def phase_means(plan_dir: Path, ranks: int) -> dict[str, float]:
    """Seconds per rank and steady epoch (each pass's first epoch left out) of the phases the structure push
    touches, from every rank's minibatch records of every pass."""
    from gnnc.runtime.metrics import read_metrics

    totals = {"push_wait": 0.0, "sample": 0.0, "slice": 0.0}
    epochs = 0
    for path in sorted(plan_dir.glob("metrics-*.jsonl")):
        records = [r for r in read_metrics(path) if r.get("kind") == "minibatch" and r["epoch"] > 0]
        epochs += len({r["epoch"] for r in records})
        for r in records:
            for k in totals:
                totals[k] += r["phase_s"].get(k, 0.0)
    return {f"{k}_s": v / max(epochs * ranks, 1) for k, v in totals.items()}


def rank_main(args: argparse.Namespace) -> None:
    from gnnc import api
    from gnnc.runtime.launch import end_joined_rank, join_torchrun
    from gnnc.runtime.minibatch_dist import SampledJob
    from gnnc.runtime.train import TrainConfig

    jobs = []
    for path in args.plans:
        plan = api.Plan.load(path)
        cfg = TrainConfig.resolve(plan.program, epochs=args.epochs, seed=0, progress=False)
        jobs.append((path, SampledJob(str(plan.program), str(plan.shard_dir), cfg, plan.sampling, plan.schedule)))
    results = join_torchrun(train_each, jobs, args.passes, timeout_s=300.0)
    if results is not None:
        for row in results:
            print(json.dumps(row, sort_keys=True), flush=True)
    sys.stdout.flush()
    end_joined_rank(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--bandwidth", default="400mbit")
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--fanout", default="25,10")
    ap.add_argument("--batch-size", type=int, default=1000)
    # 16: 2F2B's stale weights reach the sequential schedule's accuracy on the sampled-block evaluation by then
    # (at 6-10 epochs it is 2.2 points behind there, 0.75 with every neighbour: benchmarks/RESULTS-seeds.md)
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="also write the rows here")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("plans", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(args)
        return 0

    from emulated import EmulatedCluster, refuse_without_requirements

    if refuse_without_requirements():
        return 2
    from gnnc import api
    from gnnc.graph.sampling import SamplingConfig

    sampling = SamplingConfig(tuple(int(k) for k in args.fanout.split(",")), args.batch_size)
    graph = api.load_graph(args.graph)
    model = api.load_model(Path(__file__).resolve().parents[2] / "examples" / "sage.gnn")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gnnc-p3pipe-") as tmp:
        dirs = []
        for schedule in SCHEDULES:
            plan = api.compile(model, graph, workers=args.hosts, strategy="pushpull", partition="hash",
                               sampling=sampling, seed=0, schedule=schedule, approximate=schedule != "sequential",
                               graph_spec=args.graph)
            plan.save(Path(tmp) / schedule)
            dirs.append(str(Path(tmp) / schedule))
        print(f"load average before: {loadavg()}", flush=True)
        t0 = time.perf_counter()
        with EmulatedCluster(args.hosts, args.bandwidth) as cluster:
            results = cluster.run_torchrun([str(Path(__file__).resolve()), "--rank", "--epochs", str(args.epochs),
                                            "--passes", str(args.passes), *dirs], timeout_s=1800.0,
                                           run_id=f"gnnc-p3pipe-{os.getpid()}")
        status, stdout, stderr = results[0]
        got = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        if status != 0 or len(got) != len(dirs):
            print(f"the torchrun job exited {status}: {stderr.strip()[-3000:]}", file=sys.stderr)
            return 1
        print(f"load average after: {loadavg()} ({time.perf_counter() - t0:.0f} s)", flush=True)
        waits = [phase_means(Path(d), args.hosts) for d in dirs]
    for schedule, run, wait in zip(SCHEDULES, got, waits):
        row = {**wait, "schedule": schedule, "hosts": args.hosts, "bandwidth": args.bandwidth,
               "epoch_s": run["epoch_time_s"], "eval_s": run["eval_time_s"], "test_acc": run["test_acc"],
               "final_test_acc": run["final_test_acc"], "bytes_per_epoch": run["bytes_sent_per_epoch"],
               "epochs_timed": run["epochs_timed"]}
        rows.append(row)
        print(f"{schedule:10s}: epoch {row['epoch_s'] * 1e3:8.1f} ms (median of {row['epochs_timed']} steady "
              f"epochs), test acc {row['test_acc']:.4f} (final {row['final_test_acc']:.4f}), "
              f"{row['bytes_per_epoch'] / 1e6:.3f} MB/epoch; per rank and steady epoch: waited for the structure "
              f"push {row['push_wait_s'] * 1e3:.1f} ms, sampled {row['sample_s'] * 1e3:.1f} ms, built the sliced "
              f"block {row['slice_s'] * 1e3:.1f} ms", flush=True)
    seq, piped = rows
    print(f"2f2b / sequential epoch: {piped['epoch_s'] / seq['epoch_s']:.3f}; test acc difference "
          f"{(piped['test_acc'] - seq['test_acc']) * 100:+.2f} points", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
