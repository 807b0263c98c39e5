"""Each example layer computes what the torch_geometric layer computes, given the same weights.

The layer definitions are taken from examples/*.gnn; a one-layer test model
instantiates them. Forward outputs and the gradients of every weight must
agree within 1e-5 relative, on random graphs with isolated vertices,
self-loops and duplicate edges, both before lowering (graph ops) and after
it (kernels). Three cases use what the language states beyond the layers'
weights: GIN with a learnable epsilon (`param`, GINConv(train_eps=True)), GCN
on a graph with edge weights (GCNConv with edge_weight: gcn_norm weighs, the
added self-loops weigh 1) and GraphSAGE followed by a ReLU and `batch_norm`
(BatchNorm1d in training mode: batch statistics).
"""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.graph import GraphView
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs

tg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def build(example: str, test_model: str, graph, lowered: bool):
    source = (EXAMPLES / example).read_text() + "\n" + test_model
    model = api.load_model_source(source, example, "T")
    passes = ["infer-shapes", "check", "lower", "reorder-gemm"] if lowered else ["infer-shapes", "check"]
    return api.compile(model, graph, passes=passes).program


def run_ours(program, graph, params: dict[str, torch.Tensor], use_kernels: bool, training: bool = False):
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), training, lambda i: 0,
                      float(graph.train_mask.sum()), use_kernels)
    logits, loss = forward(Interpreter(program), params, graph_inputs(graph), ctx)
    loss.backward()
    return logits.detach(), {k: v.grad for k, v in params.items()}


def run_pyg(conv, graph, call):
    out = call(conv)
    m = graph.train_mask
    loss = torch.nn.functional.cross_entropy(out[m], graph.y[m], reduction="sum") / float(m.sum())
    loss.backward()
    return out.detach()


def edge_index(graph) -> torch.Tensor:
    return torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)])


CASES = ["gcn", "sage", "gin", "gat", "gcnii", "gin-eps", "gcn-weighted", "sage-bn"]
TRAINING = {"sage-bn"}  # batch_norm's batch statistics are the training-mode ones


def with_edge_weights(graph):
    """The graph with a positive weight on every edge (the duplicated self-loops get different ones)."""
    w = torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(11)) + 0.1
    graph.edge_data = {"weight": w}
    return w


def setup_case(name: str, graph):
    F, C = graph.num_features, 6
    ei = edge_index(graph)
    torch.manual_seed(1)
    if name == "gcn":
        conv = pyg.GCNConv(F, C)
        torch.nn.init.normal_(conv.bias)
        model = "model T(features, classes) { h = GCNConv(features, 6)(x)\n loss = cross_entropy(h, y, mask = train) }"
        params = {"l0.linear0.weight": conv.lin.weight.T, "l0.bias0.bias": conv.bias}
        grads = {"l0.linear0.weight": lambda: conv.lin.weight.grad.T, "l0.bias0.bias": lambda: conv.bias.grad}
        return "gcn.gnn", model, conv, lambda c: c(graph.x, ei), params, grads
    if name == "sage":
        conv = pyg.SAGEConv(F, C, aggr="mean")
        model = "model T(features, classes) { h = SAGE(features, 6)(x)\n loss = cross_entropy(h, y, mask = train) }"
        params = {"l0.linear0.weight": conv.lin_l.weight.T, "l0.linear0.bias": conv.lin_l.bias,
                  "l0.linear1.weight": conv.lin_r.weight.T}
        grads = {"l0.linear0.weight": lambda: conv.lin_l.weight.grad.T, "l0.linear0.bias": lambda: conv.lin_l.bias.grad,
                 "l0.linear1.weight": lambda: conv.lin_r.weight.grad.T}
        return "sage.gnn", model, conv, lambda c: c(graph.x, ei), params, grads
    if name == "gin":
        mlp = torch.nn.Sequential(torch.nn.Linear(F, C), torch.nn.ReLU(), torch.nn.Linear(C, C))
        conv = pyg.GINConv(mlp, eps=0.0, train_eps=False)
        model = "model T(features, classes) { h = GIN(features, 6)(x)\n loss = cross_entropy(h, y, mask = train) }"
        params = {"l0.linear0.weight": mlp[0].weight.T, "l0.linear0.bias": mlp[0].bias,
                  "l0.linear1.weight": mlp[2].weight.T, "l0.linear1.bias": mlp[2].bias}
        grads = {"l0.linear0.weight": lambda: mlp[0].weight.grad.T, "l0.linear0.bias": lambda: mlp[0].bias.grad,
                 "l0.linear1.weight": lambda: mlp[2].weight.grad.T, "l0.linear1.bias": lambda: mlp[2].bias.grad}
        return "gin.gnn", model, conv, lambda c: c(graph.x, ei), params, grads
    if name == "gat":
        H, D = 3, 2
        conv = pyg.GATConv(F, D, heads=H, concat=True, dropout=0.0)
        torch.nn.init.normal_(conv.bias)
        model = ("model T(features, classes) { h = GATConv(features, 2, 3, 0.2, 0.0)(x)\n"
                 " loss = cross_entropy(h, y, mask = train) }")
        params = {"l0.linear0.weight": conv.lin.weight.T, "l0.dot0.att": conv.att_src[0],
                  "l0.dot1.att": conv.att_dst[0], "l0.bias0.bias": conv.bias}
        grads = {"l0.linear0.weight": lambda: conv.lin.weight.grad.T, "l0.dot0.att": lambda: conv.att_src.grad[0],
                 "l0.dot1.att": lambda: conv.att_dst.grad[0], "l0.bias0.bias": lambda: conv.bias.grad}
        return "gat.gnn", model, conv, lambda c: c(graph.x, ei), params, grads
    if name == "gin-eps":
        mlp = torch.nn.Sequential(torch.nn.Linear(F, C), torch.nn.ReLU(), torch.nn.Linear(C, C))
        conv = pyg.GINConv(mlp, eps=0.3, train_eps=True)
        model = ("model T(features, classes) { h = GINTrainEps(features, 6, 0.3)(x)\n"
                 " loss = cross_entropy(h, y, mask = train) }")
        params = {"l0.e": conv.eps.detach().reshape(()), "l0.linear0.weight": mlp[0].weight.T,
                  "l0.linear0.bias": mlp[0].bias, "l0.linear1.weight": mlp[2].weight.T, "l0.linear1.bias": mlp[2].bias}
        grads = {"l0.e": lambda: conv.eps.grad.reshape(()), "l0.linear0.weight": lambda: mlp[0].weight.grad.T,
                 "l0.linear0.bias": lambda: mlp[0].bias.grad, "l0.linear1.weight": lambda: mlp[2].weight.grad.T,
                 "l0.linear1.bias": lambda: mlp[2].bias.grad}
        return "gin.gnn", model, conv, lambda c: c(graph.x, ei), params, grads
    if name == "gcn-weighted":
        w = with_edge_weights(graph)
        conv = pyg.GCNConv(F, C)
        torch.nn.init.normal_(conv.bias)
        model = "model T(features, classes) { h = GCNConv(features, 6)(x)\n loss = cross_entropy(h, y, mask = train) }"
        params = {"l0.linear0.weight": conv.lin.weight.T, "l0.bias0.bias": conv.bias}
        grads = {"l0.linear0.weight": lambda: conv.lin.weight.grad.T, "l0.bias0.bias": lambda: conv.bias.grad}
        return "gcn.gnn", model, conv, lambda c: c(graph.x, ei, w), params, grads
    if name == "sage-bn":
        conv, bn = pyg.SAGEConv(F, C, aggr="mean"), pyg.BatchNorm(C)
        torch.nn.init.normal_(bn.module.weight)
        torch.nn.init.normal_(bn.module.bias)
        # ReLU first: a bias straight before a batch norm has a gradient of zero, compared as round-off
        model = ("model T(features, classes) { h = SAGE(features, 6)(x)\n h = batch_norm(relu(h))\n"
                 " loss = cross_entropy(h, y, mask = train) }")
        params = {"l0.linear0.weight": conv.lin_l.weight.T, "l0.linear0.bias": conv.lin_l.bias,
                  "l0.linear1.weight": conv.lin_r.weight.T, "d0.batch_norm0.weight": bn.module.weight,
                  "d0.batch_norm0.bias": bn.module.bias}
        grads = {"l0.linear0.weight": lambda: conv.lin_l.weight.grad.T, "l0.linear0.bias": lambda: conv.lin_l.bias.grad,
                 "l0.linear1.weight": lambda: conv.lin_r.weight.grad.T,
                 "d0.batch_norm0.weight": lambda: bn.module.weight.grad,
                 "d0.batch_norm0.bias": lambda: bn.module.bias.grad}
        return ("sage.gnn", model, torch.nn.ModuleList([conv, bn]), lambda c: c[1](c[0](graph.x, ei).relu()), params,
                grads)
    if name == "gcnii":
        conv = pyg.GCN2Conv(F, alpha=0.1, theta=0.5, layer=3, shared_weights=True)
        model = ("model T(features, classes) { x0 = x\n h = GCNII(features, 0.1, 0.5, 3)(x)\n"
                 " loss = cross_entropy(h, y, mask = train) }")
        params = {"l0.linear0.weight": conv.weight1}
        grads = {"l0.linear0.weight": lambda: conv.weight1.grad}
        return "gcnii.gnn", model, conv, lambda c: c(graph.x, graph.x, ei), params, grads
    raise AssertionError(name)


@pytest.mark.parametrize("lowered", [False, True], ids=["graph-ops", "kernels"])
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_matches_pyg(name: str, lowered: bool, seed: int) -> None:
    graph = random_graph(n=40, e=160, f=12, c=6 if name != "gcnii" else 12, seed=seed)
    example, model, conv, call, params, grads = setup_case(name, graph)
    program = build(example, model, graph, lowered)
    theirs = run_pyg(conv, graph, call)
    ours, our_grads = run_ours(program, graph, {k: v.detach() for k, v in params.items()}, lowered, name in TRAINING)
    assert ours.shape == theirs.shape
    assert rel(ours, theirs) < 1e-5, f"forward differs: {rel(ours, theirs)}"
    for k, g in grads.items():
        assert rel(our_grads[k], g()) < 1e-5, f"gradient of {k} differs: {rel(our_grads[k], g())}"
