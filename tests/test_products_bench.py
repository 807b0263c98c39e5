"""benchmarks/products.py names an out-of-memory peer as one: at ogbn-products' size PyG's GCNConv on edge_index asks
torch's CPU allocator for its [edges, 256] messages at once (129,195,377,664 bytes), which refuses them before the
watchdog's limit is reached; the row read "RuntimeError: [enforce fail at alloc_cpu.cpp:127] ...", cut at 160
characters, where the issue asks for the models where PyG runs out of memory to be named."""
from __future__ import annotations

import importlib

from test_scale_generator import _scale

REFUSED = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 129195377664 bytes. Error code 12 (Cannot allocate memory)")


def test_an_allocation_torch_refuses_is_out_of_memory() -> None:
    _scale()  # puts benchmarks/ on sys.path, as scale.py (which imports its neighbour products.py) needs it
    products = importlib.import_module("products")
    assert products.refused_allocation(REFUSED) == \
        "out of memory: a 120.3 GiB allocation refused by torch's CPU allocator"
    assert products.refused_allocation("ValueError: GATConv does not take a sparse adjacency") is None
