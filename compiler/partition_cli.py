"""`gnnc partition`: split a graph with one partitioner and write per-part shards.

A command of its own so that partitioning, the step whose memory and time
grow fastest with the graph, can run (and be measured) once, apart from
compilation: it prints its peak-memory estimate before it starts, shows a
progress bar on stderr, writes the shards atomically with checksums, and
reports what each part owns and needs (docs/design.md section 9: with `--json`
the last stdout line is `method, parts, time_s, edge_cut, vertices, edges,
remote, peak_rss_bytes`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from gnnc.arg_types import SEED, whole_number
from gnnc.errors import GnncError
from gnnc.passes.partition.methods import METHODS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `partition` on the CLI's subparsers."""
    c = subparsers.add_parser("partition", help="partition a graph and write per-part shards",
                              description="Partition a graph with one method and write one shard per part.")
    c.add_argument("--graph", required=True, help="a graph spec (see `gnnc datasets`)")
    c.add_argument("--parts", type=int, required=True)
    c.add_argument("--method", required=True, choices=list(METHODS))
    c.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for the shards")
    c.add_argument("--seed", type=SEED, default=0)
    c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the method (see its module under passes/partition/), repeatable: "
                        "--option start=hubs for g3's hub start")
    c.add_argument("--layers", type=whole_number(0, 100), default=2,
                   help="layers for the L-hop statistics (default 2; at most 100, past any model's depth)")
    c.add_argument("--stats", action="store_true", help="print the dependency statistics of every part")
    c.add_argument("--json", action="store_true", help="end stdout with one JSON summary line")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(fn=run)
    return c


def _finite(value: Any) -> Any:
    """JSON has no inf/NaN: such floats become null (nested containers too)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def method_options(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings as keyword options; a value that reads as an int or a float becomes one."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise GnncError(f"--option must be KEY=VALUE, got '{pair}'")
        if key in ("seed", "parts"):  # every method's arguments, given by their own flags
            raise GnncError(f"--option {pair}: the {key} is given by --{key}, not as a method option")
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                pass
        options[key] = value
    return options


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    """Run `gnnc partition`; GnncError for bad input (the CLI exits 2 on it)."""
    from tqdm import tqdm

    # deferred: building gnnc's parser must not load torch
    from gnnc.passes.partition.stats import compute_stats
    from gnnc.passes.partition.core import estimate_peak_memory, partition_graph
    from gnnc.graph.loaders import load_graph
    from gnnc.runtime.metrics import peak_rss_bytes
    from gnnc.plan.shard_files import write_shards

    if args.parts < 1:
        raise GnncError(f"--parts must be a positive integer, got {args.parts}")
    if args.layers < 0:
        raise GnncError(f"--layers must be >= 0, got {args.layers}")
    options = method_options(args.option)
    bar = tqdm(total=3 + args.parts, desc="load graph", unit="step", file=sys.stderr,
               disable=args.no_progress or None, leave=False)
    try:
        graph = load_graph(args.graph)
        bar.update(1)
        estimate = estimate_peak_memory(graph, args.parts, args.method, baseline_bytes=peak_rss_bytes())
        print(f"partitioning {graph.name} ({graph.num_nodes} vertices, {graph.num_edges} edges) into "
              f"{args.parts} parts with {args.method}; estimated peak memory {_gib(estimate)}", flush=True)
        bar.set_description(f"partition ({args.method})")
        start = time.perf_counter()
        partition = partition_graph(graph, args.parts, args.method, seed=args.seed, **options)
        elapsed = time.perf_counter() - start
        bar.update(1)
        bar.set_description("statistics")
        stats = compute_stats(graph, partition, args.layers)
        bar.update(1)
        bar.set_description("write shards")
        write_shards(graph, partition.assignment, args.parts, args.output, args.method,
                     meta=_finite({"seed": args.seed, "options": options, "partition_stats": partition.stats,
                                   "stats": stats.summary()}),
                     progress=lambda i: bar.update(1))
    finally:
        bar.close()
    summary = {
        "method": args.method, "options": options, "parts": args.parts, "time_s": elapsed,
        "edge_cut": stats.edge_cut,
        "vertices": stats.vertices.tolist(), "edges": stats.edges.tolist(), "remote": stats.remote.tolist(),
        "peak_rss_bytes": peak_rss_bytes(), "estimated_peak_bytes": estimate, "output": str(args.output),
    }
    _print_table(stats, args.stats)
    print(f"{args.method}: {elapsed:.2f} s, edge cut {stats.edge_cut}, sum |B_i| {int(stats.remote.sum())}, "
          f"max |B_i| {int(stats.remote.max())}, peak RSS {_gib(summary['peak_rss_bytes'])}; "
          f"shards in {args.output}")
    if args.json:
        if args.stats:
            summary["stats"] = stats.summary()
            summary["partition_stats"] = partition.stats
        print(json.dumps(_finite(summary), sort_keys=True))
    return 0


def _print_table(stats: Any, full: bool) -> None:
    head = f"{'part':>4} {'vertices':>10} {'edges':>11} {'remote':>9} {'send':>9}"
    if full:
        head += "".join(f" {'hop' + str(l) + ' V':>10} {'hop' + str(l) + ' E':>11}" for l in range(1, stats.layers + 1))
    print(head)
    for i in range(stats.parts):
        row = f"{i:>4} {stats.vertices[i]:>10} {stats.edges[i]:>11} {stats.remote[i]:>9} {stats.send[i]:>9}"
        if full:
            row += "".join(f" {stats.lhop_vertices[i, l]:>10} {stats.lhop_edges[i, l]:>11}"
                           for l in range(1, stats.layers + 1))
        print(row)
    if full:
        print(f"replication {stats.replication_factor:.3f} (L-hop {stats.lhop_replication_factor:.3f}); balance "
              f"vertices {stats.vertex_balance:.3f}, edges {stats.edge_balance:.3f}, "
              f"remote max/min {stats.remote_balance:.3f}, send {stats.send_balance:.3f}")
