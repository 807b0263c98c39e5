"""gnnc against PyG, side by side in one run: epoch time, peak memory, and the floor.

For each model (GCN, SAGE, GAT) the same graph, sizes and optimizer run in
gnnc (the compiled examples/*.gnn) and in PyG (GCNConv / SAGEConv / GATConv),
each in a fresh subprocess so peak RSS is its own. An epoch is forward,
backward and an Adam step; the time is the median over epochs after warm-up.
The floor is the epoch's SpMM and GEMM work timed alone at the rates torch
reaches in the same run (for GCN: two SpMMs forward, their transposes
backward, and the dense products).

    python benchmarks/vs_pyg.py                   # 200K vertices, 2M edges, 128 features, hidden 128
    python benchmarks/vs_pyg.py --n 20000 --quick  # a smaller graph, fewer epochs
    python benchmarks/vs_pyg.py --device cuda      # where a GPU is present (auto: CUDA when present)
    python benchmarks/vs_pyg.py --device cuda --n 2400000 --m 62000000 --features 100 --hidden 256 --classes 47

On CUDA every tensor of both systems is on the GPU, epochs are timed to the
completion of their kernels, and peak memory is torch's peak allocation on
the GPU; a system that runs out of GPU memory reports it in its row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from device_arg import add_device_argument, resolve_device_or_exit

ROOT = Path(__file__).resolve().parent.parent


def uniform_graph(n: int, m: int, features: int, classes: int, seed: int = 0):
    import numpy as np
    import torch

    from gnnc.graph import Graph

    rs = np.random.RandomState(seed)
    src = rs.randint(0, n, m).astype(np.int64)
    dst = rs.randint(0, n, m).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    train = torch.rand(n, generator=g) < 0.6
    return Graph(n, src, dst, torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g),
                 train, ~train, ~train, f"uniform-{n}-{m}")


def _time_epochs(step, epochs: int, warmup: int, sync) -> list[float]:
    times = []
    for i in range(warmup + epochs):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_one(system: str, model: str, args) -> dict:
    """Body of one subprocess: build, warm up, time, report peak memory."""
    import resource

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    graph = uniform_graph(args.n, args.m, args.features, args.classes)
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
    if system == "gnnc":
        from gnnc import api
        from gnnc.runtime.device import grad_scaler
        from gnnc.runtime.train import TrainConfig, Worker, make_optimizer, train_step
        from gnnc.runtime.executor import init_params

        params = {"gcn": {"hidden": args.hidden}, "sage": {"hidden": args.hidden},
                  "gat": {"hidden": args.hidden // args.heads, "heads": args.heads}}[model]
        plan = api.compile(api.load_model(ROOT / "examples" / f"{model}.gnn", **params), graph)
        cfg = TrainConfig(seed=0, progress=False, device=args.device, precision=args.precision)
        worker = Worker(plan.program, graph, cfg)
        del graph  # the worker holds what it needs, on the device
        p = init_params(plan.program, 0, worker.device)
        opt = make_optimizer(plan.program, p, cfg)
        scaler = grad_scaler(worker.device, cfg.precision)
        epoch = [0]

        def step():
            train_step(worker, p, opt, scaler, epoch[0])  # what `gnnc run` does each epoch
            epoch[0] += 1
    elif system == "pyg":
        import torch.nn.functional as F
        from torch_geometric import nn as pyg

        ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).to(device)
        x, y, mask = graph.x.to(device), graph.y.to(device), graph.train_mask.to(device)
        h, c = args.hidden, args.classes
        if model == "gcn":
            convs = torch.nn.ModuleList([pyg.GCNConv(args.features, h), pyg.GCNConv(h, c)])
        elif model == "sage":
            convs = torch.nn.ModuleList([pyg.SAGEConv(args.features, h), pyg.SAGEConv(h, c)])
        else:
            convs = torch.nn.ModuleList([pyg.GATConv(args.features, h // args.heads, heads=args.heads, dropout=0.6),
                                         pyg.GATConv(h, c, heads=1, dropout=0.6)])
        convs = convs.to(device)
        opt = torch.optim.Adam(convs.parameters(), lr=0.01, weight_decay=5e-4)
        p_drop = 0.6 if model == "gat" else 0.5
        act = F.elu if model == "gat" else F.relu

        def step():
            opt.zero_grad(set_to_none=True)
            z = F.dropout(x, p_drop, training=True)
            z = act(convs[0](z, ei))
            z = F.dropout(z, p_drop, training=True)
            z = convs[1](z, ei)
            loss = F.cross_entropy(z[mask], y[mask])
            loss.backward()
            opt.step()
    elif system == "floor":
        csr = graph.csr("self_loops")
        a = torch.sparse_csr_tensor(csr.indptr, csr.indices, torch.rand(csr.nnz), (csr.n_dst, csr.n_src))
        at = a.to_sparse_coo().t().to_sparse_csr().to(device)
        a = a.to(device)
        n, f, h, c = args.n, args.features, args.hidden, args.classes
        xs, w1, w2 = (torch.randn(n, f, device=device), torch.randn(f, h, device=device),
                      torch.randn(h, c, device=device))
        g2 = torch.randn(n, c, device=device)

        def step():
            # GCN's work: forward X W1, A (X W1), H W2, A (H W2); backward A^T G2, G2 W2^T, H^T G2', A^T G1, X^T G1'
            t1 = a @ (xs @ w1)
            _ = a @ (t1 @ w2)
            b2 = at @ g2
            _ = t1.t() @ b2
            b1 = at @ (b2 @ w2.t())
            _ = xs.t() @ b1
    else:
        raise ValueError(system)
    times = _time_epochs(step, args.epochs, args.warmup, sync)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    return {"system": system, "model": model, "epoch_s": statistics.median(times), "peak_bytes": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--m", type=int, default=2_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--models", default="gcn,sage,gat")
    add_device_argument(ap)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="gnnc's (PyG's stays fp32)")
    ap.add_argument("--quick", action="store_true", help="3 epochs after 1 warm-up")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON (benchmarks/gpu_check.py reads it)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: system:model in this process
    args = ap.parse_args()
    args.device = resolve_device_or_exit(args.device)
    if args.quick:
        args.epochs, args.warmup = 3, 1
    if args.one:
        system, model = args.one.split(":")
        print(json.dumps(run_one(system, model, args)))
        return
    passthrough = _without_option(sys.argv[1:], ("--device", "--json")) + ["--device", args.device]
    rows = {}
    print(f"graph: {args.n} vertices, {args.m} edges, {args.features} features, hidden {args.hidden}, "
          f"{args.threads} threads, device {args.device}; median of {args.epochs} epochs after {args.warmup}")
    for model in args.models.split(","):
        systems = ["gnnc", "pyg"] + (["floor"] if model == "gcn" else [])
        for system in systems:
            r = subprocess.run([sys.executable, __file__, *passthrough, "--one", f"{system}:{model}"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                rows[(system, model)] = {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                rows[(system, model)] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{'model':6s} {'gnnc s/epoch':>13s} {'PyG s/epoch':>12s} {'speed-up':>9s} {'gnnc MiB':>9s} "
          f"{'PyG MiB':>8s} {'mem ratio':>9s} {'floor s':>8s} {'gnnc/floor':>10s}")
    for model in args.models.split(","):
        g, p = rows[("gnnc", model)], rows[("pyg", model)]
        if "error" in g or "error" in p:
            print(f"{model:6s} gnnc: {g.get('error', 'ok')} | pyg: {p.get('error', 'ok')}")
            continue
        fl = rows.get(("floor", model))
        floor_s = f"{fl['epoch_s']:8.3f}" if fl and "error" not in fl else f"{'-':>8s}"
        ratio_floor = f"{g['epoch_s'] / fl['epoch_s']:10.2f}" if fl and "error" not in fl else f"{'-':>10s}"
        print(f"{model:6s} {g['epoch_s']:13.3f} {p['epoch_s']:12.3f} {p['epoch_s'] / g['epoch_s']:8.1f}x "
              f"{g['peak_bytes'] / 2**20:9.0f} {p['peak_bytes'] / 2**20:8.0f} {g['peak_bytes'] / p['peak_bytes']:9.2f} "
              f"{floor_s} {ratio_floor}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "one"},
                                               "rows": [{"system": s, "model": m, **r} for (s, m), r in rows.items()]},
                                              indent=2))


def _without_option(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv without `--name VALUE` / `--name=VALUE` for each name (the parent re-adds what it resolved)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not any(a.startswith(n + "=") for n in names):
            out.append(a)
    return out


if __name__ == "__main__":
    main()
