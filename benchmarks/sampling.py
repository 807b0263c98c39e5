"""Sampling throughput: gnnc's neighbour sampler against PyG's NeighborLoader, in the same run.

Both draw 2-layer minibatches with fan-out (25, 10) (hop order, PyG's `num_neighbors`) and batch 512 from
the same 200K-vertex / 2M-edge R-MAT graph, seeds shuffled each epoch. Reported: minibatches per second
and blocks per second (two blocks a minibatch), median of `--repeats` timed passes over `--batches`
minibatches after one warm-up pass, for

* gnnc's sampler alone (`NeighbourSampler.sample`: the blocks, local ids, edge ids), and
* gnnc's loader (the blocks plus what NeighborLoader also returns: the sampled vertices' features and the
  seeds' labels), against
* PyG's NeighborLoader (its sampler, relabelling and the same feature/label gather, into a Data object).

NeighborLoader needs `pyg-lib` or `torch-sparse` for its sampler; without either it raises ImportError,
and this script says so instead of a figure. Where torch-sparse is built but its package cannot be imported
(it imports torch-scatter), its compiled neighbour-sampling op is loaded alone (`_pyg_backend`), and the note
says so. `cat /proc/loadavg` is printed beside the figures.

    python benchmarks/sampling.py [--batches 60] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path

import numpy as np
import torch

import gnnc
from gnnc.graph.sampling import NeighbourSampler

GRAPH = "rmat:n=200000,deg=10,features=64,classes=8,seed=0"
FANOUT = (25, 10)  # hop order: 25 per seed, then 10 of each
BATCH = 512


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    return statistics.median(timeit.repeat(fn, number=1, repeat=repeats))


def _pyg_backend() -> str:
    """Which sampler NeighborLoader will call. torch-sparse's Python package imports torch-scatter; when only
    torch-sparse is built, its compiled neighbour-sampling op is loaded by itself and PyG told it exists
    (NeighborLoader then calls exactly `torch.ops.torch_sparse.neighbor_sample`, as with the whole package)."""
    import importlib.util

    import torch_geometric.typing as tgt

    if tgt.WITH_PYG_LIB or tgt.WITH_TORCH_SPARSE:
        return "pyg-lib" if tgt.WITH_PYG_LIB else "torch-sparse"
    spec = importlib.util.find_spec("torch_sparse")
    lib = None if spec is None or not spec.submodule_search_locations else \
        next(Path(spec.submodule_search_locations[0]).glob("_neighbor_sample_cpu*.so"), None)
    if lib is None:
        return "none"
    torch.ops.load_library(str(lib))
    tgt.WITH_TORCH_SPARSE = True
    return f"torch-sparse's compiled op alone ({lib.name}; its package needs torch-scatter, not installed)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    graph = gnnc.load_graph(GRAPH)
    seeds = np.nonzero(graph.train_mask.numpy())[0]
    sampler = NeighbourSampler(graph, ["plain", "plain"], list(reversed(FANOUT)), seed=0)
    batches = sampler.epoch_batches(0, seeds, BATCH)[: args.batches]
    x, y = graph.x, graph.y

    def gnnc_sampler():
        for i, b in enumerate(batches):
            sampler.sample(b, 0, i)

    def gnnc_loader():
        for i, b in enumerate(batches):
            mb = sampler.sample(b, 0, i)
            x[torch.from_numpy(mb.blocks[0].src_ids)], y[torch.from_numpy(mb.seeds)]

    rows = [("gnnc sampler", timed(gnnc_sampler, args.repeats)), ("gnnc loader (+ features, labels)",
                                                                   timed(gnnc_loader, args.repeats))]
    note = ""
    try:
        backend = _pyg_backend()
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        data = Data(x=x, y=y, edge_index=torch.from_numpy(np.stack([graph.src, graph.dst])).long())
        loader = NeighborLoader(data, num_neighbors=list(FANOUT), batch_size=BATCH,
                                input_nodes=torch.from_numpy(seeds), shuffle=True)

        def pyg():
            for i, batch in enumerate(loader):
                if i + 1 >= len(batches):
                    break

        rows.append(("PyG NeighborLoader", timed(pyg, args.repeats)))
        import torch_geometric.typing as tgt

        note = ("PyG's sampler: " + ("pyg-lib" if tgt.WITH_PYG_LIB else backend if tgt.WITH_TORCH_SPARSE
                                     else "none") + f" (torch_geometric {__import__('torch_geometric').__version__})")
    except ImportError as err:
        note = f"PyG NeighborLoader unavailable here: {err}"
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"graph {GRAPH}: {graph.num_nodes} vertices, {graph.num_edges} edges; fan-out {FANOUT}, batch {BATCH}, "
          f"{len(batches)} minibatches per pass, median of {args.repeats}; loadavg {' '.join(load)}")
    base = dict(rows).get("PyG NeighborLoader")
    for name, seconds in rows:
        rate = len(batches) / seconds
        vs = f"  {base / seconds:.2f}x PyG" if base else ""
        print(f"  {name:34s} {rate:8.1f} minibatches/s  {2 * rate:8.1f} blocks/s{vs}")
    print(note)


if __name__ == "__main__":
    main()
