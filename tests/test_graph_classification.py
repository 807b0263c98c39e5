"""Graph classification (issue 37 item 3): TU datasets and the generator, batches and folds, the readouts (type
rules, round trip, golden IR, PyG equivalence, max's gradient), and `gnnc run` on a dataset of many graphs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, check_golden
from gnnc import api
from gnnc.errors import GnncError, GnncTypeError, GraphInputError
from gnnc.frontend.elaborate import elaborate
from gnnc.graph.graph_batches import epoch_batches, fold_split, make_batch, stratified_folds
from gnnc.graph.tu_dataset import generate_graphs, load_graph_dataset, read_tu, write_tu
from gnnc.ir import Eqn, Type, Value, ops
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE, run_pipeline
from gnnc.runtime.executor import ExecContext, implementation

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool  # noqa: E402

PYG_POOLS = {"global_sum_pool": global_add_pool, "global_mean_pool": global_mean_pool,
             "global_max_pool": global_max_pool}


def _tu_with_labels(tmp: Path) -> Path:
    """A small TU dataset with node labels (1-based, as TU files have them), attributes, a self-loop and a
    duplicate edge, and graph labels that are not 0..C-1."""
    d = tmp / "TOY"
    d.mkdir()
    (d / "TOY_A.txt").write_text("1, 2\n2, 1\n2, 3\n3, 2\n3, 3\n2, 3\n4, 5\n5, 4\n5, 6\n6, 5\n7, 8\n")
    (d / "TOY_graph_indicator.txt").write_text("1\n1\n1\n2\n2\n2\n3\n3\n")
    (d / "TOY_graph_labels.txt").write_text("-1\n1\n1\n")
    (d / "TOY_node_labels.txt").write_text("1\n2\n3\n1\n1\n3\n2\n2\n")
    (d / "TOY_node_attributes.txt").write_text("0.5, 1.0\n1.5, -2.0\n0.0, 0.0\n1.0, 1.0\n2.0, 2.0\n3.0, 3.0\n4, 4\n5, 5\n")
    return d


def test_tu_reader_matches_pyg_tudataset(tmp_path: Path) -> None:
    from torch_geometric.datasets import TUDataset

    d = _tu_with_labels(tmp_path)
    ours = read_tu(str(d))
    raw = tmp_path / "pyg" / "TOY" / "raw"
    raw.mkdir(parents=True)
    for f in d.iterdir():
        shutil.copy(f, raw / f.name)
    theirs = TUDataset(str(tmp_path / "pyg"), "TOY", use_node_attr=True)
    assert ours.num_graphs == len(theirs) == 3 and list(ours.y) == [0, 1, 1]
    for g in range(len(theirs)):
        b = make_batch(ours, np.array([g]))
        assert torch.equal(b.graph.x, theirs[g].x), g
        ei = torch.stack([torch.from_numpy(b.graph.src), torch.from_numpy(b.graph.dst)])
        assert torch.equal(ei, theirs[g].edge_index), g  # self-loop dropped, duplicate merged, as PyG
        assert int(b.y[0]) == int(theirs[g].y), g


def test_tu_round_trip_of_generated_dataset(tmp_path: Path) -> None:
    ds = generate_graphs("graphs:n=30,seed=3")
    back = load_graph_dataset(f"tu:{write_tu(ds, tmp_path / 'GEN', 'GEN')}")
    for f in ("x", "src", "dst", "ptr", "y"):
        assert np.array_equal(getattr(ds, f), getattr(back, f)), f


def test_generator_is_seeded_balanced_and_structural() -> None:
    a, b = generate_graphs("graphs:n=90,seed=1"), generate_graphs("graphs:n=90,seed=1")
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("src", "dst", "ptr", "y"))
    assert not np.array_equal(a.src, generate_graphs("graphs:n=90,seed=2").src)
    clean = generate_graphs("graphs:n=90,seed=1,noise=0")
    assert list(np.bincount(clean.y)) == [30, 30, 30]
    assert np.all(a.x == 1.0) and a.num_features == 1  # the class is in the structure only
    assert not np.any(a.src == a.dst)
    assert np.all(a.graph_of_nodes()[a.src] == a.graph_of_nodes()[a.dst])


@pytest.mark.parametrize("files, want", [
    ({"A": "1, 2\n2, x\n"}, "TOY_A.txt:2: A: expected an integer"),
    ({"A": "1, 2\n2, 9\n"}, "TOY_A.txt:2: A: node id 9 out of range 1..8"),
    ({"A": "1, 2\n3, 4\n"}, "TOY_A.txt:2: A: edge joins nodes of graphs 1 and 2"),
    ({"graph_labels": "1\n2\n"}, "graph_labels: 2 labels for 3 graphs"),
    ({"graph_indicator": "1\n1\n2\n1\n2\n2\n3\n3\n"}, "TOY_graph_indicator.txt:4: graph_indicator"),
    ({"node_attributes": "1.0, nan\n"}, "TOY_node_attributes.txt:1: node_attributes: NaN"),
    ({"node_labels": "1\n2\n"}, "node_labels: 2 rows for 8 nodes"),
    ({"node_labels": "1\n2\n3\n1\n1000000000\n3\n2\n2\n"}, "TOY_node_labels.txt:5: node_labels: labels span"),
    ({"graph_indicator": ""}, "graph_indicator: the file is empty"),
])
def test_bad_tu_files_name_file_and_field(tmp_path: Path, files: dict[str, str], want: str) -> None:
    d = _tu_with_labels(tmp_path)
    for k, text in files.items():
        (d / f"TOY_{k}.txt").write_text(text)
    with pytest.raises(GraphInputError, match=want.replace(".", r"\.")):
        read_tu(str(d))


def test_bad_tu_file_exits_2_on_the_command_line(tmp_path: Path, capsys) -> None:
    from gnnc.cli import main

    d = _tu_with_labels(tmp_path)
    (d / "TOY_graph_labels.txt").write_text("1\nzero\n1\n")
    assert main(["run", str(EXAMPLES / "gin_graph.gnn"), "--graph", f"tu:{d}", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "TOY_graph_labels.txt:2: graph_labels: expected an integer" in err and "Traceback" not in err


@pytest.mark.parametrize("spec, want", [("graphs:n=abc", "n=abc: expected an integer"),
                                        ("graphs:n=2", "expected 3 to 1000000 graphs"),
                                        ("graphs:size=3", "unknown option 'size=3'"),
                                        ("tu:/nonexistent/DS", "no DS_A.txt in /nonexistent/DS")])
def test_bad_dataset_specs(spec: str, want: str) -> None:
    with pytest.raises(GraphInputError, match=want):
        load_graph_dataset(spec)


def test_batches_match_pyg_batch() -> None:
    ds = generate_graphs("graphs:n=12,seed=0")
    ids = np.array([5, 0, 7, 3])
    ours = make_batch(ds, ids)
    datas = []
    for g in ids:
        lo, hi = ds.ptr[g], ds.ptr[g + 1]
        keep = (ds.src >= lo) & (ds.src < hi)
        datas.append(Data(x=torch.from_numpy(ds.x[lo:hi]), y=torch.tensor([ds.y[g]]),
                          edge_index=torch.from_numpy(np.stack([ds.src[keep] - lo, ds.dst[keep] - lo]))))
    theirs = Batch.from_data_list(datas)
    assert torch.equal(ours.graph.x, theirs.x) and torch.equal(ours.batch, theirs.batch)
    assert torch.equal(torch.from_numpy(np.stack([ours.graph.src, ours.graph.dst])), theirs.edge_index)
    assert torch.equal(ours.y, theirs.y)


def test_folds_are_stratified_disjoint_and_cover() -> None:
    y = np.repeat([0, 1, 2], [50, 30, 20])
    folds = stratified_folds(y, 10, seed=0)
    assert sorted(np.concatenate(folds).tolist()) == list(range(100))
    for f in folds:
        assert list(np.bincount(y[f], minlength=3)) == [5, 3, 2]
    train, val, test = fold_split(folds, 0)
    assert np.array_equal(test, folds[0]) and np.array_equal(val, folds[9]) and len(train) == 80
    assert stratified_folds(y, 10, seed=0)[3].tolist() == folds[3].tolist()
    with pytest.raises(GnncError, match="10-fold cross validation needs at least 10 graphs; the dataset has 4"):
        stratified_folds(np.array([0, 1, 0, 1]), 10)
    b0, b1 = epoch_batches(train, 32, 0, 0), epoch_batches(train, 32, 0, 1)
    assert [len(b) for b in b0] == [32, 32, 16] and sorted(np.concatenate(b0)) == sorted(train)
    assert not np.array_equal(np.concatenate(b0), np.concatenate(b1))  # reshuffled every epoch


# ----- the readouts in the IR ----------------------------------------------------------------------------------

POOL_MODEL = """
layer Conv(in, out) {
  scatter   m = src.h
  gather    a = sum(m)
  apply     h = linear(a, out)
}
model Pools(features, hidden = 8, classes) {
  h = relu(Conv(features, hidden)(x))
  g = concat(global_sum_pool(h), global_mean_pool(h), global_max_pool(h))
  g = linear(g, classes)
  loss = cross_entropy(g, y, mask = train)
}
"""


def _pool_program(**dims):
    model = api.load_model_source(POOL_MODEL, "pools.gnn")
    return elaborate(model.module, {}, dims or {"features": 5, "classes": 3})


def test_readouts_golden_ir_and_round_trip() -> None:
    program = _pool_program()
    stages = {"elaborate": str(program)}
    typed = run_pipeline(program, DEFAULT_PIPELINE, verify_each=True,
                         after=lambda n, p: stages.__setitem__(n, str(p)))
    check_golden({k: stages[k] for k in ("elaborate", "infer-shapes")}, "pools")
    for text in stages.values():
        assert str(parse_ir(text)) == text
    assert "%y:graph:i64[]" in stages["infer-shapes"] and "= global_max_pool(" in stages["infer-shapes"]
    assert ops.is_graph_classification(typed)


def _eqn(op: str, *types: Type) -> tuple[Eqn, list[Type]]:
    ins = tuple(Value(f"v{k}", t) for k, t in enumerate(types))
    return Eqn(op, ins, (Value("out"),)), list(types)


@pytest.mark.parametrize("op", ops.READOUTS)
def test_readout_type_rule(op: str) -> None:
    e, ts = _eqn(op, Type("vertex", (16,)))
    assert ops.infer(e, ts) == [Type("graph", (16,))]
    for bad, msg in ((Type("edge", (16,)), "expects a vertex value, got a edge value"),
                     (Type("graph", (16,)), "expects a vertex value, got a graph value"),
                     (Type("vertex", ()), "needs a value with a feature dim")):
        e, ts = _eqn(op, bad)
        with pytest.raises(GnncTypeError, match=msg):
            ops.infer(e, ts)


def test_cross_entropy_over_graph_rows_and_its_refusals() -> None:
    g, gy, gm = Type("graph", (3,)), Type("graph", (), "i64"), Type("graph", (), "bool")
    e, ts = _eqn("cross_entropy", g, gy, gm)
    assert ops.infer(e, ts) == [Type("scalar", ())]
    e, ts = _eqn("cross_entropy", g, Type("vertex", (), "i64"), gm)
    with pytest.raises(GnncTypeError, match="integer graph labels .* got vertex labels"):
        ops.infer(e, ts)
    e, ts = _eqn("add", g, Type("vertex", (3,)))
    with pytest.raises(GnncTypeError, match="cannot combine a graph value .* with a vertex value in 'add'"):
        ops.infer(e, ts)


def test_graph_classification_model_on_one_graph_is_refused() -> None:
    with pytest.raises(Exception, match="classifies graphs: run it with `gnnc run MODEL.gnn --graph tu:DIR`"):
        api.compile(api.load_model_source(POOL_MODEL, "pools.gnn"), api.load_graph("planetoid:cora"))


def _readout(op: str, x: torch.Tensor, batch: torch.Tensor, graphs: int) -> torch.Tensor:
    e = Eqn(op, (Value("x", Type("vertex", (x.shape[1],))),), (Value("g", Type("graph", (x.shape[1],))),))
    ctx = ExecContext({}, torch.arange(len(batch)), {}, True, lambda i: i, 1.0, batch=batch,
                      graph_ids=torch.arange(graphs))
    return implementation(op, False).fn(e, [x], None, ctx)


@pytest.mark.parametrize("op", ops.READOUTS)
def test_readout_matches_pyg_forward_and_backward(op: str) -> None:
    gen = torch.Generator().manual_seed(0)
    batch = torch.tensor([0, 0, 0, 1, 3, 3, 3, 3])  # graph 2 has no vertex: 0, as PyG gives it with size=4
    x = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    x[1, 2] = x[0, 2]  # a tie in max: the gradient is shared as torch's scatter_reduce amax shares it
    upstream = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = _readout(op, a, batch, 4), PYG_POOLS[op](b, batch, size=4)
    assert torch.allclose(ours, theirs, atol=1e-12)
    (ours * upstream).sum().backward()
    (theirs * upstream).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)
    if op == "global_max_pool":
        assert torch.allclose(a.grad[[0, 1], 2].sum(), upstream[0, 2]) or x[:3, 2].max() != x[0, 2]


def test_gin_graph_matches_pyg_gin_on_a_batch() -> None:
    """examples/gin_graph.gnn computes PyG's GIN (examples/gin.py's Net) on a batch: same weights, same logits
    and gradients (dropout off: evaluation mode for the dropout, batch statistics for batch_norm)."""
    from torch_geometric.nn import GINConv, MLP

    from gnnc.runtime.graph_task import GraphSplit, GraphTrainer
    from gnnc.runtime.train import TrainConfig

    ds = generate_graphs("graphs:n=40,seed=0")
    model = api.load_model(EXAMPLES / "gin_graph.gnn", layers=2, p=0.0)
    from gnnc.graph_classification import compile_for

    program = compile_for(model, ds)
    trainer = GraphTrainer(program, ds, TrainConfig(epochs=1, seed=0), GraphSplit(), 16)
    ids = np.arange(16)
    b = make_batch(ds, ids)
    trainer.loss_count = len(ids)
    logits, loss = trainer._forward(b, True, 0)
    loss.backward()

    torch.manual_seed(0)
    convs = torch.nn.ModuleList([GINConv(MLP([1 if k == 0 else 32, 32, 32]), train_eps=False) for k in range(2)])
    head = MLP([32, 32, ds.num_classes], norm=None, dropout=0.0)
    p = trainer.params
    with torch.no_grad():
        for k, conv in enumerate(convs):
            lin0, lin1 = conv.nn.lins
            lin0.weight.copy_(p[f"l{k}.linear0.weight"].T)
            lin0.bias.copy_(p[f"l{k}.linear0.bias"])
            lin1.weight.copy_(p[f"l{k}.linear1.weight"].T)
            lin1.bias.copy_(p[f"l{k}.linear1.bias"])
        dense = sorted(n for n in p if n.startswith("d") and n.endswith("weight"))
        for lin, w in zip(head.lins, dense):
            lin.weight.copy_(p[w].T)
            lin.bias.copy_(p[w.replace("weight", "bias")])
    ei = torch.from_numpy(np.stack([b.graph.src, b.graph.dst]))
    h = b.graph.x
    for conv in convs:
        h = conv(h, ei).relu()
    out = head(global_add_pool(h, b.batch))
    ref = torch.nn.functional.cross_entropy(out, b.y)
    ref.backward()
    assert torch.allclose(logits, out, atol=1e-4, rtol=1e-4)
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(p["l0.linear0.weight"].grad, convs[0].nn.lins[0].weight.grad.T, atol=1e-4, rtol=1e-3)


def test_gnnc_run_reports_test_acc() -> None:
    """`gnnc run examples/gin_graph.gnn --graph graphs:... --json` (gnnc.run, which the CLI calls) reports test_acc."""
    result = api.run(api.load_model(EXAMPLES / "gin_graph.gnn", layers=2), "graphs:n=40,seed=0", epochs=2, threads=1)
    out = json.loads(json.dumps(result.to_json()))
    assert 0.0 <= out["test_acc"] <= 1.0 and out["epochs"] == 2 and out["world_size"] == 1
    assert len(result.history) == 2 and result.model == "GIN"


def test_readouts_have_cost_entries() -> None:
    """Each readout is priced as a copy of its vertex rows (passes/cost/ops.py), on the last layer's output rows."""
    from gnnc.passes.cost.ops import op_class, program_op_work

    program = run_pipeline(_pool_program(), DEFAULT_PIPELINE)
    pools = [e for layer in program.layers for e in layer.eqns if e.op in ops.READOUTS]
    assert len(pools) == 3 and {op_class(e) for e in pools} == {"copy"}
    work = dict(((side, cls), n) for side, cls, n in program_op_work(program)[-1].forward)
    assert work[("out", "copy")] == 3 * 8  # three pools of the 8-wide h per vertex row


def test_pass_testing_kit_covers_readouts(tmp_path: Path) -> None:
    from gnnc.testing import filecheck, run_pass

    f = tmp_path / "pools.gnn"
    f.write_text(POOL_MODEL)
    out = run_pass("lower", str(f), dims={"features": 5, "classes": 3})
    filecheck(out, """
        CHECK: inputs %x:vertex:f32[features], %y:graph:i64[], %train:graph:bool[]
        CHECK: %h:vertex:f32[hidden] = relu(
        CHECK: :graph:f32[hidden] = global_sum_pool(%h)
        CHECK-NEXT: :graph:f32[hidden] = global_mean_pool(%h)
        CHECK-NEXT: :graph:f32[hidden] = global_max_pool(%h)
        CHECK: %loss:scalar:f32[] = cross_entropy(%g.1, %y, %train)
    """)


@pytest.mark.parametrize("flags, want", [
    (["--metrics", "m.jsonl"], "--metrics: not available for graph classification"),
    (["--save-model", "w.pt"], "--save-model: not available for graph classification"),
    (["--strategy", "depcomm"], "--strategy: not available for graph classification"),
    (["--schedule-lr", "cosine"], "--schedule-lr or training(schedule=...): graph classification trains at a "
                                  "constant rate"),
])
def test_flags_graph_classification_does_not_take_are_refused(tmp_path: Path, monkeypatch, capsys,
                                                               flags: list[str], want: str) -> None:
    """Exit 2 naming the flag, before training, rather than a flag silently ignored."""
    from gnnc.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["run", str(EXAMPLES / "gin_graph.gnn"), "--graph", "graphs:n=30", "--epochs", "1"] + flags
    assert main(argv) == 2
    assert want in capsys.readouterr().err


def test_run_names_the_model_it_trained() -> None:
    source = (EXAMPLES / "gin_graph.gnn").read_text() + POOL_MODEL.split("model Pools", 1)[0].replace(
        "layer Conv", "layer Conv2").replace("Conv(", "Conv2(") + "model Pools" + POOL_MODEL.split("model Pools", 1)[1]
    model = api.load_model_source(source, "two.gnn", model="GIN", layers=2)
    result = api.run(model, "graphs:n=30,seed=0", epochs=1, threads=1)
    assert result.model == "GIN"
