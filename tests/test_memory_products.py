"""Issue 35 at ogbn-products' size, checked small: what one process keeps for its graph and its step (MEM).

The full-size runs need the machine alone (benchmarks/products.py); these tests check each saving on a graph whose
[vertices, hidden] tensors are torch blocks of several MiB, which the block cache (gnnc.runtime.block_cache) counts
as live: its high-water mark over one training step is the step's peak of large tensors."""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api, memory_check
from gnnc.runtime import block_cache
from gnnc.runtime.executor import init_params
from gnnc.runtime.train import TrainConfig, Worker, make_optimizer, train_step

N, E, HIDDEN = 6000, 60000, 128  # [N, HIDDEN] float32: 2.9 MiB, above the cache's 1 MiB


def _step_peak(program, graph, recompute: bool) -> tuple[int, int]:
    """(live bytes of large blocks before a step, their high-water mark during it), after a first step that builds
    the kernels' structures."""
    cfg = TrainConfig(seed=1, progress=False, recompute=recompute)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 1)
    opt = make_optimizer(program, params, cfg)
    train_step(worker, params, opt, None, 0)
    block_cache.empty()  # the high-water mark starts over at what is live
    before = block_cache.stats().live
    train_step(worker, params, opt, None, 1)
    return before, block_cache.stats().high


@pytest.fixture(scope="module")
def gcn():
    if not block_cache.install():
        pytest.skip(f"no block cache here ({block_cache.status()}): nothing counts live blocks")
    graph = random_graph(n=N, e=E, f=32, c=8, seed=3)
    return api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=HIDDEN), graph).program, graph


def test_recompute_peaks_no_higher_than_without(gcn) -> None:
    """--recompute ran the first graph layer again in the backward, beside its output's gradient: one [N, hidden]
    more at the step's peak than without (products at 0.05: 768 against 670 MiB of large blocks live)."""
    program, graph = gcn
    (b0, plain), (b1, recomputed) = (_step_peak(program, graph, r) for r in (False, True))
    assert b0 == b1
    assert recomputed <= plain, (plain / 2**20, recomputed / 2**20)


def test_one_process_keeps_36_bytes_per_edge_of_structure() -> None:
    """After a step one process holds, per edge of GCN's self-loop view, the view's int64 sources and edge ids, its
    gcn_norm in CSR order and the kernels' two patterns (int32 columns, the transpose's int32 permutation and
    permuted norms): 36 bytes. It also kept the graph's own copies in edge order (the edge list, 12 bytes per edge),
    the int64 transpose the pattern was built from (16 bytes), an int64 permutation (4 more) and the view's int64
    destinations, which the kernels' products never read (8 more): 1.4 + 1.9 + 0.5 + 0.9 GiB at ogbn-products'
    size."""
    if not block_cache.install():
        pytest.skip(f"no block cache here ({block_cache.status()}): nothing counts live blocks")
    before = block_cache.stats().live
    graph = random_graph(n=6000, e=300_000, f=32, c=8, seed=3)  # 4-byte edge arrays of 1.2 MiB
    program = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=16), graph).program
    cfg = TrainConfig(seed=1, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 1)
    train_step(worker, params, make_optimizer(program, params, cfg), None, 0)
    nnz = worker.views["self_loops"].csr.nnz
    assert block_cache.stats().live - before <= 36 * nnz + 2**20, (block_cache.stats().live - before) / nnz
    assert "self_loops_edges" not in graph._views
    assert "dst" not in worker.views["self_loops"].csr._cache


def _resident_bytes(paths: list[str]) -> int:
    """Resident bytes of this process's mappings of `paths` (/proc/self/smaps)."""
    total, current = 0, None
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line: range perms offset dev inode [path]
                current = head[5] if len(head) > 5 else None
            elif head and head[0] == "Rss:" and current in paths:
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_a_stored_csr_read_for_the_kernels_patterns_is_not_kept_resident(tmp_path) -> None:
    """GraphSAGE on a store: its plain view is the stored CSR and transpose (int64 sources, edge ids and the
    transpose's permutation: 24 bytes per edge of file pages, resident once the kernels' int32 patterns are copied
    from them, 2.8 GiB at ogbn-products' size), and the view built the int64 destinations (8 bytes per edge), which
    its mean never reads: after a step neither is held."""
    from pathlib import Path

    store = _store(tmp_path)
    graph = api.load_graph(store)
    program = api.compile(api.load_model(EXAMPLES / "sage.gnn", hidden=16), graph).program
    cfg = TrainConfig(seed=1, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 1)
    train_step(worker, params, make_optimizer(program, params, cfg), None, 0)
    files = [str(p.resolve()) for p in Path(store).glob("*.npy") if p.name.startswith(("in.", "out."))]
    assert len(files) == 7 and _resident_bytes(files) == 0, _resident_bytes(files)
    assert "dst" not in worker.views["plain"].csr._cache


def _store(tmp_path) -> str:
    from gnnc.graph.store import write_store

    write_store(random_graph(n=3000, e=40_000, f=16, c=5, seed=4), tmp_path / "g")
    return str(tmp_path / "g")


def test_nproc_run_is_refused_from_the_store_manifest_before_loading(tmp_path, monkeypatch) -> None:
    """`--nproc 2` on a store too large for the machine: refused from its manifest's counts, before the launcher
    loads and partitions the graph (at ogbn-products' size the shards' check came after 17.8 GiB of that)."""
    from gnnc.errors import GnncError
    from gnnc.host import AvailableMemory

    store = _store(tmp_path)
    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(64 * 2**20, "a test's 64 MiB"))
    monkeypatch.setattr(api, "load_graph", lambda spec: pytest.fail(f"{spec} was loaded before the check"))
    with pytest.raises(GnncError, match="refused before loading it"):
        api.run(api.load_model(EXAMPLES / "gcn.gnn", hidden=64), store, nproc=2, epochs=1, strategy="depcomm")


def test_the_check_before_loading_admits_what_the_shards_check_admits(tmp_path) -> None:
    """Its estimate is a lower bound of the shards' (an even share, no halo): no run the later check would admit is
    refused before loading."""
    store = _store(tmp_path)
    counts = memory_check.graph_counts(store)
    model = api.load_model(EXAMPLES / "gcn.gnn", hidden=64)
    early = memory_check.check_ranks_before_loading(api.compile(model, memory_check.stand_in_graph(counts)).program,
                                                    counts, 2)
    plan = api.compile(model, api.load_graph(store), workers=2, strategy="depcomm")
    plan.write_shards(tmp_path / "shards")
    late = memory_check.estimate_run_memory(plan, shard_dir=tmp_path / "shards")
    assert (counts.vertices, counts.edges, counts.features, counts.classes) == (3000, 40_012, 16, 5)
    assert early.total <= late.total, (early.per_process, late.per_process)


def test_the_kernels_transpose_keeps_no_edge_ids() -> None:
    """GAT's kernels keep the self-loop view's transpose (its sources, permutation and inverse) but never read its
    int64 edge ids: 8 bytes per edge (0.9 GiB at ogbn-products' size) gathered only when something asks (a device
    copy, the store's check), and then the same as the transpose's built eagerly."""
    graph = random_graph(n=500, e=6000, f=8, c=3, seed=5)
    program = api.compile(api.load_model(EXAMPLES / "gat.gnn", hidden=8, heads=2), graph).program
    cfg = TrainConfig(seed=1, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 1)
    train_step(worker, params, make_optimizer(program, params, cfg), None, 0)
    csr = worker.views["self_loops"].csr
    t = csr._cache["t"]
    assert t.eids_given is None
    order = torch.argsort(csr.indices, stable=True)
    assert torch.equal(t.eids, csr.eids[order])
