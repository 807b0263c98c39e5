"""Read the IR printer's text back into a Program: `parse_ir(str(p)) == p`.

The printer is the one rendering of the IR; this parser inverts it so users
can write an IR snippet by hand (to test one pass on it) and plans can store
IR as text. The text is line-oriented:

    program NAME(k=v, ...)
      source "file.gnn"
      training k=v, ...                       (optional)
      attrs k=v, ...                          (optional: program annotations)
      inputs %x:vertex:f32[features], ...
    layer NAME KIND [OP(k=v, ...) edges=VIEW] [[k=v, ...]] [@line:col]
      param %p:param:f32[d1,d2] = INIT         (zeros, ones, glorot or a number)
      in %v:TYPE, ...
      %o:TYPE = op[k=v, ...](%a, %b)  # PRIM [line:col]
      out %v, ...
      result logits=%a loss=%b

Attribute values are typed by key where the text alone is ambiguous: dims
(`out`, `heads`) are sympy expressions, names (`reduce`, `name`, `op`,
`strategy`, ...) are strings; anything else reads as a number, a boolean, a
string, or a sympy expression, in that order. Every expression is read by
`gnnc.ir.expr`, which builds sympy objects and never evaluates the text: IR
comes from plan files, and a plan is data.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import sympy

from gnnc.errors import GnncError, Loc
from gnnc.ir.core import Eqn, Layer, Param, Program, Type, Value, attrs_of
from gnnc.ir.expr import ExprSyntaxError, parse_expr

# The settings a program's training may hold, each with its type: the language's `training(...)` keywords.
TRAINING_KEYS = {"epochs": int, "lr": float, "weight_decay": float, "graph_weight_decay": float, "patience": int,
                 "optimizer": str, "momentum": float, "schedule": str, "warmup": int, "clip": float,
                 "lr_step_size": int, "lr_gamma": float, "lr_patience": int, "lr_factor": float,
                 # link prediction's edge split and negatives (gnnc.graph.edge_split), and its Hits@K
                 "val_edges": float, "test_edges": float, "neg_ratio": float, "hits_k": int,
                 # graph classification's graphs per step (gnnc.graph.graph_batches)
                 "batch_size": int}
LINK_TRAINING_KEYS = ("val_edges", "test_edges", "neg_ratio", "hits_k")
# The settings that are names, and the names each may be (`training(optimizer = adamw, schedule = cosine)`).
TRAINING_CHOICES = {"optimizer": ("sgd", "adam", "adamw"), "schedule": ("none", "step", "cosine", "plateau")}
# The optimizer settings' ranges, as torch.optim and torch.optim.lr_scheduler accept them (lower, upper, whether
# the bounds are included); the older settings are checked where the run resolves them (gnnc.runtime.train).
TRAINING_RANGES = {"momentum": (0.0, 1.0, True, False), "warmup": (0, None, True, True),
                   "clip": (0.0, None, False, True), "lr_step_size": (1, None, True, True),
                   "lr_gamma": (0.0, 1.0, False, True), "lr_patience": (0, None, True, True),
                   "lr_factor": (0.0, 1.0, False, False), "val_edges": (0.0, 1.0, True, False),
                   "test_edges": (0.0, 1.0, False, False), "neg_ratio": (0.0, None, False, True),
                   "hits_k": (1, None, True, True), "batch_size": (1, None, True, True)}


def training_problem(key: str, value: Any) -> str | None:
    """What is wrong with `value` for training setting `key` (None when nothing): its kind, its name among the
    choices or its range. One check for the language, the IR's training line and the command line."""
    want = TRAINING_KEYS[key]
    if want is str:
        if value not in TRAINING_CHOICES[key]:
            return f"must be one of {', '.join(TRAINING_CHOICES[key])}, not {value!r}"
        return None
    if isinstance(value, bool) or not isinstance(value, want if want is int else (int, float)):
        return f"must be {'an integer' if want is int else 'a number'}, not {value!r}"
    if want is float and not math.isfinite(value):
        return f"must be a finite number, not {value!r}"
    if key in TRAINING_RANGES:
        lo, hi, lo_in, hi_in = TRAINING_RANGES[key]
        if not ((value >= lo if lo_in else value > lo) and (hi is None or (value <= hi if hi_in else value < hi))):
            return (f"must be {'at least' if lo_in else 'above'} {lo}"
                    + ("" if hi is None else f" and {'at most' if hi_in else 'below'} {hi}") + f", not {value!r}")
    return None
DIM_ATTRS = {"out", "heads", "width"}
STR_ATTRS = {"reduce", "name", "op", "strategy", "layout", "init", "method", "bin_order"}
_NAME = r"[A-Za-z0-9_.~^]+"
_TYPE_RE = re.compile(r"^(vertex|edge|param|scalar|pair|graph):([a-z0-9]+)\[(.*)\]$")
_EQN_RE = re.compile(r"^(?P<outs>.+?) = (?P<op>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<attrs>.*?)\])?"
                     r"\((?P<ins>[^()]*)\)  # (?P<prim>[a-z]+)(?: (?P<line>\d+):(?P<col>\d+))?$")
_HEAD_RE = re.compile(r"^layer (?P<name>\S+) (?P<kind>graph|dense)(?: (?P<op>[A-Za-z_][A-Za-z0-9_]*)"
                      r"\((?P<args>.*?)\) edges=(?P<edges>\S+))?(?: \[(?P<attrs>.*)\])?"
                      r"(?: @(?P<line>\d+):(?P<col>\d+))?$")


class IRSyntaxError(GnncError):
    """IR text that the printer could not have produced."""


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets or parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail or parts:
        parts.append(tail)
    return [p for p in parts if p]


def _scalar(text: str, what: str, symbols: bool = False) -> Any:
    if text == "none":
        return None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        pass
    if text.startswith("(") and text.endswith(")"):
        return tuple(_scalar(p, what, symbols) for p in _split_top(text[1:-1]))
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and not symbols:
        return text
    return parse_expr(text, what)


def _attr(key: str, text: str, what: str) -> Any:
    if key in DIM_ATTRS:
        return parse_expr(text, what)
    if key in STR_ATTRS:
        return text
    return _scalar(text, what, symbols=True)


def _kv(text: str, what: str, typed: bool = True) -> dict[str, Any]:
    """`k=v, ...`; `what` says whose keys they are (`attribute`, `program parameter`) in errors."""
    out = {}
    for part in _split_top(text):
        if "=" not in part:
            raise ValueError(f"expected key=value, got {part!r}")
        k, v = part.split("=", 1)
        k = k.strip()
        out[k] = _attr(k, v.strip(), f"{what} {k}") if typed else _scalar(v.strip(), f"{what} {k}")
    return out


def _type(text: str, what: str) -> Type | None:
    if text == "?":
        return None
    m = _TYPE_RE.match(text)
    if not m:
        raise ValueError(f"bad type {text!r}")
    dims = tuple(parse_expr(d, f"dim {k} of {what}") for k, d in enumerate(_split_top(m.group(3))))
    return Type(m.group(1), dims, m.group(2))


def _training(settings: dict[str, Any], fail: Callable[[str], IRSyntaxError]) -> dict[str, Any]:
    """The settings of a `training` line, each one the language's `training(...)` takes and of its type: the
    training settings of a plan's IR reach the run's configuration, which also holds paths (where checkpoints
    go), the device and resumption; those come from the command line only, never from a plan."""
    for key, value in settings.items():
        want = TRAINING_KEYS.get(key)
        if want is None:
            raise fail(f"unknown training setting '{key}' (a program's training holds {', '.join(TRAINING_KEYS)} "
                       f"only: paths and devices come from the command line)")
        if key == "schedule" and value is None:  # `schedule=none` reads back as None
            settings[key] = value = "none"
        problem = training_problem(key, value)
        if problem is not None:
            raise fail(f"training setting '{key}' {problem}")
    return settings


def _typed_value(text: str) -> Value:
    m = re.match(rf"^%({_NAME}):(.*)$", text.strip())
    if not m:
        raise ValueError(f"expected %name:type, got {text!r}")
    return Value(m.group(1), _type(m.group(2), f"%{m.group(1)}"))


def _ref(text: str) -> str:
    m = re.fullmatch(rf"%({_NAME})", text.strip())
    if not m:
        raise ValueError(f"expected %name, got {text!r}")
    return m.group(1)


def _args_value(v: Any) -> Any:
    """Layer arguments as elaboration stores them: numbers plain, dims symbolic."""
    if isinstance(v, str):
        return sympy.Symbol(v)
    return v


def parse_ir(text: str, file: str = "<ir>") -> Program:
    """Parse printed IR; raise IRSyntaxError at the offending line."""
    def fail(msg: str, i: int) -> IRSyntaxError:
        return IRSyntaxError(msg, Loc(file, i + 1, 1), text)

    lines = _Lines(text.splitlines(), fail)
    try:
        return _parse(lines.next_line, fail)
    except IRSyntaxError:
        raise
    except ExprSyntaxError as err:  # names the field; the line says where
        raise fail(err.message, lines.last) from None
    except (ValueError, TypeError, KeyError, IndexError) as err:
        raise fail(f"malformed IR: {err}", lines.last) from None


class _Lines:
    """The IR's lines, read one non-blank line at a time; `last` is the one read last (for errors)."""

    def __init__(self, lines: list[str], fail: Callable[[str, int], IRSyntaxError]) -> None:
        self.lines, self.fail, self.i, self.last = lines, fail, 0, 0

    def next_line(self) -> tuple[int, str]:
        while self.i < len(self.lines) and not self.lines[self.i].strip():
            self.i += 1
        if self.i >= len(self.lines):
            raise self.fail("unexpected end of IR", max(len(self.lines) - 1, 0))
        self.last = self.i
        self.i += 1
        return self.last, self.lines[self.last]


def _parse(next_line, fail) -> Program:
    k, line = next_line()
    m = re.match(r"^program ([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", line)
    if not m:
        raise fail("expected 'program NAME(...)'", k)
    name, config = m.group(1), tuple(sorted(_kv(m.group(2), "program parameter", typed=False).items()))
    k, line = next_line()
    m = re.match(r"^  source (\".*\")$", line)
    if not m:
        raise fail("expected '  source \"FILE\"'", k)
    source_file = json.loads(m.group(1))
    k, line = next_line()
    training: tuple = ()
    if line.startswith("  training "):
        training = tuple(sorted(_training(_kv(line[len("  training "):], "training setting", typed=False),
                                          lambda msg: fail(msg, k)).items()))
        k, line = next_line()
    attrs: tuple = ()
    if line.startswith("  attrs "):
        attrs = tuple(sorted(_kv(line[len("  attrs "):], "program attribute").items()))
        k, line = next_line()
    if not line.startswith("  inputs "):
        raise fail("expected '  inputs ...'", k)
    inputs = tuple(_typed_value(p) for p in _split_top(line[len("  inputs "):]))
    scope: dict[str, Value] = {v.name: v for v in inputs}
    layers: list[Layer] = []
    while True:
        k, line = next_line()
        if line.startswith("  result "):
            m = re.match(rf"^  result logits=%({_NAME}) loss=%({_NAME})$", line)
            if not m:
                raise fail("expected '  result logits=%a loss=%b'", k)
            if m.group(1) not in scope or m.group(2) not in scope:
                raise fail("result names an undefined value", k)
            return Program(name, config, inputs, tuple(layers), scope[m.group(1)], scope[m.group(2)],
                           training, source_file, attrs)
        layers.append(_layer(k, line, next_line, scope, source_file, fail))


def _layer(k: int, line: str, next_line, scope: dict[str, Value], file: str, fail) -> Layer:
    m = _HEAD_RE.match(line)
    if not m:
        raise fail("expected 'layer NAME KIND ...' or '  result ...'", k)
    kind = m.group("kind")
    op = m.group("op") or ""
    args = tuple((a, _args_value(v)) for a, v in _kv(m.group("args") or "", "layer argument", typed=False).items())
    edges = m.group("edges") or "plain"
    attrs = tuple(sorted(_kv(m.group("attrs") or "", "layer attribute").items()))
    loc = Loc(file, int(m.group("line")), int(m.group("col"))) if m.group("line") else None
    params: list[Param] = []
    local = dict(scope)
    k, line = next_line()
    while line.startswith("  param "):
        pm = re.match(r"^  param (.+) = ([a-z]+|[-+0-9.e]+)$", line)
        if not pm:
            raise fail("expected '  param %name:TYPE = INIT' (an initialiser's name or a number)", k)
        v = _typed_value(pm.group(1))
        init: str | float = pm.group(2)
        if not init[0].isalpha():
            init = float(init)
            if not math.isfinite(init):
                raise fail(f"param %{v.name}: initial value {pm.group(2)} is not finite", k)
        params.append(Param(v, init))
        local[v.name] = v
        k, line = next_line()
    if not line.startswith("  in"):
        raise fail("expected '  in ...'", k)
    inputs = tuple(_typed_value(p) for p in _split_top(line[len("  in"):]))
    eqns: list[Eqn] = []
    while True:
        k, line = next_line()
        if line.startswith("  out"):
            names = [_ref(p) for p in _split_top(line[len("  out"):])]
            for nm in names:
                if nm not in local:
                    raise fail(f"layer output %{nm} is not defined", k)
            outputs = tuple(local[nm] for nm in names)
            for v in outputs:
                scope[v.name] = v
            return Layer(m.group("name"), kind, inputs, outputs, tuple(eqns), tuple(params), op, args, edges,
                         attrs, loc)
        em = _EQN_RE.match(line.strip())
        if not em or not line.startswith("  %"):
            raise fail("expected an equation '%out:TYPE = op[attrs](ins)  # prim line:col' or '  out ...'", k)
        outs = tuple(_typed_value(p) for p in _split_top(em.group("outs")))
        ins = []
        for nm in (_ref(p) for p in _split_top(em.group("ins"))):
            if nm not in local:
                raise fail(f"%{nm} is used before it is defined", k)
            ins.append(local[nm])
        eattrs = attrs_of(**_kv(em.group("attrs") or "", f"{em.group('op')} attribute"))
        eloc = Loc(file, int(em.group("line")), int(em.group("col"))) if em.group("line") else None
        eqns.append(Eqn(em.group("op"), tuple(ins), outs, eattrs, em.group("prim"), eloc))
        for v in outs:
            local[v.name] = v
