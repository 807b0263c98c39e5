"""G3's inter-layer pipeline (issue 38 item 6): exposed halo time per epoch, bins without and with the pipeline, on
the emulated cluster.

    python benchmarks/cluster/g3_pipeline.py [--bandwidths 400mbit 3600mbit] [--models sage gat] [--bins 4]
    python benchmarks/cluster/g3_pipeline.py --predict-only [--dispatch-us 127,282] [--latency-us 1400]

Why this exists: with `schedule{pipeline=on}` a binned layer's bins send their rows of the next layer's halos as
each bin ends, and the next layer runs each of its bins once the peers' bins it reads have arrived
(gnnc.runtime.bins); without it the next layer's halo is posted once the whole layer (and the dense layers after
it) is done, and its bins that read remote rows wait for all of it. What changes is the time a rank is blocked in
its halo ops, forward and backward (the same measure as chunk_overlap.py: EpochRecord.seconds_by_op, mean over
ranks and the largest rank's, medians over steady epochs). The cases are chunk_overlap.py's (its graph, profile,
DepComm on both layers, METIS, 4 emulated hosts on this machine's cores, alternating passes); both plans run every
graph layer in `--bins` bins, so the difference is the pipeline alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from chunk_overlap import GRAPH, blocked, emulated_profile, run_on_cluster, worker_main


def blocked_by_layer(plan_dir: Path) -> dict[str, float]:
    """Per graph layer (the halo ops' label), the median over steady epochs of the mean over ranks of the seconds
    its halo ops blocked: the pipeline changes the second layer's exchange only."""
    per: dict[str, list[float]] = {}
    for f in sorted(plan_dir.glob("metrics-*.jsonl")):
        by_epoch: dict[int, list[dict]] = {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") != "minibatch":
                by_epoch.setdefault(r["epoch"], []).append(r)
        for e in sorted(by_epoch)[1:]:
            labels = {k.split("/")[0] for r in by_epoch[e] for k in r["seconds_by_op"] if k.split("/")[1] == "halo"}
            for label in labels:
                s = [sum(v for k, v in r["seconds_by_op"].items() if k.split("/")[:2] == [label, "halo"])
                     for r in by_epoch[e]]
                per.setdefault(label, []).append(sum(s) / len(s))
    return {label: statistics.median(v) for label, v in sorted(per.items())}


def predicted(api, model, graph, profile, bins: int, name: str, bandwidth: str) -> dict:
    """The schedule pass's pricing of the pipeline (`pipeline=auto`): per candidate layer its time whole and
    pipelined and the decision, and the predicted epoch of the plans with the pipeline off and on."""
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

    out: dict = {"model": name, "bandwidth": bandwidth, "bins": bins, "latency_s": profile.latency,
                 "call_s": [r for r in profile.op_rates if r.op == "call"][0].forward if any(
                     r.op == "call" for r in profile.op_rates) else None}
    for key in ("off", "on", "auto"):
        plan = api.compile(model, graph, workers=4, strategy="depcomm", partition="metis", cluster=profile,
                           passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1]
                           + [f"schedule{{bins={bins} pipeline={key}}}"])
        report = plan.meta.schedule_report
        out[f"epoch_{key}_s"] = report["predicted_time_s"]
        if key == "auto":
            out["auto"] = report.get("pipeline", [])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidths", nargs="*", default=["400mbit", "3600mbit"])
    ap.add_argument("--models", nargs="*", default=["sage", "gat"])
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--bins", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--predict-only", action="store_true",
                    help="print what the schedule pass prices and decides under pipeline=auto, run nothing")
    ap.add_argument("--dispatch-us", default=None, metavar="FWD,BWD",
                    help="the profile's dispatch per equation (`call`), in us; default: the assumed 10 us")
    ap.add_argument("--latency-us", type=float, default=None,
                    help="the profile's seconds to start a message, in us; default: the profile's")
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
    from gnnc.plan.bins import pipelined

    schedules = {"bins": f"schedule{{bins={args.bins}}}", "pipelined": f"schedule{{bins={args.bins} pipeline=on}}"}
    graph = api.load_graph(args.graph)
    for bandwidth in args.bandwidths:
        profile = emulated_profile(bandwidth)
        if args.dispatch_us:
            from gnnc.cluster import OpRate

            fwd, bwd = (float(x) * 1e-6 for x in args.dispatch_us.split(","))
            profile = dataclasses.replace(profile, op_rates=(*(r for r in profile.op_rates if r.op != "call"),
                                                             OpRate("call", fwd, bwd)))
        if args.latency_us is not None:
            profile = dataclasses.replace(profile, latency=args.latency_us * 1e-6)
        for name in args.models:
            model = api.load_model(ROOT / "examples" / f"{name}.gnn")
            if args.predict_only:
                print(json.dumps(predicted(api, model, graph, profile, args.bins, name, bandwidth)), flush=True)
                continue
            with tempfile.TemporaryDirectory(prefix="gnnc-g3pipe-") as tmp:
                dirs = []
                for key, sched in schedules.items():
                    plan = api.compile(model, graph, workers=4, strategy="depcomm", partition="metis",
                                       cluster=profile, passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [sched])
                    piped = sum(pipelined(e) for layer in plan.program.graph_layers() for e in layer.eqns)
                    assert (piped > 0) == (key == "pipelined"), (key, piped)
                    plan.save(Path(tmp) / key)
                    dirs.append(Path(tmp) / key)
                ran = run_on_cluster(__file__, ["--epochs", str(args.epochs), "--passes", str(args.passes)], dirs,
                                     bandwidth, f"g3pipe-{name}")
                if ran is None:
                    return 1
                row = {"model": name, "bandwidth": bandwidth, "graph": args.graph, "bins_per_layer": args.bins,
                       **ran}
                for key, d in zip(schedules, dirs):
                    row[key] = {**blocked(d), "halo_blocked_mean_s_by_layer": blocked_by_layer(d)}
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
