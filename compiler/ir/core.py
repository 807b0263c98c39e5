"""The gnnc IR: small, typed, printable.

A `Program` is a list of `Layer`s; a layer is a list of equations
`outs = op[attrs](ins)` over typed `Value`s, in the spirit of jaxprs. Graph
layers come from a `layer` definition instantiated in the model; `dense`
layers hold the model-level statements between them (dropout, activations,
model-level linear maps, the loss). Each equation keeps the source location
it came from so late errors still point at the user's `.gnn` text.

A `Type` is a domain (vertex, edge, graph, param, scalar), a dtype and a feature
shape whose entries are sympy expressions (`hidden`, `heads*out`, `16`). An
elaborated program may hold values whose type is not yet known (`None`,
printed `?`); the `infer-shapes` pass fills them in.

The printer (`Program.__str__`) is the only one: deterministic text with
sorted attributes and no addresses, so tests compare it verbatim.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any, Iterable

import sympy

from gnnc.errors import GnncError, Loc
from gnnc.ir.expr import parse_expr

# `pair`: one value per (source, destination) pair of a link-prediction split (gnnc.graph.edge_split)
# `graph`: one row per graph of a batch of many graphs (graph classification: a readout's result, graph labels)
DOMAINS = ("vertex", "edge", "param", "scalar", "pair", "graph")
PRIMITIVES = ("scatter", "gather", "transform", "sync", "apply", "model")
LAYER_KINDS = ("graph", "dense")
# the edge views a graph layer may read (see gnnc.graph.storage for what each holds)
VIEWS = ("plain", "self_loops")


class _Record:
    """`replace(**kw)` that refuses unknown fields (as jaxpr records do)."""

    def replace(self, **changes: Any):
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:  # the records' fields are all init fields (no InitVar, no init=False): kept per class
            names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        if not changes.keys() <= set(names):
            unknown = set(changes) - set(names)
            raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        # what dataclasses.replace does (a new instance through __init__, so __post_init__ checks it), without
        # its per-call field walk: a 64-layer model's passes replace ~5,000 records per compile
        return cls(**{name: changes[name] if name in changes else getattr(self, name) for name in names})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


class _Attrs:
    """Lookup in a sorted `attrs` tuple of (key, value) pairs."""

    attrs: tuple[tuple[str, Any], ...]

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


def dim(value: Any) -> sympy.Expr:
    """A feature dim as a sympy expression (ints stay ints, text is read by gnnc.ir.expr, never evaluated)."""
    if isinstance(value, sympy.Expr):
        return value
    if isinstance(value, bool):
        raise TypeError("a dim cannot be a bool")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, str):
        return parse_expr(value, "dim")
    raise TypeError(f"not a dim: {value!r}")


@functools.lru_cache(maxsize=4096)
def fmt_dim(d: sympy.Expr) -> str:
    """A dim as the IR prints it. Kept per expression: a deep model's IR prints the same few dims (`hidden`,
    `classes`) on every value's type, and sympy's printer takes ~10 us a call (~1,000 calls per plan written)."""
    return str(d).replace(" ", "")


@dataclass(frozen=True)
class Type(_Record):
    """domain, dtype and feature shape (the per-vertex / per-edge part)."""

    domain: str
    shape: tuple[sympy.Expr, ...] = ()
    dtype: str = "f32"

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"unknown domain {self.domain!r}")
        object.__setattr__(self, "shape", tuple(dim(d) for d in self.shape))

    def __str__(self) -> str:
        return f"{self.domain}:{self.dtype}[{','.join(fmt_dim(d) for d in self.shape)}]"


@dataclass(frozen=True)
class Value(_Record):
    """A named SSA value; names are unique within a program."""

    name: str
    type: Type | None = None

    def __str__(self) -> str:
        return f"%{self.name}"

    def typed(self) -> str:
        return f"%{self.name}:{self.type if self.type is not None else '?'}"


def _fmt_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, sympy.Expr):
        return fmt_dim(v)
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ")"
    return str(v)


def attrs_of(**kw: Any) -> tuple[tuple[str, Any], ...]:
    """Attributes as a sorted tuple of (key, value), so equations hash and print stably."""
    return tuple(sorted(kw.items()))


@dataclass(frozen=True)
class Eqn(_Record, _Attrs):
    """`outs = op[attrs](ins)`, from primitive `prim`, at source `loc`."""

    op: str
    ins: tuple[Value, ...]
    outs: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    prim: str = "model"
    loc: Loc | None = None

    def with_attrs(self, **kw: Any) -> "Eqn":
        merged = dict(self.attrs)
        merged.update(kw)
        return self.replace(attrs=attrs_of(**merged))

    def __str__(self) -> str:
        outs = ", ".join(v.typed() for v in self.outs)
        attrs = ""
        if self.attrs:
            attrs = "[" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs) + "]"
        ins = ", ".join(str(v) for v in self.ins)
        where = f"  # {self.prim}"
        if self.loc is not None:
            where += f" {self.loc.line}:{self.loc.col}"
        return f"{outs} = {self.op}{attrs}({ins}){where}"


@dataclass(frozen=True)
class Param(_Record):
    """A learnable tensor of a layer, with its initialiser."""

    value: Value
    init: str | float  # glorot | zeros | ones, or a number every element starts at

    def __str__(self) -> str:
        return f"{self.value.typed()} = {_fmt_attr(self.init)}"


@dataclass(frozen=True)
class Layer(_Record, _Attrs):
    """One unit the planner assigns a strategy to.

    kind `graph`: an instance of a `layer` definition (`op` is its name,
    `args` its instantiation arguments, `edges` the edge view its scatter and
    gather read). kind `dense`: model-level statements between graph layers.
    `inputs` are the values read from outside the layer, `outputs` those
    visible after it. `attrs` carries annotations added by later passes.
    """

    name: str
    kind: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    eqns: tuple[Eqn, ...] = ()
    params: tuple[Param, ...] = ()
    op: str = ""
    args: tuple[tuple[str, Any], ...] = ()
    edges: str = "plain"
    attrs: tuple[tuple[str, Any], ...] = ()
    loc: Loc | None = None

    def __str__(self) -> str:
        head = f"layer {self.name} {self.kind}"
        if self.kind == "graph":
            args = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.args)
            head += f" {self.op}({args}) edges={self.edges}"
        if self.attrs:
            head += " [" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs) + "]"
        if self.loc is not None:
            head += f" @{self.loc.line}:{self.loc.col}"
        lines = [head]
        for p in self.params:
            lines.append(f"  param {p}")
        lines.append("  in " + ", ".join(v.typed() for v in self.inputs))
        lines.extend(f"  {e}" for e in self.eqns)
        lines.append("  out " + ", ".join(str(v) for v in self.outputs))
        return "\n".join(lines)


@dataclass(frozen=True)
class Program(_Record):
    """A whole model: its configuration, graph inputs, layers and results.

    `config` holds every model parameter's value (defaults, `--set`
    overrides, and dims bound from the graph such as `features`);
    `training` holds the training settings the model states (epochs, lr...).
    `logits` and `loss` name the values the executor returns. `attrs` carries
    program-wide annotations of later passes (the schedule pass's gradient
    all-reduce mode), printed on an `attrs` line when there are any.
    """

    name: str
    config: tuple[tuple[str, Any], ...]
    inputs: tuple[Value, ...]
    layers: tuple[Layer, ...]
    logits: Value
    loss: Value
    training: tuple[tuple[str, Any], ...] = ()
    source_file: str = "<string>"
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    def params(self) -> list[Param]:
        return [p for layer in self.layers for p in layer.params]

    def graph_layers(self) -> list[Layer]:
        return [layer for layer in self.layers if layer.kind == "graph"]

    def __str__(self) -> str:
        cfg = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.config)
        lines = [f"program {self.name}({cfg})", f"  source {json.dumps(self.source_file)}"]
        if self.training:
            lines.append("  training " + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.training))
        if self.attrs:
            lines.append("  attrs " + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs))
        lines.append("  inputs " + ", ".join(v.typed() for v in self.inputs))
        for layer in self.layers:
            lines.append(str(layer))
        lines.append(f"  result logits={self.logits} loss={self.loss}")
        return "\n".join(lines) + "\n"


def all_values(program: Program) -> Iterable[Value]:
    yield from program.inputs
    for layer in program.layers:
        for p in layer.params:
            yield p.value
        for e in layer.eqns:
            yield from e.outs
