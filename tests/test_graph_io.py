"""Graph inputs: every format loads, every bad input exits 2 naming the field, and the cache works."""
from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnc import cli
from gnnc.errors import GraphInputError
from gnnc.graph import loaders as graph_io
from gnnc.graph.loaders import available_datasets, from_pyg, load_graph

EDGE_INDEX = np.array([[0, 1, 1, 2, 3, 3], [1, 0, 2, 1, 3, 0]])  # includes a self-loop (3, 3)
X = np.arange(12, dtype=np.float32).reshape(4, 3)
Y = np.array([0, 1, 1, 0])
MASKS = {"train_mask": np.array([True, True, False, False]), "val_mask": np.array([False, False, True, False]),
         "test_mask": np.array([False, False, False, True])}


def _npz(tmp_path: Path, name: str = "g.npz", **overrides) -> Path:
    arrays = {"edge_index": EDGE_INDEX, "x": X, "y": Y, **MASKS, **overrides}
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def test_npz_loads_as_given(tmp_path) -> None:
    g = load_graph(str(_npz(tmp_path)), use_cache=False)
    assert g.num_nodes == 4 and g.num_edges == 6
    assert np.array_equal(np.stack([g.src, g.dst]), EDGE_INDEX)  # self-loop kept, order kept
    assert torch.equal(g.x, torch.from_numpy(X)) and torch.equal(g.y, torch.from_numpy(Y))
    assert torch.equal(g.train_mask, torch.from_numpy(MASKS["train_mask"]))
    s, d = g.edges("self_loops")  # the self_loops view drops the given loop and adds one per vertex
    assert sorted(zip(s.tolist(), d.tolist())).count((3, 3)) == 1


def test_npz_without_masks_gets_seeded_split(tmp_path) -> None:
    n = 50
    ei = np.stack([np.arange(n), (np.arange(n) + 1) % n])
    path = _npz(tmp_path, edge_index=ei, x=np.ones((n, 2), np.float32), y=np.zeros(n, np.int64),
                train_mask=None, val_mask=None, test_mask=None)
    a = load_graph(str(path), use_cache=False)
    b = load_graph(str(path), use_cache=False)
    assert torch.equal(a.train_mask, b.train_mask)
    assert [int(m.sum()) for m in (a.train_mask, a.val_mask, a.test_mask)] == [30, 10, 10]
    assert torch.all(a.train_mask.int() + a.val_mask.int() + a.test_mask.int() == 1)


BAD = [
    ("index out of range", dict(edge_index=np.array([[0, 4], [1, 0]])), "edge_index: vertex id 4"),
    ("negative id", dict(edge_index=np.array([[0, -1], [1, 0]])), "edge_index: negative vertex id -1"),
    ("NaN feature", dict(x=np.where(X == 5, np.nan, X)), "x: holds NaN at row 1, column 2"),
    ("inf feature", dict(x=np.where(X == 7, np.inf, X)), "x: holds inf at row 2, column 1"),
    ("label/feature rows", dict(y=np.array([0, 1, 1])), "y: has 3 rows but x has 4"),
    ("float edge_index", dict(edge_index=EDGE_INDEX.astype(np.float64)), "edge_index: expected an integer dtype"),
    ("edge_index shape", dict(edge_index=EDGE_INDEX.T), "edge_index: expected shape [2, E], got [6, 2]"),
    ("x shape", dict(x=np.zeros(4, np.float32)), "x: expected shape [N, F], got [4]"),
    ("x dtype", dict(x=np.array([["a"]] * 4)), "x: expected a numeric dtype"),
    ("infinite label", dict(y=np.where(Y == 1, np.inf, Y.astype(np.float32))), "y: expected integer class labels"),
    ("infinite target", dict(y=np.where(Y == 1, np.inf, Y.astype(np.float32) + 0.5)), "y: targets must be finite"),
    ("negative label", dict(y=np.array([0, -1, 1, 0])), "y: holds negative label -1"),
    ("mask shape", dict(train_mask=np.array([True, False])), "train_mask: expected shape [4]"),
    ("mask dtype", dict(val_mask=np.array([0.5, 0, 0, 1])), "val_mask: expected booleans"),
    ("some masks", dict(test_mask=None), "test_mask: missing"),
    ("no vertices", dict(x=np.zeros((0, 3), np.float32), y=np.zeros(0, np.int64)), "empty graph: x has 0 rows"),
    ("no edges", dict(edge_index=np.zeros((2, 0), np.int64)), "empty graph: edge_index has no edges"),
    ("no x", dict(x=None), "x: missing"),
]


@pytest.mark.parametrize("case, overrides, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_naming_the_field(case, overrides, message, tmp_path, capsys) -> None:
    path = _npz(tmp_path, **overrides)
    with pytest.raises(GraphInputError, match=None) as err:
        load_graph(str(path), use_cache=False)
    assert message in str(err.value)
    code = cli.main(["partition", "--graph", str(path), "--parts", "2", "--method", "hash",
                     "-o", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()  # nothing written for a bad graph


def test_npz_refuses_pickled_objects(tmp_path) -> None:
    path = tmp_path / "obj.npz"
    np.savez(path, edge_index=EDGE_INDEX, x=X, y=np.array([object()] * 4, dtype=object))
    with pytest.raises(GraphInputError, match="needs pickle"):
        load_graph(str(path), use_cache=False)


def test_missing_file_and_unknown_spec() -> None:
    with pytest.raises(GraphInputError, match="no such file or directory"):
        load_graph("/nonexistent/graph.npz")


def test_edge_list_formats(tmp_path) -> None:
    text = "# a SNAP header\n% another comment\n0\t1\n1 2\n2,0\n5 5 0.5\n"
    plain = tmp_path / "g.txt"
    plain.write_text(text)
    zipped = tmp_path / "g.txt.gz"
    zipped.write_bytes(gzip.compress(text.encode()))
    for path in (plain, zipped):
        g = load_graph(str(path), use_cache=False)
        assert g.num_nodes == 6  # the largest id + 1: vertices 3 and 4 are isolated
        assert list(zip(g.src.tolist(), g.dst.tolist())) == [(0, 1), (1, 2), (2, 0), (5, 5)]
        assert g.x.shape == (6, 1) and int(g.y.max()) == 0


@pytest.mark.parametrize("text, message", [("0 1\n1 x\n", "edge list"), ("0 1\n-2 1\n", "negative vertex id -2"),
                                           ("# only a comment\n", "empty graph"), ("0 1\n2\n", "edge list")])
def test_bad_edge_lists(text, message, tmp_path) -> None:
    path = tmp_path / "bad.edges"
    path.write_text(text)
    with pytest.raises(GraphInputError, match=message):
        load_graph(str(path), use_cache=False)


def _ogb(tmp_path: Path, labels: str = "0\n1\n1\n0\n") -> Path:
    root = tmp_path / "ogbn_tiny"
    (root / "raw").mkdir(parents=True)
    (root / "split" / "random").mkdir(parents=True)

    def put(rel: str, text: str) -> None:
        (root / rel).write_bytes(gzip.compress(text.encode()))

    put("raw/edge.csv.gz", "0,1\n1,2\n3,0\n")
    put("raw/node-feat.csv.gz", "".join(",".join(str(v) for v in row) + "\n" for row in X))
    put("raw/node-label.csv.gz", labels)
    put("raw/num-node-list.csv.gz", "4\n")
    put("split/random/train.csv.gz", "0\n1\n")
    put("split/random/valid.csv.gz", "2\n")
    put("split/random/test.csv.gz", "3\n")
    return root


def test_ogb_directory(tmp_path) -> None:
    g = load_graph(str(_ogb(tmp_path)), use_cache=False)
    assert list(zip(g.src.tolist(), g.dst.tolist())) == [(0, 1), (1, 2), (3, 0)]
    assert torch.equal(g.x, torch.from_numpy(X)) and g.y.tolist() == [0, 1, 1, 0]
    assert g.train_mask.tolist() == [True, True, False, False] and g.test_mask.tolist() == [False] * 3 + [True]


def test_ogb_bad_inputs(tmp_path) -> None:
    root = _ogb(tmp_path / "b")
    (root / "raw" / "edge.csv.gz").unlink()
    with pytest.raises(GraphInputError, match="edge.csv"):
        load_graph(str(root), use_cache=False)


def test_pyg_data_saved_with_torch_save(tmp_path) -> None:
    tg = pytest.importorskip("torch_geometric")
    data = tg.data.Data(x=torch.from_numpy(X), edge_index=torch.from_numpy(EDGE_INDEX), y=torch.from_numpy(Y),
                        **{k: torch.from_numpy(v) for k, v in MASKS.items()})
    path = tmp_path / "data.pt"
    torch.save(data, path)
    g = load_graph(str(path), use_cache=False)
    assert np.array_equal(np.stack([g.src, g.dst]), EDGE_INDEX) and torch.equal(g.x, data.x)
    assert torch.equal(g.val_mask, data.val_mask)
    h = from_pyg(data)  # the in-memory path agrees
    assert np.array_equal(h.src, g.src) and torch.equal(h.y, g.y)
    torch.save(data.to_dict(), tmp_path / "dict.pt")  # a plain dict of tensors works too
    assert torch.equal(load_graph(str(tmp_path / "dict.pt"), use_cache=False).x, data.x)


def test_torch_file_that_runs_code_is_refused(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump(Evil(), f, protocol=2)
    with pytest.raises(GraphInputError, match="gnnc can read safely"):
        load_graph(str(path), use_cache=False)


def test_second_load_comes_from_the_cache(tmp_path, monkeypatch) -> None:
    path = _npz(tmp_path)
    cache = tmp_path / "cache"
    first = load_graph(str(path), cache_dir=cache)
    assert len(list(cache.glob("graph-*.npz"))) == 1

    def no_parse(p):
        raise AssertionError("re-parsed although the content did not change")

    monkeypatch.setattr(graph_io, "load_npz", no_parse)
    again = load_graph(str(path), cache_dir=cache)
    assert np.array_equal(again.src, first.src) and torch.equal(again.x, first.x)
    assert torch.equal(again.test_mask, first.test_mask) and again.name == first.name
    # new content, new key: parsed again (here by the patched parser, which says so)
    _npz(tmp_path, y=np.array([1, 1, 1, 0]))
    with pytest.raises(AssertionError, match="re-parsed"):
        load_graph(str(path), cache_dir=cache)


def test_generators_are_cached_and_default_dir_follows_xdg(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert graph_io.default_cache_dir() == tmp_path / "xdg" / "gnnc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.chdir(tmp_path)
    assert graph_io.default_cache_dir() == tmp_path / ".gnnc-cache"
    g = load_graph("rmat:n=500,deg=4,seed=1")
    assert len(list((tmp_path / ".gnnc-cache").glob("graph-*.npz"))) == 1
    h = load_graph("rmat:n=500,deg=4,seed=1")
    assert np.array_equal(g.src, h.src) and h.name == g.name


def test_corrupt_cache_entry_is_rebuilt(tmp_path) -> None:
    path = _npz(tmp_path)
    cache = tmp_path / "cache"
    load_graph(str(path), cache_dir=cache)
    entry = next(cache.glob("graph-*.npz"))
    entry.write_bytes(b"garbage")
    g = load_graph(str(path), cache_dir=cache)
    assert g.num_edges == 6


def test_available_datasets_lists_the_named_graphs() -> None:
    names = [name for name, _ in available_datasets()]
    assert "planetoid:cora" in names and "planetoid:citeseer" in names
    assert any(n.startswith("rmat:") for n in names) and any(n.startswith("sbm:") for n in names)
