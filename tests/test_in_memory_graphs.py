"""A networkx graph and a dict of arrays are graphs to the Python API (issue 21, item 8).

Both become PyG's fields and go through the loaders' one validation, so
they equal the same graph given as a PyG-style dict, and their mistakes are
named like a file's.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

import gnnc
from conftest import EXAMPLES
from gnnc.errors import GraphInputError
from gnnc.graph.in_memory import as_graph, from_networkx

EDGES = [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]
X = np.arange(8, dtype=np.float32).reshape(4, 2)
Y = np.array([0, 1, 1, 0])
TRAIN = np.array([True, True, False, False])
VAL = np.array([False, False, True, False])
TEST = np.array([False, False, False, True])


def _nx(labelled: bool = True) -> nx.Graph:
    g = nx.Graph()
    for v in range(4):
        attrs = dict(x=X[v], y=int(Y[v]), train_mask=bool(TRAIN[v]), val_mask=bool(VAL[v]),
                     test_mask=bool(TEST[v])) if labelled else {}
        g.add_node(v, **attrs)
    g.add_edges_from(EDGES)
    return g


def _dict() -> dict:
    both = EDGES + [(v, u) for u, v in EDGES]
    return {"edge_index": np.array(both).T, "x": X, "y": Y, "train_mask": TRAIN, "val_mask": VAL, "test_mask": TEST}


def _edge_set(g) -> set[tuple[int, int]]:
    return set(zip(g.src.tolist(), g.dst.tolist()))


def test_networkx_graph_loads_with_its_node_attributes() -> None:
    g = gnnc.load_graph(_nx())
    assert g.num_nodes == 4 and g.num_edges == 10  # undirected: each edge in both directions
    assert _edge_set(g) == {(u, v) for u, v in EDGES} | {(v, u) for u, v in EDGES}
    assert torch.equal(g.x, torch.from_numpy(X)) and g.y.tolist() == Y.tolist()
    assert g.train_mask.tolist() == TRAIN.tolist() and g.test_mask.tolist() == TEST.tolist()
    assert g.stand_ins == {}
    d = gnnc.load_graph(_dict())  # the same graph as a dict of arrays: the same fields, the same Graph
    assert _edge_set(d) == _edge_set(g) and torch.equal(d.x, g.x) and torch.equal(d.val_mask, g.val_mask)


def test_networkx_node_names_directed_and_multi() -> None:
    g = nx.MultiDiGraph()
    for name, label in (("b", 1), ("a", 0), ("c", 2)):
        g.add_node(name, x=[1.0, float(label)], y=label)
    g.add_edges_from([("b", "a"), ("b", "a"), ("a", "c")])  # a parallel edge stays, direction is kept
    h = from_networkx(g)
    assert h.y.tolist() == [1, 0, 2]  # vertices in g.nodes order
    assert list(zip(h.src.tolist(), h.dst.tolist())) == [(0, 1), (0, 1), (1, 2)]
    assert set(h.stand_ins) == {"split"}  # no masks given: a made-up split, recorded


def test_networkx_graph_without_labels_compiles_but_does_not_train() -> None:
    g = gnnc.load_graph(_nx(labelled=False))
    assert set(g.stand_ins) == {"x", "y", "split"} and g.x.shape == (4, 1)
    model = gnnc.load_model(EXAMPLES / "gcn.gnn")
    plan = gnnc.compile(model, g)
    with pytest.raises(GraphInputError, match=r"no labels \(y\)"):
        gnnc.run(plan, g, epochs=1)


def test_api_trains_on_networkx_and_dict_graphs() -> None:
    model = gnnc.load_model(EXAMPLES / "gcn.gnn", hidden=4)
    a = gnnc.run(model, _nx(), epochs=2, seed=0)
    b = gnnc.run(model, _dict(), epochs=2, seed=0)
    assert a.logits.shape == (4, 2) and torch.allclose(a.logits, b.logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("obj, message", [
    (42, "cannot use a builtins.int as a graph: expected a graph spec"),
    ([1, 2], "a networkx graph (node attributes x, y and optional masks) or a dict of arrays"),
    ({"x": X, "y": Y}, "dict of arrays: edge_index: missing"),
    ({"edge_index": np.array(EDGES).T, "x": X, "y": Y[:3]}, "dict of arrays: y: has 3 rows but x has 4"),
])
def test_unusable_objects_are_named(obj, message) -> None:
    with pytest.raises(GraphInputError) as err:
        as_graph(obj)
    assert message in str(err.value) and "PyG Data" not in str(err.value).split("expected")[0]


def test_networkx_attribute_on_some_nodes_only_is_named() -> None:
    g = _nx()
    del g.nodes[2]["y"]
    with pytest.raises(GraphInputError, match=r"networkx graph: y: node 2 has no attribute 'y' \(3 of 4 nodes"):
        from_networkx(g)
    g = _nx()
    g.nodes[1]["x"] = np.zeros(3, np.float32)
    with pytest.raises(GraphInputError, match="networkx graph: x: the nodes' values do not stack"):
        from_networkx(g)
