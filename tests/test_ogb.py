"""OGB node-property datasets in OGB's own on-disk layout (issue 34): gzipped CSVs, a split, NaN labels,
multi-label targets, edge features, the reverse edges of undirected datasets, the binary form, and refusals."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
import gnnc
from gnnc.cli import main
from gnnc.errors import GraphInputError
from gnnc.graph.loaders import load_graph
from gnnc.graph.storage import UNLABELLED

N, F, C = 120, 6, 3


def _csv(rows: np.ndarray, fmt: str = "{}") -> str:
    rows = rows.reshape(len(rows), -1)
    return "".join(",".join("" if isinstance(v, float) and np.isnan(v) else fmt.format(v) for v in row) + "\n"
                   for row in rows.tolist())


def _put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))


def papers_like(tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A directed, papers100M-style dataset: most labels NaN, the split over labelled vertices (plus one
    unlabelled vertex listed in valid, which must not end up in its mask)."""
    rng = np.random.default_rng(0)
    root = tmp / "ogbn_tiny_papers"
    edges = rng.integers(0, N, size=(600, 2))
    x = rng.standard_normal((N, F)).astype(np.float32)
    y = rng.integers(0, C, size=N).astype(np.float64)
    unlabelled = rng.random(N) < 0.6
    y[unlabelled] = np.nan
    labelled = np.nonzero(~unlabelled)[0]
    train, valid, test = labelled[: len(labelled) // 2], labelled[len(labelled) // 2: -8], labelled[-8:]
    listed_valid = np.append(valid, np.nonzero(unlabelled)[0][0])
    _put(root, "raw/edge.csv.gz", _csv(edges))
    _put(root, "raw/node-feat.csv.gz", _csv(x, "{!r}"))
    _put(root, "raw/node-label.csv.gz", _csv(y, "{:.0f}"))
    _put(root, "raw/num-node-list.csv.gz", f"{N}\n")
    _put(root, "raw/num-edge-list.csv.gz", f"{len(edges)}\n")
    for name, idx in (("train", train), ("valid", listed_valid), ("test", test)):
        _put(root, f"split/time/{name}.csv.gz", _csv(idx))
    return root, {"edges": edges, "x": x, "y": y, "train": train, "valid": valid, "test": test}


def proteins_like(tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """An undirected ogbn-proteins-style dataset: no vertex features, 4 binary tasks, 3-wide edge features."""
    rng = np.random.default_rng(1)
    root = tmp / "ogbn_proteins"
    n, tasks = 40, 4
    edges = rng.integers(0, n, size=(90, 2))
    edge_feat = rng.random((90, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=(n, tasks))
    _put(root, "raw/edge.csv.gz", _csv(edges))
    _put(root, "raw/edge-feat.csv.gz", _csv(edge_feat, "{!r}"))
    _put(root, "raw/node-label.csv.gz", _csv(y))
    _put(root, "raw/num-node-list.csv.gz", f"{n}\n")
    _put(root, "raw/num-edge-list.csv.gz", "90\n")
    _put(root, "raw/node_species.csv.gz", "".join(f"{3702 + i % 2}\n" for i in range(n)))  # OGB's extra file
    for name, idx in (("train", np.arange(0, 20)), ("valid", np.arange(20, 30)), ("test", np.arange(30, 40))):
        _put(root, f"split/species/{name}.csv.gz", _csv(idx))
    return root, {"edges": edges, "edge_feat": edge_feat, "y": y, "n": np.array(n)}


def test_nan_labels_are_unlabelled_and_in_no_mask(tmp_path) -> None:
    root, a = papers_like(tmp_path)
    g = load_graph(str(root), cache_dir=tmp_path / "cache")
    assert g.name == "ogbn-tiny-papers" and g.num_nodes == N and not g.multi_label
    assert np.array_equal(np.stack([g.src, g.dst]), a["edges"].T)  # a directed dataset: edges as given
    assert torch.equal(g.x, torch.from_numpy(a["x"]))
    missing = np.isnan(a["y"])
    assert np.array_equal(g.y.numpy(), np.where(missing, UNLABELLED, a["y"]).astype(np.int64))
    assert g.num_classes == C
    for mask, idx in ((g.train_mask, a["train"]), (g.val_mask, a["valid"]), (g.test_mask, a["test"])):
        assert np.array_equal(np.nonzero(mask.numpy())[0], np.sort(idx))
        assert not (mask.numpy() & missing).any()
    assert g.edge_data == {} and g.stand_ins == {}
    again = load_graph(str(root), cache_dir=tmp_path / "cache")  # from the cache: the same graph
    assert torch.equal(again.y, g.y) and torch.equal(again.val_mask, g.val_mask)


def test_multi_label_edge_features_and_reverse_edges(tmp_path) -> None:
    root, a = proteins_like(tmp_path)
    g = load_graph(str(root), cache_dir=tmp_path / "cache")
    n = int(a["n"])
    assert g.num_nodes == n and g.multi_label and g.num_classes == 4
    assert g.y.dtype == torch.float32 and np.array_equal(g.y.numpy(), a["y"])
    # OGB's add_inverse_edge for ogbn-proteins: each edge followed by its reverse, the features repeated
    want = np.repeat(a["edges"].T, 2, axis=1)
    want[0, 1::2], want[1, 1::2] = a["edges"][:, 1], a["edges"][:, 0]
    assert np.array_equal(np.stack([g.src, g.dst]), want)
    assert np.array_equal(g.edge_data["attr"].numpy(), np.repeat(a["edge_feat"], 2, axis=0))
    assert g.x.shape == (n, 1) and "x" in g.stand_ins  # no node-feat: one constant feature stands in
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [20, 10, 10]
    again = load_graph(str(root), cache_dir=tmp_path / "cache")
    assert torch.equal(again.y, g.y) and torch.equal(again.edge_data["attr"], g.edge_data["attr"])


def test_nan_labels_from_any_loader_leave_the_made_up_split_too() -> None:
    """PyG's ogbn-papers100M holds y as float [N, 1] with NaN: a dict of arrays (or a Data) like it loads, and
    the seeded split that stands in for missing masks leaves the unlabelled vertices out as well."""
    n = 50
    y = np.where(np.arange(n) % 3 == 0, np.nan, np.arange(n) % 4).astype(np.float32)[:, None]
    g = gnnc.load_graph({"edge_index": np.stack([np.arange(n), (np.arange(n) + 1) % n]),
                         "x": np.ones((n, 2), np.float32), "y": y})
    unlabelled = np.isnan(y[:, 0])
    assert np.array_equal(g.y.numpy() == UNLABELLED, unlabelled) and "split" in g.stand_ins
    for mask in (g.train_mask, g.val_mask, g.test_mask):
        assert not (mask.numpy() & unlabelled).any()
    assert int((g.train_mask | g.val_mask | g.test_mask).sum()) == int((~unlabelled).sum())


def test_binary_form_of_papers100m(tmp_path) -> None:
    root = tmp_path / "ogbn_papers100M"
    (root / "raw").mkdir(parents=True)
    ei = np.array([[0, 1, 2], [1, 2, 0]])
    np.savez(root / "raw" / "data.npz", edge_index=ei, node_feat=np.eye(3, dtype=np.float32),
             num_nodes_list=np.array([3]), num_edges_list=np.array([3]))
    np.savez(root / "raw" / "node-label.npz", node_label=np.array([[1.0], [np.nan], [0.0]]))
    g = load_graph(str(root), use_cache=False)
    assert np.array_equal(np.stack([g.src, g.dst]), ei) and g.y.tolist() == [1, UNLABELLED, 0]
    assert not g.train_mask[1] and not g.val_mask[1] and not g.test_mask[1]


def test_heterogeneous_dataset_refused_naming_what_is_missing(tmp_path) -> None:
    root = tmp_path / "ogbn_mag"
    _put(root, "raw/node-feat/paper/node-feat.csv.gz", "0.5\n")
    _put(root, "raw/relations/author___writes___paper/edge.csv.gz", "0,0\n")
    _put(root, "raw/num-node-dict.csv.gz", "author,paper\n1,1\n")
    with pytest.raises(GraphInputError, match="heterogeneous.*raw/edge.csv.gz.*missing"):
        load_graph(str(root), use_cache=False)


@pytest.mark.parametrize("rel, text, message", [
    ("raw/node-label.csv.gz", "0\ninf\n", r"y: expected integer class labels .*inf at row 1"),
    ("raw/edge.csv.gz", "0,1\n1,x\n", "edge.csv.gz:2: edge_index: column 2 holds 'x', not a number"),
    ("raw/edge.csv.gz", "0,1\n1,\n", "edge.csv.gz:2: edge_index: an empty field"),
    ("raw/edge.csv.gz", "0,1\n1,7\n", "edge_index: vertex id 7"),
    ("split/s/train.csv.gz", "5\n", "train_mask: vertex id 5 is out of range"),
    ("raw/node-label.csv.gz", "0,1\n1,inf\n", "targets must be finite numbers or NaN"),
])
def test_bad_files_name_the_field(tmp_path, rel, text, message) -> None:
    root = tmp_path / "ogbn_small"
    files = {"raw/edge.csv.gz": "0,1\n1,0\n", "raw/node-feat.csv.gz": "1.0\n2.0\n", "raw/node-label.csv.gz": "0\n1\n",
             "split/s/train.csv.gz": "0\n", "split/s/valid.csv.gz": "1\n", "split/s/test.csv.gz": ""}
    for name, body in {**files, rel: text}.items():
        _put(root, name, body)
    with pytest.raises(GraphInputError, match=message):
        load_graph(str(root), use_cache=False)


def test_nan_labelled_graph_trains_and_multi_label_is_refused_at_run(tmp_path, monkeypatch, capsys) -> None:
    """`gnnc run` (its main, in this process: a fresh interpreter costs more than the run) trains on a
    NaN-labelled graph; a multi-label one loads but its run is refused, exit 2, naming it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root, _ = papers_like(tmp_path)
    assert main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", str(root), "--epochs", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert np.isfinite(summary["train_loss"]) and 0.0 <= summary["test_acc"] <= 1.0
    proteins, _ = proteins_like(tmp_path)
    assert main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", str(proteins), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "multi-label" in err and "Traceback" not in err
