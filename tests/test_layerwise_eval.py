"""--eval-every K (issue 35, item 2): the evaluation's forward pass over every vertex runs after every K-th epoch
only (and the first epoch run and the last), with the same training and the same final logits as evaluating every
epoch; a bad K exits 2 naming the flag."""
from __future__ import annotations

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, random_graph
from gnnc import api, cli
from gnnc.runtime import train as train_module

GCN = str(EXAMPLES / "gcn.gnn")


def _run(graph, monkeypatch, **kwargs):
    evaluations: list[int] = []
    forward = train_module.Worker.forward

    def counted(self, params, training, epoch):
        if not training:
            evaluations.append(epoch)
        return forward(self, params, training, epoch)

    monkeypatch.setattr(train_module.Worker, "forward", counted)
    result = api.run(api.load_model(GCN), graph, epochs=7, seed=3, **kwargs)
    monkeypatch.setattr(train_module.Worker, "forward", forward)
    return result, evaluations


def test_evaluation_every_k_epochs_trains_the_same(monkeypatch) -> None:
    graph = random_graph(n=60, e=300, f=8, c=3, seed=1)
    every, each = _run(graph, monkeypatch)
    sparse, when = _run(graph, monkeypatch, eval_every=3)
    assert each == list(range(7)) and when == [0, 3, 6]  # the first, every third, the last
    assert [r["evaluated"] for r in sparse.history] == [True, False, False, True, False, False, True]
    assert torch.equal(sparse.logits, every.logits)  # the training does not depend on how often it is evaluated
    assert [r["loss"] for r in sparse.history] == [r["loss"] for r in every.history]
    assert sparse.best_epoch in when and sparse.history[sparse.best_epoch]["evaluated"]
    for r in sparse.history:  # between evaluations, the last evaluation's figures
        if not r["evaluated"]:
            last = max(e for e in when if e < r["epoch"])
            assert r["val_acc"] == sparse.history[last]["val_acc"]


@pytest.mark.parametrize("k", ["0", "-2", "x"])
def test_a_bad_eval_every_exits_2_naming_the_flag(k: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", GCN, "--graph", "planetoid:cora", "--eval-every", k])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --eval-every:" in err and "unrecognized" not in err


def test_train_config_refuses_a_bad_eval_every() -> None:
    with pytest.raises(train_module.GnncError, match="--eval-every: must be a whole number of at least 1"):
        train_module.TrainConfig(eval_every=0)


# ----- layer-wise evaluation in row chunks (issue 35, item 2)

ALL_EXAMPLES = ["gcn", "gat", "sage", "gin", "gcnii", "sgc", "node_regression"]


def _evaluation(program, graph, chunk: int, monkeypatch=None) -> tuple[torch.Tensor, list[bool]]:
    """One process's evaluation logits after hoisting, with `chunk` rows per chunk (0: whole layers), and for each
    graph layer whether it ran in chunks."""
    from gnnc.runtime import layerwise

    ran: list[bool] = []
    if monkeypatch is not None:
        chunked = layerwise.run_layer_chunked

        def recorded(*args, **kwargs):
            ran.append(chunked(*args, **kwargs))
            return ran[-1]

        monkeypatch.setattr(layerwise, "run_layer_chunked", recorded)
    worker = train_module.Worker(program, graph, train_module.TrainConfig(epochs=1, progress=False, eval_chunk=chunk))
    params = worker.initial_params(3)
    with torch.no_grad():
        worker.forward(params, False, 0)  # the hoisted values, as after a first training step
        ran.clear()
        logits, _ = worker.forward(params, False, 0)
    if monkeypatch is not None:
        monkeypatch.undo()
    return logits, ran


def _accuracies(logits: torch.Tensor, graph) -> list[float]:
    pred = logits.argmax(1)
    return [float((pred[m] == graph.y[m]).float().mean()) for m in (graph.train_mask, graph.val_mask, graph.test_mask)]


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_layerwise_evaluation_equals_the_whole_forward(name: str, monkeypatch) -> None:
    graph = random_graph(n=90, e=600, f=8, c=3, seed=2)
    program = api.compile(api.load_model(EXAMPLES / f"{name}.gnn",
                                         **({"layers": 4} if name == "gcnii" else {})), graph).program
    whole, _ = _evaluation(program, graph, 0)
    for chunk in (7, 1000):  # many chunks (the last one short), and one holding every row
        got, ran = _evaluation(program, graph, chunk, monkeypatch)
        assert ran and all(ran), (name, ran)  # every graph layer ran in chunks, none fell back to the whole layer
        assert torch.allclose(got, whole, rtol=1e-6, atol=1e-6 * float(whole.abs().max())), name
        if graph.num_classes == whole.shape[1] and name != "node_regression":
            assert _accuracies(got, graph) == _accuracies(whole, graph)


def test_a_layer_reading_an_aggregate_at_its_sources_runs_whole() -> None:
    """Two aggregations in one layer, the second over the first's result: its sources need every row of a value
    computed per chunk, which layer-wise evaluation does not run; the layer runs whole, with the same logits."""
    from gnnc.runtime import layerwise

    model = api.load_model_source("""
layer Twice(in, out) with self_loops {
  transform t = linear(h, out)
  scatter   m = edge.gcn_norm * src.t
  gather    a = sum(m)
  scatter   m2 = edge.gcn_norm * src.a
  gather    b = sum(m2)
  apply     h = relu(b)
}
model M(features, hidden = 8, classes) {
  h = Twice(features, hidden)(x)
  h = Twice(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
""", "twice.gnn")
    graph = random_graph(n=50, e=300, f=8, c=3, seed=4)
    program = api.compile(model, graph).program
    assert all(layerwise.split_layer(layer) is None for layer in program.graph_layers())
    whole, _ = _evaluation(program, graph, 0)
    got, _ = _evaluation(program, graph, 5)
    assert torch.allclose(got, whole, rtol=1e-6, atol=1e-7)


def test_train_config_refuses_a_bad_eval_chunk() -> None:
    with pytest.raises(train_module.GnncError, match="--eval-chunk: must be a whole number of rows"):
        train_module.TrainConfig(eval_chunk=-1)


def _rank_evaluations(cfg, jobs):
    """On each rank, for each job: the evaluation's logits of every vertex (rank 0) and its exchanges' bytes, whole
    and in chunks of 3 rows; and whether each graph layer ran in chunks."""
    import dataclasses

    from gnnc.runtime import layerwise
    from gnnc.runtime.distributed import DistWorker

    ran: list[bool] = []
    chunked = layerwise.run_layer_chunked

    def recorded(*args, **kwargs):
        ran.append(chunked(*args, **kwargs))
        return ran[-1]

    layerwise.run_layer_chunked = recorded
    import gnnc.runtime.distributed as distributed  # the name it imported

    distributed.run_layer_chunked = recorded
    out = []
    for job in jobs:
        worker = DistWorker(cfg, job)
        params = worker.initial_params(job.train.seed)
        got = {}
        with torch.no_grad():
            worker.forward(params, False, 0)  # the hoisted values
            for chunk in (0, 3):
                worker.cfg = dataclasses.replace(job.train, eval_chunk=chunk)
                worker.stats.reset()
                ran.clear()
                logits, _ = worker.forward(params, False, 0)
                got[chunk] = (worker.gather_logits(logits), worker.stats.total_bytes(), list(ran))
        out.append(got)
    return out if cfg.rank == 0 else None


DIST_CASES = [("gcn", "depcomm"), ("gcn", "depcache"), ("gcn", "bcast1d"), ("gcn", "pushpull,depcomm"),
              ("sage", "hybrid"), ("gin", "depcomm,bcast1d"), ("gat", "depcomm"), ("gat", "pushpull,hybrid"),
              ("gat", "depcache,depcomm")]


# G3's bins, and a halo in one part per peer (NeutronStar's chunks)
SCHEDULED = [("gcn", "depcomm@bins=3"), ("gat", "depcomm@chunked=on")]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_layerwise_evaluation_on_ranks_equals_the_whole_forward(world: int, tmp_path) -> None:
    """Every rank evaluates its rows layer by layer, its exchanges run whole as in the training forward: the same
    logits as its whole forward and as one process, the same bytes, and every row layer in chunks (P3's feature-
    sliced first layer runs whole)."""
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
    from gnnc.plan.schedule_attrs import split_exchange
    from gnnc.runtime.distributed import DistJob

    graph = random_graph(n=80, e=500, f=8, c=3, seed=5)
    jobs, singles = [], []
    for k, (name, strategy) in enumerate(DIST_CASES + SCHEDULED):
        strategy, _, sched = strategy.partition("@")
        passes = (DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [f"schedule{{{sched}}}"]) if sched else None
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        plan = api.compile(model, graph, workers=world, strategy=strategy, partition="metis", passes=passes)
        shards = plan.write_shards(tmp_path / str(k))
        jobs.append(DistJob(str(plan.program), str(shards), train_module.TrainConfig(seed=3, progress=False)))
        if (name, strategy, sched) == ("gcn", "depcomm", ""):  # an overlapped halo: the structure held by parts
            assert all(split_exchange(layer) is not None for layer in plan.program.graph_layers())
        singles.append(api.compile(model, graph).program)
    results = pooled_launch(_rank_evaluations, world, jobs)[0]
    for (name, strategy), single, got in zip(DIST_CASES + SCHEDULED, singles, results):
        (whole, whole_bytes, _), (chunks, chunk_bytes, ran) = got[0], got[3]
        one, _ = _evaluation(single, graph, 0)
        layers = len(single.graph_layers()) - strategy.startswith("pushpull")
        assert ran.count(True) == layers, (name, strategy, ran)
        assert chunk_bytes == whole_bytes, (name, strategy)
        for ref in (whole, one):
            assert torch.allclose(chunks, ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max())), (name, strategy)
        assert _accuracies(chunks, graph) == _accuracies(whole, graph)


def test_eval_chunk_reaches_the_evaluation_from_gnnc_run(monkeypatch) -> None:
    """api.run(eval_chunk=ROWS) (gnnc run --eval-chunk ROWS) evaluates layer-wise: the same logits and history as
    whole layers."""
    from gnnc.runtime import layerwise

    graph = random_graph(n=60, e=300, f=8, c=3, seed=1)
    whole = api.run(api.load_model(GCN), graph, epochs=2, seed=3, eval_chunk=0)
    ran: list[bool] = []
    chunked = layerwise.run_layer_chunked
    monkeypatch.setattr(layerwise, "run_layer_chunked", lambda *a, **k: ran.append(chunked(*a, **k)) or ran[-1])
    got = api.run(api.load_model(GCN), graph, epochs=2, seed=3, eval_chunk=8)
    assert ran and all(ran)
    assert torch.allclose(got.logits, whole.logits, rtol=1e-6, atol=1e-7)
    assert [r["val_acc"] for r in got.history] == [r["val_acc"] for r in whole.history]


def test_a_bad_eval_chunk_exits_2_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", GCN, "--graph", "planetoid:cora", "--eval-chunk", "-1"])
    assert exc.value.code == 2 and "argument --eval-chunk:" in capsys.readouterr().err


def test_the_run_chooses_layerwise_evaluation_on_ranks_near_the_memory_there_is(monkeypatch) -> None:
    """Asked: as asked. Otherwise whole layers in one process (its fused chains hold no edge value), and on several
    processes layer-wise once they are predicted above WARN_FRACTION of the memory available."""
    from gnnc import memory_check
    from gnnc.host import AvailableMemory
    from gnnc.passes.cost.memory import MemoryEstimate

    two = MemoryEstimate((4e9, 4e9), {})
    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(int(20e9), "test"))
    assert memory_check.evaluation_chunk(two, None) == 0
    assert memory_check.evaluation_chunk(two, 500) == 500
    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(int(9e9), "test"))
    assert memory_check.evaluation_chunk(two, None) == memory_check.EVAL_CHUNK_ROWS
    assert memory_check.evaluation_chunk(two, 0) == 0
    assert memory_check.evaluation_chunk(MemoryEstimate((8e9,), {}), None) == 0
