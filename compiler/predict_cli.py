"""`gnnc predict M --graph G [--output logits|VALUE] [--nproc N] -o OUT.npy`: run a model `gnnc run --save-model M`
saved.

In one process it runs gnnc.saved_model.predict (the model as gnnc.to_torch's module). With `--nproc N` the saved
model is compiled for N workers on G, as `gnnc run MODEL.gnn --nproc N` compiles it (the planner's strategies,
the partition, the shards), and started by the launcher `gnnc run` uses (gnnc.runtime.launch): each rank runs
one forward pass in evaluation mode on its rows with the saved weights and rank 0 writes every vertex's row in
global order (gnnc.runtime.predict). The values are the one process's, to float rounding. On a graph larger than
gnnc.runtime.predict.CHUNK_ROWS vertices both evaluate the layers layer-wise, in chunks of rows
(gnnc.runtime.layerwise), unless the value asked for is computed inside a layer. The graph's labels
and masks play no part: the shards get stand-ins (no label, empty masks), so a new graph needs none.

The command's parser apart from gnnc.saved_model, which loads torch: building gnnc's parser (`gnnc --help`,
`gnnc check`) must not.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from gnnc.arg_types import TIMEOUT, whole_number
from gnnc.errors import GnncError
from gnnc.files import writable_file


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `predict` on the CLI's subparsers."""
    c = subparsers.add_parser("predict", help="run a saved model (gnnc run --save-model) on a graph",
                              description="Compute every vertex's logits (or another vertex value of the IR) with "
                                          "a model saved by `gnnc run --save-model`, on the graph it was trained "
                                          "on or another with the same feature width, in one process or on "
                                          "--nproc N.")
    c.add_argument("model", metavar="M", help="the file `gnnc run --save-model M` wrote")
    c.add_argument("--graph", required=True, help="the graph to predict on (any --graph spec)")
    c.add_argument("--output", default="logits", metavar="logits|VALUE",
                   help="what to write: the logits (default) or a vertex value of the IR, e.g. l0.h")
    c.add_argument("-o", dest="out", required=True, metavar="OUT.npy", help="where to write it (.npy)")
    c.add_argument("--nproc", type=whole_number(1), default=1, metavar="N",
                   help="worker processes on this machine, each computing its vertices' rows (default 1)")
    c.add_argument("--timeout", type=TIMEOUT, default=60.0, metavar="SECONDS",
                   help="with --nproc: stop when a rank makes no progress for this long (default 60)")
    c.add_argument("--json", action="store_true", help="end stdout with one JSON summary line")
    c.set_defaults(fn=run)
    return c


def run(args: argparse.Namespace) -> int:
    """Run `gnnc predict`; GnncError for bad input (the CLI exits 2 on it), 128 + N after signal N."""
    from gnnc.runtime.launch import until_signal  # deferred: launch loads torch

    return until_signal(lambda: _predict(args))  # ranks stopped, temporary shards removed, as `gnnc run`


def _predict(args: argparse.Namespace) -> int:
    # deferred: the api, the saved model and the predict runtime load torch
    from gnnc.api import load_graph
    from gnnc.runtime.predict import write_array
    from gnnc.saved_model import load_saved, predict

    writable_file(args.out, "-o")  # now, not after the work: a wrong path would lose it
    saved = load_saved(args.model)
    graph = load_graph(args.graph)
    if args.nproc > 1:
        shape = predict_on_ranks(saved, graph, args.output, args.nproc, args.out, args.timeout)
    else:
        values = predict(saved, graph, args.output)
        shape = list(values.shape)
        write_array(args.out, values)
    on = f" on {args.nproc} processes" if args.nproc > 1 else ""
    print(f"wrote {args.out}: {args.output} of {args.graph}{on}, {' x '.join(map(str, shape))} "
          f"({saved.program.name} trained on {saved.schema.get('graph', '?')})")
    if args.json:
        print(json.dumps({"output": args.out, "value": args.output, "shape": shape, "graph": args.graph,
                          "model": saved.program.name, "nproc": args.nproc}, sort_keys=True))
    return 0


def predict_on_ranks(saved: Any, graph: Any, output: str, nproc: int, out: str, timeout_s: float) -> list[int]:
    """`gnnc predict --nproc N`: the saved model compiled for `nproc` workers on `graph`, one process per worker;
    rank 0 writes `output`'s rows of every vertex to `out`. Returns the array's shape."""
    import dataclasses
    import tempfile
    import warnings

    import torch

    # deferred: the api, the planner and the runtime load torch
    from gnnc import api
    from gnnc.frontend.syntax import parse
    from gnnc.graph.storage import UNLABELLED
    from gnnc.ir.dims import eval_dim
    from gnnc.ir.ops import op_def
    from gnnc.model_file import Model
    from gnnc.plan.strategies import names
    from gnnc.runtime.executor import loss_op
    from gnnc.runtime.launch import launch
    from gnnc.runtime.predict import PredictJob, chunk_rows, in_feature_phase, predict_rank
    from gnnc.saved_model import check_fits
    from gnnc.torch_module import param_shapes

    program = saved.program
    value = check_fits(saved, graph, output)
    if value in {v.name for v in program.inputs} and value != program.inputs[0].name:
        raise GnncError(f"--output {output}: a graph input (the graph's own data), which the ranks do not hold "
                        "with --nproc; read it from the graph")
    if nproc > graph.num_nodes:  # every worker owns at least one vertex
        raise GnncError(f"--nproc {nproc}: more workers than the graph's {graph.num_nodes} vertices")
    src = saved.source
    if not isinstance(src.get("source"), str):
        raise GnncError("the saved model holds no model source to compile for --nproc; predict in one process")
    model = Model(parse(src["source"], str(src.get("file") or "model.gnn")),
                  tuple((k, str(v)) for k, v in program.config), src.get("name"))
    # Labels and masks are a training run's: stand-ins (no label, no vertex in a mask) let any graph of the
    # feature width be split into shards, labelled or not, of as many classes as it has.
    n = graph.num_nodes
    width = eval_dim(program.logits.type.shape[0], program.config_dict())
    y = (torch.full((n, width), float("nan")) if op_def(loss_op(program)).loss == "targets"
         else torch.full((n,), UNLABELLED, dtype=torch.int64))
    empty = torch.zeros(n, dtype=torch.bool)
    unlabelled = dataclasses.replace(graph, y=y, train_mask=empty, val_mask=empty, test_mask=empty, stand_ins={})

    def plan_for(allow: list[str] | None):
        with warnings.catch_warnings():  # the stand-in labels match none of the logits: said of no real graph
            warnings.filterwarnings("ignore", message=".*never match a label")
            return api.compile(model, unlabelled, workers=nproc, allow=allow)

    plan = plan_for(None)
    if plan.program.logits.name != program.logits.name or value not in _values(plan.program):
        raise GnncError(f"--output {output}: the model compiled for {nproc} workers holds no value {value}; "
                        "predict it in one process")
    if value in in_feature_phase(plan.program):  # P3's slices or partial sums up to its pull, not rows
        plan = plan_for([s for s in names(plannable=True, exact=True, batching="full") if s != "pushpull"])
    if param_shapes(plan.program) != param_shapes(program):
        raise GnncError("the saved weights are not those of the model compiled for --nproc (its source or "
                        "settings changed); predict in one process")
    threads = api.thread_settings(None, nproc)["threads"]
    with tempfile.TemporaryDirectory(prefix="gnnc-predict-") as tmp:
        plan.write_shards(tmp)
        plan.graph = None  # the ranks read their shards
        job = PredictJob(str(plan.program), tmp, dict(saved.weights), value, str(out), threads,
                         chunk_rows(plan.program, n, value))
        results = launch(predict_rank, nproc, job, timeout_s=timeout_s)
    return list(results[0]["shape"])


def _values(program: Any) -> set[str]:
    return {v.name for v in program.inputs} | {o.name for layer in program.layers for e in layer.eqns
                                                for o in e.outs}
