"""The schedule pass's choices measured: MG-GCN's staged broadcast, overlap, G3's bins under a memory cap.

Each section compiles the same model and graph with different schedule options (the `schedule` pass's,
`gnnc passes`) once, runs the plans with `gnnc run --metrics` as a user would, and prints one table
(benchmarks/RESULTS-schedules.md holds the figures and the commands):

    python benchmarks/schedules.py --only bcast1d --baseline-gnnc OLD/.venv/bin/gnnc
        # peak RSS per rank, staged vs gathered vs another checkout's bcast1d (1M vertices, 4 ranks)
    python benchmarks/schedules.py --only overlap --cluster probe.json
        # blocked communication, measured and predicted, SAGE and GAT, overlap off and on
    python benchmarks/schedules.py --only bins
        # activation memory under --memory-cap (a third of the unbinned peak), logits, epoch time

`--baseline-gnnc PATH` adds a row compiled and run by another checkout's `gnnc` with its default
passes (for the bcast1d section: what bcast1d cost before the schedule pass, e.g. a checkout of the
commit before it). Times are the median, over the epochs after the first of every repeat, of the
slowest rank's figure; the plans of a comparison run in turn, repeat after repeat, so load that
comes and goes falls on both alike. Communication is the time ranks blocked in exchanges (posting
plus waiting; the gradient all-reduce is apart); activation memory is how far a training step raised
a rank's resident set, peak RSS the rank's high-water mark over the whole run (gnnc.runtime.metrics).
Predictions come from the plan (`meta.schedule_report`), priced on `--cluster` (default: the
`local` profile `gnnc probe` writes). `/proc/loadavg` is printed before and after each section.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # reason: run as a script from a checkout; gnnc itself is installed

from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE  # noqa: E402


def pipeline(schedule: str) -> str:
    """The default pipeline for several workers, with `schedule` (e.g. 'schedule{staged=off}') last."""
    return ",".join(DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [schedule])


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def gnnc(exe: list[str], *args: str) -> subprocess.CompletedProcess:
    # one thread per rank: the ranks share the machine's cores, as a cluster's workers would not
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*exe, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def _error(r: subprocess.CompletedProcess) -> dict[str, str]:
    return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}


def compile_plan(exe: list[str], model: str, graph: str, nproc: int, strategy: str, schedule: str | None,
                 plan: Path, cluster: str | None, extra: list[str] = ()) -> dict[str, Any]:
    """Compile into `plan` (with `schedule` last, or the checkout's default passes when None); the plan's meta."""
    args = ["compile", model, "--graph", graph, "--workers", str(nproc), "--strategy", strategy, "-o", str(plan),
            *extra]
    if schedule is not None:
        args += ["--passes", pipeline(schedule)]
    if cluster:
        args += ["--cluster", cluster]
    r = gnnc(exe, *args)
    return _error(r) if r.returncode != 0 else json.loads((plan / "plan.json").read_text())


def run_plan(exe: list[str], plan: Path, nproc: int, epochs: int, logits: bool = False) -> dict[str, Any]:
    """Run a compiled plan; its summary, its metrics records and (when asked) the logits."""
    metrics, dump = plan / "m.jsonl", plan / "logits.pt"
    metrics.unlink(missing_ok=True)
    run = ["run", str(plan), "--nproc", str(nproc), "--epochs", str(epochs), "--json", "--no-progress",
           "--metrics", str(metrics)] + (["--dump-logits", str(dump)] if logits else [])
    r = gnnc(exe, *run)
    if r.returncode != 0:
        return _error(r)
    out = {"summary": json.loads(r.stdout.strip().splitlines()[-1]),
           "records": [json.loads(line) for line in metrics.read_text().splitlines()]}
    if logits:
        import torch  # reason: heavy; only the sections that compare logits load it

        out["logits"] = torch.load(dump)
    return out


def steady_values(records: list[dict], key: str) -> list[float]:
    """Per epoch after the first, the largest value over ranks."""
    epochs = sorted({r["epoch"] for r in records})
    return [max(r.get(key, 0) for r in records if r["epoch"] == e) for e in (epochs[1:] or epochs)]


def steady(runs: list[dict], key: str) -> float:
    """Median over the repeats' epochs after the first of the largest value over ranks."""
    return statistics.median(v for run in runs for v in steady_values(run["records"], key))


def per_rank(runs: list[dict], key: str, ranks: int) -> list[float]:
    """Per rank, the median over the repeats' epochs after the first."""
    out = []
    for rank in range(ranks):
        values = []
        for run in runs:
            mine = [r for r in run["records"] if r["rank"] == rank]
            epochs = sorted({r["epoch"] for r in mine})
            values += [r.get(key, 0.0) for r in mine if r["epoch"] in (epochs[1:] or epochs)]
        out.append(statistics.median(values))
    return out


def predicted_exposed_comm(meta: dict) -> list[float]:
    """Per worker, the communication the plan's predicted epoch does not hide behind compute (the
    gradient all-reduce left out, as the measured figure leaves it out): every communication piece
    outside an overlap window, and inside one what outlasts the compute beside it. Waiting for a slower
    peer is not communication here; measured, it is (a rank blocks until its peer sends)."""
    stages = ((meta.get("planner") or {}).get("schedule") or (meta.get("schedule_report") or {}).get("predicted"))["stages"]
    workers = len(stages[0]["worker_time_s"]) if stages else 0
    exposed = [0.0] * workers
    for stage in stages:
        if stage["kind"] == "allreduce":
            continue
        windows: dict[int, list[list[float]]] = {}
        for piece in stage["pieces"]:
            for w in range(workers):
                t = piece["time_s"][w]
                if piece["overlap"] is None:
                    exposed[w] += t if piece["track"] == "communication" else 0.0
                else:
                    lanes = windows.setdefault(piece["overlap"], [[0.0] * workers, [0.0] * workers])
                    lanes[0 if piece["track"] == "communication" else 1][w] += t
        for comm, compute in windows.values():
            for w in range(workers):
                exposed[w] += max(0.0, comm[w] - compute[w])
    return exposed


def _pair(values: list[float], fmt: str = ".3f") -> str:
    return " / ".join(f"{v:{fmt}}" for v in values)


def section_bcast1d(args, exe: list[str], work: Path) -> None:
    graph = args.graph or "rmat:n=1000000,deg=10,features=128,classes=16,seed=0"
    model = str(ROOT / "examples" / "gcn.gnn")
    print(f"bcast1d: GCN hidden {args.hidden}, {graph}, {args.nproc} ranks, {args.epochs} epochs")
    variants = [("gathered (staged=off)", exe, "schedule{staged=off}"), ("staged", exe, "schedule{staged=on}")]
    if args.baseline_gnnc:
        variants.insert(0, ("baseline checkout", [args.baseline_gnnc], None))
    rows = []
    for label, who, schedule in variants:
        plan = work / label.split()[0]
        meta = compile_plan(who, model, graph, args.nproc, "bcast1d", schedule, plan, args.cluster,
                            ["--set", f"hidden={args.hidden}"])
        rows.append((label, meta if "error" in meta else {**run_plan(who, plan, args.nproc, args.epochs), "meta": meta}))
    ok = [r for _, r in rows if "error" not in r]
    base = ok[0]["summary"]["peak_rss_bytes"] if args.baseline_gnnc and "error" not in rows[0][1] else None
    gathered = next((r["summary"]["peak_rss_bytes"] for label, r in rows
                     if label.startswith("gathered") and "error" not in r), None)
    print(f"{'schedule':24s} {'peak RSS/rank MiB':>17s} {'vs baseline':>11s} {'vs gathered':>11s} "
          f"{'activation MiB':>14s} {'predicted act. MiB':>18s} {'epoch s':>8s} {'test acc':>8s}")
    for label, r in rows:
        if "error" in r:
            print(f"{label:24s} error: {r['error']}")
            continue
        peak = r["summary"]["peak_rss_bytes"]
        act = r["summary"].get("activation_peak_bytes")  # a checkout before the schedule pass does not measure it
        predicted = (r["meta"].get("schedule_report") or {}).get("activation_bytes")
        print(f"{label:24s} {peak / 2**20:17.0f} {peak / base if base else float('nan'):11.3f} "
              f"{peak / gathered if gathered else float('nan'):11.3f} "
              f"{act / 2**20 if act else float('nan'):14.0f} {predicted / 2**20 if predicted else float('nan'):18.0f} "
              f"{steady([r], 'epoch_s'):8.2f} {r['summary']['test_acc']:8.4f}")


def section_overlap(args, exe: list[str], work: Path) -> None:
    graph = args.graph or "rmat:n=200000,deg=10,features=128,classes=16,seed=0"
    cluster = args.cluster or "local"
    print(f"overlap: depcomm, {graph}, {args.nproc} ranks, {args.epochs} epochs x {args.repeats} repeats, "
          f"cluster {cluster}")
    print("per rank (rank 0 / rank 1 ...): blocked = time in exchanges (transfer not hidden, and waiting for a "
          "slower peer); cpu/wall = the share of the epoch the rank ran")
    print(f"{'model':6s} {'schedule':14s} {'blocked comm s':>16s} {'predicted s':>16s} {'cpu/wall':>11s} "
          f"{'epoch s':>8s} {'predicted epoch s':>17s}")
    for name in ("sage", "gat"):
        variants = {label: work / f"{name}-{label.split()[0]}"
                    for label in ("not overlapped", "overlapped")}
        metas = {label: compile_plan(exe, str(ROOT / "examples" / f"{name}.gnn"), graph, args.nproc, "depcomm",
                                     f"schedule{{overlap={'on' if label == 'overlapped' else 'off'}}}", plan, cluster)
                 for label, plan in variants.items()}
        runs: dict[str, list[dict]] = {label: [] for label in variants}
        for _ in range(args.repeats):  # in turn, so that the machine's load falls on both alike
            for label, plan in variants.items():
                if "error" not in metas[label]:
                    out = run_plan(exe, plan, args.nproc, args.epochs)
                    if "error" in out:
                        metas[label] = out
                    else:
                        runs[label].append(out)
        for label in variants:
            meta = metas[label]
            if "error" in meta:
                print(f"{name:6s} {label:14s} error: {meta['error']}")
                continue
            cpu = per_rank(runs[label], "cpu_s", args.nproc)
            wall = per_rank(runs[label], "epoch_s", args.nproc)
            print(f"{name:6s} {label:14s} {_pair(per_rank(runs[label], 'comm_s', args.nproc)):>16s} "
                  f"{_pair(predicted_exposed_comm(meta), '.4f'):>16s} "
                  f"{_pair([c / w for c, w in zip(cpu, wall)], '.2f'):>11s} {steady(runs[label], 'epoch_s'):8.3f} "
                  f"{meta['schedule_report']['predicted_time_s']:17.4f}")


def section_bins(args, exe: list[str], work: Path) -> None:
    graph = args.graph or "rmat:n=100000,deg=40,features=64,classes=8,seed=0"
    model = str(ROOT / "examples" / "gat.gnn")
    print(f"bins: GAT, depcomm, {graph}, {args.nproc} ranks, {args.epochs} epochs x {args.repeats} repeats")
    plans = {"unbinned": work / "unbinned", "capped": work / "capped"}
    metas = {"unbinned": compile_plan(exe, model, graph, args.nproc, "depcomm", "schedule", plans["unbinned"],
                                      args.cluster)}
    if "error" in metas["unbinned"]:
        print(f"unbinned: error: {metas['unbinned']['error']}")
        return
    first = {"unbinned": run_plan(exe, plans["unbinned"], args.nproc, args.epochs, logits=True)}
    if "error" in first["unbinned"]:
        print(f"unbinned: error: {first['unbinned']['error']}")
        return
    peak = steady([first["unbinned"]], "activation_peak_bytes")
    cap = int(peak / 3)
    metas["capped"] = compile_plan(exe, model, graph, args.nproc, "depcomm", None, plans["capped"], args.cluster,
                                   ["--memory-cap", str(cap)])
    if "error" in metas["capped"]:
        print(f"--memory-cap {cap}: error: {metas['capped']['error']}")
        return
    first["capped"] = run_plan(exe, plans["capped"], args.nproc, args.epochs, logits=True)
    if "error" in first["capped"]:
        print(f"--memory-cap {cap}: error: {first['capped']['error']}")
        return
    runs = {label: [out] for label, out in first.items()}
    for _ in range(args.repeats - 1):  # more epochs for the times, in turn
        for label, plan in plans.items():
            out = run_plan(exe, plan, args.nproc, args.epochs)
            if "error" not in out:
                runs[label].append(out)
    print(f"{'run':22s} {'bins per layer':>14s} {'predicted MiB':>13s} {'activation MiB':>14s} {'max MiB':>8s} "
          f"{'first step MiB':>14s} {'kept by it MiB':>14s} {'peak RSS MiB':>12s} {'epoch s':>8s}")
    worst = {}
    for label, out in runs.items():
        meta = metas[label]
        bins = ",".join(str(seg["options"].get("bins", 1)) for seg in meta["schedule_report"]["segments"])
        records = out[0]["records"]
        epoch0 = max(r["activation_peak_bytes"] for r in records if r["epoch"] == 0)
        # what the first step built and kept (the kernels' structure, cached on first use): the next base
        kept = max(b["step_base_bytes"] - a["step_base_bytes"] for a in records for b in records
                   if a["epoch"] == 0 and b["epoch"] == 1 and a["rank"] == b["rank"])
        worst[label] = max(v for o in out for v in steady_values(o["records"], "activation_peak_bytes"))
        name = "unbinned" if label == "unbinned" else f"--memory-cap {cap}"
        print(f"{name:22s} {bins:>14s} {meta['schedule_report']['activation_bytes'] / 2**20:13.1f} "
              f"{steady(out, 'activation_peak_bytes') / 2**20:14.1f} {worst[label] / 2**20:8.1f} "
              f"{epoch0 / 2**20:14.1f} {kept / 2**20:14.1f} "
              f"{max(o['summary']['peak_rss_bytes'] for o in out) / 2**20:12.0f} {steady(out, 'epoch_s'):8.3f}")
    a, b = first["unbinned"]["logits"], first["capped"]["logits"]
    print(f"cap {cap / 2**20:.1f} MiB (a third of the unbinned activation peak); logits after {args.epochs} epochs: "
          f"max |diff| {float((a - b).abs().max()):.3g}, relative {float((a - b).norm() / a.norm()):.3g}; "
          f"largest activation measured in a step after the first, any rank: {worst['capped'] / 2**20:.1f} MiB "
          f"({'under' if worst['capped'] <= cap else 'OVER'} the cap); epoch time capped / unbinned: "
          f"{steady(runs['capped'], 'epoch_s') / steady(runs['unbinned'], 'epoch_s'):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["bcast1d", "overlap", "bins"], action="append")
    ap.add_argument("--graph", help="the graph of every section (each has its own default)")
    ap.add_argument("--nproc", type=int, help="ranks (default: 4 for bcast1d, 2 otherwise)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each plan in the timed sections, in turn")
    ap.add_argument("--hidden", type=int, default=128, help="GCN's hidden width in the bcast1d section")
    ap.add_argument("--cluster", help="profile the plans are priced on (default: local for the overlap section)")
    ap.add_argument("--baseline-gnnc", help="another checkout's gnnc executable, compiled and run with its defaults")
    args = ap.parse_args()
    exe = [sys.executable, "-m", "gnnc"]
    nproc = args.nproc
    for name, fn in (("bcast1d", section_bcast1d), ("overlap", section_overlap), ("bins", section_bins)):
        if args.only and name not in args.only:
            continue
        args.nproc = nproc or (4 if name == "bcast1d" else 2)
        print(f"load average before: {loadavg()}")
        with tempfile.TemporaryDirectory() as work:
            fn(args, exe, Path(work))
        print(f"load average after: {loadavg()}")
        print()


if __name__ == "__main__":
    main()
