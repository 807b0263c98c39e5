"""Opening a graph store checks every index array against the graph's size block by block (gnnc.graph.store): the
pages those checks read are let go once checked, and Fennel's pass lets the CSR's pages go as it streams, so a
process that opened (or partitioned) a papers100M-sized store does not hold its 48 bytes per edge of mapped index
arrays resident (RSS counts a mapped file's pages, and issue 34's peaks are of RSS)."""
from __future__ import annotations

import numpy as np
import torch

from gnnc.graph import Graph
from gnnc.graph.store import open_store, write_store
from gnnc.passes.partition.core import partition_graph

N, E = 20_000, 2_000_000  # each int64 index array 16 MB


def _resident(root) -> int:
    """Bytes of the store's files resident in this process's mappings (/proc/self/smaps)."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                mine = len(head) >= 6 and head[5].startswith(str(root))
            elif mine and head and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def _store(tmp_path):
    rng = np.random.default_rng(0)
    none = torch.zeros(N, dtype=torch.bool)
    g = Graph(N, rng.integers(0, N, E).astype(np.int32), rng.integers(0, N, E).astype(np.int32),
              torch.zeros((N, 1)), torch.zeros(N, dtype=torch.int64), none, none.clone(), none.clone(), name="pages")
    write_store(g, tmp_path / "store")
    return tmp_path / "store"


def test_open_and_fennel_leave_the_index_pages_go(tmp_path) -> None:
    root = _store(tmp_path)
    graph = open_store(root)
    assert _resident(root) < 8 << 20  # the checks read 7 arrays of 8-16 MB each: before, all of them resident
    partition_graph(graph, 4, "fennel")
    assert _resident(root) < 8 << 20  # both CSRs and the edge list streamed: before, ~80 MB resident


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def test_opening_a_store_holds_one_block_of_an_index_array_not_the_array(tmp_path, monkeypatch) -> None:
    """The one-tenth papers100M's open peaked 1.1 GiB over the interpreter (scale.py's fennel step, its
    peak_after_open): each array's pages were let go only after its whole check, so the check of one edge array
    held it resident (8 bytes per edge, 12 GiB at the full papers100M). Each block's pages go as it is checked."""
    from gnnc.graph import store

    root = _store(tmp_path)
    monkeypatch.setattr(store, "BLOCK_BYTES", 1 << 20)  # blocks of 1 MiB against 16 MiB arrays
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    before = _status("VmRSS")
    graph = open_store(root)
    grew = _status("VmHWM") - before
    assert grew < 8 << 20, f"opening grew the peak {grew / 2**20:.1f} MiB"  # before: ~17 MiB, one array and more
    del graph
