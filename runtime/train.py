"""The training loop, shared by one process and by every rank of a distributed run.

Adam with L2 weight decay (graph layers may have their own, GCNII), an
evaluation after every step, and model selection on validation: `test_acc`
is the test accuracy at the epoch of best validation accuracy (what PyG's
examples report), `final_test_acc` the last epoch's. Epoch time covers
forward, backward, the gradient all-reduce and the optimizer step, not the
evaluation; the evaluation's forward pass is what the slowest rank's step
and evaluation take beyond the slowest step, and its exchanges' bytes are
counted on their own, so the two add up to the epoch the planner predicts
(gnnc.passes.cost.epoch; the all-reduce of the epoch's counts after them is
in neither). What differs between one process and a rank of many (which rows
it holds, how gradients and counts are summed) sits behind `Worker`.
Checkpoints hold parameters, optimizer state, the history and the run's
fingerprint; dropout masks are keyed by (seed, epoch, op), so a resumed run
follows the same trajectory, and a resume of a different run is refused.

A run with no training vertex is refused before the first epoch, and a loss
that stops being finite ends the run at that epoch with a message
(`TrainingDiverged`, exit 1): every later epoch would be NaN too, and a PyG
user would otherwise find out from a table of NaNs.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from gnnc.errors import GnncError, GraphInputError
from gnnc.host import wait_policy
from gnnc.ir import Program
from gnnc.ir.text import training_problem
from gnnc.plan.precision import DEFAULT_PRECISION, PRECISIONS
from gnnc.runtime import block_cache
from gnnc.runtime import device as devices
from gnnc.runtime import optim
from gnnc.runtime import rng
from gnnc.runtime.kernels import native
from gnnc.runtime.task_metrics import TaskMetrics, task_metrics
from gnnc.graph import GraphView
from gnnc.runtime.executor import (ExecContext, Interpreter, check_graph_fits, drop_edge_order_copies, forward,
                                   graph_inputs, init_params, init_state, loss_op)
from gnnc.graph import Graph
from gnnc.graph.storage import check_class_labels


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
    patience: int | None = None  # stop when validation accuracy has not improved for this many epochs
    checkpoint_dir: str | None = None
    checkpoint_every: int = 10
    resume: bool = False
    device: str = "cpu"  # where the tensors live (gnnc.runtime.device.resolve_device made it 'cpu' or 'cuda')
    precision: str = DEFAULT_PRECISION  # fp32, bf16 or fp16 (gnnc.plan.precision)
    # torch's threads in each process of the run, and why (gnnc.api.thread_settings decides them once);
    # None: torch's own count in one process, one per rank
    threads: int | None = None
    threads_reason: str = ""
    # the optimizer and its learning-rate schedule (make_optimizer, make_schedule); the defaults are Adam at a
    # constant rate, no clipping: what gnnc always ran
    optimizer: str = "adam"  # sgd, adam or adamw
    momentum: float | None = None  # sgd's (torch's default 0); no other optimizer takes one
    schedule: str = "none"  # none, step (StepLR), cosine (CosineAnnealingLR) or plateau (ReduceLROnPlateau)
    warmup: int = 0  # epochs of linear warm-up (LinearLR) before the schedule
    clip: float | None = None  # the largest gradient norm (clip_grad_norm_ of the summed gradients)
    lr_step_size: int = 50  # step: the rate times lr_gamma every lr_step_size epochs
    lr_gamma: float = 0.1
    lr_patience: int = 10  # plateau: the rate times lr_factor after lr_patience epochs without a better val_acc
    lr_factor: float = 0.1
    # evaluate after every K-th epoch (and the first run and the last): on a large graph the evaluation's forward
    # pass over every vertex is half a training step, every epoch
    eval_every: int = 1
    # the evaluation's graph layers in chunks of this many destination rows (gnnc.runtime.layerwise): about two
    # [rows, width] tensors and a chunk instead of a layer's every edge value at once; 0: whole layers; None: as
    # the run decides (gnnc.memory_check.evaluation_chunk: layer-wise when the whole forward would not fit)
    eval_chunk: int | None = None
    recompute: bool = False  # keep graph layers' inputs only and run each again in the backward (gnnc.runtime.recompute)

    def __post_init__(self) -> None:
        """Refuse settings no run can use, naming the flag or the model's `training(...)` field."""
        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        def number(value: Any) -> bool:  # lr 0 is allowed, as torch allows it: a run that only evaluates
            return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value >= 0)

        checks = [("--epochs or training(epochs=...)", self.epochs, whole(self.epochs), "a whole number of at least 1"),
                  ("--lr or training(lr=...)", self.lr, number(self.lr), "a finite number of at least 0"),
                  ("--weight-decay or training(weight_decay=...)", self.weight_decay,
                   number(self.weight_decay), "a finite number of at least 0"),
                  ("training(graph_weight_decay=...)", self.graph_weight_decay,
                   self.graph_weight_decay is None or number(self.graph_weight_decay),
                   "a finite number of at least 0"),
                  ("training(patience=...)", self.patience, self.patience is None or whole(self.patience),
                   "a whole number of at least 1"),
                  ("--checkpoint-every", self.checkpoint_every, whole(self.checkpoint_every),
                   "a whole number of at least 1"),
                  ("--eval-every", self.eval_every, whole(self.eval_every), "a whole number of at least 1"),
                  ("--eval-chunk", self.eval_chunk, self.eval_chunk is None or self.eval_chunk == 0
                   or whole(self.eval_chunk), "a whole number of rows (0: whole layers)"),
                  ("--precision", self.precision, self.precision in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
                  ("--threads", self.threads, self.threads is None or whole(self.threads),
                   "a whole number of at least 1")]
        for where, value, ok, want in checks:
            if not ok:
                raise GnncError(f"{where}: must be {want}, not {value!r}")
        for key, flag in OPTIMIZER_FLAGS.items():
            value = getattr(self, key)
            problem = None if value is None and key in ("momentum", "clip") else training_problem(key, value)
            if problem is not None:
                raise GnncError(f"{flag} or training({key}=...): {problem}")
        if self.momentum is not None and self.optimizer != "sgd":
            raise GnncError(f"--momentum or training(momentum=...): only sgd takes a momentum, not {self.optimizer} "
                            "(give --optimizer sgd, or drop the momentum)")
        if self.warmup >= self.epochs:
            raise GnncError(f"--warmup or training(warmup=...): {self.warmup} epochs of warm-up leave none of the "
                            f"{self.epochs} epochs to train at the full rate: give fewer")

    @staticmethod
    def resolve(program: Program, **flags: Any) -> "TrainConfig":
        merged = dict(program.training)
        merged.update({k: v for k, v in flags.items() if v is not None})
        return TrainConfig(**{k: v for k, v in merged.items() if k in TrainConfig.__dataclass_fields__})


# TrainConfig's optimizer settings, each with the flag that sets it (the language's training(...) names the field)
OPTIMIZER_FLAGS = {"optimizer": "--optimizer", "momentum": "--momentum", "schedule": "--schedule-lr",
                   "warmup": "--warmup", "clip": "--clip-grad", "lr_step_size": "--lr-step-size",
                   "lr_gamma": "--lr-gamma", "lr_patience": "--lr-patience", "lr_factor": "--lr-factor"}


class TrainingDiverged(GnncError):
    """The loss became NaN or infinite; the run stopped at that epoch (not bad input for sure: exit 1)."""

    exit_code = 1


@dataclass
class RunResult:
    """What a training run returns, from one process or from N (`gnnc.run`; `gnnc run --json` prints `to_json()`).

    One type from the rank to the caller: `fit` makes it, the process that trained completes it (the one
    process, or a distributed run's rank 0, whose launcher reads it back as data: gnnc.runtime.launch), and
    gnnc.run returns it with the run's settings.

    `logits` are every vertex's, in global vertex order (None when a
    distributed run was asked not to gather them); `history` has one record
    per epoch; `bytes_sent_per_epoch` is 0 and `world_size` 1 in one process.
    """

    test_acc: float
    val_acc: float
    final_test_acc: float
    train_loss: float
    epoch_time_s: float
    logits: torch.Tensor | None
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    graph: str = ""
    world_size: int = 1
    strategies: list[str] = field(default_factory=list)
    bytes_sent_per_epoch: int = 0
    peak_rss_bytes: int = 0
    predicted_peak_rss_bytes: int | None = None  # the memory check's estimate for the largest process, when made
    activation_peak_bytes: int = 0  # how far a training step raised the resident set, largest over steady epochs
    eval_time_s: float = 0.0  # the evaluation's forward pass after each step, median over steady epochs of what
    # the slowest rank's step and evaluation took beyond the slowest step
    eval_bytes_sent_per_epoch: int = 0  # what the evaluation's exchanges sent (every rank), per epoch
    # which vertices the evaluation (and the logits) covers, and on what neighbourhoods: a sampled run's is its
    # labelled vertices' (gnnc.runtime.minibatch.EVALUATION)
    evaluation: str = "every vertex, full neighbourhood"
    cpu_kernels: str = ""  # gnnc.runtime.kernels.native.status() of the (first) process: compiled, or torch and why
    cpu_allocator: str = ""  # gnnc.runtime.block_cache.status() of the (first) process: block cache, or why not
    threads: int = 0  # torch's threads in the (first) process as it trained, and why that many (TrainConfig)
    threads_reason: str = ""
    wait_policy: str = ""  # the OpenMP wait policy the processes started with (gnnc.host.wait_policy)
    epochs: int = 0  # the run's settings as resolved (TrainConfig), set by gnnc.run
    device: str = ""
    precision: str = ""
    model: str = ""  # the program's name, set by gnnc.run for `gnnc run`'s line (not a field of its --json)
    # the trained weights and the ops' running state by IR name, on the host, after the last epoch (what
    # `gnnc run --save-model` keeps; a pipeline's rank 0 holds only its stage's trained)
    weights: dict[str, torch.Tensor] | None = None
    # a task's own metrics beside (or, where accuracy means nothing, instead of) the accuracies: link
    # prediction's test_auc, test_hits@K, test_mrr (gnnc.runtime.link_task); printed by --json at the top level
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Every field but the logits, the history and the model's name (JSON-ready): what `gnnc run --json`
        prints, with the task's metrics; accuracies a task does not have (NaN) are left out."""
        out = {k: getattr(self, k) for k in SUMMARY_FIELDS
               if not (k in ("test_acc", "val_acc", "final_test_acc") and getattr(self, k) != getattr(self, k))}
        out.update(self.metrics)
        return out

    def headline(self) -> str:
        """The run's figures in words, for `gnnc run`'s line: the test metric at the best validation epoch, the
        last epoch's, the training loss (accuracy's, or the task's metrics where it has no accuracy)."""
        if self.test_acc == self.test_acc:  # not NaN
            return (f"test acc {self.test_acc:.4f} (at best val {self.val_acc:.4f}, epoch {self.best_epoch}); "
                    f"final test acc {self.final_test_acc:.4f}; train loss {self.train_loss:.4f}")
        names = [k[len("final_test_"):] for k in self.metrics if k.startswith("final_test_")]
        if not names:
            return f"train loss {self.train_loss:.4f}"
        at = ", ".join(f"test {n} {self.metrics[f'test_{n}']:.4f}" for n in names)
        return (f"{at} (at best val {names[0]} {self.metrics[f'val_{names[0]}']:.4f}, epoch {self.best_epoch}); "
                "final " + ", ".join(f"test {n} {self.metrics[f'final_test_{n}']:.4f}" for n in names)
                + f"; train loss {self.train_loss:.4f}")


SUMMARY_FIELDS = ("test_acc", "val_acc", "final_test_acc", "train_loss", "epoch_time_s", "best_epoch", "graph",
                  "world_size", "strategies", "bytes_sent_per_epoch", "peak_rss_bytes", "predicted_peak_rss_bytes",
                  "activation_peak_bytes", "eval_time_s", "eval_bytes_sent_per_epoch", "evaluation", "cpu_kernels",
                  "cpu_allocator", "threads", "threads_reason", "wait_policy", "epochs", "device", "precision")


class Worker:
    """One process's part of a run: the rows it holds and how it combines with the others.

    The single-process worker holds every row and combines with nobody; the
    distributed runtime subclasses it.
    """

    rank = 0
    world_size = 1

    def __init__(self, program: Program, graph: Graph, cfg: TrainConfig):
        from gnnc.runtime.comm import CommStats  # deferred: comm loads torch.distributed
        from gnnc.runtime.memory import set_up_allocator  # deferred, as in the distributed worker

        set_up_allocator()

        check_graph_fits(program, graph)
        self.device = devices.rank_device(cfg.device)
        devices.check_precision_on(self.device, cfg.precision)
        self.graph_name = graph.name
        self.num_nodes = graph.num_nodes
        self.stats = CommStats()
        self.program = program
        self.interp = Interpreter(program)
        self.count = max(float(graph.train_mask.sum()), 1.0)
        # Everything the epochs read goes to the device once, here (on CPU this changes nothing).
        move = devices.mover(self.device)
        self.views = {v: devices.place(GraphView.build(graph, v), self.device)
                      for v in sorted({l.edges for l in program.graph_layers()})}
        drop_edge_order_copies(graph)
        self.inputs = {k: move(t) for k, t in graph_inputs(graph).items()}
        self.ids = torch.arange(graph.num_nodes, device=self.device)
        self.cfg = cfg
        # running state of ops (batch_norm's statistics), and the values hoisted out of the loop, once per run
        self.state, self.hoisted = init_state(program, self.device), {}

    def context(self, training: bool, epoch: int) -> ExecContext:
        kb = rng.stream_key(self.cfg.seed, epoch)
        return ExecContext(self.views, self.ids, self.program.config_dict(), training,
                           lambda i, kb=kb: rng.stream_key(kb, i), self.count, self.cfg.use_kernels,
                           state=self.state, hoist_cache=self.hoisted, overwrite_saved=training,
                           recompute=self.cfg.recompute, eval_chunk=None if training else self.cfg.eval_chunk or None)

    def forward(self, params, training: bool, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and loss; at bf16/fp16 the products run in autocast (fp32 master weights)."""
        with devices.autocast(self.device, self.cfg.precision):
            return forward(self.interp, params, self.inputs, self.context(training, epoch))

    def train_epoch(self, params, opt: torch.optim.Optimizer, epoch: int,
                    scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
        """One epoch's training: a full-graph step here (gnnc.runtime.minibatch steps once per minibatch,
        gnnc.runtime.pipeline runs its chunks through the stages). Returns the epoch's training loss (on the
        device: `fit` reads it with the epoch's metrics)."""
        return train_step(self, params, opt, scaler, epoch)

    def run_settings(self) -> dict[str, Any]:
        """What else defines this worker's run, for the resume fingerprint (a sampled run's sampling)."""
        return {}

    def take_records(self) -> list[Any]:
        """Metrics records of this epoch's steps besides the epoch's own (a sampled run's minibatches)."""
        return []

    def owned(self, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The logits and inputs of the rows this worker owns (the ones it reports)."""
        return logits, self.inputs

    def initial_params(self, seed: int) -> dict[str, torch.nn.Parameter]:
        """The parameters this worker trains, as `seed` initialises them (a push-pull rank: its slice of W1)."""
        return init_params(self.program, seed, self.device)

    def reduce_grads(self, params) -> None:
        """Sum parameter gradients over workers (nothing to do alone)."""

    def clip_grads(self, params, max_norm: float) -> None:
        """Clip the (summed) gradients to `max_norm` by their norm over every parameter of the model."""
        torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], max_norm)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def train_vertices(self) -> int:
        """Training vertices in the whole graph (a collective in a distributed run); read before the epochs."""
        return int(self.inputs["train"].sum())

    def graph_tensors(self) -> list[torch.Tensor]:
        """What this worker holds of the graph (structure, features, labels, masks), for the fingerprint."""
        views = [self.views[name].csr for name in sorted(self.views)]
        return [*self.inputs.values(), *(t for csr in views for t in (csr.indptr, csr.indices))]



def make_optimizer(program: Program, params: dict[str, torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    graph_names = {p.value.name for layer in program.graph_layers() for p in layer.params}
    gw = cfg.weight_decay if cfg.graph_weight_decay is None else cfg.graph_weight_decay
    groups = [
        {"params": [p for n, p in params.items() if n in graph_names], "weight_decay": gw},
        {"params": [p for n, p in params.items() if n not in graph_names], "weight_decay": cfg.weight_decay},
    ]
    groups = [g for g in groups if g["params"]]
    # torch.optim's classes without their torch._dynamo import (gnnc.runtime.optim)
    if cfg.optimizer == "sgd":
        return optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum or 0.0)
    if cfg.optimizer == "adamw":  # decoupled weight decay, per group as Adam's L2 (torch's AdamW)
        return optim.AdamW(groups, lr=cfg.lr)
    return optim.Adam(groups, lr=cfg.lr)


class LRSchedule:
    """The learning rate over epochs: `warmup` epochs of linear warm-up (LinearLR from lr/(warmup+1) up to lr:
    epoch k < warmup trains at lr*(k+1)/(warmup+1)), then StepLR, CosineAnnealingLR (to 0 at the last epoch) or
    ReduceLROnPlateau on the validation accuracy (mode max: the rate drops when it stops rising), or a constant
    rate. Stepped once after each epoch's evaluation; its state goes into checkpoints with the optimizer's.

    Warm-up and StepLR/CosineAnnealingLR chain in torch's SequentialLR; ReduceLROnPlateau takes a metric, which
    SequentialLR does not pass, so the warm-up hands over to it here."""

    def __init__(self, opt: torch.optim.Optimizer, cfg: TrainConfig):
        sched = torch.optim.lr_scheduler
        self.warmup, self.steps = cfg.warmup, 0
        self.plateau = None
        main: Any = None
        if cfg.schedule == "step":
            main = sched.StepLR(opt, step_size=cfg.lr_step_size, gamma=cfg.lr_gamma)
        elif cfg.schedule == "cosine":
            main = sched.CosineAnnealingLR(opt, T_max=max(cfg.epochs - cfg.warmup, 1))
        warm = sched.LinearLR(opt, start_factor=1.0 / (cfg.warmup + 1), total_iters=cfg.warmup) \
            if cfg.warmup else None
        if cfg.schedule == "plateau":
            self.plateau = sched.ReduceLROnPlateau(opt, mode="max", factor=cfg.lr_factor, patience=cfg.lr_patience)
        if warm is not None and main is not None:
            main = sched.SequentialLR(opt, [warm, main], milestones=[cfg.warmup])
            warm = None
        self.main, self.warm = main, warm

    def step(self, val_acc: float) -> None:
        self.steps += 1
        if self.main is not None:
            self.main.step()
        elif self.warm is not None and self.steps <= self.warmup:
            self.warm.step()
        elif self.plateau is not None:
            self.plateau.step(val_acc)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, **{k: getattr(self, k).state_dict() for k in ("main", "warm", "plateau")
                                        if getattr(self, k) is not None}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        for k in ("main", "warm", "plateau"):
            if getattr(self, k) is not None:
                getattr(self, k).load_state_dict(state[k])


def optimizer_step(worker: "Worker", params: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler | None = None) -> None:
    """The optimizer step after the gradients' sum over workers, clipped first to `clip` (TrainConfig): the
    summed gradients are every worker's, so each clips by the same global norm, as one process would."""
    clip = worker.cfg.clip
    if clip is not None:
        if scaler is not None:
            scaler.unscale_(opt)  # clip the true gradients; the scaler's step then does not unscale again
        worker.clip_grads(params, clip)
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()


class _Params(torch.nn.Module):
    """Parameters, and the ops' running state as buffers, as a Module for checkpoints (IR names hold dots,
    which Module keys may not)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], state: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.names = list(params)
        for i, p in enumerate(params.values()):
            self.register_parameter(f"p{i}", p)
        for i, t in enumerate((state or {}).values()):
            self.register_buffer(f"s{i}", t)


def train_step(worker: Worker, params: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler | None, epoch: int) -> torch.Tensor:
    """One training step: forward, backward, the gradient sum over workers, the optimizer step; returns the loss.

    Nothing here reads a device tensor on the host (tests/test_device_placement.py checks it), except
    fp16's loss scaler, which must know whether a gradient overflowed before it steps.
    """
    opt.zero_grad(set_to_none=True)
    _, loss = worker.forward(params, True, epoch)
    (loss if scaler is None else scaler.scale(loss)).backward()
    worker.reduce_grads(params)  # scaled gradients sum like unscaled ones, and overflow on every rank alike
    optimizer_step(worker, params, opt, scaler)
    return loss.detach()


def epoch_metrics(worker: Worker, loss: torch.Tensor, logits: torch.Tensor, maxima: list[float],
                  sent: int, eval_sent: int = 0, task: TaskMetrics | None = None
                  ) -> tuple[float, list[float], list[float]]:
    """(this rank's loss, the sums over ranks of [loss, the task's numbers (correct and labelled per split for
    accuracy: gnnc.runtime.task_metrics), the step's bytes, the evaluation's bytes], the largest over ranks of
    each of `maxima` (seconds, activation bytes)): the epoch's one read of device values on the host."""
    own_logits, own = worker.owned(logits)
    dev = loss.device
    task = task or task_metrics("cross_entropy")
    # the step's and the evaluation's bytes, each a scalar: the host's one upload of several values is `maxima`
    local = torch.cat([loss.reshape(1).to(torch.float64), task.local(worker, own_logits, own),
                       torch.tensor([float(sent)], dtype=torch.float64, device=dev),
                       torch.tensor([float(eval_sent)], dtype=torch.float64, device=dev)])
    summed = worker.sum(local)
    largest = worker.max(torch.tensor(maxima, dtype=torch.float64, device=dev))
    host = torch.cat([local[:1], summed, largest]).tolist()
    return host[0], host[1:1 + len(summed)], host[1 + len(summed):]


def run_fingerprint(worker: Worker, cfg: TrainConfig) -> dict[str, Any]:
    """What makes a run this run: its graph, its program and its training settings (checked on resume)."""
    from gnnc.runtime.checkpoint import content_digest  # deferred: checkpoint loads torch.distributed

    return {"graph": worker.graph_name, "graph_nodes": worker.num_nodes,
            "graph_content": content_digest(worker.graph_tensors()),
            "program": hashlib.sha256(str(worker.program).encode()).hexdigest(),
            "strategies": [layer.attr("strategy", "local") for layer in worker.program.graph_layers()],
            "world_size": worker.world_size, "lr": cfg.lr, "weight_decay": cfg.weight_decay,
            "graph_weight_decay": cfg.graph_weight_decay, "seed": cfg.seed, "epochs": cfg.epochs,
            # the optimizer's settings, named only when not the defaults (Adam at a constant rate), so checkpoints
            # written before there were others still resume
            **{k: getattr(cfg, k) for k in OPTIMIZER_FLAGS
               if getattr(cfg, k) != TrainConfig.__dataclass_fields__[k].default},
            # a 16-bit run follows another trajectory (the device does not: a CPU checkpoint resumes on a GPU);
            # named only when not fp32, so checkpoints written before precisions existed still resume
            **({} if cfg.precision == DEFAULT_PRECISION else {"precision": cfg.precision}),
            **worker.run_settings()}


def check_graph_inputs(name: str, stand_ins: dict[str, str]) -> None:
    """Before a run: refuse a graph whose labels were made up, and state on stderr what else was.

    `stand_ins` is `Graph.stand_ins` (or what a plan recorded of it): an
    edge list has no labels, so every vertex has label 0 and a run would
    report perfect accuracy having learned nothing. Made-up features or a
    made-up split still train, but a reader of the results must know.
    """
    if "y" in stand_ins:
        missing = "labels (y) and no features (x)" if "x" in stand_ins else "labels (y)"
        raise GraphInputError(f"graph '{name}' cannot be trained: it has no {missing}, so every vertex stands in "
                              "with label 0 and there is nothing to learn. A graph without labels can be "
                              "partitioned and compiled, not trained: give one with labels (an .npz with "
                              "edge_index, x and y, a PyG Data, a networkx graph with node attributes x and y, an "
                              "OGB directory; see `gnnc datasets`)")
    for field in ("x", "split"):
        if field in stand_ins:
            print(f"note: graph '{name}': {stand_ins[field]}", file=sys.stderr)


def check_trainable(worker: Worker, cfg: TrainConfig) -> None:
    """Refuse, before the first epoch, a run that cannot train (every rank raises alike)."""
    if worker.train_vertices() == 0:
        raise GraphInputError(f"graph '{worker.graph_name}' has no training vertex (its train mask is empty): "
                              "the loss would be 0 and nothing would be learned")


def fit(worker: Worker, cfg: TrainConfig, metrics_path: str | None = None,
        on_epoch: Callable[[dict[str, Any]], None] | None = None,
        ) -> RunResult:
    """Train; returns the run's result, whose logits are the owned rows' after the last epoch (where they were
    computed) and which the caller completes with what only it knows (the graph's name, the strategies, ...).

    With `metrics_path`, every rank's EpochRecord (loss, accuracies, compute /
    communication / all-reduce time, bytes per op, peak RSS) is appended as
    JSON lines by rank 0; a resumed run first drops the records of the epochs
    it is about to run again.
    """
    # deferred: metrics loads torch.distributed
    from gnnc.runtime.metrics import EpochRecord, MetricsLog, peak_memory_since, reset_peak_memory

    check_trainable(worker, cfg)
    task = task_metrics(loss_op(worker.program))  # what each epoch reports, and which epoch is best
    params = worker.initial_params(cfg.seed)
    opt = make_optimizer(worker.program, params, cfg)
    schedule = LRSchedule(opt, cfg)
    scaler = devices.grad_scaler(worker.device, cfg.precision)
    ckpt = None
    lock = None
    start = 0
    history: list[dict[str, Any]] = []
    bar = None
    log = None
    # here, where every kind of process (one, a rank, a stage) starts training; the caller's count is given back
    # after, so that gnnc.run in a program (or a test) leaves torch's threads as it found them
    caller_threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    threads = {"threads": torch.get_num_threads(), "threads_reason": cfg.threads_reason or "torch's default",
               "wait_policy": wait_policy()}
    try:
        if cfg.checkpoint_dir is not None:
            # deferred: checkpoint loads torch.distributed
            from gnnc.runtime.checkpoint import CheckpointError, Checkpointer, resume_or_start

            ckpt = Checkpointer(cfg.checkpoint_dir, every=cfg.checkpoint_every,
                                fingerprint=run_fingerprint(worker, cfg))
            lock = ckpt.lock()  # before anything is read or written there: one job per directory

            def restored(_epoch: int, extra: dict[str, Any]) -> None:
                history.extend(extra.get("history", []))
                if "lr_schedule" in extra:
                    try:
                        schedule.load_state_dict(extra["lr_schedule"])
                    except (KeyError, TypeError, ValueError, AttributeError) as exc:
                        raise CheckpointError(f"the checkpoint in {cfg.checkpoint_dir} holds no usable learning-"
                                              f"rate schedule ({type(exc).__name__}: {exc})") from None

            start = resume_or_start(ckpt, cfg.resume, _Params(params, worker.state), opt, restored)
            if worker.rank == 0:
                for note in ckpt.resume_notes:
                    print(note, file=sys.stderr)
        if cfg.progress and worker.rank == 0:
            from tqdm import tqdm  # deferred: only a run with a progress bar needs it

            bar = tqdm(total=cfg.epochs, initial=start, desc="train", unit="epoch", leave=False)
        logits = torch.zeros(0)
        log = MetricsLog(metrics_path, drop_from_epoch=start if cfg.resume else None)
        for epoch in range(start, cfg.epochs):
            worker.stats.reset()
            base = reset_peak_memory(worker.device)  # the step's activation memory: how far it raises the peak
            t0, cpu0 = time.perf_counter(), time.process_time()
            lr = float(opt.param_groups[0]["lr"])  # the epoch's rate (a host number: the schedule's)
            loss = worker.train_epoch(params, opt, epoch, scaler)
            if worker.device.type == "cuda":
                torch.cuda.synchronize(worker.device)  # the step's kernels are queued, not done: time them done
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            activation = peak_memory_since(worker.device, base)
            # the training step's bytes and times, taken before the evaluation's exchanges add to them
            sent = worker.stats.total_bytes()
            record = EpochRecord.from_stats(epoch, worker.rank, worker.world_size, worker.stats, epoch_s=elapsed,
                                            activation_peak_bytes=activation, step_base_bytes=base or 0,
                                            cpu_s=cpu, extra={k: threads[k] for k in ("threads", "threads_reason")})
            # --eval-every K: between evaluations an epoch's metrics are the last evaluation's (its record says
            # "evaluated": false), so the best epoch, the earliest of equal scores, is always an evaluated one
            evaluated = epoch == start or epoch % cfg.eval_every == 0 or epoch == cfg.epochs - 1
            if evaluated:
                with torch.no_grad():
                    logits, _ = worker.forward(params, False, epoch)
            if worker.device.type == "cuda":
                torch.cuda.synchronize(worker.device)  # as the step: the evaluation's kernels done
            # the slowest rank's step and evaluation: the evaluation is what that holds beyond the slowest step
            # (not the sum of the two maxima, which would count a fast rank's wait for a slow one twice)
            wall = time.perf_counter() - t0
            record.loss, counts, (slowest, most, wall_slowest) = epoch_metrics(
                worker, loss, logits, [elapsed, activation, wall], sent, worker.stats.total_bytes() - sent, task)
            eval_slowest = max(wall_slowest - slowest, 0.0)
            rec = {"epoch": epoch, "loss": float(counts[0]), **task.finish(counts[1:-2]),
                   "time_s": slowest, "bytes_sent": int(counts[-2]), "activation_peak_bytes": int(most),
                   "eval_time_s": eval_slowest, "eval_bytes_sent": int(counts[-1]), "lr": lr, "evaluated": evaluated}
            history.append(rec)
            record.train_acc, record.val_acc, record.test_acc = (rec.get(f"{s}_acc") for s in ("train", "val", "test"))
            # the epoch's rate and the task's metrics other than accuracy (RMSE, ROC-AUC) in the metrics file too, for
            # `gnnc plot --tensorboard`
            record.extra.update(lr=lr, **{k: v for k, v in rec.items()
                                          if k.startswith(("train_", "val_", "test_")) and not k.endswith("_acc")})
            log.log_many([*worker.take_records(), record])  # a sampled run's minibatches, then the epoch
            if not math.isfinite(rec["loss"]):
                # Every rank sees the same summed loss, so all stop here together; no checkpoint of it.
                raise TrainingDiverged(
                    f"training stopped at epoch {epoch}: the loss is {rec['loss']} (check the scale of the "
                    "features, --lr and --weight-decay)")
            if on_epoch is not None:
                on_epoch(rec)
            schedule.step(task.score(rec))  # every rank sees the same metric: every rank's rate is the same
            if ckpt is not None:
                ckpt.maybe_save(epoch, _Params(params, worker.state), opt,
                                {"history": history, "lr_schedule": schedule.state_dict()})
            if bar is not None:
                name = task.names[0]
                bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{rec[f'val_{name}']:.3f}",
                                test=f"{rec[f'test_{name}']:.3f}")
                bar.update(1)
            if cfg.patience is not None:
                best_epoch = max(history, key=lambda r: (task.score(r), -r["epoch"]))["epoch"]
                if epoch - best_epoch >= cfg.patience:
                    break  # every rank sees the same (all-reduced) accuracies, so all stop together
    finally:
        torch.set_num_threads(caller_threads)
        if log is not None:
            log.close()
        if bar is not None:
            bar.close()
        if lock is not None:
            lock.release()
    if not history:
        raise ValueError("training ran no epoch")
    best = max(history, key=lambda r: (task.score(r), -r["epoch"]))
    steady = history[1:] or history
    return RunResult(test_acc=best.get("test_acc", math.nan), val_acc=best.get("val_acc", math.nan),
                     final_test_acc=history[-1].get("test_acc", math.nan), metrics=task.summary(best, history[-1]),
                     train_loss=history[-1]["loss"], epoch_time_s=statistics.median(r["time_s"] for r in steady),
                     logits=logits, history=history, best_epoch=int(best["epoch"]),
                     eval_time_s=statistics.median(r.get("eval_time_s", 0.0) for r in
                                                   [r for r in steady if r.get("evaluated", True)] or steady),
                     eval_bytes_sent_per_epoch=history[-1].get("eval_bytes_sent", 0),
                     bytes_sent_per_epoch=history[-1]["bytes_sent"],
                     # the training step's activation memory, largest over workers and epochs after the first
                     activation_peak_bytes=max(r.get("activation_peak_bytes", 0) for r in (history[1:] or history)),
                     cpu_kernels=native.status(), cpu_allocator=block_cache.status(), **threads,
                     weights=host_weights({**params, **worker.state}))


def host_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trained weights and op state on the host, once after the last epoch (a read of the device each)."""
    out = {}
    for name, t in tensors.items():  # a loop, not a comprehension: the device's reads are named after this function
        out[name] = t.detach().cpu()
    return out


def train(program: Program, graph: Graph, cfg: TrainConfig, metrics_path: str | None = None,
          on_epoch: Callable[[dict[str, Any]], None] | None = None, worker: Worker | None = None) -> RunResult:
    """Train `program` on `graph` in this process (`worker`: another kind of one-process Worker, such as
    gnnc.runtime.minibatch's sampled minibatches; by default full-graph steps); the logits come back on the host."""
    from gnnc.runtime.metrics import peak_rss_bytes  # deferred: metrics loads torch.distributed

    check_graph_inputs(graph.name, graph.stand_ins)
    check_class_labels(graph.y, graph.name, loss_op(program))
    result = fit(worker or Worker(program, graph, cfg), cfg, metrics_path, on_epoch)
    result.logits, result.graph, result.peak_rss_bytes = result.logits.cpu(), graph.name, peak_rss_bytes()
    result.strategies = [layer.attr("strategy", "local") for layer in program.graph_layers()]
    return result
