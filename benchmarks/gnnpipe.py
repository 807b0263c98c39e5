"""GNNPipe's claim on one machine: a deep GCNII trained by the pipeline keeps the exact run's accuracy with a
fraction of graph parallelism's traffic, and the bytes it sends are the plan's prediction.

    python benchmarks/gnnpipe.py                     # 32-layer GCNII, Reddit-like cut, 4 processes, 100 epochs
    python benchmarks/gnnpipe.py --epochs 200 --json
    python benchmarks/gnnpipe.py --ablation --epochs 40   # GNNPipe section 4.5's tricks, one at a time (below)

The graph is a stochastic block model whose cut over 4 METIS parts is Reddit's
in GNNPipe's Table 4 (sum_i |B_i| / N = 2.61: nearly every vertex has
neighbours in every other part). It trains `examples/gcnii.gnn` with the same
epochs in one process (exact) and with `--strategy pipeline --approximate`
on 4 gloo processes, and measures depcomm's training-step bytes on 4
processes (a short run: its bytes are the same every epoch). It prints the
test accuracies, the bytes per epoch measured against the prediction (the
training step; an epoch that refreshes the history adds the refresh's), and
each stage's bubble (its time blocked in pipeline send/recv over its epoch).

`--ablation` trains the same case with GNNPipe's tricks turned off one at a
time (its section 4.5 ablates chunk shuffling, historical gradients and the
fixed history; gnnc never sends gradients into the history, so that trick is
always on, and the third variant here is the hybrid with graph parallelism,
2 stages of 2 workers, instead of 4 stages of 1): the published pipeline
(every epoch starts from the history of the last refresh, every alpha = 23
epochs, chunks shuffled), the previous epoch's history instead
(`history_update=chunk`, gnnc's earlier rule), chunks in id order
(`shuffle_chunks=false`), the history refreshed every epoch (alpha = 1), and
the hybrid with either history;
each row: test accuracy at the best validation epoch and the measured bytes
per epoch (step, and a refresh epoch's), beside the exact one-process run.
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

GRAPH = "sbm:n=3000,blocks=8,deg=14,intra=0.5,features=64,classes=8,seed=0"


def remote_ratio(graph_spec: str, parts: int) -> float:
    """sum_i |B_i| / N over `parts` METIS parts (the remote in-neighbours each layer of graph parallelism fetches)."""
    from gnnc import api
    from gnnc.plan.rows import remote_in_neighbours

    graph = api.load_graph(graph_spec)
    assignment = api.partition_vertices(graph, parts, "metis")
    remote = remote_in_neighbours(graph, assignment, parts, ["self_loops"])
    return sum(len(b) for b in remote) / graph.num_nodes


def predicted(graph_spec: str, layers: int, nproc: int) -> dict:
    """The plans' predictions: the pipeline's bytes per training step and per refresh, depcomm's per step."""
    from gnnc import api

    graph = api.load_graph(graph_spec)
    model = api.load_model(ROOT / "examples" / "gcnii.gnn", layers=layers)
    pipe = api.compile(model, graph, workers=nproc, strategy="pipeline", approximate=True)
    depcomm = api.compile(model, graph, workers=nproc, strategy="depcomm")
    return {"pipeline_step": pipe.meta.predicted_bytes_per_step, "pipeline_refresh": pipe.meta.pipeline["refresh_bytes"],
            "pipeline": pipe.meta.pipeline, "depcomm_step": depcomm.meta.predicted_bytes_per_step}


def run(args: list[str], epochs: int, seed: int = 0) -> tuple[dict, list[dict]]:
    """`gnnc run ARGS` (one thread per process) with `seed` (initial weights, dropout, chunk order; the graph's own
    seed is its spec's): its --json summary and every rank's metrics records; ({"error": the last line of stderr},
    []) when it fails."""
    with tempfile.TemporaryDirectory() as d:
        metrics = Path(d) / "m.jsonl"
        cmd = [sys.executable, "-m", "gnnc", "run", *args, "--epochs", str(epochs), "--seed", str(seed),
               "--metrics", str(metrics), "--json", "--no-progress", "--timeout", "600"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if r.returncode != 0:
            return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}, []
        return json.loads(r.stdout.strip().splitlines()[-1]), [json.loads(x) for x in metrics.read_text().splitlines()]


def per_epoch(records: list[dict]) -> list[dict]:
    """Per epoch over ranks: bytes sent, the pipeline's bytes by kind, each rank's bubble fraction."""
    epochs: dict[int, list[dict]] = {}
    for rec in records:
        epochs.setdefault(rec["epoch"], []).append(rec)
    out = []
    for epoch in sorted(epochs):
        kinds = {"pipe": 0, "refresh": 0, "other": 0}
        for rec in epochs[epoch]:
            for key, nbytes in rec["bytes_by_op"].items():
                label = key.split("/")[0]
                kinds[label if label in kinds else "other"] += nbytes
        out.append({"epoch": epoch, "bytes": sum(r["bytes_sent"] for r in epochs[epoch]), **kinds,
                    "bubble": [r.get("bubble_fraction", 0.0) for r in sorted(epochs[epoch], key=lambda r: r["rank"])]})
    return out


# (name, stage-pipeline options, workers per stage): GNNPipe's tricks off one at a time (module docstring)
ABLATION = [
    ("published: fixed history, alpha 23, shuffled", "", 1),
    ("per-chunk history update", "history_update=chunk", 1),
    ("no chunk shuffling", "shuffle_chunks=false", 1),
    ("history refreshed every epoch (alpha 1)", "history_every=1", 1),
    ("hybrid: 2 stages of 2, fixed history", "", 2),
    ("hybrid: 2 stages of 2, per-chunk update", "history_update=chunk", 2),
]


def ablation_passes(options: str, groups: int) -> str:
    """The compile's pass pipeline with the pipeline forced and stage-pipeline's `options`."""
    from gnnc.passes.pipelines import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

    stage = f"stage-pipeline{{pipeline_groups={groups} {options}}}".replace(" }", "}")
    rest = [stage if p == "stage-pipeline" else "choose-strategy{strategy=pipeline}" if p == "choose-strategy" else p
            for p in DISTRIBUTED_PIPELINE]
    return ",".join([*DEFAULT_PIPELINE, *rest])


def ablation(args, common: list[str]) -> dict:
    """Every ABLATION row trained for `args.epochs` on `args.nproc` processes, and the exact run."""
    rows = []
    single, _ = run(common, args.epochs, args.seed) if not args.rows else ({}, [])
    print(f"exact, one process: test accuracy {single.get('test_acc')}", flush=True)
    for k, (name, options, groups) in enumerate(ABLATION):
        if args.rows and k not in args.rows:
            continue
        with tempfile.TemporaryDirectory() as d:
            plan = Path(d) / "plan"
            c = subprocess.run([sys.executable, "-m", "gnnc", "compile", *common, "--workers", str(args.nproc),
                                "--approximate", "--passes", ablation_passes(options, groups), "-o", str(plan)],
                               capture_output=True, text=True, cwd=ROOT)
            if c.returncode != 0:
                rows.append({"name": name, "error": (c.stderr.strip().splitlines() or ["?"])[-1]})
                continue
            got, records = run([str(plan), "--nproc", str(args.nproc)], args.epochs, args.seed)
        epochs = per_epoch(records)
        every = {int(e["bytes"]) for e in epochs}
        rows.append({"name": name, "options": options, "groups": groups, "test_acc": got.get("test_acc"),
                     "error": got.get("error"), "bytes_per_epoch": sorted(every),
                     "epoch_s": got.get("epoch_time_s")})
        print(f"{name}: test accuracy {got.get('test_acc')}, bytes per epoch {sorted(every)}"
              + (f" ({got['error']})" if "error" in got else ""), flush=True)
    return {"graph": args.graph, "layers": args.layers, "epochs": args.epochs, "nproc": args.nproc, "seed": args.seed,
            "single_test_acc": single.get("test_acc"), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default=GRAPH)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="every run's --seed (the graph stays the spec's)")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--ablation", action="store_true", help="GNNPipe's tricks off one at a time (module docstring)")
    ap.add_argument("--rows", type=lambda t: [int(x) for x in t.split(",")], default=[],
                    help="with --ablation: only these rows of ABLATION (0-based, comma-separated), no exact run")
    add_device_argument(ap)
    args = ap.parse_args()
    device = resolve_device_or_exit(args.device)  # cuda: each process takes its own GPU (NCCL)
    model = str(ROOT / "examples" / "gcnii.gnn")
    common = [model, "--graph", args.graph, "--set", f"layers={args.layers}", "--device", device]
    if args.ablation:
        result = ablation(args, common)
        if args.json:
            print(json.dumps(result, sort_keys=True))
        return 1 if any(r.get("error") for r in result["rows"]) else 0
    ratio = remote_ratio(args.graph, args.nproc)
    pred = predicted(args.graph, args.layers, args.nproc)
    print(f"{args.graph}: sum|B_i|/N = {ratio:.3f} on {args.nproc} METIS parts; GCNII, {args.layers} layers, "
          f"{args.epochs} epochs", flush=True)
    single, _ = run(common, args.epochs, args.seed)
    pipe, records = run([*common, "--nproc", str(args.nproc), "--strategy", "pipeline", "--approximate"], args.epochs,
                        args.seed)
    depcomm, _ = run([*common, "--nproc", str(args.nproc), "--strategy", "depcomm"], 2, args.seed)
    step = sum(pred["pipeline_step"].values())
    refresh = sum(pred["pipeline_refresh"].values())
    every = pred["pipeline"]["history_every"]
    epochs = per_epoch(records)
    mismatched = [e["epoch"] for e in epochs if e["bytes"] != step + (refresh if e["epoch"] % every == 0 else 0)]
    steady = [e for e in epochs if e["epoch"] % every] or epochs
    bubble = [statistics.median(e["bubble"][r] for e in steady) for r in range(args.nproc)] if steady else []
    result = {
        "graph": args.graph, "remote_ratio": ratio, "layers": args.layers, "epochs": args.epochs,
        "single_test_acc": single.get("test_acc"), "pipeline_test_acc": pipe.get("test_acc"),
        "single_epoch_s": single.get("epoch_time_s"), "pipeline_epoch_s": pipe.get("epoch_time_s"),
        "pipeline_step_bytes_predicted": step, "pipeline_refresh_bytes_predicted": refresh,
        "pipeline_bytes_measured": sorted({e["bytes"] for e in epochs}), "mismatched_epochs": mismatched,
        "depcomm_step_bytes_predicted": sum(pred["depcomm_step"].values()),
        "depcomm_bytes_measured": depcomm.get("bytes_sent_per_epoch"),
        "bubble_predicted": pred["pipeline"]["bubble"]["idle_fraction"], "bubble_measured_per_stage": bubble,
        "pipeline": {k: pred["pipeline"][k] for k in ("stages", "groups", "chunks", "split", "history_every")},
        "errors": {k: r["error"] for k, r in (("single", single), ("pipeline", pipe), ("depcomm", depcomm))
                   if "error" in r},
    }
    print(f"test accuracy: one process {result['single_test_acc']}, pipeline {result['pipeline_test_acc']}")
    print(f"bytes per epoch: pipeline step {step} predicted, measured {result['pipeline_bytes_measured']} "
          f"(refresh every {every} epochs adds {refresh}); epochs not matching: {mismatched}")
    print(f"depcomm step: {result['depcomm_step_bytes_predicted']} predicted, {result['depcomm_bytes_measured']} "
          f"measured; pipeline / depcomm = {step / max(result['depcomm_step_bytes_predicted'], 1):.4f}")
    print(f"bubble: predicted {result['bubble_predicted']:.3f} of each pass idle; measured per stage "
          f"(median over epochs without a refresh) {[round(b, 3) for b in bubble]}")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
