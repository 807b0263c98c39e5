"""`gnnc convert` of an OGB directory in blocks (issue 34: papers100M/10's convert peaked, projected, at 12.6 GiB
for an 8 GiB limit: its features and edge list were read whole and the CSRs built by sorts holding three int64
arrays per edge). The streamed store must be the in-memory one, array for array: each case converts a generated
directory with blocks far smaller than it (many blocks per array) and compares every array's checksum with
`write_store(load_graph(DIR))`, and the CSRs with the ones CSR.from_edges builds by sorting."""
from __future__ import annotations

import json
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnc.cli import main
from gnnc.errors import GraphInputError
from gnnc.graph import ogb, store
from gnnc.graph.loaders import load_graph
from gnnc.graph.storage import CSR
from gnnc.graph.ogb_store import write_ogb_store
from gnnc.graph.store import MANIFEST, open_store, write_store
from test_ogb import _csv, _put, papers_like, proteins_like


@pytest.fixture
def small_blocks(monkeypatch) -> None:
    """Blocks of a few hundred values: every array of the cases below spans many of them."""
    monkeypatch.setattr(store, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(store, "EDGE_BLOCK", 300)
    monkeypatch.setattr(ogb, "NPZ_BLOCK_BYTES", 1000)
    monkeypatch.setattr(ogb, "CSV_BLOCK_BYTES", 1 << 10)


def _binary(tmp: Path, name: str, fortran: bool, compressed: bool, edge_feat: bool) -> Path:
    """papers100M's binary form: data.npz (stored or compressed, edge_index and node_feat in C or Fortran order,
    as OGB's `.T` leaves one) and node-label.npz, duplicate edges and self-loops included."""
    rng = np.random.default_rng(7)
    n, e = 300, 5000
    root = tmp / name
    (root / "raw").mkdir(parents=True)
    pairs = rng.integers(0, n, size=(e, 2))
    pairs[:50] = pairs[50:100]  # duplicates
    pairs[100:120, 1] = pairs[100:120, 0]  # self-loops
    edge_index = pairs.T if fortran else np.ascontiguousarray(pairs.T)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    arrays = {"edge_index": edge_index, "node_feat": np.asfortranarray(x) if fortran else x,
              "num_nodes_list": np.array([n]), "num_edges_list": np.array([e])}
    if edge_feat:
        arrays["edge_feat"] = rng.random(e).astype(np.float32)  # 1-D: one column
    (np.savez_compressed if compressed else np.savez)(root / "raw" / "data.npz", **arrays)
    y = rng.integers(0, 4, size=(n, 1)).astype(np.float64)
    y[rng.random(n) < 0.7] = np.nan
    np.savez(root / "raw" / "node-label.npz", node_label=y)
    return root


def _no_split_no_counts(tmp: Path) -> Path:
    """CSVs without the count files or a split: N from the labels, a made-up split."""
    rng = np.random.default_rng(3)
    root = tmp / "ogbn_bare"
    n = 90
    _put(root, "raw/edge.csv.gz", _csv(rng.integers(0, n, size=(700, 2))))
    _put(root, "raw/node-feat.csv.gz", _csv(rng.integers(0, 2, size=(n, 3)).astype(np.float64), "{!r}"))
    _put(root, "raw/node-label.csv.gz", _csv(rng.integers(0, 3, size=n)))
    return root


CASES = {
    "papers csv": lambda tmp: papers_like(tmp)[0],
    "proteins csv (reverse edges, edge features, no x, multi-label)": lambda tmp: proteins_like(tmp)[0],
    "binary stored, C order": lambda tmp: _binary(tmp, "ogbn_b1", False, False, False),
    "binary compressed, Fortran order, edge features": lambda tmp: _binary(tmp, "ogbn_b2", True, True, True),
    "no split, no counts": _no_split_no_counts,
}


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_store_is_the_in_memory_one(tmp_path, small_blocks, case) -> None:
    root = CASES[case](tmp_path)
    streamed = write_ogb_store(root, tmp_path / "streamed")
    graph = load_graph(str(root), use_cache=False)
    reference = write_store(graph, tmp_path / "reference")
    assert streamed == reference  # every array's dtype, shape, size and sha256; the name, counts, stand-ins
    assert json.loads((tmp_path / "streamed" / MANIFEST).read_text()) == reference
    # the CSRs against the sorting construction, independent of the counting sort both stores used
    s = open_store(tmp_path / "streamed")
    want = CSR.from_edges(graph.src, graph.dst, graph.num_nodes)
    got = s.csr("plain")
    for a, b in ((got, want), (got.transpose(), want.transpose())):
        assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices) and torch.equal(a.eids, b.eids)
    assert torch.equal(got.transpose()._cache["perm_from"], want.transpose()._cache["perm_from"])
    assert torch.equal(s.x, graph.x) and torch.equal(s.y.nan_to_num(-7), graph.y.nan_to_num(-7))


@pytest.mark.parametrize("bad, message", [
    ("x", r"x: holds NaN at row 7, column 1 \(2 non-finite values\)"),
    ("id", r"edge_index: vertex id 99 at \[1, 1\] is out of range"),
    ("rows", r"x: node-feat has 119 rows but num-node-list says 120"),
])
def test_bad_blocks_are_refused_and_leave_no_files(tmp_path, small_blocks, bad, message, capsys) -> None:
    root, a = papers_like(tmp_path)
    x = a["x"].copy()
    if bad == "x":
        x[7, 1] = x[60, 0] = np.nan
        _put(root, "raw/node-feat.csv.gz", _csv(x, "{!r}"))
    elif bad == "id":
        edges = a["edges"].copy()
        edges[1, 1] = 99 + 120
        _put(root, "raw/edge.csv.gz", _csv(edges))
        message = message.replace("99", "219")
    else:
        _put(root, "raw/node-feat.csv.gz", _csv(x[:-1], "{!r}"))
    with pytest.raises(GraphInputError, match=message):
        write_ogb_store(root, tmp_path / "store")
    assert not list((tmp_path / "store").iterdir())  # nothing half-written: a second convert is not refused
    assert main(["convert", str(root), str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(root) in err


def test_convert_reads_features_and_edges_in_blocks(tmp_path, monkeypatch) -> None:
    """The defect: convert read data.npz whole (papers100M/10: x 5.7 GB, edge_index 2.6 GB) and sorted with three
    int64 arrays per edge alive. Here x is 64 MB; what convert allocates at its peak (tracemalloc: numpy's arrays)
    must stay under half of it, where reading x whole alone is all of it."""
    monkeypatch.setattr(store, "BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(store, "EDGE_BLOCK", 1 << 16)
    monkeypatch.setattr(ogb, "NPZ_BLOCK_BYTES", 1 << 20)
    rng = np.random.default_rng(0)
    n, f, e = 131072, 128, 200_000
    root = tmp_path / "ogbn_big"
    (root / "raw").mkdir(parents=True)
    x = rng.standard_normal((n, f), dtype=np.float32)
    np.savez(root / "raw" / "data.npz", edge_index=rng.integers(0, n, size=(2, e)), node_feat=x,
             num_nodes_list=np.array([n]), num_edges_list=np.array([e]))
    np.savez(root / "raw" / "node-label.npz", node_label=rng.integers(0, 5, size=(n, 1)).astype(np.float64))
    del x
    tracemalloc.start()
    try:
        assert main(["convert", str(root), str(tmp_path / "store")]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n * f * 4 / 2, f"convert allocated {peak / 2**20:.1f} MiB at its peak"
    s = open_store(tmp_path / "store")
    with zipfile.ZipFile(root / "raw" / "data.npz") as z, z.open("node_feat.npy") as member:
        np.lib.format.read_magic(member)
        np.lib.format.read_array_header_1_0(member)
        assert member.read() == s.x.numpy().tobytes()


def test_empty_count_list_in_data_npz_is_refused_by_name(tmp_path, capsys) -> None:
    root = tmp_path / "ogbn_e"
    (root / "raw").mkdir(parents=True)
    np.savez(root / "raw" / "data.npz", edge_index=np.array([[0, 1], [1, 0]]), node_feat=np.ones((2, 2), np.float32),
             num_nodes_list=np.array([], np.int64))
    np.savez(root / "raw" / "node-label.npz", node_label=np.array([[0.0], [1.0]]))
    assert main(["convert", str(root), str(tmp_path / "store")]) == 2
    assert "num-node-list: lists 0 graphs" in capsys.readouterr().err
