"""The ranks' arrival spread at each halo exchange (issue 38 item 4's missing term), on the emulated cluster.

    python benchmarks/cluster/arrival_spread.py [--bandwidths 400mbit 3600mbit] [--models sage gat] [--epochs 4]

Why this exists: the cost model prices an overlapped halo's exposed communication as if every rank posted its
exchange at once (gnnc.passes.cost.overlap.exposed_communication: max(0, exch - held)), and on the loaded emulated
cluster the blocked time measured 2-6x that (benchmarks/RESULTS-seeds.md, "The pricing, measured"). A rank blocked
in an exchange waits for the peers that post after it: this measures by how much. Each rank records the wall-clock
time (one clock: the emulated hosts share the machine) at which it posts every halo exchange, forward and backward
(gnnc.runtime.comm's _HaloExchange.forward_start / backward_start, wrapped in the worker); the n-th exchange of a
label and direction is the same exchange on every rank (the same ops in the same order). Per exchange: the spread
(last rank's post less the first's) and each rank's lateness behind the last (the wait no overlap can hide, on top
of the model's); summed over an epoch's exchanges, the mean over ranks, median over steady epochs, beside the
measured blocked halo time and the model's prediction (chunk_overlap.py's, the same cases: DepComm, whole halo).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chunk_overlap import GRAPH, blocked, emulated_profile, predicted_blocked, priced_windows, run_on_cluster

SCHEDULE = "schedule{chunked=off}"


def worker_main(args: argparse.Namespace) -> int:
    """One rank: train the plan, recording when it posts each halo exchange; the log to the plan's folder."""
    import torch.distributed as dist

    from gnnc import api
    from gnnc.runtime import comm
    from gnnc.runtime.distributed import DistJob
    from gnnc.runtime.launch import end_joined_rank, join_torchrun
    from gnnc.runtime.rank_worker import worker
    from gnnc.runtime.train import TrainConfig

    log: list[tuple[float, str, str]] = []
    fwd, bwd = comm._HaloExchange.forward_start, comm._HaloExchange.backward_start

    def forward_start(self, x):
        log.append((time.time(), self.label, "fwd"))
        return fwd(self, x)

    def backward_start(self, grad):
        log.append((time.time(), self.label, "bwd"))
        return bwd(self, grad)

    comm._HaloExchange.forward_start, comm._HaloExchange.backward_start = forward_start, backward_start
    path = args.plans[0]
    plan = api.Plan.load(path)
    cfg = TrainConfig.resolve(plan.program, epochs=args.epochs, seed=0, progress=False)

    def run(dist_cfg):
        worker(dist_cfg, DistJob(str(plan.program), str(plan.shard_dir), cfg, metrics_path=f"{path}/metrics-0.jsonl"))
        Path(f"{path}/arrivals-{dist.get_rank()}.json").write_text(json.dumps(log))

    join_torchrun(run, timeout_s=300.0)
    end_joined_rank(0)


def training_steps(log: list, halos: int) -> list[list[int]]:
    """The indices of each training step's exchanges in a rank's log: each run of backward posts and the `halos`
    forward posts just before it (an evaluation's forward posts, between steps, left out)."""
    steps, k = [], 0
    while k < len(log):
        if log[k][2] == "bwd":
            end = k
            while end < len(log) and log[end][2] == "bwd":
                end += 1
            steps.append(list(range(k - halos, end)))
            k = end
        else:
            k += 1
    return steps


def windows_late(plan_dir: Path, world: int, halos: int) -> list[dict[tuple[str, str], list[float]]]:
    """Per steady training step, per (label, direction): each rank's lateness behind the last rank at the first
    post of that label and direction (where the model's window for that layer and direction starts)."""
    logs = [json.loads((plan_dir / f"arrivals-{r}.json").read_text()) for r in range(world)]
    out = []
    for step in training_steps(logs[0], halos)[1:]:
        late: dict[tuple[str, str], list[float]] = {}
        for k in step:
            key = (logs[0][k][1], logs[0][k][2])
            if key not in late:
                t = [g[k][0] for g in logs]
                late[key] = [max(t) - x for x in t]
        out.append(late)
    return out


def priced_with_lateness(windows: list[tuple], layer_names: list[str], late: list[dict], world: int
                         ) -> dict[str, float]:
    """The model's blocked halo time with each rank's measured lateness in its windows
    (gnnc.passes.cost.overlap.exposed_communication's `late`): per step, the mean over ranks of the sum over the
    windows; medians over the steps. A layer's windows come forward then backward (chunk_overlap.priced_windows)."""
    import numpy as np
    import sympy

    from gnnc.passes.cost.evaluation import evaluate
    from gnnc.passes.cost.overlap import exposed_communication
    from gnnc.passes.cost.symbols import P

    terms, seen = [], {}
    for layer, exch, held, remote, chunked, inputs, extra in windows:
        direction = "bwd" if seen.get(layer) else "fwd"
        seen[layer] = True
        arrays = [np.asarray(evaluate(x, inputs, extra), dtype=np.float64) * np.ones(world)
                  for x in (exch, held, remote)]
        terms.append(((layer_names[layer], direction), chunked, arrays))
    totals = []
    for step in late:
        per_rank = []
        for r in range(world):
            s = 0.0
            for key, chunked, (exch, held, remote) in terms:
                expr = exposed_communication(sympy.Float(exch[r]), sympy.Float(held[r]), sympy.Float(remote[r]),
                                             chunked, sympy.Float(step.get(key, [0.0] * world)[r]))
                s += float(expr.subs(P, world))
            per_rank.append(s)
        totals.append(sum(per_rank) / world)
    return {"halo_blocked_mean_s": statistics.median(totals)}


def spread(plan_dir: Path, world: int, halos: int) -> dict[str, float]:
    """Per training step (steady: the first left out): the sum over its exchanges of the spread (the last rank's
    post less the first's), and the mean over ranks of the summed lateness behind the last rank to post;
    medians over the steps."""
    logs = [json.loads((plan_dir / f"arrivals-{r}.json").read_text()) for r in range(world)]
    steps = [training_steps(g, halos) for g in logs]
    assert len({len(s) for s in steps}) == 1 and all(s == steps[0] for s in steps), [len(s) for s in steps]
    spreads, late = [], []
    for step in steps[0][1:]:
        s, lat = 0.0, [0.0] * world
        for k in step:
            assert len({(g[k][1], g[k][2]) for g in logs}) == 1
            t = [g[k][0] for g in logs]
            s += max(t) - min(t)
            for r in range(world):
                lat[r] += max(t) - t[r]
        spreads.append(s)
        late.append(sum(lat) / world)
    return {"spread_sum_s": statistics.median(spreads), "lateness_mean_s": statistics.median(late),
            "exchanges_per_step": len(steps[0][0]), "steps": len(spreads)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidths", nargs="*", default=["400mbit", "3600mbit"])
    ap.add_argument("--models", nargs="*", default=["sage", "gat"])
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("plans", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    from emulated import refuse_without_requirements
    from runner import ROOT

    if refuse_without_requirements():
        return 2
    from gnnc import api
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

    graph = api.load_graph(args.graph)
    passes = DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [SCHEDULE]
    for bandwidth in args.bandwidths:
        profile = emulated_profile(bandwidth)
        for name in args.models:
            model = api.load_model(ROOT / "examples" / f"{name}.gnn")
            predicted = predicted_blocked(model, graph, profile, passes)
            windows = priced_windows(model, graph, profile, passes)
            with tempfile.TemporaryDirectory(prefix="gnnc-spread-") as tmp:
                plan = api.compile(model, graph, workers=4, strategy="depcomm", partition="metis", cluster=profile,
                                   passes=passes)
                plan.save(Path(tmp) / "whole")
                halos = sum(e.op == "halo" for layer in plan.program.graph_layers() for e in layer.eqns)
                ran = run_on_cluster(__file__, ["--epochs", str(args.epochs)], [Path(tmp) / "whole"], bandwidth,
                                     f"spread-{name}")
                if ran is None:
                    return 1
                row = {"model": name, "bandwidth": bandwidth, **ran,
                       "measured": blocked(Path(tmp) / "whole"), "predicted": predicted,
                       **spread(Path(tmp) / "whole", 4, halos)}
                names = [layer.name for layer in plan.program.graph_layers()]
                row["predicted_with_lateness"] = priced_with_lateness(
                    windows, names, windows_late(Path(tmp) / "whole", 4, halos), 4)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
