"""SGC's epoch time with and without the hoist pass, and the same logits either way.

SGC (examples/sgc.gnn) propagates the input features K times through
parameter-free layers and then applies one linear map. Without `hoist` every
forward pass (a training and an evaluation one per epoch) recomputes A^K x;
with it, a run computes A^K x once. Both runs train the same plan otherwise,
with the same seed; the script prints the median epoch time of each (epochs
after the first, which is where the hoisted values are computed), their
ratio, the first epoch's time of each, and how far apart the final logits
are (identical in one process; on several workers the recomputed run sums a
halo layer's held and received rows separately, overlapping the exchange, so
the two differ by float rounding). A GCN epoch on the same graph is printed for scale (the issue's
"3x a GCN epoch").

    python benchmarks/hoist.py                               # Cora, K = 2, 50 epochs
    python benchmarks/hoist.py --graph planetoid:citeseer --set K=4 --nproc 2
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import gnnc
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def one_run(model, graph, passes: list[str] | None, epochs: int, nproc: int, strategy: str | None) -> dict:
    """Train once; the summary (median epoch time after the first) and the logits."""
    plan = gnnc.compile(model, graph, workers=nproc, passes=passes, strategy=strategy, partition="metis")
    result = gnnc.run(plan, graph, epochs=epochs, seed=0)
    return {"epoch_time_s": result.epoch_time_s, "first_epoch_s": result.history[0]["time_s"],
            "logits": result.logits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="planetoid:cora")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--strategy", default=None, help="with --nproc > 1: the strategy of every graph layer")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="SGC's parameters (K=...)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one thread: the timing is of the work, not of the machine's other load
    graph = gnnc.load_graph(args.graph)
    sets = dict(item.split("=", 1) for item in args.set)
    sgc = gnnc.load_model(EXAMPLES / "sgc.gnn", **sets)
    without = [p for p in DEFAULT_PIPELINE if p != "hoist"]
    if args.nproc > 1:
        without += [p for p in DISTRIBUTED_PIPELINE if p != "hoist"]
    runs = {"hoisted": one_run(sgc, graph, None, args.epochs, args.nproc, args.strategy),
            "recomputed": one_run(sgc, graph, without, args.epochs, args.nproc, args.strategy),
            "gcn": one_run(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, None, args.epochs, args.nproc,
                           args.strategy)}
    a, b = runs["hoisted"]["logits"], runs["recomputed"]["logits"]
    gap = float((a - b).norm() / b.norm())
    summary = {name: {"epoch_time_s": r["epoch_time_s"], "first_epoch_s": r["first_epoch_s"]}
               for name, r in runs.items()}
    summary.update(graph=args.graph, nproc=args.nproc, epochs=args.epochs, logits_relative_difference=gap,
                   speedup=runs["recomputed"]["epoch_time_s"] / runs["hoisted"]["epoch_time_s"])
    for name, r in summary.items():
        if isinstance(r, dict):
            print(f"{name:11s} epoch {r['epoch_time_s'] * 1e3:8.2f} ms (median after the first), "
                  f"first epoch {r['first_epoch_s'] * 1e3:8.2f} ms")
    print(f"SGC recomputed / hoisted: {summary['speedup']:.2f}x; final logits' relative difference: {gap:.2e}")
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
