"""Train several compiled plans one after another in one torchrun job: what a validation case measures.

Why this exists: a case of the planner's validation grid runs every
assignment the planner priced, and starting torchrun, its rendezvous and a
Python with torch on every host costs seconds a plan's few epochs do not; so
each host's rank trains the plans in turn, in one process group, exactly as
`gnnc run PLAN` would (gnnc.runtime.distributed.worker: the same shards, the
same training loop, the same counters). Each plan's peak resident memory is
its own (the high-water mark starts over before each plan); rank 0 prints
one JSON line per plan, `{"plan": DIR, ...summary}`:

    torchrun ... benchmarks/cluster/run_plans.py --epochs 5 PLAN_DIR [PLAN_DIR ...]

The emulated cluster starts it on every host (runner.run_plans).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gnnc import api
from gnnc.runtime.distributed import DistJob, worker
from gnnc.runtime.launch import DistConfig, end_joined_rank, join_torchrun
from gnnc.host import use_huge_pages
from gnnc.runtime.metrics import forget_peak_rss
from gnnc.runtime.train import TrainConfig


def train_each(cfg: DistConfig, jobs: list[tuple[str, DistJob]]) -> list[dict[str, Any]] | None:
    """Every plan's training run in turn; rank 0 returns their summaries (the others None)."""
    out = []
    for name, job in jobs:
        forget_peak_rss()
        summary = worker(cfg, job)
        if summary is not None:
            summary.pop("logits", None)
            summary.pop("history", None)
            out.append({"plan": name, **summary})
    return out if cfg.rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    use_huge_pages()  # as `gnnc run` allocates (gnnc.host)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective waits for its peers")
    ap.add_argument("plans", nargs="+")
    args = ap.parse_args(argv)
    jobs = []
    for path in args.plans:
        plan = api.Plan.load(path)
        cfg = TrainConfig.resolve(plan.program, epochs=args.epochs, seed=0, progress=False)
        jobs.append((path, DistJob(str(plan.program), str(plan.shard_dir), cfg)))
    results = join_torchrun(train_each, jobs, timeout_s=args.timeout)
    if results is not None:
        for row in results:
            print(json.dumps(row, sort_keys=True), flush=True)
    sys.stdout.flush()
    end_joined_rank(0)


if __name__ == "__main__":
    main()
