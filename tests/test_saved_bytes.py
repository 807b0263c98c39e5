"""Fewer bytes kept for the backward, the same logits and gradients (issue 35, item 1).

The dropout of the input features is drawn again in the backward of the linear that reads it (rng.Redraw,
rng.matmul_redrawn) instead of being kept: a training step keeps no [vertices, features] tensor for it.

A training step's epilogue chain (gnnc.runtime.fusion: bias, activation, dropout) keeps its result for its
backward; the training loop runs one backward and reads the result no more, so the backward writes its input's
gradient over that result (ExecContext.overwrite_saved) instead of allocating a third [vertices, width] tensor
beside the incoming gradient and the result. Checked here: the gradient lies in the result's memory, equals the
one computed into a new tensor to the bit (and the unfused equations in float64), a program whose logits are such
a result is left alone, a second backward over the same graph fails in torch's words, and on the examples and the
generated programs a training step with it equals one without it to the bit.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.program_gen import generate
from gnnc.runtime import fusion, rng
from gnnc.runtime.executor import init_params
from gnnc.runtime.kernels import native
from gnnc.testing import sgd_steps
from gnnc.runtime.train import TrainConfig, Worker

compiled = pytest.mark.skipif(native.library() is None, reason=f"compiled kernels: {native.status()}")


def _spec(act: str | None, p: float, n: int) -> tuple:
    code, _, param = fusion.ACTIVATIONS[act] if act else (fusion.IDENTITY, None, 0.0)
    rows = native.int64(torch.arange(n)) if p else None
    return (code, param, rows, rng.stream_key(5, 1) if p else 0, 0, rng.threshold(p), 1.0 / (1.0 - p))


@compiled
@pytest.mark.parametrize("act,p,with_y", [("relu", 0.5, False), ("elu", 0.3, True), ("leaky_relu", 0.0, False),
                                          ("relu", 0.0, True), (None, 0.5, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gradient_is_written_over_the_kept_result(act, p, with_y, dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    n, width = 300, 37
    x0, y0 = torch.randn(n, width, generator=gen, dtype=dtype), torch.randn(n, width, generator=gen, dtype=dtype)
    b0, w = torch.randn(width, generator=gen, dtype=dtype), torch.randn(n, width, generator=gen, dtype=dtype)
    spec = _spec(act, p, n)
    runs = []
    for overwrite in (False, True):
        x, b = x0.clone().requires_grad_(), b0.clone().requires_grad_()
        y = y0.clone().requires_grad_() if with_y else None
        xin = x * 1.0  # not a leaf: its gradient passes a hook on the way to x's
        seen = []
        xin.register_hook(lambda g: seen.append(g.data_ptr()))
        out = fusion._Epilogue.apply(xin, y, b, spec, False, overwrite)
        where = out.data_ptr()
        (out * w).sum().backward()
        runs.append((x.grad, b.grad, None if y is None else y.grad))
        assert (seen[0] == where) == overwrite  # the gradient of x lies where the result was, and only then
    for got, want in zip(*runs):
        assert (got is None and want is None) or torch.equal(got, want)
    # the equations (float64 reference): drop(act(x + y + b))
    if dtype == torch.float64:
        x, b = x0.clone().requires_grad_(), b0.clone().requires_grad_()
        pre = x + (y0 if with_y else 0) + b
        f = {"relu": torch.relu, "elu": torch.nn.functional.elu, "leaky_relu": torch.nn.functional.leaky_relu,
             None: lambda t: t}[act]
        h = f(pre)
        if p:
            h = h * rng.keep_mask(spec[3], torch.arange(n), width, p).to(dtype) * (1.0 / (1.0 - p))
        (h * w).sum().backward()
        assert torch.allclose(runs[1][0], x.grad, rtol=1e-12, atol=1e-12)
        assert torch.allclose(runs[1][1], b.grad, rtol=1e-12, atol=1e-12)


@compiled
def test_a_second_backward_over_an_overwritten_result_fails_in_torch_words() -> None:
    x = torch.randn(50, 8).requires_grad_()
    out = fusion._Epilogue.apply(x * 1.0, None, None, _spec("relu", 0.5, 50), True, True)
    loss = (out * out).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_chain_whose_result_is_the_logits_keeps_it() -> None:
    """The logits (or a value they alias in one process: a sync) are read after the backward."""
    graph = random_graph(n=30, e=120, f=6, c=3, seed=1)
    src = """
layer Conv(in, out) with self_loops {
  scatter   m = edge.gcn_norm * src.h
  gather    a = sum(m)
  transform c = linear(a, out)
  sync      s = sum(c)
  apply     h = dropout(relu(s), 0.5)
}
model M(features, classes) {
  h = Conv(features, 8)(x)
  h = Conv(8, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
    program = api.compile(api.load_model_source(src, "m.gnn"), graph).program
    chains = list(fusion.find_chains(program).values())
    assert [c.escapes for c in chains if c.kind == "epilogue"] == [False, True]


def _step_grads(program, graph, overwrite: bool, monkeypatch,
                redraw: bool = True) -> list[dict[str, torch.Tensor | None]]:
    context, redraw_of = Worker.context, rng.redraw_of
    monkeypatch.setattr(Worker, "context", lambda self, training, epoch: dataclasses.replace(
        context(self, training, epoch), overwrite_saved=overwrite and training))
    if not redraw:
        monkeypatch.setattr(rng, "redraw_of", lambda t: None)
    cfg = TrainConfig(seed=1, progress=False)
    worker, params, grads = sgd_steps(program, graph, cfg)
    with torch.no_grad():
        grads.append({"logits": worker.forward(params, False, 2)[0]})
    monkeypatch.setattr(Worker, "context", context)
    monkeypatch.setattr(rng, "redraw_of", redraw_of)
    return grads


@compiled
@pytest.mark.parametrize("source", [f"example:{m}" for m in ("gcn", "sage", "gat", "gin", "gcnii")]
                         + [f"gen:{s}" for s in range(12)])
def test_training_with_the_overwrite_equals_training_without(source: str, monkeypatch) -> None:
    """Two SGD steps and the evaluation logits after them, to the bit, on the examples and generated programs."""
    graph = random_graph(n=80, e=400, f=10, c=4, seed=2)
    kind, name = source.split(":")
    if kind == "example":
        sets = {"gat": {"heads": 3, "hidden": 4}, "gcnii": {"layers": 4}}.get(name, {})
        model = api.load_model(EXAMPLES / f"{name}.gnn", **sets)
    else:
        graph.edge_data = {"weight": torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(2)) + 0.1}
        model = api.load_model_source(generate(int(name)), f"gen-{name}.gnn")
    program = api.compile(model, graph).program
    want = _step_grads(program, graph, False, monkeypatch, redraw=False)  # what was kept before
    for got in (_step_grads(program, graph, True, monkeypatch, redraw=False),
                _step_grads(program, graph, False, monkeypatch, redraw=True),
                _step_grads(program, graph, True, monkeypatch, redraw=True)):
        for g, w in zip(got, want):
            for k in w:
                assert (g[k] is None and w[k] is None) or torch.equal(g[k], w[k]), (source, k)


def saved_storages(program, graph) -> dict[tuple[int, int], tuple[int, ...]]:
    """The storages a training forward keeps for its backward (by address and size), with a shape of each."""
    cfg = TrainConfig(seed=1, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, cfg.seed)
    seen: dict[tuple[int, int], tuple[int, ...]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen.setdefault((st.data_ptr(), st.nbytes()), tuple(t.shape))
        return t

    worker.forward(params, True, 0)[1].backward()  # hoisted values computed once, as in a run
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = worker.forward(params, True, 1)
    loss.backward()
    return seen


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_the_dropped_out_features_are_not_kept(name: str) -> None:
    graph = random_graph(n=80, e=400, f=10, c=4, seed=2)
    sets = {"gat": {"heads": 3, "hidden": 4}}.get(name, {})
    program = api.compile(api.load_model(EXAMPLES / f"{name}.gnn", **sets), graph).program
    shapes = list(saved_storages(program, graph).values())
    # SAGE keeps the mean of its neighbours' features [80, 10] (its lin_l's input), not their dropout
    assert shapes.count((80, 10)) == (1 if name == "sage" else 0), shapes
