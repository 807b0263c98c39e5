"""Link prediction in the language (issue 37 item 1): pair ops, their IR, their cost, PyG equivalence, a run.

`src.z` / `dst.z` at the model level (ops pair_src / pair_dst), `dot(a, b)` of two values (op inner) and
`loss = bce(score, label)` over pairs: type rules and their messages, the printer/parser round trip, golden
IR of examples/link_gae.gnn after each pass, the cost model's count of their work, GAE's and an MLP
decoder's scores, loss and gradients against torch_geometric with the same weights, and a short run's
`--json` (test_auc, test_hits@20, test_mrr). Several processes: tests/test_link_distributed.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from conftest import EXAMPLES, check_golden, random_graph
from gnnc import api
from gnnc.errors import GnncTypeError
from gnnc.frontend.elaborate import elaborate
from gnnc.graph import GraphView
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import run_pipeline
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs

PASSES = ["infer-shapes", "check", "lower", "reorder-gemm", "sink-bias"]
CORA = {"features": 1433, "classes": 7}
GCN = (EXAMPLES / "link_gae.gnn").read_text().split("model GAE")[0]  # the example's GCNConv layer


def _stages(source: str, name: str) -> dict[str, str]:
    model = api.load_model_source(source, name)
    program = elaborate(model.module, {}, CORA)
    out = {"elaborate": str(program)}
    run_pipeline(program, PASSES, verify_each=True, after=lambda n, p: out.__setitem__(n, str(p)))
    return out


def test_golden_link_gae() -> None:
    check_golden(_stages((EXAMPLES / "link_gae.gnn").read_text(), "examples/link_gae.gnn"), "link_gae")


MLP = GCN + """
model MLP(features, hidden = 32, latent = 16) {
  z = GCNConv(hidden, latent)(relu(GCNConv(features, hidden)(x)))
  training(neg_ratio = 2, hits_k = 50)
  p = concat(src.z, dst.z)
  score = linear(relu(linear(p, hidden) + linear(src.z * dst.z, hidden, bias = false)), 1)
  loss = bce(score, label)
}
"""


@pytest.mark.parametrize("source", [(EXAMPLES / "link_gae.gnn").read_text(), MLP], ids=["gae", "mlp"])
def test_printer_parser_round_trip(source: str) -> None:
    model = api.load_model_source(source, "link.gnn")
    program = elaborate(model.module, {}, CORA)
    seen = [program]
    run_pipeline(program, PASSES, verify_each=True, after=lambda n, p: seen.append(p))
    for p in seen:
        assert parse_ir(str(p)) == p
    typed = seen[-1]
    types = {o.name: str(o.type) for layer in typed.layers for e in layer.eqns for o in e.outs}
    assert "%label:pair:f32[]" in str(typed).splitlines()[3]
    assert any(t == "pair:f32[1]" for t in types.values()) or any(t == "pair:f32[]" for t in types.values())


ERRORS = [
    ("score = dot(src.z, z)\n  loss = bce(score, label)",
     "dot of two values needs two vertex, edge or pair values of one kind, got a pair and a vertex value"),
    ("score = src.z + z\n  loss = bce(score, label)", "cannot combine"),
    ("score = dot(src.z, dst.z)\n  loss = bce(z, label)", "bce(score, label) scores pairs: score must be one number per pair"),
    ("score = linear(src.z, 2)\n  loss = bce(score, label)", "score must be one number per pair"),
    ("score = dot(src.z, dst.z)\n  loss = bce(score, label, mask = train)", "no mask"),
]


@pytest.mark.parametrize("body,message", ERRORS)
def test_pair_type_errors(body: str, message: str) -> None:
    source = GCN + "model M(features, latent = 16) {\n  z = GCNConv(features, latent)(x)\n  " + body + "\n}\n"
    model = api.load_model_source(source, "bad.gnn")
    with pytest.raises(GnncTypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_pipeline(elaborate(model.module, {}, CORA), ["infer-shapes"], verify_each=True)


def test_link_settings_need_a_link_model() -> None:
    source = GCN + ("model M(features, classes) {\n  h = GCNConv(features, classes)(x)\n"
                    "  training(val_edges = 0.1)\n  loss = cross_entropy(h, y, mask = train)\n}\n")
    with pytest.raises(GnncTypeError, match="training setting 'val_edges' is for link prediction"):
        elaborate(api.load_model_source(source, "bad.gnn").module, {}, CORA)
    source = GCN + ("model M(features, latent = 4) {\n  z = GCNConv(features, latent)(x)\n"
                    "  training(test_edges = 1.5)\n  score = dot(src.z, dst.z)\n  loss = bce(score, label)\n}\n")
    with pytest.raises(GnncTypeError, match="training setting 'test_edges' must be above 0.0 and below 1.0"):
        elaborate(api.load_model_source(source, "bad.gnn").module, {}, CORA)


def test_cost_model_counts_the_pair_ops() -> None:
    from gnnc.passes.cost.ops import class_of, program_op_work

    model = api.load_model_source((EXAMPLES / "link_gae.gnn").read_text(), "link_gae.gnn")
    program = run_pipeline(elaborate(model.module, {}, CORA), PASSES)
    assert class_of("pair_src", 1) == class_of("pair_dst", 1) == "copy" and class_of("inner", 2) == "elementwise"
    last = program_op_work(program)[-1]
    forward_edge = {cls: n for side, cls, n in last.forward if side == "edge"}
    # two copies of 16 wide and a 16-wide product per pair, and the loss; (1 + neg_ratio) / 2 pairs per edge
    assert forward_edge["copy"] == pytest.approx(2 * 16 * 1.0)  # the layer's own src copies are lowered away
    assert forward_edge["elementwise"] >= 16 * 1.0


# ----- the same model in PyG ---------------------------------------------------------------------------------

def _program(source: str, graph):
    return api.compile(api.load_model_source(source, "link.gnn"), graph, passes=PASSES[:4]).program


def _run_ours(program, graph, params, pairs, labels, training=False):
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), training, lambda i: 0, 1.0,
                      True, pairs=(pairs[0], pairs[1]))
    scores, loss = forward(Interpreter(program), params, {**graph_inputs(graph), "label": labels}, ctx)
    loss.backward()
    return scores.detach().reshape(-1), loss.detach(), {k: v.grad for k, v in params.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


@pytest.fixture(scope="module")
def graph():
    return random_graph(60, 240, 12, 3, seed=4)


def _pairs(graph, k=90, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, graph.num_nodes, (2, k), generator=gen)
    labels = (torch.rand(k, generator=gen) < 0.5).float()
    return pairs, labels


def test_gae_equals_pyg(graph) -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    from torch_geometric.nn import GAE

    torch.manual_seed(0)
    c1, c2 = pyg.GCNConv(graph.num_features, 32), pyg.GCNConv(32, 16)
    for c in (c1, c2):
        torch.nn.init.normal_(c.bias, std=0.1)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    pairs, labels = _pairs(graph)

    class Encoder(torch.nn.Module):
        def forward(self, x, edge_index):
            return c2(c1(x, edge_index).relu(), edge_index)

    gae = GAE(Encoder())
    z = gae.encode(graph.x, ei)
    want = gae.decoder(z, pairs, sigmoid=False)
    want_loss = torch.nn.functional.binary_cross_entropy_with_logits(want, labels)
    want_loss.backward()
    params = {"l0.linear0.weight": c1.lin.weight.T, "l0.bias0.bias": c1.bias,
              "l1.linear0.weight": c2.lin.weight.T, "l1.bias0.bias": c2.bias}
    grads = {"l0.linear0.weight": c1.lin.weight.grad.T, "l0.bias0.bias": c1.bias.grad,
             "l1.linear0.weight": c2.lin.weight.grad.T, "l1.bias0.bias": c2.bias.grad}
    program = _program((EXAMPLES / "link_gae.gnn").read_text(), graph)
    scores, loss, got = _run_ours(program, graph, params, pairs, labels)
    assert _rel(scores, want.detach()) < 1e-5
    assert abs(float(loss) - float(want_loss.detach())) < 1e-5
    for k, g in grads.items():
        assert _rel(got[k], g) < 1e-5, k


def test_mlp_decoder_equals_torch(graph) -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(1)
    c1, c2 = pyg.GCNConv(graph.num_features, 32), pyg.GCNConv(32, 16)
    lin_cat, lin_had, lin_out = torch.nn.Linear(32, 32), torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(32, 1)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    pairs, labels = _pairs(graph, seed=1)
    z = c2(c1(graph.x, ei).relu(), ei)
    zs, zd = z[pairs[0]], z[pairs[1]]
    want = lin_out((lin_cat(torch.cat([zs, zd], -1)) + lin_had(zs * zd)).relu()).view(-1)
    want_loss = torch.nn.functional.binary_cross_entropy_with_logits(want, labels)
    want_loss.backward()
    params = {"l0.linear0.weight": c1.lin.weight.T, "l0.bias0.bias": c1.bias,
              "l1.linear0.weight": c2.lin.weight.T, "l1.bias0.bias": c2.bias,
              "d1.linear0.weight": lin_cat.weight.T, "d1.linear0.bias": lin_cat.bias,
              "d1.linear1.weight": lin_had.weight.T,
              "d1.linear2.weight": lin_out.weight.T, "d1.linear2.bias": lin_out.bias}
    program = _program(MLP, graph)
    assert sorted(p.value.name for p in program.params()) == sorted(params)
    scores, loss, got = _run_ours(program, graph, params, pairs, labels, training=True)
    assert _rel(scores, want.detach()) < 1e-5
    assert abs(float(loss) - float(want_loss.detach())) < 1e-5
    for k, mod_grad in {"d1.linear0.weight": lin_cat.weight.grad.T, "d1.linear1.weight": lin_had.weight.grad.T,
                        "d1.linear2.bias": lin_out.bias.grad, "l0.linear0.weight": c1.lin.weight.grad.T}.items():
        assert _rel(got[k], mod_grad) < 1e-5, k


# ----- runs ------------------------------------------------------------------------------------------------

def _small_graph(path) -> str:
    """An undirected random graph with features, as an .npz file (a short run's input)."""
    import numpy as np

    rng = np.random.default_rng(0)
    n, e = 120, 500
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    np.savez(path, edge_index=np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]),
             x=rng.normal(size=(n, 8)).astype("float32"), y=rng.integers(0, 3, n))
    return str(path)


def test_run_reports_auc_hits_and_mrr(capsys, tmp_path) -> None:
    from gnnc import cli

    graph = _small_graph(tmp_path / "g.npz")
    rc = cli.main(["run", str(EXAMPLES / "link_gae.gnn"), "--graph", graph, "--epochs", "3", "--json",
                   "--no-progress", "--seed", "7"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("test_auc", "val_auc", "test_hits@20", "test_mrr", "final_test_auc"):
        assert 0.0 <= out[key] <= 1.0, key
    assert "test_acc" not in out  # no accuracy for pairs
    # seeded: the same split, negatives and initial weights again (threaded sums may differ in the last bits)
    again = api.run(api.load_model(EXAMPLES / "link_gae.gnn"), graph, epochs=3, seed=7)
    assert again.metrics == pytest.approx({k: out[k] for k in again.metrics}, rel=1e-4)


def test_dropout_of_pair_values(tmp_path) -> None:
    """A decoder's dropout draws one mask row per pair (there are more pairs than vertices)."""
    source = GCN + ("model D(features, latent = 8) {\n  z = GCNConv(features, latent)(x)\n"
                    "  score = linear(dropout(src.z * dst.z, 0.5), 1)\n  loss = bce(score, label)\n}\n")
    result = api.run(api.load_model_source(source, "d.gnn"), _small_graph(tmp_path / "g.npz"), epochs=2, seed=0)
    assert 0.0 <= result.metrics["test_auc"] <= 1.0


@pytest.mark.parametrize("flag", ["--save-model", "--dump-logits"])
def test_flags_without_vertex_logits_are_refused_before_training(flag: str, capsys, tmp_path) -> None:
    from gnnc import cli

    rc = cli.main(["run", str(EXAMPLES / "link_gae.gnn"), "--graph", _small_graph(tmp_path / "g.npz"), "--epochs",
                   "1", flag, str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{flag}: a link-prediction model scores vertex pairs" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", [["--recompute"], ["--eval-every", "2"], ["--checkpoint", "CK"], ["--metrics", "M"]])
def test_run_options_the_link_loop_lacks_are_refused(flag: list[str], capsys, tmp_path) -> None:
    from gnnc import cli

    args = [str(tmp_path / a) if a in ("CK", "M") else a for a in flag]
    rc = cli.main(["run", str(EXAMPLES / "link_gae.gnn"), "--graph", _small_graph(tmp_path / "g.npz"), "--epochs",
                   "1", *args])
    err = capsys.readouterr().err
    assert rc == 2 and flag[0] in err, err
