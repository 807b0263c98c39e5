"""P3's 2F2B pipeline across ranks (issue 38 item 3, P3 section 3.3): push-pull on 2 gloo processes posts each
minibatch's structure push a tick before its use and waits on it just before the model-parallel forward that reads
it, overlapped with the other minibatches' phases; the sequential schedule waits at once. Both equal one process
running the same schedule (2F2B's only change is its stale weights, P3's equation (3)), and the bytes each op sends
equal the planner's prediction. Each rank holds and updates only its feature slice's rows of W1 (P3 section 3.2.2),
which the gradient all-reduce leaves out."""
from __future__ import annotations

import tempfile

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.graph.sampling import SamplingConfig
from gnnc.runtime.executor import init_params
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.minibatch import MinibatchWorker
from gnnc.runtime.minibatch_dist import DistMinibatchWorker, SampledJob
from gnnc.runtime.train import TrainConfig, make_optimizer

SEED = 3
EPOCHS = 2
SAMPLING = SamplingConfig((4, 3), 12)
SCHEDULES = ("sequential", "2f2b")
# what the runtime labels each predicted kind of bytes with (as tests/test_minibatch_distributed.py)
KINDS = {"l0.structure/all_gather/fwd": "structure", "l0/reduce_scatter/fwd": "reduce_scatter",
         "l0/all_gather/bwd": "all_gather", "grads/allreduce/bwd": "allreduce"}


class _Recording(DistMinibatchWorker):
    """Logs when each minibatch's push is posted and waited on, and when other phases run."""

    def __init__(self, cfg, job):
        super().__init__(cfg, job)
        self.events: list[tuple[str, int]] = []

    def start_prepare(self, epoch, index, *args, **kwargs):
        self.events.append(("post", index))
        return super().start_prepare(epoch, index, *args, **kwargs)

    def finish_prepare(self, f) -> None:
        self.events.append(("wait", f.batch.index))
        super().finish_prepare(f)

    def forward_d(self, f) -> None:
        self.events.append(("forward_d", f.batch.index))
        super().forward_d(f)


def _train(cfg: DistConfig, jobs: list[SampledJob]) -> list[dict] | None:
    out = []
    for job in jobs:
        w = _Recording(cfg, job)
        params = w.initial_params(job.train.seed)  # W1: this rank's slice's rows (P3's split weights)
        opt = make_optimizer(w.program, params, job.train)
        losses, sent = [], None
        for e in range(EPOCHS):
            losses.append(float(w.sum(w.train_epoch(params, opt, e).reshape(1).float())[0]))
            if sent is None:  # the planner's dry run samples epoch 0
                counts = w.stats.as_dict()
                sent = w.sum(torch.tensor([counts[k]["bytes"] if k in counts else 0 for k in KINDS],
                                          dtype=torch.float64))
        out.append({"losses": losses, "weights": w.whole_weights({k: p.detach() for k, p in params.items()}),
                    "split": {k: tuple(params[k].shape) for k in w.split},
                    "events": w.events, "bytes": dict(zip(KINDS.values(), sent.tolist()))})
    return out if cfg.rank == 0 else None


def _one_process(graph, program, cfg: TrainConfig, schedule: str) -> tuple[list[float], dict]:
    w = MinibatchWorker(program, graph, cfg, SAMPLING, schedule)
    params = init_params(program, cfg.seed)
    opt = make_optimizer(program, params, cfg)
    losses = [float(w.train_epoch(params, opt, e)) for e in range(EPOCHS)]
    return losses, {k: p.detach() for k, p in params.items()}


def test_2f2b_posts_each_push_a_tick_ahead_and_trains_as_one_process() -> None:
    graph = random_graph(n=120, e=1500, f=24, seed=9)
    plans, jobs, dirs = [], [], []
    for schedule in SCHEDULES:
        plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=2, strategy="pushpull",
                           sampling=SAMPLING, seed=SEED, schedule=schedule, approximate=True)
        d = tempfile.TemporaryDirectory()
        plan.write_shards(d.name)
        plans.append(plan)
        dirs.append(d)
        jobs.append(SampledJob(str(plan.program), d.name, TrainConfig.resolve(plan.program, seed=SEED, lr=0.05),
                               SAMPLING, schedule))
    try:
        results = pooled_launch(_train, 2, jobs)[0]
    finally:
        for d in dirs:
            d.cleanup()
    for schedule, plan, job, got in zip(SCHEDULES, plans, jobs, results):
        losses, weights = _one_process(graph, plan.program, job.train, schedule)
        assert got["losses"] == pytest.approx(losses, rel=1e-5), schedule
        for k, want in weights.items():
            assert torch.allclose(got["weights"][k], want, rtol=1e-5, atol=1e-6), (schedule, k)
        predicted = {k: v for k, v in plan.meta.predicted_bytes_per_epoch.items() if v}
        assert {k: int(v) for k, v in got["bytes"].items() if v} == predicted, schedule
        # W1 stays split (SAGE's two first-layer maps of the features): rank 0 held its 12 of 24 feature rows of
        # each, and the all-reduce is every other weight's
        assert len(got["split"]) == 2 and all(got["split"][k] == (12, weights[k].shape[1]) for k in got["split"])
        others = sum(t.numel() for k, t in weights.items() if k not in got["split"])
        batches = len([e for e in got["events"] if e[0] == "forward_d"]) // EPOCHS
        assert predicted["allreduce"] == batches * 2 * (2 - 1) * others * 4
        events = got["events"]
        n = len([e for e in events if e[0] == "forward_d"]) // EPOCHS
        assert n >= 5
        for i in range(1, n):
            between = events[events.index(("post", i)) + 1:events.index(("wait", i))]
            # sequential: waited on at once; 2F2B: posted after minibatch i-1's model-parallel forward and waited
            # on after i-2's data-parallel phases (and its model-parallel backward and optimizer step) ran
            want = [("forward_d", i - 2)] if schedule == "2f2b" and i >= 2 else []
            assert between == want, (schedule, i, between)
