"""Tasks beyond node classification (issue 37): gnnc against the same model in PyG, same data, same seeds.

Each task is one function in TASKS, run by name:

    python benchmarks/tasks.py --task link_gae            # link prediction: GAE on Cora, seeds 0 1 2
    python benchmarks/tasks.py --task link_gae --seeds 0 --epochs 50
    python benchmarks/tasks.py --task gin_graph --seeds 0 --epochs 30   # graph classification, 10 folds
    python benchmarks/tasks.py --task node_regression --epochs 200        # RMSE, gnnc against PyG's SAGE
    python benchmarks/tasks.py --task proteins_multilabel --epochs 100    # mean ROC-AUC over 112 targets

link_gae: examples/link_gae.gnn (a 2-layer GCN encoder, 32 hidden and 16 latent, inner-product decoder,
Adam lr 0.01, no weight decay, 200 epochs) on Cora's 85/5/10 edge split of each seed (gnnc.graph.edge_split,
the split PyG's RandomLinkSplit makes), against PyG's GAE (torch_geometric.nn.GAE over two GCNConv) trained on
the same split's message-passing edges and positives, with the same fixed validation and test negatives, its
training negatives drawn each epoch by torch_geometric.utils.negative_sampling against the message-passing
edges (gnnc draws its own, uniformly, seeded), binary cross-entropy on the logits of positives and
negatives together (PyG's link_pred example). Both report the test AUC at the epoch of best validation AUC;
PyG's initial weights are torch.manual_seed(seed)'s, gnnc's its own of that seed. gnnc's run of the first seed
is repeated on 2 gloo processes (`--nproc 2`): each of its --json metrics beside one process's.

node_regression, proteins_multilabel: examples/node_regression.gnn (mse) and examples/proteins_multilabel.gnn
(bce; its input the mean of each vertex's in-edges' 8 features) -- two GraphSAGE layers, 64 hidden, ReLU, no
dropout, Adam lr 0.01, no weight decay, full batch -- on the generated graphs REGRESS and PROTEINS (below; the
same 60/20/20 split), against PyG's two SAGEConv layers with the same settings. Both report the test metric at
the best validation epoch (lowest RMSE; highest mean ROC-AUC, OGB's, computed for PyG apart from gnnc with
scipy's ranks). PyG's initial weights are torch.manual_seed(seed)'s, gnnc's its own of that seed. gnnc's run of
the first seed is repeated on 2 gloo processes: the relative difference of its final logits and of every
epoch's metrics against one process.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent


def _pyg_gae(graph, seed: int, epochs: int) -> float:
    """PyG's GAE on gnnc's split of `seed`: test AUC at the epoch of best validation AUC."""
    from torch_geometric.nn import GAE, GCNConv
    from torch_geometric.utils import negative_sampling

    from gnnc.graph.edge_split import split_edges
    from gnnc.runtime.link_task import pair_auc

    s = split_edges(graph.src, graph.dst, graph.num_nodes, 0.05, 0.10, 1.0, seed)
    as_t = lambda a: torch.as_tensor(a, dtype=torch.int64)  # noqa: E731
    mp = torch.stack([as_t(graph.src[s.message_edges]), as_t(graph.dst[s.message_edges])])
    train_pos = as_t(s.train_pos)
    torch.manual_seed(seed)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = GCNConv(graph.num_features, 32, cached=True), GCNConv(32, 16, cached=True)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    model = GAE(Encoder())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = graph.x.to_dense() if graph.x.is_sparse else graph.x
    best = (-1.0, 0.0)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        z = model.encode(x, mp)
        neg = negative_sampling(mp, num_nodes=graph.num_nodes, num_neg_samples=train_pos.shape[1])
        pairs = torch.cat([train_pos, neg], 1)
        labels = torch.cat([torch.ones(train_pos.shape[1]), torch.zeros(neg.shape[1])])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model.decoder(z, pairs, sigmoid=False), labels)
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            z = model.encode(x, mp)
            auc = [pair_auc(model.decoder(z, as_t(p), sigmoid=False), model.decoder(z, as_t(n), sigmoid=False))
                   for p, n in ((s.val_pos, s.val_neg), (s.test_pos, s.test_neg))]
        if auc[0] > best[0]:
            best = (auc[0], auc[1])
    return best[1]


def _gnnc_gae_run(seed: int, epochs: int, nproc: int = 1) -> dict[str, object]:
    """gnnc's run of examples/link_gae.gnn (its --json), in a process of its own, on `nproc` gloo processes."""
    ranks = ["--nproc", str(nproc)] if nproc > 1 else []
    out = subprocess.run([sys.executable, "-m", "gnnc", "run", "examples/link_gae.gnn", "--graph", "planetoid:cora",
                          "--seed", str(seed), "--epochs", str(epochs), "--json", "--no-progress", *ranks],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"gnnc run (--nproc {nproc}) exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _gnnc_gae(seed: int, epochs: int) -> float:
    return float(_gnnc_gae_run(seed, epochs)["test_auc"])  # type: ignore[arg-type]


def link_gae(seeds: list[int], epochs: int) -> dict[str, object]:
    """Link prediction (issue 37 item 1): GAE on Cora, gnnc against PyG on the same split per seed."""
    import gnnc

    graph = gnnc.load_graph("planetoid:cora")
    runs = [_gnnc_gae_run(s, epochs) for s in seeds]
    ours = [float(r["test_auc"]) for r in runs]  # type: ignore[arg-type]
    theirs = [_pyg_gae(graph, s, epochs) for s in seeds]
    out: dict[str, object] = {"task": "link_gae", "seeds": seeds, "epochs": epochs, "gnnc_test_auc": ours,
                              "pyg_test_auc": theirs, "gnnc_mean": statistics.mean(ours),
                              "pyg_mean": statistics.mean(theirs)}
    if TWO_RANKS:  # the first seed again on 2 gloo processes (gnnc.runtime.pair_exchange): every metric, loss
        one, two = runs[0], _gnnc_gae_run(seeds[0], epochs, nproc=2)
        keys = sorted(k for k in one if k.startswith(("test_", "val_", "final_test_")) or k == "train_loss")
        out["two_ranks"] = {"seed": seeds[0], **{k: [one[k], two[k]] for k in keys if k in two},
                            "best_epoch": [one["best_epoch"], two["best_epoch"]],
                            "epoch_time_s": [one["epoch_time_s"], two["epoch_time_s"]]}
    return out


def _pyg_sage(graph, seed: int, epochs: int, x: torch.Tensor, loss_fn, metric,
              init: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """PyG's two SAGEConv layers (64 hidden, ReLU between, no dropout), Adam lr 0.01, full batch, initial weights
    torch.manual_seed(seed)'s, or gnnc's (`init`: its two SAGE layers' weights by IR name, in order): `metric(out,
    mask)` (larger is better) of every split at the best validation epoch."""
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(seed)
    ei = torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]).long()
    c1, c2 = SAGEConv(x.shape[1], 64), SAGEConv(64, graph.y.shape[1])
    if init is not None:
        layers = sorted({k.split(".")[0] for k in init})
        with torch.no_grad():
            for conv, layer in zip((c1, c2), layers):
                conv.lin_l.weight.copy_(init[f"{layer}.linear0.weight"].T)
                conv.lin_l.bias.copy_(init[f"{layer}.linear0.bias"])
                conv.lin_r.weight.copy_(init[f"{layer}.linear1.weight"].T)
    params = [*c1.parameters(), *c2.parameters()]
    opt = torch.optim.Adam(params, lr=0.01)
    masks = {"train": graph.train_mask, "val": graph.val_mask, "test": graph.test_mask}
    best: dict[str, float] | None = None
    for _ in range(epochs):
        opt.zero_grad()
        out = c2(c1(x, ei).relu(), ei)
        loss_fn(out[graph.train_mask], graph.y[graph.train_mask]).backward()
        opt.step()
        with torch.no_grad():
            out = c2(c1(x, ei).relu(), ei)
        scores = {k: metric(out, m) for k, m in masks.items()}
        if best is None or scores["val"] > best["val"]:
            best = scores
    return best


def _rocauc_scipy(out: torch.Tensor, y: torch.Tensor) -> float:
    """OGB's mean ROC-AUC computed apart from gnnc (scipy's ranks, Mann-Whitney): per target with both classes."""
    from scipy.stats import rankdata

    aucs = []
    for t in range(y.shape[1]):
        lab = y[:, t].numpy()
        pos = int((lab == 1).sum())
        neg = len(lab) - pos
        if pos and neg:
            ranks = rankdata(out[:, t].numpy())
            aucs.append((ranks[lab == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))
    return float(sum(aucs) / len(aucs))


TWO_RANKS = True  # --no-two-ranks: leave out the 2-process repeat
PYG_ONLY = False  # --pyg-only: PyG's columns alone (gnnc's runs are deterministic: another command gave them)


def _gnnc_init(example: str, graph, seed: int) -> dict[str, torch.Tensor]:
    """gnnc's initial weights of `seed` for the example on `graph`, by IR name."""
    import gnnc
    from gnnc.runtime.executor import init_params

    program = gnnc.compile(gnnc.load_model(ROOT / "examples" / example), graph).program
    return {k: v.detach() for k, v in init_params(program, seed).items()}


def _gnnc_runs(example: str, spec: str, seeds: list[int], epochs: int, metric: str) -> tuple[list[float], dict]:
    """gnnc's test `metric` per seed (one process), and seed 0's run on 2 gloo ranks against one process: the
    largest relative difference of the final logits and of each split's metric over every epoch."""
    import gnnc

    if PYG_ONLY:
        return [], {}
    graph = gnnc.load_graph(spec)
    model = gnnc.load_model(ROOT / "examples" / example)
    ours, first = [], None
    for seed in seeds:
        result = gnnc.run(gnnc.compile(model, graph), graph, epochs=epochs, seed=seed)
        ours.append(result.metrics[f"test_{metric}"])
        first = first or result
    if not TWO_RANKS:
        return ours, {}
    two = gnnc.run(gnnc.compile(model, graph, workers=2, partition="metis"), graph, epochs=epochs, seed=seeds[0])
    logits = float((two.logits - first.logits).norm() / first.logits.norm())
    per_epoch = max(abs(a[f"{s}_{metric}"] - b[f"{s}_{metric}"]) / max(abs(a[f"{s}_{metric}"]), 1e-12)
                    for a, b in zip(first.history, two.history) for s in ("train", "val", "test"))
    return ours, {"logits_rel_diff": logits, f"{metric}_rel_diff": per_epoch,
                  "best_epoch": [first.best_epoch, two.best_epoch]}


REGRESS = "regress:n=3000,deg=8,features=16,targets=1,noise=0.1,seed=0"
PROTEINS = "proteins:n=3000,deg=10,features=8,tasks=112,edge_features=8,seed=0"


def node_regression(seeds: list[int], epochs: int) -> dict[str, object]:
    """Node regression (issue 37 item 2): examples/node_regression.gnn on REGRESS against PyG's same model; the
    test RMSE at the epoch of lowest validation RMSE, per seed."""
    import gnnc

    ours, two = _gnnc_runs("node_regression.gnn", REGRESS, seeds, epochs, "rmse")
    graph = gnnc.load_graph(REGRESS)
    rmse = lambda out, m: -float(((out[m] - graph.y[m]) ** 2).mean().sqrt())  # noqa: E731  (larger is better)
    theirs = [-_pyg_sage(graph, s, epochs, graph.x, torch.nn.functional.mse_loss, rmse)["test"] for s in seeds]
    same = [-_pyg_sage(graph, s, epochs, graph.x, torch.nn.functional.mse_loss, rmse,
                       _gnnc_init("node_regression.gnn", graph, s))["test"] for s in seeds]
    out = {"task": "node_regression", "graph": REGRESS, "seeds": seeds, "epochs": epochs, "gnnc_test_rmse": ours,
           "pyg_test_rmse": theirs, "pyg_from_gnnc_init_test_rmse": same, "pyg_mean": statistics.mean(theirs),
           "pyg_from_gnnc_init_mean": statistics.mean(same), "two_ranks_vs_one": two}
    if ours:
        out.update(gnnc_mean=statistics.mean(ours), gnnc_over_pyg=statistics.mean(ours) / statistics.mean(theirs))
    return out


def proteins_multilabel(seeds: list[int], epochs: int) -> dict[str, object]:
    """Multi-label (issue 37 item 2): examples/proteins_multilabel.gnn on PROTEINS against PyG's same model (its
    input the mean of each vertex's in-edges' features, torch_geometric.utils.scatter, as OGB's proteins
    example); the test mean ROC-AUC at the epoch of best validation mean ROC-AUC, per seed."""
    import gnnc
    from torch_geometric.utils import scatter

    ours, two = _gnnc_runs("proteins_multilabel.gnn", PROTEINS, seeds, epochs, "rocauc")
    graph = gnnc.load_graph(PROTEINS)
    x = scatter(graph.edge_data["attr"], torch.as_tensor(graph.dst).long(), 0, dim_size=graph.num_nodes,
                reduce="mean")
    auc = lambda out, m: _rocauc_scipy(out[m], graph.y[m])  # noqa: E731
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    theirs = [_pyg_sage(graph, s, epochs, x, bce, auc)["test"] for s in seeds]
    same = [_pyg_sage(graph, s, epochs, x, bce, auc, _gnnc_init("proteins_multilabel.gnn", graph, s))["test"]
            for s in seeds]
    out = {"task": "proteins_multilabel", "graph": PROTEINS, "seeds": seeds, "epochs": epochs,
           "gnnc_test_rocauc": ours, "pyg_test_rocauc": theirs, "pyg_from_gnnc_init_test_rocauc": same,
           "pyg_mean": statistics.mean(theirs), "pyg_from_gnnc_init_mean": statistics.mean(same),
           "two_ranks_vs_one": two}
    if ours:
        out.update(gnnc_mean=statistics.mean(ours),
                   points_apart=100 * (statistics.mean(ours) - statistics.mean(theirs)))
    return out


GIN_GRAPH_SPEC = "graphs:n=300,seed=0"  # gnnc's generator (no TU dataset ships with PyG or is on this machine)


def _pyg_gin(root: str, name: str, folds: list, fold: int, seed: int, epochs: int) -> float:
    """PyG's examples/gin.py Net on TUDataset(root, name) (the files gnnc reads), run `fold` of `folds`: test
    accuracy at the epoch of best validation accuracy."""
    from torch_geometric.datasets import TUDataset
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import MLP, GINConv, global_add_pool

    from gnnc.graph.graph_batches import fold_split

    ds = TUDataset(root, name, use_node_attr=True)
    train, val, test = (ds[torch.as_tensor(ids)] for ids in fold_split(folds, fold))
    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self, cin: int, hidden: int, cout: int, layers: int) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList()
            for _ in range(layers):
                self.convs.append(GINConv(nn=MLP([cin, hidden, hidden]), train_eps=False))
                cin = hidden
            self.mlp = MLP([hidden, hidden, cout], norm=None, dropout=0.5)

        def forward(self, x, edge_index, batch):
            for conv in self.convs:
                x = conv(x, edge_index).relu()
            return self.mlp(global_add_pool(x, batch))

    model = Net(ds.num_features, 32, ds.num_classes, 5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(train, batch_size=128, shuffle=True)

    @torch.no_grad()
    def accuracy(part) -> float:
        model.eval()
        correct = sum(int((model(d.x, d.edge_index, d.batch).argmax(-1) == d.y).sum())
                      for d in DataLoader(part, batch_size=128))
        return correct / len(part)

    best = (-1.0, 0.0)
    for _ in range(epochs):
        model.train()
        for d in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(d.x, d.edge_index, d.batch), d.y).backward()
            opt.step()
        val_acc, test_acc = accuracy(val), accuracy(test)
        if val_acc > best[0]:
            best = (val_acc, test_acc)
    return best[1]


def gin_graph(seeds: list[int], epochs: int) -> dict[str, object]:
    """Graph classification (issue 37 item 3): examples/gin_graph.gnn against PyG's GIN example (examples/gin.py:
    5 GINConv layers of MLP([., 32, 32]) with batch norm, sum readout, MLP([32, 32, C], dropout 0.5), Adam lr
    0.01, batches of 128) on gnnc's generated dataset GIN_GRAPH_SPEC written in the TUDataset layout (gnnc reads it
    with tu:, PyG with TUDataset(use_node_attr=True)), the same 10 stratified folds (gnnc.graph.graph_batches,
    fold seed 0) and seeds; the mean over folds and seeds of the test accuracy at the epoch of best validation
    accuracy. One thread each, one after the other."""
    import tempfile

    import gnnc
    from gnnc import graph_classification as gc
    from gnnc.graph.graph_batches import stratified_folds
    from gnnc.graph.tu_dataset import generate_graphs, write_tu
    from gnnc.runtime.graph_task import GraphSplit

    torch.set_num_threads(1)
    ds = generate_graphs(GIN_GRAPH_SPEC)
    folds = stratified_folds(ds.y, 10, 0)
    model = gnnc.load_model(ROOT / "examples" / "gin_graph.gnn")
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="gnnc-gin-") as tmp:
        write_tu(ds, Path(tmp) / "GEN" / "raw", "GEN")
        for seed in seeds:
            for fold in range(10):
                result = gc.run(model, f"tu:{tmp}/GEN", {"epochs": epochs, "seed": seed, "threads": 1},
                                split=GraphSplit(10, fold, 0))
                ours.append(result.test_acc)
                theirs.append(_pyg_gin(tmp, "GEN", folds, fold, seed, epochs))
                print(f"seed {seed} fold {fold}: gnnc {ours[-1]:.4f} pyg {theirs[-1]:.4f}", file=sys.stderr, flush=True)
    return {"task": "gin_graph", "dataset": GIN_GRAPH_SPEC, "folds": 10, "seeds": seeds, "epochs": epochs,
            "gnnc_test_acc": ours, "pyg_test_acc": theirs, "gnnc_mean": statistics.mean(ours),
            "pyg_mean": statistics.mean(theirs), "difference_points": 100 * (statistics.mean(ours) - statistics.mean(theirs))}


TASKS: dict[str, Callable[[list[int], int], dict[str, object]]] = {
    "link_gae": link_gae, "node_regression": node_regression, "proteins_multilabel": proteins_multilabel,
    "gin_graph": gin_graph}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--no-two-ranks", action="store_true", help="link_gae, node_regression, proteins_multilabel: "
                    "leave out the repeat of gnnc's first seed on 2 gloo processes")
    ap.add_argument("--pyg-only", action="store_true", help="node_regression, proteins_multilabel: PyG's columns "
                    "alone (gnnc's runs are deterministic for a seed: an earlier command gave them)")
    args = ap.parse_args()
    global TWO_RANKS, PYG_ONLY
    TWO_RANKS, PYG_ONLY = not args.no_two_ranks, args.pyg_only
    with open("/proc/loadavg", encoding="ascii") as f:
        load = f.read().split()[:3]
    result = TASKS[args.task](args.seeds, args.epochs)
    result["loadavg_before"] = load
    print(json.dumps(result))


if __name__ == "__main__":
    main()
