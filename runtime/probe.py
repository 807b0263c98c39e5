"""`gnnc probe`: measure this machine for the cost model and write a `local` cluster profile.

GEMM rate (FP32 FLOP/s of one worker's threads), SpMM rate (edge-feature
multiply-adds per second through the kernels gnnc uses), memory bandwidth (a
large copy), and gloo's latency and bandwidth between two local processes
(half the round-trip time of a small message; a large message's size over
its one-way time). Each rate is the median of several timed samples after a
warm-up, each sample as many calls as fill 20 ms (`_median_time`); the link's
figures are medians of single round trips. The profile offers one worker per
core: `gnnc run --nproc N` runs its workers as processes on this machine.

`gnnc probe --device cuda` measures the GPUs instead (`gpu_profile`): the same
rates on GPU 0 (timed to completion of the GPU's work), plus the bf16 and fp16
dense rates and the 16-bit SpMM rate `--precision` prices, its memory, and
NCCL between GPUs 0 and 1 (on a single GPU, its pinned host link: there is no
peer); one worker per GPU, as `gnnc run --nproc N --device cuda` runs them.

NeutronStar's T_v, T_e, T_c (seconds per vertex computed, per edge
aggregated, per row communicated: the constants of its Algorithm 4 and
Eq. 1-3) need more, because the rates above time bare kernels while a
training step pays for everything gnnc's executor does around them. A short
test training times each layer of a 2-layer GCN (forward plus backward,
through `Interpreter.run_layer`, single process, each equation on its own as
a distributed rank runs it: no fused chain) on generated R-MAT graphs
whose vertex and edge counts vary independently (the median of a few
repetitions each: a run's epoch is the median of its epochs, on the same
shared cores): `probe_layer_samples`.

Every other op of an epoch (activations, bias, dropout, attention scores,
the loss, row copies around exchanges, the optimizer step) is timed too:
`probe_op_samples` runs each equation of PROBE_OPS_MODEL alone through the
executor, forward and backward, on the same graphs, and times row copies
and Adam steps of several sizes; the fit turns them into seconds per element
of each op class and per op dispatched (gnnc.cluster.OpRate). The dense
map's products and the aggregation are also timed alone at several widths
(`kernel_rate_samples`): their rates move with the widths, and the fit
prices each layer's kernels at its own (gnnc.cluster.KernelRate). Elementwise ops and the aggregation
are timed again at several working-set sizes (`size_rate_samples`): on rows that fit a cache they run
several times faster per element than at the sizes above, and the fit prices each op at its own working set
(gnnc.cluster.SizeRate). This module
only measures; the fit lives beside the cost model (gnnc.passes.cost.fit),
and `gnnc probe` (gnnc.cli) runs one, then the other.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Callable

import torch
import torch.distributed as dist

from gnnc.graph import CSR
from gnnc.graph.generators import rmat
from gnnc.runtime.comm import collective_device
from gnnc.runtime.device import place
from gnnc.runtime.executor import init_params
from gnnc.runtime.kernels import spmm
from gnnc.runtime.launch import DistConfig, launch
from gnnc.runtime import optim
from gnnc.runtime.train import TrainConfig, Worker

CPU = torch.device("cpu")


def _sync_for(device: torch.device) -> Callable[[], None]:
    """What makes a timing include the work it started: the GPU's queue drained on CUDA, nothing on CPU."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


# A timed sample lasts at least this long: several of the scheduler's slices. Two ranks sharing a core (4
# emulated hosts on 2 cores) each run at half speed on average, but a call shorter than a slice mostly runs
# whole inside one: the median of single short calls measured 73 GFLOP/s for dense maps there, as fast as
# on a core of its own (77), while the aggregation's rate, fitted to layer timings of tens of milliseconds,
# halved (2.3 against 5.8 G/s).
MIN_SAMPLE_S = 0.02
MAX_CALLS = 100_000

# What a timing waits for before it starts: nothing in one process; in `gnnc probe --network`, every rank
# (`timing_together`) for the timings of the probe's layers, so that the ranks time the same layer at the same
# moment, as a job's ranks run the same layer at once. Their memory traffic shares the machine's caches and
# bandwidth: on 2 emulated hosts the 256-wide aggregation of a DepCache rank's 162,000 edges took 7.1 ms alone
# and 10.6 to 16 ms with the other rank running its own, while the probe's ranks, each at its own point of the
# probe, had timed their layers near alone.
_start_together: Callable[[], None] = lambda: None


@contextlib.contextmanager
def timing_together(barrier: Callable[[], None]) -> Iterator[None]:
    """Within it, every timing (`_median_time`) of this process starts after `barrier()`: a collective that
    every rank of the job calls as often, since each runs the same probe."""
    global _start_together
    before, _start_together = _start_together, barrier
    try:
        yield
    finally:
        _start_together = before


def _median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
                 sync: Callable[[], None] = lambda: None) -> float:
    """Seconds of one call of `fn`: the median of `repeats` samples after `warmup` calls (at least one), each
    sample the mean of as many calls as fill MIN_SAMPLE_S (`sync` drains a GPU's queue). The median, as a run's
    epoch time is the median of its epochs; samples of many calls, so that on a core shared with another rank
    a rate is its throughput, as a run on it then gets."""
    _start_together()
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    once = (time.perf_counter() - t0) / max(warmup, 1)
    calls = min(MAX_CALLS, max(1, math.ceil(MIN_SAMPLE_S / max(once, 1e-9))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def gemm_rate(threads: int, n: int = 1024, device: torch.device = CPU, dtype: torch.dtype = torch.float32) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2.0 * n**3 / _median_time(lambda: a @ b, sync=_sync_for(device))


def spmm_rate(threads: int, n: int = 100_000, deg: int = 10, width: int = 64, device: torch.device = CPU,
              dtype: torch.dtype = torch.float32) -> float:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (n * deg,), generator=g), torch.randint(0, n, (n * deg,), generator=g)
    csr = place(CSR.from_edges(src.numpy(), dst.numpy(), n), device)
    x = torch.randn(n, width, device=device, dtype=dtype)
    return csr.nnz * width / _median_time(lambda: spmm(csr, x), sync=_sync_for(device))


# The widths the kernels are timed at (`kernel_rate_samples`): a dense map reads k-wide rows and writes n-wide
# ones, each of these; an aggregation runs on rows of each. Below 8 or above 256 a profile holds the edge's
# rate (the rates level off above 256; narrower maps are rare and cost little).
KERNEL_WIDTHS = (8, 16, 32, 64, 128, 256)
KERNEL_ROWS = 16384  # rows of the dense maps: a worker's share of the graphs worth distributing
KERNEL_GRAPH = (30000, 10.0)  # the aggregations' graph: PROBE_GRAPHS' size, so their rates are the fit's
# attention's aggregation (per-head edge values) is timed with GAT's usual 8 heads, at the per-head widths a
# hidden layer has (8 heads of 64 already make 512-wide rows)
ATTENTION_HEADS = 8
ATTENTION_WIDTHS = (8, 16, 32, 64)


def kernel_rate_samples(threads: int, device: str = "cpu", widths: Sequence[int] = KERNEL_WIDTHS,
                        rows: int = KERNEL_ROWS, graph: tuple[int, float] = KERNEL_GRAPH, repeats: int = 3,
                        attention: Sequence[tuple[int, int]] = tuple((ATTENTION_HEADS, n) for n in ATTENTION_WIDTHS),
                        ) -> list[dict]:
    """The kernels of a layer timed alone at several widths, as `kernel_rates` entries (gnnc.cluster.KernelRate):
    a dense map x[rows, k] @ W[k, n] forward ("gemm_f"), its weight gradient x^T @ g ("gemm_dw") and input
    gradient g @ W^T ("gemm_dx") for every k and n of `widths`, in FLOP/s; the aggregation (gnnc's SpMM with
    edge weights) forward ("spmm_f"), its transpose backward ("spmm_b") and the gradient of its edge values
    ("spmm_dw": a dot per edge, which attention's coefficients need) at every width, in edge-feature
    multiply-adds/s, on an R-MAT graph of `graph`'s size; the same with per-head edge values at each (heads,
    per-head width) of `attention` (k = heads; a head-blocked structure, another kernel).

    Why: one FLOP rate misprices a dense map writing 8-wide rows (a model's last layer) several times over
    against a 64-wide one, and the aggregation's rate also moves with its width and kernel.
    """
    torch.set_num_threads(threads)
    dev = torch.device(device if device != "cuda" else "cuda:0")
    sync = _sync_for(dev)
    out: list[dict] = []
    for k in widths:
        x = torch.randn(rows, k, device=dev)
        for n in widths:
            w, g = torch.randn(k, n, device=dev), torch.randn(rows, n, device=dev)
            flop = 2.0 * rows * k * n
            products = (("gemm_f", lambda: x @ w), ("gemm_dw", lambda: x.t() @ g), ("gemm_dx", lambda: g @ w.t()))
            for kernel, fn in products:
                out.append({"kernel": kernel, "k": k, "n": n, "rate": flop / _median_time(fn, repeats, sync=sync)})
    n_vertices, deg = graph
    csr = place(rmat(n_vertices, deg, features=1, classes=1, seed=0).csr("plain"), dev)
    shapes = [(0, n) for n in widths] + [(heads, n) for heads, n in attention]
    for heads, n in shapes:
        # heads 0: one value per edge (GCN's norms); else attention's per-head coefficients, [edges, heads]
        weight = torch.rand(csr.nnz, *((heads,) if heads else ()), device=dev)
        learned = weight.clone().requires_grad_()  # edge values with a gradient, as attention's
        x = torch.randn(csr.n_src, *((heads,) if heads else ()), n, device=dev, requires_grad=True)
        y = spmm(csr, x, weight)
        y_learned = spmm(csr, x.detach(), learned)
        g = torch.randn_like(y)
        work = float(csr.nnz * max(heads, 1) * n)
        forward = _median_time(lambda: spmm(csr, x.detach(), weight), repeats, sync=sync)
        backward = _median_time(lambda: torch.autograd.grad(y, x, g, retain_graph=True), repeats, sync=sync)
        edge_grad = _median_time(lambda: torch.autograd.grad(y_learned, learned, g, retain_graph=True), repeats,
                                 sync=sync)
        out += [{"kernel": "spmm_f", "k": heads, "n": n, "rate": work / forward},
                {"kernel": "spmm_b", "k": heads, "n": n, "rate": work / backward},
                {"kernel": "spmm_dw", "k": heads, "n": n, "rate": work / edge_grad}]
    return out


# The working sets `size_rate_samples` times at: rows of SIZE_WIDTH fp32 elements (elementwise ops), and R-MAT
# graphs of as many vertices at KERNEL_GRAPH's degree (the aggregation's source rows of SIZE_WIDTH). The largest
# is the reference, KERNEL_GRAPH's vertex count (the graph the width table and the op fit's first graph have):
# 7.7 MB at 64 wide, about this machine's last-level cache (8 MiB); 2,048 rows (0.5 MB) fit a core's L2 (1 MiB)
# as a Cora-sized worker's rows do; 8,192 (2 MB) lie between. Timed side by side in one run, so that their
# ratios are the machine's and not the load's between two runs.
SIZE_ROWS = (2048, 8192, KERNEL_GRAPH[0])
SIZE_WIDTH = 64


def size_rate_samples(threads: int, device: str = "cpu", rows: Sequence[int] = SIZE_ROWS, width: int = SIZE_WIDTH,
                      degree: float = KERNEL_GRAPH[1], repeats: int = 3, rounds: int = 3) -> list[dict]:
    """Seconds per unit of work of elementwise ops and of the aggregation at several working sets, as
    `size_rates` samples ({"kind", "rows", "width", "seconds"}; gnnc.passes.cost.fit.fit_size_rates makes them
    factors): "elementwise.forward", the mean per element of a relu, an add and a scale of [rows, width] (each
    less its dispatch, the same op on one row); "elementwise.backward", of relu's and the scale's backward; "spmm_f"
    and "spmm_b", seconds per edge-feature multiply-add of gnnc's aggregation forward and its transpose on an
    R-MAT graph of `rows` vertices (one value per edge, `width`-wide rows). Each the median of `rounds` rounds,
    each round timing every size in turn: a change of the load between sizes then moves every size's timing, not
    one size's (the factors are ratios of sizes).

    Why: the probe's op rates and kernel rates are measured at one size (KERNEL_GRAPH's, OPS_GRAPHS'), where
    the rows no longer fit the caches, and the grid's small graphs ran the same ops 1.5-5x faster (issue 36:
    Cora-sized rows 0.2-1.3 ns per element against 1.0-3.1; the dense R-MAT's 8,000 vertices 2.4-3.6 G/s
    against 1.2-2.1)."""
    torch.set_num_threads(threads)
    dev = torch.device(device if device != "cuda" else "cuda:0")
    sync = _sync_for(dev)
    out: list[dict] = []

    def per_element(make: Callable[[int], Callable[[], object]], n: int) -> float:
        one = _median_time(make(1), repeats, sync=sync)  # the op's dispatch: the same op on one row
        return max(_median_time(make(n), repeats, sync=sync) - one, 0.0) / (n * width)

    def forward_ops(n: int) -> list[Callable[[], object]]:
        x, y = torch.randn(n, width, device=dev), torch.randn(n, width, device=dev)
        return [lambda: torch.relu(x), lambda: x + y, lambda: x * 0.5]

    def backward_ops(n: int) -> list[Callable[[], object]]:
        x = torch.randn(n, width, device=dev, requires_grad=True)
        g = torch.randn(n, width, device=dev)
        relu, scaled = torch.relu(x), x * 0.5
        return [lambda: torch.autograd.grad(relu, x, g, retain_graph=True),
                lambda: torch.autograd.grad(scaled, x, g, retain_graph=True)]

    graphs = [place(rmat(n, degree, features=1, classes=1, seed=seed).csr("plain"), dev) for seed, n in enumerate(rows)]
    timed: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for kind, ops in (("elementwise.forward", forward_ops), ("elementwise.backward", backward_ops)):
            for n in rows:
                times = [per_element(lambda m, i=i: ops(m)[i], n) for i in range(len(ops(1)))]
                timed.setdefault((kind, n), []).append(statistics.fmean(times))
        for n, csr in zip(rows, graphs):
            weight = torch.rand(csr.nnz, device=dev)
            x = torch.randn(csr.n_src, width, device=dev, requires_grad=True)
            y = spmm(csr, x, weight)
            g = torch.randn_like(y)
            work = float(csr.nnz * width)
            # warm-up calls first: the first aggregation of a process is several times slower (its one warm-up
            # call then made the sample a single call: the smallest graph, timed first, at 1.15 ns a multiply-add
            # against 0.50 timed after others)
            forward = _median_time(lambda: spmm(csr, x.detach(), weight), repeats, warmup=3, sync=sync)
            backward = _median_time(lambda: torch.autograd.grad(y, x, g, retain_graph=True), repeats, warmup=3,
                                    sync=sync)
            timed.setdefault(("spmm_f", n), []).append(forward / work)
            timed.setdefault(("spmm_b", n), []).append(backward / work)
    return [{"kind": kind, "rows": n, "width": width, "seconds": statistics.median(seconds)}
            for (kind, n), seconds in timed.items()]


def memory_bandwidth(threads: int, mib: int = 256, device: torch.device = CPU) -> float:
    torch.set_num_threads(threads)
    a = torch.empty(mib * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    return 2.0 * a.numel() * 4 / _median_time(lambda: b.copy_(a), sync=_sync_for(device))  # read + write


def _pingpong(cfg: DistConfig, sizes: list[int], repeats: int) -> dict[int, float]:
    """Rank 0 sends `size` floats to rank 1, which sends them back; median one-way seconds."""
    device = collective_device()
    sync = _sync_for(device)
    out = {}
    for size in sizes:
        buf = torch.zeros(size, device=device)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            if cfg.rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            if i:
                times.append((time.perf_counter() - t0) / 2)
        out[size] = statistics.median(times)
    return out


def link(repeats: int = 10, device: str = "cpu") -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) between two processes on this machine: gloo, or NCCL between
    GPUs 0 and 1 with `device="cuda"`."""
    small, large = 1, 4 * 2**20
    times = launch(_pingpong, 2, [small, large], repeats, device=device)[0]
    return _latency_bandwidth(times[small], times[large], large * 4)


def _latency_bandwidth(t_small: float, t_large: float, large_bytes: int) -> tuple[float, float]:
    """alpha and beta from one-way times of a tiny and a large message."""
    return t_small, large_bytes / max(t_large - t_small, 1e-9)


def host_link(device: torch.device, repeats: int = 10) -> tuple[float, float]:
    """(latency, bandwidth) of copies between pinned host memory and `device`: a lone GPU's only link."""
    small, large = torch.zeros(1).pin_memory(), torch.zeros(4 * 2**20).pin_memory()
    sync = _sync_for(device)
    t_small = _median_time(lambda: small.to(device, non_blocking=True), repeats, sync=sync)
    t_large = _median_time(lambda: large.to(device, non_blocking=True), repeats, sync=sync)
    return _latency_bandwidth(t_small, t_large, large.numel() * 4)


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


def layer_times(program, graph, repeats: int = 5, device: str = "cpu") -> tuple[list[float], list[float]]:
    """Seconds of one forward plus backward, and of one forward alone as the evaluation runs it (no autograd),
    each the median of `repeats`, of each graph layer of `program` on `graph`.

    Each layer runs alone through gnnc's executor (`Interpreter.run_layer`) on the inputs a training
    step gives it (the layers before it run first), with the gradient flowing where it would in
    training: to the weights always, to the input unless the layer reads the input features. The
    forward alone is timed apart because a dense map's backward products (x^T g) run at another
    rate than its forward one (x W): the evaluation pass is forward only.
    """
    worker = Worker(program, graph, TrainConfig(progress=False, device=device))
    params = init_params(program, 0, worker.device)
    # each equation on its own, as a distributed rank runs it and as eqn_times times the other ops: the fit
    # takes those ops' modelled time off these timings, which a fused chain would make smaller than modelled
    ctx, eval_ctx = (dataclasses.replace(worker.context(training, 0), fuse=False) for training in (True, False))
    sync = _sync_for(worker.device)
    env = dict(worker.inputs)
    seen = dict(worker.inputs)  # every layer's outputs: the interpreter lets go of a value after its last reader
    with torch.no_grad():
        for layer in program.layers:
            worker.interp.run_layer(layer, env, params, ctx)
            seen.update({v.name: env[v.name] for v in layer.outputs})
    env = seen
    inputs = {v.name for v in program.inputs}
    out, forward = [], []
    for layer in program.graph_layers():
        grad = torch.ones_like(env[layer.outputs[0].name])

        def step(layer=layer, grad=grad) -> None:
            local = {v.name: env[v.name].detach().requires_grad_(v.name not in inputs and env[v.name].is_floating_point())
                     for v in layer.inputs}
            worker.interp.run_layer(layer, local, params, ctx)
            local[layer.outputs[0].name].backward(grad)
            for p in params.values():
                p.grad = None

        def evaluate(layer=layer) -> None:
            with torch.no_grad():
                worker.interp.run_layer(layer, {v.name: env[v.name] for v in layer.inputs}, params, eval_ctx)

        out.append(_median_time(step, repeats=repeats, sync=sync))
        forward.append(_median_time(evaluate, repeats=repeats, sync=sync))
    return out, forward


def probe_layer_samples(compile_program: Callable[[object], object], threads: int,
                        graphs: Sequence[tuple[int, float]] = PROBE_GRAPHS, widths: tuple[int, int, int] = PROBE_WIDTHS,
                        repeats: int = 5, device: str = "cpu") -> tuple[object, list[tuple[int, list[int], list[float]]],
                                                                        list[tuple[int, list[int], list[float]]]]:
    """Time PROBE_MODEL's layers on each test graph: (the program, [(V, E per layer, seconds per layer)] of a
    forward plus backward, the same of a forward alone).

    `compile_program(graph)` compiles PROBE_MODEL with these widths for a graph (the caller's: the
    runtime does not compile); the first graph's program serves every graph.
    """
    torch.set_num_threads(threads)
    features, _, classes = widths
    program = None
    samples: list[tuple[int, list[int], list[float]]] = []
    forward: list[tuple[int, list[int], list[float]]] = []
    for seed, (n, deg) in enumerate(graphs):
        graph = rmat(n, deg, features=features, classes=classes, seed=seed)
        program = program or compile_program(graph)
        edges = [graph.csr(layer.edges).nnz for layer in program.graph_layers()]
        both, alone = layer_times(program, graph, repeats, device)
        samples.append((graph.num_nodes, edges, both))
        forward.append((graph.num_nodes, edges, alone))
    return program, samples, forward


# Every kind of op an epoch runs besides dense maps and aggregations: GAT's attention (dot, sddmm,
# leaky_relu, edge_softmax, edge dropout), concat, bias, elu, vertex dropout, the loss.
PROBE_OPS_MODEL = """
layer Att(in, out, heads = 2) with self_loops {
  transform z = linear(h, heads, out, bias = false)
  scatter   e = leaky_relu(dot(src.z) + dot(dst.z), 0.2)
  gather    alpha = softmax(e)
  scatter   m = dropout(edge.alpha, 0.5) * src.z
  gather    a = sum(m)
  transform c = concat(a)
  apply     h = bias(c)
}

model ProbeOps(features, hidden, classes) {
  h = dropout(x, 0.5)
  h = Att(features, hidden)(h)
  h = elu(h)
  h = dropout(h, 0.5)
  h = Att(2 * hidden, classes, 1)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""
PROBE_OPS_WIDTHS = (64, 32, 16)
# graphs the ops are timed on (PROBE_GRAPHS' sizes), and one small enough that an op's dispatch is its time
OPS_GRAPHS = PROBE_GRAPHS[:3]
DISPATCH_GRAPH = (256, 4.0)
# (rows, width) of the row copies timed, and (elements, tensors) of the Adam steps: both vary
COPY_SIZES = ((20000, 16), (20000, 128), (80000, 64), (160000, 32))
ADAM_SIZES = ((10_000, 1), (1_000_000, 1), (1_000_000, 16), (4_000_000, 4), (64, 32))


def eqn_times(program, graph, repeats: int = 5, device: str = "cpu") -> list[tuple[str, int, int, int, float, float]]:
    """(op, inputs, rows and elements of its widest tensor, forward seconds, backward seconds) of every equation
    of `program` run alone on `graph` through gnnc's executor, each the median of `repeats`.

    The inputs are those a training step gives the equation (every equation before it runs first);
    backward sends a gradient of ones through the result to every floating-point input and parameter.
    """
    worker = Worker(program, graph, TrainConfig(progress=False, device=device))
    params = init_params(program, 0, worker.device)
    ctx = worker.context(True, 0)
    sync = _sync_for(worker.device)
    env = dict(worker.inputs)
    out = []
    for layer in program.layers:
        view = ctx.views.get(layer.edges) if layer.kind == "graph" else None
        for e in layer.eqns:
            raw = [env[v.name] if v.name in env else params[v.name] for v in e.ins]
            with torch.no_grad():
                result = worker.interp.compute(e, raw, view, ctx)
            env[e.outs[0].name] = result
            widest = max([t for t in (*raw, result) if isinstance(t, torch.Tensor)], key=torch.numel)

            def forward(e=e, raw=raw, view=view) -> torch.Tensor:
                ins = [t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
                       for t in raw]
                return worker.interp.compute(e, ins, view, ctx)

            fwd = _median_time(forward, repeats=repeats, sync=sync)
            bwd = 0.0
            probe_out = forward()
            if probe_out.requires_grad and not probe_out.is_sparse:
                grad = torch.ones_like(probe_out)

                def backward(grad=grad) -> None:
                    forward().backward(grad)

                # a backward call runs its forward first: its own time is the difference
                bwd = max(_median_time(backward, repeats=repeats, sync=sync) - fwd, 0.0)
            out.append((e.op, len(e.ins), int(widest.shape[0]) if widest.dim() else 1, int(widest.numel()), fwd, bwd))
    return out


def copy_times(sizes=COPY_SIZES, repeats: int = 5, device: torch.device = CPU) -> list[tuple[int, float, float]]:
    """(elements, forward s, backward s) of the row copies around an exchange: forward gathers rows to send
    (index_select of scattered rows, as a halo packs them), backward adds a gradient into scattered rows
    (index_add_, as the owner sums the gradients sent back)."""
    out = []
    for rows, width in sizes:
        x = torch.randn(rows, width, device=device)
        idx = torch.randperm(rows, device=device)
        grad = torch.zeros(rows, width, device=device)
        sync = _sync_for(device)
        out.append((rows * width,
                    _median_time(lambda x=x, idx=idx: x.index_select(0, idx), repeats=repeats, sync=sync),
                    _median_time(lambda g=grad, idx=idx, x=x: g.index_add_(0, idx, x), repeats=repeats, sync=sync)))
    return out


def adam_times(sizes=ADAM_SIZES, repeats: int = 5, device: torch.device = CPU) -> list[tuple[int, int, float]]:
    """(parameter elements, parameter tensors, seconds) of one Adam step with weight decay, as training takes."""
    out = []
    for elements, tensors in sizes:
        params = [torch.nn.Parameter(torch.randn(max(elements // tensors, 1), device=device)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = optim.Adam(params, lr=0.01, weight_decay=5e-4)  # training's Adam (gnnc.runtime.optim)
        out.append((sum(p.numel() for p in params), tensors,
                    _median_time(opt.step, repeats=repeats, sync=_sync_for(device))))
    return out


def probe_op_samples(compile_program: Callable[[object], object], threads: int,
                     graphs: Sequence[tuple[int, float]] = OPS_GRAPHS,
                     widths: tuple[int, int, int] = PROBE_OPS_WIDTHS, device: str = "cpu") -> dict:
    """Every op timing `gnnc probe` fits op rates to: {"eqns": [(op, inputs, rows, elements, fwd, bwd), ...] on
    `graphs`, "dispatch": the same on DISPATCH_GRAPH, "copies": copy_times(), "adam": adam_times()};
    `compile_program(graph)` compiles PROBE_OPS_MODEL."""
    torch.set_num_threads(threads)
    features, _, classes = widths
    timed: list[list[tuple[str, int, int, int, float, float]]] = []
    program = None
    for seed, (n, deg) in enumerate((DISPATCH_GRAPH, *graphs)):
        graph = rmat(n, deg, features=features, classes=classes, seed=seed)
        program = program or compile_program(graph)
        timed.append(eqn_times(program, graph, device=device))
    dev = torch.device(device if device != "cuda" else "cuda:0")
    return {"dispatch": timed[0], "eqns": [e for t in timed[1:] for e in t], "copies": copy_times(device=dev),
            "adam": adam_times(device=dev)}


def across_ranks(every: Sequence[dict]) -> dict:
    """One machine's timings from every rank's (`gnnc probe --network`: each rank of the job ran the same probe):
    each timing of the probe's layers ("layers", "forward") the slowest rank's, every other timing ("ops",
    "kernels", "sizes") the median over the ranks.

    Why: a job's ranks compute each layer at once and wait for each other at its exchanges, so a step pays
    for each layer what its slowest rank takes, and the layers were timed on every rank at the same moment
    (`timing_together`) for that. The single ops and kernels were timed on each rank at its own moment: they
    price the work of any rank, and the median of several ranks' draws is steadier than one rank's. On
    these shared cores one rank's figures alone moved by up to 2x between probes minutes apart, and on 4
    emulated hosts two ranks sharing a core timed the same layer 10-30% apart.
    """
    if not every:
        raise ValueError("no rank's timings")

    def agree(what: str, keys: list) -> None:
        if any(k != keys[0] for k in keys):
            raise ValueError(f"the ranks timed different {what}: {keys[0]} and {next(k for k in keys if k != keys[0])}")

    def layers(key: str) -> list:
        parts = [r[key] for r in every]
        agree(key, [[(n, list(edges)) for n, edges, _ in p] for p in parts])
        return [(n, list(edges), [max(p[i][2][j] for p in parts) for j in range(len(seconds))])
                for i, (n, edges, seconds) in enumerate(parts[0])]

    def medians(rows: list[list[tuple]], timed_from: int, what: str) -> list[tuple]:
        agree(what, [[tuple(r[:timed_from]) for r in part] for part in rows])
        return [(*row[:timed_from], *(statistics.median(part[i][k] for part in rows)
                                      for k in range(timed_from, len(row))))
                for i, row in enumerate(rows[0])]

    ops = [r["ops"] for r in every]
    kernels = [[(k["kernel"], k["k"], k["n"], k["rate"]) for k in r["kernels"]] for r in every]
    sizes = [[(z["kind"], z["rows"], z["width"], z["seconds"]) for z in r.get("sizes", ())] for r in every]
    return {**every[0], "layers": layers("layers"), "forward": layers("forward"),
            "sizes": [{"kind": kind, "rows": n, "width": width, "seconds": seconds}
                      for kind, n, width, seconds in medians(sizes, 3, "working sets")],
            "ops": {"dispatch": medians([o["dispatch"] for o in ops], 4, "ops"),
                    "eqns": medians([o["eqns"] for o in ops], 4, "ops"),
                    "copies": medians([o["copies"] for o in ops], 1, "row copies"),
                    "adam": medians([o["adam"] for o in ops], 2, "optimizer steps")},
            "kernels": [{"kernel": kernel, "k": k, "n": n, "rate": rate}
                        for kernel, k, n, rate in medians(kernels, 3, "kernels")]}


def machine_fields(threads: int) -> dict:
    """The machine's own figures (kernel rates, memory), as ClusterProfile fields."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"memory_per_worker": float(pages), "memory_bandwidth": memory_bandwidth(threads),
            "gemm_rate": gemm_rate(threads), "spmm_rate": spmm_rate(threads)}


def probe(threads: int, device: str = "cpu") -> dict:
    """Every measurement of the machine itself (kernel rates, memory, the link), as ClusterProfile fields."""
    if device == "cuda":
        return gpu_profile(threads)
    latency, bandwidth = link()
    # `gnnc run --nproc N` runs its workers as processes on this one machine: one per core at most
    workers = max(1, os.cpu_count() or 1)
    return {"name": "local", "workers": workers, "devices_per_node": workers, "intra_bandwidth": bandwidth,
            "inter_bandwidth": bandwidth, "latency": latency, "topology": "loopback (gloo)",
            **machine_fields(threads),
            "description": f"this machine as measured by gnnc probe ({threads} threads, {os.cpu_count()} cores)"}


def gpu_profile(threads: int) -> dict:
    """This machine's GPUs as ClusterProfile fields: rates measured on GPU 0, one worker per GPU."""
    gpu = torch.device("cuda", 0)
    count = torch.cuda.device_count()
    latency, bandwidth = link(device="cuda") if count >= 2 else host_link(gpu)
    props = torch.cuda.get_device_properties(gpu)
    bf16 = gemm_rate(threads, 4096, gpu, torch.bfloat16) if torch.cuda.is_bf16_supported() else None
    return gpu_fields(name=props.name, count=count, memory=float(props.total_memory), latency=latency,
                      bandwidth=bandwidth, memory_bandwidth=memory_bandwidth(threads, 1024, gpu),
                      fp32=gemm_rate(threads, 4096, gpu), bf16=bf16, fp16=gemm_rate(threads, 4096, gpu, torch.float16),
                      spmm=spmm_rate(threads, device=gpu), spmm_16=spmm_rate(threads, device=gpu, dtype=torch.float16))


def gpu_fields(*, name: str, count: int, memory: float, latency: float, bandwidth: float, memory_bandwidth: float,
               fp32: float, bf16: float | None, fp16: float, spmm: float, spmm_16: float) -> dict:
    """The profile of `count` GPUs called `name`, from what `gpu_profile` measured on one of them."""
    link_kind = "NCCL between GPUs 0 and 1" if count >= 2 else "a single GPU: its pinned host link"
    return {"name": "local", "workers": count, "devices_per_node": count, "intra_bandwidth": bandwidth,
            "inter_bandwidth": bandwidth, "latency": latency, "topology": "nccl" if count >= 2 else "pcie-host",
            "memory_per_worker": memory, "memory_bandwidth": memory_bandwidth, "gemm_rate": fp32,
            "spmm_rate": spmm, "gemm_rate_bf16": bf16, "gemm_rate_fp16": fp16, "spmm_rate_16": spmm_16,
            "description": f"this machine's {count} x {name} as measured by gnnc probe --device cuda ({link_kind})"}
