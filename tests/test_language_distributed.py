"""The language's learnable scalars, edge weights, batch norm and hoisting on 2 gloo processes.

GIN with a learnable epsilon, GCN on a graph with edge weights and GraphSAGE
with a batch norm between its layers must equal their PyG layers
(GINConv(train_eps=True), GCNConv with edge_weight, BatchNorm1d) given the
same weights, forward and every gradient within 1e-5, on 2 processes under
several strategies: epsilon's gradient is all-reduced like any weight's,
every edge a rank holds (halo and replicated neighbourhood included) carries
its weight, and batch_norm's statistics are summed over every rank's owned
rows by an all-reduce whose backward sums the gradients. Layers reading edge
data directly (`edge.weight`, a 3-wide `edge.attr`), SGC's propagation hoisted
out of the training loop (its halos and fetches included) and an aggregation
of x hoisted on each rank's feature slice under P3's pushpull must equal one
process. In every case the bytes measured in a step after the first must
equal the plan's prediction (which leaves the hoisted exchanges out). One
launch runs every case.
"""
from __future__ import annotations

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.testing import first_training_step
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.executor import init_params
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import measured_bytes

tg = pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402

SEED = 3
WORLD = 2
HIDDEN = 8
# edge data read directly: PyG's GraphConv with edge_weight, and a gate computed from 3-wide edge features
EDGE_LAYERS = """
layer WeightedConv(in, out) {
  scatter   m = edge.weight * src.h
  gather    a = sum(m)
  transform t = linear(a, out) + linear(h, out, bias = false)
  sync      s = sum(t)
  apply     h = s
}
layer GatedConv(in, out) with self_loops {
  transform t = linear(h, out)
  scatter   m = sigmoid(dot(edge.attr)) * src.t
  gather    a = sum(m)
  apply     h = a
}
model T(features, classes) {
  h = WeightedConv(features, 8)(x)
  h = relu(h)
  h = GatedConv(8, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
# aggregation before the dense map (wider than the input: reorder-gemm keeps that order), so under P3's
# pushpull the first layer's aggregation of x is hoisted on every rank's feature slice
AGGREGATE_FIRST = """
layer Agg(in, out) with self_loops {
  scatter   m = edge.gcn_norm * src.h
  gather    a = sum(m)
  transform t = linear(a, out, bias = false)
  sync      s = sum(t)
  apply     h = bias(s)
}
model M(features, classes) {
  h = relu(Agg(features, 16)(x))
  h = Agg(16, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
MODELS = {
    "gin-eps": ("gin.gnn", "h = GINTrainEps(features, 8, 0.3)(x)\n h = relu(h)\n h = GINTrainEps(8, classes)(h)",
                ["depcomm", "depcache", "bcast1d", "depcomm,depcache"]),
    "gcn-weighted": ("gcn.gnn", "h = GCNConv(features, 8)(x)\n h = relu(h)\n h = GCNConv(8, classes)(h)",
                     ["depcomm", "depcache", "bcast1d", "pushpull,depcomm", "depcomm,depcache"]),
    "sage-bn": ("sage.gnn", "h = SAGE(features, 8)(x)\n h = batch_norm(relu(h))\n h = SAGE(8, classes)(h)",
                ["depcomm", "depcache", "bcast1d", "depcomm,depcache"]),
    "sgc": ("sgc.gnn", None, ["depcomm", "depcache", "bcast1d", "hybrid", "depcomm,depcache"]),
    "edge-data": (EDGE_LAYERS, None, ["depcomm", "depcache", "bcast1d", "depcomm,depcache"]),
    "aggregate-first": (AGGREGATE_FIRST, None, ["pushpull,depcomm"]),
}
PYG = {"gin-eps", "gcn-weighted", "sage-bn"}


def weighted_graph():
    g = random_graph(n=50, e=220, f=10, c=4, seed=5)
    gen = torch.Generator().manual_seed(2)
    g.edge_data = {"weight": torch.rand(g.num_edges, generator=gen) + 0.1,
                   "attr": torch.randn(g.num_edges, 3, generator=gen)}
    return g


def model_of(name: str):
    example, body, _ = MODELS[name]
    if "\n" in example:  # the model's own text
        return api.load_model_source(example, f"{name}.gnn")
    source = (EXAMPLES / example).read_text()
    if body is not None:
        source += f"\nmodel T(features, classes) {{\n {body}\n loss = cross_entropy(h, y, mask = train)\n}}\n"
    return api.load_model_source(source, example)


def pyg_logits(name: str, graph, params: dict[str, torch.Tensor]):
    """PyG's layers with gnnc's initial weights: (logits, {gnnc name: gradient}) of the same loss."""
    x, ei = graph.x, torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)])
    F, C = graph.num_features, graph.num_classes
    named: dict[str, torch.nn.Parameter] = {}

    def bind(name_: str, value: torch.Tensor, transpose: bool = False) -> None:
        named[name_].data.copy_(value.detach().T if transpose else value.detach())

    if name == "gin-eps":
        convs = []
        for k, (i, o) in enumerate([(F, HIDDEN), (HIDDEN, C)]):
            mlp = torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))
            conv = pyg.GINConv(mlp, eps=0.0, train_eps=True)
            named.update({f"l{k}.e": conv.eps, f"l{k}.linear0.weight": mlp[0].weight, f"l{k}.linear0.bias": mlp[0].bias,
                          f"l{k}.linear1.weight": mlp[2].weight, f"l{k}.linear1.bias": mlp[2].bias})
            convs.append(conv)
        run = lambda: convs[1](convs[0](x, ei).relu(), ei)  # noqa: E731
    elif name == "gcn-weighted":
        w = graph.edge_data["weight"]
        convs = [pyg.GCNConv(F, HIDDEN), pyg.GCNConv(HIDDEN, C)]
        for k, conv in enumerate(convs):
            named.update({f"l{k}.linear0.weight": conv.lin.weight, f"l{k}.bias0.bias": conv.bias})
        run = lambda: convs[1](convs[0](x, ei, w).relu(), ei, w)  # noqa: E731
    else:
        convs = [pyg.SAGEConv(F, HIDDEN, aggr="mean"), pyg.SAGEConv(HIDDEN, C, aggr="mean")]
        bn = pyg.BatchNorm(HIDDEN)
        for k, conv in enumerate(convs):
            named.update({f"l{k}.linear0.weight": conv.lin_l.weight, f"l{k}.linear0.bias": conv.lin_l.bias,
                          f"l{k}.linear1.weight": conv.lin_r.weight})
        named.update({"d0.batch_norm0.weight": bn.module.weight, "d0.batch_norm0.bias": bn.module.bias})
        run = lambda: convs[1](bn(convs[0](x, ei).relu()), ei)  # noqa: E731
    assert set(named) == set(params), sorted(set(named) ^ set(params))
    for k, v in params.items():
        bind(k, v.reshape(named[k].shape) if named[k].dim() < 2 else v, transpose=named[k].dim() == 2)
    out = run()
    m = graph.train_mask
    torch.nn.functional.cross_entropy(out[m], graph.y[m], reduction="sum").div(float(m.sum())).backward()
    grads = {k: (p.grad.T if p.dim() == 2 else p.grad.reshape(params[k].shape)) for k, p in named.items()}
    return out.detach(), grads


def one_process(program, graph):
    logits, _, grads = first_training_step(program, graph, SEED)
    return logits, grads


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def test_language_features_match_pyg_on_two_processes(tmp_path) -> None:
    graph = weighted_graph()
    todo = []
    for name, (_, _, strategies) in MODELS.items():
        model = model_of(name)
        single = api.compile(model, graph).program
        for strategy in strategies:
            plan = api.compile(model, graph, workers=WORLD, strategy=strategy, partition="hash")
            shards = plan.write_shards(tmp_path / f"{name}-{strategy}")
            job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False))
            todo.append((name, strategy, single, job, plan.meta.predicted_bytes_per_step))
    results = pooled_launch(one_step_each, WORLD, [job for _, _, _, job, _ in todo])[0]
    failures = []
    for (name, strategy, single, _, predicted), got in zip(todo, results):
        refs = [("one process", one_process(single, graph))]
        if name in PYG:
            refs.append(("PyG", pyg_logits(name, graph, init_params(single, SEED))))
        for who, (logits, grads) in refs:
            if rel(got["logits"], logits) > 1e-5:
                failures.append(f"{name} {strategy}: logits differ from {who}'s by {rel(got['logits'], logits):.2e}")
            for k, g in grads.items():
                if rel(got["grads"][k], g) > 1e-5:
                    failures.append(f"{name} {strategy}: gradient of {k} differs from {who}'s by "
                                    f"{rel(got['grads'][k], g):.2e}")
        measured = measured_bytes(got)
        if measured != predicted:
            failures.append(f"{name} {strategy}: measured bytes {measured} != predicted {predicted}")
    assert not failures, "\n".join(failures)
