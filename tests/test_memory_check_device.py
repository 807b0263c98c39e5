"""On CUDA the memory pre-check compares a run's device terms with its GPU's free memory (issue 35, item 3).

This machine has no GPU: torch.cuda.mem_get_info and the host's figure are monkeypatched, so the decision is the
check's alone. Before the fix a CUDA run was compared with host RAM only: a run that fits the host but not the
GPU started, and one that fits the GPU but whose activations exceed host RAM was refused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
from gnnc import api, memory_check
from gnnc.errors import GnncError
from gnnc.host import AvailableMemory

GCN = str(EXAMPLES / "gcn.gnn")


@pytest.fixture
def plan_and_graph(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    n = 40
    src = np.arange(n)
    ei = np.stack([np.concatenate([src, (src + 1) % n]), np.concatenate([(src + 1) % n, src])])
    np.savez(tmp_path / "ring.npz", edge_index=ei, x=np.ones((n, 5), np.float32), y=np.arange(n) % 3)
    graph = api.load_graph(str(tmp_path / "ring.npz"))
    return api.compile(api.load_model(GCN, hidden=64), graph), graph


def fake(monkeypatch, host: float, gpu: dict[int, float]) -> list[int]:
    """Host RAM `host` bytes (nothing held yet); GPU i has gpu[i] bytes free. Returns the GPUs asked."""
    asked: list[int] = []

    def mem_get_info(index: int = 0) -> tuple[int, int]:
        asked.append(index)
        return int(gpu[index]), int(80 * 2 ** 30)

    monkeypatch.setattr(memory_check, "available_memory", lambda: AvailableMemory(int(host), "test host"))
    monkeypatch.setattr(memory_check, "resident_bytes", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return asked


def test_a_run_that_does_not_fit_the_gpu_is_refused_though_the_host_has_room(plan_and_graph, monkeypatch) -> None:
    plan, graph = plan_and_graph
    est = memory_check.estimate_run_memory(plan, graph=graph)
    on_device = est.peak - est.terms["process"]
    asked = fake(monkeypatch, host=100 * est.total, gpu={0: on_device / 2})
    with pytest.raises(GnncError, match=r"on its GPU, more than the .* \(free on cuda:0, torch.cuda.mem_get_info\)"):
        memory_check.check_run_memory(plan, graph=graph, device="cuda")
    assert asked == [0]
    memory_check.check_run_memory(plan, graph=graph, device="cpu")  # on the CPU the host's room is what counts


def test_a_run_that_fits_the_gpu_is_not_refused_for_the_host(plan_and_graph, monkeypatch) -> None:
    """The activations, parameters and optimizer state live on the GPU: the host needs the interpreter and the
    graph only."""
    plan, graph = plan_and_graph
    est = memory_check.estimate_run_memory(plan, graph=graph)
    host_part = est.terms["process"] + est.terms["graph"]
    # room for the host's part and half of the rest: on the CPU the run cannot fit, on a GPU it can
    fake(monkeypatch, host=host_part + (est.total - host_part) / 2, gpu={0: 10 * est.total})
    memory_check.check_run_memory(plan, graph=graph, device="cuda", warn=lambda line: None)
    with pytest.raises(GnncError, match="test host"):
        memory_check.check_run_memory(plan, graph=graph, device="cpu")


def test_close_to_the_gpu_warns(plan_and_graph, monkeypatch) -> None:
    plan, graph = plan_and_graph
    est = memory_check.estimate_run_memory(plan, graph=graph)
    fake(monkeypatch, host=100 * est.total, gpu={0: (est.peak - est.terms["process"]) / 0.9})
    warned: list[str] = []
    memory_check.check_run_memory(plan, graph=graph, device="cuda", warn=warned.append)
    assert len(warned) == 1 and "on cuda:0, 90% of the" in warned[0]


def test_each_rank_is_checked_against_its_own_gpu(plan_and_graph, monkeypatch, tmp_path: Path) -> None:
    plan, graph = plan_and_graph
    dist = api.compile(api.load_model(GCN, hidden=64), graph, workers=2)
    dist.parts = api.partition_vertices(graph, 2, dist.meta.partition.method, 0)
    dist.write_shards(tmp_path / "shards")
    est = memory_check.estimate_run_memory(dist, shard_dir=tmp_path / "shards")
    need = [p - est.terms["process"] for p in est.per_process]
    asked = fake(monkeypatch, host=100 * est.total, gpu={0: 10 * max(need), 1: need[1] / 2})
    with pytest.raises(GnncError, match=r"rank 1 of this run .* \(free on cuda:1"):
        memory_check.check_run_memory(dist, shard_dir=tmp_path / "shards", device="cuda")
    assert asked == [0, 1]
