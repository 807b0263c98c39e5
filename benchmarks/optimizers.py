"""GCN on Cora with AdamW, cosine annealing and a linear warm-up: gnnc against the same PyG model and schedule.

Both train 200 epochs with AdamW (lr 0.01, weight decay 5e-4 on every parameter), 10 epochs of LinearLR warm-up
from lr/11 chained by SequentialLR with CosineAnnealingLR over the remaining 190, dropout 0.5, hidden 16, and
report the test accuracy at the epoch of best validation accuracy (the earliest such epoch), for the same seeds
(torch.manual_seed(seed) for PyG, `--seed` for gnnc: the two draw their initial weights differently, so the
accuracies are compared over the seeds, not seed by seed). Issue 41 asks for the two within 1 point. A third
column runs PyG from gnnc's own initial weights of that seed (gnnc.runtime.executor.init_params, transposed into
GCNConv's): the two then differ only by their dropout masks, a tighter comparison of the optimizer and schedule.

    python benchmarks/optimizers.py              # seeds 0..4
    python benchmarks/optimizers.py --seeds 3 --epochs 200

Its output at 7fc0107 (2 CPU cores, torch 2.8, PyG 2.8.1): test accuracy per seed 0..4, gnnc 0.7900 0.8170
0.7980 0.8030 0.8020, PyG 0.8270 0.8060 0.8130 0.7940 0.8090, PyG from gnnc's initial weights 0.7750 0.8180
0.8060 0.8110 0.7990; means 0.8020, 0.8098 and 0.8018: gnnc - PyG = -0.78 points, gnnc - PyG from gnnc's
initial weights = +0.02 points (both within 1 point).
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


def pyg_run(graph, seed: int, epochs: int, start: dict[str, torch.Tensor] | None = None) -> float:
    """PyG's GCN (GCNConv, cached normalisation) under the same optimizer and schedule: test acc at best val;
    from `start`, gnnc's initial weights by IR name, when given."""
    from torch_geometric.nn import GCNConv

    torch.manual_seed(seed)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    x = graph.x.to_dense() if graph.x.is_sparse else graph.x
    y = graph.y
    c = int(y.max()) + 1
    convs = torch.nn.ModuleList([GCNConv(x.shape[1], 16, cached=True), GCNConv(16, c, cached=True)])
    if start is not None:
        with torch.no_grad():
            for k, conv in enumerate(convs):
                conv.lin.weight.copy_(start[f"l{k}.linear0.weight"].T)  # gnnc's [in, out], PyG's [out, in]
                conv.bias.copy_(start[f"l{k}.bias0.bias"])
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
    from gnnc import api
    from gnnc.runtime.executor import init_params

    graph = api.load_graph("planetoid:cora")
    program = api.compile(api.load_model(ROOT / "examples" / "gcn.gnn"), graph).program
    rows = []
    print(f"GCN on Cora, AdamW lr {LR} wd {WEIGHT_DECAY}, {WARMUP} epochs warm-up + cosine, {args.epochs} epochs")
    print(f"{'seed':>4}  {'gnnc':>6}  {'pyg':>6}  {'pyg from gnnc init':>18}")
    for seed in range(args.seeds):
        start = {k: v.detach() for k, v in init_params(program, seed).items()}
        row = (gnnc_run(seed, args.epochs), pyg_run(graph, seed, args.epochs),
               pyg_run(graph, seed, args.epochs, start))
        rows.append(row)
        print(f"{seed:>4}  {row[0]:.4f}  {row[1]:.4f}  {row[2]:18.4f}", flush=True)
    g, p, q = (statistics.mean(r[k] for r in rows) for k in range(3))
    print(f"mean  {g:.4f}  {p:.4f}  {q:18.4f}")
    for name, other in (("pyg", p), ("pyg from gnnc init", q)):
        print(f"gnnc - {name} = {100 * (g - other):+.2f} points "
              f"({'within' if abs(g - other) <= 0.01 else 'NOT within'} 1 point)")
    sys.exit(0)


if __name__ == "__main__":
    main()
