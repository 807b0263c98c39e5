"""Sparse input features (bag-of-words graphs) give what dense ones give, for every example."""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.runtime import rng
from gnnc.graph import GraphView, sparse_if_sparse
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs, init_params


@pytest.mark.parametrize("name", ["gcn", "sage", "gin", "gat", "gcnii"])
def test_sparse_features_match_dense(name: str) -> None:
    graph = random_graph(n=50, e=200, f=40, c=4, seed=3)
    keep = torch.rand(graph.x.shape, generator=torch.Generator().manual_seed(0)) < 0.03
    graph.x = graph.x * keep
    overrides = {"layers": 2} if name == "gcnii" else {}
    program = api.compile(api.load_model(EXAMPLES / f"{name}.gnn", **overrides), graph).program
    outs = []
    for sparse in (False, True):
        inputs = graph_inputs(graph)
        inputs["x"] = sparse_if_sparse(graph.x) if sparse else graph.x
        assert inputs["x"].is_sparse == sparse
        params = init_params(program, 0)
        views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
        kb = rng.stream_key(0, 0)
        ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), True,
                          lambda i: rng.stream_key(kb, i), float(graph.train_mask.sum()))
        logits, loss = forward(Interpreter(program), params, inputs, ctx)
        loss.backward()
        outs.append((logits.detach(), {k: p.grad for k, p in params.items()}))
    (a, ga), (b, gb) = outs
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    for k in ga:
        assert torch.allclose(ga[k], gb[k], rtol=1e-4, atol=1e-6), k
