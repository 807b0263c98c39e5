"""What sum |B_i| a split costs once every part holds some of the graph (issue 4's G3 target, measured).

Edge-cut METIS reaches its low sum |B_i| on an R-MAT graph by leaving parts
nearly without remote vertices: half the vertices are isolated, and METIS
can fill whole parts with them. A split with max/min |B_i| <= 1.10 cannot.
This partitions only the non-isolated vertices with METIS (edge cut or
volume, vertex or degree weights), deals the isolated ones round-robin, and
prints sum |B_i| against the default edge-cut METIS on the whole graph:

    python benchmarks/partition_core.py
    python benchmarks/partition_core.py --spec rmat:n=100000,deg=10,features=16,classes=4,seed=0
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from gnnc import api
from gnnc.passes.graph_stats import compute_stats
from gnnc.passes.partition_metis import metis_kway
from gnnc.passes.partitioning import PartitionInput

VARIANTS = (("cut", "vertices"), ("vol", "vertices"), ("cut", "degree"), ("vol", "vertices+degree"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="rmat:n=1000000,deg=10,features=16,classes=4,seed=0")
    ap.add_argument("--parts", type=int, default=8)
    args = ap.parse_args()
    graph = api.load_graph(args.spec)
    n = graph.num_nodes
    indptr, indices = PartitionInput(graph).undirected
    degree = np.diff(indptr)
    core, isolated = np.flatnonzero(degree > 0), np.flatnonzero(degree == 0)
    sub = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))[core][:, core].tocsr()
    in_degree = np.bincount(graph.dst, minlength=n).astype(np.int64)[core]

    def row(name: str, assignment: np.ndarray, seconds: float, base: int | None) -> int:
        stats = compute_stats(graph, assignment, layers=1)
        total = int(stats.remote.sum())
        ratio = f"{total / base:8.3f}x" if base else f"{'1.000x':>9s}"
        print(f"{name:36s} {seconds:7.1f} {total:10d} {ratio} {int(stats.remote.max()):9d} "
              f"{stats.remote_balance:9.3f}")
        return total

    print(f"{args.spec}: {len(core)} non-isolated of {n} vertices, {args.parts} parts")
    print(f"{'split':36s} {'time s':>7s} {'sum |B|':>10s} {'x metis':>9s} {'max |B|':>9s} {'max/min':>9s}")
    t0 = time.perf_counter()
    whole = np.asarray(api.partition_vertices(graph, args.parts, "metis"))
    base = row("metis (cut), whole graph", whole, time.perf_counter() - t0, None)
    ones = np.ones(len(core), np.int64)
    weight_sets = {"vertices": ones[:, None], "degree": (in_degree + 1)[:, None],
                   "vertices+degree": np.stack([ones, in_degree], axis=1)}
    for objective, weights in VARIANTS:
        w = weight_sets[weights]
        t0 = time.perf_counter()
        part, _ = metis_kway(sub.indptr.astype(np.int64), sub.indices.astype(np.int64), args.parts, w, objective, 0, 30)
        assignment = np.empty(n, np.int64)
        assignment[core] = part
        assignment[isolated] = np.arange(len(isolated)) % args.parts
        row(f"{objective}, {weights} weights, core", assignment, time.perf_counter() - t0, base)


if __name__ == "__main__":
    main()
