"""A .gnn file loaded as a model: its parsed module and the parameter overrides to elaborate it with.

Apart from `gnnc.api` because checking a model needs only the front end:
`gnnc check` imports this module, the parser and two passes, and none of
the graph storage, the planner or torch (which `gnnc.api` loads), so it
answers in a fraction of a second. `gnnc.api` re-exports these names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnc.errors import GnncError
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
        """Elaborate (untyped IR), binding `features`/`classes` from the graph if given."""
        return elaborate(self.module, dict(self.overrides), graph_dims(graph), self.name)

    def source(self) -> "ModelSource":
        """What a plan records of the model it was compiled from."""
        from gnnc.plan.plan_file import ModelSource  # deferred: the plan file's shards load torch

        return ModelSource(self.module.file, self.module.source, self.name, self.overrides)


def graph_dims(graph: Any) -> dict[str, int]:
    if graph is None:
        return {}
    return {"features": graph.num_features, "classes": graph.num_classes, "nodes": graph.num_nodes}


def load_model(path: str | os.PathLike, model: str | None = None, **params: Any) -> Model:
    """Parse a .gnn file; `params` override model parameters (as `--set NAME=VALUE`)."""
    p = Path(path)
    try:
        source = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GnncError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise GnncError(f"{path}: cannot read: {err}") from None
    return Model(parse(source, str(path)), tuple(sorted((k, str(v)) for k, v in params.items())), model)


def load_model_source(source: str, file: str = "<string>", model: str | None = None, **params: Any) -> Model:
    return Model(parse(source, file), tuple(sorted((k, str(v)) for k, v in params.items())), model)
