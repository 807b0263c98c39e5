"""NeutronStar's chunks (issue 38 item 4): exposed halo time per epoch, whole halo against chunks, on the emulated
cluster.

    python benchmarks/cluster/chunk_overlap.py [--bandwidths 400mbit 3600mbit] [--models sage gat] [--epochs 5]

Why this exists: an overlapped halo runs its remote edges either once every peer's rows are in (`chunked=false`)
or on each peer's rows as they arrive, in ring order (`halo[chunked=true]`, gnnc.plan.schedule_attrs). What that
changes is the time a rank is blocked waiting for the exchange, forward and backward: every rank's
CommStats seconds of its halo ops (EpochRecord.seconds_by_op, the time spent in wait(), which the load of the
machine moves less than the epoch). For each model it compiles DepComm on every layer for 4 workers three ways
(`schedule{chunked=off}`, `schedule{chunked=on}` and the schedule pass's own choice, whose per-layer decision is
printed), trains the first two in one torchrun job on 4 emulated hosts, in alternating passes (run_plans.py's
protocol), and prints per plan the median over steady epochs of the mean over ranks of the halo's blocked
seconds, its largest rank's, and the epoch. The profile is fixed (algorithm4.py's measured rates at 4 workers,
the link the case's), not probed, to keep a run to a few minutes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

GRAPH = "sbm:n=8000,blocks=8,deg=10,intra=0.5,features=128,classes=8,seed=0"
MEASURED = {"gemm_rate": 35e9, "spmm_rate": 1.4e9, "latency": 1.6e-3}  # algorithm4.py's 4-worker figures
SCHEDULES = {"whole": "schedule{chunked=off}", "chunked": "schedule{chunked=on}"}


def worker_main(args: argparse.Namespace) -> int:
    """One rank: train every plan `passes` times in alternating order, each pass's records to its own file."""
    from gnnc import api
    from gnnc.runtime.distributed import DistJob
    from gnnc.runtime.launch import end_joined_rank, join_torchrun
    from gnnc.runtime.rank_worker import worker
    from gnnc.runtime.train import TrainConfig
    from run_plans import pass_order

    jobs = []
    for path in args.plans:
        plan = api.Plan.load(path)
        cfg = TrainConfig.resolve(plan.program, epochs=args.epochs, seed=0, progress=False)
        jobs.append((path, str(plan.program), str(plan.shard_dir), cfg))

    def run(dist_cfg):
        for n, k in enumerate(pass_order(len(jobs), args.passes)):
            path, ir, shards, cfg = jobs[k]
            worker(dist_cfg, DistJob(ir, shards, cfg, metrics_path=f"{path}/metrics-{n}.jsonl"))

    join_torchrun(run, timeout_s=300.0)
    end_joined_rank(0)


def blocked(plan_dir: Path) -> dict[str, float]:
    """Per steady epoch (each pass's first left out) the mean and the largest over ranks of the seconds the
    halo ops blocked (forward and backward), and the slowest rank's epoch; medians over the epochs."""
    mean, most, epoch = [], [], []
    for f in sorted(plan_dir.glob("metrics-*.jsonl")):
        by_epoch: dict[int, list[dict]] = {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "minibatch":
                by_epoch.setdefault(r["epoch"], []).append(r)
        for e in sorted(by_epoch)[1:]:
            halo = [sum(s for k, s in r["seconds_by_op"].items() if k.split("/")[1] == "halo") for r in by_epoch[e]]
            mean.append(sum(halo) / len(halo))
            most.append(max(halo))
            epoch.append(max(r["epoch_s"] for r in by_epoch[e]))
    return {"halo_blocked_mean_s": statistics.median(mean), "halo_blocked_max_s": statistics.median(most),
            "epoch_s": statistics.median(epoch), "epochs": len(mean)}


def predicted_blocked(model, graph, profile, passes: list[str]) -> dict[str, float]:
    """The cost model's blocked halo seconds per epoch (module docstring of `priced_windows`): the mean over workers
    and the largest."""
    import numpy as np

    from gnnc.passes.cost.evaluation import evaluate
    from gnnc.passes.cost.overlap import exposed_communication

    total = sum(np.asarray(evaluate(exposed_communication(exch, held, remote, chunked), inputs, extra),
                           dtype=np.float64)
                for _, exch, held, remote, chunked, inputs, extra in priced_windows(model, graph, profile, passes))
    return {"halo_blocked_mean_s": float(np.mean(total)), "halo_blocked_max_s": float(np.max(total))}


def priced_windows(model, graph, profile, passes: list[str]) -> list[tuple]:
    """The overlapped halo windows (training: forward and backward) of a plan compiled with `passes`, as the
    schedule pass priced its chosen options: (graph layer, exch, held, remote, chunked, inputs, extra), each
    window's terms symbolic, to evaluate on the schedule pass's inputs per worker (`predicted_blocked`: per worker
    the sum over its windows of their exposed communication, gnnc.passes.cost.overlap.exposed_communication, as
    `blocked` measures them). A layer's forward window comes before its backward one.

    The windows' terms are read where the formulas build them: overlap_window is wrapped for the compile, which
    prices every alternative; the chosen segment options select the windows priced with them."""
    from gnnc import api
    from gnnc.passes import schedule as schedule_pass
    from gnnc.passes.cost import neutronstar, registry

    windows: list[tuple] = []
    per_segment: dict[tuple[int, int], dict] = {}
    wrapped, choose = neutronstar.overlap_window, schedule_pass.choose_segment

    def record(exch, held, remote, chunked, calls):
        windows.append((exch, held, remote, chunked))
        return wrapped(exch, held, remote, chunked, calls)

    def priced_choice(program, seg, priced, extra, opts):
        windows.clear()
        # formulas built before (cached) would not call the wrapper
        neutronstar._hybrid_layer.cache_clear()
        registry._built_segment_cost.cache_clear()
        out = choose(program, seg, priced, extra, opts)
        got: dict[bool, list[tuple]] = {}
        for exch, held, remote, chunked in windows:
            got.setdefault(chunked, []).append((seg.start, exch, held, remote, chunked, priced.inputs, extra))
        per_segment[(seg.start, seg.end)] = {**got, "chosen": out.options.get("chunked", False)}
        return out

    neutronstar.overlap_window, schedule_pass.choose_segment = record, priced_choice
    try:
        api.compile(model, graph, workers=4, strategy="depcomm", partition="metis", cluster=profile, passes=passes)
    finally:
        neutronstar.overlap_window, schedule_pass.choose_segment = wrapped, choose
    return [w for v in per_segment.values() for w in v.get(v["chosen"], [])]


def emulated_profile(bandwidth: str):
    """neutronstar-ecs at `bandwidth` both ways for 4 workers, with the op rates measured for these cases."""
    from emulated import parse_rate
    from gnnc.cluster import preset

    rate = parse_rate(bandwidth) / 8
    return dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=rate, intra_bandwidth=rate, workers=4,
                               **MEASURED)


def run_on_cluster(script: str, worker_args: list[str], dirs: list[Path], bandwidth: str,
                   label: str) -> dict | None:
    """`script --worker worker_args dirs` on 4 emulated hosts at `bandwidth` (one rank each): the run's load
    average before and after and its seconds, or None (the failure printed) when a rank failed."""
    from emulated import EmulatedCluster

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    t0 = time.perf_counter()
    with EmulatedCluster(4, bandwidth) as cluster:
        results = cluster.run_torchrun([script, "--worker", *worker_args, *map(str, dirs)], 1, timeout_s=900,
                                       run_id=f"gnnc-{label}-{os.getpid()}")
    if results[0][0] != 0:
        print(f"{label} {bandwidth}: the run failed: {results[0][2][-3000:]}", file=sys.stderr)
        return None
    return {"load_before": load, "load_after": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
            "run_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidths", nargs="*", default=["400mbit", "3600mbit"])
    ap.add_argument("--models", nargs="*", default=["sage", "gat"])
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--predict-only", action="store_true", help="print the cost model's blocked halo time, run nothing")
    ap.add_argument("--dispatch-us", default=None, metavar="FWD,BWD",
                    help="the profile's dispatch per equation (`call`, what gnnc probe measures), in us; default: "
                         "the assumed 10 us (gnnc.cluster.CALL_OVERHEAD_S)")
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
    from gnnc.plan.schedule_attrs import exchange_schedule

    graph = api.load_graph(args.graph)
    for bandwidth in args.bandwidths:
        profile = emulated_profile(bandwidth)
        if args.dispatch_us:
            from gnnc.cluster import OpRate

            fwd, bwd = (float(x) * 1e-6 for x in args.dispatch_us.split(","))
            profile = dataclasses.replace(profile, op_rates=(*(r for r in profile.op_rates if r.op != "call"),
                                                             OpRate("call", fwd, bwd)))
        for name in args.models:
            model = api.load_model(ROOT / "examples" / f"{name}.gnn")
            auto = api.compile(model, graph, workers=4, strategy="depcomm", partition="metis", cluster=profile)
            chosen = [[exchange_schedule(e).chunked for e in layer.eqns if e.op == "halo"]
                      for layer in auto.program.graph_layers()]
            predicted = {key: predicted_blocked(model, graph, profile,
                                                DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [sched])
                         for key, sched in SCHEDULES.items()}
            if args.predict_only:
                print(json.dumps({"model": name, "bandwidth": bandwidth, "auto_chunked": chosen,
                                  "predicted": predicted}), flush=True)
                continue
            with tempfile.TemporaryDirectory(prefix="gnnc-chunks-") as tmp:
                dirs = []
                for key, sched in SCHEDULES.items():
                    plan = api.compile(model, graph, workers=4, strategy="depcomm", partition="metis",
                                       cluster=profile, passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [sched])
                    halos = [exchange_schedule(e) for layer in plan.program.graph_layers() for e in layer.eqns
                             if e.op == "halo"]
                    assert all(h.split and h.chunked == (key == "chunked") for h in halos), (key, halos)
                    plan.save(Path(tmp) / key)
                    dirs.append(Path(tmp) / key)
                ran = run_on_cluster(__file__, ["--epochs", str(args.epochs), "--passes", str(args.passes)], dirs,
                                     bandwidth, f"chunks-{name}")
                if ran is None:
                    return 1
                row = {"model": name, "bandwidth": bandwidth, "graph": args.graph, "auto_chunked": chosen, **ran}
                for key, d in zip(SCHEDULES, dirs):
                    row[key] = {**blocked(d), "predicted": predicted[key]}
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
