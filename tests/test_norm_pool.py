"""batch_norm, elementwise max/min and jumping knowledge's max (issue 21, item 3).

batch_norm is torch's BatchNorm1d over the vertices: batch statistics in
training, running statistics (momentum, unbiased variance) updated by every
training step and used in evaluation, carried by checkpoints. `max(a, b, ...)`
and `min(...)` are elementwise everywhere but in gather (and sync), where one
argument is the reducer. GraphSAGE with batch norm against PyG is in
test_pyg_equivalence; its synchronised statistics on 2 processes in
test_language_distributed.
"""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.errors import GnncError
from gnnc.runtime.executor import init_params
from gnnc.runtime.train import TrainConfig, Worker, train

BN = """
model M(features, classes) {
  h = batch_norm(linear(x, classes), momentum = 0.3)
  loss = cross_entropy(h, y, mask = train)
}
"""


def test_running_statistics_follow_batchnorm1d_and_serve_evaluation() -> None:
    graph = random_graph(n=30, e=60, f=5, c=4, seed=2)
    program = api.compile(api.load_model_source(BN, "bn.gnn"), graph).program
    worker = Worker(program, graph, TrainConfig(progress=False))
    params = init_params(program, 0)
    bn = torch.nn.BatchNorm1d(4, momentum=0.3)
    z = (graph.x @ params["d0.linear0.weight"] + params["d0.linear0.bias"]).detach()
    for step in range(3):
        worker.forward(params, True, step)
        bn(z)
    state = {k.rsplit(".", 1)[1]: v for k, v in worker.state.items()}
    assert torch.allclose(state["running_mean"], bn.running_mean, rtol=1e-5, atol=1e-6)
    assert torch.allclose(state["running_var"], bn.running_var, rtol=1e-5, atol=1e-6)
    logits, _ = worker.forward(params, False, 3)
    with torch.no_grad():
        want = bn.eval()(z) * params["d0.batch_norm0.weight"] + params["d0.batch_norm0.bias"]
    assert torch.allclose(logits, want, rtol=1e-5, atol=1e-6)


def test_checkpoints_carry_the_running_statistics(tmp_path) -> None:
    """A resumed run evaluates with the statistics of the epochs before the stop, as an uninterrupted one."""
    graph = random_graph(n=40, e=120, f=6, c=3, seed=3)
    program = api.compile(api.load_model_source(BN, "bn.gnn"), graph).program
    whole = train(program, graph, TrainConfig(epochs=4, progress=False))
    train(program, graph, TrainConfig(epochs=2, progress=False, checkpoint_dir=str(tmp_path), checkpoint_every=1))
    resumed = train(program, graph, TrainConfig(epochs=4, progress=False, checkpoint_dir=str(tmp_path),
                                                checkpoint_every=1, resume=True))
    assert torch.equal(resumed.logits, whole.logits)


def test_max_and_min_are_elementwise_outside_gather() -> None:
    source = """
    layer L(in, out) {
      param     c[out] = 0.25
      scatter   m = max(src.h, dst.h)
      gather    a = sum(m)
      transform t = linear(a, out)
      apply     h = min(t, c, -t)
    }
    model M(features, classes) {
      h = L(features, classes)(x)
      loss = cross_entropy(h, y, mask = train)
    }
    """
    graph = random_graph(n=20, e=60, f=3, c=2, seed=1)
    plan = api.compile(api.load_model_source(source, "mm.gnn"), graph)
    program = plan.program
    assert "= maximum[hoisted=true](%l0.m~1, %l0.m~2)" in str(program)  # computed from x alone
    assert "= minimum(%l0.t, %l0.c, %l0.h~1)" in str(program)
    params = init_params(program, 0)
    src, dst = torch.as_tensor(graph.src), torch.as_tensor(graph.dst)
    a = torch.zeros(20, 3).index_add(0, dst, torch.maximum(graph.x[src], graph.x[dst]))
    t = a @ params["l0.linear0.weight"] + params["l0.linear0.bias"]
    want = torch.minimum(torch.minimum(t, params["l0.c"]), -t)
    result = api.run(plan, graph, epochs=1, lr=0.0)
    assert torch.allclose(result.logits, want.detach(), atol=1e-6)


def test_jumping_knowledge_max_over_layer_outputs_trains() -> None:
    source = (EXAMPLES / "gcn.gnn").read_text() + """
    model JK(features, hidden = 8, classes) {
      h1 = relu(GCNConv(features, hidden)(x))
      h2 = relu(GCNConv(hidden, hidden)(h1))
      h3 = relu(GCNConv(hidden, hidden)(h2))
      h = linear(max(h1, h2, h3), classes)
      loss = cross_entropy(h, y, mask = train)
    }
    """
    graph = random_graph(n=40, e=160, f=6, c=3, seed=5)
    plan = api.compile(api.load_model_source(source, "jk.gnn"), graph)
    assert "maximum(%h1, %h2, %h3)" in str(plan.program)
    result = api.run(plan, graph, epochs=8, lr=0.05)
    assert result.history[-1]["loss"] < result.history[0]["loss"]


ERRORS = [
    ("h = max(x)", "bad.gnn:2:7: reducer 'max' can only be used in a gather statement (or sum/mean/max in sync); "
                   "max(a, b, ...) of two or more values is elementwise"),
    ("h = batch_norm(x, momentum = x)", "bad.gnn:2:32: expected a number"),
    ("h = concat(x, batch_norm(x, 0.1))", "bad.gnn:2:17: batch_norm takes 1 positional argument, got 2"),
]


@pytest.mark.parametrize("stmt, message", ERRORS, ids=["max-of-one", "momentum", "positional"])
def test_misuses_are_reported_at_their_place(stmt: str, message: str) -> None:
    source = (f"model M(features, classes) {{\n  {stmt}\n"
              "  loss = cross_entropy(linear(h, classes), y, mask = train)\n}\n")
    with pytest.raises(GnncError) as err:
        api.compile(api.load_model_source(source, "bad.gnn"))
    assert str(err.value).splitlines()[0] == message


def test_batch_norm_before_a_pushpull_layer_is_refused() -> None:
    source = (EXAMPLES / "gcn.gnn").read_text() + """
    model B(features, classes) {
      h = GCNConv(features, classes)(batch_norm(x))
      loss = cross_entropy(h, y, mask = train)
    }
    """
    graph = random_graph(n=20, e=60, f=4, c=2)
    with pytest.raises(GnncError, match="'batch_norm' before layer l0 needs whole rows"):
        api.compile(api.load_model_source(source, "b.gnn"), graph, workers=2, strategy="pushpull", partition="hash")
