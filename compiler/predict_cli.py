"""`gnnc predict M --graph G [--output logits|VALUE] -o OUT.npy`: run a model `gnnc run --save-model M` saved.

The command's parser apart from gnnc.saved_model, which loads torch: building gnnc's parser (`gnnc --help`,
`gnnc check`) must not.
"""
from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from gnnc.errors import write_failure
from gnnc.files import atomic_write


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `predict` on the CLI's subparsers."""
    c = subparsers.add_parser("predict", help="run a saved model (gnnc run --save-model) on a graph",
                              description="Compute every vertex's logits (or another vertex value of the IR) with "
                                          "a model saved by `gnnc run --save-model`, on the graph it was trained "
                                          "on or another with the same feature width, in one process.")
    c.add_argument("model", metavar="M", help="the file `gnnc run --save-model M` wrote")
    c.add_argument("--graph", required=True, help="the graph to predict on (any --graph spec)")
    c.add_argument("--output", default="logits", metavar="logits|VALUE",
                   help="what to write: the logits (default) or a vertex value of the IR, e.g. l0.h")
    c.add_argument("-o", dest="out", required=True, metavar="OUT.npy", help="where to write it (.npy)")
    c.add_argument("--json", action="store_true", help="end stdout with one JSON summary line")
    c.set_defaults(fn=run)
    return c


def run(args: argparse.Namespace) -> int:
    """Run `gnnc predict`; GnncError for bad input (the CLI exits 2 on it)."""
    import numpy as np  # deferred, as below

    # deferred: the api and the saved model load torch
    from gnnc.api import load_graph
    from gnnc.saved_model import load_saved, predict

    saved = load_saved(args.model)
    values = predict(saved, load_graph(args.graph), args.output)
    buf = io.BytesIO()
    np.save(buf, values)
    try:
        atomic_write(Path(args.out), buf.getvalue())
    except OSError as err:
        raise write_failure(err, f"-o {args.out}") from None
    print(f"wrote {args.out}: {args.output} of {args.graph}, {' x '.join(map(str, values.shape))} "
          f"({saved.program.name} trained on {saved.schema.get('graph', '?')})")
    if args.json:
        print(json.dumps({"output": args.out, "value": args.output, "shape": list(values.shape),
                          "graph": args.graph, "model": saved.program.name}, sort_keys=True))
    return 0
