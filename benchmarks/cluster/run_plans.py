"""Train several compiled plans one after another in one torchrun job: what a validation case measures.

Why this exists: a case of the planner's validation grid runs every
assignment the planner priced, and starting torchrun, its rendezvous and a
Python with torch on every host costs seconds a plan's few epochs do not; so
each host's rank trains the plans in turn, in one process group, exactly as
`gnnc run PLAN` would (gnnc.runtime.rank_worker.worker: the same shards, the
same training loop, the same counters). Each plan's peak resident memory is
its own (the high-water mark starts over before each plan); rank 0 prints
one JSON line per plan, `{"plan": DIR, ...summary}`:

    torchrun ... benchmarks/cluster/run_plans.py --epochs 5 [--passes 2] PLAN_DIR [PLAN_DIR ...]

`--passes P` trains the plans P times, every other pass in reverse order, and
each plan's epoch and evaluation times are then the medians of its steady
epochs (all but each pass's first) over all passes. Why: the plan trained
first in a job measured up to 1.5x slower than the same plan trained later
in it (gat/sbm on 4 emulated hosts: 274 ms against 183 ms, for plans the
planner priced alike), and the machine's speed drifts over seconds; a plan
that runs first and then last, minutes apart, is measured on both.

`--drop-after-first R` (the grid's default 2.5): after the first pass, a plan
whose measured epoch (step + evaluation, the median of that pass's steady
epochs) is R or more times the fastest plan's is not trained again; its
figures are the first pass's. Why: such a plan can be neither the
measured-fastest nor within 10% of it (the first-pass penalty above is at
most 1.5x), and on slow links bcast1d's epochs are 3-10x everyone else's,
so its later passes were most of a case's wall (RESULTS-planner.md: 1.05 of
1.9 s per epoch of gcn/sbm/F<H/x2/400mbit's five plans). The first plan (the
planner's choice, whose prediction the summary line judges) always runs
every pass. Rank 0 decides; every rank follows (one broadcast).

`--pass-seconds S` (the grid's default 10): a plan whose own predicted
epoch (its plan.json's schedule, the same on every rank) is long trains
ceil(S / epoch) + 1 epochs a pass, at least `MIN_EPOCHS` and at most
`--epochs`: still the median of 3 or more steady epochs a pass, over every
pass, where an epoch of seconds is long beside the jitter the passes'
medians smooth. Only plans predicted above S / 5 seconds run fewer: in the
extended grid GCNII x4 on the 32,000-vertex SBM at width 512 (2.6-4.5 s
predicted a plan), whose three cases were about 80% of the grid's epochs.

The emulated cluster starts it on every host (runner.run_plans).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

from gnnc import api
from gnnc.inspect_plan import predicted_epoch
from gnnc.runtime.distributed import DistJob
from gnnc.runtime.launch import DistConfig, end_joined_rank, join_torchrun
from gnnc.host import use_huge_pages
from gnnc.runtime.metrics import forget_peak_rss
from gnnc.runtime.rank_worker import worker
from gnnc.runtime.train import TrainConfig


MIN_EPOCHS = 4  # a warm-up and 3 timed epochs per pass


def epochs_for(predicted_s: float | None, epochs: int, pass_seconds: float | None) -> int:
    """Epochs a pass trains a plan predicted to take `predicted_s` per epoch: ceil(pass_seconds / predicted_s) + 1,
    between MIN_EPOCHS and `epochs` (all `epochs` without a prediction or `pass_seconds`)."""
    if not pass_seconds or not predicted_s or predicted_s <= 0:
        return epochs
    return max(min(MIN_EPOCHS, epochs), min(epochs, math.ceil(pass_seconds / predicted_s) + 1))


def pass_order(plans: int, passes: int) -> list[int]:
    """The plans' indices in the order they train: every other pass reversed."""
    order: list[int] = []
    for p in range(passes):
        order += list(range(plans))[::-1 if p % 2 else 1]
    return order


def combined(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One plan's summary over its passes: the last pass's figures, its epoch and evaluation times the medians
    of every pass's steady epochs (each pass's first epoch is a warm-up), its peak memory the largest."""
    steady = [r for s in summaries for r in (s["history"][1:] or s["history"])]
    out = {k: v for k, v in summaries[-1].items() if k not in ("logits", "history")}
    out.update(epoch_time_s=statistics.median(r["time_s"] for r in steady),
               eval_time_s=statistics.median(r.get("eval_time_s", 0.0) for r in steady),
               peak_rss_bytes=max(s["peak_rss_bytes"] for s in summaries), passes=len(summaries),
               epochs_timed=len(steady))
    return out


def steady_epoch(summary: dict[str, Any]) -> float:
    """One pass's measured epoch of a plan: the median of its steady epochs' step plus evaluation."""
    steady = summary["history"][1:] or summary["history"]
    return statistics.median(r["time_s"] + r.get("eval_time_s", 0.0) for r in steady)


def far_behind(first_pass: list[float], ratio: float | None) -> set[int]:
    """The plans (indices) whose first-pass epoch is `ratio` or more times the fastest's; never the first plan
    (the planner's choice). None or 0: none."""
    if not ratio or not first_pass:
        return set()
    fastest = min(first_pass)
    return {k for k, t in enumerate(first_pass) if k > 0 and t >= ratio * fastest}


def train_each(cfg: DistConfig, jobs: list[tuple[str, DistJob]], passes: int = 1,
               drop_after_first: float | None = None) -> list[dict[str, Any]] | None:
    """Every plan's training run, `passes` times (`pass_order`), less the plans `far_behind` after the first pass;
    rank 0 returns their summaries (`combined`, in the order of `jobs`; the others None)."""
    runs: list[list[dict[str, Any]]] = [[] for _ in jobs]
    dropped: set[int] = set()
    for n, k in enumerate(pass_order(len(jobs), passes)):
        if n == len(jobs) and drop_after_first:  # the first pass is done: rank 0 says which plans stop
            decided = [sorted(far_behind([steady_epoch(r[0]) for r in runs], drop_after_first))
                       if cfg.rank == 0 else None]
            if cfg.world_size > 1:
                import torch.distributed as dist  # deferred: the group is up inside join_torchrun

                dist.broadcast_object_list(decided, src=0)
            dropped = set(decided[0])
        if k in dropped:
            continue
        name, job = jobs[k]
        forget_peak_rss()
        summary = worker(cfg, job)
        if summary is not None:
            runs[k].append({"plan": name, **summary.to_json(), "history": summary.history})
    return [combined(r) for r in runs] if cfg.rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    use_huge_pages()  # as `gnnc run` allocates (gnnc.host)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--passes", type=int, default=1, help="train the plans this many times, every other pass "
                    "in reverse order; each plan's times are the medians over all passes")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a collective waits for its peers")
    ap.add_argument("--drop-after-first", type=float, default=None, metavar="R",
                    help="after the first pass, stop training plans measured R or more times the fastest "
                    "(never the first plan)")
    ap.add_argument("--pass-seconds", type=float, default=None, metavar="S",
                    help="a plan predicted to take long trains ceil(S / its epoch) + 1 epochs a pass (at least "
                    f"{MIN_EPOCHS}, at most --epochs)")
    ap.add_argument("plans", nargs="+")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error(f"--passes must be at least 1, not {args.passes}")
    jobs = []
    for path in args.plans:
        plan = api.Plan.load(path)
        epochs = epochs_for(predicted_epoch(plan)["epoch_time_s"], args.epochs, args.pass_seconds)
        cfg = TrainConfig.resolve(plan.program, epochs=epochs, seed=0, progress=False)
        jobs.append((path, DistJob(str(plan.program), str(plan.shard_dir), cfg)))
    results = join_torchrun(train_each, jobs, args.passes, args.drop_after_first, timeout_s=args.timeout)
    if results is not None:
        for row in results:
            print(json.dumps(row, sort_keys=True), flush=True)
    sys.stdout.flush()
    end_joined_rank(0)


if __name__ == "__main__":
    main()
