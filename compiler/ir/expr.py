"""Dim and number expressions read from text by gnnc's own grammar, never by evaluating it.

A plan is data: its IR text (dims such as `heads*hidden`, attribute values
such as `p=0.6` or `log(theta/3+1)`) comes from a file anyone can edit, and
`ir_sha256` is a checksum anyone can recompute. `sympy.sympify` of that text
runs Python (`x.__class__.__new__.__globals__...` reaches `os.system`), so
this module reads the text with a small recursive-descent parser and builds
every sympy object explicitly. It accepts exactly what the IR printer writes
for the expressions gnnc makes:

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/" | "//" | "%") unary)*
    unary  := ("-" | "+") unary | power
    power  := atom ("**" unary)?
    atom   := NUMBER | NAME | NAME "(" expr ("," expr)* ")" | "(" expr ")"

A NAME is a symbol (a model parameter); a call names one of `FUNCTIONS`.
Anything else is an `ExprSyntaxError` that names the field it was read for.
"""
from __future__ import annotations

import math
import re
from typing import Callable

import sympy

from gnnc.errors import GnncError

# what the printer writes for the functions an elaborated program can hold (constant folding of
# log/exp/abs/tanh) and for the integer arithmetic dims may use (`//`, `%`, min/max)
FUNCTIONS: dict[str, tuple[Callable[..., sympy.Expr], int | None]] = {
    "log": (sympy.log, 1), "exp": (sympy.exp, 1), "Abs": (sympy.Abs, 1), "tanh": (sympy.tanh, 1),
    "sqrt": (sympy.sqrt, 1), "floor": (sympy.floor, 1), "ceiling": (sympy.ceiling, 1),
    "Mod": (sympy.Mod, 2), "Min": (sympy.Min, None), "Max": (sympy.Max, None),
}
MAX_LENGTH = 2000  # longer than any dim or attribute the printer writes for a real model
MAX_DEPTH = 64  # nesting of parentheses and operators; keeps recursion far from Python's limit
MAX_EXPONENT = 1000  # of a literal's decimal exponent: sympy takes seconds to read 1e100000
# Every constant (a node without symbols) must be a finite float: nothing real is larger, and with each
# node's value bounded, sympy's exact arithmetic on the next one stays cheap (`floor(exp(exp(100)))` would
# otherwise run for minutes). A power is checked before sympy computes it: `9**9**9` has 370 million digits.
MAX_LOG2 = 1024  # log2 of the largest float

_TOKEN = re.compile(r"(?:(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>\*\*|//|[-+*/%(),]))")
_NOT_REAL = (sympy.zoo, sympy.nan, sympy.oo, -sympy.oo, sympy.I)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


class ExprSyntaxError(GnncError):
    """Text that is not a dim or number expression in gnnc's grammar."""


def parse_expr(text: str, what: str) -> sympy.Expr:
    """`text` as a sympy expression; `what` names the field in the error (`dim of %x`, `attribute p`)."""
    if not isinstance(text, str):
        raise ExprSyntaxError(f"{what}: expected an expression as text, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExprSyntaxError(f"{what}: expression of {len(text)} characters (at most {MAX_LENGTH})")
    return _Parser(text, what).parse()


class _Parser:
    def __init__(self, text: str, what: str) -> None:
        self.text, self.what = text, what
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, column)
        pos = _skip_space(text, 0)
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.error(f"unexpected {text[pos]!r}", pos)
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind), pos))
            pos = _skip_space(text, m.end())
        self.i = 0
        self.depth = 0

    def error(self, reason: str, col: int | None = None) -> ExprSyntaxError:
        where = f" at column {col + 1}" if col is not None else ""
        shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        return ExprSyntaxError(f"{self.what}: {shown!r} is not a dim or number expression: {reason}{where}")

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def expect(self, op: str) -> None:
        if self.take(op) is None:
            tok = self.peek()
            raise self.error(f"expected {op!r}", tok[2] if tok else len(self.text))

    def parse(self) -> sympy.Expr:
        if not self.tokens:
            raise self.error("empty")
        value = self.expr()
        tok = self.peek()
        if tok is not None:
            raise self.error(f"unexpected {tok[1]!r}", tok[2])
        if any(value.has(bad) for bad in _NOT_REAL):
            raise self.error("not a finite real number (a division by zero?)")
        return value

    def nested(self, rule: Callable[[], sympy.Expr]) -> sympy.Expr:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}")
        try:
            return rule()
        finally:
            self.depth -= 1

    def expr(self) -> sympy.Expr:
        value = self.nested(self.term)
        while (op := self.take("+", "-")) is not None:
            rhs = self.nested(self.term)
            value = self.apply(op, value, rhs)
        return value

    def term(self) -> sympy.Expr:
        value = self.nested(self.unary)
        while (op := self.take("*", "/", "//", "%")) is not None:
            rhs = self.nested(self.unary)
            value = self.apply(op, value, rhs)
        return value

    def unary(self) -> sympy.Expr:
        op = self.take("-", "+")
        if op is not None:
            operand = self.nested(self.unary)
            return -operand if op == "-" else operand
        base = self.nested(self.atom)
        if self.take("**") is None:
            return base
        return self.apply("**", base, self.nested(self.unary))

    def atom(self) -> sympy.Expr:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end", len(self.text))
        kind, text, col = tok
        self.i += 1
        if kind == "num":
            return self.number(text, col)
        if kind == "name":
            if self.take("(") is None:
                return sympy.Symbol(text)
            return self.call(text, col)
        if text == "(":
            value = self.nested(self.expr)
            self.expect(")")
            return value
        raise self.error(f"unexpected {text!r}", col)

    def number(self, text: str, col: int) -> sympy.Expr:
        if re.fullmatch(r"\d+", text):
            return self.finite(sympy.Integer(int(text)), col)  # MAX_LENGTH keeps int() within Python's limit
        exponent = re.search(r"[eE]([+-]?\d+)$", text)
        if exponent is not None and abs(int(exponent.group(1)[:6])) > MAX_EXPONENT:
            raise self.error("number out of range", col)
        # from the text, as sympify read it: the precision follows the digits the printer wrote
        return self.finite(sympy.Float(text), col)

    def call(self, name: str, col: int) -> sympy.Expr:
        if name not in FUNCTIONS:
            raise self.error(f"unknown function {name!r} (known: {', '.join(sorted(FUNCTIONS))})", col)
        fn, arity = FUNCTIONS[name]
        args = [self.nested(self.expr)]
        while self.take(",") is not None:
            args.append(self.nested(self.expr))
        self.expect(")")
        if arity is not None and len(args) != arity:
            raise self.error(f"{name} takes {arity} argument(s), got {len(args)}", col)
        return self.build(lambda: fn(*args), col)

    def apply(self, op: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        if op == "**" and not a.free_symbols and not b.free_symbols:
            base = abs(float(a))  # a constant is a finite float (`finite`)
            if base > 0 and abs(float(b) * math.log2(base)) > MAX_LOG2:
                raise self.error(f"the power {a}**{b} is out of range")
        build = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                 "//": lambda: sympy.floor(a / b), "%": lambda: sympy.Mod(a, b), "**": lambda: a ** b}[op]
        return self.build(build, None)

    def build(self, make: Callable[[], sympy.Expr], col: int | None) -> sympy.Expr:
        """Build one sympy node; sympy's own arithmetic errors (modulo by zero, ...) become ours."""
        try:
            value = make()
        except (ArithmeticError, ValueError, TypeError) as err:
            raise self.error(str(err) or type(err).__name__, col) from None
        if not isinstance(value, sympy.Expr):
            raise self.error(f"not a number ({type(value).__name__})", col)
        return value if value.free_symbols else self.finite(value, col)

    def finite(self, value: sympy.Expr, col: int | None) -> sympy.Expr:
        """`value`, a constant, if it is a finite real float (see MAX_LOG2)."""
        try:
            as_float = float(value)
        except OverflowError:
            raise self.error("out of range", col) from None
        except (TypeError, ValueError, ArithmeticError):  # complex, or sympy's PrecisionExhausted
            raise self.error("not a finite real number", col) from None
        if math.isinf(as_float):
            raise self.error("out of range", col)
        if math.isnan(as_float):
            raise self.error("not a finite real number", col)
        return value


def as_expr(value: int | float | sympy.Basic) -> sympy.Basic:
    """A number or sympy object as a sympy object, built explicitly: text must go through `parse_expr`.

    The places that used `sympy.sympify` on values built in code use this, so no path can hand
    text (from a plan or a file) to sympy's evaluating parser.
    """
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool):
        raise TypeError("a boolean is not an expression")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, float):
        return sympy.Float(value)
    raise TypeError(f"not a number or sympy expression: {type(value).__name__} (text goes through parse_expr)")
