"""A graph store's manifest records x's nonzero values; the cost model's input density reads them (issue 34).

Every compile counted the features' nonzeros (torch.count_nonzero over all of x: 245M floats at ogbn-products'
size, 2.1 s with x's pages cold, ~0.3 s warm) for one number the store can hold: `gnnc convert` counts as it
writes x (gnnc.graph.store, `COUNTED`), the full check of an open counts again (a wrong count is refused like a
wrong checksum), and `x_nonzeros` hands it to `input_density` while x is the store's unchanged array. These
tests check that the density is the same either way, that a compile's inputs then do not read x, that a store
written without the count (before) still works, and that a wrong or malformed count is refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
from gnnc import api
from gnnc.cluster import preset
from gnnc.errors import GraphInputError
from gnnc.graph import Graph, input_density, store
from gnnc.graph.generators import rmat


def _sparse_features(n: int = 500, seed: int = 0) -> Graph:
    """An R-MAT graph whose features are ~2% nonzero (a bag of words: priced sparse), with a -0.0 and a NaN (a
    zero and a nonzero to torch.count_nonzero and numpy alike)."""
    g = rmat(n, 5.0, seed=seed)
    rng = np.random.default_rng(seed)
    x = np.where(rng.random((n, 64)) < 0.02, rng.standard_normal((n, 64)), 0.0).astype(np.float32)
    x[0, 0], x[1, 1] = -0.0, np.nan
    return Graph(n, g.src, g.dst, torch.from_numpy(x), g.y, g.train_mask, g.val_mask, g.test_mask, name="bow")


def _manifest(root: Path) -> dict:
    return json.loads((root / store.MANIFEST).read_text())


def _rewrite(root: Path, change) -> None:
    manifest = _manifest(root)
    change(manifest["arrays"]["x"])
    (root / store.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def test_the_manifest_records_x_nonzeros(tmp_path: Path) -> None:
    """write_store counts x's nonzeros into its entry, as torch counts them; no other array gets a count."""
    g = _sparse_features()
    store.write_store(g, tmp_path / "s")
    arrays = _manifest(tmp_path / "s")["arrays"]
    assert arrays["x"]["nonzeros"] == int(torch.count_nonzero(g.x))
    assert [name for name, entry in arrays.items() if "nonzeros" in entry] == ["x"]
    opened = store.open_store(tmp_path / "s")
    assert store.x_nonzeros(opened) == int(torch.count_nonzero(g.x))
    assert input_density(opened.x, store.x_nonzeros(opened)) == input_density(g.x) < 0.05
    assert store.x_nonzeros(g) is None  # a graph held in memory: counted


def test_planning_inputs_of_a_store_do_not_count_x(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The statistics pass's inputs on a store: the same density (and cost inputs) as counting x gave, without
    reading x (the count refused here); a store written before, without the count, still counts."""
    from gnnc.passes.cost.inputs import planning_inputs

    g = _sparse_features(seed=1)
    store.write_store(g, tmp_path / "s")
    opened = store.open_store(tmp_path / "s")
    program = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), g, workers=2).program
    parts = np.arange(g.num_nodes) % 2
    _, want, want_shapes = planning_inputs(program, g, parts, preset("g3"), 2)
    assert want.input_density < 0.05

    def refuse(*args, **kwargs):
        raise AssertionError("x counted")

    monkeypatch.setattr(torch, "count_nonzero", refuse)
    _, got, shapes = planning_inputs(program, opened, parts, preset("g3"), 2)
    assert got.input_density == want.input_density and shapes == want_shapes
    assert got.table.keys() == want.table.keys()
    assert all(np.array_equal(np.asarray(got.table[k]), np.asarray(want.table[k])) for k in want.table)
    monkeypatch.undo()

    _rewrite(tmp_path / "s", lambda entry: entry.pop("nonzeros"))  # as a store written before this count
    older = store.open_store(tmp_path / "s")
    assert store.x_nonzeros(older) is None
    assert planning_inputs(program, older, parts, preset("g3"), 2)[1].input_density == want.input_density


def test_features_replaced_are_counted(tmp_path: Path) -> None:
    """Where graph.x is no longer the store's array, the manifest's count is not used."""
    store.write_store(_sparse_features(seed=2), tmp_path / "s")
    opened = store.open_store(tmp_path / "s")
    opened.x = torch.ones_like(opened.x)
    assert store.x_nonzeros(opened) is None


@pytest.mark.parametrize("value,match", [(7, "nonzero values, the manifest says 7"),
                                         (10**9, "its nonzero values, at most its size"),
                                         (-1, "its nonzero values"), (True, "its nonzero values"),
                                         ("12", "its nonzero values")])
def test_a_wrong_count_is_refused(tmp_path: Path, value, match: str) -> None:
    """A count that is not x's (checked where the store is checked) or not a count at all: GraphInputError."""
    store.write_store(_sparse_features(seed=3), tmp_path / "s")
    _rewrite(tmp_path / "s", lambda entry: entry.update(nonzeros=value))
    with pytest.raises(GraphInputError, match=match):
        store.open_store(tmp_path / "s")


def test_only_x_may_carry_a_count(tmp_path: Path) -> None:
    store.write_store(_sparse_features(seed=4), tmp_path / "s")
    manifest = _manifest(tmp_path / "s")
    manifest["arrays"]["y"]["nonzeros"] = 3
    (tmp_path / "s" / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(GraphInputError, match="the entry of 'y'"):
        store.open_store(tmp_path / "s")
