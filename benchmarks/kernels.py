"""SpMM: gnnc's kernel against torch.sparse and PyG's message passing, side by side in one run.

The aggregation of a GCN layer, out[d] = sum over in-edges k of w[k] * x[src_k],
timed on a uniform random graph (default 200K vertices, 2M edges) at several
feature widths, forward alone and forward + backward (d/dx), for

* gnnc:         `gnnc.runtime.kernels.spmm` (CSR kernels, cached transpose);
* torch.sparse: `torch.sparse.mm` on a CSR tensor built once (autograd's own
                backward, which transposes the matrix on every call);
* PyG:          a `MessagePassing` layer whose message is `w * x_j`, as
                GCNConv's (one gathered row per edge, then a scatter-sum).

A last row times the GAT shape: 8 heads of 16 features with one weight per
edge and head (gnnc's block CSR product against PyG's [nnz, heads, D] path).
Each figure is the median of `--repeat` runs (forward and forward + backward
read off the same runs; one warm-up run per system first); ratios are
PyG / gnnc and torch.sparse / gnnc (above 1: gnnc is faster).

On CUDA, gnnc's default path is cuSPARSE (through torch's CSR ops); a
`gnnc-triton` column times the optional Triton kernels beside it, and a
second table times the GAT layer's other two kernels (SDDMM-dot, edge
softmax) and dropout of [n, 128] (gnnc.runtime.rng's counter-based mask) both
ways: what `gnnc.runtime.kernels.TRITON_OPS` is decided on.

    python benchmarks/kernels.py                       # CPU; CUDA too where present
    python benchmarks/kernels.py --n 20000 --m 200000  # a quick look
    python benchmarks/kernels.py --device cuda --n 2400000 --m 62000000 --no-pyg   # products scale
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from device_arg import add_device_argument, resolve_device_or_exit


def time_fwd_bwd(forward: Callable[[], torch.Tensor], grad: torch.Tensor, repeat: int, warmup: bool,
                 sync: Callable[[], None]) -> tuple[float, float]:
    """Medians of (forward, forward + backward), both read off the same runs."""
    if warmup:  # caches, generated code, allocator, thread pools
        forward().backward(grad)
        sync()
    fwd, total = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = forward()
        sync()
        t1 = time.perf_counter()
        out.backward(grad)
        sync()
        fwd.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    return statistics.median(fwd), statistics.median(total)


def make_pyg_layer() -> torch.nn.Module:
    from torch_geometric.nn import MessagePassing

    class WeightedSum(MessagePassing):
        """GCNConv's propagation without its linear map and normalisation."""

        def __init__(self) -> None:
            super().__init__(aggr="add", node_dim=0)  # x may be [n, heads, D], as in GATConv

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return self.propagate(edge_index, x=x, w=w)

        def message(self, x_j: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return w.view(w.shape + (1,) * (x_j.dim() - w.dim())) * x_j

    return WeightedSum()


def _triton():
    """gnnc's Triton kernels, where triton imports (the `gnnc[triton]` extra), else None."""
    try:
        # deferred: triton is optional
        from gnnc.runtime.kernels import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def bench_device(device: torch.device, args: argparse.Namespace) -> list[dict]:
    from gnnc.runtime import kernels
    from gnnc.runtime.device import place
    from gnnc.graph import CSR

    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, args.n, (args.m,), generator=gen)
    dst = torch.randint(0, args.n, (args.m,), generator=gen)
    csr = CSR.from_edges(src, dst, args.n)
    # The same edges in CSR order for every system, so the sums match term by term.
    edge_index = torch.stack([csr.indices, csr.dst_index()]).to(device)
    csr = place(csr, device)  # structure and transpose on the device, as a run holds them
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "sparse CSR is beta" notice
        w = torch.rand(args.m, generator=gen).to(device)
        a_csr = torch.sparse_csr_tensor(csr.indptr.to(device), csr.indices.to(device), w, (args.n, args.n))
    pyg = make_pyg_layer().to(device) if not args.no_pyg else None
    tk = _triton() if device.type == "cuda" else None

    rows = []
    shapes = [(f"{f}", (f,), w) for f in args.widths]
    heads, depth = 8, 16
    w_heads = torch.rand(args.m, heads, generator=gen).to(device)
    shapes.append((f"{heads}x{depth} heads", (heads, depth), w_heads))
    for label, feat, weight in shapes:
        x = torch.randn((args.n,) + feat, generator=gen).to(device).requires_grad_(True)
        grad = torch.randn((args.n,) + feat, generator=gen).to(device)
        row = {"width": label}
        systems: dict[str, Callable[[], torch.Tensor]] = {"gnnc": lambda: kernels.spmm(csr, x, weight)}
        if tk is not None:
            systems["gnnc-triton"] = lambda: tk.spmm(csr, x, weight)
        if len(feat) == 1:
            systems["torch.sparse"] = lambda: torch.sparse.mm(a_csr, x)
        if pyg is not None:
            systems["pyg"] = lambda: pyg(x, edge_index, weight)
        for name, forward in systems.items():
            row[f"{name} fwd"], row[f"{name} fwd+bwd"] = time_fwd_bwd(forward, grad, args.repeat, not rows, sync)
            x.grad = None
        rows.append(row)
        print_row(row, device, header=len(rows) == 1)
    if tk is not None:
        rows += bench_attention(csr, device, args, tk, gen, sync)
    return rows


def bench_attention(csr, device: torch.device, args: argparse.Namespace, tk, gen: torch.Generator,
                    sync: Callable[[], None]) -> list[dict]:
    """GAT's SDDMM-dot and edge softmax (8 heads of 16) and dropout (p = 0.5, [n, 128]), torch's path against the
    Triton kernels."""
    from gnnc.runtime import rng
    from gnnc.runtime.kernels import cpu

    heads, depth = 8, 16
    a = torch.randn(args.n, heads, depth, generator=gen).to(device).requires_grad_(True)
    b = torch.randn(args.n, heads, depth, generator=gen).to(device).requires_grad_(True)
    e = torch.randn(csr.nnz, heads, generator=gen).to(device).requires_grad_(True)
    grad = torch.randn(csr.nnz, heads, generator=gen).to(device)
    x = torch.randn(args.n, 128, generator=gen).to(device).requires_grad_(True)
    ids = torch.arange(args.n, device=device)
    key, keep = rng.stream_key(0, 1), rng.threshold(0.5)
    cases = {"sddmm dot": ({"torch": lambda: cpu.sddmm(csr, a, b, "dot"),
                            "triton": lambda: tk.sddmm(csr, a, b, "dot")}, grad),
             "edge_softmax": ({"torch": lambda: cpu.edge_softmax(csr, e),
                               "triton": lambda: tk.edge_softmax(csr, e)}, grad),
             "dropout": ({"torch": lambda: x * rng.dropout_mask(key, ids, (128,), 0.5),
                          "triton": lambda: tk.dropout(x, ids, key, keep, 2.0, 0)}, torch.randn_like(x))}
    rows = []
    print(f"\nGAT's edge kernels ({heads} heads of {depth}) and dropout ([n, 128]) on {device}: seconds, median "
          "(fwd+bwd)", flush=True)
    for op, (systems, g) in cases.items():
        row = {"width": op}
        for name, forward in systems.items():
            row[f"{name} fwd"], row[f"{name} fwd+bwd"] = time_fwd_bwd(forward, g, args.repeat, True, sync)
        print(f"{op:>14} torch {row['torch fwd+bwd']:.4f}  triton {row['triton fwd+bwd']:.4f}  "
              f"({row['torch fwd+bwd'] / row['triton fwd+bwd']:.2f}x)", flush=True)
        rows.append(row)
    return rows


COLUMNS = ["gnnc", "gnnc-triton", "torch.sparse", "pyg"]


def print_row(row: dict, device: torch.device, header: bool) -> None:
    if header:
        print(f"\nSpMM on {device} ({torch.get_num_threads()} threads): seconds, median; "
              "x = other / gnnc", flush=True)
        head = f"{'width':>14}"
        for phase in ("fwd", "fwd+bwd"):
            for name in COLUMNS:
                head += f" {name + ' ' + phase:>18}"
        print(head, flush=True)
    line = f"{row['width']:>14}"
    for phase in ("fwd", "fwd+bwd"):
        ours = row[f"gnnc {phase}"]
        for name in COLUMNS:
            t = row.get(f"{name} {phase}")
            if t is None:
                line += f" {'-':>18}"
            elif name == "gnnc":
                line += f" {t:>18.4f}"
            else:
                line += f" {f'{t:.4f} ({t / ours:.1f}x)':>18}"
    print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200_000, help="vertices")
    p.add_argument("--m", type=int, default=2_000_000, help="edges (uniform random)")
    p.add_argument("--widths", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64, 128, 256])
    p.add_argument("--repeat", type=int, default=3, help="timed runs per figure (after one warm-up)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_device_argument(p, default="all", extra="|all")
    p.add_argument("--no-pyg", action="store_true", help="skip PyG (its per-edge rows need nnz x F memory)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON (benchmarks/gpu_check.py reads it)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # 'all' (the default): the CPU, and CUDA when present
    names = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) if args.device == "all" else \
        [resolve_device_or_exit(args.device)]
    print(f"uniform random graph: {args.n} vertices, {args.m} edges", flush=True)
    out = {}
    for name in names:
        out[name] = bench_device(torch.device(name), args)
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.n, "m": args.m, "rows": out}, indent=2))


if __name__ == "__main__":
    main()
