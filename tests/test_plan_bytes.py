"""A plan writes each array once (issue 36: write time).

A deep depcache segment's layers share one structure (the prefix of its first layer's in-edges, or all of it
once the hop neighbourhood saturates), and ranks that each hold most of the graph's rows share one features
file: the gcnii example's plan on Cora for 4 workers was 133 MB (each rank's shard held its structure 64 times and
its own copy of 2,491 of the 2,708 feature rows), GCNII x32 on an 89,000-vertex SBM 1.6 GB. A rank loads the
same arrays as the compiler held.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnc
from conftest import EXAMPLES
from gnnc.errors import PlanError
from gnnc.plan import rows, shards
from gnnc.plan.shard_files import pack_arrays, unpack_arrays


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


@pytest.fixture(scope="module")
def gcnii_plan(cora, tmp_path_factory):
    # the example's 64 layers, depcache x64 (the planner's choice too; named here, the search is not under test)
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn"), cora, workers=4, strategy="depcache")
    path = tmp_path_factory.mktemp("gcnii") / "plan"
    plan.save(path)
    return plan, path


def _sizes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}


def test_the_gcnii_example_on_cora_writes_each_array_once(gcnii_plan) -> None:
    plan, path = gcnii_plan
    assert {layer.attr("strategy") for layer in plan.program.graph_layers()} == {"depcache"}
    sizes = _sizes(path)
    x = 2708 * 1433 * 4
    assert x < sizes["shards/features.npy"] < x + 4096  # the features once, not once per rank
    for rank in range(4):  # its structure once (50,548 edges of int32 ids, edge ids and float32 norms), not 64 times
        assert sizes[f"shards/rank-{rank:05d}.npz"] < 400_000, sizes
    assert sum(sizes.values()) < 18_000_000, sizes  # was 133,236,758 bytes


def test_a_rank_loads_the_arrays_the_compiler_built(gcnii_plan, cora) -> None:
    plan, path = gcnii_plan
    specs = rows.layer_specs(plan.program)
    sets = rows.all_row_sets(cora, plan.parts, 4, specs, plan.cached)
    for rank in range(4):
        want = rows.build_local_graph(cora, plan.parts, rank, 4, specs, sets, edge_positions=False)
        got = shards.load_rank(path / "shards", rank, 4)
        assert torch.equal(got.lg.rows, want.rows) and got.lg.n_owned == want.n_owned
        x = got.inputs["x"]
        assert torch.equal(x.to_dense() if x.is_sparse else x, cora.x[want.rows[:want.layers[specs[0].name].n_in]])
        for s in specs:
            a, b = got.lg.layers[s.name], want.layers[s.name]
            assert (a.n_in, a.n_out) == (b.n_in, b.n_out) and torch.equal(a.ids, b.ids)
            va, vb = a.views[s.view], b.views[s.view]
            assert torch.equal(va.csr.indptr, vb.csr.indptr) and torch.equal(va.csr.indices, vb.csr.indices)
            # no GCNII layer draws per edge: its shards hold no edge ids, -1 ("unknown") of each view's length
            assert va.edge_ids.shape == vb.edge_ids.shape and bool((va.edge_ids == -1).all())
            assert torch.equal(va.edge_data["gcn_norm"], vb.edge_data["gcn_norm"])
            assert [t.tolist() for t in a.halo.send_idx] == [t.tolist() for t in b.halo.send_idx]
            assert a.halo.recv_counts == b.halo.recv_counts
        # the layers hold one structure in memory, as the compiler's did: 64 copies were 64x its bytes
        first = got.lg.layers[specs[0].name].views[specs[0].view].csr.indices
        assert all(g.views[s.view].csr.indices.data_ptr() == first.data_ptr()
                   for s, g in ((s, got.lg.layers[s.name]) for s in specs))


def test_ranks_that_hold_their_own_rows_keep_their_features(cora, tmp_path) -> None:
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), cora, workers=4, strategy="depcomm")
    plan.save(tmp_path / "plan")
    manifest = json.loads((tmp_path / "plan/shards/manifest.json").read_text())
    assert "features" not in manifest and not (tmp_path / "plan/shards/features.npy").exists()
    x = shards.load_rank(tmp_path / "plan/shards", 1, 4).inputs["x"]
    x = x.to_dense() if x.is_sparse else x
    assert torch.equal(x, cora.x[torch.as_tensor(np.nonzero(plan.parts == 1)[0])])


def test_altered_shared_features_are_refused(gcnii_plan, tmp_path) -> None:
    _, path = gcnii_plan
    copy = tmp_path / "shards"
    copy.mkdir()
    for p in (path / "shards").iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    data = bytearray((copy / "features.npy").read_bytes())
    data[-1] ^= 1
    (copy / "features.npy").write_bytes(bytes(data))
    with pytest.raises(PlanError, match="features.*checksum"):
        shards.load_rank(copy, 0, 4)
    (copy / "features.npy").unlink()
    with pytest.raises(PlanError, match="features.*missing"):
        shards.load_rank(copy, 0, 4)


def test_packing_gives_every_array_back() -> None:
    base = np.arange(100, dtype=np.int64)
    arrays = {"a": base, "prefix": base[:40], "tail": base[10:], "empty": np.zeros(0, np.int64),
              "empty2": np.zeros(0, np.int64), "small": np.array([3, 1, 2]), "small2": np.array([3, 1, 2]),
              "wide": np.array([2**40, 1]), "norm": np.ones(5, np.float32), "scalar": np.array(7),
              "rows2d": np.ones((4, 3), np.float32)}
    stored, packing = pack_arrays(arrays)
    assert packing["refs"] == {"prefix": ["a", 40], "empty2": ["empty", 0], "small2": ["small", 3]}
    assert stored["a"].dtype == np.int32 and stored["tail"].dtype == np.int32 and stored["wide"].dtype == np.int64
    got = unpack_arrays(stored, json.loads(json.dumps(packing)), "here")
    for name, want in arrays.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape and np.array_equal(got[name], want)
    assert np.shares_memory(got["a"], got["prefix"])


@pytest.mark.parametrize("packing", [{"refs": {"x": ["nowhere", 1]}}, {"refs": {"x": ["a", 101]}},
                                     {"int32": ["b"]}, {"refs": []}])
def test_a_packing_that_does_not_fit_the_shard_is_refused(packing) -> None:
    stored = {"a": np.arange(100, dtype=np.int32), "b": np.ones(3)}
    with pytest.raises(PlanError, match="here"):
        unpack_arrays(stored, packing, "here")


@pytest.mark.parametrize("model, kept", [("gcn", False), ("gat", True)])  # GAT drops attention values per edge
def test_a_shard_holds_its_edges_ids_only_where_a_layer_reads_them(cora, tmp_path, model, kept) -> None:
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / f"{model}.gnn"), cora, workers=2, strategy="depcomm")
    plan.save(tmp_path / "plan")
    with np.load(tmp_path / "plan/shards/rank-00000.npz") as f:
        assert any(k.endswith(".eids") for k in f.files) == kept
    lg = shards.load_rank(tmp_path / "plan/shards", 0, 2).lg
    view = lg.layers[plan.program.graph_layers()[0].name].views["self_loops"]
    assert len(view.edge_ids) == view.csr.nnz and bool((view.edge_ids >= 0).all()) == kept


@pytest.mark.parametrize("model, kept", [("sage", False), ("gcn", True)])  # GCN's messages read edge.gcn_norm
def test_a_shard_holds_gcn_norm_only_where_a_layer_reads_it(cora, tmp_path, model, kept) -> None:
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / f"{model}.gnn"), cora, workers=2, strategy="depcomm")
    plan.save(tmp_path / "plan")
    with np.load(tmp_path / "plan/shards/rank-00001.npz") as f:
        assert any(k.endswith(".norm") for k in f.files) == kept
    lg = shards.load_rank(tmp_path / "plan/shards", 1, 2).lg
    assert all(("gcn_norm" in v.edge_data) == kept for g in lg.layers.values() for v in g.views.values())
