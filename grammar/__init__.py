"""The .gnn grammar and the one Lark parser built from it.

The parser is LALR(1) with the contextual lexer, so keywords such as `in` or
`with` stay usable as parameter names where the grammar expects a NAME, and
parse errors carry the exact line and column of the offending token.
"""
from __future__ import annotations

import functools
from pathlib import Path

from lark import Lark

GRAMMAR_PATH = Path(__file__).with_name("gnn.lark")


@functools.lru_cache(maxsize=1)
def parser() -> Lark:
    """The parser for .gnn text (built once; Lark parsers are reusable)."""
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", propagate_positions=True,
                maybe_placeholders=True)
