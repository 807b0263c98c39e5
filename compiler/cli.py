"""`gnnc`: the command line, a thin layer over gnnc.api.

Exit codes: 0 success, 2 the user's input is wrong (a message, never a
traceback), 1 an internal error. With `--json` the last line of stdout is one
JSON object summarising the command (docs/design.md section 9).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# only light modules here: every command, `gnnc --help` included, imports them (torch and sympy load later,
# in the commands that need them)
from gnnc.arg_types import SEED, THREADS, TIMEOUT, count_or_auto, memory_bytes, real_number, whole_number
from gnnc.errors import GnncError, GnncWarning, InternalError, write_failure
from gnnc.files import writable_file
from gnnc.passes.partition.methods import METHODS
from gnnc.passes.pipelines import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.precision import PRECISIONS
from gnnc.plan.schedules import SCHEDULES
from gnnc.plan.strategies import STRATEGIES, describe_assignment, names as strategy_names
from gnnc.host import use_huge_pages


def _sets(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        if "=" not in item:
            raise GnncError(f"--set {item}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _emit_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, sort_keys=True))


def cmd_check(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them (check needs neither, unless
    # it is given a graph)
    from gnnc.model_file import ModelErrors, check, load_model

    model = load_model(args.model, model=args.model_name, **_sets(args.set))
    graph = None
    if args.graph:
        from gnnc import api  # deferred: loading a graph needs torch

        graph = api.load_graph(args.graph)
    try:
        names = check(model, graph)
    except ModelErrors as err:  # every model's first error, each at its file:line:col
        for e in err.errors:
            print(f"error: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 2
    print(f"{args.model}: ok" + (f" ({len(names)} models: {', '.join(names)})" if len(names) > 1 else ""))
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc import api, inspect_plan
    from gnnc.passes.manager import parse_pipeline

    model = api.load_model(args.model, model=args.model_name, **_sets(args.set))
    graph = api.load_graph(args.graph) if args.graph else None
    names = parse_pipeline(args.passes) if args.passes else None
    printed = {spec.name for spec in parse_pipeline(args.print_after)} if args.print_after else set()

    def after(name, program):
        if name in printed:
            print(f"// ----- IR after {name} -----")
            print(program, end="")

    allow = args.allow.split(",") if args.allow else None
    # the device the plan is for: it picks the `local` profile; a GPU need not be here to compile for one
    device = _resolve_device(args.device, here=False)
    plan = api.compile(model, graph, workers=args.workers, passes=names, graph_spec=args.graph, after=after,
                       strategy=args.strategy, partition=args.partition, cluster=args.cluster, allow=allow,
                       memory_cap=args.memory_cap, precision=args.precision, device=device, explain=args.explain,
                       partition_from=args.partition_from, threads=args.threads, **_sampled_options(args))
    if args.explain:
        print(inspect_plan.explain(plan), end="")
    if args.output:
        plan.save(args.output)
        if not args.json and not printed:
            print(f"wrote {Path(args.output) / 'plan.json'}")
    if args.json:
        meta, planner = plan.meta, plan.meta.planner
        predicted_bytes = meta.predicted_bytes_per_epoch or meta.predicted_bytes_per_step
        _emit_json({"strategies": [layer.attr("strategy", "local") for layer in plan.program.graph_layers()],
                    "workers": plan.workers, "threads": plan.threads, "exact": not meta.approximations,
                    "approximations": list(meta.approximations), "passes": plan.passes,
                    "partition": meta.partition.to_json() if meta.partition else None, "schedule": meta.schedule,
                    "predicted": {**inspect_plan.predicted_epoch(plan),
                                  "bytes_per_epoch": sum((predicted_bytes or {}).values()),
                                  "eval_bytes_per_epoch": sum((meta.predicted_eval_bytes_per_epoch or {}).values()),
                                  "peak_memory_bytes": planner.predicted_memory_bytes if planner else None},
                    "alternatives": [{k: v for k, v in a.items() if k != "formulas"}
                                     for a in (planner.alternatives if planner else None) or []]})
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc import api
    from gnnc.inspect_plan import render

    plan = api.Plan.load(args.plan)
    if args.format in ("png", "gantt") and not args.output:  # before drawing: a terminal takes no PNG
        raise GnncError(f"--format {args.format} writes binary output; give -o FILE")
    if args.output:
        writable_file(args.output, "-o")
    text = render(plan, args.format, args.metrics)
    if args.output:
        mode = "wb" if isinstance(text, bytes) else "w"
        with open(args.output, mode) as f:
            f.write(text)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from gnnc.runtime.launch import until_signal  # deferred: launch loads torch

    if args.nproc is not None and args.nproc < 1:
        raise GnncError(f"--nproc must be at least 1, not {args.nproc}")
    return until_signal(lambda: _run(args))


def _resolve_device(spec: str, here: bool = True) -> str:
    from gnnc.runtime.device import resolve_device  # deferred: the device module loads torch

    return resolve_device(spec, here)


def _run(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc import api
    from gnnc.ir.ops import is_link_prediction
    from gnnc.plan_flags import check_run_flags
    from gnnc.runtime.launch import started_by_torchrun

    if not started_by_torchrun() or os.environ.get("RANK") == "0":  # rank 0 alone writes them
        for flag, path in (("--metrics", args.metrics), ("--dump-logits", args.dump_logits),
                           ("--save-model", args.save_model)):
            if path:
                writable_file(path, flag)  # now, not after training: a wrong path would lose the run
    if api.is_graph_dataset_spec(args.graph):  # graph classification keeps no vertex logits nor a saved model yet
        api.refuse_graph_flags(dump_logits=args.dump_logits, save_model=args.save_model)
    options: dict[str, Any] = {}
    if Path(args.target).is_dir():
        target = api.Plan.load(args.target)
        if args.set or args.model_name:
            raise GnncError(f"{'--set' if args.set else '--model'} applies to a .gnn model; recompile the plan "
                            f"to change it")
        check_run_flags(target, graph=args.graph, strategy=args.strategy, partition=args.partition, nproc=args.nproc,
                        fanout=args.fanout, batch_size=args.batch_size, schedule=args.schedule,
                        pipeline_groups=args.pipeline_groups)
        if args.memory_cap:
            raise GnncError("--memory-cap is decided when a plan is compiled; recompile it with --memory-cap")
    else:
        if not args.graph:
            raise GnncError("gnnc run MODEL.gnn needs --graph G")
        target = api.load_model(args.target, model=args.model_name, **_sets(args.set))
        options = {"nproc": args.nproc, "strategy": args.strategy, "partition": args.partition,
                   "memory_cap": args.memory_cap, **_sampled_options(args)}
    if args.resume and not args.checkpoint:
        raise GnncError("--resume needs --checkpoint DIR")
    if args.dump_logits or args.save_model:  # link prediction scores pairs: no vertex logits, no saved model yet
        program = target.program if isinstance(target, api.Plan) else target.program()
        if is_link_prediction(program):
            flag = "--dump-logits" if args.dump_logits else "--save-model"
            raise GnncError(f"{flag}: a link-prediction model scores vertex pairs; it keeps no vertex logits nor "
                            "a saved model yet (its metrics are in --json)")
    result = api.run(target, args.graph, epochs=args.epochs, seed=args.seed, lr=args.lr,
                     weight_decay=args.weight_decay, metrics=args.metrics, want_logits=bool(args.dump_logits),
                     progress=args.progress or (not args.no_progress and sys.stderr.isatty()),
                     device=args.device, precision=args.precision, threads=args.threads or "auto",
                     checkpoint_dir=args.checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume,
                     timeout_s=args.timeout, optimizer=args.optimizer, momentum=args.momentum,
                     lr_schedule=args.schedule_lr, warmup=args.warmup, clip=args.clip_grad,
                     lr_step_size=args.lr_step_size, lr_gamma=args.lr_gamma, lr_patience=args.lr_patience,
                     lr_factor=args.lr_factor, eval_every=args.eval_every, eval_chunk=args.eval_chunk, recompute=args.recompute or None,
                     **options)
    if result is None:
        return 0  # a rank other than 0 of a torchrun job: rank 0 reports
    if result.cpu_kernels not in ("", "compiled"):  # slower, never wrong: said once, not an error
        print(f"note: CPU kernels: {result.cpu_kernels}", file=sys.stderr)
    if result.cpu_allocator not in ("", "block cache"):  # as the kernels: slower, said once
        print(f"note: CPU allocator: {result.cpu_allocator}", file=sys.stderr)
    if args.dump_logits:
        import torch  # deferred: saving the logits needs torch (the run loaded it already)

        try:
            torch.save(result.logits, args.dump_logits)
        except OSError as err:
            raise write_failure(err, f"--dump-logits {args.dump_logits}") from None
    if args.save_model:
        from gnnc.saved_model import save_model  # deferred: as the run's modules above

        save_model(args.save_model, target, api.one_process_program(target, args.graph), result.weights,
                   result.graph)
    if args.json:
        _emit_json(result.to_json())
    else:
        print(f"{result.model} on {result.graph or args.graph} x{result.world_size} "
              f"({describe_assignment(result.strategies)}): {result.headline()}; "
              f"{result.epoch_time_s * 1000:.1f} ms/epoch")
    return 0


def _sampled_options(args: argparse.Namespace) -> dict[str, Any]:
    """--fanout/--batch-size (sampled minibatches), --schedule and --approximate, as api.compile takes them."""
    from gnnc.graph.sampling import SamplingConfig  # deferred: gnnc.graph loads torch

    if args.fanout is None and args.batch_size is not None:
        raise GnncError("--batch-size needs --fanout (full-graph training has no batches)")
    sampling = None if args.fanout is None else SamplingConfig.parse(args.fanout, args.batch_size)
    return {"sampling": sampling, "schedule": args.schedule, "approximate": args.approximate,
            "pipeline_groups": args.pipeline_groups}


def _add_sampled_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--fanout", metavar="K1,K2",
                   help="train sampled minibatches: in-neighbours sampled per vertex, hop by hop from the seeds "
                        "(25,10: 25 per seed, then 10 of each of those; -1: all), one per graph layer")
    c.add_argument("--batch-size", type=whole_number(1), metavar="B", help="seeds per minibatch (with --fanout)")
    c.add_argument("--schedule", choices=list(SCHEDULES),
                   help="step schedule: " + "; ".join(f"{s.name}: {s.summary}" + ("" if s.exact else " (approximate)")
                                                      for s in SCHEDULES.values()))
    c.add_argument("--approximate", action="store_true",
                   help="allow approximate strategies and schedules (" + ", ".join(
                       [n for n in STRATEGIES if not STRATEGIES[n].exact]
                       + [n for n in SCHEDULES if not SCHEDULES[n].exact]) + "): the planner may choose them "
                       "and --strategy/--schedule may name them")
    c.add_argument("--pipeline-groups", type=whole_number(0), default=0, metavar="G",
                   help="pipeline: G workers per stage, running it graph-parallel (default: the planner's choice, "
                        "or one per stage)")


def cmd_datasets(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc.graph.loaders import available_datasets

    for name, desc in available_datasets():
        print(f"{name:28s} {desc}")
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc.cluster import list_presets

    for name, desc in list_presets():
        print(f"{name:20s} {desc}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Measure this machine, or under torchrun the job's machines and links (api.probe), and show the profile."""
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc import api
    from gnnc.passes.cost.fit import describe_unit_costs

    done = api.probe(args.output, args.threads, args.device, network=args.network, base=args.base,
                     timeout_s=args.timeout)
    if done is None:
        return 0  # a rank other than 0 of `gnnc probe --network`: rank 0 writes the profile
    profile, path = done
    print(profile.to_json(), end="")  # stdout stays the profile's JSON, for scripts
    if not args.network:
        print(describe_unit_costs(profile), end="", file=sys.stderr)
    else:
        inter = [link for link in profile.links if not link.same_host] or list(profile.links)
        print(f"{len(profile.links)} links: bandwidth {min(x.bandwidth for x in inter) * 8 / 1e9:.3g}.."
              f"{max(x.bandwidth for x in inter) * 8 / 1e9:.3g} Gb/s, latency "
              f"{min(x.latency for x in inter) * 1e6:.0f}..{max(x.latency for x in inter) * 1e6:.0f} us "
              f"idle (profile: {profile.inter_bandwidth * 8 / 1e9:.3g} Gb/s, {profile.latency * 1e6:.0f} us per "
              f"message as a step's exchanges pay it)", file=sys.stderr)
        for c in profile.collectives:
            print(f"{c.op}: {c.bytes / 2**20:.0f} MiB per rank in {c.seconds * 1e3:.1f} ms, "
                  f"{c.bandwidth * 8 / 1e9:.3g} Gb/s sent per rank", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    # deferred: a command loads torch and the planner only when it needs them
    from gnnc.passes.manager import FACTS, passes
    from gnnc.passes.pipeline_text import format_value, option_fields, type_name

    for name, info in sorted(passes().items()):
        print(f"{name:16s} {info.summary}")
        if info.requires:
            print(f"{'':16s}   requires: {'; '.join(FACTS[r].description for r in info.requires)}")
        for field, kind, default, text in option_fields(info.options) if info.options else []:
            print(f"{'':16s}   {field}={format_value(default) or '<empty>'} ({type_name(kind)}): {text}")
    return 0


def load_plugins(names: list[str] | None) -> None:
    """Import user modules (a module name or a .py path) so their passes register."""
    import importlib
    import importlib.util

    for name in names or []:
        try:
            if name.endswith(".py"):
                spec = importlib.util.spec_from_file_location(Path(name).stem, name)
                if spec is None or spec.loader is None or not Path(name).is_file():
                    raise GnncError(f"--plugin {name}: no such file")
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except ImportError as err:
            raise GnncError(f"--plugin {name}: cannot import: {err}") from None


def _strategy_list(known: tuple[str, ...]):
    """An argparse type: comma-separated strategy names, each one of `known` (the registry's)."""
    def parse(text: str) -> str:
        for name in text.split(","):
            if name not in known:
                raise argparse.ArgumentTypeError(f"unknown strategy '{name}' (known: {', '.join(known)})")
        return text

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gnnc", description="Compile GNN programs into distributed plans and run them.")
    sub = p.add_subparsers(dest="command", required=True)
    plugin = argparse.ArgumentParser(add_help=False)
    plugin.add_argument("--plugin", action="append", metavar="MODULE",
                        help="import a module (or .py file) that registers passes; repeatable")

    model_choice = argparse.ArgumentParser(add_help=False)
    model_choice.add_argument("--model", dest="model_name", metavar="NAME",
                              help="the model of the file to use (default: the last one)")

    c = sub.add_parser("check", help="parse and type-check every model of a .gnn file (or the one --model names)",
                       parents=[plugin, model_choice])
    c.add_argument("model")
    c.add_argument("--graph", help="type-check for this graph: its feature, class and edge data widths")
    c.add_argument("--set", action="append", metavar="NAME=VALUE")
    c.set_defaults(fn=cmd_check)

    c = sub.add_parser("compile", help="compile a .gnn model for a graph into a plan directory",
                       parents=[plugin, model_choice])
    c.add_argument("model")
    c.add_argument("--graph")
    c.add_argument("-o", "--output")
    c.add_argument("--workers", type=count_or_auto(1), default=1, help="worker count, or 'auto' (up to the cluster's size)")
    c.add_argument("--cluster", help="a preset (gnnc clusters) or a profile JSON file")
    plannable = strategy_names(plannable=True)
    c.add_argument("--allow", type=_strategy_list(plannable), metavar="S1,S2",
                   help=f"strategies the planner may choose, comma-separated: {', '.join(plannable)}")
    c.add_argument("--explain", action="store_true", help="print the planner's alternatives and crossovers")
    c.add_argument("--strategy", type=_strategy_list(tuple(STRATEGIES)), metavar="S[,S...]",
                   help=f"one strategy for every graph layer, or one per layer: {', '.join(STRATEGIES)}")
    c.add_argument("--partition", choices=list(METHODS))
    c.add_argument("--partition-from", metavar="DIR",
                   help="compile after partitioning: the split a `gnnc partition --parts N -o DIR` wrote")
    c.add_argument("--memory-cap", type=memory_bytes, metavar="BYTES",
                   help="activation memory per worker (300M, 1.5G): layers run in G3's bins to stay under it")
    c.add_argument("--set", action="append", metavar="NAME=VALUE")
    c.add_argument("--passes", help="pass pipeline, comma-separated, options in braces, e.g. "
                                    "'infer-shapes,check,choose-strategy{allow=depcomm,hybrid}' (see `gnnc passes`); "
                                    f"default: {','.join(DEFAULT_PIPELINE)}, followed with --workers N>1 by "
                                    f"{','.join(DISTRIBUTED_PIPELINE)}")
    c.add_argument("--print-after", metavar="PASS[,PASS]")
    c.add_argument("--device", default="cpu", metavar="cpu|cuda|auto",
                   help="the device the plan will run on: `--cluster local` is its `gnnc probe --device` profile")
    c.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bytes predicted per exchanged element and the rates priced (fp32: 4 bytes, bf16/fp16: 2)")
    _add_sampled_flags(c)
    c.add_argument("--json", action="store_true")
    c.add_argument("--threads", type=THREADS, metavar="N",
                   help="processes the compile splits its per-worker steps over (default: the CPUs this process may "
                        "use, by its affinity mask and cgroup CPU quota)")
    c.set_defaults(fn=cmd_compile)

    c = sub.add_parser("inspect", help="show a plan")
    c.add_argument("plan")
    c.add_argument("--format", default="table",
                   choices=["table", "json", "ir", "dot", "png", "explain", "gantt", "trace"],
                   help="gantt: the predicted schedule as a PNG (needs -o); trace: the same as Chrome/Perfetto "
                        "trace JSON")
    c.add_argument("-o", "--output")
    c.add_argument("--metrics", metavar="RUN.jsonl",
                   help="with --format trace: lay the measured run (`gnnc run --metrics`) beside the prediction")
    c.set_defaults(fn=cmd_inspect)

    c = sub.add_parser("run", help="train a model (MODEL.gnn --graph G) or a plan (PLAN)",
                       parents=[plugin, model_choice])
    c.add_argument("target")
    c.add_argument("--graph")
    c.add_argument("--nproc", type=int, help="worker processes on this machine (default 1, or the plan's workers)")
    c.add_argument("--timeout", type=TIMEOUT, default=60.0, metavar="SECONDS",
                   help="stop the run when a rank makes no progress between collectives for this long "
                        "(default 60); the message names the hung rank")
    c.add_argument("--strategy", type=_strategy_list(tuple(STRATEGIES)), metavar="S[,S...]",
                   help=f"one strategy for every graph layer, or one per layer: {', '.join(STRATEGIES)}")
    c.add_argument("--partition", choices=list(METHODS))
    c.add_argument("--memory-cap", type=memory_bytes, metavar="BYTES",
                   help="activation memory per worker (300M, 1.5G): layers run in G3's bins to stay under it")
    c.add_argument("--set", action="append", metavar="NAME=VALUE")
    c.add_argument("--epochs", type=whole_number(1))
    c.add_argument("--seed", type=SEED, default=0)
    c.add_argument("--lr", type=real_number(0))
    c.add_argument("--weight-decay", type=real_number(0))
    c.add_argument("--optimizer", choices=("sgd", "adam", "adamw"),
                   help="torch.optim's SGD, Adam (the default) or AdamW, each with --weight-decay per group")
    c.add_argument("--momentum", type=real_number(0, 1), metavar="M", help="sgd's momentum, below 1 (default 0)")
    c.add_argument("--schedule-lr", choices=("none", "step", "cosine", "plateau"),
                   help="the learning rate over epochs: step (times --lr-gamma every --lr-step-size epochs), cosine "
                        "(to 0 at the last epoch), plateau (times --lr-factor after --lr-patience epochs without a "
                        "better validation accuracy); default none (constant)")
    c.add_argument("--lr-step-size", type=whole_number(1), metavar="EPOCHS", help="step's period (default 50)")
    c.add_argument("--lr-gamma", type=real_number(0, 1, positive=True), metavar="G", help="step's factor (default 0.1)")
    c.add_argument("--lr-patience", type=whole_number(0), metavar="EPOCHS", help="plateau's patience (default 10)")
    c.add_argument("--lr-factor", type=real_number(0, 1, positive=True), metavar="F",
                   help="plateau's factor, below 1 (default 0.1)")
    c.add_argument("--warmup", type=whole_number(0), metavar="EPOCHS",
                   help="linear warm-up from lr/(EPOCHS+1) to lr over the first EPOCHS epochs (default 0)")
    c.add_argument("--clip-grad", type=real_number(0, positive=True), metavar="NORM",
                   help="clip the summed gradients to this norm over the whole model (default: no clipping)")
    c.add_argument("--eval-every", type=whole_number(1), metavar="K",
                   help="evaluate every vertex after every K-th epoch only (and the first and last; default 1)")
    c.add_argument("--eval-chunk", type=whole_number(0), metavar="ROWS",
                   help="evaluate layer by layer in chunks of ROWS destination rows (about two [vertices, width] "
                        "tensors and a chunk at once); 0: whole layers; default: chunks where the whole evaluation "
                        "would not fit beside a run of several processes")
    c.add_argument("--recompute", action="store_true",
                   help="keep only each graph layer's inputs for the backward and run the layer again there: less "
                        "memory, one more forward pass per step (one process, full-graph)")
    c.add_argument("--metrics", metavar="FILE.jsonl")
    c.add_argument("--checkpoint", metavar="DIR", help="save model and optimizer state here every K epochs")
    c.add_argument("--checkpoint-every", type=whole_number(1), default=10, metavar="K")
    c.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint")
    c.add_argument("--dump-logits", metavar="FILE.pt")
    c.add_argument("--save-model", metavar="M", help="write the trained model (source, IR, graph schema, weights) "
                                                     "for `gnnc predict M` and gnnc.to_torch")
    c.add_argument("--device", default="cpu", metavar="cpu|cuda|auto",
                   help="cpu, cuda (exit 2 without a GPU; with --nproc N rank r takes GPU r and NCCL) or auto "
                        "(cuda when a GPU is present)")
    c.add_argument("--precision", choices=PRECISIONS,
                   help="fp32 (default, exact), bf16 or fp16: products in 16 bits under autocast, fp32 master "
                        "weights, fp16 with loss scaling; a plan runs at the precision it was compiled for")
    _add_sampled_flags(c)
    c.add_argument("--json", action="store_true")
    c.add_argument("--threads", type=THREADS, metavar="N",
                   help="threads per worker process (default: the CPUs this process may use, by its affinity mask "
                        "and cgroup CPU quota, shared between the --nproc workers; one for an epoch too small to "
                        "share; --json says why)")
    c.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(fn=cmd_run)

    c = sub.add_parser("datasets", help="list the graphs gnnc can name")
    c.set_defaults(fn=cmd_datasets)

    c = sub.add_parser("probe", help="measure this machine for the cost model (the 'local' cluster)")
    c.add_argument("-o", "--output", help="profile file (default: the place `--cluster local` reads)")
    c.add_argument("--threads", type=THREADS,
                   help="threads per worker to measure with (default: the CPUs this process may use, as gnnc run)")
    c.add_argument("--device", default="cpu", metavar="cpu|cuda|auto",
                   help="measure the CPU, or this machine's GPUs (rates, NCCL link, unit costs) with cuda/auto")
    c.add_argument("--network", action="store_true",
                   help="under torchrun: measure the links and collectives between the job's ranks (rank 0 "
                        "writes the profile of the job's machines)")
    c.add_argument("--base", metavar="PROFILE.json",
                   help="with --network: take each machine's own figures from this profile instead of measuring")
    c.add_argument("--timeout", type=TIMEOUT, default=60.0, metavar="SECONDS",
                   help="with --network: how long a rank waits for its peers")
    c.set_defaults(fn=cmd_probe)

    c = sub.add_parser("clusters", help="list the cluster presets")
    c.set_defaults(fn=cmd_clusters)

    c = sub.add_parser("passes", help="list the registered passes", parents=[plugin])
    c.set_defaults(fn=cmd_passes)

    try:
        # deferred: a command loads torch and the planner only when it needs them
        from gnnc import partition_cli
    except ImportError:
        partition_cli = None
    if partition_cli is not None:
        partition_cli.add_parser(sub)
    from gnnc import convert_cli  # its body imports the graph store when the command runs

    convert_cli.add_parser(sub)
    from gnnc import plot  # its body imports matplotlib when the command runs

    plot.add_parser(sub)
    from gnnc import predict_cli  # its body imports the saved model and torch when the command runs

    predict_cli.add_parser(sub)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """gnnc's warnings as `file:line:col: warning: ...` on stderr; the others as Python shows them."""
    if isinstance(message, GnncWarning):
        print(str(message), file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: list[str] | None = None) -> int:
    use_huge_pages()  # before torch's first allocation: it reads the setting once (gnnc.host)
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        load_plugins(getattr(args, "plugin", None))
        return int(args.fn(args) or 0)
    except GnncError as err:
        print(f"error: {err}" if err.loc is None else str(err), file=sys.stderr)
        return err.exit_code
    except InternalError as err:  # a pass broke the IR: a bug in gnnc, not bad input
        print(f"internal error (a bug in gnnc, please report it): {err.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
