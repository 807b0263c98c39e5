"""`gnnc plot RUN.jsonl [-o curves.png]`: the training curves of a `gnnc run --metrics RUN.jsonl`, as a PNG.

The file holds one EpochRecord per epoch and rank (gnnc.runtime.metrics): the rank's share of the loss (the
shares add up to the epoch's loss), the accuracies (the same on every rank: they are all-reduced) and where
the rank's step time went (compute, communication, pipeline waits, the gradient all-reduce). A sampled run
adds one record per minibatch, which the curves leave out. The figure shows the loss and the train,
validation and test accuracies per epoch, with the epoch of best validation accuracy marked (the epoch whose
test accuracy `gnnc run` reports), and for a run on several processes each rank's mean step split into those
parts, over the epochs after the first (the first one builds caches).

`--tensorboard DIR` writes the same run as TensorBoard scalars instead (or as well, with `-o`): per epoch the
loss, the accuracies or the task's metrics (RMSE and MAE, ROC-AUC), the learning rate and the epoch's time (the
slowest rank's step), with torch.utils.tensorboard's SummaryWriter, in one new event file. It converts the
metrics file rather than hooking `gnnc run`: the file is what every kind of run writes already (one process, the
ranks of a distributed or sampled run, a resumed run), rank 0 alone, so TensorBoard is never imported by a
training process, and a run already done, or still running, can be looked at without training again.

Only this module's `run` loads matplotlib (the `plot` extra), or torch and tensorboard (the `tensorboard`
extra) for `--tensorboard`: plotting a file takes a fraction of a second. A file that is missing, not JSON lines, or not gnnc metrics is refused naming
the file and its line (exit 2); a last line a crash tore (no newline at its end) is passed over, as
gnnc.runtime.metrics.read_metrics does.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnnc.errors import GnncError, write_failure
from gnnc.files import atomic_write

# the parts of a rank's step, as (label, EpochRecord fields whose difference it is), drawn bottom up
TIME_PARTS = (("compute", ("compute_s",), ()), ("communication", ("comm_s",), ("pipe_s",)),
              ("pipeline wait", ("pipe_s",), ()), ("gradient all-reduce", ("allreduce_s",), ()))
ACCURACIES = (("train_acc", "train"), ("val_acc", "validation"), ("test_acc", "test"))
SPLITS = ("train", "val", "test")
TENSORBOARD_MISSING = ("gnnc plot --tensorboard needs the tensorboard package: pip install tensorboard "
                       "(or pip install 'gnnc[tensorboard]')")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `plot` on the CLI's subparsers."""
    c = subparsers.add_parser("plot", help="draw the training curves of a --metrics file (PNG)",
                              description="Draw the loss and accuracies per epoch of `gnnc run --metrics "
                                          "RUN.jsonl`, and each rank's time split for a run on several "
                                          "processes. Needs matplotlib (pip install 'gnnc[plot]').")
    c.add_argument("metrics", metavar="RUN.jsonl", help="the file `gnnc run --metrics` wrote")
    c.add_argument("-o", "--output", metavar="PNG", help="where to write the figure (default: RUN.png beside it, "
                                                         "unless --tensorboard is given)")
    c.add_argument("--tensorboard", metavar="DIR",
                   help="write the curves as TensorBoard scalars (loss, accuracies or the task's metrics, lr, epoch "
                        "time) to an event file in DIR instead of the PNG; needs tensorboard (pip install tensorboard)")
    c.add_argument("--json", action="store_true", help="end stdout with one JSON summary line")
    c.set_defaults(fn=run)
    return c


@dataclass
class Curves:
    """A run's per-epoch curves and per-rank time split, read from its metrics records."""

    epochs: list[int]
    loss: list[float]
    accuracy: dict[str, list[float]]  # "train" / "validation" / "test" -> per epoch
    world_size: int
    split: dict[str, list[float]]  # TIME_PARTS' label -> per rank, mean seconds per step; empty for one process

    @property
    def best(self) -> int:
        """The index of the epoch of best validation accuracy (the first one, as gnnc run reports)."""
        val = self.accuracy["validation"]
        return max(range(len(val)), key=lambda k: (_finite(val[k]), -k))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The epoch records of a metrics file, each line checked; GnncError naming `path:line` for a bad one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GnncError(f"{path}: no such file (write one with `gnnc run ... --metrics {path}`)") from None
    except IsADirectoryError:
        raise GnncError(f"{path}: is a directory, not a metrics file") from None
    except OSError as err:
        raise GnncError(f"{path}: cannot read it ({err.strerror})") from None
    lines = data.split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError) as err:
            if number == len(lines):
                continue  # no newline after it: torn by a crash inside its write
            raise GnncError(f"{path}:{number}: not a JSON line ({err})") from None
        if not isinstance(rec, dict):
            raise GnncError(f"{path}:{number}: not a gnnc metrics record (a JSON {type(rec).__name__})")
        if rec.get("kind") == "minibatch":
            continue
        for key in ("epoch", "rank", "world_size"):
            if not isinstance(rec.get(key), int) or isinstance(rec.get(key), bool):
                raise GnncError(f"{path}:{number}: not a gnnc metrics record (no whole number '{key}'; "
                                "`gnnc run --metrics FILE` writes them)")
        for key in ("loss", "train_acc", "val_acc", "test_acc", *(f for _, add, sub in TIME_PARTS for f in add + sub)):
            value = rec.get(key)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise GnncError(f"{path}:{number}: '{key}' is {value!r}, not a number")
        records.append(rec)
    if not records:
        raise GnncError(f"{path}: holds no epoch record (is it the file of `gnnc run --metrics`?)")
    return records


def curves(records: list[dict[str, Any]]) -> Curves:
    """Per epoch: the loss (the ranks' shares added), rank 0's accuracies; per rank: the mean step split over the
    epochs after the first."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        by_epoch.setdefault(rec["epoch"], []).append(rec)
    epochs = sorted(by_epoch)
    first = [min(by_epoch[e], key=lambda r: r["rank"]) for e in epochs]
    loss = [math.fsum(r["loss"] for r in by_epoch[e] if r.get("loss") is not None) for e in epochs]
    accuracy = {label: [_number(r.get(key)) for r in first] for key, label in ACCURACIES}
    world = max(r["world_size"] for r in records)
    split: dict[str, list[float]] = {}
    if world > 1:
        steady = [r for r in records if r["epoch"] != epochs[0]] if len(epochs) > 1 else records
        ranks = range(world)
        for label, add, sub in TIME_PARTS:
            split[label] = [statistics.fmean([max(sum(r.get(f) or 0.0 for f in add) - sum(r.get(f) or 0.0 for f in sub),
                                                  0.0) for r in steady if r["rank"] == k] or [0.0]) for k in ranks]
        split = {label: v for label, v in split.items() if any(v)}
    return Curves(epochs, loss, accuracy, world, split)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


def draw(c: Curves, title: str) -> bytes:
    """The figure as PNG bytes (matplotlib's Agg canvas: no display and no pyplot state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: the optional `plot` extra
        from matplotlib.figure import Figure
    except ImportError:
        raise GnncError("gnnc plot needs matplotlib: pip install 'gnnc[plot]'") from None
    panels = 3 if c.split else 2
    fig = Figure(figsize=(5.2 * panels, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_acc, *rest = fig.subplots(1, panels)
    best = c.best
    ax_loss.plot(c.epochs, c.loss, color="tab:red")
    ax_loss.set(title="training loss", xlabel="epoch", ylabel="cross-entropy")
    for label, values in c.accuracy.items():
        ax_acc.plot(c.epochs, values, label=label)
    test = c.accuracy["test"][best]
    for ax in (ax_loss, ax_acc):
        ax.axvline(c.epochs[best], color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    ax_acc.plot([c.epochs[best]], [test], "o", color="tab:green",
                label=f"best validation: epoch {c.epochs[best]}, test {test:.3f}")
    ax_acc.set(title="accuracy", xlabel="epoch", ylabel="accuracy", ylim=(0, 1))
    ax_acc.legend(loc="lower right")
    if rest:
        ax = rest[0]
        bottom = [0.0] * c.world_size
        for label, seconds in c.split.items():
            ms = [s * 1e3 for s in seconds]
            ax.bar(range(c.world_size), ms, bottom=bottom, label=label)
            bottom = [b + m for b, m in zip(bottom, ms)]
        ax.set(title="step time per rank (mean after epoch 0)", xlabel="rank", ylabel="ms",
               xticks=range(c.world_size))
        ax.legend(loc="lower right")
    fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def scalars(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's scalars by tag, each a list of (epoch, value): the loss (the ranks' shares added), rank 0's
    accuracies or other metrics (`<split>_<name>`: the same on every rank), its learning rate and the slowest
    rank's step time. A metric a record holds no number for (null) leaves that epoch out of its tag."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        by_epoch.setdefault(rec["epoch"], []).append(rec)
    out: dict[str, list[tuple[int, float]]] = {}
    for epoch in sorted(by_epoch):
        recs = by_epoch[epoch]
        first = min(recs, key=lambda r: r["rank"])
        values = {"loss": math.fsum(r["loss"] for r in recs if r.get("loss") is not None),
                  "time/epoch_s": max(float(r.get("epoch_s") or 0.0) for r in recs)}
        extra = first.get("extra") if isinstance(first.get("extra"), dict) else {}
        for key, value in [*first.items(), *extra.items()]:
            split, _, name = key.partition("_")
            if split in SPLITS and name and _is_number(value):
                values[f"{name}/{split}"] = float(value)
        if _is_number(extra.get("lr")):
            values["lr"] = float(extra["lr"])
        for tag, value in values.items():
            out.setdefault(tag, []).append((epoch, value))
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_tensorboard(directory: Path, tags: dict[str, list[tuple[int, float]]]) -> Path:
    """One event file of `tags` in `directory` (made if its parent exists); it appears whole, renamed there
    once written, as gnnc writes every file. Returns its path."""
    try:
        import tensorboard  # noqa: F401  (deferred: the optional `tensorboard` extra; torch's writer needs it)
        from torch.utils.tensorboard import SummaryWriter  # deferred: loads torch
    except ImportError:
        raise GnncError(TENSORBOARD_MISSING) from None
    if directory.exists() and not directory.is_dir():
        raise GnncError(f"--tensorboard {directory}: is a file; name a directory")
    if not directory.parent.is_dir():
        raise GnncError(f"--tensorboard {directory}: directory {directory.parent} does not exist; create it first")
    try:
        directory.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".gnnc-plot-", dir=directory))
    except OSError as err:
        raise write_failure(err, f"--tensorboard {directory}") from None
    try:
        writer = SummaryWriter(log_dir=str(staging))
        for tag, points in tags.items():
            for epoch, value in points:
                writer.add_scalar(tag, value, epoch)
        writer.close()
        (event,) = staging.iterdir()
        final = directory / event.name
        os.replace(event, final)
    except OSError as err:
        raise write_failure(err, f"--tensorboard {directory}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def run(args: argparse.Namespace) -> int:
    """Run `gnnc plot`; GnncError for bad input (the CLI exits 2 on it)."""
    path = Path(args.metrics)
    records = read_records(path)
    c = curves(records)
    world = f", {c.world_size} processes" if c.world_size > 1 else ""
    summary: dict[str, Any] = {"epochs": len(c.epochs), "world_size": c.world_size}
    if args.tensorboard:
        tags = scalars(records)
        event = write_tensorboard(Path(args.tensorboard), tags)
        print(f"wrote {event}: {len(c.epochs)} epochs{world}, scalars {', '.join(sorted(tags))} "
              f"(tensorboard --logdir {args.tensorboard})")
        summary["tensorboard"] = str(event)
    if args.output or not args.tensorboard:
        out = Path(args.output) if args.output else path.with_suffix(".png")
        png = draw(c, f"{path.name}: {len(c.epochs)} epochs{world}")
        try:
            atomic_write(out, png)
        except OSError as err:
            raise write_failure(err, f"the figure {out}") from None
        best = c.best
        print(f"wrote {out}: {len(c.epochs)} epochs{world}; best validation accuracy "
              f"{c.accuracy['validation'][best]:.3f} at epoch {c.epochs[best]} (test {c.accuracy['test'][best]:.3f})")
        summary.update(output=str(out), best_epoch=c.epochs[best], final_loss=c.loss[-1])
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0
