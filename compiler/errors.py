"""The one root of every error a user can cause.

The CLI catches `GnncError`, prints `str(err)` and exits 2. `InternalError` (an
IR invariant broken by a pass) is a bug in gnnc: the CLI says so and exits 1;
anything else is an internal error too (exit 1, with a traceback). Errors that point into a `.gnn`
file carry a `Loc` and render as `file:line:col: message`, the source line and
a caret under the offending column.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A position in a source file; lines and columns count from 1."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class GnncError(Exception):
    """A problem with the user's input: a message, and where it is if known.

    `exit_code` is what the CLI exits with after printing the message: 2 (bad
    input) unless a subclass reports a stopped or failed run (1).
    """

    exit_code: int = 2

    def __init__(self, message: str, loc: Loc | None = None, source: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.source = source

    def __str__(self) -> str:
        if self.loc is None:
            return self.message
        text = f"{self.loc}: {self.message}"
        source = self.source if self.source is not None else _read(self.loc.file)
        if source is not None:
            lines = source.splitlines()
            if 1 <= self.loc.line <= len(lines):
                line = lines[self.loc.line - 1].replace("\t", " ")
                text += f"\n  {line}\n  {' ' * (self.loc.col - 1)}^"
        return text


class GnncWarning(UserWarning):
    """Something in the user's input that is probably a mistake but does not stop the command.

    Rendered like an error (`file:line:col: warning: message`, the line and a
    caret); the CLI prints it to stderr that way, Python code sees a warning.
    """

    def __init__(self, message: str, loc: Loc | None = None, source: str | None = None):
        super().__init__(message)
        self.message, self.loc, self.source = message, loc, source

    def __str__(self) -> str:
        return str(GnncError(f"warning: {self.message}", self.loc, self.source)) if self.loc else \
            f"warning: {self.message}"


def _read(path: str) -> str | None:
    """The file an error points into, when it is a readable file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError, ValueError):
        return None


class InternalError(Exception):
    """A bug in gnnc, not in the user's input (never reported as bad input)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class GnncSyntaxError(GnncError):
    """The text does not parse."""


class GnncTypeError(GnncError):
    """The program parses but is ill-typed: unknown names, dims, misplaced ops."""


class GraphInputError(GnncError):
    """A graph file or spec is malformed; the message names the field."""


class PlanError(GnncError):
    """A plan directory is missing, corrupt or does not match its checksums."""


class OutOfSpace(GnncError):
    """A write failed for lack of space (disk or quota full): the machine's state, not bad input, so exit 1."""

    exit_code = 1


def write_failure(err: OSError, what: str) -> GnncError:
    """The error for an OSError met while writing `what` (a plan, a checkpoint, shards): out of space is exit 1,
    anything else (read-only, not a directory, no permission) names the path the user gave: exit 2."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return OutOfSpace(f"cannot write {what}: {reason}; free some space or write elsewhere (nothing was "
                          f"left half-written)")
    where = f" ({err.filename})" if err.filename else ""
    return GnncError(f"cannot write {what}: {reason}{where}")
