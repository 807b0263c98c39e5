"""gnnc.to_torch: a trained model as a torch.nn.Module computes gnnc's logits (issue 41, item 3).

Every example, and a GAT that weighs its attention by `edge.weight`, is trained for one epoch on Cora with a
checkpoint; the module built from that checkpoint gives the logits the run returned (1e-6). The module trains
in a PyG loop on a `Data` object, and, from gnnc's initial weights with gnnc's optimizer, follows gnnc's run.
Neither torch.jit.script nor torch.export takes it (its edge views are built on the host, from
`edge_index`'s values): the last test states what each says.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gnnc
from gnnc.errors import GnncError
from gnnc.runtime.executor import init_params
from gnnc.api import to_torch
from gnnc.torch_module import GnncModule

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# small settings where an example's own are slow to run twice (GCNII's 64 layers)
SMALL = {"gcnii": {"layers": 2, "hidden": 16}, "gin": {"hidden": 16}, "gat": {"hidden": 4, "heads": 2}}

# GAT whose attention scores are scaled by each edge's weight (its self-loops weigh 1)
WEIGHTED_GAT = """
layer WGAT(in, out, heads = 1, slope = 0.2, attn_p = 0.6) with self_loops {
  transform z = linear(h, heads, out, bias = false)
  scatter   e = leaky_relu(dot(src.z) + dot(dst.z), slope) * edge.weight
  gather    alpha = softmax(e)
  scatter   m = dropout(edge.alpha, attn_p) * src.z
  gather    a = sum(m)
  transform c = concat(a)
  sync      s = sum(c)
  apply     h = bias(s)
}

model WeightedGAT(features, hidden = 4, heads = 2, classes, p = 0.6) {
  h = dropout(x, p)
  h = WGAT(features, hidden, heads)(h)
  h = elu(h)
  h = dropout(h, p)
  h = WGAT(heads * hidden, classes, 1)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


@pytest.fixture(scope="module")
def weighted_cora(cora):
    weights = np.random.default_rng(0).uniform(0.5, 2.0, cora.num_edges).astype(np.float32)
    return gnnc.load_graph({"edge_index": np.stack([cora.src, cora.dst]), "x": cora.x, "y": cora.y,
                            "train_mask": cora.train_mask, "val_mask": cora.val_mask, "test_mask": cora.test_mask,
                            "edge_weight": weights})


def edge_index(graph) -> torch.Tensor:
    return torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).to(torch.int64)


def trained(model, graph, directory: Path, epochs: int = 1):
    """(plan, result) of `epochs` epochs with a checkpoint of the last one in `directory`."""
    plan = gnnc.compile(model, graph)
    result = gnnc.run(plan, graph, epochs=epochs, checkpoint_dir=str(directory), checkpoint_every=epochs)
    return plan, result


# examples that read what a module's forward(x, edge_index, edge_weight) does not take
NOT_ON_CORA = {"proteins_multilabel": "reads 8-dimensional edge features (edge.attr)",
               "gin_graph": "classifies graphs (a readout): it trains on a dataset of many graphs, not on Cora",
               "link_gae": "scores pairs (link prediction): its runs keep no weights to export (--save-model is refused)"}


@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.gnn")))
def test_every_example_gives_gnncs_logits(example: str, cora, tmp_path: Path) -> None:
    if example in NOT_ON_CORA:
        pytest.skip(NOT_ON_CORA[example])
    model = gnnc.load_model(EXAMPLES / f"{example}.gnn", **SMALL.get(example, {}))
    plan, result = trained(model, cora, tmp_path)
    module = to_torch(plan, tmp_path).eval()
    assert isinstance(module, torch.nn.Module)
    with torch.no_grad():
        logits = module(cora.x, edge_index(cora))
    assert logits.shape == result.logits.shape
    torch.testing.assert_close(logits, result.logits, rtol=0, atol=1e-6)


def test_weighted_gat_reads_the_edge_weights(weighted_cora, tmp_path: Path) -> None:
    model = gnnc.load_model_source(WEIGHTED_GAT, "wgat.gnn")
    plan, result = trained(model, weighted_cora, tmp_path)
    module = to_torch(plan, tmp_path).eval()
    ei, w = edge_index(weighted_cora), weighted_cora.edge_data["weight"]
    with torch.no_grad():
        torch.testing.assert_close(module(weighted_cora.x, ei, w), result.logits, rtol=0, atol=1e-6)
        # the weights matter: others give other logits, and none is refused naming the field
        assert (module(weighted_cora.x, ei, torch.ones_like(w)) - result.logits).abs().max() > 1e-5
        with pytest.raises(GnncError, match="edge.weight"):
            module(weighted_cora.x, ei)


def test_a_model_with_its_dims_set_and_a_dict_of_weights(cora) -> None:
    """No plan, no checkpoint: a model whose features and classes are set, weights by IR name."""
    model = gnnc.load_model(EXAMPLES / "sage.gnn", features=cora.num_features, classes=cora.num_classes)
    module = to_torch(model, {k: v.detach() for k, v in init_params(gnnc.compile(model).program, 3).items()})
    assert sorted(module.state_dict()) == ["l0.linear0.bias", "l0.linear0.weight", "l0.linear1.weight",
                                           "l1.linear0.bias", "l1.linear0.weight", "l1.linear1.weight"]
    assert module.eval()(cora.x, edge_index(cora)).shape == (cora.num_nodes, cora.num_classes)


def test_pyg_training_loop(cora, tmp_path: Path) -> None:
    """Ten epochs of a PyG loop on a Data object: the loss falls; from gnnc's initial weights, with gnnc's optimizer
    (Adam, weight decay) and its dropout masks (the module's seed and step), the weights are gnnc's after ten epochs."""
    torch_geometric = pytest.importorskip("torch_geometric")
    data = torch_geometric.data.Data(x=cora.x, edge_index=edge_index(cora), y=cora.y, train_mask=cora.train_mask)
    model = gnnc.load_model(EXAMPLES / "gcn.gnn")
    plan = gnnc.compile(model, cora)
    start = {k: v.detach() for k, v in init_params(plan.program, 0).items()}
    module = to_torch(plan, start, seed=0)
    opt = torch.optim.Adam(module.parameters(), lr=0.01, weight_decay=5e-4)
    module.train()
    losses = []
    for _ in range(10):
        opt.zero_grad()
        out = module(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    result = gnnc.run(plan, cora, epochs=10, seed=0)
    torch.testing.assert_close(losses[0], result.history[0]["loss"], rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(module.eval()(data.x, data.edge_index), result.logits, rtol=0, atol=1e-5)


def test_weights_of_another_model_are_refused(cora, tmp_path: Path) -> None:
    gcn = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), cora)
    wide = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn", hidden=32), cora)
    weights = {k: v.detach() for k, v in init_params(wide.program, 0).items()}
    with pytest.raises(GnncError, match=r"weight l0\.linear0\.weight has shape \[1433, 32\] but the model's is "
                                        r"\[1433, 16\]"):
        to_torch(gcn, weights)
    with pytest.raises(GnncError, match=r"missing l1\.bias0\.bias; not in the model: l9\.w"):
        to_torch(gcn, {**{k: v for k, v in weights.items() if k != "l1.bias0.bias"}, "l9.w": torch.zeros(1)})
    gnnc.run(gnnc.compile(gnnc.load_model(EXAMPLES / "sgc.gnn"), cora), cora, epochs=1,
             checkpoint_dir=str(tmp_path), checkpoint_every=1)
    with pytest.raises(GnncError, match="holds 2 weights and this model has 4: it is another model's"):
        to_torch(gcn, tmp_path)
    with pytest.raises(GnncError, match="no checkpoint in it"):
        to_torch(gcn, tmp_path / "epoch-000000")
    (tmp_path / "other.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(GnncError, match="other.bin: not a gnnc saved model"):
        to_torch(gcn, tmp_path / "other.bin")


def test_neither_script_nor_export_takes_the_module(cora) -> None:
    """What torch says, so that the docs' answer is checked: the edge views are built from `edge_index`'s values
    on the host, which tracing (export) cannot read, and TorchScript compiles none of the interpreter's Python
    (the IR's dataclasses, closures, numpy)."""
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), cora)
    module: GnncModule = to_torch(plan, {k: v.detach() for k, v in init_params(plan.program, 0).items()}).eval()
    with pytest.raises(Exception):  # it stops at the first Python it cannot compile (the IR's dataclasses)
        torch.jit.script(module)
    with pytest.raises(Exception, match="numpy"):
        torch.export.export(module, (cora.x, edge_index(cora)))


@pytest.mark.slow
def test_a_distributed_runs_checkpoint(cora, tmp_path: Path) -> None:
    """Rank 0's checkpoint of a two-process run holds every weight: the module gives that run's logits."""
    model = gnnc.load_model(EXAMPLES / "gat.gnn", hidden=4, heads=2)
    plan = gnnc.compile(model, cora, workers=2)
    result = gnnc.run(plan, cora, epochs=2, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with torch.no_grad():
        logits = to_torch(plan, tmp_path).eval()(cora.x, edge_index(cora))
    torch.testing.assert_close(logits, result.logits, rtol=0, atol=1e-6)
