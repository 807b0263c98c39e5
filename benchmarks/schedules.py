"""The schedule pass's choices measured: MG-GCN's staged broadcast, overlap, G3's bins under a memory cap.

Each section compiles the same model and graph with different schedule options (the `schedule` pass's,
`gnnc passes`), runs the plans with `gnnc run --metrics` as a user would, and prints one table:

    python benchmarks/schedules.py --only bcast1d   # peak RSS per rank, staged vs gathered (1M vertices, 4 ranks)
    python benchmarks/schedules.py --only overlap   # blocked communication, measured and predicted, SAGE and GAT
    python benchmarks/schedules.py --only bins      # activation memory under --memory-cap, logits, epoch time

`--baseline-gnnc PATH` adds a row run by another checkout's `gnnc` with the same command (for the
bcast1d section: what bcast1d cost before the schedule pass, e.g. a checkout of main). Times are the
median over the epochs after the first of the slowest rank; communication is the time ranks blocked
in exchanges (not the gradient all-reduce); activation memory is how far a training step raised a
rank's resident set (gnnc.runtime.metrics). Predictions come from the plan (`meta.schedule`), priced
on `--cluster` (default: the `local` profile `gnnc probe` writes).
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


def gnnc(exe: list[str], *args: str, env_threads: int = 1) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(env_threads))
    return subprocess.run([*exe, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def compile_and_run(exe: list[str], model: str, graph: str, nproc: int, strategy: str, schedule: str | None,
                    epochs: int, cluster: str | None, extra: list[str] = (), workdir: Path | None = None,
                    logits: bool = False) -> dict[str, Any]:
    """Compile (with `schedule`, or the checkout's defaults when None) and run; the run's summary, its
    metrics records, the plan's meta and the logits file."""
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        plan, metrics, dump = Path(d) / "plan", Path(d) / "m.jsonl", Path(d) / "logits.pt"
        args = ["compile", model, "--graph", graph, "--workers", str(nproc), "--strategy", strategy, "-o", str(plan),
                *extra]
        if schedule is not None:
            args += ["--passes", pipeline(schedule)]
        if cluster:
            args += ["--cluster", cluster]
        r = gnnc(exe, *args)
        if r.returncode != 0:
            return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        meta = json.loads((plan / "plan.json").read_text())
        run = ["run", str(plan), "--nproc", str(nproc), "--epochs", str(epochs), "--json", "--no-progress",
               "--metrics", str(metrics)] + (["--dump-logits", str(dump)] if logits else [])
        r = gnnc(exe, *run)
        if r.returncode != 0:
            return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        out = {"summary": summary, "records": records, "meta": meta}
        if logits:
            import torch

            out["logits"] = torch.load(dump)
        return out


def steady(records: list[dict], key: str) -> float:
    """Median over the epochs after the first of the largest value over ranks."""
    epochs = sorted({r["epoch"] for r in records})
    later = epochs[1:] or epochs
    return statistics.median(max(r.get(key, 0) for r in records if r["epoch"] == e) for e in later)


def predicted_exposed_comm(meta: dict) -> float:
    """Communication the plan's predicted epoch does not hide behind compute (the gradient all-reduce left
    out, as the measured figure leaves it out): per worker, every communication piece outside an overlap
    window, and inside one what outlasts the compute beside it; the largest over workers."""
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
    return max(exposed, default=0.0)


def section_bcast1d(args, exe: list[str]) -> None:
    graph = args.graph or "rmat:n=1000000,deg=10,features=128,classes=16,seed=0"
    model = str(ROOT / "examples" / "gcn.gnn")
    print(f"bcast1d: GCN hidden {args.hidden}, {graph}, {args.nproc} ranks, {args.epochs} epochs")
    rows = []
    if args.baseline_gnnc:
        base = [args.baseline_gnnc]
        r = gnnc(base, "run", model, "--graph", graph, "--set", f"hidden={args.hidden}", "--nproc", str(args.nproc),
                 "--strategy", "bcast1d", "--epochs", str(args.epochs), "--json", "--no-progress")
        rows.append(("baseline checkout", json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                     else {"error": r.stderr.strip().splitlines()[-1]}))
    for label, schedule in (("gathered (staged=off)", "schedule{staged=off}"), ("staged", "schedule{staged=on}")):
        out = compile_and_run(exe, model, graph, args.nproc, "bcast1d", schedule, args.epochs, args.cluster,
                              ["--set", f"hidden={args.hidden}"])
        rows.append((label, out.get("summary", out)))
    first = next((r for _, r in rows if "error" not in r), None)
    print(f"{'schedule':24s} {'peak RSS/rank MiB':>18s} {'vs first':>8s} {'epoch s':>8s} {'test acc':>8s}")
    for label, r in rows:
        if "error" in r:
            print(f"{label:24s} error: {r['error']}")
            continue
        print(f"{label:24s} {r['peak_rss_bytes'] / 2**20:18.0f} {r['peak_rss_bytes'] / first['peak_rss_bytes']:8.3f} "
              f"{r['epoch_time_s']:8.2f} {r['test_acc']:8.4f}")


def section_overlap(args, exe: list[str]) -> None:
    graph = args.graph or "rmat:n=200000,deg=10,features=128,classes=16,seed=0"
    print(f"overlap: depcomm, {graph}, {args.nproc} ranks, {args.epochs} epochs, cluster {args.cluster or 'local'}")
    print(f"{'model':6s} {'schedule':14s} {'blocked comm s':>14s} {'predicted s':>11s} {'epoch s':>8s} "
          f"{'predicted epoch s':>17s}")
    for name in ("sage", "gat"):
        for label, schedule in (("not overlapped", "schedule{overlap=off}"), ("overlapped", "schedule{overlap=on}")):
            out = compile_and_run(exe, str(ROOT / "examples" / f"{name}.gnn"), graph, args.nproc, "depcomm", schedule,
                                  args.epochs, args.cluster or "local")
            if "error" in out:
                print(f"{name:6s} {label:14s} error: {out['error']}")
                continue
            meta = out["meta"]
            print(f"{name:6s} {label:14s} {steady(out['records'], 'comm_s'):14.3f} "
                  f"{predicted_exposed_comm(meta):11.4f} {steady(out['records'], 'epoch_s'):8.3f} "
                  f"{meta['schedule_report']['predicted_time_s']:17.4f}")


def section_bins(args, exe: list[str]) -> None:
    graph = args.graph or "rmat:n=100000,deg=20,features=64,classes=8,seed=0"
    model = str(ROOT / "examples" / "gat.gnn")
    print(f"bins: GAT, depcomm, {graph}, {args.nproc} ranks, {args.epochs} epochs")
    free = compile_and_run(exe, model, graph, args.nproc, "depcomm", "schedule", args.epochs, args.cluster,
                           logits=True)
    if "error" in free:
        print(f"unbinned: error: {free['error']}")
        return
    peak = steady(free["records"], "activation_peak_bytes")
    cap = int(peak / 3)
    capped = compile_and_run(exe, model, graph, args.nproc, "depcomm", None, args.epochs, args.cluster,
                             ["--memory-cap", str(cap)], logits=True)
    print(f"{'run':22s} {'bins per layer':>14s} {'activation MiB':>14s} {'first epoch MiB':>15s} {'predicted MiB':>13s} "
          f"{'epoch s':>8s}")
    for label, out in (("unbinned", free), (f"--memory-cap {cap}", capped)):
        if "error" in out:
            print(f"{label:22s} error: {out['error']}")
            continue
        bins = ",".join(str(seg["options"].get("bins", 1)) for seg in out["meta"]["schedule_report"]["segments"])
        first = max(r["activation_peak_bytes"] for r in out["records"] if r["epoch"] == 0)
        print(f"{label:22s} {bins:>14s} {steady(out['records'], 'activation_peak_bytes') / 2**20:14.1f} "
              f"{first / 2**20:15.1f} {out['meta']['schedule_report']['activation_bytes'] / 2**20:13.1f} "
              f"{steady(out['records'], 'epoch_s'):8.3f}")
    if "error" not in capped:
        a, b = free["logits"], capped["logits"]
        print(f"cap {cap / 2**20:.1f} MiB (a third of the unbinned peak); logits after {args.epochs} epochs: "
              f"max |diff| {float((a - b).abs().max()):.3g}, relative {float((a - b).norm() / a.norm()):.3g}; "
              f"measured under the cap: {steady(capped['records'], 'activation_peak_bytes') <= cap}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["bcast1d", "overlap", "bins"], action="append")
    ap.add_argument("--graph", help="the graph of every section (each has its own default)")
    ap.add_argument("--nproc", type=int, help="ranks (default: 4 for bcast1d, 2 otherwise)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128, help="GCN's hidden width in the bcast1d section")
    ap.add_argument("--cluster", help="profile the plans are priced on (default: local for the overlap section)")
    ap.add_argument("--baseline-gnnc", help="another checkout's gnnc executable, run with the same command")
    args = ap.parse_args()
    exe = [sys.executable, "-m", "gnnc"]
    nproc = args.nproc
    for name, fn in (("bcast1d", section_bcast1d), ("overlap", section_overlap), ("bins", section_bins)):
        if args.only and name not in args.only:
            continue
        args.nproc = nproc or (4 if name == "bcast1d" else 2)
        print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
        fn(args, exe)
        print()


if __name__ == "__main__":
    main()
