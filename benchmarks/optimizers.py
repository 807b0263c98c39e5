"""GCN on Cora with AdamW, cosine annealing and a linear warm-up: gnnc against the same PyG model and schedule.

Both train 200 epochs with AdamW (lr 0.01, weight decay 5e-4 on every parameter), 10 epochs of LinearLR warm-up
from lr/11 chained by SequentialLR with CosineAnnealingLR over the remaining 190, dropout 0.5, hidden 16, and
report the test accuracy at the epoch of best validation accuracy (the earliest such epoch), for the same seeds
(torch.manual_seed(seed) for PyG, `--seed` for gnnc: the two draw their initial weights differently, so the
accuracies are compared over the seeds, not seed by seed). Issue 41 asks for the two within 1 point.

    python benchmarks/optimizers.py              # seeds 0..4
    python benchmarks/optimizers.py --seeds 3 --epochs 200
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
LR, WEIGHT_DECAY, WARMUP = 0.01, 5e-4, 10


def pyg_run(graph, seed: int, epochs: int) -> float:
    """PyG's GCN (GCNConv, cached normalisation) under the same optimizer and schedule: test acc at best val."""
    from torch_geometric.nn import GCNConv

    torch.manual_seed(seed)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    x = graph.x.to_dense() if graph.x.is_sparse else graph.x
    y = graph.y
    c = int(y.max()) + 1
    convs = torch.nn.ModuleList([GCNConv(x.shape[1], 16, cached=True), GCNConv(16, c, cached=True)])
    opt = torch.optim.AdamW(convs.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    S = torch.optim.lr_scheduler
    sched = S.SequentialLR(opt, [S.LinearLR(opt, start_factor=1 / (WARMUP + 1), total_iters=WARMUP),
                                 S.CosineAnnealingLR(opt, T_max=epochs - WARMUP)], milestones=[WARMUP])

    def forward(training: bool) -> torch.Tensor:
        h = F.dropout(x, 0.5, training=training)
        h = F.relu(convs[0](h, ei))
        h = F.dropout(h, 0.5, training=training)
        return convs[1](h, ei)

    best_val, best_test = -1.0, 0.0
    for _ in range(epochs):
        convs.train()
        opt.zero_grad()
        F.cross_entropy(forward(True)[graph.train_mask], y[graph.train_mask]).backward()
        opt.step()
        convs.eval()
        with torch.no_grad():
            pred = forward(False).argmax(-1)
        val = float((pred[graph.val_mask] == y[graph.val_mask]).float().mean())
        test = float((pred[graph.test_mask] == y[graph.test_mask]).float().mean())
        if val > best_val:
            best_val, best_test = val, test
        sched.step()
    return best_test


def gnnc_run(seed: int, epochs: int) -> float:
    from gnnc import api

    model = api.load_model(ROOT / "examples" / "gcn.gnn")
    result = api.run(model, "planetoid:cora", epochs=epochs, seed=seed, lr=LR, weight_decay=WEIGHT_DECAY,
                     optimizer="adamw", lr_schedule="cosine", warmup=WARMUP)
    return result.test_acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=200)
    args = ap.parse_args()
    from gnnc.api import load_graph

    graph = load_graph("planetoid:cora")
    rows = []
    print(f"GCN on Cora, AdamW lr {LR} wd {WEIGHT_DECAY}, {WARMUP} epochs warm-up + cosine, {args.epochs} epochs")
    print(f"{'seed':>4}  {'gnnc':>6}  {'pyg':>6}")
    for seed in range(args.seeds):
        ours, theirs = gnnc_run(seed, args.epochs), pyg_run(graph, seed, args.epochs)
        rows.append((ours, theirs))
        print(f"{seed:>4}  {ours:.4f}  {theirs:.4f}", flush=True)
    g, p = statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows)
    print(f"mean  {g:.4f}  {p:.4f}   gnnc - pyg = {100 * (g - p):+.2f} points "
          f"({'within' if abs(g - p) <= 0.01 else 'NOT within'} 1 point)")
    sys.exit(0)


if __name__ == "__main__":
    main()
