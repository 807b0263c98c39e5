"""Every tensor of a run lives on its device, and the epoch loop never waits for the device, checked without a GPU.

The stand-in device of `standin_device` labels CPU data as another device and records every op that mixes
devices and, inside the loop, every host read of a device tensor (`.item()`, `bool()`, `.cpu()`, `.tolist()`,
...), every size that depends on device values, every upload of a tensor that should have been placed before,
and every collective given host tensors (NCCL takes device tensors only). On it run:

* a full training step (forward, backward, optimizer) and the evaluation forward of every example, twice
  (the second with every cache built and the optimizer's state made), through the worker's `train_epoch`,
  which `fit` runs; and `fit` itself, whose only reads are one per epoch (its metrics) and one before the first;
* the per-rank step of every strategy on 2 gloo ranks, with the same check on each rank (GNNPipe's pipeline:
  its refresh, its pipelined step through two stages, its history), under every kind of schedule the
  schedule pass writes: overlapped halos and staged broadcasts split by source part (the default; max and
  min aggregations too), nothing overlapped, and G3's bins (eager bins of held rows, recomputed in backward);
* sampled minibatches in one process (sequential and P3's 2F2B): each minibatch's blocks and inputs are
  sampled on the host and copied to the device (uploads, by design), and nothing else crosses.

The values are real, so the stand-in runs are also compared with the same steps on the CPU.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, EXTREMES, SCHEDULES, random_graph
from gnnc import api
from gnnc.graph.sampling import SamplingConfig
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.pipeline import is_pipeline
from gnnc.runtime.distributed import DistJob, DistWorker
from gnnc.runtime.executor import init_params
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.minibatch import MinibatchWorker
from gnnc.runtime.pipeline import PipelineWorker
from gnnc.runtime.train import TrainConfig, Worker, fit, make_optimizer
from standin_device import STANDIN, StandinDevice

STEPS = 2
# every example, one with sparse (bag-of-words) inputs, and GraphSAGE with a batch norm between its layers
# (running statistics; on several ranks an all-reduce of its sums); SGC's propagation is hoisted out of the loop
EXAMPLE_CASES = {"gcn": ("gcn", {}), "sage": ("sage", {}), "gin": ("gin", {}), "gat": ("gat", {}),
                 "gcnii": ("gcnii", {"layers": 3}), "sgc": ("sgc", {}), "gin-sparse": ("gin", {}),
                 "sage-bn": ("sage", {})}
SAGE_BN = """
model SAGEBN(features, hidden = 16, classes) {
  h = SAGE(features, hidden)(x)
  h = batch_norm(relu(h))
  h = dropout(h, 0.5)
  h = SAGE(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""




def model_for(case: str):
    case = case.split("@")[0]
    if case == "extremes":
        return api.load_model_source(EXTREMES, "extremes.gnn")
    name, params = EXAMPLE_CASES[case]
    if case == "sage-bn":  # examples/sage.gnn's layer, another model
        layers = (EXAMPLES / "sage.gnn").read_text().split("model ")[0]
        return api.load_model_source(layers + SAGE_BN, "sage-bn.gnn", **params)
    return api.load_model(EXAMPLES / f"{name}.gnn", **params)


def graph_for(case: str):
    if case.endswith("@sbm"):  # communities: a part holds whole ones, so some bins read only held rows
        return api.load_graph("sbm:n=80,blocks=4,deg=4,intra=0.97,features=10,classes=4,seed=1")
    g = random_graph(n=40, e=160, f=12, c=4, seed=2)
    if case.endswith("-sparse"):  # bag-of-words inputs: kept sparse, moved and dropped out as such
        g.x = g.x * (torch.rand(g.x.shape, generator=torch.Generator().manual_seed(5)) < 0.03)
    return g


def program_for(case: str, graph):
    return api.compile(model_for(case), graph).program


def steps(worker, params, opt) -> torch.Tensor:
    """STEPS training steps as `fit` takes them, each followed by the evaluation forward; the last logits."""
    logits = None
    for epoch in range(STEPS):
        worker.train_epoch(params, opt, epoch)
        with torch.no_grad():
            logits, _ = worker.forward(params, False, epoch)
    return logits


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    # Adam's step counters stay on the host by torch's design (non-capturable): read there, never synced
    return [t for state in opt.state.values() for k, t in state.items() if k != "step" and torch.is_tensor(t)]


def cpu_logits(program, graph) -> torch.Tensor:
    cfg = TrainConfig(progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, cfg.seed)
    return steps(worker, params, make_optimizer(program, params, cfg))


@pytest.mark.parametrize("case", list(EXAMPLE_CASES))
def test_a_training_step_of_every_example_stays_on_the_device(case: str) -> None:
    graph = graph_for(case)
    program = program_for(case, graph)
    with StandinDevice() as sd:
        cfg = TrainConfig(progress=False, device=STANDIN.type)
        worker = Worker(program, graph, cfg)
        params = init_params(program, cfg.seed, worker.device)
        opt = make_optimizer(program, params, cfg)
        with sd.watch():
            logits = steps(worker, params, opt)
        touched = [*params.values(), *(p.grad for p in params.values()), *optimizer_tensors(opt),
                   *worker.inputs.values(), *worker.state.values(), worker.ids, logits]
        assert all(sd.on_device(t) for t in touched), "a tensor of the run is not on the device"
        assert sd.problems() == [], "\n".join(sd.problems())
        got = sd.host(logits)
    torch.testing.assert_close(got, cpu_logits(program, graph), rtol=1e-5, atol=1e-6)


def test_fit_reads_the_device_once_per_epoch() -> None:
    graph = graph_for("gcn")
    program = program_for("gcn", graph)
    epochs = 3
    with StandinDevice() as sd:
        cfg = TrainConfig(progress=False, device=STANDIN.type, epochs=epochs)
        worker = Worker(program, graph, cfg)
        with sd.watch():
            result = fit(worker, cfg)
    assert len(result.history) == epochs and 0 <= result.test_acc <= 1
    reads = Counter(e.function for e in sd.events if e.kind == "read")
    # the training count before the first epoch, then the epoch's metrics, then (after the last epoch) the
    # trained weights and op state, each once: nothing else
    assert set(reads) == {"train_vertices", "epoch_metrics", "host_weights"}, sd.problems()
    assert reads["train_vertices"] == 1 and reads["epoch_metrics"] == epochs, sd.problems()
    # what goes to the device in `fit` are its parameters, once, before the first epoch, and the host's own
    # figures of each epoch (its seconds and activation bytes) for the maximum over ranks
    uploads = Counter(e.function for e in sd.events if e.kind == "upload")
    assert set(uploads) == {"init_params", "epoch_metrics"} and uploads["epoch_metrics"] == epochs, sd.problems()
    assert sd.problems(("mix", "collective")) == []


# --- every strategy, per rank ------------------------------------------------------------------------

# every strategy and every communication op (halo, fetch, bcast_rows, reduce_scatter, batch_norm's all-reduce,
# the gradient all-reduce, the pipeline's pipe and history), each at least once
STRATEGY_CASES = [("gcn", s) for s in ("depcomm", "bcast1d", "pushpull,depcomm", "depcomm,depcache",
                                       "depcache,depcomm")] + \
                 [("gat", "depcomm"), ("sage", "pushpull,bcast1d"), ("gin-sparse", "hybrid"),
                  ("gcnii", "depcache,depcache,depcomm"), ("sgc", "depcomm"), ("sage-bn", "bcast1d"),
                  ("gcnii", "pipeline"), ("extremes", "depcomm"), ("extremes", "bcast1d")]
# the schedule pass's other choices (the cases above run its default)
SCHEDULED_CASES = [("gcn", "depcomm,bcast1d", "none"), ("gcn@sbm", "depcomm", "bins"),
                   ("gat@sbm", "hybrid,depcache", "bins"), ("extremes@sbm", "depcomm", "bins")]


def assert_schedule(text: str, case: str, strategy: str, schedule: str | None) -> None:
    """The case runs the schedule it is named for (a pass that silently ignored an option would leave the
    new paths untested)."""
    if schedule == "none":
        assert "overlap=true" not in text and "staged=true" not in text and "grad_overlap=false" in text, case
    elif schedule == "bins":
        assert "bins=3" in text and "bin=true" in text, case
    elif case in ("gcn", "extremes") and strategy in ("depcomm", "bcast1d"):
        assert "split=true" in text, (case, strategy)  # overlapped halo / staged broadcast, run part by part


def rank_worker(cfg: DistConfig, job: DistJob, device: torch.device):
    """The worker `gnnc.runtime.rank_worker.worker` runs for `job`, on `device`."""
    return (PipelineWorker if is_pipeline(parse_ir(job.ir)) else DistWorker)(cfg, job, device=device)


def standin_steps(cfg: DistConfig, jobs: list[DistJob]) -> list[dict[str, Any] | None]:
    """Each job's per-rank steps on the stand-in device; rank 0 returns the problems seen by every rank.
    An approximate strategy (the pipeline) computes another function than one process: its steps on the
    CPU come back beside (`reference`)."""
    import torch.distributed as dist

    out = []
    for job in jobs:
        reference = None
        if is_pipeline(parse_ir(job.ir)):
            w = rank_worker(cfg, job, torch.device("cpu"))
            params = w.initial_params(job.train.seed)
            reference = w.gather_logits(steps(w, params, make_optimizer(w.program, params, job.train)))
        with StandinDevice() as sd:
            w = rank_worker(cfg, job, STANDIN)
            params = w.initial_params(job.train.seed)  # a push-pull rank: its slice of W1
            opt = make_optimizer(w.program, params, job.train)
            with sd.watch():
                logits = steps(w, params, opt)
            # a pipeline rank's parameters of the other stages have no gradient
            touched = [*params.values(), *(p.grad for p in params.values() if p.grad is not None),
                       *optimizer_tensors(opt), *w.inputs.values(), *getattr(w, "state", {}).values(),
                       *getattr(w, "history", {}).values(), logits]
            placed = all(sd.on_device(t) for t in touched)
            gathered = w.gather_logits(logits)
        every: list[Any] = [None] * cfg.world_size
        dist.all_gather_object(every, (placed, sd.problems()))
        out.append(None if cfg.rank else {"logits": gathered, "ranks": every, "reference": reference})
    return out


def test_the_per_rank_step_of_every_strategy_stays_on_the_device(tmp_path) -> None:
    world = 2
    jobs, expected = [], []
    cases = [(case, strategy, None) for case, strategy in STRATEGY_CASES] + SCHEDULED_CASES
    for case, strategy, schedule in cases:
        graph = graph_for(case)
        exact = strategy != "pipeline"
        options: dict[str, Any] = {"partition": "metis"} if exact else {"approximate": True}
        if schedule is not None:
            options["passes"] = DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [SCHEDULES[schedule]]
        plan = api.compile(model_for(case), graph, workers=world, strategy=strategy, **options)
        assert_schedule(str(plan.program), case, strategy, schedule)
        shards = plan.write_shards(tmp_path / f"{case}-{strategy}-{schedule}")
        jobs.append(DistJob(str(plan.program), str(shards), TrainConfig(progress=False, device=STANDIN.type)))
        expected.append(cpu_logits(program_for(case, graph), graph) if exact else None)
    results = pooled_launch(standin_steps, world, jobs)[0]
    failures = []
    for (case, strategy, _), got, want in zip(cases, results, expected):
        want = got["reference"] if want is None else want
        for rank, (placed, problems) in enumerate(got["ranks"]):
            if not placed:
                failures.append(f"{case} {strategy} rank {rank}: a tensor of the run is not on the device")
            failures += [f"{case} {strategy} rank {rank}: {p}" for p in problems]
        if not torch.allclose(got["logits"], want, rtol=1e-4, atol=1e-5):
            failures.append(f"{case} {strategy}: logits differ from one process on the CPU by "
                            f"{(got['logits'] - want).abs().max():.2e}")
    assert not failures, "\n".join(failures)


# --- sampled minibatches in one process ------------------------------------------------------------

SAMPLED_CASES = [("sage", "sequential"), ("gat", "sequential"), ("gcn", "2f2b")]


def sampled_epochs(program, graph, device: torch.device, schedule: str) -> tuple[MinibatchWorker, dict, Any]:
    cfg = TrainConfig(progress=False, device=device.type)
    worker = MinibatchWorker(program, graph, cfg, SamplingConfig((4, 3), 8), schedule)
    params = init_params(program, cfg.seed, worker.device)
    opt = make_optimizer(program, params, cfg)
    return worker, params, opt


def test_sampled_minibatches_in_one_process_stay_on_the_device() -> None:
    failures = []
    for case, schedule in SAMPLED_CASES:
        graph = graph_for(case)
        program = program_for(case, graph)
        worker, params, opt = sampled_epochs(program, graph, torch.device("cpu"), schedule)
        want_losses = [worker.train_epoch(params, opt, epoch) for epoch in range(STEPS)]
        want = [r.loss for r in worker.take_records()]
        with StandinDevice() as sd:
            worker, params, opt = sampled_epochs(program, graph, STANDIN, schedule)
            with sd.watch():
                losses = [worker.train_epoch(params, opt, epoch) for epoch in range(STEPS)]
            got = [r.loss for r in worker.take_records()]  # after the loop: the epoch's one read of them
            touched = [*params.values(), *(p.grad for p in params.values() if p.grad is not None),
                       *optimizer_tensors(opt), *losses]
            if not all(sd.on_device(t) for t in touched):
                failures.append(f"{case} {schedule}: a tensor of the run is not on the device")
            # each minibatch's blocks and inputs are uploaded by design; nothing else may cross
            failures += [f"{case} {schedule}: {p}" for p in sd.problems(("mix", "read", "sync", "collective"))]
            got_losses = [float(sd.host(t)) for t in losses]
        if got != pytest.approx(want, rel=1e-5) or got_losses != pytest.approx([float(t) for t in want_losses],
                                                                                rel=1e-5):
            failures.append(f"{case} {schedule}: losses {got_losses} differ from the CPU's {want_losses}")
    assert not failures, "\n".join(failures)
