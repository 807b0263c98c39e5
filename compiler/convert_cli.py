"""`gnnc convert SRC DIR`: write a graph as a memory-mapped graph store (gnnc.graph.store).

A command of its own so that the costly step, reading a graph in whatever
form the user has it (OGB's CSVs, an .npz, an edge list), is done once: every
later `--graph DIR` opens the store's .npy files with `mmap_mode="r"` and reads
only the pages it touches.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
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
    from gnnc.graph.ogb import is_ogb_dir
    from gnnc.graph.ogb_store import write_ogb_store
    from gnnc.graph.store import is_store, write_store
    from gnnc.runtime.metrics import peak_rss_bytes

    source = Path(args.source)
    if source.is_dir() and is_ogb_dir(source) and not is_store(source):
        # read in blocks: an OGB directory of papers100M's size does not fit whole (its features alone 57 GB)
        manifest = write_ogb_store(source, args.output)
    else:
        # no load cache: the store is the converted graph, and the cache's copy of it would be the whole source
        # again on disk and one more write of every array
        manifest = write_store(load_graph(args.source, use_cache=False), args.output)
    name, n, e = manifest["name"], manifest["num_nodes"], manifest["num_edges"]
    print(f"wrote {args.output}: {name}, {n} vertices, {e} edges, {len(manifest['arrays'])} arrays")
    if args.json:
        print(json.dumps({"output": str(args.output), "num_nodes": n, "num_edges": e,
                          "arrays": sorted(manifest["arrays"]), "peak_rss_bytes": peak_rss_bytes()},
                         sort_keys=True))
    return 0
