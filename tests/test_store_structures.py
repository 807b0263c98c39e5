"""A plan of a graph opened from a store leaves the structures on its stored edges to the ranks, who build them from
the store (gnnc.plan.shards.store_source); each rank's structures, inputs and memory account are what it loads from
a plan that copied them into its shards, and its training step is one process's.

The shards of a deep DepCache plan were each a relabelled copy of nearly all of the graph's edges (ogbn-products
for 8 workers: 5.1 GB, the largest part of the compile, issue 34); a store's plan keeps the rows, halo plans and
labels, and names the store (its path and its manifest's sha256), which a rank refuses once it is gone or changed.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnc
from _rank_pool import pooled_launch
from conftest import EXAMPLES
from gnnc.errors import PlanError
from gnnc.graph import CSR, store
from gnnc.plan import shard_files, shards
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.train import TrainConfig
from gnnc.testing import first_training_step
from test_distributed_exact import half_of_the_dependencies, hub_graph, measured_bytes, parts_for, step_differences

# a layer on the graph's own edges (no self-loops view) that reads every per-edge array a rank builds: gcn_norm,
# the graph's edge data and the edges' global ids (the dropout of an edge value draws by edge id)
EDGES = """
layer Weighted(in, out) {
  scatter   m = dropout(edge.gcn_norm, 0.5) * sigmoid(dot(edge.attr)) * edge.weight * src.h
  gather    a = sum(m)
  transform t = linear(a, out) + linear(h, out, bias = false)
  apply     h = t
}
model M(features, hidden = 8, classes) {
  h = Weighted(features, hidden)(x)
  h = relu(h)
  h = Weighted(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""

# (model, strategy, workers): one strategy for every layer, per layer, a segment entered after layer 0 (a fetch),
# P3's first layer; GCN's, GAT's and GCNII's layers read the self-loops view, which the store does not hold: the plan
# writes it once (`write_views`)
CASES = [("sage", "depcache", 4), ("sage", "hybrid", 4), ("sage", "depcomm", 3), ("sage", "bcast1d", 3),
         ("sage", "depcomm,depcache", 2), ("sage", "pushpull,depcache", 2), ("gin", "depcache", 3),
         ("gcn", "depcomm", 2), ("gcn", "hybrid", 3), ("gat", "bcast1d", 2), ("gcnii", "depcache", 4),
         ("edges", "hybrid", 3), ("edges", "bcast1d", 2)]


def _model(name: str):
    return gnnc.load_model_source(EDGES, "edges.gnn") if name == "edges" else gnnc.load_model(EXAMPLES / f"{name}.gnn")


def _with_edge_data(graph):
    rng = np.random.default_rng(4)
    graph.edge_data = {"weight": torch.from_numpy(rng.random(graph.num_edges, dtype=np.float32)),
                       "attr": torch.from_numpy(rng.standard_normal((graph.num_edges, 2), dtype=np.float32))}
    return graph


@pytest.fixture(scope="module")
def held():
    return _with_edge_data(gnnc.load_graph("planetoid:cora"))


@pytest.fixture(scope="module")
def stored(held, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store") / "cora"
    store.write_store(held, root)
    return root


def _plan(model, graph, strategy: str, workers: int, path: Path, plan: list | None = None) -> dict:
    """The shards' manifest of `model`'s plan on `graph`, saved at `path` (the plan appended to `plan`)."""
    names = strategy.split(",") * (2 if "," not in strategy else 1)
    cached = None
    if "hybrid" in names:  # half of the remote dependencies cached: rows and halos both
        cached = half_of_the_dependencies(graph, parts_for(graph, workers, "metis"), workers,
                                          [k for k, n in enumerate(names) if n == "hybrid"])
    compiled = gnnc.compile(model, graph, workers=workers, strategy=strategy, partition="metis", hybrid_cached=cached)
    compiled.save(path)
    if plan is not None:
        plan.append(compiled)
    return json.loads((path / "shards" / "manifest.json").read_text())


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.is_sparse else t


def _same_view(a, b, where: str) -> None:
    assert a.csr.indices.dtype == b.csr.indices.dtype == torch.int64, where
    for x, y in ((a.csr.indptr, b.csr.indptr), (a.csr.indices, b.csr.indices), (a.csr.eids, b.csr.eids),
                 (a.edge_ids, b.edge_ids), (a.dst, b.dst), (a.deg, b.deg)):
        assert torch.equal(x, y), where
    assert (a.csr.n_src, a.csr.n_dst) == (b.csr.n_src, b.csr.n_dst), where
    assert a.edge_data.keys() == b.edge_data.keys(), where
    assert all(torch.equal(a.edge_data[k], b.edge_data[k]) for k in a.edge_data), where


def _storages(lg) -> int:
    return len({g.views[v].csr.indices.untyped_storage().data_ptr() for g in lg.layers.values() for v in g.views
                if len(g.views[v].csr.indices)})


def _same_plan(x, y, where: str) -> None:
    assert (x is None) == (y is None), where
    if x is not None:
        assert x.recv_counts == y.recv_counts and all(map(torch.equal, x.send_idx, y.send_idx)), where


@pytest.mark.parametrize("name, strategy, workers", CASES)
def test_ranks_build_what_the_shards_held(name, strategy, workers, held, stored, tmp_path) -> None:
    model = _model(name)
    built = _plan(model, store.open_store(stored), strategy, workers, tmp_path / "built")
    copied = _plan(model, held, strategy, workers, tmp_path / "copied")
    assert "store" not in copied and "features" not in built
    assert {k: built["store"][k] for k in ("path", "sha256")} == {
        "path": str(stored.resolve()), "sha256": hashlib.sha256((stored / store.MANIFEST).read_bytes()).hexdigest()}
    # the self-loops view's CSR written once; each view's per-edge arrays in its CSR order, once (the graph's edge
    # data, which a rank's structures carry whether read or not, as a copied shard's; gcn_norm where read)
    views = built["store"]["views"]
    view = "self_loops" if name in ("gcn", "gat", "gcnii") else "plain"
    assert list(views) == [view]
    norm = ["data.gcn_norm"] if name in ("gcn", "gcnii", "edges") else []
    assert sorted(views[view]) == sorted(["data.attr", "data.weight", *norm] +
                                         (["indptr", "indices"] if view == "self_loops" else []) +
                                         (["eids"] if name == "gat" else [])), sorted(views[view])  # its dropout
    for rank in range(workers):
        got = shards.load_rank(tmp_path / "built" / "shards", rank, workers)
        want = shards.load_rank(tmp_path / "copied" / "shards", rank, workers)
        where = f"{name} {strategy} rank {rank}"
        assert torch.equal(got.lg.rows, want.lg.rows) and got.lg.n_owned == want.lg.n_owned, where
        assert got.lg.block_rows == want.lg.block_rows and got.lg.layers.keys() == want.lg.layers.keys(), where
        for layer, g in got.lg.layers.items():
            w = want.lg.layers[layer]
            assert (g.n_in, g.n_out, g.blocks) == (w.n_in, w.n_out, w.blocks) and torch.equal(g.ids, w.ids), where
            assert g.views.keys() == w.views.keys(), where
            for v in g.views:
                _same_view(g.views[v], w.views[v], f"{where} {layer}")
            _same_plan(g.halo, w.halo, where)
            _same_plan(g.entry, w.entry, where)
            assert (g.entry_perm is None) == (w.entry_perm is None), where
            assert g.entry_perm is None or torch.equal(g.entry_perm, w.entry_perm), where
        # layers of a segment that read the first rows of another's structure share its arrays, as when copied
        assert _storages(got.lg) == _storages(want.lg), where
        assert got.inputs.keys() == want.inputs.keys(), where
        assert all(torch.equal(_dense(got.inputs[k]), _dense(want.inputs[k])) for k in want.inputs), where
        if got.full_views is not None:
            assert torch.equal(got.block_order, want.block_order) and got.cols == want.cols, where
        entry = built["shards"][rank]
        arrays = shard_files.load_npz(tmp_path / "built" / "shards", built, rank)
        store_built = [info for info in entry["layout"]["layers"].values() if "store" in info]
        # every layer's structure is built by the rank (P3's first layer has none): its columns are not in the shard
        assert len(store_built) == sum(info["n_src"] is not None for info in entry["layout"]["layers"].values()) > 0
        assert "store" in copied or not any("store" in i for i in copied["shards"][rank]["layout"]["layers"].values())
        for info in store_built:
            assert f"g{info['structure']}.indices" not in arrays, where
        # what the rank holds once loaded, counted as the copied shard counts it
        assert entry["loaded_bytes"] == copied["shards"][rank]["loaded_bytes"], where
        assert entry["bytes"] < copied["shards"][rank]["bytes"], where


def test_a_graph_whose_structure_or_features_were_replaced_is_copied(held, stored, tmp_path) -> None:
    model = _model("sage")
    graph = store.open_store(stored)
    csr = graph.csr("plain")
    graph._views[("csr", "plain")] = CSR(csr.indptr.clone(), csr.indices.clone(), csr.eids.clone(), csr.n_dst,
                                         csr.n_src)
    assert "store" not in _plan(model, graph, "depcache", 2, tmp_path / "csr")
    graph = store.open_store(stored)
    graph.edge_data = dict(graph.edge_data, weight=graph.edge_data["weight"] * 2)
    assert "store" not in _plan(model, graph, "depcache", 2, tmp_path / "edges")
    # the structure is the store's, the features not: the ranks build the one and read the other from the shards
    graph = store.open_store(stored)
    graph.x = graph.x + 1
    manifest = _plan(model, graph, "depcache", 2, tmp_path / "x")
    assert "store" in manifest and not any((e["layout"].get("x") or {}).get("store") for e in manifest["shards"])
    for rank in range(2):
        got = shards.load_rank(tmp_path / "x" / "shards", rank, 2)
        assert torch.equal(_dense(got.inputs["x"]), _dense(held.x)[got.lg.rows[:len(got.inputs["x"])]] + 1)


def test_a_rank_refuses_a_store_moved_or_changed(held, stored, tmp_path) -> None:
    root = tmp_path / "store"
    shutil.copytree(stored, root)
    _plan(_model("sage"), store.open_store(root), "depcache", 2, tmp_path / "plan")
    where = tmp_path / "plan" / "shards"
    shards.load_rank(where, 0, 2)
    moved = root.rename(tmp_path / "moved")
    with pytest.raises(PlanError, match=f"builds its structures from the graph store {root}, which the plan was "
                                        f"compiled from: .*{store.MANIFEST}"):
        shards.load_rank(where, 1, 2)
    # a store converted again at the same path (another graph, or the same one with other labels): refused
    moved.rename(root)
    other = _with_edge_data(gnnc.load_graph("planetoid:cora"))
    other.y = torch.roll(other.y, 1)
    shutil.rmtree(root)
    store.write_store(other, root)
    with pytest.raises(PlanError, match=f"the graph store {root} is not the one the plan was compiled from"):
        shards.load_rank(where, 0, 2)
    manifest = json.loads((where / shard_files.MANIFEST).read_text())
    del manifest["store"]  # a manifest that does not name it (edited): refused, not a crash
    (where / shard_files.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PlanError, match="does not name it"):
        shards.load_rank(where, 0, 2)


TRAINED = [("sage", "depcache"), ("sage", "hybrid"), ("sage", "bcast1d"), ("gin", "depcomm,depcache"),
           ("sage", "pushpull,depcache"), ("edges", "hybrid"), ("edges", "depcache"), ("gcn", "depcache"),
           ("gat", "hybrid")]


def test_training_on_a_stores_plan_is_one_process_step(tmp_path) -> None:
    """Logits, loss, every gradient and the bytes sent: a store's plans on 2 and 4 gloo processes (the store's own
    edges and the self-loops view the plan writes)."""
    graph = _with_edge_data(hub_graph())
    root = tmp_path / "store"
    store.write_store(graph, root)
    opened = store.open_store(root)
    todo = []
    for world in (2, 4):
        for name, strategy in TRAINED:
            model = _model(name)
            path = tmp_path / f"{world}-{name}-{strategy}"
            plan: list = []
            assert "store" in _plan(model, opened, strategy, world, path, plan)
            job = DistJob(str(plan[0].program), str(path / "shards"), TrainConfig(seed=3, progress=False,
                                                                                   use_kernels=False))
            todo.append((world, (name, strategy, world), gnnc.compile(model, graph).program, job,
                         plan[0].meta.predicted_bytes_per_step))
    failures = []
    for world in (2, 4):
        cases = [c for c in todo if c[0] == world]
        results = pooled_launch(one_step_each, world, [job for *_, job, _ in cases])[0]
        for (_, key, single, _, predicted), got in zip(cases, results):
            if measured_bytes(got) != predicted:
                failures.append(f"{key}: measured bytes {measured_bytes(got)} != predicted {predicted}")
            failures += step_differences(key, got, *first_training_step(single, graph, 3))
    assert not failures, "\n".join(failures)
