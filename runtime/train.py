"""Single-process training: Adam, per-epoch evaluation, model selection on validation.

Reports what a PyG example prints: the loss, train/val/test accuracy per
epoch, and the test accuracy at the epoch of best validation accuracy
(`test_acc`, the usual model selection) beside the last epoch's
(`final_test_acc`). Epoch time covers forward, backward and the optimizer
step, not evaluation.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from gnnc.ir import Program
from gnnc.runtime import rng
from gnnc.runtime.executor import (ExecContext, GraphView, Interpreter, check_graph_fits, forward,
                                   graph_inputs, init_params)
from gnnc.runtime.graph import Graph


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run, resolved once (CLI flags over the model's `training(...)`)."""

    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 5e-4
    graph_weight_decay: float | None = None  # for graph-layer params, if different (GCNII)
    seed: int = 0
    progress: bool = True
    use_kernels: bool = True

    @staticmethod
    def resolve(program: Program, **flags: Any) -> "TrainConfig":
        stated = dict(program.training)
        merged = {k: v for k, v in stated.items()}
        merged.update({k: v for k, v in flags.items() if v is not None})
        return TrainConfig(**{k: v for k, v in merged.items() if k in TrainConfig.__dataclass_fields__})


@dataclass
class RunResult:
    test_acc: float
    val_acc: float
    final_test_acc: float
    train_loss: float
    epoch_time_s: float
    logits: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0

    def summary(self) -> dict[str, Any]:
        return {"test_acc": self.test_acc, "val_acc": self.val_acc, "final_test_acc": self.final_test_acc,
                "train_loss": self.train_loss, "epoch_time_s": self.epoch_time_s, "best_epoch": self.best_epoch}


def _accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    if n == 0:
        return 0.0
    return float((logits[mask].argmax(-1) == y[mask]).sum()) / n


def make_optimizer(program: Program, params: dict[str, torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    graph_names = {p.value.name for layer in program.graph_layers() for p in layer.params}
    gw = cfg.weight_decay if cfg.graph_weight_decay is None else cfg.graph_weight_decay
    groups = [
        {"params": [p for n, p in params.items() if n in graph_names], "weight_decay": gw},
        {"params": [p for n, p in params.items() if n not in graph_names], "weight_decay": cfg.weight_decay},
    ]
    return torch.optim.Adam([g for g in groups if g["params"]], lr=cfg.lr)


def train(program: Program, graph: Graph, cfg: TrainConfig,
          on_epoch: Callable[[dict[str, float]], None] | None = None) -> RunResult:
    """Train `program` on `graph` in this process."""
    check_graph_fits(program, graph)
    views = {layer.edges: None for layer in program.graph_layers()}
    views = {v: GraphView.build(graph, v) for v in views}
    interp = Interpreter(program)
    params = init_params(program, cfg.seed)
    opt = make_optimizer(program, params, cfg)
    inputs = graph_inputs(graph)
    ids = torch.arange(graph.num_nodes)
    count = float(graph.train_mask.sum())
    eval_ctx = ExecContext(views, ids, program.config_dict(), False, lambda i: 0, max(count, 1.0),
                           cfg.use_kernels)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.epochs, desc="train", unit="epoch", leave=False)
    history: list[dict[str, float]] = []
    times: list[float] = []
    best_val, best = -1.0, None
    logits = None
    for epoch in range(cfg.epochs):
        key_base = rng.stream_key(cfg.seed, epoch)
        ctx = ExecContext(views, ids, program.config_dict(), True,
                          lambda i, kb=key_base: rng.stream_key(kb, i), max(count, 1.0), cfg.use_kernels)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = forward(interp, params, inputs, ctx)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        with torch.no_grad():
            logits, _ = forward(interp, params, inputs, eval_ctx)
        rec = {"epoch": epoch, "loss": float(loss.detach()), "train_acc": _accuracy(logits, graph.y, graph.train_mask),
               "val_acc": _accuracy(logits, graph.y, graph.val_mask),
               "test_acc": _accuracy(logits, graph.y, graph.test_mask), "time_s": times[-1]}
        history.append(rec)
        if rec["val_acc"] > best_val:
            best_val, best = rec["val_acc"], rec
        if on_epoch is not None:
            on_epoch(rec)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{rec['val_acc']:.3f}", test=f"{rec['test_acc']:.3f}")
            bar.update(1)
    if bar is not None:
        bar.close()
    assert best is not None and logits is not None, "training ran no epoch"
    steady = times[1:] or times
    return RunResult(best["test_acc"], best["val_acc"], history[-1]["test_acc"], history[-1]["loss"],
                     statistics.median(steady), logits, history, int(best["epoch"]))
