"""`gnnc predict --nproc N`'s rank: a saved model's values on this rank's rows, assembled and written by rank 0.

Each rank loads its shard of a plan compiled for N workers (gnnc.saved_model.predict_distributed), as a rank
of `gnnc run --nproc N` does (gnnc.runtime.distributed.DistWorker), takes the saved weights in place of
initial ones (under P3's push-pull its feature slice's rows of the split first-layer weights) and the ops'
running state, and runs one forward pass in evaluation mode, exchanging rows as the plan says. It keeps the
value asked for (the logits, or a vertex value of the IR) past its last reader, and sends the rows of it that
it owns to rank 0, which puts every vertex's row in global order and writes the .npy file atomically: every
vertex is owned by exactly one rank, so no row is written twice and none is missing.

A value is held by rows where a rank runs its layer: the prefix of that layer's row order (gnnc.plan.rows)
that the value covers. Values before P3's pull are feature slices or partial sums instead, and the caller
plans such a value's layer with a row strategy (`in_feature_phase`).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gnnc.errors import GnncError, write_failure
from gnnc.files import atomic_write
from gnnc.ir import Program
from gnnc.runtime import device as devices
from gnnc.runtime.distributed import DistInterpreter, DistJob, DistWorker
from gnnc.runtime.executor import Interpreter
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.train import TrainConfig


# A graph of more vertices than this is evaluated layer-wise (gnnc.runtime.layerwise), in chunks of this many rows
# (gnnc.memory_check measured 16,384 rows at 22 MiB above the two [rows, width] tensors on a 200K-vertex R-MAT)
CHUNK_ROWS = 16_384


def chunk_rows(program: Program, num_nodes: int, value: str) -> int | None:
    """The rows per chunk of layer-wise evaluation for predicting `value` on a graph of `num_nodes` vertices,
    equation by equation (a rank's evaluation; one process's for any value but the logits, whose fused chains hold
    no edge value: gnnc.runtime.fusion): CHUNK_ROWS on a larger graph, where a layer's every edge value at once
    would be the largest thing held; None (whole layers) on a smaller one, or for a value computed inside a layer,
    which a layer run in chunks does not keep."""
    outputs = {v.name for layer in program.layers for v in layer.outputs}
    return CHUNK_ROWS if num_nodes > CHUNK_ROWS and value in outputs else None


class Keeping:
    """An interpreter mixin that keeps the value `keep` (`kept_value`) from the layer that computes it: past its last
    reader within that layer, and whatever a later layer drops (gnnc.torch_module's `predict --output` and the
    ranks both read it after the forward pass)."""

    keep: str = ""
    kept_value: torch.Tensor | None = None

    def drop_dead(self, env: dict[str, Any], layer: Any, k: int | None = None) -> None:
        value = env.get(self.keep)
        super().drop_dead(env, layer, k)  # type: ignore[misc]
        if value is not None:
            env[self.keep] = value

    def run_layer(self, layer, env, params, ctx):
        before = self.keep in env
        super().run_layer(layer, env, params, ctx)  # type: ignore[misc]
        if not before and self.kept_value is None and self.keep in env:
            self.kept_value = env[self.keep]
            self.made_by(layer)

    def made_by(self, layer: Any) -> None:
        """Called once the layer computing the value has run."""


class KeepingInterpreter(Keeping, Interpreter):
    """One process's interpreter keeping `keep` (gnnc.torch_module's `predict`)."""

    def __init__(self, program: Program, keep: str):
        super().__init__(program)
        self.keep = keep


class _KeepingRanks(Keeping, DistInterpreter):
    """A rank's interpreter keeping `keep`, with the global ids of its rows: those of the layer that made it."""

    def __init__(self, program: Program, lg: Any, phase: Any, keep: str):
        super().__init__(program, lg, phase)
        self.keep = keep
        self.kept_ids: torch.Tensor | None = None

    def made_by(self, layer: Any) -> None:
        self.kept_ids = self._ids  # the row order the layer ran in (its segment's, gnnc.plan.rows)


def in_feature_phase(program: Program) -> frozenset[str]:
    """The values a rank holds as feature slices or partial sums (P3's push-pull, up to its `reduce_scatter`),
    not as rows: everything computed before the pull, and the inputs it reads."""
    seen: set[str] = {v.name for v in program.inputs}
    for layer in program.layers:
        for e in layer.eqns:
            if e.op == "reduce_scatter":
                return frozenset(seen)
            seen.update(o.name for o in e.outs)
    return frozenset()


@dataclass(frozen=True)
class PredictJob:
    """What every rank needs (picklable): the plan's IR and shards, the weights by IR name, the value to keep,
    where rank 0 writes it."""

    ir: str
    shard_dir: str
    weights: dict[str, torch.Tensor]
    value: str  # the IR name of the value written (the logits' by default)
    out: str
    threads: int | None = None
    chunk: int | None = None  # layer-wise evaluation's rows per chunk (chunk_rows); None: whole layers


def predict_rank(cfg: DistConfig, job: PredictJob) -> dict[str, Any] | None:
    """One rank's forward pass; rank 0 writes every vertex's row of `job.value` to `job.out` and returns its
    shape (None on the other ranks)."""
    w = DistWorker(cfg, DistJob(job.ir, job.shard_dir, TrainConfig(epochs=1, progress=False, eval_chunk=job.chunk)))
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    interp = _KeepingRanks(w.program, w.lg, w.interp.phase, job.value)
    w.interp = interp
    params = {}
    for name in (p.value.name for p in w.program.params()):
        t = job.weights[name].to(w.device)
        if name in w.split:  # this rank's feature slice of P3's split weight: the rows it multiplies
            assert w.cols is not None
            t = t[w.cols[0]:w.cols[1]]
        params[name] = t
    for name in w.state:  # the ops' running state (batch_norm's statistics) as trained
        if name in job.weights:
            w.state[name] = job.weights[name].to(w.device)
    env = dict(w.inputs)
    if job.value in env:  # the features: as the shard holds them, no layer run
        value, held = env[job.value], w.lg.rows
    else:
        # a fused chain computes its inner values nowhere and may write its result over its input: only for the
        # logits, as one process (gnnc.torch_module)
        ctx = replace(w.context(False, 0), fuse=job.value == w.program.logits.name)
        with torch.no_grad(), devices.autocast(w.device, w.cfg.precision):
            for layer in w.program.layers:
                interp.run_layer(layer, env, params, ctx)
        value, held = interp.kept_value, interp.kept_ids
    assert value is not None and held is not None
    value = value.to_dense() if value.is_sparse else value
    ids = held[: value.shape[0]]
    mine = torch.isin(ids, w.lg.owned)
    rows = (ids[mine].cpu(), value[mine].detach().cpu())
    every: list[Any] = [None] * cfg.world_size if cfg.rank == 0 else None  # type: ignore[assignment]
    dist.gather_object(rows, every, dst=0)
    if cfg.rank != 0:
        return None
    out = torch.zeros((w.num_nodes, *rows[1].shape[1:]), dtype=rows[1].dtype)
    covered = torch.zeros(w.num_nodes, dtype=torch.bool)
    for ids_r, rows_r in every:
        out[ids_r] = rows_r
        covered[ids_r] = True
    if not bool(covered.all()):
        missing = int((~covered).sum())
        raise GnncError(f"--output {job.value}: {missing} of the {w.num_nodes} vertices' rows are held by no rank "
                        "on this plan; ask for it without --nproc")
    array = out.numpy()
    write_array(job.out, array)
    return {"shape": list(array.shape)}


def write_array(out: str, array: np.ndarray) -> None:
    """`gnnc predict`'s -o: `array` as a .npy file, written atomically (an OSError names -o)."""
    buf = io.BytesIO()
    np.save(buf, array)
    try:
        atomic_write(Path(out), buf.getvalue())
    except OSError as err:
        raise write_failure(err, f"-o {out}") from None
