"""Inputs that lack something are honest about it (issue 21, items 6, 7 and 12).

An edge list has no labels: it can be partitioned and compiled, but a run
refuses it naming what is missing (it used to train on all-zero labels and
report test accuracy 1.0). A split gnnc makes up is stated on stderr and
seedable (`,split_seed=N`). Planetoid features are row-normalised by default
and `,normalize=false` keeps them raw. Edge-list errors name the file's line.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnc
from conftest import EXAMPLES
from gnnc import cli
from gnnc.errors import GraphInputError
from gnnc.graph.loaders import load_graph

RING = "# a ring of 6 vertices, both directions\n" + "".join(f"{i} {(i + 1) % 6}\n{(i + 1) % 6} {i}\n"
                                                             for i in range(6))


def gnnc_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`gnnc ARGS` in this process (a subprocess would spend seconds importing torch): exit code, stdout, stderr."""
    capsys.readouterr()
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _no_masks_npz(tmp_path: Path, n: int = 50) -> Path:
    ring = np.stack([np.arange(n), (np.arange(n) + 1) % n])
    path = tmp_path / "nomasks.npz"
    rs = np.random.RandomState(0)
    np.savez(path, edge_index=np.concatenate([ring, ring[::-1]], 1), x=rs.rand(n, 4).astype(np.float32),
             y=np.arange(n) % 3)
    return path


# --- item 6: an edge list is not trained on -------------------------------------------------------


def test_edge_list_records_what_it_lacks(tmp_path) -> None:
    path = tmp_path / "ring.txt"
    path.write_text(RING)
    g = load_graph(str(path), use_cache=False)
    assert set(g.stand_ins) == {"x", "y", "split"}
    assert g.x.shape == (6, 1) and int(g.y.max()) == 0  # the stand-ins themselves are as before


def test_run_on_an_edge_list_exits_2_naming_the_missing_labels(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the graph cache goes here
    path = tmp_path / "ring.txt"
    path.write_text(RING)
    code, out, err = gnnc_cli(capsys, "run", str(EXAMPLES / "gcn.gnn"), "--graph", str(path), "--epochs", "2")
    assert code == 2, out + err
    assert "cannot be trained: it has no labels (y) and no features (x)" in err
    assert "Traceback" not in err and "test acc" not in out
    # ... but it partitions and compiles, for one worker and for two (the plan records what the graph lacks)
    plan = tmp_path / "plan"
    assert gnnc_cli(capsys, "compile", str(EXAMPLES / "gcn.gnn"), "--graph", str(path), "--workers", "2",
                    "-o", str(plan))[0] == 0
    assert "y" in json.loads((plan / "plan.json").read_text())["graph_stand_ins"]
    code, _, err = gnnc_cli(capsys, "run", str(plan), "--nproc", "2", "--epochs", "2")  # from the saved shards
    assert code == 2 and "cannot be trained: it has no labels (y)" in err, err
    assert gnnc_cli(capsys, "partition", "--graph", str(path), "--parts", "2", "--method", "hash", "-o",
                    str(tmp_path / "parts"), "--no-progress")[0] == 0


def test_the_api_refuses_to_train_without_labels(tmp_path) -> None:
    path = tmp_path / "ring.txt"
    path.write_text(RING)
    graph = gnnc.load_graph(str(path))
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph)  # compiling is fine
    with pytest.raises(GraphInputError, match=r"no labels \(y\)"):
        gnnc.run(plan, graph, epochs=1)
    with pytest.raises(GraphInputError, match=r"no labels \(y\)"):  # several workers: refused before any starts
        gnnc.run(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, nproc=2, strategy="depcomm", epochs=1)


def test_a_made_up_split_is_stated_and_seedable(tmp_path, capsys) -> None:
    path = _no_masks_npz(tmp_path)
    model = gnnc.load_model(EXAMPLES / "gcn.gnn")
    default = gnnc.load_graph(str(path))
    gnnc.run(model, default, epochs=1)
    err = capsys.readouterr().err
    assert "no train/val/test masks; a random 60/20/20 split stands in (seed 0" in err and "split_seed=N" in err
    seeded = gnnc.load_graph(f"{path},split_seed=7")
    again = gnnc.load_graph(f"{path},split_seed=7")
    assert torch.equal(seeded.train_mask, again.train_mask)
    assert not torch.equal(seeded.train_mask, default.train_mask)
    assert [int(m.sum()) for m in (seeded.train_mask, seeded.val_mask, seeded.test_mask)] == [30, 10, 10]
    assert "(seed 7;" in seeded.stand_ins["split"]
    code, _, err = gnnc_cli(capsys, "run", str(EXAMPLES / "gcn.gnn"), "--graph", f"{path},split_seed=7",
                            "--epochs", "1", "--json")
    assert code == 0 and "split stands in (seed 7;" in err, err


def test_split_seed_is_refused_where_it_cannot_apply(tmp_path) -> None:
    own = tmp_path / "own.npz"
    masks = {k: np.arange(4) % 3 == i for i, k in enumerate(("train_mask", "val_mask", "test_mask"))}
    np.savez(own, edge_index=np.array([[0, 1, 2, 3], [1, 2, 3, 0]]), x=np.ones((4, 2), np.float32),
             y=np.array([0, 1, 0, 1]), **masks)
    with pytest.raises(GraphInputError, match="has its own"):
        load_graph(f"{own},split_seed=1", use_cache=False)
    with pytest.raises(GraphInputError, match="unknown option 'seed'"):
        load_graph(f"{own},seed=1", use_cache=False)
    with pytest.raises(GraphInputError, match="split_seed=x: expected a non-negative integer"):
        load_graph(f"{_no_masks_npz(tmp_path)},split_seed=x", use_cache=False)


def test_stand_ins_survive_the_cache(tmp_path) -> None:
    path = tmp_path / "ring.txt"
    path.write_text(RING)
    first = load_graph(str(path), cache_dir=tmp_path / "cache")
    cached = load_graph(str(path), cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("graph-*.npz"))) == 1
    assert cached.stand_ins == first.stand_ins and "y" in cached.stand_ins


# --- item 7: planetoid's feature normalisation is a choice ----------------------------------------


def test_planetoid_normalisation_is_stated_and_optional(capsys) -> None:
    normalised = load_graph("planetoid:cora")
    raw = load_graph("planetoid:cora,normalize=false")
    rows = raw.x.sum(1)
    assert set(raw.x.unique().tolist()) == {0.0, 1.0} and float(rows.max()) > 1  # bag of words as stored
    assert torch.allclose(normalised.x, raw.x / rows.clamp(min=1).unsqueeze(1))
    assert torch.equal(load_graph("planetoid:cora,normalize=true").x, normalised.x)  # the default
    assert torch.equal(raw.y, normalised.y) and np.array_equal(raw.src, normalised.src)
    with pytest.raises(GraphInputError, match="normalize=maybe: expected true or false"):
        load_graph("planetoid:cora,normalize=maybe")
    with pytest.raises(GraphInputError, match="unknown option 'split_seed'"):
        load_graph("planetoid:cora,split_seed=1")
    listed = gnnc_cli(capsys, "datasets")[1]
    assert "row-normalised" in listed and "normalize=false" in listed and "split_seed=N" in listed


# --- item 12: edge-list errors name the line, counted from 1 --------------------------------------


@pytest.mark.parametrize("text, where, message", [
    ("# header\n0 1\n1 x\n", 3, "'x' is not an integer vertex id"),
    ("0 1\n% comment\n\n-2 1\n", 4, "negative vertex id -2"),
    ("0 1\n2\n", 2, "expected 'src dst', got '2'"),
])
def test_edge_list_errors_name_the_line(text, where, message, tmp_path) -> None:
    path = tmp_path / "bad.edges"
    path.write_text(text)
    with pytest.raises(GraphInputError) as err:
        load_graph(str(path), use_cache=False)
    assert str(err.value) == f"{path}:{where}: edge list: {message}"
