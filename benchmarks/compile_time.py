"""Compile time, split into load, partition, passes (each pass) and writing (issue 36, item 6).

For each case, in this one process (imports paid once, before the first), the median of `--repeat`
compiles: wall and user CPU of loading the graph, elaborating the model, partitioning, each pass of the
pipeline, recording the plan's metadata, and writing the plan. The 1-minute load average is printed beside
each case (a shared machine's figures are only comparable at similar loads). `--json OUT` writes the
figures; `--previous FILE` (such a file, from an earlier commit) prints that commit's beside them.

    python benchmarks/compile_time.py                       # every example on Cora x4, GCNII 16/64 layers x8
    python benchmarks/compile_time.py --cases gcn-cora-4 --repeat 1 --json /tmp/now.json --previous /tmp/was.json
    python benchmarks/compile_time.py --big                 # also the 89,000-vertex SBM, GCNII x32, gnnpipe
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gnnc
from gnnc import api

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SBM = "sbm:n=89000,blocks=32,deg=10,intra=0.8,features=500,classes=7,seed=0"


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    graph: str
    workers: int
    sets: dict[str, int] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


CASES = [Case(f"{m}-cora-4", m, "planetoid:cora", 4) for m in ("gcn", "sage", "gat", "gin", "gcnii")] + [
    Case(f"gcnii{n}-cora-8", "gcnii", "planetoid:cora", 8, {"layers": n}) for n in (16, 64)]
BIG = [Case(f"gcnii32-sbm-8-gnnpipe{'-approx' if a else ''}", "gcnii", SBM, 8, {"layers": 32, "hidden": 100},
            {"cluster": "gnnpipe", "approximate": a}) for a in (False, True)]


class Clock:
    """Wall and user CPU since the last mark."""

    def __init__(self) -> None:
        self.wall, self.user = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_utime

    def lap(self) -> tuple[float, float]:
        wall, user = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
        out = (wall - self.wall, user - self.user)
        self.wall, self.user = wall, user
        return out


def compile_once(case: Case) -> dict[str, tuple[float, float]]:
    """One compile of `case`: {step: (wall s, user CPU s)}, steps in order."""
    steps: dict[str, tuple[float, float]] = {}
    clock = Clock()
    graph = api.load_graph(case.graph)
    steps["load"] = clock.lap()
    model = api.load_model(EXAMPLES / f"{case.model}.gnn", **case.sets)
    partition_graph = api.partition_graph

    def timed_partition(*args: Any, **kwargs: Any) -> Any:
        steps["elaborate"] = clock.lap()
        out = partition_graph(*args, **kwargs)
        steps["partition"] = clock.lap()
        return out

    def after(name: str, program: Any) -> None:
        steps[f"pass {name}"] = clock.lap()

    api.partition_graph = timed_partition
    try:
        plan = api.compile(model, graph, workers=case.workers, graph_spec=case.graph, after=after, **case.options)
    finally:
        api.partition_graph = partition_graph
    steps["record"] = clock.lap()
    with tempfile.TemporaryDirectory(prefix="gnnc-compile-time-") as out:
        plan.save(Path(out) / "plan")
    steps["write"] = clock.lap()
    return steps


def measure(case: Case, repeat: int) -> dict[str, Any]:
    runs = [compile_once(case) for _ in range(repeat)]
    names = list(runs[0])
    median = {k: [statistics.median(r[k][i] for r in runs) for i in (0, 1)] for k in names}
    passes = [k for k in names if k.startswith("pass ")]
    after_load = [k for k in names if k != "load"]
    return {"steps": median,
            "passes": [sum(median[k][i] for k in passes) for i in (0, 1)],
            "after_load": [sum(median[k][i] for k in after_load) for i in (0, 1)],
            "total": [sum(median[k][i] for k in names) for i in (0, 1)],
            "load_average": os.getloadavg()[0], "repeat": repeat}


def fmt(pair: list[float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:7.2f} {pair[1]:7.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all; see CASES)")
    ap.add_argument("--big", action="store_true", help="also the 89,000-vertex SBM cases (minutes each)")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per case, the median kept (default 3)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--previous", help="a --json file of an earlier commit, printed beside")
    ap.add_argument("--steps", action="store_true", help="print every step (each pass), not only the totals")
    args = ap.parse_args()
    cases = CASES + (BIG if args.big else [])
    if args.cases:
        wanted = args.cases.split(",")
        unknown = sorted(set(wanted) - {c.name for c in cases})
        if unknown:
            ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(c.name for c in CASES + BIG)}")
        cases = [c for c in CASES + BIG if c.name in wanted]
    previous = json.loads(Path(args.previous).read_text()) if args.previous else {}
    print(f"gnnc {gnnc.__file__}; load average {os.getloadavg()}; median of {args.repeat}; wall s, user CPU s")
    print(f"{'case':28s} {'after load (now)':>16s} {'passes (now)':>16s} {'total (now)':>16s}"
          f"{'  after load (previous)':>24s} {'load avg':>9s}")
    results: dict[str, Any] = {}
    for case in cases:
        got = results[case.name] = measure(case, args.repeat)
        was = previous.get(case.name, {})
        print(f"{case.name:28s} {fmt(got['after_load']):>16s} {fmt(got['passes']):>16s} {fmt(got['total']):>16s}"
              f"{fmt(was.get('after_load')):>24s} {got['load_average']:9.2f}", flush=True)
        if args.steps:
            for step, pair in got["steps"].items():
                print(f"    {step:32s} {fmt(pair)}   previous {fmt(was.get('steps', {}).get(step))}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
