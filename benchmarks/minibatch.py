"""Sampled minibatch training: accuracy against full-graph training, P3's bytes, the 2F2B pipeline.

Three sections (`--section`), each printing its figures with `cat /proc/loadavg` and writing them as JSON
under `--out` (benchmarks/RESULTS-minibatch.md quotes them):

* `accuracy`: GraphSAGE (examples/sage.gnn) on Cora and CiteSeer, fan-out (25, 10), batch 512, against
  full-graph training at the same epochs (100); test accuracy at the best validation epoch, mean of 3 seeds.
* `bytes`: 4 gloo processes on a contextual SBM with P3's shape (F = 128, hidden 32, average degree 50),
  fan-out (25, 10), batch 1000, hash partition: the first layer's measured bytes of epoch 0 (every rank's
  `--metrics` records) for dp-sample and pushpull, against the planner's prediction (its dry run), at
  several hidden widths; and the planner's crossover from `--explain` (cluster p3).
* `pipeline`: pushpull on the same SBM (6 epochs of 10 minibatches), sequential against P3's 2F2B
  (staleness 3, `--approximate`): test accuracy and the per-minibatch training loss, plotted to
  RESULTS-minibatch.png under --out; plus one process on Cora (batch 32, so 5 minibatches an epoch,
  60 epochs) over 3 seeds.

    python benchmarks/minibatch.py --section accuracy [--graphs planetoid:cora] [--out benchmarks]
    python benchmarks/minibatch.py --section bytes
    python benchmarks/minibatch.py --section pipeline --part sbm; ... --part cora   (then the plot)
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import gnnc
from device_arg import add_device_argument, resolve_device_or_exit
from gnnc import api
from gnnc.graph.sampling import SamplingConfig
from gnnc.inspect_plan import explain
from gnnc.runtime.metrics import read_metrics
from gnnc.runtime.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
SAGE = ROOT / "examples" / "sage.gnn"
SBM = "sbm:n=16000,blocks=16,deg=50,intra=0.7,features=128,classes=16,seed=0"
P3_SAMPLING = SamplingConfig((25, 10), 1000)
WORKERS = 4
EPOCHS = 100  # accuracy section, both ways of training


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def accuracy(out: Path, graphs: list[str], device: str = "cpu") -> dict:
    rows = {}
    for spec in graphs:
        graph = gnnc.load_graph(spec)
        model = gnnc.load_model(SAGE)
        full, mini = [], []
        for seed in (0, 1, 2):
            full.append(gnnc.run(model, graph, epochs=EPOCHS, seed=seed, device=device).test_acc)
            mini.append(gnnc.run(model, graph, epochs=EPOCHS, seed=seed, device=device,
                                 sampling=SamplingConfig((25, 10), 512)).test_acc)
        rows[spec] = {"full": full, "minibatch": mini, "full_mean": statistics.mean(full),
                      "minibatch_mean": statistics.mean(mini)}
        print(f"{spec}: full-graph {statistics.mean(full):.4f} {full}, minibatch (25,10)/512 "
              f"{statistics.mean(mini):.4f} {mini}, difference {statistics.mean(mini) - statistics.mean(full):+.4f}")
    return rows


def layer1_bytes(records: list[dict], epoch: int = 0) -> dict[str, int]:
    """Epoch `epoch`'s bytes of the first layer's ops, summed over ranks, by op."""
    out: dict[str, int] = {}
    for rec in records:
        if rec.get("kind") == "minibatch" or rec["epoch"] != epoch:
            continue
        for key, nbytes in rec["bytes_by_op"].items():
            if key.startswith("l0"):
                op = key.split("/")[1] if not key.startswith("l0.structure") else "structure"
                out[op] = out.get(op, 0) + nbytes
    return out


def _bytes_run(graph, hidden: int, strategy: str, tmp: Path) -> dict:
    model = gnnc.load_model(SAGE, hidden=hidden)
    plan = api.compile(model, graph, workers=WORKERS, strategy=strategy, sampling=P3_SAMPLING, seed=0,
                       cluster="p3")
    predicted = {k: v for k, v in plan.meta.predicted_bytes_per_epoch.items() if k != "allreduce"}
    metrics = tmp / f"{strategy}-{hidden}.jsonl"
    cfg = TrainConfig.resolve(plan.program, epochs=2, seed=0, progress=False)
    api.run_plan(plan, graph, cfg, metrics=str(metrics), want_logits=False)
    records = read_metrics(metrics)
    return {"predicted": predicted, "measured": layer1_bytes(records), "measured_epoch1": layer1_bytes(records, 1)}


def bytes_section(out: Path) -> dict:
    graph = gnnc.load_graph(SBM)
    print(f"{SBM}: {graph.num_nodes} vertices, {graph.num_edges} edges, {int(graph.train_mask.sum())} training")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in (16, 32, 64, 128, 256):
            row = {"hidden": hidden}
            for strategy in ("dp-sample", "pushpull"):
                row[strategy] = _bytes_run(graph, hidden, strategy, Path(tmp))
            pp, dp = (sum(row[s]["measured"].values()) for s in ("pushpull", "dp-sample"))
            print(f"hidden {hidden:4d}: layer-1 MB/epoch measured dp-sample {dp / 1e6:9.3f} "
                  f"(predicted {sum(row['dp-sample']['predicted'].values()) / 1e6:9.3f}), pushpull {pp / 1e6:9.3f} "
                  f"(predicted {sum(row['pushpull']['predicted'].values()) / 1e6:9.3f}); equal: "
                  f"{all(row[s]['measured'] == row[s]['predicted'] for s in ('dp-sample', 'pushpull'))}; "
                  f"epoch 1 / epoch 0: {sum(row['pushpull']['measured_epoch1'].values()) / pp:.4f} (pushpull), "
                  f"{sum(row['dp-sample']['measured_epoch1'].values()) / dp:.4f} (dp-sample)")
            rows.append(row)
    plan = api.compile(gnnc.load_model(SAGE, hidden=32), graph, workers=WORKERS, sampling=P3_SAMPLING, seed=0,
                       cluster="p3", explain=True)
    crossovers = plan.meta.planner.crossovers
    print(explain(plan))
    return {"rows": rows, "crossovers": crossovers, "chosen": plan.meta.planner.strategies}


def _pipeline_run(graph, schedule: str, seed: int, epochs: int, tmp: Path, workers: int, sampling) -> dict:
    model = gnnc.load_model(SAGE)
    plan = api.compile(model, graph, workers=workers, strategy="pushpull" if workers > 1 else None,
                       sampling=sampling, seed=seed, schedule=schedule, approximate=schedule != "sequential")
    metrics = tmp / f"{schedule}-{seed}-{workers}.jsonl"
    cfg = TrainConfig.resolve(plan.program, epochs=epochs, seed=seed, progress=False)
    if workers > 1:
        result = api.run_plan(plan, graph, cfg, metrics=str(metrics), want_logits=False)
    else:
        result = api.train_local(plan, graph, cfg, metrics=str(metrics))
    losses: dict[tuple[int, int], float] = {}
    for rec in read_metrics(metrics):
        if rec.get("kind") == "minibatch":
            key = (rec["epoch"], rec["batch"])
            losses[key] = losses.get(key, 0.0) + rec["loss"]  # ranks' shares add up to the step's loss
    return {"test_acc": result.test_acc, "final_test_acc": result.final_test_acc,
            "losses": [losses[k] for k in sorted(losses)]}


def pipeline(out: Path, part: str) -> dict:
    """`part` sbm (4 ranks) or cora (one process); the plot is drawn once both JSON files exist."""
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if part == "sbm":
            graph = gnnc.load_graph(SBM)
            for schedule in ("sequential", "2f2b"):
                result[f"sbm/{schedule}"] = runs = [_pipeline_run(graph, schedule, s, 6, Path(tmp), WORKERS,
                                                                  P3_SAMPLING) for s in (0,)]
                print(f"{SBM} x{WORKERS} pushpull {schedule}: test acc {[r['test_acc'] for r in runs]} "
                      f"mean {statistics.mean(r['test_acc'] for r in runs):.4f}")
        else:
            cora = gnnc.load_graph("planetoid:cora")
            for schedule in ("sequential", "2f2b"):
                result[f"cora/{schedule}"] = runs = [_pipeline_run(cora, schedule, s, 60, Path(tmp), 1,
                                                                   SamplingConfig((25, 10), 32)) for s in (0, 1, 2)]
                print(f"cora x1 {schedule} (batch 32): test acc {[r['test_acc'] for r in runs]} "
                      f"mean {statistics.mean(r['test_acc'] for r in runs):.4f}")
    both = {}
    for name in ("sbm", "cora"):
        saved = out / f"minibatch-pipeline-{name}.json"
        both.update(result if name == part else json.loads(saved.read_text()) if saved.exists() else {})
    if all(f"{k}/{s}" in both for k in ("sbm", "cora") for s in ("sequential", "2f2b")):
        _plot(both, out / "RESULTS-minibatch.png")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib  # deferred: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, title) in zip(axes, [("sbm", f"SBM (F=128, deg 50), 4 gloo ranks, pushpull, seed 0"),
                                      ("cora", "Cora, one process, batch 32, seed 0")]):
        for schedule, style in (("sequential", "-"), ("2f2b", "--")):
            losses = result[f"{key}/{schedule}"][0]["losses"]
            ax.plot(range(len(losses)), losses, style, label=f"{schedule}" + (" (staleness 3)" if schedule == "2f2b"
                                                                                 else ""), linewidth=1)
        ax.set_xlabel("minibatch (optimizer step)")
        ax.set_ylabel("training loss of the minibatch")
        ax.set_title(title, fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--section", choices=["accuracy", "bytes", "pipeline"], required=True)
    ap.add_argument("--out", default=str(ROOT / "benchmarks"))
    ap.add_argument("--graphs", default="planetoid:cora,planetoid:citeseer", help="accuracy: the graphs")
    ap.add_argument("--part", choices=["sbm", "cora"], default="sbm", help="pipeline: which half")
    add_device_argument(ap)
    args = ap.parse_args()
    device = resolve_device_or_exit(args.device)
    if device != "cpu" and args.section != "accuracy":
        print(f"error: --device {args.device}: the {args.section} section runs sampled minibatches on several "
              "workers, which run on the CPU for now; --section accuracy trains in one process on the device",
              file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)  # a shared machine: several threads per process only contend (accuracy is the same)
    out = Path(args.out)
    print(f"loadavg before: {loadavg()}")
    if args.section == "accuracy":
        result = accuracy(out, args.graphs.split(","), device)
        name = f"accuracy-{args.graphs.replace(':', '_').replace(',', '+')}"
    elif args.section == "pipeline":
        result = pipeline(out, args.part)
        name = f"pipeline-{args.part}"
    else:
        result = bytes_section(out)
        name = "bytes"
    print(f"loadavg after: {loadavg()}")
    (out / f"minibatch-{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
