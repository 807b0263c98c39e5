"""A rank's structures gather a masked run of entries a block at a time (gnnc.plan.rows.GATHER_BLOCK, issue 34:
the products compile's structures built a temporary of most of the graph's edges per rank, 0.76 GB of int64
sources, faulted in, zeroed and read back). Every block size gives the same structures, edge ids and edge data
as one block of the whole run. Fails on ca3da6e: no GATHER_BLOCK."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
from gnnc import api
from gnnc.graph.loaders import load_graph
from gnnc.plan import rows as rows_mod


def _structures(plan, graph, world: int) -> list[dict[str, np.ndarray]]:
    """Every rank's every layer's CSR, edge ids, CSR eids and edge data, gathered with edge positions and all
    per-edge arrays (nothing left unread), and as the shard writer gathers them (narrow, unread)."""
    parts = np.asarray(plan.parts)
    specs = rows_mod.layer_specs(plan.program)
    sets = rows_mod.all_row_sets(graph, parts, world, specs)
    out = []
    for rank in range(world):
        arrays: dict[str, np.ndarray] = {}
        for how, kwargs in (("all", {}), ("shard", {"edge_positions": False, "unread": frozenset({"eids"}),
                                                     "narrow": True})):
            lg = rows_mod.build_local_graph(graph, parts, rank, world, specs, sets, **kwargs)
            for name, g in lg.layers.items():
                for view, v in g.views.items():
                    key = f"{how}.{name}.{view}"
                    arrays[key + ".indptr"] = v.csr.indptr.numpy().copy()
                    arrays[key + ".indices"] = v.csr.indices.numpy().copy()
                    arrays[key + ".edge_ids"] = v.edge_ids.contiguous().numpy().copy()
                    if how == "all":
                        arrays[key + ".eids"] = v.csr.eids.numpy().copy()
                    arrays.update((f"{key}.edata.{k}", t.numpy().copy()) for k, t in v.edge_data.items())
        out.append(arrays)
    return out


@pytest.mark.parametrize("model,strategy,seed", [("gcn", "depcache", 0), ("gat", "depcache", 1),
                                                 ("gcn", "hybrid", 2), ("sage", "depcomm", 3)])
def test_every_block_size_gathers_the_same_structures(model: str, strategy: str, seed: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs read through masks (MASK_WALK 0: every run of ascending rows), gathered by blocks of 1, 7, 1,000
    entries and the default: the same arrays (the runs are masks over more entries than the blocks)."""
    graph = load_graph(f"rmat:n=900,deg=7,features=5,classes=3,seed={seed}")
    graph.edge_data["w"] = torch.arange(graph.num_edges, dtype=torch.float32).reshape(-1, 1) * 0.5
    world = 4
    plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph, workers=world, strategy=strategy,
                       threads=1)
    monkeypatch.setattr(rows_mod, "MASK_WALK", 0.0)
    pieces = rows_mod._entry_pieces
    masks: list[int] = []

    def noted(indptr, rows):
        out = pieces(indptr, rows)
        masks.extend(len(at) for _, _, at in out if at.dtype == bool)
        return out

    monkeypatch.setattr(rows_mod, "_entry_pieces", noted)
    want = _structures(plan, graph, world)
    assert masks and min(masks) > 1000  # masked runs, of more entries than the blocks below
    for size in (1, 7, 1000):
        monkeypatch.setattr(rows_mod, "GATHER_BLOCK", size)
        got = _structures(plan, graph, world)
        for rank, (a, b) in enumerate(zip(want, got)):
            assert a.keys() == b.keys()
            for k in a:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (size, rank, k)
    assert any(k.endswith(".edata.w") for k in want[0])
