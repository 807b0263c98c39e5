"""A trained model kept to be used again: `gnnc run ... --save-model M` writes it, `gnnc predict M --graph G`
and `gnnc.to_torch(model, M)` read it.

A checkpoint (`--checkpoint`) is for resuming one run: it holds the optimizer and the RNG states, one file per
rank, and only `--resume` of the same run understands it. A saved model holds what running the model again
needs, in one file: the model's source (the .gnn text, its file name and `--set` overrides), the IR one
process runs (the compiled program, parsed back with gnnc's own IR parser), the schema of the graph it was
trained on (feature width, classes, the edge data it reads) and the weights after the last epoch, with the
ops' running state (batch_norm's statistics). It is written atomically (gnnc.files) with torch.save of plain
containers and tensors, and read with `torch.load(weights_only=True)`: nothing in it is run as code.

`gnnc predict` runs it on one process (or on N, `--nproc`: gnnc.predict_cli compiles its source for N workers and
gnnc.runtime.predict runs the ranks), full-graph, in evaluation mode, on the graph it was trained on or any
other with the same feature width (GraphSAGE's inductive case: a new graph), and writes the logits, or the
value of any vertex value of the IR (`--output l0.h`: the first layer's embeddings), as a .npy file. It
computes what `gnnc.to_torch`'s module computes (the same interpreter on the same program and weights). A
graph of another feature width, or weights of another model, are refused naming what differs (exit 2).
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError, write_failure
from gnnc.files import atomic_write
from gnnc.graph import Graph, edge_data
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.ir.text import parse_ir
from gnnc.model_file import Model
from gnnc.plan.pipeline import is_pipeline
from gnnc.plan.plan_file import Plan
from gnnc.runtime.executor import check_dims_fit, init_state
from gnnc.torch_module import GnncModule, param_shapes, value_named

FORMAT = "gnnc-saved-model-1"


@dataclass(frozen=True)
class SavedModel:
    """A saved model as read back: the program one process runs, its weights by IR name, where it came from."""

    program: Program
    weights: dict[str, torch.Tensor]
    source: dict[str, Any]  # file, source (the .gnn text), name, overrides
    schema: dict[str, Any]  # the training graph's name, features, classes and edge data widths

    def module(self) -> GnncModule:
        """The model as a torch.nn.Module (gnnc.to_torch's)."""
        return GnncModule(self.program, self.weights)


def schema_of(program: Program, graph_name: str) -> dict[str, Any]:
    """What a graph must have for the program: its feature width, the logits' width, each edge data's width."""
    cfg = program.config_dict()
    widths = {name: None if w is None else eval_dim(w, cfg) for name, w in edge_data.read_by(program).items()}
    return {"graph": graph_name, "features": eval_dim(program.inputs[0].type.shape[0], cfg),
            "classes": eval_dim(program.logits.type.shape[0], cfg), "edge_data": widths}


def save_model(path: str | Path, target: Plan | Model, program: Program, weights: dict[str, torch.Tensor],
               graph_name: str) -> SavedModel:
    """Write `target`'s one-process `program` (gnnc.api.one_process_program) with the trained `weights`."""
    if isinstance(target, Plan) and is_pipeline(target.program):
        raise GnncError("--save-model: a pipeline's stages each hold their own layers' trained weights, and "
                        "rank 0 hands back only its own; train without the pipeline strategy to save the model")
    saved = SavedModel(program, dict(weights), _source(target), schema_of(program, graph_name))
    saved.module()  # the weights are the program's, each of its shape (a bug otherwise: they were trained on it)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "model": saved.source, "ir": str(program), "schema": saved.schema,
                "weights": saved.weights}, buf)
    try:
        atomic_write(Path(path), buf.getvalue())
    except OSError as err:
        raise write_failure(err, f"--save-model {path}") from None
    return saved


def _source(target: Plan | Model) -> dict[str, Any]:
    src = target.model if isinstance(target, Plan) else target.source()
    return {"file": src.file, "source": src.source, "name": src.name,
            "overrides": [list(pair) for pair in src.overrides]}


def load_saved(path: str | Path) -> SavedModel:
    """Read a file of `--save-model`; GnncError naming the file and what is wrong with it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GnncError(f"{path}: no such file (write one with `gnnc run ... --save-model {path}`)") from None
    except OSError as err:
        raise GnncError(f"{path}: cannot read it ({err.strerror})") from None
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file that is not its format; each means "not ours"
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise GnncError(f"{path}: not a gnnc saved model ({reason})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise GnncError(f"{path}: not a gnnc saved model (no '{FORMAT}' format field; `gnnc run --save-model` "
                        "writes them)")
    ir, weights = payload.get("ir"), payload.get("weights")
    if not isinstance(ir, str) or not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()):
        raise GnncError(f"{path}: a damaged saved model (its IR or weights are missing or not tensors)")
    try:
        program = parse_ir(ir)
    except GnncError as err:
        raise GnncError(f"{path}: its IR does not parse: {err}") from None
    return SavedModel(program, weights, dict(payload.get("model") or {}), dict(payload.get("schema") or {}))


def check_fits(saved: SavedModel, graph: Graph, output: str = "logits") -> str:
    """The IR name of the value `output` names (the logits, a layer, a vertex value), the graph checked to fit the
    model (feature width, edge data); GnncError naming what does not."""
    value = saved.program.logits.name if output == "logits" else value_named(saved.program, output)
    check_dims_fit(saved.program, graph.num_features, 0, graph.name)
    edge_data.check_fits(saved.program, graph.edge_data, graph.name, saved.program.config_dict())
    return value


def predict(saved: SavedModel, graph: Graph, output: str = "logits") -> np.ndarray:
    """`gnnc predict`'s values: every vertex's logits, or the vertex value `output`, on `graph`."""
    return saved.module().predict(graph, None if output == "logits" else output).cpu().numpy()


# ----- where the weights come from


def load_weights(source: Any, program: Program) -> dict[str, torch.Tensor]:
    """The weights (and op state) by IR name from `source`: a dict of tensors by IR name, a checkpoint
    directory or `.ckpt` file of `gnnc run --checkpoint`, or a model file of `gnnc run --save-model`."""
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, os.PathLike)):
        return _from_file(Path(source), program)
    raise GnncError(f"to_torch: cannot take weights from a {type(source).__name__}: give a dict of tensors by IR "
                    "name, a checkpoint directory or file (gnnc run --checkpoint) or a saved model "
                    "(gnnc run --save-model)")


def _from_file(path: Path, program: Program) -> dict[str, torch.Tensor]:
    from gnnc.runtime.checkpoint import MAGIC, load_state  # deferred: checkpoint loads torch.distributed

    if path.is_dir():
        marker = path / "latest-rank-0.json"
        try:
            epoch = int(json.loads(marker.read_text())["epoch"])
        except FileNotFoundError:
            raise GnncError(f"{path}: no checkpoint in it ({marker.name} is missing): give the directory of "
                            "`gnnc run --checkpoint DIR`") from None
        except (OSError, ValueError, KeyError, TypeError):
            raise GnncError(f"{marker}: not a checkpoint marker (corrupt)") from None
        path = path / f"epoch-{epoch:06d}" / "rank-0.ckpt"
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as err:
        raise GnncError(f"{path}: cannot read it ({err.strerror})") from None
    if head != MAGIC:
        return load_saved(path).weights
    state = load_state(path)
    if "pipeline" in (state.get("fingerprint") or {}).get("strategies", []):
        raise GnncError(f"checkpoint {path}: a pipeline's ranks each hold their own stage's trained weights, "
                        "and rank 0's file has only its own; train without the pipeline strategy to use them")
    return checkpoint_weights(state["model"], program, path)


def checkpoint_weights(saved: Mapping[str, torch.Tensor], program: Program, where: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's module state (gnnc.runtime.train's `_Params`: weight k as `p{k}`, op state k as `s{k}`,
    each in program order) by IR name."""
    names = [*(f"p{k}" for k in range(len(program.params()))), *(f"s{k}" for k in range(len(init_state(program))))]
    if sorted(saved) != sorted(names):
        raise GnncError(f"checkpoint {where} holds {len([k for k in saved if k.startswith('p')])} weights and this "
                        f"model has {len(program.params())}: it is another model's")
    ir = [*param_shapes(program), *init_state(program)]
    return {name: saved[key] for key, name in zip(names, ir)}
