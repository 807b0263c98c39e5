"""The gnnc IR: small, typed, printable.

A `Program` is a list of `Layer`s; a layer is a list of equations
`outs = op[attrs](ins)` over typed `Value`s, in the spirit of jaxprs. Graph
layers come from a `layer` definition instantiated in the model; `dense`
layers hold the model-level statements between them (dropout, activations,
model-level linear maps, the loss). Each equation keeps the source location
it came from so late errors still point at the user's `.gnn` text.

A `Type` is a domain (vertex, edge, param, scalar), a dtype and a feature
shape whose entries are sympy expressions (`hidden`, `heads*out`, `16`). An
elaborated program may hold values whose type is not yet known (`None`,
printed `?`); the `infer-shapes` pass fills them in.

The printer (`Program.__str__`) is the only one: deterministic text with
sorted attributes and no addresses, so tests compare it verbatim.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Iterable

import sympy

from gnnc.errors import GnncError, Loc
from gnnc.ir.expr import parse_expr

DOMAINS = ("vertex", "edge", "param", "scalar")
PRIMITIVES = ("scatter", "gather", "transform", "sync", "apply", "model")
LAYER_KINDS = ("graph", "dense")
# the edge views a graph layer may read (see gnnc.graph.storage for what each holds)
VIEWS = ("plain", "self_loops")


class _Record:
    """`replace(**kw)` that refuses unknown fields (as jaxpr records do)."""

    def replace(self, **changes: Any):
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


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


def fmt_dim(d: sympy.Expr) -> str:
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
    init: str  # glorot | zeros | ones

    def __str__(self) -> str:
        return f"{self.value.typed()} = {self.init}"


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
    `logits` and `loss` name the values the executor returns.
    """

    name: str
    config: tuple[tuple[str, Any], ...]
    inputs: tuple[Value, ...]
    layers: tuple[Layer, ...]
    logits: Value
    loss: Value
    training: tuple[tuple[str, Any], ...] = ()
    source_file: str = "<string>"

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
        lines.append("  inputs " + ", ".join(v.typed() for v in self.inputs))
        for layer in self.layers:
            lines.append(str(layer))
        lines.append(f"  result logits={self.logits} loss={self.loss}")
        return "\n".join(lines) + "\n"


class VerifyError(GnncError):
    """An IR invariant is broken: a bug in a pass, not in the user's program."""


def verify(program: Program, typed: bool = False) -> None:
    """Check the IR's invariants; raise VerifyError naming the broken one.

    1. Every value is defined once: program inputs, layer params and equation
       outputs never share a name.
    2. Every equation input is defined before use: by a program input, an
       earlier layer's output (declared in the reading layer's `inputs`), a
       param of its layer, or an earlier equation of its layer.
    3. Every layer output is defined inside the layer or passes an input through.
    4. Layer kinds and primitives are known; graph layers name an edge view.
    5. `logits` and `loss` are defined by the program.
    6. With `typed=True`: every value has a type, and a value's type is the
       same at its definition and at every use.
    """
    defined: dict[str, Value] = {}

    def define(v: Value, where: str) -> None:
        if v.name in defined:
            raise VerifyError(f"value %{v.name} is defined twice ({where})")
        if typed and v.type is None:
            raise VerifyError(f"value %{v.name} has no type ({where})")
        defined[v.name] = v

    def use(v: Value, scope: dict[str, Value], where: str) -> None:
        if v.name not in scope:
            raise VerifyError(f"%{v.name} is used before it is defined ({where})")
        if typed and scope[v.name].type != v.type:
            raise VerifyError(
                f"%{v.name} has type {v.type} at its use but {scope[v.name].type} "
                f"at its definition ({where})")

    for v in program.inputs:
        define(v, "program input")
    visible: dict[str, Value] = dict(defined)
    for layer in program.layers:
        if layer.kind not in LAYER_KINDS:
            raise VerifyError(f"layer {layer.name} has unknown kind {layer.kind!r}")
        if layer.kind == "graph" and layer.edges not in VIEWS:
            raise VerifyError(f"layer {layer.name} reads unknown edge view {layer.edges!r}")
        scope: dict[str, Value] = {}
        for v in layer.inputs:
            use(v, visible, f"input of layer {layer.name}")
            scope[v.name] = visible[v.name]
        for p in layer.params:
            define(p.value, f"param of layer {layer.name}")
            if p.value.type is not None and p.value.type.domain != "param":
                raise VerifyError(f"param %{p.value.name} is not in the param domain")
            scope[p.value.name] = p.value
        for i, e in enumerate(layer.eqns):
            where = f"layer {layer.name}, equation {i}: {e.op}"
            if e.prim not in PRIMITIVES:
                raise VerifyError(f"unknown primitive {e.prim!r} ({where})")
            for v in e.ins:
                use(v, scope, where)
            for v in e.outs:
                define(v, where)
                scope[v.name] = v
        for v in layer.outputs:
            use(v, scope, f"output of layer {layer.name}")
            visible[v.name] = scope[v.name]
    for role, v in (("logits", program.logits), ("loss", program.loss)):
        if v.name not in visible:
            raise VerifyError(f"the program's {role} %{v.name} is not defined")


def all_values(program: Program) -> Iterable[Value]:
    yield from program.inputs
    for layer in program.layers:
        for p in layer.params:
            yield p.value
        for e in layer.eqns:
            yield from e.outs
