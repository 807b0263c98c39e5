"""What a run reports and selects its best epoch on, by the op of the model's loss.

cross_entropy reports accuracy; mse (node regression) RMSE and MAE; bce (multi-label binary targets,
ogbn-proteins') the mean ROC-AUC over the targets, as OGB's evaluator computes it. Each task's metrics come
from the rows a worker owns: `local` gives the numbers that add up over workers (the training loop sums them
with the epoch's loss and bytes, one all-reduce), `finish` the metrics of the summed numbers. ROC-AUC does not
add up, so in a distributed run bce's `local` first gathers every owned row's outputs, targets and masks to
every rank (a sum of rows placed at each rank's offset), so every rank computes the same figures as one
process does. The first metric of `names` selects the best epoch (`higher_is_better` says which way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from gnnc.runtime.executor import float_targets

SPLITS = ("train", "val", "test")


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The area under the ROC curve of 1-D `scores` for 0/1 `labels`, ties counted half (sklearn's
    roc_auc_score): the Mann-Whitney statistic from the scores' average ranks, in float64."""
    scores, labels = scores.double(), labels.double()
    order = torch.argsort(scores)
    s = scores[order]
    _, counts = torch.unique_consecutive(s, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    avg = ends - (counts.double() - 1) / 2  # the average 1-based rank of each run of tied scores
    ranks = torch.empty_like(s)
    ranks[order] = torch.repeat_interleave(avg, counts)
    n_pos = float(labels.sum())
    n_neg = float(labels.numel()) - n_pos
    return (float((ranks * labels).sum()) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _column_aucs(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """roc_auc of every column at once ([n, T] scores, 0/1 labels, no NaN), ties counted half: each column's
    average ranks from one sort, a tie's rows sharing the mean of its first and last position."""
    scores, labels = scores.double(), labels.double()
    n, t = scores.shape
    s, order = torch.sort(scores, 0)
    new = torch.ones_like(s, dtype=torch.bool)
    new[1:] = s[1:] != s[:-1]
    group = (torch.cumsum(new.long(), 0) - 1) + torch.arange(t) * n  # a tie's id, unique over the columns
    pos = torch.arange(1, n + 1, dtype=torch.float64).unsqueeze(1).expand(n, t).reshape(-1)
    flat = group.reshape(-1)
    first = torch.full((n * t,), math.inf, dtype=torch.float64).scatter_reduce(0, flat, pos, "amin")
    last = torch.zeros(n * t, dtype=torch.float64).scatter_reduce(0, flat, pos, "amax")
    ranks = torch.empty_like(s).scatter_(0, order, ((first[flat] + last[flat]) / 2).reshape(n, t))
    n_pos = labels.sum(0)
    n_neg = n - n_pos
    return ((ranks * labels).sum(0) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def mean_roc_auc(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """OGB's rocauc (ogb.nodeproppred.Evaluator for ogbn-proteins): per target column, over its known (non-NaN)
    rows, skipping a column without both a positive and a negative; the mean over the rest (NaN if none).
    Columns without an unknown target are computed together (one sort), the others one by one."""
    unknown = torch.isnan(targets)
    rated = ((targets == 1).any(0) & (targets == 0).any(0))
    whole = rated & ~unknown.any(0)
    aucs = _column_aucs(scores[:, whole], targets[:, whole]).tolist() if bool(whole.any()) else []
    for t in torch.nonzero(rated & ~whole).flatten().tolist():
        known = ~unknown[:, t]
        aucs.append(roc_auc(scores[known, t], targets[known, t]))
    return sum(aucs) / len(aucs) if aucs else math.nan


def _accuracy_local(worker: Any, logits: torch.Tensor, own: dict[str, torch.Tensor], cache: dict[str, Any]
                    ) -> torch.Tensor:
    """[correct, labelled] for train, val and test, float64 on the logits' device (no host read)."""
    hit = logits.argmax(-1) == own["y"]
    return torch.stack([t for split in SPLITS
                        for t in ((hit & own[split]).sum(), own[split].sum())]).to(torch.float64)


def _accuracy_finish(sums: list[float], cache: dict[str, Any]) -> dict[str, float]:
    return {f"{split}_acc": sums[2 * k] / max(sums[2 * k + 1], 1) for k, split in enumerate(SPLITS)}


def _errors_local(worker: Any, out: torch.Tensor, own: dict[str, torch.Tensor], cache: dict[str, Any]
                  ) -> torch.Tensor:
    """[squared errors, absolute errors, known targets] for train, val and test (float64, no host read)."""
    y = float_targets(own["y"])
    parts = []
    for split in SPLITS:
        known = own[split].unsqueeze(1) & ~torch.isnan(y)
        err = torch.where(known, out.double() - torch.where(known, y, 0.0).double(), 0.0)
        parts += [(err * err).sum(), err.abs().sum(), known.sum().double()]
    return torch.stack(parts).to(torch.float64)


def _errors_finish(sums: list[float], cache: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, split in enumerate(SPLITS):
        n = max(sums[3 * k + 2], 1)
        out[f"{split}_rmse"] = math.sqrt(sums[3 * k] / n)
        out[f"{split}_mae"] = sums[3 * k + 1] / n
    return out


def _gather_rows(worker: Any, rows: torch.Tensor) -> torch.Tensor:
    """Every worker's `rows` ([n_r, W] float64), stacked in rank order on every worker: each places its rows at
    its offset in a zero matrix of all of them, and a sum over workers joins them (one process: `rows`)."""
    if worker.world_size == 1:
        return rows
    counts = torch.zeros(worker.world_size, dtype=torch.float64, device=rows.device)
    counts[worker.rank] = rows.shape[0]
    counts = worker.sum(counts).to(torch.int64).tolist()
    start = sum(counts[: worker.rank])
    full = rows.new_zeros((sum(counts), rows.shape[1]))
    full[start: start + rows.shape[0]] = rows
    return worker.sum(full)


def _rocauc_local(worker: Any, out: torch.Tensor, own: dict[str, torch.Tensor], cache: dict[str, Any]
                  ) -> torch.Tensor:
    """Nothing to add up: gathers every row's outputs (and, at the first epoch, targets and masks) into `cache`."""
    if "targets" not in cache:
        y = float_targets(own["y"]).double()
        masks = torch.stack([own[split] for split in SPLITS], 1).double()
        both = _gather_rows(worker, torch.cat([y, masks], 1)).cpu()
        cache["targets"], cache["masks"] = both[:, : y.shape[1]], both[:, y.shape[1]:].bool()
    cache["scores"] = _gather_rows(worker, out.detach().double()).cpu()
    return out.new_zeros(0, dtype=torch.float64)


def _rocauc_finish(sums: list[float], cache: dict[str, Any]) -> dict[str, float]:
    scores, targets, masks = cache["scores"], cache["targets"], cache["masks"]
    return {f"{split}_rocauc": mean_roc_auc(scores[masks[:, k]], targets[masks[:, k]])
            for k, split in enumerate(SPLITS)}


@dataclass
class TaskMetrics:
    """The metrics of the runs whose loss is `loss`: their names (`<split>_<name>` in each epoch's record;
    the first selects the best epoch), how to compute them, and a cache a run's epochs share."""

    loss: str
    names: tuple[str, ...]
    higher_is_better: bool
    _local: Callable[[Any, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]], torch.Tensor]
    _finish: Callable[[list[float], dict[str, Any]], dict[str, float]]
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def selects(self) -> str:
        """The record's key the best epoch is chosen on."""
        return f"val_{self.names[0]}"

    def local(self, worker: Any, out: torch.Tensor, own: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._local(worker, out, own, self.cache)

    def finish(self, sums: list[float]) -> dict[str, float]:
        return self._finish(sums, self.cache)

    def summary(self, best: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
        """A run's figures besides accuracy's own fields (RunResult.test_acc, ...): every split's metrics at the
        best epoch, `final_test_<name>` at the last (`gnnc run --json` reports them: test_rmse, test_rocauc)."""
        if self.names == ("acc",):
            return {}
        out = {f"{split}_{name}": best[f"{split}_{name}"] for name in self.names for split in SPLITS}
        out.update({f"final_test_{name}": last[f"test_{name}"] for name in self.names})
        return out

    def score(self, rec: dict[str, Any]) -> float:
        """The record's selection metric, larger is better (a NaN, no target to rate, is the worst)."""
        value = rec.get(self.selects, math.nan)
        if value != value:
            return -math.inf
        return value if self.higher_is_better else -value


def task_metrics(loss: str) -> TaskMetrics:
    """A fresh TaskMetrics (its own cache) for a run whose loss op is `loss`."""
    if loss == "mse":
        return TaskMetrics(loss, ("rmse", "mae"), False, _errors_local, _errors_finish)
    if loss == "bce":
        return TaskMetrics(loss, ("rocauc",), True, _rocauc_local, _rocauc_finish)
    return TaskMetrics(loss, ("acc",), True, _accuracy_local, _accuracy_finish)
