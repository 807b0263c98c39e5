"""The work of the products-size compile's statistics and depcache row sets, counted (issue 34): on a graph store
no transpose of the in-CSR is built (the store maps its out-CSR), and no rank walks the in-edges for its depcache
row sets (they are read off the in-distance table the statistics computed). Both fail on f7ba317: its statistics
transposed the in-CSR by scipy (`in_adj.T.tocsr()`) and every rank walked its segment (`rows._sources`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from gnnc.graph.generators import rmat
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition.stats import compute_stats
from gnnc.plan import rows
from gnnc.plan.rows import LayerSpec, all_row_sets


def test_statistics_then_row_sets_transpose_and_walk_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_store(rmat(800, 6.0, seed=3), tmp_path / "s")
    g = open_store(tmp_path / "s")
    parts = np.random.default_rng(4).integers(0, 4, g.num_nodes)
    transposes: list[int] = []
    walks: list[int] = []
    real_t, real_walk = sp.csr_matrix.transpose, rows._sources
    monkeypatch.setattr(sp.csr_matrix, "transpose", lambda self, *a, **k: transposes.append(1) or real_t(self, *a, **k))
    monkeypatch.setattr(rows, "_sources", lambda *a, **k: walks.append(1) or real_walk(*a, **k))
    stats = compute_stats(g, parts, 3, "plain", num_parts=4)
    specs = [LayerSpec(f"l{k}", "plain", "depcache", 0) for k in range(3)]
    sets = all_row_sets(g, parts, 4, specs)
    assert (len(transposes), len(walks)) == (0, 0)
    # and what they computed is what a walk gives: C^0 of each rank holds its 3-hop in-neighbourhood
    for r, s in enumerate(sets):
        assert int(s.held_in[0].sum()) == int(stats.lhop_vertices[r].sum())
