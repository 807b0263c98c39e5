"""`gnnc probe`: measure this machine for the cost model and write a `local` cluster profile.

GEMM rate (FP32 FLOP/s of one worker's threads), SpMM rate (edge-feature
multiply-adds per second through the kernels gnnc uses), memory bandwidth (a
large copy), and gloo's latency and bandwidth between two local processes
(half the round-trip time of a small message; a large message's size over
its one-way time). Each figure is the median of several timed repetitions
after a warm-up. NeutronStar's T_v, T_e, T_c are not fitted yet: the profile
leaves them unset, so the rates above are used.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from gnnc.runtime.launch import DistConfig, launch


def _median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_rate(threads: int, n: int = 1024) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n**3 / _median_time(lambda: a @ b)


def spmm_rate(threads: int, n: int = 100_000, deg: int = 10, width: int = 64) -> float:
    from gnnc.runtime.graph import CSR
    from gnnc.runtime.kernels import spmm

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (n * deg,), generator=g), torch.randint(0, n, (n * deg,), generator=g)
    csr = CSR.from_edges(src.numpy(), dst.numpy(), n)
    x = torch.randn(n, width)
    return csr.nnz * width / _median_time(lambda: spmm(csr, x))


def memory_bandwidth(threads: int, mib: int = 256) -> float:
    torch.set_num_threads(threads)
    a = torch.empty(mib * 2**20 // 4)
    b = torch.empty_like(a)
    return 2.0 * a.numel() * 4 / _median_time(lambda: b.copy_(a))  # read + write


def _pingpong(cfg: DistConfig, sizes: list[int], repeats: int) -> dict[int, float]:
    """Rank 0 sends `size` floats to rank 1, which sends them back; median one-way seconds."""
    out = {}
    for size in sizes:
        buf = torch.zeros(size)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if cfg.rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i:
                times.append((time.perf_counter() - t0) / 2)
        out[size] = statistics.median(times)
    return out


def link(repeats: int = 10) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of gloo between two processes on this machine."""
    small, large = 1, 4 * 2**20
    times = launch(_pingpong, 2, [small, large], repeats)[0]
    latency = times[small]
    return latency, large * 4 / max(times[large] - latency, 1e-9)


def probe(threads: int | None = None) -> dict:
    """Every measurement, as the fields of a ClusterProfile."""
    threads = threads or max(1, torch.get_num_threads())
    latency, bandwidth = link()
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"name": "local", "workers": 1, "devices_per_node": 1, "intra_bandwidth": bandwidth,
            "inter_bandwidth": bandwidth, "latency": latency, "topology": "loopback (gloo)",
            "memory_per_worker": float(pages), "memory_bandwidth": memory_bandwidth(threads),
            "gemm_rate": gemm_rate(threads), "spmm_rate": spmm_rate(threads),
            "description": f"this machine as measured by gnnc probe ({threads} threads, {os.cpu_count()} cores)"}
