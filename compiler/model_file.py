"""A .gnn file loaded as a model: its parsed module and the parameter overrides to elaborate it with.

Apart from `gnnc.api` because checking a model needs only the front end:
`gnnc check` imports this module, the parser and two passes, and none of
the graph storage, the planner or torch (which `gnnc.api` loads), so it
answers in a fraction of a second. `gnnc.api` re-exports these names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnnc.errors import GnncError
from gnnc.files import read_text_input
from gnnc.frontend.elaborate import elaborate
from gnnc.frontend.syntax import Module, parse
from gnnc.ir import Program

if TYPE_CHECKING:
    from gnnc.plan.plan_file import ModelSource


@dataclass(frozen=True)
class Model:
    """A parsed .gnn file plus the parameter overrides to elaborate it with."""

    module: Module
    overrides: tuple[tuple[str, str], ...] = ()
    name: str | None = None

    @property
    def file(self) -> str:
        return self.module.file

    def program(self, graph: Any = None) -> Program:
        """Elaborate (untyped IR), binding `features`/`classes` and the edge data's widths from the graph if given."""
        return elaborate(self.module, dict(self.overrides), graph_dims(graph), self.name, edge_shapes(graph))

    def source(self) -> "ModelSource":
        """What a plan records of the model it was compiled from."""
        from gnnc.plan.plan_file import ModelSource  # deferred: the plan file's shards load torch

        return ModelSource(self.module.file, self.module.source, self.name, self.overrides)


def graph_dims(graph: Any) -> dict[str, int]:
    if graph is None:
        return {}
    return {"features": graph.num_features, "classes": graph.num_classes, "targets": graph.num_targets,
            "nodes": graph.num_nodes}


def edge_shapes(graph: Any) -> dict[str, int | None] | None:
    """The graph's edge data by name and width (None: a number per edge); None without a graph."""
    if graph is None:
        return None
    from gnnc.graph import edge_data  # deferred: the graph package loads torch, which `gnnc check` does without

    return edge_data.shapes(graph.edge_data)


class ModelErrors(GnncError):
    """`check` found errors in one or more models of a file: `errors` holds each model's first one."""

    def __init__(self, errors: list[GnncError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


def check(model: Model, graph: Any = None) -> list[str]:
    """Type-check every model of the file, or only the one `model.name` names; the names of those checked.

    A `--set` value applies to the models that declare that parameter. Raises ModelErrors
    with each failing model's first error (`file:line:col` with a caret).
    """
    from gnnc.ir.ops import suggest  # deferred: the op table loads sympy, which only a run of `check` needs
    from gnnc.passes.manager import run_pipeline  # deferred: passes sit above this module's layer

    models = model.module.models
    names = [model.name] if model.name is not None else [m.name for m in models] or [None]
    declared = {p.name for m in models for p in m.params}
    for key, _ in model.overrides:
        if key not in declared:
            which = f"model '{models[0].name}' has" if len(models) == 1 else f"no model in {model.file} has"
            raise GnncError(f"--set {key}: {which} no parameter '{key}'{suggest(key, declared)}")
    errors: list[GnncError] = []
    for name in names:
        params = {p.name for m in models if m.name == name for p in m.params}
        chosen = model.name is not None  # a model named by the user takes every --set, and refuses a foreign one
        one = Model(model.module, tuple((k, v) for k, v in model.overrides if k in params or chosen), name)
        try:
            run_pipeline(one.program(graph), ["infer-shapes", "check"])
        except GnncError as err:
            errors.append(err)
    if errors:
        raise ModelErrors(errors)
    return [n for n in names if n is not None]


def load_model(path: str | os.PathLike, model: str | None = None, **params: Any) -> Model:
    """Parse a .gnn file; `params` override model parameters (as `--set NAME=VALUE`)."""
    source = read_text_input(path, os.fspath(path))
    return Model(parse(source, str(path)), tuple(sorted((k, str(v)) for k, v in params.items())), model)


def load_model_source(source: str, file: str = "<string>", model: str | None = None, **params: Any) -> Model:
    return Model(parse(source, file), tuple(sorted((k, str(v)) for k, v in params.items())), model)
