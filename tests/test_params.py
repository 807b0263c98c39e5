"""Learnable scalars and vectors (issue 21, item 2): `param NAME[shape] = init` in a layer or a model.

A declaration becomes a Param of its block's IR layer (printed and parsed
back with its initialiser, a number included), combines with vertex and edge
values by broadcasting, gets its gradient and its optimizer step like any
weight, and is refused at file:line:col when malformed. GIN's learnable
epsilon against PyG is in test_pyg_equivalence; its gradient all-reduced
over 2 processes in test_language_distributed.
"""
from __future__ import annotations

import pytest
import torch

from conftest import random_graph
from gnnc import api
from gnnc.errors import GnncError
from gnnc.ir.text import parse_ir
from gnnc.runtime.executor import init_params
from gnnc.runtime.train import TrainConfig, Worker, make_optimizer
from gnnc.testing import outputs_and_grads

# GPR-GNN: a learnable coefficient per propagation step, declared in the repeat loop
GPR = """
layer Prop() with self_loops {
  scatter m = edge.gcn_norm * src.h
  gather  a = sum(m)
  apply   h = a
}
layer Scale(in, out) {
  param   w[out] = ones
  param   b = -0.5
  apply   h = w * h + b
}
model GPR(features, classes, K = 3, alpha = 0.1) {
  h = linear(x, classes)
  param g = alpha
  z = g * h
  repeat k in 1..K {
    h = Prop()(h)
    param g = alpha * (1 - alpha) ** k
    z = z + g * h
  }
  z = Scale(classes, classes)(z)
  loss = cross_entropy(z, y, mask = train)
}
"""


def compiled(source: str, graph, **params):
    return api.compile(api.load_model_source(source, "gpr.gnn", **params), graph).program


def test_declarations_become_params_that_print_and_parse_back() -> None:
    graph = random_graph(n=30, e=100, f=6, c=3)
    program = compiled(GPR, graph)
    text = str(program)
    for line in ("param %d0.g:param:f32[] = 0.1", "param %d3.g:param:f32[] = 0.0729",
                 "param %l3.w:param:f32[classes] = ones", "param %l3.b:param:f32[] = -0.5"):
        assert line in text, line
    assert parse_ir(text) == program and str(parse_ir(text)) == text
    params = init_params(program, 0)
    assert params["d2.g"].item() == pytest.approx(0.081) and torch.equal(params["l3.w"], torch.ones(3))
    assert params["l3.b"].item() == -0.5


def test_params_get_gradients_and_optimizer_steps() -> None:
    graph = random_graph(n=40, e=160, f=6, c=3, seed=1)
    program = compiled(GPR, graph)
    _, grads = outputs_and_grads(program, graph)
    for name in ("d0.g", "d1.g", "d3.g", "l3.w", "l3.b"):
        assert float(grads[name].abs().sum()) > 0, name
    cfg = TrainConfig(lr=0.05, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 0)
    opt = make_optimizer(program, params, cfg)
    _, loss = worker.forward(params, True, 0)
    loss.backward()
    opt.step()
    assert params["d1.g"].item() != pytest.approx(0.09) and not torch.equal(params["l3.w"], torch.ones(3))


ERRORS = [
    ("layer L(in, out) {\n  param h = 1\n  apply h = h\n}\n",
     "bad.gnn:2:9: 'h' is the layer's input and cannot name a parameter"),
    ("layer L(in, out) {\n  param w[0] = ones\n  apply h = h\n}\n",
     "bad.gnn:2:11: param w's size must be a positive integer, got 0"),
    ("layer L(in, out) {\n  param w = glrot\n  apply h = h\n}\n",
     "bad.gnn:2:13: param w's initial value must be a number or one of zeros, ones, glorot; did you mean 'glorot'?"),
    ("layer L(in, out) {\n  param w = h\n  apply h = h\n}\n",
     "bad.gnn:2:13: param w's initial value must be a number or one of zeros, ones, glorot"),
    ("layer L(in, out) {\n  param w[h] = ones\n  apply h = h\n}\n",
     "bad.gnn:2:11: param w's size must be a dim (a number or integer parameter)"),
    ("layer L(in, out) {\n  param = 1\n  apply h = h\n}\n", "bad.gnn:2:9: expected a name before '='"),
]


@pytest.mark.parametrize("layer, message", ERRORS, ids=[m.split(": ", 1)[1][:30] for _, m in ERRORS])
def test_bad_declarations_are_reported_at_their_place(layer: str, message: str) -> None:
    source = layer + ("model M(features, classes) {\n  h = L(features, classes)(x)\n"
                      "  loss = cross_entropy(h, y, mask = train)\n}\n")
    with pytest.raises(GnncError) as err:
        api.compile(api.load_model_source(source, "bad.gnn"))
    assert str(err.value).splitlines()[0] == message


def test_a_model_param_cannot_be_a_graph_input() -> None:
    source = ("model M(features, classes) {\n  param x = 1\n"
              "  loss = cross_entropy(linear(x, classes), y, mask = train)\n}\n")
    with pytest.raises(GnncError, match="bad.gnn:2:9: 'x' is a graph input and cannot name a parameter"):
        api.compile(api.load_model_source(source, "bad.gnn"))
