"""Syntax tree of a .gnn file, and the parser that builds it.

Lark parses the text (grammar/gnn.lark); a Transformer turns the parse tree
into frozen dataclasses that each carry a `Loc`. Every Lark failure becomes a
`GnncSyntaxError` at the offending token, with a message written for people
("expected a primitive (scatter, gather, ...), found 'scater'") rather than
Lark's terminal names.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Union

from lark import Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from gnnc.errors import GnncError, GnncSyntaxError, Loc
from gnnc.grammar import parser


@dataclass(frozen=True)
class Num:
    value: int | float
    loc: Loc


@dataclass(frozen=True)
class Name:
    id: str
    loc: Loc


@dataclass(frozen=True)
class Attr:
    """`base.field`: src.h, dst.h or edge.NAME."""

    base: str
    field: str
    loc: Loc


@dataclass(frozen=True)
class BinOp:
    op: str  # add | sub | mul | div | pow
    lhs: "Expr"
    rhs: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Kwarg:
    name: str
    value: "Expr"
    loc: Loc


@dataclass(frozen=True)
class Call:
    """`func(args)`, or `Layer(args)(inputs)` when `inputs` is not None."""

    func: str
    args: tuple["Expr", ...]
    kwargs: tuple[Kwarg, ...]
    inputs: tuple["Expr", ...] | None
    loc: Loc
    inputs_kwargs: tuple[Kwarg, ...] = ()


Expr = Union[Num, Name, Attr, BinOp, Neg, Call]


@dataclass(frozen=True)
class ParamDef:
    name: str
    default: int | float | bool | None
    loc: Loc


@dataclass(frozen=True)
class Stmt:
    """`PRIMITIVE target = expr` inside a layer."""

    prim: str
    target: str
    expr: Expr
    loc: Loc
    target_loc: Loc


@dataclass(frozen=True)
class ParamDecl:
    """`param NAME[d1, d2] = INIT` in a layer or a model: a learnable tensor (a scalar without a shape)."""

    name: str
    shape: tuple[Expr, ...]
    init: Expr  # a number, or the name of an initialiser (zeros, ones, glorot)
    loc: Loc
    name_loc: Loc


@dataclass(frozen=True)
class LayerDef:
    name: str
    params: tuple[ParamDef, ...]
    options: tuple[tuple[str, Loc], ...]
    stmts: tuple[Stmt | ParamDecl, ...]
    loc: Loc


@dataclass(frozen=True)
class Assign:
    target: str
    expr: Expr
    loc: Loc


@dataclass(frozen=True)
class Repeat:
    """`repeat VAR in START..STOP { ... }`, inclusive bounds."""

    var: str
    start: Expr
    stop: Expr
    body: tuple["ModelStmt", ...]
    loc: Loc


@dataclass(frozen=True)
class CallStmt:
    call: Call
    loc: Loc


ModelStmt = Union[Assign, Repeat, CallStmt, ParamDecl]


@dataclass(frozen=True)
class ModelDef:
    name: str
    params: tuple[ParamDef, ...]
    stmts: tuple[ModelStmt, ...]
    loc: Loc


@dataclass(frozen=True)
class Module:
    """A parsed .gnn file."""

    file: str
    source: str
    layers: tuple[LayerDef, ...]
    models: tuple[ModelDef, ...]


class _Build(Transformer):
    """Parse tree -> AST; each node's Loc comes from its first token."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _loc(self, item) -> Loc:
        if isinstance(item, Token):
            return Loc(self.file, item.line, item.column)
        meta = getattr(item, "meta", None)
        if meta is not None and not meta.empty:
            return Loc(self.file, meta.line, meta.column)
        loc = getattr(item, "loc", None)
        if loc is not None:
            return loc
        return Loc(self.file, 1, 1)

    @v_args(meta=True)
    def start(self, meta, items):
        return list(items)

    def number(self, items):
        tok = items[0]
        text = str(tok)
        loc = self._loc(tok)
        try:
            if any(c in text for c in ".eE"):
                value: int | float = float(text)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError
            else:
                value = int(text)
        except ValueError:
            raise GnncSyntaxError(f"number {text[:20]!r} is out of range", loc) from None
        return Num(value, loc)

    def name(self, items):
        return Name(str(items[0]), self._loc(items[0]))

    def attr(self, items):
        return Attr(str(items[0]), str(items[1]), self._loc(items[0]))

    def _bin(op):  # noqa: N805 - a small factory for the four binary rules
        def rule(self, items):
            return BinOp(op, items[0], items[1], items[0].loc)
        return rule

    add = _bin("add")
    sub = _bin("sub")
    mul = _bin("mul")
    div = _bin("div")
    pow = _bin("pow")

    @v_args(meta=True)
    def neg(self, meta, items):
        return Neg(items[0], Loc(self.file, meta.line, meta.column))

    def kwarg(self, items):
        return Kwarg(str(items[0]), items[1], self._loc(items[0]))

    def args(self, items):
        return [i for i in items if i is not None]

    def layer_inputs(self, items):
        return ("inputs", items[0] if items and items[0] is not None else [])

    def call(self, items):
        name_tok, args, inputs = items
        args = args or []
        pos = tuple(a for a in args if not isinstance(a, Kwarg))
        kws = tuple(a for a in args if isinstance(a, Kwarg))
        seen_kw = False
        for a in args:
            if isinstance(a, Kwarg):
                seen_kw = True
            elif seen_kw:
                raise GnncSyntaxError("positional argument after a keyword argument", a.loc)
        ins = None
        in_kws: tuple[Kwarg, ...] = ()
        if inputs is not None:
            ins = tuple(a for a in inputs[1] if not isinstance(a, Kwarg))
            in_kws = tuple(a for a in inputs[1] if isinstance(a, Kwarg))
        return Call(str(name_tok), pos, kws, ins, self._loc(name_tok), in_kws)

    def param(self, items):
        name_tok, default = items
        return ParamDef(str(name_tok), default, self._loc(name_tok))

    def neg_default(self, items):
        return -items[0].value

    def name_default(self, items):
        tok = items[0]
        if str(tok) in ("true", "false"):
            return str(tok) == "true"
        raise GnncSyntaxError(
            f"a parameter default must be a number, true or false, not {str(tok)!r}", self._loc(tok))

    def params(self, items):
        out = []
        for p in items:
            if p is None:
                continue
            if isinstance(p.default, Num):
                p = ParamDef(p.name, p.default.value, p.loc)
            out.append(p)
        return out

    def layer_options(self, items):
        return [(str(t), self._loc(t)) for t in items]

    def layer_stmt(self, items):
        prim, target, expr = items
        return Stmt(str(prim), str(target), expr, self._loc(prim), self._loc(target))

    @v_args(meta=True)
    def param_decl(self, meta, items):
        name, shape, init = items
        return ParamDecl(str(name), tuple(shape or ()), init, Loc(self.file, meta.line, meta.column), self._loc(name))

    def param_shape(self, items):
        return [i for i in items if i is not None]

    def layer_def(self, items):
        name_tok, params, options, *stmts = items
        return LayerDef(str(name_tok), tuple(params or ()), tuple(options or ()),
                        tuple(stmts), self._loc(name_tok))

    def assign(self, items):
        return Assign(str(items[0]), items[1], self._loc(items[0]))

    def repeat(self, items):
        var, start, stop, *body = items
        return Repeat(str(var), start, stop, tuple(body), self._loc(var))

    def call_stmt(self, items):
        return CallStmt(items[0], items[0].loc)

    def model_def(self, items):
        name_tok, params, *stmts = items
        return ModelDef(str(name_tok), tuple(params or ()), tuple(stmts), self._loc(name_tok))


# What people call Lark's terminals in messages.
_TERMINAL_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "PRIMITIVE": "a primitive (scatter, gather, transform, sync, apply)",
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','", "EQUAL": "'='",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "DOT": "'.'", "__ANON_0": "'..'",
    "LAYER": "'layer'", "MODEL": "'model'", "WITH": "'with'", "REPEAT": "'repeat'", "IN": "'in'",
    "PARAM": "'param'", "LSQB": "'['", "RSQB": "']'",
    "$END": "the end of the file",
}


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, t.strip('"').lower() if t.startswith('"') else t) for t in expected})
    if set(expected) >= {"LAYER", "MODEL"} or expected == {"LAYER", "MODEL", "$END"}:
        return "'layer' or 'model'"
    if len(words) > 6:
        return "an expression or statement"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _found(tok: Token) -> str:
    if tok.type == "$END":
        return "the end of the file"
    return repr(str(tok))


def _syntax_error(err: UnexpectedInput, file: str, source: str) -> GnncSyntaxError:
    line = getattr(err, "line", None) or 1
    col = getattr(err, "column", None) or 1
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        lines = source.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
    loc = Loc(file, max(int(line), 1), max(int(col), 1))
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if 0 <= err.pos_in_stream < len(source) else "?"
        return GnncSyntaxError(f"unexpected character {ch!r}", loc, source)
    if isinstance(err, UnexpectedEOF):
        return GnncSyntaxError("unexpected end of file", loc, source)
    assert isinstance(err, UnexpectedToken)
    tok = err.token
    expected = set(err.expected)
    if tok.type == "NAME" and "PRIMITIVE" in expected:
        msg = (f"expected a primitive (scatter, gather, transform, sync, apply) to start a layer "
               f"statement, found {_found(tok)}")
    elif tok.type == "EQUAL" and expected == {"NAME"}:
        msg = "expected a name before '='"
    else:
        msg = f"expected {_describe_expected(expected)}, found {_found(tok)}"
    return GnncSyntaxError(msg, loc, source)


# The deepest parse tree a file may have. The transformer and elaboration recurse on the tree, so deeper
# input overflowed Python's stack: a traceback from elaboration (relu(...) nested 400 deep, a sum of 3000
# terms), or a message placed at 1:1. The examples' trees are 8-12 deep; 256 is 128 nested calls or a
# 250-term sum, and elaborates within Python's default recursion limit (it recursed past it at 800).
MAX_TREE_DEPTH = 256


def _check_nesting(tree: Tree, file: str, source: str) -> None:
    """GnncSyntaxError at the first part of the text (in reading order) nested deeper than MAX_TREE_DEPTH."""
    stack: list[tuple[Tree | Token, int]] = [(tree, 1)]
    while stack:  # depth first, in source order, without recursing (the point is not to overflow)
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            line, col = (node.line, node.column) if isinstance(node, Token) else (node.meta.line, node.meta.column)
            raise GnncSyntaxError(f"expression is nested too deeply (more than {MAX_TREE_DEPTH} levels of the "
                                  f"syntax tree); split it into several assignments", Loc(file, line, col), source)
        if isinstance(node, Tree):
            stack.extend((child, depth + 1) for child in reversed(node.children))


def parse(source: str, file: str = "<string>") -> Module:
    """Parse .gnn text into a Module, or raise GnncSyntaxError at file:line:col."""
    try:
        tree = parser().parse(source)
    except UnexpectedInput as err:
        raise _syntax_error(err, file, source) from None
    _check_nesting(tree, file, source)
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20000))  # the transformer recurses a few frames per level of the tree
        items = _Build(file).transform(tree)
    except VisitError as err:
        inner = err.orig_exc
        if isinstance(inner, GnncError):
            if inner.source is None:
                inner.source = source
            raise inner from None
        raise
    finally:
        sys.setrecursionlimit(limit)
    layers = tuple(i for i in items if isinstance(i, LayerDef))
    models = tuple(i for i in items if isinstance(i, ModelDef))
    return Module(file, source, layers, models)
