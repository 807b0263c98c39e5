"""The cost model on one process, probed and run back to back: predicted epoch beside measured, per part.

    python benchmarks/cluster/local_check.py                 # probes this machine first (one thread)
    python benchmarks/cluster/local_check.py --profile P.json

Why this exists: the validation grid (grid.py) measures its cases minutes
after it probed the machines, across emulated hosts whose cores other jobs
share, so its ratios hold the drift of the machine's load as well as the
model's error. This runs the same model with nothing between: `gnnc probe`
(one thread, as a rank computes), then for each model and graph the one-worker
prediction (the `local` formula of every layer, its evaluation pass and the
optimizer step: gnnc.passes.cost) beside a single-process run of a few
epochs (the median after the first), training step and evaluation apart.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gnnc import api
from gnnc.cluster import load_profile
from gnnc.passes.cost.epoch import epoch_costs
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.registry import segment_cost
from gnnc.runtime.executor import init_params
from gnnc.host import use_huge_pages
from gnnc.runtime.train import TrainConfig, Worker, make_optimizer

ROOT = Path(__file__).resolve().parents[2]
CASES = (("gcn", "rmat:n=16000,deg=8,features=256,classes=8,seed=0", 64),
         ("sage", "sbm:n=16000,blocks=8,deg=10,intra=0.7,features=256,classes=8,seed=0", 64),
         ("gat", "rmat:n=16000,deg=8,features=64,classes=8,seed=0", 32),
         ("gcn", "planetoid:cora", 64))


def predicted(program, graph, profile) -> tuple[float, float]:
    """(training step, evaluation) seconds the cost model predicts on one worker."""
    _, inputs, shapes = planning_inputs(program, graph, np.zeros(graph.num_nodes, np.int64), profile, workers=1)
    step = epoch_costs(program, inputs)[1].time
    evaluation = 0.0
    for i in range(len(shapes)):
        value = evaluate_cost(segment_cost("local", i, i + 1, shapes[i:i + 1]), inputs)
        step += float(value.stage_times[:2].max(axis=1).sum())
        evaluation += float(value.stage_times[2:].max(axis=1).sum())
    return step, evaluation


def measured(program, graph, epochs: int) -> tuple[float, float]:
    """(training step, evaluation) seconds of a one-thread run, the median of the epochs after the first."""
    torch.set_num_threads(1)
    cfg = TrainConfig(progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 0)
    opt = make_optimizer(program, params, cfg)
    times = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        worker.train_epoch(params, opt, epoch)
        t1 = time.perf_counter()
        with torch.no_grad():
            worker.forward(params, False, epoch)
        times.append((t1 - t0, time.perf_counter() - t1))
    return statistics.median(t[0] for t in times[1:]), statistics.median(t[1] for t in times[1:])


def main(argv: list[str] | None = None) -> int:
    use_huge_pages()  # as `gnnc probe` and `gnnc run` allocate (gnnc.host)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a profile `gnnc probe --threads 1` wrote (default: probe now)")
    ap.add_argument("--epochs", type=int, default=6)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.profile or str(Path(tmp) / "probe.json")
        if args.profile is None:
            subprocess.run([sys.executable, "-m", "gnnc", "probe", "--threads", "1", "-o", path], check=True,
                           capture_output=True, cwd=ROOT)
        profile = load_profile(path).for_workers(1)
        print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        for model, spec, hidden in CASES:
            graph = api.load_graph(spec)
            program = api.compile(api.load_model(ROOT / "examples" / f"{model}.gnn", hidden=hidden), graph).program
            p_step, p_eval = predicted(program, graph, profile)
            m_step, m_eval = measured(program, graph, args.epochs)
            print(f"{model} on {spec}, hidden {hidden}: predicted {(p_step + p_eval) * 1e3:.1f} ms "
                  f"({p_step * 1e3:.1f} + {p_eval * 1e3:.1f}), measured {(m_step + m_eval) * 1e3:.1f} ms "
                  f"({m_step * 1e3:.1f} + {m_eval * 1e3:.1f}): measured / predicted "
                  f"{(m_step + m_eval) / (p_step + p_eval):.2f}", flush=True)
        print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
