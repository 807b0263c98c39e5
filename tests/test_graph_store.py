"""The memory-mapped graph store (`gnnc convert SRC DIR`, `--graph DIR`; issue 34): the same graph and the
same logits as the source, every array mapped read-only, and a damaged store refused naming its file."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
from gnnc.cli import main
from gnnc.graph.loaders import load_graph
from gnnc.graph.store import MANIFEST, open_store, release_pages, write_store
from gnnc.plan.shard_files import read_shard, write_shards
from test_ogb import papers_like, proteins_like


@pytest.fixture(scope="module")
def cora_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("store") / "cora"
    assert main(["convert", "planetoid:cora", str(out)]) == 0
    return out


def _mapped_file(address: int) -> str | None:
    """The file mapped at `address` in this process (/proc/self/maps), None for anonymous memory."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(v, 16) for v in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5] if len(fields) == 6 else None
    return None


def test_store_holds_the_graph_mapped(cora_store) -> None:
    g, s = load_graph("planetoid:cora"), load_graph(str(cora_store))
    assert (s.name, s.num_nodes, s.num_edges, s.stand_ins) == (g.name, g.num_nodes, g.num_edges, g.stand_ins)
    assert np.array_equal(s.src, g.src) and np.array_equal(s.dst, g.dst)
    for field in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(s, field), getattr(g, field)), field
    for field, file in (("x", "x.npy"), ("y", "y.npy"), ("train_mask", "train_mask.npy")):
        assert _mapped_file(getattr(s, field).data_ptr()) == str(cora_store / file), field  # no copy in memory
    a, b = s.csr("plain"), g.csr("plain")  # the stored CSR (both directions) is the one Graph.csr builds
    for t_s, t_g in ((a, b), (a.transpose(), b.transpose())):
        assert all(torch.equal(u, v) for u, v in ((t_s.indptr, t_g.indptr), (t_s.indices, t_g.indices),
                                                  (t_s.eids, t_g.eids)))
    assert torch.equal(a.transpose()._cache["perm_from"], b.transpose()._cache["perm_from"])


def _resident_kib(path: Path) -> int:
    """KiB of `path`'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.endswith(" " + str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_shard_writing_lets_each_parts_rows_go(cora_store, tmp_path) -> None:
    """Shards are written part by part from the mapped x, and the pages a part read are let go after it: the
    process does not end up holding the whole feature matrix."""
    g = open_store(cora_store)
    assert float(g.x.sum()) > 0 and _resident_kib(cora_store / "x.npy") > 10_000  # all 15 MB of x read
    release_pages(g)
    assert _resident_kib(cora_store / "x.npy") == 0
    parts = np.arange(g.num_nodes) % 3
    write_shards(g, parts, 3, tmp_path / "parts")
    assert _resident_kib(cora_store / "x.npy") == 0
    shards = [read_shard(tmp_path / "parts", i) for i in range(3)]
    assert all(np.array_equal(sh.x, g.x.numpy()[sh.global_ids]) for sh in shards)


def test_run_from_the_store_gives_the_same_logits(cora_store, tmp_path) -> None:
    logits = {}
    for name, spec in (("source", "planetoid:cora"), ("store", str(cora_store))):
        path = tmp_path / f"{name}.pt"
        assert main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", spec, "--epochs", "3", "--seed", "1",
                     "--dump-logits", str(path)]) == 0
        logits[name] = torch.load(path)
    assert torch.equal(logits["source"], logits["store"])


@pytest.mark.slow
def test_two_ranks_from_the_store_give_the_same_logits(cora_store, tmp_path) -> None:
    logits = {}
    for name, spec in (("source", "planetoid:cora"), ("store", str(cora_store))):
        path = tmp_path / f"{name}.pt"
        assert main(["run", str(EXAMPLES / "sage.gnn"), "--graph", spec, "--epochs", "2", "--nproc", "2",
                     "--dump-logits", str(path)]) == 0
        logits[name] = torch.load(path)
    assert torch.equal(logits["source"], logits["store"])


def test_unlabelled_multi_label_and_edge_data_survive(tmp_path) -> None:
    for make in (papers_like, proteins_like):
        root, _ = make(tmp_path)
        g = load_graph(str(root), use_cache=False)
        write_store(g, tmp_path / f"{root.name}-store")
        s = open_store(tmp_path / f"{root.name}-store")
        assert torch.equal(s.y.nan_to_num(-7), g.y.nan_to_num(-7)) and s.multi_label == g.multi_label
        assert torch.equal(s.train_mask, g.train_mask) and s.edge_data.keys() == g.edge_data.keys()
        assert all(torch.equal(s.edge_data[k], v) for k, v in g.edge_data.items())
        assert s.stand_ins == g.stand_ins


def _damage(store: Path, how: str) -> str:
    """Damage a copy of a store; the file the error must name."""
    manifest = json.loads((store / MANIFEST).read_text())
    if how == "checksum":
        data = bytearray((store / "x.npy").read_bytes())
        data[-1] ^= 0xFF
        (store / "x.npy").write_bytes(bytes(data))
        return "x.npy"
    if how == "missing":
        (store / "train_mask.npy").unlink()
        return "train_mask.npy"
    if how == "header":  # the file holds another shape than the manifest says (size and checksum made to match)
        y = np.load(store / "y.npy")
        np.save(store / "y.npy", np.zeros((len(y) // 2, 2), np.int64))
    if how == "shape":  # file and manifest agree, but y has fewer rows than the graph has vertices
        y = np.load(store / "y.npy")
        np.save(store / "y.npy", y[:-1])
        manifest["arrays"]["y"]["shape"] = [len(y) - 1]
    if how in ("header", "shape"):
        raw = (store / "y.npy").read_bytes()
        manifest["arrays"]["y"].update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        (store / MANIFEST).write_text(json.dumps(manifest))
        return "y.npy"
    if how == "path":  # a manifest naming a file outside the store
        manifest["arrays"]["x"]["file"] = "../x.npy"
        (store / MANIFEST).write_text(json.dumps(manifest))
        return MANIFEST
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["checksum", "missing", "header", "shape", "path"])
def test_damaged_store_exits_2_naming_the_file(cora_store, tmp_path, how, capsys) -> None:
    store = tmp_path / "copy"
    store.mkdir()
    for f in cora_store.iterdir():
        (store / f.name).write_bytes(f.read_bytes())
    name = _damage(store, how)
    assert main(["compile", str(EXAMPLES / "gcn.gnn"), "--graph", str(store)]) == 2
    err = capsys.readouterr().err
    assert f"{store / name}" in err and "Traceback" not in err, err


def test_convert_refuses_a_directory_of_other_files(tmp_path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["convert", "planetoid:cora", str(tmp_path)]) == 2
    assert "other files" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("")
    assert main(["convert", "planetoid:cora", str(tmp_path / "file" / "store")]) == 2  # an OSError: named, no traceback
    assert "cannot write the graph store" in capsys.readouterr().err
