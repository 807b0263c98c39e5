"""A plan's shard structures are built without per-edge work the shard does not need (issue 34: the products-size
compile for 8 workers, where a depcache rank's structures are most of the graph's edges), and with the same bytes.

Each test here fails on the code before it: gcn_norm computed for a GraphSAGE plan, the row sets' in-neighbours
walked through int positions when the rows hold most edges, the shard's columns gathered as int64 and narrowed
again by the packer, each structure's destinations expanded though the writer never reads them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph


def test_a_graphsage_plan_computes_no_gcn_norm(tmp_path, monkeypatch) -> None:
    """No layer of GraphSAGE reads edge.gcn_norm and its shards store none: it was computed over every edge (the
    degrees, each edge's norm) and gathered into CSR order for nothing, once per view."""
    import gnnc

    graph = gnnc.load_graph("planetoid:cora")
    calls = []
    norm = type(graph).gcn_norm
    monkeypatch.setattr(type(graph), "gcn_norm", lambda g, view="self_loops": calls.append(view) or norm(g, view))
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy="depcache")
    plan.save(tmp_path / "plan")
    assert calls == [], calls


def test_sources_through_a_mask_equal_through_positions(monkeypatch) -> None:
    """`_sources` of rows holding most edges reads every entry through a mask (no int positions built); both ways
    give the same in-neighbours, below and above the threshold."""
    from gnnc.plan import rows as rows_mod

    graph = random_graph(400, 6000, seed=3)
    csr = graph.csr("plain")
    indptr, indices = csr.indptr.numpy(), csr.indices.numpy()
    rng = np.random.default_rng(0)
    built = []
    entries = rows_mod._entries
    monkeypatch.setattr(rows_mod, "_entries", lambda p, r: built.append(len(r)) or entries(p, r))
    for share in (0.02, 0.1, 0.5, 0.9, 1.0):
        mask = rng.random(graph.num_nodes) < share
        want = np.zeros(graph.num_nodes, dtype=bool)
        want[indices[entries(indptr, np.nonzero(mask)[0])]] = True
        built.clear()
        assert np.array_equal(rows_mod._sources(indptr, indices, mask), want), share
        edges = int(np.diff(indptr)[mask].sum())
        assert bool(built) == (edges <= rows_mod.MASK_WALK * len(indices)), (share, built)


@pytest.mark.parametrize("model,strategy", [("sage", "depcache"), ("gcn", "hybrid"), ("gat", "depcomm"),
                                            ("gin", "bcast1d")])
def test_narrow_shard_arrays_pack_as_the_int64_ones(model, strategy) -> None:
    """`rank_arrays(narrow=True)` (the shard writer's) gathers each structure's columns as int32 and expands no
    destinations; packed, they are the int64 arrays' bytes, packing and loaded bytes exactly."""
    import gnnc
    from gnnc.graph.sampling import reads_edge_ids
    from gnnc.plan import shards
    from gnnc.plan.rows import all_row_sets, layer_specs
    from gnnc.plan.shard_files import pack_arrays

    graph = gnnc.load_graph("planetoid:cora")
    world = 4
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / f"{model}.gnn"), graph, workers=world, strategy=strategy)
    parts = np.asarray(plan.parts)
    specs = layer_specs(plan.program)
    sets = all_row_sets(graph, parts, world, specs)
    ids = any(reads_edge_ids(layer) for layer in plan.program.graph_layers())
    for rank in range(world):
        wide, layout = shards.rank_arrays(graph, parts, rank, world, specs, sets, False, ids, True)
        thin, layout2 = shards.rank_arrays(graph, parts, rank, world, specs, sets, False, ids, True, narrow=True)
        assert layout == layout2 and wide.keys() == thin.keys()
        names = shards.narrowed(thin)
        assert names and all(k.endswith(".indices") for k in names)
        for k in names:
            assert wide[k].dtype == np.int64 and thin[k].dtype == np.int32 and np.array_equal(wide[k], thin[k])
        stored, packing = pack_arrays(wide)
        stored2, packing2 = pack_arrays(thin, names)
        assert packing == packing2 and stored.keys() == stored2.keys()
        for k in stored:
            assert stored[k].dtype == stored2[k].dtype and stored[k].tobytes() == stored2[k].tobytes(), k

        class Writer:  # what write_packed hands the shard writer
            def write(self, path, rank, arrays, layout, loaded_bytes):
                self.got = (arrays, layout, loaded_bytes)

        a, b = Writer(), Writer()
        shards.write_packed(a, None, rank, wide, dict(layout), 0, ids)
        shards.write_packed(b, None, rank, thin, dict(layout2), 0, ids, names)
        assert a.got[1] == b.got[1] and a.got[2] == b.got[2]
        lg = __import__("gnnc.plan.rows", fromlist=["x"]).build_local_graph(
            graph, parts, rank, world, specs, sets, edge_positions=False, narrow=True)
        for g in lg.layers.values():
            for v in g.views.values():
                assert v.csr is None or "dst" not in v.csr._cache, "the writer's structures expanded destinations"


def test_pack_arrays_wide_names_small_equal_arrays_and_prefixes() -> None:
    """`wide` arrays are references, small-array equality and int32 listing as the int64 arrays they stand for."""
    from gnnc.plan.shard_files import pack_arrays, unpack_arrays

    big = np.arange(5000, dtype=np.int64) % 77
    small = np.array([3, 1, 2], dtype=np.int64)
    wide = {"a.indices": big, "b.indices": big[:100], "c": small.copy(), "d.indices": small.copy(),
            "e": np.array([3, 1, 2], dtype=np.int32)}
    thin_big = big.astype(np.int32)
    thin = {"a.indices": thin_big, "b.indices": thin_big[:100], "c": small.copy(), "d.indices": small.astype(np.int32),
            "e": np.array([3, 1, 2], dtype=np.int32)}
    stored, packing = pack_arrays(wide)
    stored2, packing2 = pack_arrays(thin, {"a.indices", "b.indices", "d.indices"})
    assert packing == packing2 and {k: v.tobytes() for k, v in stored.items()} == \
        {k: v.tobytes() for k, v in stored2.items()}
    back = unpack_arrays(stored2, packing2, "here")
    for k, v in wide.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    with pytest.raises(ValueError):
        pack_arrays({"x.indices": big}, {"x.indices"})


def test_loaded_narrow_shards_equal_the_compiled_structures(tmp_path) -> None:
    """A plan written through the narrow path loads as `build_local_graph` builds it: int64 columns, same values."""
    import gnnc
    from gnnc.plan import shards
    from gnnc.plan.rows import all_row_sets, build_local_graph, layer_specs

    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(gnnc.load_model(EXAMPLES / "sage.gnn"), graph, workers=4, strategy="depcache")
    plan.save(tmp_path / "plan")
    parts = np.asarray(plan.parts)
    specs = layer_specs(plan.program)
    sets = all_row_sets(graph, parts, 4, specs)
    for rank in range(4):
        loaded = shards.load_rank(tmp_path / "plan" / "shards", rank, 4)
        want = build_local_graph(graph, parts, rank, 4, specs, sets)
        for name, g in want.layers.items():
            got = loaded.lg.layers[name]
            for view, v in g.views.items():
                w = got.views[view]
                assert w.csr.indices.dtype == torch.int64
                assert torch.equal(w.csr.indices, v.csr.indices) and torch.equal(w.csr.indptr, v.csr.indptr)
