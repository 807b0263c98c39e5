"""Where `gnnc partition --method metis`'s peak goes, phase by phase (issue 34: METIS at ogbn-products' size).

One process: open a graph (a store is memory-mapped), then `partition_graph(graph, parts, "metis")` with its
phases wrapped where the code looks them up: building the symmetric CSR (`core.undirected_adjacency`), the METIS
call (`pymetis.part_graph`), the cut and volume after (`metis.cut_and_volume`). Before each phase the process's
peak resident set is reset (`echo 5 > /proc/self/clear_refs`, Linux), so each phase's VmHWM is its own peak;
a phase's own bytes are that peak less the resident set it started from. RSS counts the store's mapped pages
that a phase touched, as the kernel charges them. Prints one JSON line.

    python benchmarks/metis_memory.py --graph /tmp/gnnc-scale/products-store --parts 8
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any, Callable


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


PHASES: list[dict[str, Any]] = []
MOST = [0]  # the process's peak over every stretch between two resets: the whole run's peak




def measured(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its own peak recorded in PHASES (the process's peak reset at its start)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        MOST[0] = max(MOST[0], _status("VmHWM"))  # the stretch since the last reset, before it is forgotten
        _reset_peak()
        before, t0 = _status("VmRSS"), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            MOST[0] = max(MOST[0], _status("VmHWM"))
            PHASES.append({"phase": name, "rss_before": before, "peak": _status("VmHWM"),
                           "rss_after": _status("VmRSS"), "time_s": time.perf_counter() - t0})
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", required=True)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import numpy as np
    import pymetis

    from gnnc import api
    from gnnc.passes.partition import core, metis

    core.undirected_adjacency = measured("symmetric CSR", core.undirected_adjacency)
    pymetis.part_graph = measured("METIS (pymetis.part_graph)", pymetis.part_graph)
    metis.cut_and_volume = measured("cut and volume", metis.cut_and_volume)
    graph = measured("open graph", api.load_graph)(args.graph)
    opened = _status("VmRSS")
    part = core.partition_graph(graph, args.parts, "metis", seed=args.seed)
    MOST[0] = max(MOST[0], _status("VmHWM"))
    edges = graph.num_edges
    out = {"graph": args.graph, "vertices": graph.num_nodes, "edges": edges, "parts": args.parts, "peak": MOST[0], "rss_after_open": opened,
           "partition_bytes_per_edge": (MOST[0] - opened) / edges,
           "edge_cut": part.stats["edge_cut"], "sha_assignment": __import__("hashlib").sha256(
               np.ascontiguousarray(part.assignment, dtype=np.int64).tobytes()).hexdigest()[:16],
           "phases": [{**p, "own_bytes": p["peak"] - p["rss_before"],
                       "own_bytes_per_edge": (p["peak"] - p["rss_before"]) / edges} for p in PHASES]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
