"""Full-graph training at ogbn-products size, gnnc beside PyG in the same run (issue 35 item 4).

The graph is the products-sized R-MAT: 2,449,029 vertices, 123,718,280 directed edges, 100 features, 47 classes
(`rmat:n=...,deg=50.52,...`); `--scale S` takes S of its vertices at the same average degree (S of its edges), for
a machine that cannot hold it, and the results file says which scale ran. Models: GCN and GraphSAGE (hidden 256),
GAT (4 heads x 64). Peers, each in its own process:

* gnnc in one process (`gnnc.run`, what `gnnc run MODEL --graph G` runs), and on `--nproc 2` with depcomm and with
  the planner's choice;
* PyG: GCNConv (cached), SAGEConv, GATConv on `edge_index`, and on a `torch.sparse` CSR adjacency (adj_t: what a
  PyG user does to save memory) where the layer accepts one; the same dropout, Adam, an evaluation forward pass
  after each step.

Per row: the training step's median over the epochs after the first, the evaluation's, and the peak resident set:
the process's high-water mark (VmHWM) in one process, the largest rank's and, sampled, the sum over the process
tree on two. Every peer runs under a watchdog that samples its process tree's resident memory and kills it above
`--limit-gib` GiB: that row reads "out of memory at N GiB" and the benchmark goes on (an address-space limit,
RLIMIT_AS, would refuse torch's large virtual reservations long before its resident memory got there).

Each model's floor: the features (N x 100 x 4 bytes), the CSR in both directions (int64 index and f32 weight per
edge, twice, and the row pointers), one [N, width] tensor kept per layer and two transient [N, hidden] gradients
(the issue's count for GCN); GAT keeps each layer's attention coefficients too (edges x heads x 4 bytes), SAGE
each layer's neighbour mean ([N, width in]).

    python benchmarks/products.py                   # the full size: the machine alone, about 20 GiB
    python benchmarks/products.py --scale 0.02 --epochs 3 --limit-gib 3.5   # a check on a shared machine
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS-products.md"
VERTICES, EDGES, FEATURES, CLASSES = 2_449_029, 123_718_280, 100, 47
MODELS = {"gcn": ("gcn.gnn", {"hidden": 256}), "sage": ("sage.gnn", {"hidden": 256}),
          "gat": ("gat.gnn", {"hidden": 64, "heads": 4})}
PEERS = ("gnnc", "gnnc-nproc2-depcomm", "gnnc-nproc2-planner", "pyg-edge_index", "pyg-csr")


def graph_spec(scale: float) -> str:
    n = max(int(round(VERTICES * scale)), 100)
    return f"rmat:n={n},deg={EDGES / VERTICES:.4f},features={FEATURES},classes={CLASSES},seed=0"


def floor_bytes(model: str, n: int, e: int) -> float:
    """The model's floor (module docstring)."""
    width, heads = (256, 1) if model != "gat" else (256, 4)
    csr = 2 * (e * (8 + 4) + (n + 1) * 8)
    kept = n * width * 4 + n * CLASSES * 4  # one [N, width] per layer
    out = n * FEATURES * 4 + csr + kept + 2 * n * width * 4
    if model == "gat":
        out += 2 * e * heads * 4
    if model == "sage":
        out += n * (FEATURES + width) * 4
    return float(out)


# ----- one peer, in its own process


def run_gnnc(model: str, spec: str, epochs: int, peer: str) -> dict:
    from gnnc import api

    file, sets = MODELS[model]
    nproc = 2 if "nproc2" in peer else None
    strategy = "depcomm" if peer.endswith("depcomm") else None
    result = api.run(api.load_model(ROOT / "examples" / file, **sets), spec, epochs=epochs, seed=0, nproc=nproc,
                     strategy=strategy, want_logits=False)
    return {"epoch_s": result.epoch_time_s, "eval_s": result.eval_time_s, "peak_bytes": result.peak_rss_bytes,
            "predicted_bytes": result.predicted_peak_rss_bytes, "strategies": sorted(set(result.strategies)),
            "test_acc": result.test_acc}


def run_pyg(model: str, spec: str, epochs: int, peer: str) -> dict:
    import torch
    import torch.nn.functional as F
    from torch_geometric.utils import to_torch_csr_tensor
    from vs_pyg import pyg_two_layer  # this folder is the script's, on sys.path

    from gnnc import api
    from gnnc.runtime.metrics import peak_rss_bytes

    graph = api.load_graph(spec)
    n = graph.num_nodes
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    if peer == "pyg-csr":  # adj_t[dst, src]: a row per destination, as PyG's sparse path reads it
        adj = to_torch_csr_tensor(ei.flip(0), size=(n, n))
        del ei
        ei = adj
    x, y, mask = graph.x.to_dense() if graph.x.is_sparse else graph.x, graph.y, graph.train_mask
    net, forward_on = pyg_two_layer(model, x.shape[1], 64 if model == "gat" else 256, 4 if model == "gat" else 1,
                                    CLASSES)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)

    def forward(training: bool):
        return forward_on(x, ei, training)

    steps, evals = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        net.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(True)[mask], y[mask]).backward()
        opt.step()
        t1 = time.perf_counter()
        net.eval()
        with torch.no_grad():
            logits = forward(False)
        steps.append(t1 - t0)
        evals.append(time.perf_counter() - t1)
    acc = float((logits.argmax(1)[graph.test_mask] == y[graph.test_mask]).float().mean())
    return {"epoch_s": statistics.median(steps[1:] or steps), "eval_s": statistics.median(evals[1:] or evals),
            "peak_bytes": peak_rss_bytes(), "test_acc": acc}


def peer_main(args: argparse.Namespace) -> None:
    fn = run_gnnc if args.peer.startswith("gnnc") else run_pyg
    try:
        out = fn(args.model, args.graph, args.epochs, args.peer)
    except Exception as exc:  # a layer that refuses the adjacency, a peer that fails: its row says why
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    print("RESULT " + json.dumps(out), flush=True)


# ----- the driver: each peer in a process under a watchdog


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and every descendant (read from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def run_peer(peer: str, model: str, spec: str, epochs: int, limit: float, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--peer", peer, "--model", model, "--graph", spec, "--epochs", str(epochs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, cwd=ROOT)
    most, t0, killed = 0, time.monotonic(), None
    while proc.poll() is None:
        most = max(most, tree_rss(proc.pid))
        if most > limit or time.monotonic() - t0 > timeout:
            killed = "out of memory" if most > limit else "timed out"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    if killed == "out of memory":
        return {"error": f"out of memory at {limit / 2**30:.1f} GiB", "tree_bytes": most}
    if killed:
        return {"error": f"timed out after {timeout:.0f} s", "tree_bytes": most}
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"error": f"exit {proc.returncode}", "tree_bytes": most}
    return {**json.loads(lines[-1][len("RESULT "):]), "tree_bytes": most}


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def gib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def write_results(args: argparse.Namespace, spec: str, n: int, e: int, before: str,
                  rows: list[tuple[str, str, dict]]) -> None:
    after = loadavg()
    lines = ["# Full-graph training at ogbn-products size: gnnc beside PyG (issue 35 item 4)", "",
             f"`python benchmarks/products.py --scale {args.scale:g} --epochs {args.epochs} --limit-gib "
             f"{args.limit_gib:g}`: graph `{spec}` ({n:,} vertices, {e:,} directed edges"
             + ("; the products size" if args.scale == 1 else f"; {args.scale:g} of products' size, NOT the full "
                "size: the full run needs the machine alone") + ").",
             f"Load average before {before}, after the last row {after}"
             + (" (loaded: a shared machine; times are not comparable)." if float(before.split()[0]) > 2.5 else "."),
             "Epoch: the training step's median over the epochs after the first; evaluation: the evaluation "
             "forward's; peak: the largest process's VmHWM (tree: the peer's process tree, sampled).", "",
             "| model | peer | epoch s | evaluation s | peak GiB | tree GiB | floor GiB | note |",
             "|---|---|---|---|---|---|---|---|"]
    for model, peer, r in rows:
        note = r.get("error") or ", ".join(f"{k} {v}" for k, v in r.items()
                                            if k in ("strategies", "test_acc") and v is not None)
        cells = [model, peer, f"{r['epoch_s']:.3f}" if "epoch_s" in r else "-",
                 f"{r['eval_s']:.3f}" if "eval_s" in r else "-", gib(r.get("peak_bytes")), gib(r.get("tree_bytes")),
                 gib(floor_bytes(model, n, e)), note]
        lines.append("| " + " | ".join(cells) + " |")
    Path(args.output).write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of products' vertices (and edges)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--limit-gib", type=float, default=22.0, help="a peer's process tree is killed above this")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a peer may run")
    ap.add_argument("-o", "--output", default=str(RESULTS))
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_main(args)
    spec = graph_spec(args.scale)
    from gnnc import api  # the graph's size, for the floors (loaded here once; each peer loads its own)

    g = api.load_graph(spec)
    n, e = g.num_nodes, g.num_edges
    del g
    before = loadavg()
    rows: list[tuple[str, str, dict]] = []
    for model in args.models.split(","):
        for peer in args.peers.split(","):
            r = run_peer(peer, model, spec, args.epochs, args.limit_gib * 2**30, args.timeout)
            rows.append((model, peer, r))
            print(model, peer, json.dumps(r), flush=True)
            write_results(args, spec, n, e, before, rows)  # after every peer: a long run cut short keeps its rows
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
