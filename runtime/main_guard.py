"""Whether a script that starts worker processes guards its top level with `if __name__ == "__main__":`.

Why this module exists: a 'spawn' (or 'forkserver') worker first imports the
parent's main module again, as `__mp_main__` (`multiprocessing.spawn`). A
script whose top level calls `gnnc.run(..., nproc=2)` outside the guard then
runs that call again in each worker, which dies before gnnc's code starts,
and all the launcher could say was "exited with status 1". The launcher asks
`unguarded_main_call` first and refuses such a call, naming the script's
line. Apart from `launch` (which imports torch) so that the check is cheap
to test and to reuse.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from gnnc.errors import GnncError


class UnguardedMainError(GnncError):
    """A script would start worker processes from its unguarded top level (bad input: exit 2)."""


def check_main_guard(nproc: int, start_method: str = "spawn") -> None:
    """Raise UnguardedMainError, naming the script's line, when starting workers from here would rerun it."""
    unguarded = unguarded_main_call()
    if unguarded is not None:
        file, line = unguarded
        raise UnguardedMainError(
            f"{file}:{line}: this line starts {nproc} worker processes, and the '{start_method}' start method "
            f"runs the main script again in each worker before it works, so every worker would reach this "
            f"line too and fail. Put the script's top-level code under `if __name__ == \"__main__\":` "
            f"(Python's multiprocessing guide, 'Safe importing of main module')")


def unguarded_main_call() -> tuple[str, int] | None:
    """(file, line) where the main script, at its top level and outside `if __name__ == "__main__":`, called
    into the code that asks; None when the call is guarded or when 'spawn' does not run the main module
    again: like multiprocessing, an interactive session or `python -c` (no file) and a package's
    `__main__` (`python -m gnnc`) are left alone.
    """
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    if main is None or file is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__"):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None  # not called from the script's top level (a thread, a function of a finished script)
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # nothing to read: let the launch go on rather than refuse on a guess
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _tests_main_name(node.test) and node.body and \
                node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
            return None
    return file, line


def _tests_main_name(test: ast.expr) -> bool:
    """Whether `test` is `__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(a, ast.Name) and a.id == "__name__" for a in sides) and \
        any(isinstance(b, ast.Constant) and b.value == "__main__" for b in sides)
