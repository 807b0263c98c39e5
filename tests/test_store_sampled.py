"""Sampled minibatch training from the memory-mapped graph store (issue 34 item 4): one process reads its features
through the store's mapping and N processes through their shards' mapped feature files, gathering only the rows
each minibatch samples. The anonymous memory a run adds (RssAnon: what is not a mapped file's pages) stays well
below the features' size, and the losses are those of the same run from the graph in memory."""
from __future__ import annotations

import gc
import json
import math

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.errors import PlanError
from gnnc.graph import Graph
from gnnc.graph.sampling import SamplingConfig
from gnnc.graph.store import write_store
from gnnc.ir.text import parse_ir
from gnnc.plan.sampled_shards import load_sampled_rank
from gnnc.runtime.launch import DistConfig, launch
from gnnc.runtime.minibatch import MinibatchWorker
from gnnc.runtime.minibatch_dist import DistMinibatchWorker, SampledJob
from gnnc.runtime.train import TrainConfig, make_optimizer

N, F, E = 100_000, 256, 200_000  # features 100 MB (float32), each rank's share of them 50 MB
SAMPLING = SamplingConfig((5, 5), 500)
STRATEGIES = ("pushpull", "dp-sample")
SEED = 0


def _anon() -> int:
    """This process's resident anonymous memory in bytes (mapped files' pages are RssFile, not counted)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def _graph() -> Graph:
    rng = np.random.default_rng(0)
    train = torch.zeros(N, dtype=torch.bool)
    train[rng.choice(N, 2000, replace=False)] = True
    none = torch.zeros(N, dtype=torch.bool)
    return Graph(N, rng.integers(0, N, E).astype(np.int32), rng.integers(0, N, E).astype(np.int32),
                 torch.from_numpy(rng.standard_normal((N, F), dtype=np.float32)),
                 torch.from_numpy(rng.integers(0, 8, N)), train, none, none.clone(), name="mapped")


def _epoch(worker, program, cfg: TrainConfig) -> float:
    params = worker.initial_params(SEED)  # a push-pull rank: its slice's rows of W1
    loss = worker.train_epoch(params, make_optimizer(program, params, cfg), 0)
    return float(worker.sum(loss.reshape(1).float())[0]) if worker.world_size > 1 else float(loss)


def _measure(cfg: DistConfig, jobs: list[SampledJob], store: str, one: tuple[str, TrainConfig]) -> list[dict]:
    """Each job's epoch on 2 ranks, then (rank 0) one process from the store: the loss and the anonymous memory
    that loading the data and training one epoch added, with the worker still alive."""
    warm = torch.nn.Parameter(torch.zeros(1))  # the optimizer's modules imported before anything is measured
    opt = make_optimizer(parse_ir(one[0]), {"w": warm}, one[1])
    (warm * 2).sum().backward()
    opt.step()
    out = []
    for job in jobs:
        gc.collect()
        before = _anon()
        w = DistMinibatchWorker(cfg, job)
        loss = _epoch(w, w.program, job.train)
        out.append({"loss": loss, "added": float(_anon() - before), "share": float(w.features.numel() * 4)})
        del w
    if cfg.rank == 0:
        gc.collect()
        before = _anon()
        graph = api.load_graph(store)
        program = parse_ir(one[0])
        w = MinibatchWorker(program, graph, one[1], SAMPLING)
        loss = _epoch(w, program, one[1])
        out.append({"loss": loss, "added": float(_anon() - before), "share": float(N * F * 4)})
    return out


@pytest.mark.slow  # 100 MB of features written, compiled for 2 ranks twice and trained 3 times: 25-90 s
def test_sampled_runs_from_the_store_gather_only_the_sampled_rows_and_train_as_from_memory(tmp_path) -> None:
    graph = _graph()
    store = tmp_path / "store"
    write_store(graph, store)
    model = api.load_model(EXAMPLES / "sage.gnn")
    plan = api.compile(model, graph, sampling=SAMPLING, seed=SEED)
    cfg = TrainConfig.resolve(plan.program, seed=SEED)
    want = _epoch(MinibatchWorker(plan.program, graph, cfg, SAMPLING), plan.program, cfg)  # from memory
    del graph
    gc.collect()
    mapped = api.load_graph(str(store))
    jobs = []
    for strategy in STRATEGIES:
        dist_plan = api.compile(model, mapped, workers=2, strategy=strategy, partition="hash", sampling=SAMPLING,
                                seed=SEED)
        dist_plan.write_shards(tmp_path / strategy)
        jobs.append(SampledJob(str(dist_plan.program), str(tmp_path / strategy),
                               TrainConfig.resolve(dist_plan.program, seed=SEED), SAMPLING))
    del mapped
    ranks = launch(_measure, 2, jobs, str(store), (str(plan.program), cfg))
    *runs, one = ranks[0]
    print("\n".join(f"rank {r}: " + ", ".join(f"{k} {v['loss']:.6f}, added {v['added'] / 2**20:.1f} MiB of "
                                                f"{v['share'] / 2**20:.1f}" for k, v in zip((*STRATEGIES, "one"), got))
                     for r, got in enumerate(ranks)) + f"\nfrom memory {want:.6f}")
    assert one["loss"] == want  # the same rows, gathered from the mapping: the same sums
    assert one["added"] < one["share"] / 4, f"one process added {one['added'] / 2**20:.1f} MiB of anonymous memory"
    for rank, got in enumerate(ranks):
        for strategy, run in zip(STRATEGIES, got):
            assert math.isclose(run["loss"], want, rel_tol=1e-5), (strategy, run["loss"], want)
            # a rank that read its whole share into memory adds the share and the structure (71.6 MiB here before
            # the shards' features were mapped); mapped, the structure and a minibatch's rows (7-23 MiB)
            assert run["added"] < 0.75 * run["share"], (
                f"rank {rank} ({strategy}) added {run['added'] / 2**20:.1f} MiB of anonymous memory; its share of "
                f"the features is {run['share'] / 2**20:.1f} MiB")


def test_a_damaged_or_misnamed_features_file_of_a_sampled_shard_is_refused_naming_it(tmp_path) -> None:
    graph = random_graph(n=60, e=300, f=8, seed=1)
    plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), graph, workers=2, strategy="pushpull",
                       sampling=SAMPLING, seed=SEED)
    plan.write_shards(tmp_path)
    assert load_sampled_rank(tmp_path, 1, 2).features.shape == (60, 4)
    x = tmp_path / "rank-00001.x.npy"
    x.write_bytes(x.read_bytes()[:-8])
    with pytest.raises(PlanError, match=r"rank-00001\.x\.npy: x: .* truncated or altered"):
        load_sampled_rank(tmp_path, 1, 2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"][0]["x"]["file"] = "../rank-00001.x.npy"  # a path from the manifest is never opened
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PlanError, match=r"rank 0's shard entry must describe its features as rank-00000\.x\.npy"):
        load_sampled_rank(tmp_path, 0, 2)
