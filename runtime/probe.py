"""`gnnc probe`: measure this machine for the cost model and write a `local` cluster profile.

GEMM rate (FP32 FLOP/s of one worker's threads), SpMM rate (edge-feature
multiply-adds per second through the kernels gnnc uses), memory bandwidth (a
large copy), and gloo's latency and bandwidth between two local processes
(half the round-trip time of a small message; a large message's size over
its one-way time). Each figure is the median of several timed repetitions
after a warm-up. The profile offers one worker per core: `gnnc run --nproc N`
runs its workers as processes on this machine.

NeutronStar's T_v, T_e, T_c (seconds per vertex computed, per edge
aggregated, per row communicated: the constants of its Algorithm 4 and
Eq. 1-3) need more, because the rates above time bare kernels while a
training step pays for everything gnnc's executor does around them. A short
test training times each layer of a 2-layer GCN (forward plus backward,
through `Interpreter.run_layer`, single process) on generated R-MAT graphs
whose vertex and edge counts vary independently (the fastest of a few
repetitions each): `probe_layer_samples`. This module only measures; the
fit lives beside the cost model (gnnc.passes.cost.fit), and `gnnc probe`
(gnnc.cli) runs one, then the other.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Callable

import torch
import torch.distributed as dist

from gnnc.graph import CSR
from gnnc.graph.generators import rmat
from gnnc.runtime.executor import init_params
from gnnc.runtime.kernels import spmm
from gnnc.runtime.launch import DistConfig, launch
from gnnc.runtime.train import TrainConfig, Worker


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


# --- NeutronStar's unit costs ---------------------------------------------------------------------

# The test model: examples/gcn.gnn's GCN without dropout (dropout's cost is not a layer's).
PROBE_MODEL = """
layer GCNConv(in, out) with self_loops {
  transform t = linear(h, out, bias = false)
  scatter   m = edge.gcn_norm * src.t
  gather    a = sum(m)
  sync      s = sum(a)
  apply     h = bias(s)
}

model ProbeGCN(features, hidden, classes) {
  h = GCNConv(features, hidden)(x)
  h = relu(h)
  h = GCNConv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
PROBE_WIDTHS = (128, 64, 16)  # features, hidden, classes: a wide first layer and a narrow second
# (vertices, average degree) of the test graphs: both counts vary, and not in proportion, so the
# fit can tell per-vertex from per-edge time. They are large enough that the rows do not fit in a
# core's caches, as in the runs worth distributing: graphs of 2,000-6,000 vertices, first tried,
# fitted per-edge costs 5x below what a 100,000-vertex layer pays for its cache-missing gathers.
PROBE_GRAPHS = ((30000, 4.0), (30000, 16.0), (90000, 4.0), (90000, 10.0))


def layer_times(program, graph, repeats: int = 5) -> list[float]:
    """Seconds of one forward plus backward (the fastest of `repeats`) of each graph layer of `program` on `graph`.

    Each layer runs alone through gnnc's executor (`Interpreter.run_layer`) on the inputs a training
    step gives it (the layers before it run first), with the gradient flowing where it would in
    training: to the weights always, to the input unless the layer reads the input features.
    """
    worker = Worker(program, graph, TrainConfig(progress=False))
    params = init_params(program, 0)
    ctx = worker.context(True, 0)
    env = dict(worker.inputs)
    seen = dict(worker.inputs)  # every layer's outputs: the interpreter lets go of a value after its last reader
    with torch.no_grad():
        for layer in program.layers:
            worker.interp.run_layer(layer, env, params, ctx)
            seen.update({v.name: env[v.name] for v in layer.outputs})
    env = seen
    inputs = {v.name for v in program.inputs}
    out = []
    for layer in program.graph_layers():
        grad = torch.ones_like(env[layer.outputs[0].name])

        def step(layer=layer, grad=grad) -> None:
            local = {v.name: env[v.name].detach().requires_grad_(v.name not in inputs and env[v.name].is_floating_point())
                     for v in layer.inputs}
            worker.interp.run_layer(layer, local, params, ctx)
            local[layer.outputs[0].name].backward(grad)
            for p in params.values():
                p.grad = None

        out.append(_min_time(step, repeats=repeats))
    return out


def _min_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """The fastest of `repeats` timed calls: what a layer costs when nothing else interrupts it.

    The fit needs the cost, not this moment's contention: on shared cores a slow repetition was
    interrupted, and the interruptions would land in the fit as noise larger than the effects.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def probe_layer_samples(compile_program: Callable[[object], object], threads: int,
                        graphs: Sequence[tuple[int, float]] = PROBE_GRAPHS, widths: tuple[int, int, int] = PROBE_WIDTHS,
                        repeats: int = 3) -> tuple[object, list[tuple[int, list[int], list[float]]]]:
    """Time PROBE_MODEL's layers on each test graph: (the program, [(V, E per layer, seconds per layer)]).

    `compile_program(graph)` compiles PROBE_MODEL with these widths for a graph (the caller's: the
    runtime does not compile); the first graph's program serves every graph.
    """
    torch.set_num_threads(threads)
    features, _, classes = widths
    program = None
    samples: list[tuple[int, list[int], list[float]]] = []
    for seed, (n, deg) in enumerate(graphs):
        graph = rmat(n, deg, features=features, classes=classes, seed=seed)
        program = program or compile_program(graph)
        edges = [graph.csr(layer.edges).nnz for layer in program.graph_layers()]
        samples.append((graph.num_nodes, edges, layer_times(program, graph, repeats)))
    return program, samples


def machine_fields(threads: int) -> dict:
    """The machine's own figures (kernel rates, memory), as ClusterProfile fields."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"memory_per_worker": float(pages), "memory_bandwidth": memory_bandwidth(threads),
            "gemm_rate": gemm_rate(threads), "spmm_rate": spmm_rate(threads)}


def probe(threads: int) -> dict:
    """Every measurement of the machine itself (kernel rates, memory, the link), as ClusterProfile fields."""
    latency, bandwidth = link()
    # `gnnc run --nproc N` runs its workers as processes on this one machine: one per core at most
    workers = max(1, os.cpu_count() or 1)
    return {"name": "local", "workers": workers, "devices_per_node": workers, "intra_bandwidth": bandwidth,
            "inter_bandwidth": bandwidth, "latency": latency, "topology": "loopback (gloo)",
            **machine_fields(threads),
            "description": f"this machine as measured by gnnc probe ({threads} threads, {os.cpu_count()} cores)"}
