"""Graphs the size of the seeds' datasets, from disk (issue 34 item 5): every step's wall time and peak memory.

Steps (`--steps`, comma-separated; default all, in this order), each in its own process:

* `generate`: a papers100M-like graph at `--fraction` of ogbn-papers100M (default 0.1: 11.1M vertices, 161.6M
  directed edges, 128 features, 172 classes; 1.1% of the vertices labelled for training, 0.11% validation, 0.19%
  test, as OGB's split; every other vertex's label NaN, unlabelled), written streaming in OGB's own binary layout
  (`raw/data.npz`, `raw/node-label.npz`, `split/time/*.csv.gz`: what a user has after OGB's download) in blocks
  of `BLOCK` vertices and edges: neither the edges nor the feature matrix are ever whole in memory. Edges are
  R-MAT (gnnc's quadrant probabilities, hubs at low ids; self-loops redrawn, duplicates kept), features a noisy
  class mean per vertex, so a sampled GraphSAGE learns something.
* `convert`: `gnnc convert` of that directory into the memory-mapped graph store.
* `fennel`: `--partition fennel` (gnnc.partition on the store, the partitioner `--partition` runs) into 4 and 8
  parts: time, edge cut, balance (largest part over the average).
* `sage1`, `sage2`: sampled GraphSAGE, three layers of 256 (fan-out 15,10,5; batch 1024), one epoch from the store,
  in one process and on `--nproc 2` (each rank maps its shard's features and the CSR the shards hold once). Its
  evaluation is gnnc's for sampled runs (gnnc.runtime.minibatch.EVALUATION, the `evaluation` of its --json): the
  labelled vertices only (1.4% of papers100M's), on sampled blocks at the run's fan-outs, in batches.
* `products`: the ogbn-products size (2,449,029 vertices, 123,718,280 directed edges, 100 features, 47 classes) at
  `--products-fraction` (default: ten times `--fraction`, at most 1), generated and converted alike; METIS and
  Fennel into 2, 4 and 8 parts side by side (METIS's split into 8 written as `gnnc partition -o` writes it); `gnnc
  compile` of GraphSAGE for 8 workers after partitioning (`--partition-from` that split), timed by phase.
* `products-partition`: the must-show's partition row alone: the products-like graph generated and converted (as
  `products`), then METIS and Fennel into 2, 4 and 8 parts, each in its own process under the watchdog (a METIS
  killed at --limit-gib is a row "out of memory at N GiB", and the next one runs), side by side in one table:
  time, peak, edge cut, balance (`--metis-matching rm`: METIS's random matching; `--products-symmetric`: the
  graph undirected, as ogbn-products is, each drawn pair written both ways).
* `plan`: the full papers100M on paper (the method is written beside the figures).

Each step runs under a watchdog that reads its process tree's resident memory (and every process's VmHWM, its
exact peak) every 0.05 s and kills the tree above `--limit-gib`: that row reads "out of memory at N GiB" and the
benchmark goes on. An address-space limit (RLIMIT_AS) would refuse torch's large virtual reservations long
before the resident memory got there (benchmarks/products.py says the same), and a cgroup needs privileges this
script must not assume. The load average is printed beside each timing; the machine may be shared.

    python benchmarks/scale.py                                  # the must-show: the machine alone, hours
    python benchmarks/scale.py --fraction 0.001 --limit-gib 3   # a check at 111K vertices
    python benchmarks/scale.py --project 0.1                    # each step at 0.1, from the checks' fractions
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

# the watchdog's /proc readings and the figures' format, as benchmarks/products.py takes them
from products import gib, loadavg, rss_and_peak, tree_pids

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS-scale.md"
GNNC = [sys.executable, "-m", "gnnc"]
# (vertices, directed edges, features, classes) of the real datasets
PAPERS = (111_059_956, 1_615_685_872, 128, 172)
PRODUCTS = (2_449_029, 123_718_280, 100, 47)
# OGB's splits as fractions of the vertices: papers100M 1.2M / 125K / 214K of 111M (the rest unlabelled),
# products 196,615 / 39,323 / 2,213,091 of 2.45M (every vertex labelled)
PAPERS_SPLIT = (0.011, 0.0011, 0.0019)
PRODUCTS_SPLIT = (0.0803, 0.0161, 0.9036)
RMAT = (0.57, 0.19, 0.19)  # gnnc.graph.generators' quadrants
QUIET_LOAD = 1.5  # the highest 1-minute load average at which a run's times are called a quiet machine's
BLOCK = 1 << 20  # vertices or edges generated and written at once
FANOUT, BATCH, HIDDEN = "15,10,5", 1024, 256
WORKERS = (16, 32, 64)
PRESETS = ("dgx-a100", "cpu-cluster")
STEPS = ("generate", "convert", "fennel", "sage1", "sage2", "products", "products-partition", "plan")
SAGE3 = """# GraphSAGE, three layers (fan-out 15,10,5), written by benchmarks/scale.py
layer SAGE(in, out) {
  scatter   m = src.h
  gather    a = mean(m)
  transform t = linear(a, out) + linear(h, out, bias = false)
  sync      s = sum(t)
  apply     h = s
}

model GraphSAGE3(features, hidden = 256, classes, p = 0.5) {
  h = dropout(x, p)
  h = SAGE(features, hidden)(h)
  h = relu(h)
  h = dropout(h, p)
  h = SAGE(hidden, hidden)(h)
  h = relu(h)
  h = dropout(h, p)
  h = SAGE(hidden, classes)(h)
  training(epochs = 1, lr = 0.003, weight_decay = 0)
  loss = cross_entropy(h, y, mask = train)
}
"""
T0 = time.monotonic()


def say(text: str) -> None:
    """A progress line: the elapsed time of the whole benchmark and the load average."""
    print(f"[{time.monotonic() - T0:8.1f} s, load {loadavg()}] {text}", flush=True)


# ----- the streaming generator (a child process)


def rmat_edges(rng: np.random.Generator, n: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` R-MAT edges on `n` vertices without self-loops (ids drawn on the next power of two, those past n
    and the loops drawn again)."""
    levels = max(math.ceil(math.log2(n)), 1)
    a, b, c = RMAT
    src_out, dst_out, have = [], [], 0
    while have < count:
        want = int((count - have) * 1.3) + 16
        src = np.zeros(want, dtype=np.int64)
        dst = np.zeros(want, dtype=np.int64)
        for _ in range(levels):
            u = rng.random(want)
            right = ((u >= a) & (u < a + b)) | (u >= a + b + c)
            down = u >= a + b
            src = (src << 1) | down
            dst = (dst << 1) | right
        keep = (src < n) & (dst < n) & (src != dst)
        src_out.append(src[keep][: count - have])
        dst_out.append(dst[keep][: count - have])
        have += len(src_out[-1])
    return np.concatenate(src_out), np.concatenate(dst_out)


class NpyStream:
    """One .npy member of a zip archive (an .npz) written block by block: its header first (the shape is known),
    then each block's bytes, so the array is never whole in memory."""

    def __init__(self, archive: zipfile.ZipFile, name: str, dtype: np.dtype, shape: tuple[int, ...]):
        self.f = archive.open(f"{name}.npy", "w", force_zip64=True)
        self.dtype = np.dtype(dtype)
        np.lib.format.write_array_header_2_0(self.f, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                      "fortran_order": False, "shape": shape})

    def write(self, block: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(block, dtype=self.dtype).tobytes())

    def close(self) -> None:
        self.f.close()


def generate_ogb(out: Path, n: int, e: int, features: int, classes: int, split: tuple[float, float, float],
                 seed: int = 0, symmetric: bool = False) -> dict[str, Any]:
    """An OGB node-property directory in OGB's binary layout (papers100M's), written streaming.

    symmetric: e // 2 R-MAT pairs, each written in both directions (a block's pairs, then the same pairs
    reversed), as ogbn-products' edge list holds its 61.9M undirected edges (123.7M directed); otherwise e
    directed R-MAT edges, whose symmetric graph (METIS's input) has about 1.7 e entries, not e."""
    if out.exists():
        shutil.rmtree(out)
    raw = out / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((classes, features)).astype(np.float32) * (3.0 / math.sqrt(features))
    with zipfile.ZipFile(raw / "data.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        # edge_index [2, E] is row-major: every source, then every destination (each drawn again from the same
        # seeded stream, block by block, so neither row is held whole)
        e = e - e % 2 if symmetric else e
        ei = NpyStream(z, "edge_index", np.int64, (2, e))
        drawn = e // 2 if symmetric else e
        for row in (0, 1):
            block_rng = np.random.default_rng(seed + 1)
            for lo in range(0, drawn, BLOCK):
                src, dst = rmat_edges(block_rng, n, min(BLOCK, drawn - lo))
                if symmetric:
                    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
                ei.write(src if row == 0 else dst)
        ei.close()
        x = NpyStream(z, "node_feat", np.float32, (n, features))
        klass = np.empty(n, dtype=np.int64)  # O(N): each vertex's class, its label where it has one
        for lo in range(0, n, BLOCK):
            hi = min(lo + BLOCK, n)
            klass[lo:hi] = rng.integers(0, classes, hi - lo)
            x.write(means[klass[lo:hi]] + rng.standard_normal((hi - lo, features), dtype=np.float32))
        x.close()
        for name, value in (("num_nodes_list", n), ("num_edges_list", e)):
            s = NpyStream(z, name, np.int64, (1,))
            s.write(np.array([value]))
            s.close()
    draw = rng.random(n)
    bounds = np.cumsum(split)
    which = np.searchsorted(bounds, draw, side="right")  # 0 train, 1 valid, 2 test, 3 unlabelled
    with zipfile.ZipFile(raw / "node-label.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        y = NpyStream(z, "node_label", np.float32, (n, 1))
        for lo in range(0, n, BLOCK):
            hi = min(lo + BLOCK, n)
            block = klass[lo:hi].astype(np.float32)
            block[which[lo:hi] == 3] = np.nan
            y.write(block[:, None])
        y.close()
    folder = out / "split" / "time"
    folder.mkdir(parents=True)
    counts = {}
    for k, name in enumerate(("train", "valid", "test")):
        ids = np.nonzero(which == k)[0]
        counts[name] = len(ids)
        # mtime 0: the same graph is the same bytes (gzip's header would carry the second it was written in)
        with io.TextIOWrapper(gzip.GzipFile(folder / f"{name}.csv.gz", "wb", compresslevel=1, mtime=0)) as f:
            for lo in range(0, len(ids), BLOCK):
                f.write("\n".join(map(str, ids[lo:lo + BLOCK].tolist())) + "\n")
    return {"vertices": n, "edges": e, "features": features, "classes": classes, **counts,
            "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())}


# ----- children: each step's work in its own process, its result on one `RESULT {json}` line


def child(args: argparse.Namespace) -> None:
    spec = json.loads(args.child)
    kind = spec.pop("kind")
    if kind == "generate":
        out = generate_ogb(Path(spec["out"]), *spec["size"], tuple(spec["split"]),
                           symmetric=spec.get("symmetric", False))
    elif kind == "partition":
        from gnnc import api
        from gnnc.runtime.metrics import peak_rss_bytes

        graph = api.load_graph(spec["graph"])
        opened = peak_rss_bytes()
        t0 = time.perf_counter()
        part = api.partition(graph, spec["parts"], spec["method"], seed=0, **spec.get("options", {}))
        elapsed = time.perf_counter() - t0
        sizes = np.bincount(part.assignment, minlength=spec["parts"])
        # the directed edges between parts, counted alike for every method: METIS's stats count its symmetric
        # graph's undirected edges (the edge list's both directions and duplicates one), which read as a smaller
        # share of the directed edges beside Fennel's directed count
        cut = _cut(graph, part.assignment)
        out = {"time_s": elapsed, "edge_cut": int(cut), "cut_fraction": int(cut) / graph.num_edges,
               "balance": float(sizes.max() / (graph.num_nodes / spec["parts"])), "peak_after_open": opened}
        if spec["method"] == "metis":
            out["symmetric_cut"] = int(part.stats["edge_cut"])
        out.update({k: v for k, v in part.stats.items() if k in ("gamma", "slack", "batch", "ufactor", "matching")})
        if spec.get("save"):  # the split as `gnnc partition -o DIR` writes it, for `gnnc compile --partition-from`
            from gnnc.plan.shard_files import write_shards

            shutil.rmtree(spec["save"], ignore_errors=True)
            t0 = time.perf_counter()
            write_shards(graph, part.assignment, spec["parts"], spec["save"], spec["method"],
                         meta={"seed": 0, "partition_stats": part.stats})
            out["save_s"] = time.perf_counter() - t0
    elif kind == "compile":
        out = compile_child(spec)
    elif kind == "plan":
        out = plan_child(spec)
    else:
        raise SystemExit(f"unknown child {kind}")
    print("RESULT " + json.dumps(out), flush=True)


def compile_child(spec: dict[str, Any]) -> dict[str, Any]:
    """`gnnc compile --workers 8 --partition-from SPLIT -o OUT` (`strategy`: --strategy S, else the planner's
    choice; `threads`: --threads N, else the CPUs this process may use), as the CLI runs it, timed by phase: wall
    and process CPU (the shard writer thread's included) of loading the graph, the planner's statistics, the row sets,
    the rest of the passes, each rank's structures, writing the shards (hashed as they are written) and waiting
    for the last to reach the disk ("checksums (wait)", the name older results use)."""
    from gnnc import api
    from gnnc.passes import predict_bytes
    from gnnc.passes.cost import inputs
    from gnnc.plan import shard_files, shards

    phases: dict[str, dict[str, float]] = {}
    # the phases inside another may run beside threads of their own (a shard's fsync), so each counts its own
    # thread's CPU; the outer ones (load, passes, save) the whole process's, and what is left of them once their
    # parts are taken off is the rest. A part run in the compile's forked processes (gnnc.parallel: the shards,
    # Algorithm 4's runs) is timed there and not seen here: its wall is in its outer phase, its CPU in children_cpu_s
    inner = ("statistics", "row sets", "structures", "shard files", "checksums (wait)")

    def timed(name: str, fn: Any) -> Any:
        clock = time.thread_time if name in inner else time.process_time

        def run(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), clock()
            try:
                return fn(*args, **kwargs)
            finally:
                p = phases.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0})
                p["wall_s"] += time.perf_counter() - w  # summed over calls: threads' overlap counted twice
                p["cpu_s"] += clock() - c
        return run

    # the functions each phase is, wrapped where their callers look them up
    inputs.compute_stats = timed("statistics", inputs.compute_stats)
    predict_bytes.all_row_sets = timed("row sets", predict_bytes.all_row_sets)
    shards.rank_arrays = timed("structures", shards.rank_arrays)
    shard_files.ShardWriter.write = timed("shard files", shard_files.ShardWriter.write)
    shard_files.ShardWriter.entries = timed("checksums (wait)", shard_files.ShardWriter.entries)
    w0, c0 = time.perf_counter(), time.process_time()
    children0 = _children_cpu()  # the compile's forked processes (gnnc.parallel): their CPU is not this process's
    graph = timed("load", api.load_graph)(spec["graph"])
    model = api.load_model(spec["model"])
    plan = timed("passes", api.compile)(model, graph, workers=8, graph_spec=spec["graph"],
                                        partition_from=spec["split"], strategy=spec.get("strategy"),
                                        threads=spec.get("threads"))
    timed("save", plan.save)(spec["out"])
    total_wall, total_cpu = time.perf_counter() - w0, time.process_time() - c0
    children_cpu = _children_cpu() - children0
    for inner, outer in (("statistics", "passes"), ("row sets", "passes"), ("structures", "save"),
                         ("shard files", "save"), ("checksums (wait)", "save")):
        for k in ("wall_s", "cpu_s"):  # each phase once: the passes and the save without their parts
            phases[outer][k] -= phases.get(inner, {}).get(k, 0.0)
    order = ("load", "statistics", "row sets", "passes", "structures", "shard files", "checksums (wait)", "save")
    # a phase run in child processes counts only what its parent did; total_cpu_s counts the children too
    return {"phases": {k: phases[k] for k in order if k in phases}, "total_wall_s": total_wall,
            "total_cpu_s": total_cpu + children_cpu, "children_cpu_s": children_cpu, "threads": plan.threads,
            "strategies": [layer.attr("strategy", "local") for layer in
                                                     plan.program.graph_layers()],
            "plan_bytes": sum(p.stat().st_size for p in Path(spec["out"]).rglob("*") if p.is_file())}


def _children_cpu() -> float:
    """User and system CPU seconds of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cut(graph: Any, assignment: np.ndarray) -> int:
    """Directed edges whose ends are in different parts, counted in blocks, a store's pages let go after each (the
    edge list read whole would stay resident: 8 bytes per edge on Fennel's peak)."""
    from gnnc.graph.store import release_pages

    src, dst = graph.edges("plain")
    step = 1 << 22
    cut = 0
    for k in range(0, len(src), step):
        cut += int(np.count_nonzero(assignment[np.asarray(src[k:k + step])] != assignment[np.asarray(dst[k:k + step])]))
        release_pages(graph)
    return cut


# ----- the driver: a step's command under the watchdog


def measure(name: str, cmd: list[str], limit: float, timeout: float) -> dict[str, Any]:
    """Run `cmd` in its own session under the watchdog: wall time, every process's peak (VmHWM), the tree's
    largest sampled resident sum, the exit status, the load average before and after, its last JSON line."""
    shown = " ".join(cmd[2:] if cmd[:2] == GNNC[:2] else cmd[2:] if cmd[1] == __file__ else cmd)
    say(f"{name}: {shown[:240]}")
    before = loadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")})
    peaks: dict[int, int] = {}
    tree_most, killed, last_say = 0, None, t0
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            # ru_maxrss is the largest of the step's process and its descendants: its own peak only where no
            # VmHWM was sampled (a step shorter than one sample)
            peaks.setdefault(proc.pid, usage.ru_maxrss * 1024)
            break
        total = 0
        for p in tree_pids(proc.pid):
            rss, hwm = rss_and_peak(p)
            total += rss
            if hwm:
                peaks[p] = max(peaks.get(p, 0), hwm)
        tree_most = max(tree_most, total)
        now = time.monotonic()
        if tree_most > limit or now - t0 > timeout:
            killed = (f"out of memory at {limit / 2**30:.1f} GiB" if tree_most > limit
                      else f"timed out after {timeout:.0f} s")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        if now - last_say > 30:
            say(f"{name}: running {now - t0:.0f} s, tree {tree_most / 2**30:.2f} GiB")
            last_say = now
        time.sleep(0.05)
    wall = time.monotonic() - t0
    out_text, err_text = proc.communicate()
    result: dict[str, Any] = {"wall_s": wall, "rc": proc.returncode, "load_before": before, "load_after": loadavg(),
                              "peak_bytes": max(peaks.values(), default=0), "tree_bytes": tree_most,
                              "root_peak": peaks.get(proc.pid, 0),
                              "child_peaks": sorted((v for p, v in peaks.items() if p != proc.pid), reverse=True)}
    if killed:
        result["error"] = killed
    elif proc.returncode != 0:
        tail = [line for line in err_text.strip().splitlines() if line.strip()][-1:] or ["?"]
        result["error"] = f"exit {proc.returncode}: {tail[0][:200]}"
    for line in reversed(out_text.splitlines()):
        text = line[len("RESULT "):] if line.startswith("RESULT ") else line
        if text.startswith("{"):
            try:
                result["out"] = json.loads(text)
                break
            except json.JSONDecodeError:
                continue
    say(f"{name}: {'failed: ' + result['error'] if 'error' in result else 'done'} in {wall:.1f} s, peak "
        f"{gib(result['peak_bytes'])} GiB")
    return result


def highest_load(readings: list[str]) -> float:
    """The largest 1-minute load average among `loadavg()` readings: a run is quiet only if every step was (a
    run that starts alone and is joined by other work is loaded; the start's reading alone called it quiet)."""
    return max(float(r.split()[0]) for r in readings)


def sized(full: tuple[int, int, int, int], fraction: float) -> tuple[int, int, int, int]:
    n, e, f, c = full
    return max(int(round(n * fraction)), 1000), max(int(round(e * fraction)), 1000), f, c


# ----- the steps


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.limit = args.limit_gib * 2**30
        self.rows: list[dict[str, Any]] = []
        self.papers = sized(PAPERS, args.fraction)
        self.products = sized(PRODUCTS, args.products_fraction)
        self.model = self.work / "sage3.gnn"
        self.model.write_text(SAGE3)
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.first_load = loadavg()
        self.before = Path(args.output).read_text() if Path(args.output).exists() else ""
        # every step's measurement at this fraction, kept in the work directory, so `--steps plan` alone reads
        # the sampled runs' peaks measured by an earlier invocation
        self.saved = self.work / f"measured-{args.fraction:g}.json"
        self.measured: dict[str, dict[str, Any]] = json.loads(self.saved.read_text()) if self.saved.exists() else {}

    def path(self, name: str) -> str:
        return str(self.work / name)

    def me(self, **spec: Any) -> list[str]:
        return [sys.executable, __file__, "--child", json.dumps(spec)]

    def step(self, name: str, cmd: list[str], note: str = "", timeout: float | None = None) -> dict[str, Any]:
        r = measure(name, cmd, self.limit, timeout or self.args.timeout)
        self.measured[name] = r
        self.saved.write_text(json.dumps(self.measured))
        self.rows.append({"step": name, "note": note, **r})
        self.write()
        return r

    def generate(self, which: str = "papers") -> None:
        size, split = (self.papers, PAPERS_SPLIT) if which == "papers" else (self.products, PRODUCTS_SPLIT)
        symmetric = which == "products" and getattr(self.args, "products_symmetric", False)
        self.step(f"generate {which}", self.me(kind="generate", out=self.path(f"{which}-ogb"), size=size,
                                                split=split, symmetric=symmetric),
                  note="OGB binary layout, streaming, blocks of {:,}".format(BLOCK))

    def convert(self, which: str = "papers") -> None:
        store = Path(self.path(f"{which}-store"))
        if store.exists():
            shutil.rmtree(store)
        self.step(f"convert {which}", [*GNNC, "convert", self.path(f"{which}-ogb"), str(store), "--json"])

    def partition(self, which: str, method: str, parts: int, save: str | None = None) -> None:
        matching = getattr(self.args, "metis_matching", "shem")
        options = {"matching": matching} if method == "metis" and matching != "shem" else {}
        r = self.step(f"{method} {parts} ({which})", self.me(kind="partition", graph=self.path(f"{which}-store"),
                                                             method=method, parts=parts, save=save, options=options))
        if "out" in r:
            o = r["out"]
            r["note"] = (f"partition {o['time_s']:.1f} s, edge cut {o['edge_cut']:,} ({o['cut_fraction']:.1%}), "
                         f"balance {o['balance']:.3f}"
                         + (f"; then written as `gnnc partition -o` writes it {o['save_s']:.1f} s" if save else ""))
            self.rows[-1]["note"] = r["note"]
            self.write()

    def sage(self, nproc: int) -> None:
        cmd = [*GNNC, "run", str(self.model), "--graph", self.path("papers-store"), "--fanout", FANOUT,
               "--batch-size", str(BATCH), "--epochs", "1", "--seed", "0", "--json", "--no-progress",
               "--timeout", "600"]
        if nproc > 1:
            cmd += ["--nproc", str(nproc), "--partition", "fennel"]
        r = self.step(f"sage {nproc} process{'es' if nproc > 1 else ''}", cmd)
        o = r.get("out")
        if o:
            r["note"] = (f"epoch {o.get('epoch_time_s', float('nan')):.1f} s, evaluation "
                         f"{o.get('eval_time_s', float('nan')):.1f} s, test acc {o.get('test_acc', float('nan')):.3f}"
                         f", launcher {gib(r['root_peak'])} GiB"
                         + (f", ranks {', '.join(gib(p) for p in r['child_peaks'][:nproc])} GiB" if nproc > 1 else ""))
            self.rows[-1]["note"] = r["note"]
            self.write()

    def products_steps(self) -> None:
        self.generate("products")
        self.convert("products")
        split = self.path("products-metis-8")
        for parts in (2, 4, 8):
            for method in ("metis", "fennel"):
                self.partition("products", method, parts, save=split if (method, parts) == ("metis", 8) else None)
        self.compile_after_partitioning(split)

    def products_partition_steps(self) -> None:
        """The must-show's partition row: convert, then METIS and Fennel into 2/4/8, one process each."""
        self.generate("products")
        self.convert("products")
        for method in ("metis", "fennel"):
            for parts in (2, 4, 8):
                self.partition("products", method, parts)

    def compile_after_partitioning(self, split: str) -> None:
        """`gnnc compile --workers 8 --partition-from` the METIS split into 8 written above: the compile's own work
        after partitioning (the must-show's <= 30 s), by phase."""
        plan = self.path("products-plan")
        shutil.rmtree(plan, ignore_errors=True)
        r = self.step("compile 8 workers after partitioning (products)",
                      self.me(kind="compile", graph=self.path("products-store"), model=str(self.model),
                              split=split, out=plan))
        shutil.rmtree(plan, ignore_errors=True)  # ~20 bytes per edge of a rank's structures: gigabytes
        if "out" in r:
            o = r["out"]
            phases = ", ".join(f"{k} {v['wall_s']:.1f} s ({v['cpu_s']:.1f} CPU)" for k, v in o["phases"].items())
            self.rows[-1]["note"] = (f"full-graph GraphSAGE, the planner's {'+'.join(o['strategies'])}, the METIS "
                                     f"split read (--partition-from); {o['total_wall_s']:.1f} s after the "
                                     f"interpreter's start ({o['total_cpu_s']:.1f} CPU s): {phases}; plan "
                                     f"{o['plan_bytes'] / 2**30:.2f} GiB")
            self.write()

    def plan(self) -> None:
        base = measure("runtime baseline", [sys.executable, "-c", "import torch, gnnc.api, gnnc.runtime.minibatch_dist"],
                       self.limit, 600)
        self.measured["runtime baseline"] = base  # the interpreter's start, which --project takes off every wall
        self.step("plan full papers100M", self.me(kind="plan", baseline_bytes=base["peak_bytes"], work=str(self.work),
                                                  store=self.args.plan_store or self.path("papers-store"),
                                                  probe=self.args.probe,
                                                  model=str(self.model), fraction=self.args.fraction))

    def write(self) -> None:
        a = self.args
        n, e, f, c = self.papers
        pn, pe, _, _ = self.products
        steps = "" if a.steps == ",".join(STEPS) else f" --steps {a.steps}"
        if getattr(a, "metis_matching", "shem") != "shem":
            steps += f" --metis-matching {a.metis_matching}"
        if getattr(a, "products_symmetric", False):
            steps += " --products-symmetric"
        most = highest_load([self.first_load, *(r[k] for r in self.rows for k in ("load_before", "load_after"))])
        head = [f"## `python benchmarks/scale.py --fraction {a.fraction:g} --products-fraction {a.products_fraction:g} "
                f"--limit-gib {a.limit_gib:g}{steps}` ({self.started})", "",
                f"papers100M-like: {n:,} vertices, {e:,} directed edges, {f} features, {c} classes "
                f"({a.fraction:g} of ogbn-papers100M); products-like: {pn:,} vertices, {pe:,} edges "
                f"({a.products_fraction:g} of ogbn-products). "
                + ("The must-show's size." if a.fraction == 0.1 else
                   f"NOT the must-show's size (one tenth): a check at {a.fraction:g}."),
                f"Load average at the start {self.first_load}, at most {most:.2f} at a step's start or end: "
                + ("a loaded, shared machine; times are not comparable to a quiet one." if
                   most > QUIET_LOAD else "a quiet machine."),
                "Peak: the largest process's VmHWM (its own high-water mark); tree: the step's process tree's "
                "largest sampled resident sum. Each step in its own process under a watchdog (--limit-gib).", "",
                "| step | wall s | peak GiB | tree GiB | load before / after | result |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            result = r.get("error") or r.get("note") or "ok"
            head.append(f"| {r['step']} | {r['wall_s']:.1f} | {gib(r['peak_bytes'])} | {gib(r['tree_bytes'])} | "
                        f"{r['load_before']} / {r['load_after']} | {result} |")
        head += side_by_side(self.rows, a.limit_gib)
        if "plan full papers100M" in self.measured and "out" in self.measured["plan full papers100M"]:
            head += ["", *self.measured["plan full papers100M"]["out"]["lines"]]
        Path(a.output).write_text((self.before.rstrip() + "\n\n" if self.before else
                                   "# Graphs the size of the seeds' datasets, from disk (issue 34)\n\n")
                                  + "\n".join(head) + "\n")


def side_by_side(rows: list[dict[str, Any]], limit_gib: float) -> list[str]:
    """METIS and Fennel on the products-like store, one row per part count: each method's partition time (the
    step's wall in brackets: the interpreter, opening the store), peak, edge cut and balance; a step killed by
    the watchdog reads its error in place of its figures. Empty where no products-like partition ran."""
    got = {(r["step"].split()[0], int(r["step"].split()[1])): r for r in rows
           if r["step"].endswith("(products)") and r["step"].split()[0] in ("metis", "fennel")}
    if not got:
        return []
    lines = ["", f"METIS and Fennel on the products-like store side by side (each in its own process, killed above "
                 f"{limit_gib:g} GiB; edge cut: directed edges between parts, as a share of all, counted alike for "
                 f"both; balance: the largest part over the average):", "",
             "| parts | METIS s (wall) | METIS peak GiB | METIS edge cut | METIS balance | Fennel s (wall) | "
             "Fennel peak GiB | Fennel edge cut | Fennel balance |", "|---|---|---|---|---|---|---|---|---|"]
    for parts in sorted({p for _, p in got}):
        cells = [str(parts)]
        for method in ("metis", "fennel"):
            r = got.get((method, parts))
            if r is None:
                cells += ["not run", "", "", ""]
            elif "out" not in r:
                cells += [r.get("error", "failed"), f"{gib(r['peak_bytes'])} (at the kill)" if r.get("peak_bytes")
                          else "", "", ""]
            else:
                o = r["out"]
                cells += [f"{o['time_s']:.1f} ({r['wall_s']:.1f})", gib(r["peak_bytes"]),
                          f"{o['edge_cut']:,} ({o['cut_fraction']:.1%})", f"{o['balance']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ----- the plan on paper (a child)


def plan_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Plan the full papers100M from the sampled runs measured at `fraction` (the method: PLAN_METHOD): the
    planner's step on `store` (a small store: see PLAN_METHOD) per cluster and worker count, then
    `paper_plan` on the measured figures."""
    from gnnc import api
    from gnnc.graph.sampling import SamplingConfig

    graph = api.load_graph(spec["store"])
    model = api.load_model(spec["model"])
    sampling = SamplingConfig(tuple(int(k) for k in FANOUT.split(",")), BATCH)
    train = int(graph.train_mask.sum())

    def predicted(cluster: Any, workers: int) -> dict[str, Any]:
        """The planner's choice for `workers` of `cluster` on the small store; its step per 1024 seeds."""
        try:
            rec = api.compile(model, graph, workers=workers, cluster=cluster, sampling=sampling,
                              partition="fennel").meta.planner
        except Exception as exc:  # a cluster the planner refuses: its row says why
            return {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
        # per seed times a batch: a small store's last batch may be short
        return {"strategies": list(rec.strategies), "step_s": float(rec.predicted_time_s) / train * BATCH,
                "activation_bytes": float(rec.predicted_memory_bytes)}

    from gnnc.cluster import ClusterProfile, preset

    local = preset("local", spec.get("probe")).to_dict()
    local.update(workers=2, name="local x2")  # the 2 ranks measured, on this machine's probed profile
    predictions = {("local", 2): predicted(ClusterProfile.from_dict(local), 2)}
    for name in PRESETS:
        for workers in WORKERS:
            predictions[(name, workers)] = predicted(scaled_cluster(name, workers, spec.get("probe")), workers)
    runs = {float(p.stem[len("measured-"):]): json.loads(p.read_text())
            for p in Path(spec["work"]).glob("measured-*.json")}
    split = Path(spec["work"]) / "papers-ogb" / "split" / "time" / "train.csv.gz"
    with gzip.open(split, "rt") as f:  # the measured run's training vertices (its store's train mask)
        train_measured = sum(1 for line in f if line.strip())
    plan = paper_plan(runs, spec["fraction"], spec["baseline_bytes"], train_measured, predictions)
    plan["lines"] = ["### The full papers100M on paper", "",
                     PLAN_METHOD.format(fraction=spec["fraction"], store=graph.num_nodes, train=train,
                                        steps_full=plan["steps_full"]), "", *plan["lines"]]
    return plan


def _sampled_peaks(measured: dict[str, Any]) -> tuple[int, int] | None:
    """(the 1-process run's peak, the larger rank's of the 2-process run) where both ran to the end. The ranks
    are the step's two largest children (the third, multiprocessing's resource tracker, is small)."""
    one, two = measured.get("sage 1 process", {}), measured.get("sage 2 processes", {})
    if one.get("rc") != 0 or two.get("rc") != 0 or len(two.get("child_peaks") or []) < 2:
        return None
    return one["peak_bytes"], max(two["child_peaks"][:2])


def paper_plan(runs: dict[float, dict[str, Any]], fraction: float, baseline: int, train_measured: int,
               predictions: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """The full papers100M's per-worker memory and epoch from the sampled runs measured at `fraction` (`runs`:
    each measured fraction's steps, as `measured-F.json` keeps them) and the planner's step per cluster and
    worker count (`predictions`, with ("local", 2): the 2 ranks measured). PLAN_METHOD states the method."""
    here = runs.get(fraction, {})
    peaks = _sampled_peaks(here)
    if peaks is None:
        raise SystemExit(f"the plan on paper needs the sampled runs (sage1, sage2) measured at {fraction:g}")
    one_peak, rank_peak = peaks
    n, e, _, _ = sized(PAPERS, fraction)
    n_full, e_full, features, _ = PAPERS
    # what grows with the graph, per vertex (the generator keeps papers100M's 14.5 edges a vertex, so per vertex
    # holds the per-edge part too): the slope of the larger rank's peak from the nearest smaller fraction measured,
    # else its peak over the runtime's baseline (an upper bound: the minibatch's own memory counted as growth)
    below = sorted((f for f, m in runs.items() if f < fraction and _sampled_peaks(m)), reverse=True)
    if below:
        n_below = sized(PAPERS, below[0])[0]
        per_vertex = (rank_peak - _sampled_peaks(runs[below[0]])[1]) / (n - n_below)
        how = (f"the slope of the larger rank's peak from {below[0]:g} "
               f"({gib(_sampled_peaks(runs[below[0]])[1])} GiB, {n_below:,} vertices)")
    else:
        per_vertex = (rank_peak - baseline) / n
        how = "the larger rank's peak over the runtime's baseline (one fraction: an upper bound)"
    worker_bytes = rank_peak + per_vertex * (n_full - n)
    steps = math.ceil(train_measured / BATCH)
    steps_full = math.ceil(PAPERS_SPLIT[0] * n_full / BATCH)  # the batch is global: each rank takes its seeds
    step_two = here["sage 2 processes"]["out"]["epoch_time_s"] / steps
    local = predictions.get(("local", 2), {})
    calibration = step_two / local["step_s"] if "step_s" in local else float("nan")
    lines = [f"Measured at {fraction:g} ({n:,} vertices, {e:,} edges, {train_measured:,} training vertices: "
             f"{steps} steps of 1024): one process peaked at {gib(one_peak)} GiB, the larger of 2 ranks at "
             f"{gib(rank_peak)} GiB; the runtime's baseline (a process that imported gnnc's runtime and torch) "
             f"{gib(baseline)} GiB. Growth {per_vertex:.0f} bytes per vertex ({per_vertex * n / e:.1f} per edge), "
             f"{how}. A 2-rank step {step_two:.2f} s measured (the epoch {here['sage 2 processes']['out']['epoch_time_s']:.1f} s "
             f"over {steps} steps, loaded: load {here['sage 2 processes']['load_before']} at its start), "
             f"the planner's {local.get('step_s', float('nan')):.3f} s for 2 ranks of this machine's profile: "
             f"the CPU preset's steps are the planner's times {calibration:.1f}.", "",
             "| cluster | workers | planner's strategies | planner's step ms | step ms used | epoch s (full) | "
             "per-worker GiB | its feature rows on disk GiB | planner's activations MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for name in PRESETS:
        for workers in WORKERS:
            p = predictions[(name, workers)]
            if "error" in p:
                lines.append(f"| {name} | {workers} | error: {p['error']} | | | | | | |")
                continue
            # the CPU preset is this machine's probed profile: its steps scaled by the measured over the predicted;
            # the GPU preset's are the planner's own (no GPU measured here)
            step = p["step_s"] * (calibration if name != "dgx-a100" else 1.0)
            row = {"cluster": name, "workers": workers, "strategies": p["strategies"], "planner_step_s": p["step_s"],
                   "step_s": step, "epoch_full_s": step * steps_full, "per_worker_bytes": worker_bytes,
                   "feature_bytes": n_full * 4 * features / workers, "activation_bytes": p["activation_bytes"]}
            rows.append(row)
            lines.append(f"| {name} | {workers} | {'+'.join(p['strategies'])} | {p['step_s'] * 1e3:.2f} | "
                         f"{step * 1e3:.2f} | {step * steps_full:.1f} | {gib(worker_bytes)} | "
                         f"{gib(row['feature_bytes'])} | {p['activation_bytes'] / 2**20:.1f} |")
    return {"rows": rows, "lines": lines, "per_vertex_bytes": per_vertex, "per_worker_bytes": worker_bytes,
            "calibration": calibration, "steps_full": steps_full, "baseline_bytes": baseline,
            "rank_peak_bytes": rank_peak}


PLAN_METHOD = ("Method: the measured figures are the sampled GraphSAGE's at {fraction:g} (the `sage 1 process` and "
               "`sage 2 processes` rows: fan-out 15,10,5, batch 1024, `--partition fennel` on 2 ranks). Memory: a "
               "rank holds the structure mapped (the in-edge CSR and its features' rows read a region at a time and "
               "let go, gnnc.graph.sampling.take), the per-vertex arrays of the whole graph (parts, labels, masks, "
               "the sampler's degrees and scratch) and a minibatch, so the per-worker figure is the larger rank's "
               "peak at {fraction:g} plus its growth per vertex times the 111M - 11.1M vertices it lacks, the same "
               "for every worker count (the per-vertex arrays are every rank's; the minibatch shrinks with more "
               "ranks, so it is an upper bound); the feature rows a worker owns are on its disk, mapped. Epoch: "
               "{steps_full:,} global steps of 1024 seeds (1.2M training vertices). A step is the planner's "
               "prediction (gnnc.api.compile with the preset, `--partition fennel`) on a {store:,}-vertex store of "
               "the same generator ({train:,} training vertices; its prediction per seed times 1024: a sampled "
               "step is bounded by its fan-out, not the graph; the one-tenth store would take Fennel into 64 "
               "parts hours of Python): for the CPU preset times the measured 2-rank step over the planner's "
               "prediction for those 2 ranks of this machine's profile (loaded times, so an upper bound); for "
               "dgx-a100 the planner's own (no GPU measured here). dgx-a100 at 16/32/64 workers: 2, 4, 8 DGX "
               "A100 (the preset's 8 GPUs and NVSwitch per box) joined by 200 Gb/s HDR InfiniBand per GPU; "
               "cpu-cluster: this machine's `gnnc probe` profile (`local`) as one worker per host on 10 Gb/s "
               "Ethernet.")


def scaled_cluster(name: str, workers: int, probe: str | None = None) -> Any:
    """`workers` workers of a cluster (module docstring of PLAN_METHOD): DGX A100 boxes on InfiniBand, or this
    machine's probed profile (`gnnc probe`'s, at `probe` or where `--cluster local` reads it) as hosts on
    Ethernet."""
    from gnnc.cluster import ClusterProfile, preset

    if name == "dgx-a100":
        base = preset("dgx-a100").to_dict()
        base.update(workers=workers, inter_bandwidth=8 * 200e9 / 8, latency=5e-6, topology="nvswitch+infiniband",
                    name=f"dgx-a100 x{workers // 8}")
    else:
        base = preset("local", probe).to_dict()
        base.update(workers=workers, devices_per_node=1, inter_bandwidth=10e9 / 8, latency=50e-6,
                    topology="ethernet", name=f"cpu-cluster x{workers}")
    base.pop("links", None), base.pop("collectives", None)  # measured between this machine's ranks only
    return ClusterProfile.from_dict(base)


def project(work: Path, target: float) -> list[str]:
    """Each step's peak and wall time at `target`, extrapolated linearly in the graph's size from the fractions
    measured in `work` (`measured-F.json`; every step's size is proportional to the fraction: the papers-like and
    the products-like graphs alike). Peak: the least-squares line through every fraction measured (two or more),
    its intercept the fixed part (the interpreter, torch), its slope what grows with the graph, given per vertex
    (the generator's degree is fixed, so a per-edge figure is the same slope over the edges per vertex)."""
    runs = sorted((float(p.stem[len("measured-"):]), json.loads(p.read_text())) for p in work.glob("measured-*.json"))
    if len(runs) < 2:
        raise SystemExit(f"--project needs two fractions measured in {work}, found {len(runs)}")
    fractions = [f for f, _ in runs]
    f2, m2 = runs[-1]
    startup = m2.get("runtime baseline", {}).get("wall_s", 0.0)
    shown = " / ".join(f"{f:g}" for f in fractions)
    lines = [f"Projected to --fraction {target:g} from the runs at {shown}. Peak: the least-squares line through "
             f"them (its intercept the interpreter and torch, its slope what grows with the graph: bytes per "
             f"vertex of papers100M's {PAPERS[0]:,} at fraction 1, with its {PAPERS[1] / PAPERS[0]:.1f} edges per "
             f"vertex; products-like steps per products' vertex at the default --products-fraction). Time: on a small fraction a step's wall is mostly "
             f"the interpreter's start ({startup:.0f} s, the `runtime baseline` step) and the load's noise, so the "
             f"wall projected is the largest run's beyond that start times {target / f2:g} (meaningful once the "
             f"graph's part dominates), and the inner times (the partitioner's, the epoch's, the evaluation's) "
             f"times {target / f2:g}: linear in the graph, a lower bound for what grows faster (METIS).", "",
             f"| step | peak GiB at {shown} | slope, bytes per vertex | projected peak GiB | wall s at {shown} | "
             "projected wall s | inner s projected |", "|---|---|---|---|---|---|---|"]

    def grown(v2: float, fixed: float = 0.0) -> float:
        return fixed + max(v2 - fixed, 0.0) * target / f2

    def walls(got: list[tuple[float, dict[str, Any]]]) -> str:
        return " / ".join(f"{r['wall_s']:.1f}" for _, r in got)

    for name, r2 in m2.items():
        got = [(f, m[name]) for f, m in runs if m.get(name, {}).get("rc") == 0]
        if len(got) < 2 or r2.get("rc") != 0:
            lines.append(f"| {name} | {' / '.join(gib(m.get(name, {}).get('peak_bytes')) for _, m in runs)} | - | - "
                         f"| - | - | not measured at two fractions |")
            continue
        series = {name: [r["peak_bytes"] for _, r in got]}
        if name.startswith("sage 2"):
            # every process of the 2-process run: its ranks, largest first (rank 0, where Fennel's part 0 keeps
            # R-MAT's hubs and so the largest blocks, is the larger), and the launcher (compile, partition, shards);
            # the smallest child is multiprocessing's resource tracker
            series = {f"{name}, the larger rank": [r["child_peaks"][0] for _, r in got],
                      f"{name}, the other rank": [r["child_peaks"][1] for _, r in got],
                      f"{name}, launcher": [r["root_peak"] for _, r in got]}
        # the vertices at fraction 1 of the papers-like graph: products-like at the default --products-fraction
        vertices = 10 * PRODUCTS[0] if "products" in name else PAPERS[0]
        inner = ""
        o2 = r2.get("out") or {}
        for key in ("time_s", "epoch_time_s", "eval_time_s", "total_cpu_s"):  # the last: compile
            if isinstance(o2.get(key), (int, float)):
                inner += f"{key} {grown(o2[key]):.0f} "
        for label, peaks in series.items():
            slope, intercept = np.polyfit([f for f, _ in got], peaks, 1)
            lines.append(f"| {label} | {' / '.join(gib(p) for p in peaks)} | {slope / vertices:.0f} | "
                         f"{gib(intercept + slope * target)} | {walls(got)} | "
                         f"{grown(r2['wall_s'], startup):.0f} | {inner.strip() or '-'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.1, help="of ogbn-papers100M's vertices and edges")
    ap.add_argument("--products-fraction", type=float, default=None,
                    help="of ogbn-products' vertices and edges (default: ten times --fraction, at most 1)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    ap.add_argument("--limit-gib", type=float, default=20.0, help="a step's process tree is killed above this")
    ap.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds a step may run")
    ap.add_argument("--work", default="/tmp/gnnc-scale", help="where the graphs, stores and plans are written")
    ap.add_argument("-o", "--output", default=str(RESULTS), help="the results file (a section appended per run)")
    ap.add_argument("--project", type=float, metavar="FRACTION",
                    help="print each step's peak and time projected to FRACTION from the fractions measured in "
                         "--work (a least-squares line), and run nothing")
    ap.add_argument("--plan-store", metavar="DIR",
                    help="the graph store `plan` compiles its plans on (default: this run's papers-store; a small "
                         "one: Fennel into 64 parts of the one-tenth store is hours)")
    ap.add_argument("--probe", metavar="FILE",
                    help="the `gnnc probe` profile of this machine `plan`'s CPU preset is made of (default: where "
                         "`--cluster local` reads it)")
    ap.add_argument("--metis-matching", choices=("shem", "rm"), default="shem",
                    help="METIS's coarsening in the products steps: shem (heavy-edge matching, METIS's default) or "
                         "rm (random matching: less of METIS's memory; passes/partition/metis.py)")
    ap.add_argument("--products-symmetric", action="store_true",
                    help="the products-like graph as ogbn-products is: half its edges drawn (R-MAT pairs), each "
                         "written in both directions; by default every edge is drawn, directed (METIS's symmetric "
                         "input then has ~1.7x the entries real ogbn-products has)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.project:
        print("\n".join(project(Path(args.work), args.project)))
        return None
    if args.products_fraction is None:
        args.products_fraction = min(10 * args.fraction, 1.0)
    steps = args.steps.split(",")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise SystemExit(f"unknown step {unknown[0]!r} (known: {', '.join(STEPS)})")
    bench = Bench(args)
    say(f"papers-like {bench.papers}, products-like {bench.products}, work {bench.work}")
    for step in STEPS:
        if step not in steps:
            continue
        if step == "generate":
            bench.generate("papers")
        elif step == "convert":
            bench.convert("papers")
        elif step == "fennel":
            for parts in (4, 8):
                bench.partition("papers", "fennel", parts)
        elif step == "sage1":
            bench.sage(1)
        elif step == "sage2":
            bench.sage(2)
        elif step == "products":
            bench.products_steps()
        elif step == "products-partition":
            bench.products_partition_steps()
        elif step == "plan":
            bench.plan()
    say(f"wrote {args.output}")


if __name__ == "__main__":
    main()
