"""P3's split W1 under push-pull (issue 38 item 1): the bytes of one training step, predicted and measured, op by op,
and its logits and gradients against one process's.

    python benchmarks/p3_split.py --graph planetoid:cora --worlds 2,4

For each model (GCN, SAGE) and worker count: the plan `pushpull,depcomm` on a hash partition, one training step
(dropout on) on that many gloo processes (gnnc.runtime.distributed.one_step), the all-reduce bytes and the step's
total, predicted and measured, W1's element count and 2 (P-1) x 4 x that (what all-reducing W1 whole would send),
and the largest relative difference of the logits and of any gradient from one process's. Run at the commit before
the split (in a worktree) it gives the "before" column of benchmarks/RESULTS-seeds.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import tempfile

import numpy as np
import torch

from gnnc import api
from gnnc.testing import first_training_step
from gnnc.ir.dims import eval_dim
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.launch import launch
from gnnc.runtime.train import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEED = 3


def one_process(program, graph) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and gradients of the same step (dropout on, the same masks) in one process."""
    logits, _, grads = first_training_step(program, graph, SEED)
    return logits, grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def w1_elements(program) -> int:
    """Elements of the first graph layer's dense maps of its input (W1: GCN's one, SAGE's two)."""
    cfg = program.config_dict()
    first = program.graph_layers()[0]
    weights = {e.ins[1].name for e in first.eqns if e.op == "linear" and e.ins[0].name == first.inputs[0].name}
    return sum(int(np.prod([eval_dim(d, cfg) for d in p.value.type.shape])) for p in first.params
               if p.value.name in weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="planetoid:cora")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--models", default="gcn,sage")
    args = ap.parse_args()
    graph = api.load_graph(args.graph)
    print("| model | P | W1 elements | 2(P-1)x4xW1 | allreduce predicted | allreduce measured | step predicted | "
          "step measured | logits rel | worst gradient rel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in args.worlds.split(",")]:
            cases = []
            for name in args.models.split(","):
                model = api.load_model(EXAMPLES / f"{name}.gnn")
                plan = api.compile(model, graph, workers=world, strategy="pushpull,depcomm", partition="hash")
                shards = plan.write_shards(Path(tmp) / f"{name}-{world}")
                job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False,
                                                                          use_kernels=False))
                cases.append((name, api.compile(model, graph).program, job, plan.meta.predicted_bytes_per_step))
            results = launch(one_step_each, world, [job for _, _, job, _ in cases])[0]
            for (name, single, _, predicted), got in zip(cases, results):
                logits, grads = one_process(single, graph)
                worst, worst_name = max((rel(got["grads"][k], g) if got["grads"][k].shape == g.shape else float("inf"),
                                         k) for k, g in grads.items())
                measured = got["bytes_by_op"]
                w1 = w1_elements(single)
                print(f"| {name} | {world} | {w1} | {2 * (world - 1) * 4 * w1} | {predicted['allreduce']} | "
                      f"{measured.get('allreduce', 0)} | {sum(predicted.values())} | {sum(measured.values())} | "
                      f"{rel(got['logits'], logits):.1e} | {worst:.1e} ({worst_name}) |")


if __name__ == "__main__":
    main()
