"""Full-graph training at ogbn-products size, gnnc beside PyG in the same run (issue 35 item 4).

The graph is the products-sized R-MAT: 2,449,029 vertices, 123,718,280 directed edges, 100 features, 47 classes
(`rmat:n=...,deg=50.52,...`); `--scale S` takes S of its vertices at the same average degree (S of its edges), for
a machine that cannot hold it, and the results file says which scale ran. Models: GCN and GraphSAGE (hidden 256),
GAT (4 heads x 64). Peers, each in its own process:

* gnnc in one process (`gnnc.run`, what `gnnc run MODEL --graph G` runs), the same with `--recompute`, and on
  `--nproc 2` with depcomm (its default METIS partition, and `-g3`: `--partition g3`, edges balanced too) and with
  the planner's choice;
* PyG: GCNConv (cached), SAGEConv, GATConv on `edge_index`, and on a `torch.sparse` CSR adjacency (adj_t: what a
  PyG user does to save memory) where the layer accepts one; the same dropout, Adam, an evaluation forward pass
  after each step.

Per row: the training step's median over the epochs after the first, the evaluation's, and the peak resident set:
the process's high-water mark (VmHWM) in one process, the largest rank's and, sampled, the sum over the process
tree on two. Every peer runs under a watchdog that samples its process tree's resident memory and kills it above
`--limit-gib` GiB: that row reads "out of memory at N GiB" and the benchmark goes on (an address-space limit,
RLIMIT_AS, would refuse torch's large virtual reservations long before its resident memory got there).

The graph is generated once and converted into a memory-mapped store (`gnnc convert`, under `--store`, reused by
later runs of the same scale): every peer maps it (`--graph DIR`) instead of generating it again. Progress lines on
stdout carry the elapsed time; each run appends its own section to the results file, with the load average at
each peer's start and end beside its times, and each model's one-process peak against its floor and the largest
rank's peak on two processes against the one-process peak (the issue's 0.6x).

Each model's floor: the features (N x 100 x 4 bytes), the CSR in both directions (int64 index and f32 weight per
edge, twice, and the row pointers), one [N, width] tensor kept per layer and two transient [N, hidden] gradients
(the issue's count for GCN); GAT keeps each layer's attention coefficients too (edges x heads x 4 bytes). SAGE's
floor is GCN's: its neighbour mean need not be kept (mean(x) W = mean(x W), so the weight's gradient reads x, which
is kept anyway; gnnc's reorder-gemm runs it so). Counted with the mean ([N, width in] per layer) as it was until
session 21, the floor was above what gnnc's SAGE peaked at: not a floor.

    python benchmarks/products.py --models gcn,sage,gat --epochs 2   # the full size: the machine alone, about 20 GiB
    python benchmarks/products.py --scale 0.02 --epochs 3 --limit-gib 3.5   # a check on a shared machine
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
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
PEERS = ("gnnc", "gnnc-recompute", "gnnc-nproc2-depcomm", "gnnc-nproc2-depcomm-g3", "gnnc-nproc2-planner",
         "pyg-edge_index", "pyg-csr")
STORE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gnnc" / "products"


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
    return float(out)


# ----- one peer, in its own process


def run_gnnc(model: str, spec: str, epochs: int, peer: str) -> dict:
    from gnnc import api

    file, sets = MODELS[model]
    nproc = 2 if "nproc2" in peer else None
    strategy = "depcomm" if "-depcomm" in peer else None
    # -g3: METIS with vertices and in-edges balanced, then G3's swaps (METIS, depcomm's default, balances vertices:
    # at 0.05 one of 2 ranks held 73% of the edges)
    partition = "g3" if peer.endswith("-g3") else None
    result = api.run(api.load_model(ROOT / "examples" / file, **sets), spec, epochs=epochs, seed=0, nproc=nproc,
                     strategy=strategy, partition=partition, want_logits=False,
                     recompute=peer == "gnnc-recompute" or None)
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
        out = {"epoch_s": statistics.median(steps[1:] or steps), "eval_s": statistics.median(evals[1:] or evals),
               "peak_bytes": peak_rss_bytes(), "test_acc": acc, "epochs_done": len(steps)}
        # after every epoch: a peer stopped at --timeout still reports the epochs it ran (the driver keeps the last)
        print("RESULT " + json.dumps(out), flush=True)
    return out


def peer_main(args: argparse.Namespace) -> None:
    fn = run_gnnc if args.peer.startswith("gnnc") else run_pyg
    try:
        out = fn(args.model, args.graph, args.epochs, args.peer)
    except Exception as exc:  # a layer that refuses the adjacency, a peer that fails: its row says why
        out = {"error": refused_allocation(str(exc)) or
               f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    print("RESULT " + json.dumps(out), flush=True)


def refused_allocation(message: str) -> str | None:
    """"out of memory: ..." for torch's CPU allocator refusing a tensor (PyG's [edges, width] messages at products'
    size ask for ~129 GB at once, refused before the watchdog's limit is reached), else None."""
    found = re.search(r"can't allocate memory: you tried to allocate (\d+) bytes", message)
    return None if found is None else \
        f"out of memory: a {int(found.group(1)) / 2**30:.1f} GiB allocation refused by torch's CPU allocator"


# ----- the driver: each peer in a process under a watchdog


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_and_peak(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes; (0, 0) once it is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, hwm


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and every descendant."""
    return sum(rss_and_peak(p)[0] for p in tree_pids(pid))


def run_peer(peer: str, model: str, spec: str, epochs: int, limit: float, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--peer", peer, "--model", model, "--graph", spec, "--epochs", str(epochs)]
    return watched(cmd, limit, timeout)


def watched(cmd: list[str], limit: float, timeout: float) -> dict:
    """Run `cmd` in a session of its own, killed when its process tree's resident memory passes `limit` bytes or
    it runs past `timeout` s; its last `RESULT {json}` line, with the tree's sampled peak and the wall time."""
    cpu0 = _children_cpu()
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
    # CPU seconds of the tree (its processes waited for; a killed one's too): on a loaded machine the wall time says
    # little, this says what the peer would take alone (about cpu / 2 on 2 cores)
    seen = {"tree_bytes": most, "wall_s": time.monotonic() - t0, "cpu_s": _children_cpu() - cpu0}
    out = proc.stdout.read() if proc.stdout else ""
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    partial = json.loads(lines[-1][len("RESULT "):]) if lines else {}  # a killed PyG peer's epochs so far
    if killed == "out of memory":
        return {**partial, "error": f"out of memory at {limit / 2**30:.1f} GiB", **seen}
    if killed:
        done = f" after {partial['epochs_done']} epoch(s)" if "epochs_done" in partial else ""
        return {**partial, "error": f"timed out after {timeout:.0f} s{done}", **seen}
    if not lines:
        return {"error": f"exit {proc.returncode}", **seen}
    return {**partial, **seen}


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def store_for(spec: str, root: Path, limit: float, timeout: float, progress) -> tuple[Path, dict]:
    """The graph's store under `root` (one directory per spec), converted once by `gnnc convert` in a watched
    process; its manifest (vertex and edge counts) and how long the conversion took (0 when reused)."""
    from gnnc.graph.store import MANIFEST  # the store's manifest file; imports no torch

    path = root / spec.replace(":", "_").replace(",", "_").replace("=", "-")
    if not (path / MANIFEST).exists():
        progress(f"generating {spec} and converting it to {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "gnnc", "convert", spec, str(path)]
        r = watched(cmd + ["--json"], limit, timeout)
        if not (path / MANIFEST).exists():
            raise SystemExit(f"gnnc convert {spec} failed: {r.get('error', r)}")
        convert_s = r["wall_s"]
        progress(f"converted in {convert_s:.0f} s (process tree peak {gib(r['tree_bytes'])} GiB)")
    else:
        convert_s = 0.0
        progress(f"reusing the store {path}")
    manifest = json.loads((path / MANIFEST).read_text())
    return path, {"n": int(manifest["num_nodes"]), "e": int(manifest["num_edges"]), "convert_s": convert_s}


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def gib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def section(args: argparse.Namespace, spec: str, info: dict, started: str, rows: list[tuple[str, str, dict]]) -> str:
    """This run's section of the results file (rewritten after every peer: a run cut short keeps its rows)."""
    n, e = info["n"], info["e"]
    size = "the products size" if args.scale == 1 else (f"{args.scale:g} of products' size, NOT the full size: the "
                                                        "full run needs the machine alone")
    conv = (f"generated and converted to a store in {info['convert_s']:.0f} s" if info["convert_s"]
            else "the store of an earlier run reused")
    # the peers inherit this process's environment: a run without the block cache says so beside its command
    switch = "".join(f"{k}={os.environ[k]} " for k in ("GNNC_BLOCK_CACHE", "GNNC_NATIVE") if k in os.environ)
    lines = [f"## {started}: --scale {args.scale:g}, {args.models}", "",
             f"`{switch}python benchmarks/products.py --scale {args.scale:g} --models {args.models} "
             f"--peers {args.peers} --epochs {args.epochs} --limit-gib {args.limit_gib:g}`: graph `{spec}` ({n:,} vertices, {e:,} directed "
             f"edges; {size}; {conv}).",
             "Epoch: the training step's median over the epochs after the first; evaluation: the evaluation "
             "forward's; load: the load average (1 min) at the peer's start and end (above 2.5: a loaded machine, "
             "times not comparable); wall, cpu: the peer's whole process (start, graph, every epoch) in wall and CPU "
             "seconds; peak: the largest process's VmHWM (tree: the peer's process tree, sampled); "
             "floor: the model's floor (module docstring of benchmarks/products.py).", "",
             "| model | peer | epoch s | evaluation s | load | wall s | cpu s | peak GiB | tree GiB | floor GiB "
             "| note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, peer, r in rows:
        note = r.get("error") or ", ".join(f"{k} {v}" for k, v in r.items()
                                            if k in ("strategies", "test_acc") and v is not None)
        cells = [model, peer, f"{r['epoch_s']:.3f}" if "epoch_s" in r else "-",
                 f"{r['eval_s']:.3f}" if "eval_s" in r else "-", r.get("load", "-"), f"{r.get('wall_s', 0):.0f}",
                 f"{r.get('cpu_s', 0):.0f}",
                 gib(r.get("peak_bytes")), gib(r.get("tree_bytes")), gib(floor_bytes(model, n, e)), note]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for model in dict.fromkeys(m for m, _, _ in rows):
        got = {peer: r for m, peer, r in rows if m == model}
        one = got.get("gnnc", {}).get("peak_bytes")
        said = []
        if one:
            said.append(f"one process {gib(one)} GiB, {one / floor_bytes(model, n, e):.2f}x its floor")
        for peer in ("gnnc-recompute", "gnnc-nproc2-depcomm", "gnnc-nproc2-depcomm-g3", "gnnc-nproc2-planner"):
            peak = got.get(peer, {}).get("peak_bytes")
            if one and peak:
                what = "largest rank" if "nproc2" in peer else "peak"
                said.append(f"{peer}: {what} {peak / one:.2f}x the one-process peak")
        if said:
            lines.append(f"- {model}: " + "; ".join(said) + ".")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of products' vertices (and edges); 1: full")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--models", default="gcn,sage,gat", help="comma-separated, of " + ",".join(MODELS))
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of " + ",".join(PEERS))
    ap.add_argument("--limit-gib", type=float, default=22.0, help="a peer's process tree is killed above this")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a peer may run")
    ap.add_argument("--store", default=str(STORE),
                    help="where the graph is converted once (a store per scale, reused by later runs)")
    ap.add_argument("-o", "--output", default=str(RESULTS), help="the results file a section is appended to")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_main(args)
    models, peers = args.models.split(","), args.peers.split(",")
    for name, given, known in (("model", models, MODELS), ("peer", peers, PEERS)):
        bad = [x for x in given if x not in known]
        if bad:
            ap.error(f"unknown {name} {bad[0]!r}: expected some of {','.join(known)}")
    t0 = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - t0:7.0f} s] {line}", flush=True)

    spec = graph_spec(args.scale)
    limit = args.limit_gib * 2**30
    store, info = store_for(spec, Path(args.store), limit, args.timeout, progress)
    out = Path(args.output)
    before = out.read_text() if out.exists() else \
        "# Full-graph training at ogbn-products size: gnnc beside PyG (issue 35 item 4)\n"
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[tuple[str, str, dict]] = []
    for model in models:
        for peer in peers:
            load = loadavg().split()[0]
            progress(f"{model} {peer}: started (load {load})")
            r = run_peer(peer, model, str(store), args.epochs, limit, args.timeout)
            r["load"] = f"{load} / {loadavg().split()[0]}"
            rows.append((model, peer, r))
            said = r.get("error") or (f"epoch {r.get('epoch_s', 0):.2f} s, evaluation {r.get('eval_s', 0):.2f} s, "
                                      f"peak {gib(r.get('peak_bytes'))} GiB")
            progress(f"{model} {peer}: {said} (tree {gib(r['tree_bytes'])} GiB, {r['wall_s']:.0f} s wall, "
                     f"{r['cpu_s']:.0f} s cpu)")
            out.write_text(before.rstrip("\n") + "\n\n" + section(args, spec, info, started, rows))
    progress(f"appended to {out}")


if __name__ == "__main__":
    main()
