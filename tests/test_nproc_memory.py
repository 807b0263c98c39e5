"""What a run on several processes holds (issue 35: `--nproc 2` depcomm, each rank <= 0.6x one process, and all
ranks together within the machine): a rank's structure per edge, its halo's receive buffers, the launcher beside the
ranks, and the memory check before loading.

A rank runs its halo layers part by part (the held rows' edges, then the halo's): it keeps the structure as those
parts only (gnnc.plan.rows.LayerGraph.hold_parts). Each byte per edge kept there is 0.1 GiB at ogbn-products' size.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnc.errors import GnncError
from gnnc.graph import CSR, GraphView
from gnnc.plan.rows import LayerGraph

N_DST, N_HELD, N_HALO = 40, 30, 25


def layer_graph(seed: int = 0) -> LayerGraph:
    rs = np.random.RandomState(seed)
    src = rs.randint(0, N_HELD + N_HALO, 600)
    dst = rs.randint(0, N_DST, 600)
    csr = CSR.from_edges(src, dst, N_DST, N_HELD + N_HALO)
    eids = torch.from_numpy(rs.permutation(csr.nnz).astype(np.int64))  # global edge ids: not CSR positions
    view = GraphView(csr, csr.indices, None, eids, {"gcn_norm": torch.rand(csr.nnz)},
                     csr.in_degree().to(torch.float32))
    return LayerGraph(N_HELD, N_DST, {"plain": view})


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_parts_held_share_the_edge_data_and_build_no_destinations() -> None:
    lg = layer_graph()
    whole = lg.views["plain"]
    ids, norm, src = whole.edge_ids.clone(), whole.edge_data["gcn_norm"].clone(), whole.src.clone()
    dst = whole.dst.clone()
    bounds = (0, N_HELD, N_HELD + N_HALO)
    lg.hold_parts("plain", bounds)
    held = lg.views["plain"]
    sp = lg.parts("plain", bounds)
    for p, (view, at) in enumerate(zip(sp.views, sp.pos)):
        # the values each part had before: its edges' ids, norms, sources (numbered within the part), destinations
        pos = torch.nonzero((src >= bounds[p]) & (src < bounds[p + 1])).flatten()
        assert torch.equal(view.edge_ids, ids[pos]) and torch.equal(view.csr.eids, ids[pos])
        assert torch.equal(view.edge_data["gcn_norm"], norm[pos])
        assert torch.equal(held.edge_data["gcn_norm"][at], norm[pos])
        assert torch.equal(view.csr.indices, src[pos] - bounds[p])
        # held once: a part's edge ids and data are slices of the whole's reordered ones (12 bytes per edge less)
        assert _storage(view.edge_ids) == _storage(held.edge_ids)
        assert _storage(view.edge_data["gcn_norm"]) == _storage(held.edge_data["gcn_norm"])
        # the destinations are built when read, not kept beside the part for the run (8 bytes per edge)
        assert view.dst_given is None and "dst" not in view.csr._cache
        assert torch.equal(view.dst, dst[pos])


@pytest.mark.parametrize("model, kept", [("gcn", False), ("gat", True)])
def test_a_rank_lets_go_of_the_edge_ids_no_layer_reads(model: str, kept: bool) -> None:
    """A rank keeps its edges' global ids only where a layer draws by them (GAT's dropout of its attention): GCN's
    rank held them for the run, 8 bytes per edge (0.47 GiB of each of 2 ranks at ogbn-products' size). What stays
    has each view's length, so a layer-wise evaluation still cuts its chunks from the parts, and keeps no part's
    destinations after a chunk (they were built for all its edges and cached with it)."""
    from gnnc import api
    from gnnc.plan.rows import LocalGraph
    from gnnc.runtime.distributed import forget_edge_ids
    from gnnc.runtime.layerwise import chunk_view

    graph = api.load_graph("rmat:n=400,deg=8,features=6,classes=3,seed=0")
    program = api.compile(api.load_model(f"examples/{model}.gnn"), graph, workers=2, strategy="depcomm").program
    lg = layer_graph()
    bounds = (0, N_HELD, N_HELD + N_HALO)
    ids = lg.views["plain"].edge_ids.clone()
    lg.hold_parts("plain", bounds)
    sp = lg.parts("plain", bounds)
    forget_edge_ids(program, LocalGraph(torch.arange(N_DST), N_DST, {"l0": lg}, [N_DST]))
    views = [lg.views["plain"], *sp.views]
    assert sum(len(v.edge_ids) for v in sp.views) == len(ids) == len(views[0].edge_ids)
    for view in views:
        assert (view.edge_ids.untyped_storage().nbytes() >= 8 * len(view.edge_ids)) is kept
        assert view.csr is None or (view.csr.eids.untyped_storage().nbytes() >= 8 * view.csr.nnz) is kept
    sub, at = chunk_view(lg.views["plain"], 5, 20, sp)
    assert len(sub.edge_ids) == sub.csr.nnz > 0
    # a chunk's destinations come from its rows' degrees: no part keeps every edge's (8 bytes per edge for the run)
    assert all("dst" not in v.csr._cache for v in sp.views)
    assert torch.equal(sub.dst, torch.cat([v.dst[v.csr.indptr[5]:v.csr.indptr[20]] for v in sp.views]).sort().values - 5)
    assert torch.equal(sub.edge_ids, views[0].edge_ids[at] if kept else torch.full_like(sub.edge_ids, -1))


def test_a_rank_holds_its_parts_sources_once_as_the_kernels_take_them() -> None:
    """A source part's columns are int32, the tensor its kernel pattern reads (the pattern narrowed an int64 copy
    and kept both: 8 bytes per edge more, 0.47 GiB of each rank at ogbn-products' size), and its products, forward,
    transposed and per head (GAT's block pattern), are the int64 columns'."""
    from gnnc.plan.rows import LocalGraph
    from gnnc.runtime.distributed import narrow_part_sources
    from gnnc.runtime.kernels import cpu

    lg = layer_graph()
    bounds = (0, N_HELD, N_HELD + N_HALO)
    lg.hold_parts("plain", bounds)
    sp = lg.parts("plain", bounds)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(bounds[p + 1] - bounds[p], 4, 2, generator=gen) for p in range(2)]
    ws = [torch.rand(v.csr.nnz, 4, generator=gen) for v in sp.views]
    ys = [torch.randn(N_DST, 8, generator=gen) for _ in range(2)]

    def products(csr: CSR, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [cpu.spmm_sum(csr, x.reshape(len(x), 8), None), cpu.spmm_sum(csr, y, None, transposed=True),
                cpu.spmm_sum(csr, x, w)]

    wide = [products(CSR(v.csr.indptr, v.csr.indices.clone(), v.csr.eids, v.csr.n_dst, v.csr.n_src), x, w, y)
            for v, x, w, y in zip(sp.views, xs, ws, ys)]
    narrow_part_sources(LocalGraph(torch.arange(N_DST), N_DST, {"l0": lg}, [N_DST]))
    for v, x, w, y, want in zip(sp.views, xs, ws, ys, wide):
        assert v.csr.indices.dtype == torch.int32 and v.src is v.csr.indices
        assert all(torch.equal(got, exp) for got, exp in zip(products(v.csr, x, w, y), want))
        assert _storage(cpu.pattern(v.csr, False, 1, torch.device("cpu")).col) == _storage(v.csr.indices)


class _Launched(Exception):
    pass


def test_the_launcher_lets_go_of_the_graphs_derived_structure_before_the_ranks_start(monkeypatch) -> None:
    """The launcher wrote every rank's shard from the whole graph; while the ranks run it keeps none of the graph's
    CSRs, self-loop edges or gcn_norm (440 MiB of its 524 at products 0.05, about 9 GiB at full size)."""
    from gnnc import api
    from gnnc.runtime.train import TrainConfig

    graph = api.load_graph("rmat:n=400,deg=8,features=6,classes=3,seed=0")
    plan = api.compile(api.load_model("examples/gcn.gnn"), graph, workers=2, strategy="depcomm")
    held: list[list[str]] = []

    def launch(*args, **kwargs):
        held.append([str(k) for k in graph._views])
        raise _Launched

    monkeypatch.setattr(api, "launch", launch)
    try:
        api.run_plan(plan, graph, TrainConfig(epochs=1, progress=False))
    except _Launched:
        pass
    assert held == [[]]
    # what the launcher reads again is rebuilt as it was
    csr = graph.csr("self_loops")
    assert csr.nnz == graph.num_edges + graph.num_nodes


def _rank_1_of_4_receiving(monkeypatch):
    """Rank 1 of 4 whose receives "complete" at once with the peer's rank in every element: its halo plan (2, 0,
    1 and 3 rows from ranks 0-3) and the list of the buffers it received into."""
    from gnnc.plan.halo import HaloPlan
    from gnnc.runtime import comm
    from test_comm import rank_1_of_4_posting_by

    received: list[torch.Tensor] = []

    def post(self, ops):
        for op in ops:
            if op.op is comm.dist.irecv:
                op.tensor.fill_(float(op.peer))
                received.append(op.tensor)
        return []

    rank_1_of_4_posting_by(monkeypatch, post)
    plan = HaloPlan(send_idx=(torch.tensor([0]), torch.tensor([], dtype=torch.long), torch.tensor([1]),
                              torch.tensor([0, 1])), recv_counts=(2, 0, 1, 3))
    return plan, received


def test_a_halo_exchange_receives_every_peers_rows_into_its_result(monkeypatch) -> None:
    """The received rows are the exchange's result, not joined by a copy after the receives (two [halo, width]
    tensors at once: 0.9 GiB of a GCN rank's hidden layer at products' size)."""
    from gnnc.runtime import comm

    plan, received = _rank_1_of_4_receiving(monkeypatch)
    op = comm._HaloExchange(plan, comm.CommStats(), "layer0", None, "ring")
    op.forward_start(torch.arange(6.0).view(2, 3))
    out = op.forward_finish()
    assert torch.equal(out, torch.tensor([[0.0] * 3] * 2 + [[2.0] * 3] + [[3.0] * 3] * 3))
    assert all(_storage(r) == _storage(out) for r in received)


@pytest.mark.parametrize("grad", [False, True])
def test_an_evaluations_halo_receives_beside_the_held_rows_with_no_concatenation(monkeypatch, grad: bool) -> None:
    """Without autograd (an evaluation, whose layer-wise chunks read each halo whole) a rank's halo value is one
    buffer: the held rows copied in front, every peer's rows received behind them. Joined by a concatenation, the
    held rows, the received ones and the result were alive at once: 1.9 GiB of a GCN rank's peak at ogbn-products'
    size on 2 ranks. Training joins them as before (autograd splits the gradient at the concatenation)."""
    from types import SimpleNamespace

    from gnnc import api
    from gnnc.runtime import comm
    from gnnc.runtime.distributed import Exchange

    plan, received = _rank_1_of_4_receiving(monkeypatch)
    graph = api.load_graph("rmat:n=400,deg=8,features=6,classes=3,seed=0")
    program = api.compile(api.load_model("examples/gcn.gnn"), graph, workers=2, strategy="depcomm").program
    e = next(e for layer in program.graph_layers() for e in layer.eqns if e.op == "halo")
    rank = SimpleNamespace(layer=SimpleNamespace(n_in=2, halo=plan), stats=comm.CommStats())
    x = torch.arange(6.0).view(2, 3).requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = Exchange._halo(rank, x, e)
    want = torch.tensor([[0.0, 1, 2], [3, 4, 5]] + [[0.0] * 3] * 2 + [[2.0] * 3] + [[3.0] * 3] * 3)
    assert torch.equal(out.detach(), want)
    assert all((_storage(r) == _storage(out)) is not grad for r in received)


def test_the_check_before_loading_prices_the_launchers_reading_and_the_ranks_apart(monkeypatch) -> None:
    """The launcher reads and partitions the graph before the ranks start and lets go of what it derived before they
    do: a run is refused before loading only if either phase cannot fit, not their sum (at ogbn-products' size,
    GCN 256 on 2 ranks: ranks >= 17.3 GiB + store 6.5 GiB refused on the 24 GiB machine)."""
    from gnnc import api, memory_check
    from gnnc.host import AvailableMemory

    counts = memory_check.graph_counts("rmat:n=2000,deg=10,features=16,classes=4,seed=0")
    program = api.compile(api.load_model("examples/gcn.gnn", hidden=64), memory_check.stand_in_graph(counts)).program
    monkeypatch.setattr(memory_check, "available_memory", lambda: None)
    ranks = memory_check.check_ranks_before_loading(program, counts, 2).total
    room = max(ranks, counts.launcher_bytes) + 1
    assert room < ranks + counts.launcher_bytes
    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(room, "a test's memory"))
    memory_check.check_ranks_before_loading(program, counts, 2)  # admitted
    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(ranks - 1, "a test's memory"))
    with pytest.raises(GnncError, match="refused before loading it"):
        memory_check.check_ranks_before_loading(program, counts, 2)


def test_a_stores_graph_keeps_the_csr_it_stored_when_the_launcher_lets_go(tmp_path) -> None:
    """What the launcher drops is what it derived: a store's mapped CSR stays (sorting the edges again to rebuild it
    might order a row's entries otherwise), with the mappings it reads."""
    from conftest import random_graph
    from gnnc import api
    from gnnc.graph.store import array_file, mapped_files, stored_structure, write_store
    from gnnc.runtime.distributed import let_go_of_graph

    write_store(random_graph(n=300, e=4000, f=4, c=3, seed=4), tmp_path / "g")
    graph = api.load_graph(str(tmp_path / "g"))
    stored = graph.csr("plain")
    graph.gcn_norm("self_loops")
    let_go_of_graph(graph)
    # the maps, the files they map (array_file), the store's directory and the CSR: what a plan's ranks build their
    # structures and read their features from (gnnc.plan.shards.store_source)
    assert mapped_files(graph) and len(graph._views) == 4 and graph.csr("plain") is stored
    assert array_file(graph, "x", graph.x) is not None and stored_structure(graph) is not None


def test_the_precheck_prices_a_ranks_part_columns_at_int32(tmp_path, monkeypatch) -> None:
    """The pre-check's graph bytes of a rank follow narrow_part_sources: 4 bytes less per edge of a structure its
    split exchange holds by source parts (GCN's overlapped depcomm halo), none where no exchange is split
    (depcache: no halo)."""
    from gnnc import api, memory_check
    from gnnc.plan.shard_files import read_manifest

    graph = api.load_graph("rmat:n=400,deg=8,features=6,classes=3,seed=0")
    for strategy, split in (("depcomm", True), ("depcache", False)):
        plan = api.compile(api.load_model("examples/gcn.gnn"), graph, workers=2, strategy=strategy)
        out = tmp_path / strategy
        plan.write_shards(out)
        manifest = read_manifest(out)
        got = [p.graph_bytes for p in memory_check.shard_counts(plan.program, manifest)]
        monkeypatch.setattr(memory_check, "NARROWED_COLUMN_BYTES", 0)
        wide = [p.graph_bytes for p in memory_check.shard_counts(plan.program, manifest)]
        monkeypatch.undo()
        nnz = [entry["layout"]["layers"]["l0"]["nnz"] for entry in manifest["shards"]]
        assert [w - g for w, g in zip(wide, got)] == [4 * n if split else 0 for n in nnz]
