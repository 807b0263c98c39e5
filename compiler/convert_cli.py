"""`gnnc convert SRC DIR`: write a graph as a memory-mapped graph store (gnnc.graph.store).

A command of its own so that the costly step, reading a graph in whatever
form the user has it (OGB's CSVs, an .npz, an edge list), is done once: every
later `--graph DIR` opens the store's .npy files with `mmap_mode="r"` and reads
only the pages it touches.
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `convert` on the CLI's subparsers."""
    c = subparsers.add_parser("convert", help="write a graph as a memory-mapped graph store (--graph DIR)",
                              description="Convert a graph (any --graph spec) into a directory of .npy files "
                                          "and a manifest with checksums, which --graph DIR then maps.")
    c.add_argument("source", metavar="SRC", help="a graph spec (see `gnnc datasets`)")
    c.add_argument("output", metavar="DIR", help="the store directory to write (created; must not hold a store)")
    c.add_argument("--json", action="store_true", help="end stdout with one JSON summary line")
    c.set_defaults(fn=run)
    return c


def run(args: argparse.Namespace) -> int:
    """Run `gnnc convert`; GnncError for bad input (the CLI exits 2 on it)."""
    # deferred: building gnnc's parser must not load torch
    from gnnc.graph.loaders import load_graph
    from gnnc.graph.store import write_store
    from gnnc.runtime.metrics import peak_rss_bytes

    # no load cache: the store is the converted graph, and the cache's copy of it would be the whole source again
    # on disk (papers100M's 57 GB of features) and one more write of every array
    graph = load_graph(args.source, use_cache=False)
    manifest = write_store(graph, args.output)
    print(f"wrote {args.output}: {graph.name}, {graph.num_nodes} vertices, {graph.num_edges} edges, "
          f"{len(manifest['arrays'])} arrays")
    if args.json:
        print(json.dumps({"output": str(args.output), "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                          "arrays": sorted(manifest["arrays"]), "peak_rss_bytes": peak_rss_bytes()},
                         sort_keys=True))
    return 0
