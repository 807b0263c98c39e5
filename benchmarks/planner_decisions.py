"""The planner's decisions on every example x graph x worker count x cluster preset, to compare two commits
(issue 36: "the planner's choice equals the previous commit's").

For each case it records what choose-strategy chose (each graph layer's strategy and segment, the pipeline's
groups when chosen), its predicted epoch time and bytes; a case the compile refuses records the refusal's
first line. `--json OUT` writes them; `--compare FILE` (such a file from another commit) lists every case
whose choice, bytes or time (to `--rtol`, 1e-9) differs, and exits 1 when any does.

    PYTHONPATH=/path/to/old/checkout/as/gnnc python benchmarks/planner_decisions.py --json /tmp/was.json
    python benchmarks/planner_decisions.py --json /tmp/now.json --compare /tmp/was.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gnnc import api
from gnnc.cluster import PRESET_NAMES
from gnnc.errors import GnncError
from gnnc.plan.rows import layer_specs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GRAPHS = ("planetoid:cora", "rmat:n=100000")
WORKERS = (2, 4, 8)


def decision(plan: Any) -> dict[str, Any]:
    """What the planner chose and predicted in `plan`."""
    rec = plan.meta.planner
    return {"layers": [[s.strategy, s.segment] for s in layer_specs(plan.program)],
            "chosen": None if rec is None else list(rec.strategies),
            "segments": None if rec is None else [list(x) for x in rec.segments],
            "time_s": None if rec is None else rec.predicted_time_s,
            "memory_bytes": None if rec is None else rec.predicted_memory_bytes,
            "bytes": plan.meta.predicted_bytes_per_step}


def run(graphs: list[str], workers: list[int], presets: list[str], models: list[str],
        save: Path | None = None) -> dict[str, Any]:
    """Every case's decision; `save`: rewritten after each case (a long run stopped keeps what it found)."""
    out: dict[str, Any] = {}
    for spec in graphs:
        graph = api.load_graph(spec)
        for name in models:
            model = api.load_model(EXAMPLES / f"{name}.gnn")
            for w in workers:
                for preset in presets:
                    key = f"{name} {spec} x{w} {preset}"
                    t = time.process_time()
                    try:
                        got = decision(api.compile(model, graph, workers=w, graph_spec=spec, cluster=preset))
                    except GnncError as err:
                        got = {"refused": str(err).splitlines()[0]}
                    out[key] = got
                    if save is not None:
                        save.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
                    print(f"{key:60s} {time.process_time() - t:6.2f} s  {got.get('chosen', got.get('refused'))}",
                          flush=True)
    return out


def differences(now: dict[str, Any], was: dict[str, Any], rtol: float) -> list[str]:
    def close(a: Any, b: Any) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return abs(a - b) <= rtol * max(abs(a), abs(b))
        return a == b

    out = []
    for key in sorted(set(now) & set(was)):
        a, b = now[key], was[key]
        diff = [k for k in sorted(set(a) | set(b)) if not close(a.get(k), b.get(k))]
        if diff:
            out.append(f"{key}: {', '.join(f'{k} {b.get(k)} -> {a.get(k)}' for k in diff)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--workers", default=",".join(map(str, WORKERS)))
    ap.add_argument("--presets", default=",".join(p for p in PRESET_NAMES if p != "local"),
                    help="cluster presets (default: every one but `local`, this machine's probe)")
    ap.add_argument("--models", default=",".join(sorted(p.stem for p in EXAMPLES.glob("*.gnn"))))
    ap.add_argument("--json", help="write the decisions here")
    ap.add_argument("--compare", help="a --json file of another commit: list the cases that differ")
    ap.add_argument("--rtol", type=float, default=1e-9)
    args = ap.parse_args()
    print(f"gnnc {api.__file__}; load average {os.getloadavg()}")
    now = run(args.graphs.split(","), [int(w) for w in args.workers.split(",")], args.presets.split(","),
              args.models.split(","), Path(args.json) if args.json else None)
    if args.compare:
        was = json.loads(Path(args.compare).read_text())
        diff = differences(now, was, args.rtol)
        print(f"{len(set(now) & set(was))} cases compared, {len(diff)} differ")
        for line in diff:
            print("  " + line)
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
