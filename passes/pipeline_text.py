"""Pass options and the textual pipeline: `choose-strategy{allow=depcomm,hybrid strategy=},assign-strategy`.

A pass that takes options declares them as a frozen dataclass whose fields
carry a default and a one-line help (`option(default, help)`); the text
gives values in MLIR's syntax (`{key=value key=value}`, a list as
`a,b,c`), converted by the field's type, so a typo is an error that names
the pass, the option and the value, never an option silently ignored.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from gnnc.errors import GnncError


def option(default: Any, help: str) -> Any:
    """A pass option's field: its default and the one line `gnnc passes` prints for it."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("pass options are frozen: use a tuple for a list option")
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class PassSpec:
    """One pass of a pipeline: its name and its options (None when the pass takes none).

    `given` names the options the text set, which a caller's defaults
    (gnnc.compile's `allow`, `strategy`) do not override.
    """

    name: str
    options: Any = None
    given: frozenset[str] = frozenset()

    def __str__(self) -> str:
        if not self.given:
            return self.name
        return f"{self.name}{{{' '.join(f'{k}={format_value(getattr(self.options, k))}' for k in sorted(self.given))}}}"


def option_fields(options_type: type) -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, help) of every option of an options dataclass."""
    hints = typing.get_type_hints(options_type)
    return [(f.name, hints[f.name], f.default, f.metadata.get("help", "")) for f in dataclasses.fields(options_type)]


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def type_name(kind: Any) -> str:
    if typing.get_origin(kind) is tuple:
        return f"list of {typing.get_args(kind)[0].__name__}"
    return getattr(kind, "__name__", str(kind))


def convert(text: str, kind: Any, where: str) -> Any:
    """`text` as a value of `kind` (str, int, float, bool, or a tuple of one of those)."""
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return tuple(convert(t, item, where) for t in text.split(",") if t)
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise GnncError(f"{where}: expected true or false, got '{text}'")
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise GnncError(f"{where}: expected {type_name(kind)}, got '{text}'") from None


def split_pipeline(text: str) -> list[tuple[str, str | None]]:
    """(name, option text or None) per pass; commas inside braces belong to the options."""
    items: list[tuple[str, str | None]] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "{":
            depth += 1
            if depth > 1:
                raise GnncError(f"pipeline '{text}': nested '{{'")
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise GnncError(f"pipeline '{text}': '}}' without '{{'")
        elif ch == "," and depth == 0:
            item = text[start:i].strip()
            start = i + 1
            if not item:
                continue
            name, brace, rest = item.partition("{")
            if brace and not rest.endswith("}"):
                raise GnncError(f"pipeline '{text}': text after the options of '{name.strip()}'")
            items.append((name.strip(), rest[:-1] if brace else None))
    if depth:
        raise GnncError(f"pipeline '{text}': '{{' without '}}'")
    return items


def parse_options(pass_name: str, options_type: type | None, text: str | None) -> PassSpec:
    """The options of one pass from `key=value key=value` text (defaults for what it does not set)."""
    if text is None or not text.strip():
        return PassSpec(pass_name, options_type() if options_type else None)
    if options_type is None:
        raise GnncError(f"pass '{pass_name}' takes no options, got '{{{text}}}'")
    fields = {name: kind for name, kind, _, _ in option_fields(options_type)}
    values: dict[str, Any] = {}
    for pair in text.split():
        key, sep, raw = pair.partition("=")
        if not sep:
            raise GnncError(f"pass '{pass_name}': option '{pair}' must be KEY=VALUE")
        if key not in fields:
            raise GnncError(f"pass '{pass_name}' has no option '{key}' (options: {', '.join(fields)})")
        values[key] = convert(raw, fields[key], f"pass '{pass_name}', option '{key}'")
    return PassSpec(pass_name, options_type(**values), frozenset(values))


def with_values(spec: PassSpec, values: dict[str, Any]) -> PassSpec:
    """`spec` with the options it takes from `values`, except those its text set."""
    if spec.options is None:
        return spec
    names = {f.name for f in dataclasses.fields(spec.options)}
    take = {k: v for k, v in values.items() if k in names and k not in spec.given}
    return dataclasses.replace(spec, options=dataclasses.replace(spec.options, **take)) if take else spec
