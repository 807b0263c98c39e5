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
Eq. 1-3) are fitted too, because the rates above time bare kernels while a
training step pays for everything gnnc's executor does around them. A short
test training times each layer of a 2-layer GCN (forward plus backward,
through `Interpreter.run_layer`, single process) on generated R-MAT graphs
whose vertex and edge counts vary independently (the fastest of a few
repetitions each), and non-negative least squares fits
time = T_v*V + T_e*E + const per layer width; T_c is the gloo bandwidth
measured above, per row of the exchanged width. The per-width figures go
into the profile's `unit_costs`; the cost model's single `t_v`, `t_e`, `t_c`
(per unit of work, see gnnc.cluster.ClusterProfile) are fitted jointly to
the same timings through the cost model's own per-vertex and per-edge work
(`cost_model.compute_forward`/`compute_backward`), so that the model,
evaluated on the probe's layers, predicts the times the probe measured.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np
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
    from gnnc.graph import CSR
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


@dataclass(frozen=True)
class UnitCostFit:
    """time = T_v*V + T_e*E + const, fitted by non-negative least squares; rms: the residual (seconds)."""

    T_v: float
    T_e: float
    const: float
    rms: float


def fit_unit_costs(vertices: Sequence[float], edges: Sequence[float], seconds: Sequence[float]) -> UnitCostFit:
    """Least-squares T_v, T_e, const from (V, E, time) samples, all three kept non-negative.

    Non-negative because a negative time per vertex is noise, not a cost; with at least three
    samples of independent V and E the constants of exact timings are recovered exactly.
    """
    from scipy.optimize import nnls

    v, e, t = (np.asarray(a, dtype=np.float64) for a in (vertices, edges, seconds))
    if not (len(v) == len(e) == len(t)) or len(t) < 3:
        raise ValueError(f"need at least 3 samples of equal length, got {len(v)}, {len(e)}, {len(t)}")
    a = np.stack([v, e, np.ones_like(v)], axis=1)
    coef = _nnls_scaled(a, t, nnls)
    rms = float(np.sqrt(np.mean((a @ coef - t) ** 2)))
    return UnitCostFit(float(coef[0]), float(coef[1]), float(coef[2]), rms)


def _nnls_scaled(a: np.ndarray, y: np.ndarray, nnls) -> np.ndarray:
    """NNLS on columns scaled to unit norm: V, E and 1 differ by orders of magnitude, which would
    otherwise decide the solver's tolerance for the small columns."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(a / norms, y)
    return coef / norms


def layer_times(program, graph, repeats: int = 5) -> list[float]:
    """Seconds of one forward plus backward (the fastest of `repeats`) of each graph layer of `program` on `graph`.

    Each layer runs alone through gnnc's executor (`Interpreter.run_layer`) on the inputs a training
    step gives it (the layers before it run first), with the gradient flowing where it would in
    training: to the weights always, to the input unless the layer reads the input features.
    """
    from gnnc.runtime.executor import init_params
    from gnnc.runtime.train import TrainConfig, Worker

    worker = Worker(program, graph, TrainConfig(progress=False))
    params = init_params(program, 0)
    ctx = worker.context(True, 0)
    env = dict(worker.inputs)
    with torch.no_grad():
        for layer in program.layers:
            worker.interp.run_layer(layer, env, params, ctx)
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


def _per_unit_work(program) -> list[tuple[float, float, int]]:
    """Per graph layer: the cost model's forward-plus-backward seconds of one vertex and of one edge
    when t_v = t_e = 1, and the width of the rows the layer exchanges."""
    from gnnc.passes import cost_model as cm
    from gnnc.passes.choose_strategy import layer_dims, layer_shape
    from gnnc.passes.predict_bytes import param_dependent

    dims, heads = layer_dims(program)
    needs = param_dependent(program)
    out = []
    for i, layer in enumerate(program.graph_layers()):
        shape = layer_shape(layer, needs)
        subs = {cm.d(i): dims[i], cm.d(i + 1): dims[i + 1], cm.heads(i): heads[i], cm.R_gemm: 2.0, cm.R_spmm: 1.0}
        vertex = cm.compute_forward(i, shape, 1, 0) + cm.compute_backward(i, shape, 1, 0)
        edge = cm.compute_forward(i, shape, 0, 1) + cm.compute_backward(i, shape, 0, 1)
        out.append((float(vertex.subs(subs)), float(edge.subs(subs)), int(shape.width(i).subs(subs))))
    return out


def unit_costs(bandwidth: float, threads: int, graphs: Sequence[tuple[int, float]] = PROBE_GRAPHS,
               widths: tuple[int, int, int] = PROBE_WIDTHS, repeats: int = 3) -> dict:
    """NeutronStar's T_v, T_e, T_c per layer width (`unit_costs`) and the cost model's t_v, t_e, t_c."""
    from gnnc import api
    from gnnc.graph.generators import rmat

    torch.set_num_threads(threads)
    features, hidden, classes = widths
    model = api.load_model_source(PROBE_MODEL, "<gnnc probe>", features=features, hidden=hidden, classes=classes)
    program = None
    samples: list[tuple[int, list[int], list[float]]] = []  # (V, E per layer, seconds per layer)
    for seed, (n, deg) in enumerate(graphs):
        graph = rmat(n, deg, features=features, classes=classes, seed=seed)
        program = program or api.compile(model, graph).program
        edges = [graph.csr(layer.edges).nnz for layer in program.graph_layers()]
        samples.append((graph.num_nodes, edges, layer_times(program, graph, repeats)))
    work = _per_unit_work(program)
    dims = [features, hidden, classes]
    layers = []
    for i, (_, _, row_width) in enumerate(work):
        fit = fit_unit_costs([s[0] for s in samples], [s[1][i] for s in samples], [s[2][i] for s in samples])
        layers.append({"d_in": dims[i], "d_out": dims[i + 1], "row_width": row_width, "T_v": fit.T_v,
                       "T_e": fit.T_e, "T_c": row_width * 4 / bandwidth, "const": fit.const})
    t_v, t_e = _joint_rates(samples, work)
    return {"unit_costs": layers, "t_v": t_v, "t_e": t_e, "t_c": 1.0 / bandwidth}


def _joint_rates(samples: list[tuple[int, list[int], list[float]]],
                 work: list[tuple[float, float, int]]) -> tuple[float | None, float | None]:
    """The cost model's t_v, t_e: one pair for every layer, with an intercept per layer, fitted to
    all timings through the model's per-vertex and per-edge work. None where the fit gives 0
    (the profile then keeps deriving that figure from the kernel rate)."""
    from scipy.optimize import nnls

    rows, y = [], []
    for n, edges, seconds in samples:
        for i, (per_vertex, per_edge, _) in enumerate(work):
            rows.append([per_vertex * n, per_edge * edges[i]] + [1.0 if j == i else 0.0 for j in range(len(work))])
            y.append(seconds[i])
    coef = _nnls_scaled(np.asarray(rows), np.asarray(y), nnls)
    return (float(coef[0]) or None), (float(coef[1]) or None)


def describe_unit_costs(profile) -> str:
    """NeutronStar's figures of a profile, one line per layer width, for `gnnc probe`'s output."""
    if not profile.unit_costs:
        return "no NeutronStar unit costs in this profile\n"
    lines = ["NeutronStar unit costs (2-layer GCN through gnnc's executor, forward + backward):",
             f"  {'layer':>12s} {'T_v ns/vertex':>14s} {'T_e ns/edge':>12s} {'T_c ns/row':>11s} {'const us':>9s}"]
    for u in profile.unit_costs:
        lines.append(f"  {f'{u.d_in}->{u.d_out}':>12s} {u.T_v * 1e9:14.2f} {u.T_e * 1e9:12.3f} {u.T_c * 1e9:11.2f} "
                     f"{u.const * 1e6:9.1f}")

    def rate(value, unit: str) -> str:
        return "- (kept from the kernel rate)" if value is None else f"{value:.4g} {unit}"

    lines.append(f"  cost model: t_v {rate(profile.t_v, 's per vertex per d_in*d_out')}, "
                 f"t_e {rate(profile.t_e, 's per edge per feature')}, t_c {rate(profile.t_c, 's per byte')}")
    return "\n".join(lines) + "\n"


def probe(threads: int | None = None) -> dict:
    """Every measurement, as the fields of a ClusterProfile."""
    threads = threads or max(1, torch.get_num_threads())
    latency, bandwidth = link()
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # `gnnc run --nproc N` runs its workers as processes on this one machine: one per core at most
    workers = max(1, os.cpu_count() or 1)
    return {"name": "local", "workers": workers, "devices_per_node": workers, "intra_bandwidth": bandwidth,
            "inter_bandwidth": bandwidth, "latency": latency, "topology": "loopback (gloo)",
            "memory_per_worker": float(pages), "memory_bandwidth": memory_bandwidth(threads),
            "gemm_rate": gemm_rate(threads), "spmm_rate": spmm_rate(threads),
            **unit_costs(bandwidth, threads),
            "description": f"this machine as measured by gnnc probe ({threads} threads, {os.cpu_count()} cores)"}
