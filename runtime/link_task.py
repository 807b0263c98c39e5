"""Link prediction: train an encoder and a pair scorer on an edge split, report AUC and ranks.

A link-prediction program (gnnc.ir.ops.is_link_prediction) reads pairs at the model level (`src.z`,
`dst.z`) and defines `loss = bce(score, label)`. Its run:

- splits the graph's edges once per seed (gnnc.graph.edge_split: PyG's RandomLinkSplit semantics, the
  program's `training(val_edges, test_edges, neg_ratio)`); the encoder passes messages over the training
  edges only;
- trains every epoch on the training edges (label 1) and `neg_ratio` times as many negative pairs (label 0)
  drawn anew, uniformly, on the model's device from a generator seeded by (seed, epoch), rejecting pairs that
  are message-passing edges (three rounds of redrawing, without a read of the device on the host);
- evaluates after every step on the fixed validation and test pairs: ROC AUC (ties counted half, as
  sklearn's roc_auc_score), Hits@K and MRR as OGB's link-prediction evaluator defines them against the
  split's negatives (Hits@K: the share of positives scored above the K-th best negative; MRR: the mean of
  1 / rank of each positive among all negatives, the rank the mean of the optimistic and pessimistic one);
- selects the epoch of best validation AUC (`patience` stops on it), as PyG's link-prediction examples do.

On several ranks (`gnnc run --nproc N`), gnnc.runtime.pair_exchange runs the same loop (`fit_link`) with the
encoder distributed and each pair scored on the rank owning its source.

The metrics go into `RunResult.metrics` (`test_auc`, `val_auc`, `test_hits@K`, `test_mrr`, ...), which
`gnnc run --json` prints with the rest.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from gnnc.errors import GnncError
from gnnc.graph import Graph, GraphView
from gnnc.graph.edge_split import DEFAULT_NEG_RATIO, DEFAULT_TEST, DEFAULT_VAL, EdgeSplit, message_graph, split_edges
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.runtime import device as devices
from gnnc.runtime import rng
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs, init_params, init_state
from gnnc.runtime.task_metrics import roc_auc
from gnnc.runtime.train import LRSchedule, RunResult, TrainConfig, TrainingDiverged, host_weights, make_optimizer

DEFAULT_HITS_K = 20
_NEGATIVES_STREAM = 0x4C494E4B  # the training negatives' random stream ("LINK"), beside dropout's
_REDRAWS = 3  # rounds of redrawing a negative that hit a message-passing edge


@dataclass(frozen=True)
class LinkSettings:
    """The program's link-prediction settings (`training(...)`), with PyG's defaults."""

    val_edges: float = DEFAULT_VAL
    test_edges: float = DEFAULT_TEST
    neg_ratio: float = DEFAULT_NEG_RATIO
    hits_k: int = DEFAULT_HITS_K

    @staticmethod
    def of(program: Program) -> "LinkSettings":
        given = dict(program.training)
        return LinkSettings(**{k: given[k] for k in LinkSettings.__dataclass_fields__ if k in given})


def split_for(program: Program, graph: Graph, seed: int) -> EdgeSplit:
    """The run's edge split: a function of the graph, the program's settings and the seed."""
    s = LinkSettings.of(program)
    return split_edges(graph.src, graph.dst, graph.num_nodes, s.val_edges, s.test_edges, s.neg_ratio, seed)


# ----- metrics -----------------------------------------------------------------------------------------------

def pair_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """The ROC AUC of positives against negatives (ties count half: sklearn's roc_auc_score)."""
    return roc_auc(torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))


def hits_at_k(pos: torch.Tensor, neg: torch.Tensor, k: int) -> torch.Tensor:
    """OGB's Hits@K: the share of positives scored above the K-th highest negative (1 with fewer than K)."""
    if neg.shape[0] < k:
        return torch.ones((), dtype=torch.float64, device=pos.device)
    kth = torch.topk(neg, k).values[-1]
    return (pos > kth).double().mean()


def mrr(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """OGB's MRR against every negative: rank = 1 + mean of the optimistic and pessimistic count of negatives
    above the positive."""
    order = torch.sort(neg.double()).values
    p = pos.double()
    above = neg.shape[0] - torch.searchsorted(order, p, right=True)  # negatives > positive
    at_least = neg.shape[0] - torch.searchsorted(order, p, right=False)  # negatives >= positive
    return (1.0 / (0.5 * (above + at_least).double() + 1.0)).mean()


def pair_metrics(pos: torch.Tensor, neg: torch.Tensor, k: int) -> list[float]:
    """[auc, hits@k, mrr] of one split's scores (NaN without pairs: a split without validation edges)."""
    if not pos.numel() or not neg.numel():
        return [float("nan")] * 3
    return [pair_auc(pos, neg), float(hits_at_k(pos, neg, k)), float(mrr(pos, neg))]


def draw_negatives(seed: int, epoch: int, n: int, k: int, message_keys: torch.Tensor) -> torch.Tensor:
    """An epoch's `k` training negatives [2, k]: uniform pairs u != v of `n` vertices, redrawn where they are
    message-passing edges (`message_keys`, sorted u * n + v), on message_keys' device from a generator seeded by
    (seed, epoch): every rank of a distributed run draws the same ones."""
    device = message_keys.device
    gen = torch.Generator(device=device)
    gen.manual_seed(rng.stream_key(seed, epoch, _NEGATIVES_STREAM))

    def draw() -> torch.Tensor:
        u = torch.randint(0, n, (k,), generator=gen, device=device)
        v = torch.randint(0, n - 1, (k,), generator=gen, device=device)
        return u * n + v + (v >= u)

    keys = draw()
    for _ in range(_REDRAWS):
        pos = torch.searchsorted(message_keys, keys).clamp(max=max(message_keys.shape[0] - 1, 0))
        hit = message_keys[pos] == keys if message_keys.numel() else torch.zeros_like(keys, dtype=torch.bool)
        keys = torch.where(hit, draw(), keys)
    return torch.stack([keys // n, keys % n])


# ----- the run ---------------------------------------------------------------------------------------------

class LinkWorker:
    """One process's link-prediction run: the message-passing graph on the device, the split's pairs."""

    def __init__(self, program: Program, graph: Graph, cfg: TrainConfig):
        self.program, self.cfg = program, cfg
        self.settings = LinkSettings.of(program)
        self.split = split_for(program, graph, cfg.seed)
        mp = message_graph(graph, self.split)
        self.device = devices.rank_device(cfg.device)
        devices.check_precision_on(self.device, cfg.precision)
        cfg_dims = program.config_dict()
        feats = eval_dim(program.inputs[0].type.shape[0], cfg_dims)
        if feats != graph.num_features:
            raise GnncError(f"the model expects {feats} input features but graph '{graph.name}' has "
                            f"{graph.num_features}")
        move = devices.mover(self.device)
        self.interp = Interpreter(program)
        self.views = {v: devices.place(GraphView.build(mp, v), self.device)
                      for v in sorted({layer.edges for layer in program.graph_layers()})}
        self.inputs = {k: move(t) for k, t in graph_inputs(mp).items()}
        self.ids = torch.arange(graph.num_nodes, device=self.device)
        self.state, self.hoisted = init_state(program, self.device), {}
        as_t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=self.device)  # noqa: E731
        self.train_pos = as_t(self.split.train_pos)
        self.message_keys = as_t(self.split.message_keys)
        # the evaluation's pairs, in one forward pass: val positives, val negatives, test positives, test negatives
        parts = [self.split.val_pos, self.split.val_neg, self.split.test_pos, self.split.test_neg]
        self.eval_sizes = [p.shape[1] for p in parts]
        self.eval_pairs = as_t(torch.cat([torch.as_tensor(p) for p in parts], 1))
        self.eval_labels = torch.cat([torch.full((n,), float(k % 2 == 0)) for k, n in enumerate(self.eval_sizes)]
                                     ).to(self.device)
        self.num_nodes = graph.num_nodes

    def negatives(self, epoch: int) -> torch.Tensor:
        """The epoch's training negatives [2, k] (`draw_negatives`)."""
        return draw_negatives(self.cfg.seed, epoch, self.num_nodes, self.split.train_negatives(), self.message_keys)

    def initial_params(self, seed: int) -> dict[str, torch.nn.Parameter]:
        return init_params(self.program, seed, self.device)

    def bytes_sent(self) -> tuple[int, int]:
        return 0, 0  # one process sends nothing

    def context(self, training: bool, epoch: int, pairs: torch.Tensor) -> ExecContext:
        kb = rng.stream_key(self.cfg.seed, epoch)
        return ExecContext(self.views, self.ids, self.program.config_dict(), training,
                           lambda i, kb=kb: rng.stream_key(kb, i), 1.0, self.cfg.use_kernels,
                           state=self.state, hoist_cache=self.hoisted, pairs=(pairs[0], pairs[1]))

    def forward(self, params: dict[str, torch.Tensor], training: bool, epoch: int, pairs: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, loss) of `pairs` with `labels`."""
        with devices.autocast(self.device, self.cfg.precision):
            return forward(self.interp, params, {**self.inputs, "label": labels},
                           self.context(training, epoch, pairs))

    def train_step(self, params: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer, epoch: int) -> torch.Tensor:
        neg = self.negatives(epoch)
        pairs = torch.cat([self.train_pos, neg], 1)
        labels = torch.cat([torch.ones(self.train_pos.shape[1], device=self.device),
                            torch.zeros(neg.shape[1], device=self.device)])
        opt.zero_grad(set_to_none=True)
        _, loss = self.forward(params, True, epoch, pairs, labels)
        loss.backward()
        if self.cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], self.cfg.clip)
        opt.step()
        return loss.detach()

    def evaluate(self, params: dict[str, torch.Tensor], epoch: int) -> list[float]:
        """[val auc, hits, mrr, test auc, hits, mrr]."""
        with torch.no_grad():
            scores, _ = self.forward(params, False, epoch, self.eval_pairs, self.eval_labels)
        vp, vn, tp, tn = torch.split(scores.detach().float().reshape(-1).cpu(), self.eval_sizes)  # one host read
        k = self.settings.hits_k
        return pair_metrics(vp, vn, k) + pair_metrics(tp, tn, k)


class LinkRun(Protocol):
    """What `fit_link` trains: one process's LinkWorker, or a rank's (gnnc.runtime.pair_exchange.DistLinkWorker,
    whose step returns the loss summed over ranks and whose metrics are the same on every rank)."""

    program: Program
    device: torch.device
    settings: LinkSettings
    state: dict[str, torch.Tensor]

    def initial_params(self, seed: int) -> dict[str, torch.nn.Parameter]: ...

    def train_step(self, params: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                   epoch: int) -> torch.Tensor: ...

    def evaluate(self, params: dict[str, torch.Tensor], epoch: int) -> list[float]: ...

    def bytes_sent(self) -> tuple[int, int]:
        """What the last training step and evaluation sent to other ranks (every rank's, summed)."""
        ...


def fit_link(worker: LinkRun, cfg: TrainConfig,
             on_epoch: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Train and evaluate every epoch; the result's metrics are those of the epoch of best validation AUC."""
    if cfg.checkpoint_dir is not None:
        raise GnncError("--checkpoint-dir: link-prediction runs do not checkpoint yet")
    if cfg.precision == "fp16":
        raise GnncError("--precision fp16: link-prediction runs take fp32 or bf16 (no loss scaling yet)")
    # node classification's run options this loop does not implement: refused rather than ignored
    for flag, given in (("--recompute", cfg.recompute), ("--eval-every", cfg.eval_every != 1)):
        if given:
            raise GnncError(f"{flag}: link-prediction runs do not take it yet (they evaluate after every epoch)")
    params = worker.initial_params(cfg.seed)
    opt = make_optimizer(worker.program, params, cfg)
    schedule = LRSchedule(opt, cfg)
    k = worker.settings.hits_k
    history: list[dict[str, Any]] = []
    caller_threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            lr = float(opt.param_groups[0]["lr"])
            loss = worker.train_step(params, opt, epoch)
            if worker.device.type == "cuda":
                torch.cuda.synchronize(worker.device)
            elapsed = time.perf_counter() - t0
            m = [float(loss), *worker.evaluate(params, epoch)]
            rec = {"epoch": epoch, "loss": m[0], "val_auc": m[1], f"val_hits@{k}": m[2], "val_mrr": m[3],
                   "test_auc": m[4], f"test_hits@{k}": m[5], "test_mrr": m[6], "time_s": elapsed, "lr": lr}
            rec["bytes_sent"], rec["eval_bytes_sent"] = worker.bytes_sent()
            history.append(rec)
            if m[0] != m[0] or abs(m[0]) == float("inf"):
                raise TrainingDiverged(f"training stopped at epoch {epoch}: the loss is {m[0]} (check the scale "
                                       "of the features, --lr and --weight-decay)")
            if on_epoch is not None:
                on_epoch(rec)
            schedule.step(rec["val_auc"])
            if cfg.patience is not None:
                best_epoch = _best(history)["epoch"]
                if epoch - best_epoch >= cfg.patience:
                    break
    finally:
        torch.set_num_threads(caller_threads)
    best = _best(history)
    steady = history[1:] or history
    metrics = {key: best[key] for key in ("test_auc", f"test_hits@{k}", "test_mrr", "val_auc", f"val_hits@{k}",
                                          "val_mrr")}
    metrics["final_test_auc"] = history[-1]["test_auc"]
    return RunResult(test_acc=float("nan"), val_acc=float("nan"), final_test_acc=float("nan"),
                     train_loss=history[-1]["loss"], epoch_time_s=statistics.median(r["time_s"] for r in steady),
                     logits=None, history=history, best_epoch=int(best["epoch"]), metrics=metrics,
                     weights=host_weights({**params, **worker.state}), bytes_sent_per_epoch=history[-1]["bytes_sent"],
                     eval_bytes_sent_per_epoch=history[-1]["eval_bytes_sent"])


def _best(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The epoch of best validation AUC (the first of equals); a split without validation edges: the last."""
    if all(r["val_auc"] != r["val_auc"] for r in history):
        return history[-1]
    return max(history, key=lambda r: (r["val_auc"] if r["val_auc"] == r["val_auc"] else -1.0, -r["epoch"]))


def train_link(program: Program, graph: Graph, cfg: TrainConfig,
               on_epoch: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Train a link-prediction program on `graph` in this process."""
    from gnnc.runtime.metrics import peak_rss_bytes  # deferred: metrics loads torch.distributed

    result = fit_link(LinkWorker(program, graph, cfg), cfg, on_epoch)
    result.graph, result.peak_rss_bytes = graph.name, peak_rss_bytes()
    result.strategies = [layer.attr("strategy", "local") for layer in program.graph_layers()]
    return result
