"""`--device cpu|cuda|auto` for the benchmarks, resolved as `gnnc run` resolves it.

Why a module: every benchmark takes the flag and must refuse `cuda` on a
machine without a GPU the way the CLI does (one line, exit 2) before it
builds a graph or starts a subprocess.
"""
from __future__ import annotations

import argparse
import sys


def add_device_argument(parser: argparse.ArgumentParser, default: str = "cpu", extra: str = "") -> None:
    parser.add_argument("--device", default=default, metavar="cpu|cuda|auto" + extra,
                        help="where gnnc runs: cpu, cuda (exit 2 without a GPU) or auto (CUDA when present)")


def resolve_device_or_exit(spec: str) -> str:
    """`cpu` or `cuda`; without a GPU, `cuda` prints gnnc's one-line error and exits 2."""
    from gnnc.errors import GnncError  # deferred: the parser's --help needs neither gnnc nor torch
    from gnnc.runtime.device import resolve_device

    try:
        return resolve_device(spec)
    except GnncError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
