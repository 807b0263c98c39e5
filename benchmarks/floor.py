"""The floor of an epoch, and where gnnc's epoch spends the rest: measured side by side in one run.

An epoch is a training step (forward, backward, Adam) and the evaluation forward pass. Its floor is
the work no implementation can skip: every SpMM, SDDMM and GEMM the lowered plan executes — forward,
the backward products autograd needs (an input gradient only where the input depends on a
parameter), and the evaluation forward — each timed alone at its shape with torch's fastest kernel
for it on this machine (MKL's CSR product or torch's spmm_reduce, whichever is faster at that width;
`mm` for dense products; sparse input features as COO or CSR, whichever is faster; `sampled_addmm`
for SDDMM-dots; a gather-add for SDDMM-adds). Elementwise
work (dropout, activations, softmax, bias, the loss) and the optimizer are not in the floor: they are
what an implementation should make small. Outputs are allocated per call as torch does, under the
allocator gnnc's worker sets up (gnnc.runtime.memory: blocks of 1 MiB and more kept for reuse by the
block cache where it builds, mapped afresh otherwise), so each kernel pays for its output what it pays
in gnnc's epoch.

Beside the floor: gnnc's epoch on the same graph and model (median over epochs, and the peak RSS
during them), and a profile of one epoch that splits its time into the floor's kernels and the rest,
op by op (self CPU time; "outside torch ops": Python and the interpreter).

    python benchmarks/floor.py --model gcn                  # 200K-vertex, 2M-edge uniform graph
    python benchmarks/floor.py --model gat --graph rmat     # R-MAT of the same size
    python benchmarks/floor.py --model sage --graph cora --epochs 30
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent

# torch ops that are the floor's kernels (a profile's self time of these is kernel time, the rest overhead)
KERNEL_OPS = ("aten::mm", "aten::addmm", "aten::_sparse_mm_reduce_impl", "aten::_sparse_mm_reduce_impl_backward",
              "aten::_sparse_addmm", "aten::sparse_sampled_addmm", "aten::_sparse_sparse_matmul", "aten::bmm",
              "aten::addmm_", "aten::_sparse_csr_mm")


# ----- graphs and models, as vs_pyg.py runs them

PLANETOID = ("cora", "citeseer")

def uniform_graph(n: int, m: int, features: int, classes: int, seed: int = 0):
    """n vertices, m edges with uniformly random ends, Gaussian features, random labels, a 60/40 split."""
    import numpy as np

    from gnnc.graph import Graph

    rs = np.random.RandomState(seed)
    src = rs.randint(0, n, m).astype(np.int64)
    dst = rs.randint(0, n, m).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    train = torch.rand(n, generator=g) < 0.6
    return Graph(n, src, dst, torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g),
                 train, ~train, ~train, f"uniform-{n}-{m}")


def bench_graph(name: str, n: int, m: int, features: int, classes: int):
    """'uniform' (n, m), 'rmat' (R-MAT with n vertices and about m edges), 'cora', or any gnnc graph spec."""
    from gnnc import api

    if name == "uniform":
        return uniform_graph(n, m, features, classes)
    if name == "rmat":
        return api.load_graph(f"rmat:n={n},deg={m / n:g},features={features},classes={classes},seed=0")
    if name in PLANETOID:
        return api.load_graph(f"planetoid:{name}")
    return api.load_graph(name)


def model_sizes(model: str, hidden: int | None, heads: int) -> dict[str, int]:
    """The example's parameters at a hidden width: GAT splits it over its heads (128: 8 heads x 16).
    None keeps the example's own sizes (GCN and SAGE 16, GAT 8 heads x 8, as on Cora)."""
    if hidden is None:
        return {}
    return {"gat": {"hidden": hidden // heads, "heads": heads}}.get(model, {"hidden": hidden})


def compile_model(model: str, graph, hidden: int | None, heads: int):
    from gnnc import api

    return api.compile(api.load_model(ROOT / "examples" / f"{model}.gnn", **model_sizes(model, hidden, heads)), graph)


# ----- the floor: the plan's kernels, each alone

@dataclass
class KernelOp:
    phase: str  # forward, backward, eval
    kind: str  # gemm, spmm, sddmm
    what: str  # the equation and shape, for the table
    run: Callable[[], object]
    seconds: float = 0.0


def _quiet_sparse(crow, col, values, shape):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR is beta" notice
        return torch.sparse_csr_tensor(crow, col, values, shape)


def _best_spmm(a: torch.Tensor, width: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's faster CSR x dense product for `a` at this width: MKL's or spmm_reduce (timed here)."""
    x = torch.randn(a.shape[1], width)
    mkl = lambda t: torch.sparse.mm(a, t)  # noqa: E731
    reduce = lambda t: torch.sparse.mm(a, t, "sum")  # noqa: E731
    return min((mkl, reduce), key=lambda f: _median(_call(f, x), 3))


def _best_sparse_features(xs: torch.Tensor, b: torch.Tensor) -> Callable[[], object]:
    """The faster of torch's products of sparse features xs (COO) with b: as COO, or in CSR (MKL's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR is beta" notice
        csr = xs.to_sparse_csr()
    return min((_call(_sparse_mm, xs, b), _call(_sparse_mm, csr, b)), key=lambda f: _median(f, 3))


def _median(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of `repeat` calls after one warm-up (caches, thread pools, the allocator)."""
    from gnnc.runtime.probe import _median_time  # the probe's timing loop, the same here

    return _median_time(fn, repeats=repeat, warmup=1)


class _Patterns:
    """The sparse matrices of the graph's edge views (and their per-head block forms), built once."""

    def __init__(self, graph) -> None:
        from gnnc.graph import GraphView

        self.graph, self._views, self._mats = graph, {}, {}
        self._view_type = GraphView

    def view(self, name: str):
        if name not in self._views:
            self._views[name] = self._view_type.build(self.graph, name)
        return self._views[name]

    def matrix(self, name: str, transposed: bool, heads: int) -> torch.Tensor:
        key = (name, transposed, heads)
        if key not in self._mats:
            from gnnc.runtime.kernels import cpu  # the same block structure gnnc multiplies with

            pat = cpu.pattern(self.view(name).csr, transposed, heads, torch.device("cpu"))
            self._mats[key] = _quiet_sparse(pat.crow, pat.col, torch.rand(pat.nnz), pat.shape)
        return self._mats[key]


def _call(fn: Callable, *args, **kwargs) -> Callable[[], object]:
    """fn(*args) as a closure over these very tensors (a lambda would see the loop's later ones)."""
    return lambda: fn(*args, **kwargs)


def _sparse_mm(a: torch.Tensor, b: torch.Tensor, reduce: str | None = None) -> torch.Tensor:
    return torch.sparse.mm(a, b) if reduce is None else torch.sparse.mm(a, b, reduce)


def _gather_add(a: torch.Tensor, src: torch.Tensor, b: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return a.index_select(0, src) + b.index_select(0, dst)


def _scatter_sum(g: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.zeros(rows, g.shape[1]).index_add_(0, index, g)


def kernel_ops(program, graph) -> list[KernelOp]:
    """Every SpMM, SDDMM and GEMM one epoch of `program` runs, with a closure that runs each alone."""
    from gnnc.graph import sparse_if_sparse
    from gnnc.ir.dims import eval_dim

    cfg = program.config_dict()
    mats = _Patterns(graph)
    n = graph.num_nodes
    x_sparse = sparse_if_sparse(graph.x).is_sparse
    needs_grad = {p.value.name for p in program.params()}
    sparse_values = {"x"} if x_sparse else set()
    ops: list[KernelOp] = []
    fwd, bwd = ("forward", "eval"), ("backward",)

    def width(v) -> tuple[int, ...]:
        return tuple(eval_dim(d, cfg) for d in v.type.shape)

    def add(phases, kind, what, run) -> None:
        ops.extend(KernelOp(phase, kind, what, run) for phase in phases)

    for layer in program.layers:
        for e in layer.eqns:
            if e.attr("hoisted"):
                continue  # computed once per run, not per epoch
            grad_in = [v.name in needs_grad for v in e.ins]
            if any(grad_in):
                needs_grad.update(o.name for o in e.outs)
            if e.op == "dropout" and e.ins[0].name in sparse_values:
                sparse_values.add(e.outs[0].name)
            if e.op == "linear":
                x, w = e.ins[0], e.ins[1]
                f_in, f_out = eval_dim(w.type.shape[0], cfg), eval_dim(w.type.shape[1], cfg)
                desc = f"{e.outs[0].name}: [{n}x{f_in}] @ [{f_in}x{f_out}]"
                wt, g = torch.randn(f_in, f_out), torch.randn(n, f_out)
                if x.name in sparse_values:
                    xs = sparse_if_sparse(graph.x)
                    add(fwd, "gemm", desc + " (sparse x)", _best_sparse_features(xs, wt))
                    add(bwd, "gemm", f"d{w.name}: sparse x^T @ grad", _best_sparse_features(xs.t().coalesce(), g))
                    continue
                xd = torch.randn(n, f_in)
                add(fwd, "gemm", desc, _call(torch.mm, xd, wt))
                add(bwd, "gemm", f"d{w.name}: [{f_in}x{n}] @ [{n}x{f_out}]", _call(torch.mm, xd.t(), g))
                if grad_in[0]:
                    add(bwd, "gemm", f"d{x.name}: [{n}x{f_out}] @ [{f_out}x{f_in}]", _call(torch.mm, g, wt.t()))
            elif e.op == "spmm":
                x = e.ins[0]
                w = e.ins[1] if len(e.ins) > 1 else None
                heads = math.prod(width(w)) if w is not None else 1
                cols = math.prod(width(x)) // heads
                a = mats.matrix(layer.edges, False, heads)
                at = mats.matrix(layer.edges, True, heads)
                reduce = e.attr("reduce")
                desc = f"{e.outs[0].name}: {reduce} over {a._nnz()} entries, width {cols}" + \
                    (f" x {heads} heads" if heads > 1 else "")
                xs, gs = torch.randn(a.shape[1], cols), torch.randn(a.shape[0], cols)
                if reduce in ("max", "min"):
                    add(fwd, "spmm", desc, _call(_sparse_mm, a, xs, "amax" if reduce == "max" else "amin"))
                else:
                    add(fwd, "spmm", desc, _call(_best_spmm(a, cols), xs))
                    if grad_in[0]:
                        add(bwd, "spmm", f"d{x.name}: transposed, width {cols}", _call(_best_spmm(at, cols), gs))
                if w is not None and grad_in[1]:
                    ones = _quiet_sparse(a.crow_indices(), a.col_indices(), torch.ones(a._nnz()), a.shape)
                    add(bwd, "sddmm", f"d{w.name}: sampled dot, width {cols}",
                        _call(torch.sparse.sampled_addmm, ones, gs, xs.t(), beta=0.0))
            elif e.op == "sddmm":
                csr = mats.view(layer.edges).csr
                h = math.prod(width(e.ins[0])) or 1
                src, dst = csr.indices, csr.dst_index()
                op = e.attr("op")
                desc = f"{e.outs[0].name}: {op} over {csr.nnz} edges x {h}"
                if op == "dot":
                    d = width(e.ins[0])[-1]
                    ones = mats.matrix(layer.edges, False, h)
                    ad, bd = torch.randn(csr.n_src * h, d), torch.randn(csr.n_dst * h, d)
                    add(fwd, "sddmm", desc, _call(torch.sparse.sampled_addmm, ones, bd, ad.t(), beta=0.0))
                    continue
                a, b, g = torch.randn(csr.n_src, h), torch.randn(csr.n_dst, h), torch.randn(csr.nnz, h)
                add(fwd, "sddmm", desc, _call(_gather_add, a, src, b, dst))
                if grad_in[0]:
                    add(bwd, "sddmm", f"d{e.ins[0].name}: sum over out-edges", _call(_scatter_sum, g, src, csr.n_src))
                if grad_in[1]:
                    add(bwd, "sddmm", f"d{e.ins[1].name}: sum over in-edges",
                        _call(torch.segment_reduce, g, "sum", offsets=csr.indptr, unsafe=True))
    return ops


def measure_floor(program, graph, repeat: int) -> list[KernelOp]:
    """Time every kernel op (median of `repeat` after a warm-up)."""
    ops = kernel_ops(program, graph)
    for op in ops:
        op.seconds = _median(op.run, repeat)
    return ops


# ----- gnnc's epoch, its peak memory and its profile

def gnnc_epoch(program, graph, device: str = "cpu", precision: str = "fp32") -> Callable[[], None]:
    """One gnnc epoch as `gnnc run` runs it: the training step (Worker.train_epoch), then the evaluation
    forward pass."""
    from gnnc.runtime.device import grad_scaler
    from gnnc.runtime.executor import init_params
    from gnnc.runtime.train import TrainConfig, Worker, make_optimizer

    cfg = TrainConfig.resolve(program, seed=0, progress=False, device=device, precision=precision)
    worker = Worker(program, graph, cfg)
    params = init_params(program, 0, worker.device)
    opt = make_optimizer(program, params, cfg)
    scaler = grad_scaler(worker.device, cfg.precision)
    epoch = [0]

    def step() -> None:
        worker.train_epoch(params, opt, epoch[0], scaler)
        with torch.no_grad():
            worker.forward(params, False, epoch[0])
        epoch[0] += 1

    return step


@dataclass
class Timed:
    """An epoch's median time, and memory: the peak RSS during the timed epochs and the RSS before them
    (what the process held already: libraries, the graph, parameters); peak - before is what epochs add."""

    epoch_s: float
    peak_bytes: int
    before_bytes: int


def time_epochs(step: Callable[[], None], epochs: int, warmup: int,
                device: torch.device = torch.device("cpu")) -> Timed:
    """Run `warmup` epochs, then time `epochs` (median) and take their peak RSS; on a GPU, epochs timed to
    the completion of their kernels and the peak of torch's allocations there."""
    from gnnc.runtime.metrics import peak_memory_since, peak_rss_bytes, reset_peak_memory

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    # as `gnnc run` measures a step's memory: the base is what the process holds (less the blocks the block
    # cache keeps for the epochs), and the peak is how far the epochs rise above it
    base = reset_peak_memory(device)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if base is None:  # no high-water mark to reset here: the process's own peak
        return Timed(statistics.median(times), peak_rss_bytes(), 0)
    return Timed(statistics.median(times), base + peak_memory_since(device, base), base)


def profile_epoch(step: Callable[[], None]) -> tuple[float, dict[str, float]]:
    """(wall seconds, self CPU seconds per op name) of one epoch under torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
    per_op: dict[str, float] = {}
    for ev in prof.key_averages():
        per_op[ev.key] = per_op.get(ev.key, 0.0) + ev.self_cpu_time_total / 1e6
    return wall, per_op


def cpu_code() -> str:
    """Which compiled code runs: the kernels' status and the allocator's, for the benchmarks' headers."""
    from gnnc.runtime import block_cache
    from gnnc.runtime.kernels import native

    return f"{native.status()}, {block_cache.status()}"


def threads_note() -> str:
    return f"{torch.get_num_threads()} threads, compiled kernels: {cpu_code()}"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def report(args: argparse.Namespace) -> None:
    from gnnc.runtime import block_cache
    from gnnc.runtime.memory import set_up_allocator

    set_up_allocator()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    graph = bench_graph(args.graph, args.n, args.m, args.features, args.classes)
    plan = compile_model(args.model, graph, args.hidden, args.heads)
    print(f"{args.model} on {graph.name}: {graph.num_nodes} vertices, {graph.num_edges} edges; {threads_note()}; "
          f"load {loadavg()}", flush=True)
    ops = measure_floor(plan.program, graph, args.repeat)
    floor = sum(op.seconds for op in ops)
    print(f"\nfloor: {floor:.4f} s per epoch ({len(ops)} kernels)")
    for op in ops:
        print(f"  {op.phase:8s} {op.kind:5s} {op.seconds:9.5f}  {op.what}")
    block_cache.empty()  # the floor's blocks, sized for its kernels: gnnc's epochs start from none kept
    step = gnnc_epoch(plan.program, graph)
    timed = time_epochs(step, args.epochs, args.warmup)
    print(f"\ngnnc epoch: {timed.epoch_s:.4f} s (median of {args.epochs}), {timed.epoch_s / floor:.2f}x the floor; "
          f"peak RSS {timed.peak_bytes / 2**20:.0f} MiB ({(timed.peak_bytes - timed.before_bytes) / 2**20:.0f} MiB "
          f"above the {timed.before_bytes / 2**20:.0f} MiB held before the epochs); load {loadavg()}")
    wall, per_op = profile_epoch(step)
    kernel = sum(t for k, t in per_op.items() if k in KERNEL_OPS)
    # autograd and profiler records nest the ops; self times do not double count, but records for
    # Python-level functions (autograd Functions) hold their C calls (compiled kernels) as self time
    rest = sorted(((t, k) for k, t in per_op.items() if k not in KERNEL_OPS), reverse=True)
    print(f"\nprofile of one epoch: {wall:.4f} s wall; floor kernels {kernel:.4f} s; the rest by op (self time):")
    for t, k in rest[: args.top]:
        if t >= 1e-4:
            print(f"  {t:9.5f}  {k}")
    print(f"  {max(wall - sum(per_op.values()), 0.0):9.5f}  (outside torch ops: Python, the interpreter)")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The graph, model and timing options floor.py and vs_pyg.py share (`resolve` fills their defaults)."""
    ap.add_argument("--graph", default="uniform", help="uniform, rmat, cora, citeseer or a gnnc graph spec")
    ap.add_argument("--n", type=int, default=200_000, help="vertices of a generated graph")
    ap.add_argument("--m", type=int, default=2_000_000, help="edges of a generated graph")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--hidden", type=int, help="hidden width (GAT: heads x width/heads); default 128, on "
                    "cora/citeseer the examples' own")
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, help="timed epochs (default 5; 50 on cora/citeseer)")
    ap.add_argument("--warmup", type=int, help="epochs before timing (default 2; 10 on cora/citeseer)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each floor kernel")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    small = args.graph in PLANETOID
    if args.hidden is None and not small:
        args.hidden = 128
    args.epochs = args.epochs or (50 if small else 5)
    args.warmup = args.warmup if args.warmup is not None else (10 if small else 2)
    return args


def main() -> None:
    from gnnc.host import use_huge_pages

    use_huge_pages()  # as `gnnc run` allocates (gnnc.host)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gcn", help="an example: gcn, sage, gat, gin, ...")
    add_arguments(ap)
    ap.add_argument("--top", type=int, default=15, help="ops of the rest to list")
    report(resolve(ap.parse_args()))


if __name__ == "__main__":
    main()
