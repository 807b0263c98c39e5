"""The argparse types of every numeric flag of `gnnc` (`cli` and `partition_cli` use only these).

Why this module exists: Python's `int` and `float` accept text no run can use
(`inf`, `nan`, `1e400`, integers past int64) and the bad value then surfaced
deep inside a run as a traceback (`--memory-cap 1e400`: OverflowError;
`--seed 100000000000000000000000`: torch's "Overflow when unpacking long
long"). Each type here checks its text once, at parse time: a number that is
finite, within the flag's range and, for a count, written as a whole number.
argparse then reports the flag by name and exits 2 ("argument --seed: ...").
"""
from __future__ import annotations

import argparse
import math
import re
from typing import Callable

INT64_MAX = (1 << 63) - 1  # the counts and seeds reach torch and numpy as int64
_WHOLE = re.compile(r"[+-]?\d+")


def whole_number(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """A type for an integer flag in [low, high], written as digits (`1.5`, `1e3` and `inf` are refused)."""
    def parse(text: str) -> int:
        text = text.strip()
        if not _WHOLE.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected a whole number, not '{text}'")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(_out_of_range(low, high, value, text))
        return value

    return parse


def real_number(low: float, high: float = math.inf, positive: bool = False) -> Callable[[str], float]:
    """A type for a float flag: finite, in [low, high], and above 0 when `positive`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not '{text}'") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, not '{text}'")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(_out_of_range(low, high, value, text))
        return value

    return parse


def count_or_auto(low: int, high: int = INT64_MAX) -> Callable[[str], int | str]:
    """A type for a count that may also be the word `auto` (compile's --workers)."""
    count = whole_number(low, high)

    def parse(text: str) -> int | str:
        if text.strip() == "auto":
            return "auto"
        try:
            return count(text)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} (or 'auto')") from None

    return parse


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_BYTES = 1 << 60  # an exbibyte: past any machine, and still exact as an int64 in the planner's sums


def memory_bytes(text: str) -> int:
    """A type: bytes, as a number with an optional K, M, G or T (binary) suffix: 300M, 1.5G."""
    unit = text[-1:].upper() if text[-1:].upper() in _UNITS and not text[-1:].isdigit() else ""
    try:
        value = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"expected a number of bytes (300M, 1.5G), not '{text}'")
    if value > MAX_BYTES:
        raise argparse.ArgumentTypeError(f"'{text}' is more than 2^60 bytes (1024T)")
    return int(value)


# the seeds every generator takes (torch's, numpy's) are non-negative int64
SEED = whole_number(0)
# threads per process (gnnc run, gnnc probe): torch takes a C int; 4096 is past any machine
THREADS = whole_number(1, 4096)
# threading and torch.distributed take a finite wait; 1e7 s (16 weeks) is past any run's silence
TIMEOUT = real_number(0, 1e7, positive=True)


def _out_of_range(low: float, high: float, value: float, text: str) -> str:
    def say(bound: float) -> str:
        return f"{bound:g}" if isinstance(bound, float) else str(bound)

    return f"must be at least {say(low)}, not {text}" if value < low else f"must be at most {say(high)}, not {text}"
