"""METIS's input and stats built in blocks (issue 34: METIS at ogbn-products' size): the same symmetric CSR, the
same split for the same seed and the same cut and volume as the whole-array code before, with less memory.

The reference functions below are the code before this change (be90bc0), kept here to compare against. The
memory checks fail on it: its symmetric CSR allocated some 80 bytes per edge (sorting every key of both
directions at once), its cut and volume some 50, and its METIS call copied the CSR (astype) before METIS read it.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from gnnc.errors import GnncError
from gnnc.graph import Graph, sorted_unique
from gnnc.graph.loaders import load_graph
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition import metis
from gnnc.passes.partition.core import PartitionInput, partition_graph, undirected_adjacency

RMAT = "rmat:n=3000,deg=8,features=4,classes=3,seed=1"


def old_undirected(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """be90bc0's undirected_adjacency: both directions' keys sorted whole."""
    n = graph.num_nodes
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = sorted_unique(np.concatenate([src * n + dst, dst * n + src]))
    rows = keys // n
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, keys - rows * n


def old_remote_sizes(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, parts: int) -> np.ndarray:
    """be90bc0's remote_sizes: every entry's row, mask and key at once."""
    n = len(indptr) - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    cross = assignment[rows] != assignment[indices]
    keys = sorted_unique(assignment[indices[cross]] * n + rows[cross])
    return np.bincount(keys // n, minlength=parts).astype(np.int64)


def old_cut(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray) -> int:
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    return int(np.count_nonzero(assignment[rows] != assignment[indices])) // 2


def messy_graph(n: int, e: int, seed: int) -> Graph:
    """A directed multigraph with self-loops, duplicates, one-way edges and isolated vertices."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = np.where(rng.random(e) < 0.1, src, rng.integers(0, max(n // 2, 1), e))  # loops; the upper half isolated
    src, dst = np.concatenate([src, src[: e // 5]]), np.concatenate([dst, dst[: e // 5]])  # duplicates
    masks = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
    return Graph(n, src, dst, torch.zeros(n, 2), torch.zeros(n, dtype=torch.int64), *masks, name="messy")


@pytest.mark.parametrize("block", [1, 7, 1000, 1 << 21])
@pytest.mark.parametrize("which", ["rmat", "messy"])
def test_symmetric_csr_equals_the_whole_sort(which: str, block: int) -> None:
    g = load_graph(RMAT, use_cache=False) if which == "rmat" else messy_graph(500, 4000, 3)
    indptr, indices = undirected_adjacency(g, block=block)
    want_ptr, want_idx = old_undirected(g)
    assert indptr.dtype == np.int64 and indices.dtype == np.int64  # METIS's idx_t in pymetis's wheels
    assert np.array_equal(indptr, want_ptr) and np.array_equal(indices, want_idx)


def test_symmetric_csr_of_a_store_equals_in_memory(tmp_path) -> None:
    g = messy_graph(400, 3000, 5)
    write_store(g, tmp_path / "s")
    s = open_store(tmp_path / "s")
    got, want = PartitionInput(s), PartitionInput(g)
    for a, b in zip(got.undirected, old_undirected(g)):
        assert np.array_equal(a, b)
    assert np.array_equal(got.in_degree, np.bincount(g.dst, minlength=g.num_nodes))  # off the mapped in-CSR
    assert np.array_equal(want.in_degree, np.bincount(g.dst, minlength=g.num_nodes))


@pytest.mark.parametrize("parts", [2, 3, 8])
@pytest.mark.parametrize("block", [1, 50, 1 << 21])
def test_cut_and_remote_sizes_in_blocks_equal_the_whole_pass(parts: int, block: int) -> None:
    g = load_graph(RMAT, use_cache=False)
    indptr, indices = undirected_adjacency(g)
    rng = np.random.default_rng(parts)
    for assignment in (rng.integers(0, parts, g.num_nodes), np.arange(g.num_nodes) * parts // g.num_nodes):
        cut, remote = metis._cross(indptr, indices, assignment, parts, block=block)
        assert cut == old_cut(indptr, indices, assignment)
        assert np.array_equal(remote, old_remote_sizes(indptr, indices, assignment, parts))
    assert metis.cut_and_volume(indptr, indices, assignment) == (
        old_cut(indptr, indices, assignment), int(old_remote_sizes(indptr, indices, assignment, parts).sum()))


@pytest.mark.parametrize("parts", [2, 4, 8])
@pytest.mark.parametrize("opts", [{}, {"objective": "vol"}, {"constraints": "vertices+degree"}, {"recursive": True}])
def test_metis_split_unchanged_for_the_same_seed(parts: int, opts: dict) -> None:
    """METIS on the CSR the old code built, with the same options, gives the split partition_graph gives now."""
    import pymetis

    g = load_graph(RMAT, use_cache=False)
    got = partition_graph(g, parts, "metis", seed=0, **opts)
    indptr, indices = old_undirected(g)
    if opts.get("constraints") == "vertices+degree":
        weights = np.stack([np.ones(g.num_nodes, dtype=np.int64), np.bincount(g.dst, minlength=g.num_nodes)], 1)
        want, _ = metis.metis_kway(indptr, indices, parts, weights, opts.get("objective", "cut"), 0, 30)
    else:
        options = pymetis.Options(seed=0, ufactor=30, objtype=int(pymetis.ObjType.VOL if opts.get("objective") == "vol"
                                                                  else pymetis.ObjType.CUT))
        want = np.asarray(pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(indptr, indices),
                                             recursive=opts.get("recursive", False), options=options).vertex_part)
    assert np.array_equal(got.assignment, want)
    assert got.stats["edge_cut"] == old_cut(indptr, indices, want)
    assert got.stats["volume"] == int(old_remote_sizes(indptr, indices, want, parts).sum())
    assert "matching" not in got.stats  # the default's stats as before


def test_metis_reads_the_symmetric_csr_itself(monkeypatch) -> None:
    """No copy of the CSR beside METIS's input (be90bc0 passed astype copies: 8 bytes per entry more)."""
    import pymetis

    seen = {}
    real = pymetis.part_graph

    def spy(parts, adjacency, **kw):
        seen["xadj"], seen["adjncy"] = adjacency.adj_starts, adjacency.adjacent
        return real(parts, adjacency=adjacency, **kw)

    monkeypatch.setattr(pymetis, "part_graph", spy)
    g = load_graph(RMAT, use_cache=False)
    inp = PartitionInput(g)
    metis.run(inp, 4, 0)
    assert seen["adjncy"] is inp.undirected[1] or np.shares_memory(seen["adjncy"], inp.undirected[1])
    assert np.shares_memory(seen["xadj"], inp.undirected[0])


def _peak(fn, *args, **kwargs) -> int:
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_symmetric_csr_and_stats_hold_little_beyond_the_result() -> None:
    """numpy reports its allocations to tracemalloc. The symmetric CSR: its result (8 bytes per entry, 2 entries
    per symmetric edge) and blocks; be90bc0's held some 80 bytes per edge. The cut and volume: blocks only;
    be90bc0's held some 50 bytes per entry."""
    g = load_graph("rmat:n=20000,deg=16,features=2,classes=2,seed=0", use_cache=False)
    g.csr("plain").transpose()  # the graph's own CSRs (a store maps them), built before the measurement
    e = g.num_edges
    block = 1 << 14
    peak = _peak(undirected_adjacency, g, block=block)
    indptr, indices = undirected_adjacency(g, block=block)
    assert len(indices) <= e  # symmetric already: one entry per directed edge
    # the result (indices allocated for in + out entries, 2E, tracemalloc counting the pages past nnz that are
    # never written, so never resident; indptr and the rows' totals) and a few blocks' temporaries
    assert peak <= 8 * 2 * e + 16 * g.num_nodes + 64 * block + (1 << 20), peak / e
    assert _peak(old_undirected, g) > 2 * peak  # what the bound tells apart: the whole sort (~50 bytes per edge here)
    assignment = np.arange(g.num_nodes) * 4 // g.num_nodes
    cross_peak = _peak(metis._cross, indptr, indices, assignment, 4, block=block)
    assert cross_peak <= 64 * block + (1 << 20), cross_peak
    assert _peak(old_remote_sizes, indptr, indices, assignment, 4) > 4 * cross_peak


def test_matching_is_metis_own_option() -> None:
    g = load_graph(RMAT, use_cache=False)
    rm = partition_graph(g, 4, "metis", seed=0, matching="rm")
    assert rm.stats["matching"] == "rm" and rm.sizes().min() > 0
    assert np.array_equal(rm.assignment, partition_graph(g, 4, "metis", seed=0, matching="rm").assignment)
    kw = partition_graph(g, 4, "metis", seed=0, matching="rm", constraints="vertices+degree")
    assert kw.sizes().min() > 0
    with pytest.raises(GnncError, match="matching must be one of"):
        partition_graph(g, 4, "metis", matching="heavy")


def test_an_in_memory_graph_keeps_no_csr_from_partitioning() -> None:
    """The CSR and transpose the symmetric CSR is read from are the call's, not kept on an in-memory graph (a
    compile reading GCN's self-loop view would hold them, 40 bytes per edge, for nothing); a CSR the graph has is
    read, its transpose not added to it."""
    g = load_graph(RMAT, use_cache=False)
    partition_graph(g, 4, "metis", seed=0)
    assert ("csr", "plain") not in g._views
    csr = g.csr("plain")
    for a, b in zip(undirected_adjacency(g), old_undirected(g)):
        assert np.array_equal(a, b)
    assert "t" not in csr._cache
