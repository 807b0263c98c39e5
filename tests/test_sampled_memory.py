"""A sampled run's memory at papers100M's size (issue 34 items 4/5): a rank samples from the memory-mapped CSR its
plan's shards hold once (not from an edge list read into every rank's memory, and a CSR sorted from it), drawing
exactly the edges it drew before; the evaluation of a sampled run covers the labelled vertices only, on sampled
blocks, in batches (not every vertex with whole layers), and does not depend on which batch or rank evaluates a
vertex."""
from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.graph import CSR, Graph
from gnnc.graph import sampling
from gnnc.graph.sampling import NeighbourSampler, SamplingConfig, SamplingView
from gnnc.graph.storage import UNLABELLED
from gnnc.graph.store import mapped_files, write_store
from gnnc.plan import sampled_shards
from gnnc.plan.sampled_shards import load_sampled_rank
from gnnc.runtime.executor import init_params
from gnnc.runtime import minibatch
from gnnc.runtime.minibatch import EVALUATION, MinibatchWorker, gather_rows
from gnnc.runtime.minibatch_dist import DistMinibatchWorker
from gnnc.runtime.train import TrainConfig

SAMPLING = SamplingConfig((3, 2), 16)


def _edge_list_view(graph: Graph, view: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sampler's candidates as it built them before: a CSR sorted from the view's edge list, loops set apart."""
    n = graph.num_nodes
    csr = CSR.from_edges(*graph.edges(view), n)
    indptr, indices, eids = csr.indptr.numpy(), csr.indices.numpy(), csr.eids.numpy()
    if view == "self_loops":
        keep = eids < graph.num_edges - int(np.count_nonzero(graph.src == graph.dst))
        counts = np.bincount(np.repeat(np.arange(n), np.diff(indptr))[keep], minlength=n)
        indptr, indices, eids = np.concatenate([[0], np.cumsum(counts)]), indices[keep], eids[keep]
    return indptr, indices, eids


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("view", ["plain", "self_loops"])
def test_the_sampler_reads_from_the_plain_csr_the_candidates_of_the_edge_list(view: str, loops: bool) -> None:
    graph = random_graph(n=90, e=700, seed=2)  # self-loops and duplicate edges
    if not loops:
        keep = graph.src != graph.dst
        graph = Graph(graph.num_nodes, graph.src[keep], graph.dst[keep], graph.x, graph.y, graph.train_mask,
                      graph.val_mask, graph.test_mask)
    got = SamplingView(graph, view)
    for name, a, b in zip(("indptr", "indices", "eids"), (got.indptr, got.indices, got.eids),
                          _edge_list_view(graph, view)):
        assert np.array_equal(a, b), (view, name)
    assert ("csr", "self_loops") not in graph._views  # nothing built from the edge list


def _blocks(sampler: NeighbourSampler, seeds: np.ndarray) -> list[np.ndarray]:
    out = []
    for index in range(3):
        for block in sampler.sample(seeds, 1, index).blocks:
            out += [block.src_ids, block.indptr, block.indices, block.eids]
    return out


def test_a_sampled_rank_samples_from_its_shards_mapped_csr_the_edges_one_process_draws(tmp_path) -> None:
    """Before, each rank's .npz held the edge list (src, dst, int64), read whole, and the sampler sorted a CSR from
    it: 32 bytes per edge in every rank's memory. Now the shards hold the CSR once, read-only mapped by each rank."""
    graph = random_graph(n=90, e=700, seed=4)
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, workers=2, strategy="dp-sample",
                       sampling=SAMPLING, seed=0)
    plan.write_shards(tmp_path)
    with np.load(tmp_path / "rank-00001.npz") as npz:
        assert {"src", "dst"}.isdisjoint(npz.files)
    rank = load_sampled_rank(tmp_path, 1, 2).graph
    csr = rank.csr("plain")
    spans = [(a, a + len(m)) for m in mapped_files(rank) for a in [np.frombuffer(m, np.uint8).ctypes.data]]
    for t in (csr.indptr, csr.indices, csr.eids, torch.from_numpy(rank.src), torch.from_numpy(rank.dst)):
        assert any(lo <= t.data_ptr() < hi for lo, hi in spans)  # over a mapped file, not a copy in memory
    seeds = np.arange(0, 87, 3)
    for view in ("plain", "self_loops"):  # gcn.gnn's layers read self_loops: its candidates from the plain CSR
        want = _blocks(NeighbourSampler(graph, [view, view], [3, 2], 7), seeds)
        got = _blocks(NeighbourSampler(rank, [view, view], [3, 2], 7), seeds)
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), view


def _partly_labelled(seed: int) -> Graph:
    graph = random_graph(n=120, e=900, seed=seed)
    unlabelled = torch.arange(graph.num_nodes) % 3 == 0  # as papers100M's: in no mask, label UNLABELLED
    for m in (graph.train_mask, graph.val_mask, graph.test_mask):
        m[unlabelled] = False
    graph.y[unlabelled] = UNLABELLED
    return graph


def test_a_sampled_run_evaluates_its_labelled_vertices_only_and_says_so() -> None:
    """Before, one process evaluated every vertex with whole [N, width] layers (56 GiB projected at papers100M/10)
    and reported logits for every vertex."""
    graph = _partly_labelled(5)
    labelled = np.nonzero((graph.train_mask | graph.val_mask | graph.test_mask).numpy())[0]
    result = api.run(api.load_model(EXAMPLES / "sage.gnn"), graph, epochs=2, sampling=SAMPLING, seed=0)
    assert result.evaluation == EVALUATION and result.to_json()["evaluation"] == EVALUATION
    assert result.logits.shape == (len(labelled), graph.num_classes)
    hit = (result.logits.argmax(1) == graph.y[labelled]).numpy()
    test = graph.test_mask.numpy()[labelled]
    assert result.final_test_acc == pytest.approx(hit[test].mean())
    full = api.run(api.load_model(EXAMPLES / "sage.gnn"), graph, epochs=1, seed=0)
    assert full.evaluation == "every vertex, full neighbourhood"


def test_the_evaluation_draws_the_same_blocks_for_a_vertex_whatever_its_batch(monkeypatch) -> None:
    """The evaluation's sampling is one stream per epoch, so its batch size (and, on ranks, which rank holds a
    vertex) changes no logit."""
    monkeypatch.setattr(minibatch, "EVAL_SEEDS", 1)  # batches of the batch size: 16 against 1000
    graph = _partly_labelled(6)
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, sampling=SAMPLING, seed=0)
    cfg = TrainConfig.resolve(plan.program, seed=0)
    params = init_params(plan.program, 0)
    small, _ = MinibatchWorker(plan.program, graph, cfg, SAMPLING).forward(params, False, 3)
    large, _ = MinibatchWorker(plan.program, graph, cfg, SamplingConfig((3, 2), 1000)).forward(params, False, 3)
    assert small.shape[0] == int((graph.train_mask | graph.val_mask | graph.test_mask).sum())
    assert torch.allclose(small, large, atol=1e-6)
    other, _ = MinibatchWorker(plan.program, graph, cfg, SAMPLING).forward(params, False, 4)
    assert not torch.allclose(small, other, atol=1e-6)  # each epoch's evaluation draws afresh


@pytest.mark.slow  # two rank processes: ~30 s on the shared machine
def test_two_ranks_evaluate_the_labelled_vertices_as_one_process() -> None:
    graph = _partly_labelled(7)
    model = api.load_model(EXAMPLES / "sage.gnn")
    one = api.run(model, graph, epochs=2, sampling=SAMPLING, seed=0)
    for strategy in ("dp-sample", "pushpull"):
        two = api.run(model, graph, epochs=2, sampling=SAMPLING, seed=0, nproc=2, strategy=strategy)
        assert two.evaluation == EVALUATION and two.logits.shape == one.logits.shape, strategy
        assert torch.allclose(two.logits, one.logits, rtol=1e-4, atol=1e-4), strategy
        assert two.final_test_acc == one.final_test_acc, strategy


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _peak_from_here(graph: Graph) -> int:
    """VmRSS, with the store's pages let go and VmHWM reset: what a step grows VmHWM by is then its own peak."""
    for pages in mapped_files(graph):
        pages.madvise(mmap.MADV_DONTNEED)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def test_a_minibatch_gathers_a_mapped_x_a_region_at_a_time(tmp_path, monkeypatch) -> None:
    """The kernel maps a page cache's large folios whole, so x[ids] of a few thousand scattered rows made the whole
    mapped matrix resident (papers100M/10: 5.7 GB in every minibatch); gathered a region at a time, each region's
    pages let go after it, the peak grows by a region and the rows copied."""
    n, f = 131_072, 128  # x: 64 MiB
    rng = np.random.default_rng(0)
    none = torch.zeros(n, dtype=torch.bool)
    write_store(Graph(n, rng.integers(0, n, 1000), rng.integers(0, n, 1000),
                      torch.from_numpy(rng.standard_normal((n, f), dtype=np.float32)),
                      torch.zeros(n, dtype=torch.int64), none, none, none), tmp_path / "store")
    graph = api.load_graph(str(tmp_path / "store"))
    ids = rng.choice(n, 20_000)  # 10 MiB of rows, duplicates included
    want = graph.x[torch.from_numpy(ids)].clone()
    monkeypatch.setattr(sampling, "REGION_BYTES", 4 << 20)
    before = _peak_from_here(graph)
    got = gather_rows(graph.x, ids, graph)
    grown = _status("VmHWM") - before
    assert torch.equal(got, want)
    assert grown < 32 << 20, f"the gather's peak grew {grown / 2**20:.1f} MiB (x: 64 MiB, the rows: 10 MiB)"


def test_the_sampler_reads_a_mapped_csr_a_region_at_a_time(tmp_path, monkeypatch) -> None:
    """A minibatch's last hop reads CSR rows all over the graph, and the kernel maps a page cache's large folios
    whole: the mapped in-edge CSR (16 bytes per edge, 2.6 GB at papers100M/10) was resident in every process while
    it sampled, in its peak (one process, each rank). Read a region at a time, each region's pages let go, the
    peak grows by a region and the blocks; the blocks are those of the graph in memory."""
    n, e = 100_000, 1_500_000  # in.indices and in.eids: 12 MB each
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    none = torch.zeros(n, dtype=torch.bool)
    memory = Graph(n, src, dst, torch.zeros((n, 1)), torch.zeros(n, dtype=torch.int64), none, none, none)
    write_store(memory, tmp_path / "store")
    del src, dst
    graph = api.load_graph(str(tmp_path / "store"))
    monkeypatch.setattr(sampling, "REGION_BYTES", 1 << 20)
    seeds = rng.choice(n, 2000, replace=False)
    sampler = NeighbourSampler(graph, ["plain", "plain"], [5, 5], 3)
    before = _peak_from_here(graph)
    got = sampler.sample(seeds, 0, 0)
    grown = _status("VmHWM") - before
    want = NeighbourSampler(memory, ["plain", "plain"], [5, 5], 3).sample(seeds, 0, 0)
    for a, b in zip(got.blocks, want.blocks):
        for name in ("src_ids", "indptr", "indices", "eids"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert grown < 16 << 20, f"sampling's peak grew {grown / 2**20:.1f} MiB (the CSR: 24 MiB, the blocks: ~1 MiB)"


def test_a_rank_evaluates_its_share_of_an_evaluation_batch() -> None:
    """A rank evaluated batches of a whole evaluation batch (1024 seeds), twice the seeds a training step gives it;
    with Fennel keeping R-MAT's hubs in part 0, rank 0's were the largest blocks of the run: at papers100M/100 its
    peak 1.41 GiB against 1.16 in training (rank 1: 0.78). Each rank now takes its share, as in training."""
    w = object.__new__(DistMinibatchWorker)
    w.sampling, w.world_size = SamplingConfig((15, 10, 5), 1024), 2
    w.eval_ids = np.arange(0, 5000, 2)
    w.eval_most = 2600
    batches = w.eval_batches()
    assert max(len(b) for b in batches) == 512 and len(batches) == 6
    assert np.array_equal(np.concatenate(batches), w.eval_ids)


@pytest.mark.parametrize("strategy", ["dp-sample", "pushpull"])
def test_a_sampled_plans_shards_are_written_from_a_store_a_block_at_a_time(tmp_path, monkeypatch,
                                                                           strategy: str) -> None:
    """Written whole, a rank's features were an anonymous copy of its rows beside the whole mapped x.npy read to
    make it: the launcher of a 2-rank run from papers100M/100's store peaked at 1.13 GiB, above either rank
    (0.95), projected ~9 GiB at one tenth. Written a block at a time, the store's pages let go after each, its
    peak grows by a block; the files are the features' rows and columns."""
    n, f = 65_536, 256  # x: 64 MiB
    rng = np.random.default_rng(2)
    mask = torch.from_numpy(rng.random(n) < 0.1)
    write_store(Graph(n, rng.integers(0, n, 20_000), rng.integers(0, n, 20_000),
                      torch.from_numpy(rng.standard_normal((n, f), dtype=np.float32)),
                      torch.from_numpy(rng.integers(0, 4, n)), mask, mask.clone(), mask.clone()), tmp_path / "store")
    graph = api.load_graph(str(tmp_path / "store"))
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=2, strategy=strategy,
                       sampling=SAMPLING, seed=0)
    monkeypatch.setattr(sampled_shards, "BLOCK_BYTES", 4 << 20)
    monkeypatch.setattr(sampling, "REGION_BYTES", 4 << 20)
    before = _peak_from_here(graph)
    plan.write_shards(tmp_path / "shards")
    grown = _status("VmHWM") - before
    x = graph.x.numpy()
    for rank in range(2):
        got = load_sampled_rank(tmp_path / "shards", rank, 2).features.numpy()
        want = x[plan.parts == rank] if strategy == "dp-sample" else x[:, rank * f // 2:(rank + 1) * f // 2]
        assert np.array_equal(got, want), rank
    assert grown < 24 << 20, f"writing the shards grew the peak {grown / 2**20:.1f} MiB (x: 64 MiB)"


def test_a_sampled_plan_for_two_workers_loads_after_it_is_saved(tmp_path) -> None:
    """`gnnc compile --fanout ... --workers 2 -o PLAN` wrote the planner's predicted schedule of a sampled plan, which
    has none, as {}, and `gnnc run PLAN` refused it: "'planner.schedule' lacks 'time_s'" (exit 2)."""
    graph = random_graph(n=90, e=700, seed=8)
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=2, sampling=SAMPLING, seed=0)
    plan.save(tmp_path / "plan")
    again = api.Plan.load(tmp_path / "plan")
    assert again.sampling == plan.sampling and again.workers == 2
