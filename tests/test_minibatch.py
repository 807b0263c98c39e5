"""Sampled minibatch training in one process (gnnc.runtime.minibatch): the same IR on blocks, exact against
full-graph training at fan-out -1, P3's 2F2B with weight stashing, per-minibatch metrics, the CLI's checks."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.cli import main
from gnnc.graph.sampling import FULL, SamplingConfig
from gnnc.runtime.executor import init_params
from gnnc.runtime.metrics import read_metrics, summarize
from gnnc.runtime.minibatch import MinibatchWorker
from gnnc.runtime.train import TrainConfig, Worker, make_optimizer


SMALL = "sbm:n=100,blocks=4,deg=4,features=8,classes=4,seed=0"  # 60 training vertices


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def step(worker: MinibatchWorker, flight) -> None:
    for phase in (worker.forward_m, worker.forward_d, worker.backward_d, worker.backward_m):
        phase(flight)


@pytest.mark.parametrize("model", ["sage", "gcn", "gin", "gat", "gcn+weights"])
def test_a_full_fanout_batch_of_every_training_vertex_is_a_full_graph_step(model) -> None:
    """Fan-out -1 and one batch: the minibatch step's loss, seeds' logits and every gradient equal the
    full-graph step's (training mode: dropout drawn by global ids; gcn_norm with its scale of 1, weighted
    by the graph's edge weights when it has them)."""
    graph = random_graph(n=60, e=400, seed=3)
    if model.endswith("+weights"):
        model = model.split("+")[0]
        graph.edge_data = {"weight": torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(1)) + 0.5}
    plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph)
    cfg = TrainConfig.resolve(plan.program, seed=5)
    full = Worker(plan.program, graph, cfg)
    p_full = init_params(plan.program, 5)
    logits, loss = full.forward(p_full, True, 0)
    loss.backward()
    layers = len(plan.program.graph_layers())
    mw = MinibatchWorker(plan.program, graph, cfg, SamplingConfig((FULL,) * layers, 10_000))
    (seeds,) = mw.epoch_batches(0)
    p_mb = init_params(plan.program, 5)
    f = mw.prepare(0, 0, seeds, 0, p_mb)
    step(mw, f)
    assert abs(float(f.loss.detach()) - float(loss.detach())) <= 1e-6 * abs(float(loss.detach()))
    assert rel(f.env[plan.program.logits.name].detach(), logits.detach()[torch.from_numpy(seeds)]) < 1e-5
    for name, p in p_full.items():
        assert rel(p_mb[name].grad, p.grad) < 1e-5, name


def test_a_sampled_step_runs_on_smaller_blocks() -> None:
    graph = random_graph(n=200, e=3000, seed=4)
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph)
    mw = MinibatchWorker(plan.program, graph, TrainConfig.resolve(plan.program), SamplingConfig((3, 2), 16))
    batches = mw.epoch_batches(0)
    assert [len(b) for b in batches] == [16] * (len(mw.train_ids) // 16) + ([len(mw.train_ids) % 16] * (
        len(mw.train_ids) % 16 > 0))
    f = mw.prepare(0, 0, batches[0], 0, init_params(plan.program, 0))
    step(mw, f)
    first, last = f.batch.blocks
    assert last.n_dst == 16 and first.n_src < graph.num_nodes and np.diff(last.indptr).max() <= 3 + 1
    assert f.env[plan.program.logits.name].shape[0] == 16


def test_2f2b_applies_each_gradient_computed_on_the_weights_of_three_steps_before() -> None:
    """The pipelined schedule equals a plain loop that computes step t's gradient on w_{max(0, t-3)}."""
    graph = random_graph(n=120, e=1500, seed=8)
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph)
    cfg = TrainConfig.resolve(plan.program, seed=2, lr=0.05)
    sampling = SamplingConfig((4, 3), 12)
    piped = MinibatchWorker(plan.program, graph, cfg, sampling, "2f2b")
    params = init_params(plan.program, 2)
    opt = make_optimizer(plan.program, params, cfg)
    for epoch in range(2):
        piped.train_epoch(params, opt, epoch)

    ref = MinibatchWorker(plan.program, graph, cfg, sampling)
    want = init_params(plan.program, 2)
    ref_opt = make_optimizer(plan.program, want, cfg)
    history = [{k: v.detach().clone() for k, v in want.items()}]
    n = len(ref.epoch_batches(0))
    assert n >= 5
    for epoch in range(2):
        for i, seeds in enumerate(ref.epoch_batches(epoch)):
            t = epoch * n + i
            stale = {k: v.clone().requires_grad_(True) for k, v in history[max(0, t - 3)].items()}
            f = ref.prepare(epoch, i, seeds, t, stale)
            step(ref, f)
            for k, p in want.items():
                p.grad = stale[k].grad
            ref_opt.step()
            history.append({k: v.detach().clone() for k, v in want.items()})
    for k in want:
        assert torch.allclose(params[k], want[k], rtol=1e-5, atol=1e-6), k
    plain = init_params(plan.program, 2)  # and it is not the sequential schedule's trajectory
    seq_opt = make_optimizer(plan.program, plain, cfg)
    for epoch in range(2):
        ref.train_epoch(plain, seq_opt, epoch)
    assert any(not torch.allclose(params[k], plain[k], rtol=1e-3, atol=1e-4) for k in plain)


def test_metrics_hold_one_record_per_minibatch_beside_the_epochs(tmp_path) -> None:
    out = tmp_path / "run.jsonl"
    code = main(["run", str(EXAMPLES / "sage.gnn"), "--graph", SMALL, "--fanout", "5,3",
                 "--batch-size", "16", "--epochs", "2", "--metrics", str(out), "--json"])
    assert code == 0
    records = read_metrics(out)
    mini = [r for r in records if r.get("kind") == "minibatch"]
    assert [(r["epoch"], r["batch"]) for r in mini] == [(e, b) for e in range(2) for b in range(4)]  # 60 / 16
    assert all(r["seeds"] in (16, 12) and len(r["sampled_vertices"]) == 2 and r["sampled_edges"][1] <= 5 * r["seeds"]
               and {"sample", "forward_d", "backward_d", "step"} <= set(r["phase_s"]) for r in mini)
    assert summarize(records)["epochs"] == 2


def test_the_cli_refuses_what_does_not_fit(capsys) -> None:
    sage = str(EXAMPLES / "sage.gnn")
    cases = [(["--fanout", "5,3"], "needs --batch-size"),
             (["--batch-size", "5"], "--batch-size needs --fanout"),
             (["--fanout", "5", "--batch-size", "8"], "1 fan-outs for a model with 2 graph layers"),
             (["--fanout", "5,3", "--batch-size", "8", "--schedule", "2f2b"],
              "schedule 2f2b: each minibatch's gradient is computed on weights 3 optimizer steps old"),
             (["--schedule", "2f2b", "--approximate"], "pipelines sampled minibatches"),
             (["--fanout", "5,3", "--batch-size", "8", "--nproc", "2", "--strategy", "depcomm"],
              "'depcomm' does not train sampled minibatches"),
             (["--nproc", "2", "--strategy", "dp-sample"], "'dp-sample' does not train full-graph steps")]
    for extra, message in cases:
        assert main(["run", sage, "--graph", SMALL, "--epochs", "1", *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert main(["run", sage, "--graph", SMALL, "--epochs", "1", "--fanout", "5,3", "--batch-size", "16",
                 "--schedule", "2f2b", "--approximate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["epochs"] == 1


def test_a_sampled_plan_round_trips_and_refuses_a_malformed_sampling_field(tmp_path) -> None:
    from gnnc.errors import PlanError

    graph = random_graph(n=60, e=400, seed=3)
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=2, strategy="pushpull",
                       sampling=SamplingConfig((4, 3), 16))
    assert [layer.attr("strategy") for layer in plan.program.graph_layers()] == ["pushpull", "dp-sample"]
    plan.save(tmp_path / "p")
    again = api.Plan.load(tmp_path / "p")
    assert again.sampling == SamplingConfig((4, 3), 16) and again.schedule == "sequential"
    assert again.meta.predicted_bytes_per_epoch == plan.meta.predicted_bytes_per_epoch
    data = json.loads((tmp_path / "p" / "plan.json").read_text())
    for field, value, message in [("sampling", {"fanouts": "25,10", "batch_size": 4}, "list of integers"),
                                  ("sampling", {"fanouts": [4, 0], "batch_size": 4}, "positive count"),
                                  ("schedule", "3f3b", "unknown schedule")]:
        (tmp_path / "p" / "plan.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(PlanError, match=message):
            api.Plan.load(tmp_path / "p")


def test_the_sampled_planner_offers_2f2b_only_with_approximate_and_marks_it() -> None:
    graph = random_graph(n=120, e=1500, f=64, seed=1)
    model = api.load_model(EXAMPLES / "sage.gnn")
    exact = api.compile(model, graph, workers=2, sampling=SamplingConfig((4, 3), 16), cluster="p3")
    schedules = {a["schedule"] for a in exact.meta.planner.alternatives}
    assert schedules == {"sequential"} and not exact.meta.approximations
    loose = api.compile(model, graph, workers=2, sampling=SamplingConfig((4, 3), 16), cluster="p3", approximate=True,
                        explain=True)
    marked = [a for a in loose.meta.planner.alternatives if a["schedule"] == "2f2b"]
    assert len(marked) == 1 and "3 optimizer steps old" in marked[0]["approximate"][0]
    assert any("crossover" not in c and "pushpull sends fewer bytes than dp-sample" in c
               for c in loose.meta.planner.crossovers)
