"""gnnc against PyG and against the floor, side by side in one run: epoch time and peak memory.

For each model (GCN, SAGE, GAT) three measurements on the same graph and sizes, each in a fresh
subprocess so that its peak RSS is its own:

* PyG: GCNConv (cached=True, so its normalisation is computed once as gnnc's is), SAGEConv or
  GATConv on `edge_index`, the same dropout, Adam (lr 0.01, weight decay 5e-4).
* gnnc: the compiled examples/<model>.gnn, an epoch as `gnnc run` runs it.
* the floor: every SpMM, SDDMM and GEMM gnnc's lowered plan executes in an epoch, each timed alone
  with torch's fastest kernel for its shape (benchmarks/floor.py, which also profiles the rest).

An epoch is the training step (forward, backward, Adam) and the evaluation forward pass. Times are
medians over epochs after warm-up. Peak RSS is the process's high-water mark during the timed
epochs (VmHWM, reset before them), which includes what the process held before them (torch's
libraries, about 300 MiB, the graph, the parameters); "+MiB" is the part the epochs add above that
(activations, gradients, temporaries). The table gives PyG's epoch over gnnc's (the speed-up), gnnc's
over the floor, and gnnc's memory over PyG's; the load average before and after is printed, since
the times mean little on a loaded machine.

    python benchmarks/vs_pyg.py                     # 200K vertices, 2M uniform edges, F=128, hidden 128
    python benchmarks/vs_pyg.py --graph rmat        # R-MAT (power-law) of the same size
    python benchmarks/vs_pyg.py --graph cora        # the examples' own sizes (GCN 16, GAT 8 heads x 8)
    python benchmarks/vs_pyg.py --rounds 3           # each system three times, alternating: medians
    python benchmarks/vs_pyg.py --n 20000 --m 200000 --quick
    python benchmarks/vs_pyg.py --device cuda      # where a GPU is present (auto: CUDA when present)
    python benchmarks/vs_pyg.py --device cuda --n 2400000 --m 62000000 --features 100 --hidden 256 --classes 47

On CUDA every tensor of both systems is on the GPU, epochs are timed to the completion of their
kernels, and peak memory is torch's peak allocation on the GPU; a system that runs out of GPU memory
reports it in its row. The floor is the CPU's (torch's CPU kernels): on a GPU its column stays empty.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import floor  # benchmarks/floor.py: the graphs, the models, the floor and the epoch timing
from device_arg import add_device_argument, resolve_device_or_exit

SYSTEMS = ("pyg", "gnnc", "floor")


def _sizes(model: str, hidden: int | None, heads: int) -> tuple[int, int]:
    """(width per head, heads) of the hidden layer, as floor.model_sizes gives the gnnc example."""
    if hidden is None:
        return (8, 8) if model == "gat" else (16, 1)
    return (hidden // heads, heads) if model == "gat" else (hidden, 1)


def pyg_two_layer(model: str, f: int, width: int, heads: int, classes: int):
    """The two-layer PyG model the gnnc examples are compared with (GCNConv, SAGEConv or GATConv; dropout and
    activation as the examples have them): the module and `forward(x, edge_index_or_adj_t, training)`."""
    import torch
    import torch.nn.functional as F
    from torch_geometric import nn as pyg

    if model == "gcn":
        convs = [pyg.GCNConv(f, width, cached=True), pyg.GCNConv(width, classes, cached=True)]
    elif model == "sage":
        convs = [pyg.SAGEConv(f, width), pyg.SAGEConv(width, classes)]
    else:
        convs = [pyg.GATConv(f, width, heads=heads, dropout=0.6),
                 pyg.GATConv(width * heads, classes, heads=1, dropout=0.6)]
    net = torch.nn.ModuleList(convs)
    p = 0.6 if model == "gat" else 0.5
    act = F.elu if model == "gat" else F.relu

    def forward(x, ei, training: bool):
        z = F.dropout(x, p, training=training)
        z = act(net[0](z, ei))
        z = F.dropout(z, p, training=training)
        return net[1](z, ei)

    return net, forward


def pyg_epoch(model: str, graph, args):
    """PyG's epoch for `model` on args.device: a training step, then the evaluation forward pass."""
    import torch
    import torch.nn.functional as F

    device = torch.device(args.device)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long().to(device)  # R-MAT: int32
    x = (graph.x.to_dense() if graph.x.is_sparse else graph.x).to(device)
    y, mask = graph.y.to(device), graph.train_mask.to(device)
    width, heads = _sizes(model, args.hidden, args.heads)
    f, c = x.shape[1], int(graph.y.max()) + 1
    net, forward_on = pyg_two_layer(model, f, width, heads, c)
    net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)

    def forward(training: bool):
        return forward_on(x, ei, training)

    def step() -> None:
        net.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(True)[mask], y[mask]).backward()
        opt.step()
        net.eval()
        with torch.no_grad():
            forward(False)

    return step


def run_one(system: str, model: str, args) -> dict:
    """Body of one subprocess: build, warm up, time; the epoch and the peak RSS during the timed epochs."""
    import torch

    from gnnc.runtime.memory import set_up_allocator

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    graph = floor.bench_graph(args.graph, args.n, args.m, args.features, args.classes)
    out = {"system": system, "model": model, "graph": graph.name, "vertices": graph.num_nodes,
           "edges": graph.num_edges}
    if system == "pyg":
        step = pyg_epoch(model, graph, args)
    else:
        plan = floor.compile_model(model, graph, args.hidden, args.heads)
        if system == "floor":
            set_up_allocator()  # as gnnc's worker does: outputs are allocated as in its epoch
            ops = floor.measure_floor(plan.program, graph, args.repeat)
            return {**out, "epoch_s": sum(op.seconds for op in ops), "kernels": len(ops)}
        step = floor.gnnc_epoch(plan.program, graph, args.device, args.precision)
        out["cpu_kernels"] = floor.cpu_code()
    timed = floor.time_epochs(step, args.epochs, args.warmup, torch.device(args.device))
    return {**out, "epoch_s": timed.epoch_s, "peak_bytes": timed.peak_bytes,
            "epoch_bytes": timed.peak_bytes - timed.before_bytes}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def main() -> None:
    from gnnc.host import use_huge_pages

    use_huge_pages()  # every system's subprocess inherits it: PyG, gnnc and the floor allocate alike, as gnnc runs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    floor.add_arguments(ap)
    ap.add_argument("--models", default="gcn,sage,gat")
    add_device_argument(ap)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="gnnc's (PyG's stays fp32)")
    ap.add_argument("--quick", action="store_true", help="3 epochs after 1 warm-up, 3 runs per floor kernel")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON (benchmarks/gpu_check.py reads it)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, the three alternating, and report each one's medians "
                         "(the machine's drift then falls on all three alike)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: system:model in this process
    args = floor.resolve(ap.parse_args())
    args.device = resolve_device_or_exit(args.device)
    if args.quick:
        args.epochs, args.warmup, args.repeat = 3, 1, 3
    if args.one:
        system, model = args.one.split(":")
        print(json.dumps(run_one(system, model, args)))
        return

    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    forwarded = [a for a in _without_option(sys.argv[1:], ("--device", "--json", "--rounds")) if a != "--quick"]
    forwarded += ["--epochs", str(args.epochs), "--warmup", str(args.warmup), "--repeat", str(args.repeat),
                  "--device", args.device]
    load_before = floor.loadavg()
    started = time.perf_counter()
    runs: dict[tuple[str, str], list[dict]] = {}
    models = args.models.split(",")
    for _ in range(args.rounds):
        for model in models:
            for system in SYSTEMS if args.device == "cpu" else SYSTEMS[:2]:
                r = subprocess.run([sys.executable, str(Path(__file__)), *forwarded, "--one", f"{system}:{model}"],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    row = {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
                else:
                    row = json.loads(r.stdout.strip().splitlines()[-1])
                runs.setdefault((system, model), []).append(row)
    rows = {key: _median_row(every) for key, every in runs.items()}
    first = next((r for r in rows.values() if "graph" in r), {})
    kernels = next((r["cpu_kernels"] for r in rows.values() if "cpu_kernels" in r), "?")
    sizes = "the examples' own sizes" if args.hidden is None else f"hidden {args.hidden} (GAT {args.heads} heads)"
    print(f"graph {first.get('graph', args.graph)}: {first.get('vertices', '?')} vertices, {first.get('edges', '?')} "
          f"edges; {sizes}; {args.threads} threads; device {args.device}, gnnc at {args.precision}; "
          f"gnnc's CPU kernels: {kernels}")
    rounds = f"; each figure the median of {args.rounds} runs, the systems alternating" if args.rounds > 1 else ""
    print(f"epoch = training step + evaluation forward; median of {args.epochs} after {args.warmup}; "
          f"peak RSS during the timed epochs{rounds}")
    print(f"{'model':6s} {'PyG s':>8s} {'gnnc s':>8s} {'floor s':>8s} {'PyG/gnnc':>9s} {'gnnc/floor':>10s} "
          f"{'PyG MiB':>8s} {'gnnc MiB':>9s} {'ratio':>6s} {'PyG +MiB':>9s} {'gnnc +MiB':>10s} {'ratio':>6s}")
    for model in models:
        p, g, fl = (rows.get((s, model), {}) for s in SYSTEMS)
        errors = [f"{s}: {r['error']}" for s, r in zip(SYSTEMS, (p, g, fl)) if "error" in r]

        def sec(t: float | None) -> str:
            return f"{t:8.4f}" if t is not None else f"{'-':>8s}"

        def mib(b: int | None, w: int) -> str:
            return f"{b / 2**20:{w}.0f}" if b is not None else f"{'-':>{w}s}"

        pt, gt, ft = p.get("epoch_s"), g.get("epoch_s"), fl.get("epoch_s")
        pm, gm, pe, ge = p.get("peak_bytes"), g.get("peak_bytes"), p.get("epoch_bytes"), g.get("epoch_bytes")
        print(f"{model:6s} {sec(pt)} {sec(gt)} {sec(ft)} {_ratio(pt, gt):>9s} {_ratio(gt, ft):>10s} "
              f"{mib(pm, 8)} {mib(gm, 9)} {_ratio(gm, pm):>6s} {mib(pe, 9)} {mib(ge, 10)} {_ratio(ge, pe):>6s}"
              + (f"   ({'; '.join(errors)})" if errors else ""))
    print(f"load average {load_before} before, {floor.loadavg()} after ({time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "one"},
                                               "rows": [{"system": s, "model": m, **r} for (s, m), r in rows.items()]},
                                              indent=2))


def _median_row(every: list[dict]) -> dict:
    """One system's runs of a model as one row: the median of each measured figure (the first error, if a run
    failed). The ratios are then taken between medians."""
    failed = next((r for r in every if "error" in r), None)
    if failed is not None:
        return failed
    row = dict(every[0])
    for key in ("epoch_s", "peak_bytes", "epoch_bytes"):
        if key in row:
            row[key] = statistics.median(r[key] for r in every)
    row["runs"] = [r.get("epoch_s") for r in every]
    return row


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
