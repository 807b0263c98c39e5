"""Cora and CiteSeer load exactly as PyG's Planetoid loader reads the same files."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from gnnc.errors import GraphInputError
from gnnc.graph.planetoid import DATA_DIR, load_planetoid

tg = pytest.importorskip("torch_geometric")


@pytest.mark.parametrize("name, pyg_name, sizes", [("cora", "Cora", (140, 500, 1000)),
                                                    ("citeseer", "CiteSeer", (120, 500, 1000))])
def test_matches_pyg(name: str, pyg_name: str, sizes, tmp_path) -> None:
    from torch_geometric.datasets import Planetoid
    from torch_geometric.transforms import NormalizeFeatures

    raw = tmp_path / pyg_name / "raw"
    raw.mkdir(parents=True)
    for f in DATA_DIR.glob(f"ind.{name}.*"):
        shutil.copy(f, raw / f.name)
    ref = Planetoid(str(tmp_path), pyg_name, transform=NormalizeFeatures())[0]
    g = load_planetoid(name)
    assert g.num_nodes == ref.num_nodes
    assert torch.equal(g.x, ref.x)  # bit-identical: 0/1 counts divide exactly in float32
    assert torch.equal(g.y, ref.y)
    for ours, theirs, size in zip((g.train_mask, g.val_mask, g.test_mask),
                                  (ref.train_mask, ref.val_mask, ref.test_mask), sizes):
        assert torch.equal(ours, theirs) and int(ours.sum()) == size
    ours_e = set(zip(g.src.tolist(), g.dst.tolist()))
    theirs_e = set(zip(ref.edge_index[0].tolist(), ref.edge_index[1].tolist()))
    assert ours_e == theirs_e and len(ours_e) == g.num_edges
    # PyG removes self-loops and duplicates and sorts by (src, dst): same arrays, same order
    assert np.array_equal(np.stack([g.src, g.dst]), ref.edge_index.numpy())


def test_refuses_a_pickle_that_runs_code(tmp_path) -> None:
    import pickle

    for f in DATA_DIR.glob("ind.cora.*"):
        shutil.copy(f, tmp_path / f.name)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "ind.cora.x").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(GraphInputError, match="builtins.print"):
        load_planetoid("cora", tmp_path)


def test_unknown_name() -> None:
    with pytest.raises(GraphInputError, match="unknown Planetoid dataset 'pubmed'"):
        load_planetoid("pubmed")


def test_no_vertex_feature_row_is_unnormalised() -> None:
    g = load_planetoid("cora")
    sums = g.x.sum(1)
    assert np.allclose(sums[sums > 0].numpy(), 1.0, atol=1e-5)


def test_load_graph_names_planetoid() -> None:
    from gnnc.graph.loaders import load_graph

    g = load_graph("planetoid:citeseer")
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (3327, 9104, 3703, 6)
    with pytest.raises(GraphInputError, match="unknown Planetoid dataset 'pubmed'"):
        load_graph("planetoid:pubmed")
