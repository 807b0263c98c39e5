"""Renderings of a plan for people: a table of layers, the IR, JSON, DOT of the dataflow, and the
predicted schedule as a Gantt chart (PNG) or a Chrome/Perfetto trace.

The schedule views draw what the planner stored in the plan (`planner.schedule`, written by
`gnnc.passes.cost.schedule.predicted_schedule`), never a re-estimate: a chart that recomputed the
costs could silently disagree with the prediction the plan was chosen on. A trace can carry a
measured run beside the prediction (`--metrics RUN.jsonl` from `gnnc run --metrics`), on other
process ids, so Perfetto shows both on one time axis.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir.ops import COMM_OPS
from gnnc.ir.ops import fmt_shape
from gnnc.plan.plan_meta import PlannerRecord
from gnnc.plan.strategies import describe_assignment
from gnnc.runtime.metrics import epoch_records, read_metrics


def table(program: Program) -> str:
    rows = [("layer", "kind", "op", "edges", "strategy", "out", "params", "ops")]
    for layer in program.layers:
        out = ", ".join(fmt_shape(v.type.shape) if v.type else "?" for v in layer.outputs) or "-"
        params = " ".join(f"{p.value.name.split('.', 1)[-1]}{fmt_shape(p.value.type.shape) if p.value.type else ''}"
                          for p in layer.params) or "-"
        ops = " ".join(e.op for e in layer.eqns)
        rows.append((layer.name, layer.kind, layer.op or "-", layer.edges if layer.kind == "graph" else "-",
                     layer.attr("strategy", "local"), out, params, ops))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    cfg = ", ".join(f"{k}={v}" for k, v in program.config)
    return f"model {program.name}({cfg})\n" + "\n".join(lines) + "\n"


def dot(program: Program) -> str:
    """Dataflow between values: one node per equation, clustered by layer."""
    lines = ["digraph plan {", "  rankdir=TB;", '  node [shape=box, fontname="Helvetica", fontsize=10];']
    producer: dict[str, str] = {v.name: f"in_{v.name}" for v in program.inputs}
    for v in program.inputs:
        lines.append(f'  "in_{v.name}" [label="{v.name}", shape=ellipse];')
    for layer in program.layers:
        lines.append(f'  subgraph "cluster_{layer.name}" {{')
        label = f"{layer.name}: {layer.op}" if layer.kind == "graph" else f"{layer.name} (dense)"
        lines.append(f'    label="{label} [{layer.attr("strategy", "local")}]";')
        for i, e in enumerate(layer.eqns):
            node = f"{layer.name}_{i}"
            lines.append(f'    "{node}" [label="{e.op}\\n{e.outs[0].name}"];')
            for o in e.outs:
                producer[o.name] = node
        lines.append("  }")
    for layer in program.layers:
        for i, e in enumerate(layer.eqns):
            for v in e.ins:
                if v.name in producer:
                    lines.append(f'  "{producer[v.name]}" -> "{layer.name}_{i}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def png(program: Program) -> bytes:
    """The dataflow drawn with matplotlib: one column per layer, one box per equation, arrows for values."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    pos: dict[str, tuple[float, float]] = {}
    boxes = []
    colors = {"graph": "#dbe9f6", "dense": "#eeeeee"}

    comm_ops = set(COMM_OPS)
    for col, layer in enumerate(program.layers):
        for row, e in enumerate(layer.eqns):
            xy = (col * 3.0, -row * 1.0)
            color = "#f6d7c3" if e.op in comm_ops else colors[layer.kind]
            boxes.append((xy, e.op, color))
            for o in e.outs:
                pos[o.name] = xy
    for v in program.inputs:
        pos.setdefault(v.name, (-3.0, -list(program.inputs).index(v) * 1.0))
    height = max(1, max(len(layer.eqns) for layer in program.layers))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(program.layers) * 2.2), max(3, 0.55 * height + 1.5)))
    for layer in program.layers:
        for e in layer.eqns:
            end = pos[e.outs[0].name]
            for v in e.ins:
                if v.name in pos:
                    start = pos[v.name]
                    ax.annotate("", xy=(end[0] - 0.9, end[1]), xytext=(start[0] + 0.9, start[1]),
                                arrowprops={"arrowstyle": "->", "color": "#888888", "lw": 0.7})
    for (x, y), label, color in boxes:
        ax.add_patch(FancyBboxPatch((x - 0.9, y - 0.3), 1.8, 0.6, boxstyle="round,pad=0.05", fc=color, ec="#555555"))
        ax.text(x, y, label, ha="center", va="center", fontsize=8)
    for col, layer in enumerate(program.layers):
        title = f"{layer.name} {layer.op}" if layer.kind == "graph" else f"{layer.name} (dense)"
        strategy = layer.attr("strategy")
        ax.text(col * 3.0, 0.8, title + (f"\n[{strategy}]" if strategy else ""), ha="center", fontsize=9,
                weight="bold")
    for v in program.inputs:
        x, y = pos[v.name]
        ax.text(x, y, v.name, ha="center", va="center", fontsize=8, style="italic")
    ax.set_xlim(-4, 3.0 * len(program.layers))
    ax.set_ylim(-height - 0.5, 1.6)
    ax.axis("off")
    ax.set_title(f"{program.name}: dataflow (orange: communication)", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def explain(plan) -> str:
    """Strategies per graph layer, with the planner's alternatives when it recorded them, and why it chose."""
    lines = [f"plan for {plan.workers} worker(s)"]
    part = plan.meta.partition
    if part:
        lines[0] += f", {part.method} partition"
    names = [layer.name for layer in plan.program.graph_layers()]
    for layer in plan.program.graph_layers():
        lines.append(f"  {layer.name} {layer.op}: {layer.attr('strategy', 'local')}"
                     + ("" if plan.workers > 1 else " (one worker)"))
    sampling = plan.sampling
    if sampling is not None:
        lines.append(f"sampled minibatches: fan-out {sampling.text} (hop order), batch {sampling.batch_size}, "
                     f"schedule {plan.schedule}")
    for note in plan.meta.approximations:
        lines.append(f"approximate: {note}")
    planner = plan.meta.planner
    if planner:
        cluster = planner.cluster
        lines.append(f"chosen by the planner on {f'cluster {cluster!r}' if cluster else 'an unnamed cluster profile'}"
                     f": predicted {planner.predicted_time_s * 1000:.3f} ms/epoch, "
                     f"{planner.predicted_memory_bytes / 2**20:.1f} MiB/worker")
        alternatives = sorted(planner.alternatives or [], key=lambda a: a["time_s"])
        rows = [(describe_assignment(a["strategies"]) + (f" [{a['schedule']}]" if "schedule" in a else ""),
                 f"{a['time_s'] * 1000:.3f}", f"{a['bytes'] / 1e6:.3f}", f"{a['memory_bytes'] / 2**20:.1f}",
                 (" <- chosen" if a["strategies"] == planner.strategies
                  and a.get("schedule", plan.schedule) == plan.schedule else "")
                 + (f" (user cost: {'; '.join(a['user_costs'])})" if a.get("user_costs") else "")
                 + (" (approximate: " + "; ".join(a["approximate"]) + ")" if a.get("approximate") else ""))
                for a in alternatives]
        lines += _columns(("strategies", "time ms", "MB/epoch", "MiB/worker"), rows)
        lines += _why(planner, alternatives, names)
        if planner.crossovers is None:  # found only when asked for: they cost more than the choice
            lines.append("  crossovers: not recorded in this plan (gnnc compile --explain finds them)")
        for c in planner.crossovers or []:
            lines.append(f"  crossover: {c}")
        lines += _segment_table(planner, names)
    lines += _schedule_lines(plan.meta.schedule_report, names)
    lines += _pipeline_lines(plan.meta.pipeline)
    considered = plan.meta.workers_considered
    if considered:
        lines.append("workers considered: " + ", ".join(
            f"{c.workers}: {c.time_s * 1000:.3f} ms" if c.time_s is not None else f"{c.workers}: -"
            for c in considered))
    return "\n".join(lines) + "\n"


def _pipeline_lines(pipeline: dict | None) -> list[str]:
    """The pipeline a plan runs: stages, groups, chunks, GPipe's bubble, the history it reads."""
    if not pipeline:
        return []
    bubble = pipeline["bubble"]
    split = ", ".join(f"{a}..{z - 1}" for a, z in pipeline["split"])
    return [f"pipeline: {pipeline['stages']} stages of {pipeline['groups']} worker(s) (graph layers {split}), "
            f"{pipeline['chunks']} chunks; bubble: each pass takes {bubble['stretch']:.3f}x its stages' work "
            f"({bubble['idle_fraction']:.1%} idle); {pipeline['history_reads_per_layer']} history rows read per "
            f"layer and epoch, refreshed every {pipeline['history_every']} epochs"]


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int = 1) -> list[str]:
    """A table indented by two: the first `left` columns (names) left-aligned, the numbers right-aligned,
    each column as wide as its widest cell (a 64-layer model's names must not push the numbers out of
    their columns); a last cell beyond the header (a mark) follows unaligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        out = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return ("  " + "  ".join(out) + "".join(cells[len(header):])).rstrip()

    return [line(header)] + [line(r) for r in rows]


_SEGMENT_KEY = re.compile(r"^([\w-]+)\[(\d+):(\d+)\]$")  # an alternative's formula key: strategy[start:end]


def _why(planner: PlannerRecord, alternatives: list[dict], names: list[str]) -> list[str]:
    """Why the chosen assignment won: against the next fastest, where their times differ segment by segment,
    and which faster assignments the memory cap ruled out (the DP takes the fastest that fits)."""
    chosen = next((a for a in alternatives if a["strategies"] == planner.strategies), None)
    if chosen is None or len(alternatives) < 2:
        return []
    tol = 1e-12 * max(chosen["time_s"], 1e-30)
    faster = [a for a in alternatives if a["time_s"] < chosen["time_s"] - tol]
    slower = [a for a in alternatives if a is not chosen and a not in faster]
    what = describe_assignment(chosen["strategies"])
    lines = []
    if slower:
        nxt = slower[0]
        ratio = nxt["time_s"] / chosen["time_s"] if chosen["time_s"] > 0 else float("inf")
        lines.append(f"why {what}: the fastest assignment that fits in memory, {ratio:.2f}x faster than the next, "
                     f"{describe_assignment(nxt['strategies'])}")
        costs = {(tuple(c["layers"]), c["strategy"]): c["time_s"] for c in planner.segment_costs or []}
        for label, alt in (("chosen", chosen), ("next", nxt)):
            parts = _segment_times(alt, costs, names)
            if parts is not None:
                lines.append(f"  {label + ':':8s}{parts}")
    else:
        lines.append(f"why {what}: the only assignment that fits in memory")
    for a in faster:
        lines.append(f"  ruled out by the memory cap: {describe_assignment(a['strategies'])} would take "
                     f"{a['time_s'] * 1000:.3f} ms/epoch but needs {a['memory_bytes'] / 2**20:.1f} MiB/worker")
    return lines


def _segment_times(alt: dict, costs: dict, names: list[str]) -> str | None:
    """`l0..l6 depcache 0.142 ms + l7 depcomm 0.405 ms + 1.300 ms all-reduce, optimizer and layout changes =
    1.847 ms` for one alternative, from its segments (the keys of its formulas) and the planner's segment costs; None when
    the plan did not record them."""
    segments = []
    for key in alt.get("formulas") or {}:
        m = _SEGMENT_KEY.match(key)
        if m is None:
            return None
        segments.append((int(m.group(2)), int(m.group(3)), m.group(1)))
    if not segments or any(((a, b), s) not in costs for a, b, s in segments):
        return None
    parts = []
    for a, b, s in sorted(segments):
        span = names[a] if b == a + 1 else f"{names[a]}..{names[b - 1]}"
        parts.append(f"{span} {s} {costs[(a, b), s] * 1000:.3f} ms")
    rest = alt["time_s"] - sum(costs[(a, b), s] for a, b, s in segments)
    return (" + ".join(parts) + f" + {rest * 1000:.3f} ms all-reduce, optimizer and layout changes = "
            f"{alt['time_s'] * 1000:.3f} ms")


def _segment_table(planner: PlannerRecord, names: list[str]) -> list[str]:
    """Every strategy the planner priced for each layer (single-layer segments) and for each longer span."""
    costs = planner.segment_costs or []
    if not costs:
        return []
    chosen = {(a, b, s) for a, b, s in planner.segments or []}
    rows = []
    for c in sorted(costs, key=lambda c: (c["layers"][1] - c["layers"][0], c["layers"][0], c["time_s"])):
        a, b = c["layers"]
        span = names[a] if b == a + 1 else f"{names[a]}..{names[b - 1]}"
        rows.append((span, c["strategy"], f"{c['time_s'] * 1000:.3f}", f"{c['bytes'] / 1e6:.3f}",
                     f"{c['memory_bytes'] / 2**20:.1f}", " <- chosen" if (a, b, c["strategy"]) in chosen else ""))
    return ["per layer and segment, evaluation pass included (before the gradient all-reduce, the optimizer and "
            "layout transitions):",
            *_columns(("layers", "strategy", "time ms", "MB/epoch", "MiB/worker"), rows, left=2)]


def _options_text(options: dict[str, Any]) -> str:
    words = {"overlap": ("overlapped", "not overlapped"), "staged": ("staged", "gathered")}
    parts = [words[k][0 if v else 1] for k, v in options.items() if k in words]
    if options.get("chunked"):  # (said only where on: a halo's remote rows come whole otherwise)
        parts.append("in chunks per peer")
    if options.get("bins", 1) > 1:
        parts.append(f"{options['bins']} bins")
    return ", ".join(parts) or "-"


def _schedule_lines(schedule: dict | None, names: list[str]) -> list[str]:
    """What the schedule pass compared and chose, per segment, for the gradient all-reduce and the memory cap."""
    if not schedule:
        return []
    head = "schedule"
    if schedule.get("predicted_time_s") is not None:
        head += f" (predicted {schedule['predicted_time_s'] * 1000:.3f} ms/epoch)"
    lines = [head + ":"]
    for seg in schedule.get("segments", []):
        a, b = seg["layers"]
        span = names[a] if b == a + 1 else f"{names[a]}..{names[b - 1]}"
        alts = " | ".join(f"{_options_text(alt['options'])} {alt['time_s'] * 1000:.3f} ms" if "time_s" in alt
                          else _options_text(alt["options"]) for alt in seg.get("alternatives", []))
        line = f"  {span:14s} {seg['strategy']:10s} {_options_text(seg['options'])}"
        if len(seg.get("alternatives", [])) > 1 or seg["options"].get("bins", 1) > 1:
            line += f"  (priced: {alts})"
        if seg.get("why"):
            line += f"; {seg['why']}"
        lines.append(line)
    grad = schedule.get("grad_alternatives")
    if grad is not None:
        priced = ", ".join(f"{'during' if g['grad_overlap'] else 'after'} backward {g['time_s'] * 1000:.3f} ms"
                           for g in grad)
        lines.append(f"  gradient all-reduce: {schedule.get('grad_buckets', 1)} bucket(s), "
                     f"{'during' if schedule.get('grad_overlap') else 'after'} backward (epoch: {priced})")
    if schedule.get("activation_bytes") is not None:
        cap = schedule.get("memory_cap")
        lines.append(f"  activations: predicted {schedule['activation_bytes'] / 2**20:.1f} MiB per worker at the "
                     f"peak ({schedule['activation_kept_bytes'] / 2**20:.1f} MiB kept whatever the bins)"
                     + (f", under the memory cap of {cap / 2**20:.1f} MiB" if cap else ""))
    for note in schedule.get("notes", []):
        lines.append(f"  note: {note}")
    return lines


# --- the predicted schedule: Gantt chart and trace ---------------------------------------------------

PREDICTED_PID = 1  # worker w of the prediction is process PREDICTED_PID + w in a trace
MEASURED_PID = 1001  # rank r of a measured run is process MEASURED_PID + r
# trace threads of each process: a row of spans per layer and direction, then the two resources
TID_LAYERS, TID_COMPUTE, TID_COMM = 1, 2, 3
_TIDS = {"compute": TID_COMPUTE, "mixed": TID_COMPUTE, "communication": TID_COMM}


def schedule_of(plan) -> dict[str, Any]:
    """The predicted schedule the plan stores (the planner's, redrawn by the schedule pass; or the schedule
    pass's alone when the strategies were fixed); a GnncError (exit 2) when it has none."""
    planner, report = plan.meta.planner, plan.meta.schedule_report
    schedule = (planner.schedule if planner else None) or (report or {}).get("predicted")
    if not schedule:
        why = ("the planner did not run for it (one worker, or --strategy fixed every layer)"
               if not planner else
               "the planner predicts sampled minibatch training per epoch, not stage by stage"
               if plan.sampling is not None else "it was compiled by a gnnc that did not record one")
        raise GnncError(f"this plan has no predicted schedule: {why}; compile it with --workers N and without "
                        f"--strategy to let the planner predict one")
    return schedule


def predicted_epoch(plan) -> dict[str, Any]:
    """The predicted epoch of a plan's schedule (`schedule_of`): its time, the training step's part and the
    evaluation pass's; None each without a schedule."""
    try:
        schedule = schedule_of(plan)
    except GnncError:
        return {"epoch_time_s": None, "step_time_s": None, "eval_time_s": None}
    evaluation = sum(st["time_s"] for st in schedule["stages"] if st["direction"] == "evaluation")
    return {"epoch_time_s": schedule["time_s"], "step_time_s": schedule["time_s"] - evaluation,
            "eval_time_s": evaluation}


# what a stage of the predicted epoch that belongs to no layer does
_EPOCH_STAGES = {"allreduce": "gradient all-reduce", "optimizer": "optimizer step"}


def _prediction(plan, schedule: dict[str, Any]) -> tuple[float, list[str], str | None]:
    """The predicted epoch time, strategies and cluster of the plan's prediction (the planner's, or the
    schedule pass's when the strategies were fixed)."""
    planner = plan.meta.planner
    if planner is not None:
        return planner.predicted_time_s, planner.strategies, schedule.get("cluster") or planner.cluster
    return (schedule["time_s"], [layer.attr("strategy", "local") for layer in plan.program.graph_layers()],
            schedule.get("cluster"))


def _layer_names(plan) -> list[str]:
    return [layer.name for layer in plan.program.graph_layers()]


def _piece_name(piece: dict[str, Any], stage: dict[str, Any], names: list[str]) -> str:
    if stage["kind"] in _EPOCH_STAGES:
        return _EPOCH_STAGES[stage["kind"]]
    if stage["kind"] == "transition":
        return f"layout {stage['strategy']}"
    where = names[piece["layer"]] if piece["layer"] is not None else \
        f"{names[stage['segment'][0]]}..{names[stage['segment'][1] - 1]}"
    op = "compute and communication (not split)" if piece["op"] == "mixed" else piece["op"]
    return f"{where} {op}"


def _span_name(stage: dict[str, Any], layer: int | None, names: list[str]) -> str:
    if stage["kind"] in _EPOCH_STAGES:
        return _EPOCH_STAGES[stage["kind"]]
    if stage["kind"] == "transition":
        return f"layout {stage['strategy']} ({stage['direction']})"
    where = names[layer] if layer is not None else "segment"
    return f"{where} {stage['direction']} [{stage['strategy']}]"


def _layer_spans(stage: dict[str, Any], worker: int) -> list[tuple[int | None, float, float]]:
    """(layer, start, end) of each layer's work in a stage on one worker, in the order they run."""
    spans: dict[int | None, list[float]] = {}
    for piece in stage["pieces"]:
        t0 = piece["start_s"][worker]
        t1 = t0 + piece["time_s"][worker]
        lo, hi = spans.setdefault(piece["layer"], [t0, t1])
        spans[piece["layer"]] = [min(lo, t0), max(hi, t1)]
    return sorted(((k, v[0], v[1]) for k, v in spans.items()), key=lambda s: s[1])


def _x(name: str, cat: str, pid: int, tid: int, start_s: float, dur_s: float, args: dict[str, Any]) -> dict:
    """A complete ("X") trace event; trace times are microseconds."""
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6, "dur": dur_s * 1e6,
            "args": args}


def _meta(pid: int, name: str, sort: int, threads: dict[int, str]) -> list[dict[str, Any]]:
    out = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": sort}}]
    for tid, label in threads.items():
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def predicted_events(plan) -> list[dict[str, Any]]:
    """Trace events of the predicted epoch: per worker, its layer spans, compute and communication.

    Pieces the cost model overlaps (a max, not a sum) sit on the compute and communication threads
    at the same time; a worker that finishes a stage before the slowest one waits (a "wait" span).
    """
    schedule = schedule_of(plan)
    names = _layer_names(plan)
    events: list[dict[str, Any]] = []
    for w in range(schedule["workers"]):
        pid = PREDICTED_PID + w
        events += _meta(pid, f"predicted: worker {w}", w, {TID_LAYERS: "layers (predicted)",
                                                           TID_COMPUTE: "compute", TID_COMM: "communication"})
        for k, stage in enumerate(schedule["stages"]):
            base = {"stage": k, "direction": stage["direction"], "strategy": stage["strategy"]}
            for piece in stage["pieces"]:
                if piece["time_s"][w] > 0:
                    events.append(_x(_piece_name(piece, stage, names), stage["direction"], pid, _TIDS[piece["track"]],
                                     piece["start_s"][w], piece["time_s"][w],
                                     {**base, "op": piece["op"], "overlapped": piece["overlap"] is not None}))
            end = stage["start_s"]
            for layer, t0, t1 in _layer_spans(stage, w):
                events.append(_x(_span_name(stage, layer, names), stage["direction"], pid, TID_LAYERS, t0, t1 - t0,
                                 {**base, "layer": names[layer] if layer is not None else None}))
                end = max(end, t1)
            stage_end = stage["start_s"] + stage["time_s"]
            if stage_end - end > 1e-9 * stage["time_s"]:  # not a rounding difference
                events.append(_x("wait (for the slowest worker)", "wait", pid, TID_LAYERS, end, stage_end - end, base))
    return events


def _epoch_blocks(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records of each epoch, in file order (a file appended to by several runs repeats epochs)."""
    blocks: list[list[dict[str, Any]]] = []
    for rec in records:
        if not blocks or blocks[-1][0]["epoch"] != rec["epoch"]:
            blocks.append([])
        blocks[-1].append(rec)
    return blocks


def read_run(path: str) -> list[dict[str, Any]]:
    """The records of `gnnc run --metrics PATH`, checked for the fields a trace needs."""
    try:
        records = epoch_records(read_metrics(path))  # a sampled run's minibatch records are not drawn
    except FileNotFoundError:
        raise GnncError(f"--metrics {path}: no such file") from None
    except (OSError, ValueError) as err:
        raise GnncError(f"--metrics {path}: not a metrics file written by `gnnc run --metrics` ({err})") from None
    need = ("epoch", "rank", "epoch_s", "compute_s", "comm_s", "allreduce_s")
    for n, rec in enumerate(records, 1):
        missing = [k for k in need if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise GnncError(f"--metrics {path}: record {n} lacks {', '.join(missing)}")
    if not records:
        raise GnncError(f"--metrics {path}: no records")
    return records


def measured_events(records: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """Trace events of a measured run: per rank, each epoch's compute, communication and all-reduce.

    The metrics hold per-epoch totals, not when each op ran, so an epoch is drawn as its compute,
    then its communication, then its all-reduce, end to end. Epochs follow each other; each starts
    when the slowest rank finished the previous one (the all-reduce synchronises them).
    """
    events: list[dict[str, Any]] = []
    for rank in sorted({rec["rank"] for rec in records}):
        events += _meta(MEASURED_PID + rank, f"measured: rank {rank} ({label})", 10_000 + rank,
                        {TID_LAYERS: "epochs (measured)", TID_COMPUTE: "compute", TID_COMM: "communication"})
    clock = 0.0
    for block in _epoch_blocks(records):
        for rec in block:
            pid, epoch = MEASURED_PID + rec["rank"], rec["epoch"]
            args = {"epoch": epoch, "loss": rec.get("loss"), "bytes_sent": rec.get("bytes_sent"),
                    "note": "totals of the epoch; their order inside it is not measured"}
            events.append(_x(f"epoch {epoch}", "measured", pid, TID_LAYERS, clock, rec["epoch_s"], args))
            events.append(_x("compute", "measured", pid, TID_COMPUTE, clock, rec["compute_s"], args))
            events.append(_x("communication", "measured", pid, TID_COMM, clock + rec["compute_s"], rec["comm_s"], args))
            events.append(_x("gradient all-reduce", "measured", pid, TID_COMM, clock + rec["compute_s"] + rec["comm_s"],
                             rec["allreduce_s"], args))
        clock += max(rec["epoch_s"] for rec in block)
    return [e for e in events if e["ph"] == "M" or e["dur"] > 0]


def trace(plan, metrics: str | None = None) -> str:
    """The predicted epoch (and a measured run) as Chrome trace JSON: Perfetto and chrome://tracing read it."""
    schedule = schedule_of(plan)
    time_s, strategies, cluster = _prediction(plan, schedule)
    events = predicted_events(plan)
    other = {"predicted_epoch_s": time_s, "strategies": strategies, "cluster": cluster, "schedule_per": schedule["per"],
             "workers": schedule["workers"]}
    if metrics is not None:
        events += measured_events(read_run(metrics), Path(metrics).name)
        other["measured"] = str(metrics)
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}, sort_keys=True) + "\n"


def _time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for an axis spanning `seconds`."""
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if seconds * scale >= 1.0:
            return unit, scale
    return "ns", 1e9


def gantt(plan) -> bytes:
    """The predicted epoch as a Gantt chart (PNG): per worker a compute row and a communication row.

    Colour says the layer; forward bars are solid, backward bars lighter and hatched; bars of an
    overlap window (compute and communication the cost model overlaps) have a dashed outline, on
    both rows at once. The top row shows the synchronised stages (each as long as its slowest
    worker). When the gradient all-reduce or another stage dwarfs the rest, a second panel repeats
    the chart up to that stage so the short stages stay readable.
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedule = schedule_of(plan)
    total = schedule["time_s"]
    zoom_end = _zoom_end(schedule)
    panels = [(0.0, total)] + ([(0.0, zoom_end)] if zoom_end is not None else [])
    workers = schedule["workers"]
    height = 1.2 + 0.42 * (2 * workers + 1)
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, height * len(panels) + 0.9), squeeze=False)
    for ax, (lo, hi) in zip(axes[:, 0], panels):
        _draw_gantt(ax, plan, schedule, lo, hi)
    if zoom_end is not None:
        axes[1, 0].set_title("zoom: the stages before the long one", fontsize=9, loc="left")
    _, strategies, cluster = _prediction(plan, schedule)
    unit, scale = _time_unit(total)
    fig.suptitle(f"{plan.program.name}, predicted epoch: {total * scale:.3g} {unit} on {workers} workers "
                 f"({_runs(strategies)}; cluster {cluster})",
                 fontsize=10)
    legend_rows = _legend(fig, plan, schedule)
    fig.tight_layout(rect=(0, (0.2 + 0.25 * legend_rows) / fig.get_figheight(), 1, 1))  # room for the legend
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _runs(strategies: list[str]) -> str:
    """Per-layer strategies, repeats counted ("depcache x16"), so a deep model's title stays one line."""
    runs: list[list] = []
    for s in strategies:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return ", ".join(s if n == 1 else f"{s} x{n}" for s, n in runs)


def _zoom_end(schedule: dict[str, Any]) -> float | None:
    """Where a zoomed panel should end: before the first stage longer than 60% of the epoch, when the
    stages before it are too short to read (under a quarter of the epoch)."""
    for stage in schedule["stages"]:
        if stage["time_s"] > 0.6 * schedule["time_s"]:
            start = stage["start_s"]
            return start if 0 < start < 0.25 * schedule["time_s"] else None
    return None


_LAYER_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#bab0ac")
_OTHER_COLOR = "#8c8c8c"


def _color(piece: dict[str, Any]) -> str:
    return _OTHER_COLOR if piece["layer"] is None else _LAYER_COLORS[piece["layer"] % len(_LAYER_COLORS)]


def _draw_gantt(ax, plan, schedule: dict[str, Any], lo: float, hi: float) -> None:
    names = _layer_names(plan)
    unit, scale = _time_unit(hi - lo)
    workers = schedule["workers"]
    rows = {("stages", None): 0}
    for w in range(workers):
        rows[("compute", w)] = 1 + 2 * w
        rows[("communication", w)] = 2 + 2 * w
    width = (hi - lo) * scale
    for stage in schedule["stages"]:
        s0, s1 = stage["start_s"], stage["start_s"] + stage["time_s"]
        if s0 >= hi:
            continue
        _bar(ax, 0, s0 * scale, stage["time_s"] * scale, "#d9d9d9" if stage["direction"] == "forward" else "#efefef",
             stage["direction"] == "backward", False, _stage_label(stage, names), width)
        ax.axvline(s0 * scale, color="#bbbbbb", lw=0.6, ls=":", zorder=0)
        for piece in stage["pieces"]:
            for w in range(workers):
                t = piece["time_s"][w]
                if t <= 0:
                    continue
                row = rows[("communication" if piece["track"] == "communication" else "compute", w)]
                label = _piece_name(piece, stage, names).replace("gradient ", "")
                label = label.replace("aggregation", "agg").replace("communication", "comm")
                _bar(ax, row, piece["start_s"][w] * scale, t * scale, _color(piece), stage["direction"] == "backward",
                     piece["overlap"] is not None, label, width)
        ax.axvline(s1 * scale, color="#bbbbbb", lw=0.6, ls=":", zorder=0)
    labels = ["stages (slowest worker)"] + [f"worker {w} {kind}" for w in range(workers)
                                            for kind in ("compute", "communication")]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(lo * scale, hi * scale)
    ax.set_xlabel(f"time ({unit})", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    for w in range(1, workers):
        ax.axhline(2 * w + 0.5, color="#999999", lw=0.5)
    ax.axhline(0.5, color="#666666", lw=0.8)


def _stage_label(stage: dict[str, Any], names: list[str]) -> str:
    if stage["kind"] in _EPOCH_STAGES:
        return {"allreduce": "all-reduce", "optimizer": "optimizer"}[stage["kind"]]
    if stage["kind"] == "transition":
        return f"{stage['strategy']}"
    layers = stage["layers"]
    where = names[layers[0]] if len(layers) == 1 else f"{names[layers[0]]}..{names[layers[-1]]}"
    short = {"forward": "fwd", "backward": "bwd", "evaluation": "eval"}.get(stage["direction"], stage["direction"])
    return f"{where} {short} {stage['strategy']}"


def _bar(ax, row: int, x: float, w: float, color: str, backward: bool, overlapped: bool, label: str,
         axis_width: float) -> None:
    """One bar; its label inside when it fits (about 7 pixels per character at this size)."""
    # a white edge keeps neighbouring pieces of one layer apart (and draws the backward hatch in white)
    ax.barh(row, w, left=x, height=0.72, color=color, alpha=0.6 if backward else 0.95,
            hatch="//" if backward else None, edgecolor="#222222" if overlapped else "#ffffff",
            linestyle="--" if overlapped else "-", linewidth=1.0 if overlapped else 0.6)
    if w / max(axis_width, 1e-30) * 1000 > 7 * len(label) + 10:
        ax.text(x + w / 2, row, label, ha="center", va="center", fontsize=7, clip_on=True,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})


def _legend(fig, plan, schedule: dict[str, Any]) -> int:
    """The legend below the chart; returns its number of rows."""
    import math

    from matplotlib.patches import Patch

    names = _layer_names(plan)
    used = sorted({p["layer"] for st in schedule["stages"] for p in st["pieces"] if p["layer"] is not None})
    cycle = len(_LAYER_COLORS)
    # one entry per colour: with more layers than colours, the layers sharing it ("l0, l10, ...")
    handles = [Patch(color=_LAYER_COLORS[i % cycle], label=names[i] if i + cycle not in used
                     else f"{names[i]}, {names[i + cycle]}{', ...' if i + 2 * cycle in used else ''}")
               for i in used if i < cycle]
    handles.append(Patch(color=_OTHER_COLOR, label="all-reduce, optimizer, layout changes"))
    handles.append(Patch(facecolor="#ffffff", edgecolor="#555555", hatch="///", label="backward"))
    if any(p["overlap"] is not None for st in schedule["stages"] for p in st["pieces"]):
        handles.append(Patch(facecolor="#ffffff", edgecolor="#333333", linestyle="--", label="overlapped (max)"))
    columns = min(len(handles), 7)
    fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    return math.ceil(len(handles) / columns)


def render(plan, fmt: str, metrics: str | None = None) -> str | bytes:
    if metrics is not None and fmt != "trace":
        raise GnncError("--metrics lays a measured run beside the prediction in --format trace only")
    if fmt == "gantt":
        return gantt(plan)
    if fmt == "trace":
        return trace(plan, metrics)
    if fmt == "table":
        return table(plan.program)
    if fmt == "ir":
        return str(plan.program)
    if fmt == "json":
        return json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n"
    if fmt == "dot":
        return dot(plan.program)
    if fmt == "explain":
        return explain(plan)
    if fmt == "png":
        return png(plan.program)
    raise GnncError(f"unknown format '{fmt}'")
