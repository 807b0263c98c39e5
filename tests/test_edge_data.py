"""Edge data from the graph (issue 21, item 1): `edge_NAME` fields become `edge.NAME`, checked, kept.

Every file format keeps `edge_weight`, `edge_attr` and other `edge_*` fields
(a bad one is refused naming the field); the `self_loops` view gives its
loops the values PyG's add_remaining_self_loops gives them; gcn_norm weighs
as PyG's gcn_norm does; partition shards, subgraphs and the load cache keep
the data; elaboration types `edge.NAME` by what the graph holds and the
runtime refuses a graph that lacks what the model reads. The distributed
runtime's share (halo edges carry their data) is in test_language_distributed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api, cli
from gnnc.errors import GnncError, GnncTypeError, GraphInputError
from gnnc.graph.loaders import from_pyg, load_graph
from gnnc.passes.partition.core import induced_subgraph
from gnnc.plan.shard_files import assemble, write_shards

EDGE_INDEX = np.array([[0, 1, 1, 2, 3, 3, 3], [1, 0, 2, 1, 3, 0, 3]])  # vertex 3 has two self-loops
X = np.arange(12, dtype=np.float32).reshape(4, 3)
Y = np.array([0, 1, 1, 0])
WEIGHT = np.array([0.5, 2.0, 1.5, 1.0, 3.0, 0.25, 4.0], dtype=np.float32)
ATTR = np.arange(14, dtype=np.float32).reshape(7, 2)


def _npz(tmp_path: Path, **arrays) -> Path:
    base = {"edge_index": EDGE_INDEX, "x": X, "y": Y, "edge_weight": WEIGHT, "edge_attr": ATTR}
    base.update(arrays)
    path = tmp_path / "g.npz"
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return path


def test_npz_fields_named_edge_NAME_are_edge_data(tmp_path) -> None:
    g = load_graph(str(_npz(tmp_path, edge_type=np.arange(7), edge_weight=WEIGHT[:, None])), use_cache=False)
    assert sorted(g.edge_data) == ["attr", "type", "weight"]
    assert g.edge_data["weight"].shape == (7,) and torch.equal(g.edge_data["weight"], torch.from_numpy(WEIGHT))
    assert g.edge_data["attr"].dtype == torch.float32 and g.edge_data["attr"].shape == (7, 2)
    assert g.edge_data["type"].shape == (7,)


BAD = [
    ("rows", dict(edge_weight=WEIGHT[:5]), "edge_weight: has 5 rows but edge_index has 7 edges"),
    ("weight shape", dict(edge_weight=ATTR), "edge_weight: expected shape [E], got [7, 2]"),
    ("attr shape", dict(edge_attr=np.zeros((7, 2, 2))), "edge_attr: expected shape [E] or [E, d], got [7, 2, 2]"),
    ("NaN", dict(edge_attr=np.where(ATTR == 9, np.nan, ATTR)), "edge_attr: holds NaN at edge 4"),
    ("dtype", dict(edge_attr=np.array(["a"] * 7)), "edge_attr: expected a numeric dtype"),
    ("computed name", dict(edge_gcn_norm=WEIGHT), "edge_gcn_norm: 'gcn_norm' is computed by gnnc"),
]


@pytest.mark.parametrize("case, arrays, message", BAD, ids=[b[0] for b in BAD])
def test_bad_edge_data_is_refused_naming_the_field(case, arrays, message, tmp_path, capsys) -> None:
    path = _npz(tmp_path, **arrays)
    with pytest.raises(GraphInputError) as err:
        load_graph(str(path), use_cache=False)
    assert message in str(err.value) and str(path) in str(err.value)
    assert cli.main(["check", str(EXAMPLES / "gcn.gnn"), "--graph", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_pyg_data_keeps_edge_weight_and_edge_attr(tmp_path) -> None:
    tg = pytest.importorskip("torch_geometric")
    data = tg.data.Data(x=torch.from_numpy(X), edge_index=torch.from_numpy(EDGE_INDEX), y=torch.from_numpy(Y),
                        edge_weight=torch.from_numpy(WEIGHT), edge_attr=torch.from_numpy(ATTR))
    torch.save(data, tmp_path / "d.pt")
    for g in (load_graph(str(tmp_path / "d.pt"), use_cache=False), from_pyg(data), api.load_graph(data)):
        assert torch.equal(g.edge_data["weight"], data.edge_weight) and torch.equal(g.edge_data["attr"], data.edge_attr)


def test_the_cache_keeps_edge_data(tmp_path) -> None:
    path = _npz(tmp_path)
    first = load_graph(str(path), cache_dir=tmp_path / "cache")
    again = load_graph(str(path), cache_dir=tmp_path / "cache")
    assert sorted(again.edge_data) == ["attr", "weight"]
    assert all(torch.equal(again.edge_data[k], first.edge_data[k]) for k in first.edge_data)


def test_self_loop_view_and_gcn_norm_are_pygs() -> None:
    utils = pytest.importorskip("torch_geometric.utils")
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    g = random_graph(n=30, e=120, f=4, c=3, seed=4)  # self-loops, one vertex with several, isolated vertices
    gen = torch.Generator().manual_seed(0)
    g.edge_data = {"weight": torch.rand(g.num_edges, generator=gen) + 0.1, "attr": torch.randn(g.num_edges, 3,
                                                                                               generator=gen)}
    ei = torch.stack([torch.as_tensor(g.src), torch.as_tensor(g.dst)])
    loops = g.edge_values("self_loops")
    _, w = utils.add_remaining_self_loops(ei, g.edge_data["weight"], fill_value=1.0, num_nodes=g.num_nodes)
    _, attr = utils.add_remaining_self_loops(ei, g.edge_data["attr"], fill_value="mean", num_nodes=g.num_nodes)
    assert torch.equal(loops["weight"], w) and torch.allclose(loops["attr"], attr, atol=1e-6)
    for view, add in (("self_loops", True), ("plain", False)):
        _, norm = gcn_norm(ei, g.edge_data["weight"], g.num_nodes, add_self_loops=add)
        assert torch.allclose(g.gcn_norm(view), norm, rtol=1e-6, atol=1e-7), view


def test_partition_shards_and_subgraphs_keep_edge_data(tmp_path) -> None:
    g = random_graph(n=40, e=150, f=4, c=3, seed=2)
    g.edge_data = {"weight": torch.rand(g.num_edges), "attr": torch.randn(g.num_edges, 2)}
    write_shards(g, np.arange(g.num_nodes) % 3, 3, tmp_path)
    back = assemble(tmp_path)
    assert all(torch.equal(back.edge_data[k], g.edge_data[k]) for k in g.edge_data)
    sub = induced_subgraph(g, np.arange(20))
    keep = (g.src < 20) & (g.dst < 20)
    assert torch.equal(sub.edge_data["attr"], g.edge_data["attr"][torch.from_numpy(keep)])


GATED = """
layer Gated(in, out) with self_loops {
  transform t = linear(h, out)
  scatter   m = sigmoid(dot(edge.attr)) * edge.weight * src.t
  gather    a = sum(m)
  apply     h = a
}
model M(features, classes) {
  h = Gated(features, classes)(x)
  loss = cross_entropy(h, y, mask = train)
}
"""


def test_edge_data_is_typed_by_the_graph_and_checked_at_run(tmp_path) -> None:
    g = load_graph(str(_npz(tmp_path)), use_cache=False)
    model = api.load_model_source(GATED, "gated.gnn")
    program = api.compile(model, g).program
    assert "edata[name=attr, width=2]()" in str(program) and "edata[name=weight]()" in str(program)
    assert "param %l0.dot0.att:param:f32[2]" in str(program)
    plan = api.compile(model, g)
    assert api.run(plan, g, epochs=2).logits.shape == (4, 2)
    no_attr = load_graph(str(_npz(tmp_path, edge_attr=None)), use_cache=False)
    with pytest.raises(GnncTypeError, match=r"gated.gnn:4:29: unknown edge data 'edge.attr' \(the graph has weight"):
        api.compile(model, no_attr)
    with pytest.raises(GnncError, match="the model reads edge.attr but graph 'g' has no edge_attr"):
        api.run(plan, no_attr, epochs=1)  # a plan run on another graph
    wider = load_graph(str(_npz(tmp_path, edge_attr=np.ones((7, 3)))), use_cache=False)
    with pytest.raises(GnncError, match="reads edge.attr as 2 numbers per edge but graph 'g' has 3"):
        api.run(plan, wider, epochs=1)


def test_without_a_graph_weight_and_attr_are_known() -> None:
    program = api.compile(api.load_model_source(GATED, "gated.gnn")).program
    assert "edata[name=attr, width=edge_attr]()" in str(program)
