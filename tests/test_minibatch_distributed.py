"""Sampled minibatches on several gloo processes (gnnc.runtime.minibatch_dist): dp-sample and pushpull compute
the one-process minibatch step (loss, the seeds' logits, every gradient), and the bytes each op sends equal
the planner's prediction from its dry run of the sampler.

One launch per world size runs every case (starting processes is the expensive part). The batch holds
every training vertex, so the predicted epoch is the measured step; training mode, so dropout too.
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.graph.sampling import SamplingConfig
from gnnc.runtime.executor import init_params
from gnnc.runtime.minibatch import MinibatchWorker
from gnnc.runtime.minibatch_dist import SampledJob, sampled_one_step_each
from gnnc.runtime.train import TrainConfig

SEED = 4
SAMPLING = SamplingConfig((4, 3), 10_000)
CASES = [("sage", "dp-sample"), ("sage", "pushpull"), ("gcn", "pushpull"), ("gcn", "dp-sample")]
# what the runtime labels each predicted kind of bytes with ("label/op/direction" -> predict-bytes' name)
KINDS = {"l0/pull_ids/fwd": "pull_ids", "l0/halo/fwd": "halo", "l0.structure/all_gather/fwd": "structure",
         "l0/reduce_scatter/fwd": "reduce_scatter", "l0/all_gather/bwd": "all_gather",
         "grads/allreduce/bwd": "allreduce"}


def one_process(graph, model: str):
    plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph, sampling=SAMPLING)
    cfg = TrainConfig.resolve(plan.program, seed=SEED)
    w = MinibatchWorker(plan.program, graph, cfg, SAMPLING)
    params = init_params(plan.program, SEED)
    (seeds,) = w.epoch_batches(0)
    f = w.prepare(0, 0, seeds, 0, params)
    for phase in (w.forward_m, w.forward_d, w.backward_d, w.backward_m):
        phase(f)
    logits = dict(zip(f.batch.seeds.tolist(), f.env[plan.program.logits.name].detach()))
    return float(f.loss.detach()), logits, {k: p.grad for k, p in params.items()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def check(world: int) -> None:
    graph = random_graph(n=120, e=1500, f=24, seed=9)
    jobs, plans, dirs = [], [], []
    for model, strategy in CASES:
        plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph, workers=world, strategy=strategy,
                           sampling=SAMPLING, seed=SEED)
        d = tempfile.TemporaryDirectory()
        plan.write_shards(d.name)
        dirs.append(d)
        plans.append(plan)
        jobs.append(SampledJob(str(plan.program), d.name, TrainConfig.resolve(plan.program, seed=SEED), SAMPLING))
    results = pooled_launch(sampled_one_step_each, world, jobs)[0]
    failures = []
    for (model, strategy), plan, got in zip(CASES, plans, results):
        key = f"{model}/{strategy}/w{world}"
        loss, logits, grads = one_process(graph, model)
        if abs(got["loss"] - loss) > 1e-5 * abs(loss):
            failures.append(f"{key}: loss {got['loss']} != {loss}")
        want = torch.stack([logits[s] for s in got["seeds"].tolist()])
        if sorted(got["seeds"].tolist()) != sorted(logits) or rel(got["logits"], want) > 1e-5:
            failures.append(f"{key}: the seeds' logits differ")
        for k, g in grads.items():
            if rel(got["grads"][k], g) > 1e-5:
                failures.append(f"{key}: gradient of {k} differs by {rel(got['grads'][k], g):.2e}")
        measured = {KINDS[k]: v for k, v in got["bytes"].items()}
        predicted = {k: v for k, v in plan.meta.predicted_bytes_per_epoch.items() if v}
        if measured != predicted:
            failures.append(f"{key}: measured bytes {measured} != predicted {predicted}")
        first = "pull_ids" if strategy == "dp-sample" else "structure"
        if not measured.get(first):
            failures.append(f"{key}: no {first} bytes")
    for d in dirs:
        d.cleanup()
    assert not failures, "\n".join(failures)


def test_sampled_strategies_on_two_processes_equal_one_process_and_their_predicted_bytes() -> None:
    check(2)


@pytest.mark.slow
def test_sampled_strategies_on_four_processes_equal_one_process_and_their_predicted_bytes() -> None:
    check(4)
