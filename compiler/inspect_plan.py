"""Renderings of a plan for people: a table of layers, the IR, JSON, DOT of the dataflow."""
from __future__ import annotations

import json

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ops import fmt_shape


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
    from gnnc.ops import COMM_OPS

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
    """Strategies per graph layer, with the planner's alternatives when it recorded them."""
    lines = [f"plan for {plan.workers} worker(s)"]
    part = plan.meta.get("partition")
    if part:
        lines[0] += f", {part['method']} partition"
    for layer in plan.program.graph_layers():
        lines.append(f"  {layer.name} {layer.op}: {layer.attr('strategy', 'local')}"
                     + ("" if plan.workers > 1 else " (one worker)"))
    planner = plan.meta.get("planner")
    if planner:
        lines.append(f"chosen by the planner on cluster '{planner.get('cluster')}': predicted "
                     f"{planner['predicted_time_s'] * 1000:.3f} ms/epoch, {planner['predicted_memory_bytes'] / 2**20:.1f} "
                     f"MiB/worker")
        lines.append(f"  {'strategies':32s} {'time ms':>10s} {'MB/epoch':>10s} {'MiB/worker':>11s}")
        for a in sorted(planner.get("alternatives", []), key=lambda a: a["time_s"]):
            mark = " <- chosen" if a["strategies"] == planner["strategies"] else ""
            user = f" (user cost: {'; '.join(a['user_costs'])})" if a.get("user_costs") else ""
            lines.append(f"  {','.join(a['strategies']):32s} {a['time_s'] * 1000:10.3f} {a['bytes'] / 1e6:10.3f} "
                         f"{a['memory_bytes'] / 2**20:11.1f}{mark}{user}")
        for c in planner.get("crossovers", []):
            lines.append(f"  crossover: {c}")
        lines += _segment_table(planner, [layer.name for layer in plan.program.graph_layers()])
    considered = plan.meta.get("workers_considered")
    if considered:
        lines.append("workers considered: " + ", ".join(
            f"{c['workers']}: {c['time_s'] * 1000:.3f} ms" if c["time_s"] is not None else f"{c['workers']}: -"
            for c in considered))
    return "\n".join(lines) + "\n"


def _segment_table(planner: dict, names: list[str]) -> list[str]:
    """Every strategy the planner priced for each layer (single-layer segments) and for each longer span."""
    costs = planner.get("segment_costs") or []
    if not costs:
        return []
    chosen = {(a, b, s) for a, b, s in planner.get("segments", [])}
    lines = ["per layer and segment (before the gradient all-reduce and layout transitions):",
             f"  {'layers':14s} {'strategy':10s} {'time ms':>10s} {'MB/epoch':>10s} {'MiB/worker':>11s}"]
    for c in sorted(costs, key=lambda c: (c["layers"][1] - c["layers"][0], c["layers"][0], c["time_s"])):
        a, b = c["layers"]
        span = names[a] if b == a + 1 else f"{names[a]}..{names[b - 1]}"
        mark = " <- chosen" if (a, b, c["strategy"]) in chosen else ""
        lines.append(f"  {span:14s} {c['strategy']:10s} {c['time_s'] * 1000:10.3f} {c['bytes'] / 1e6:10.3f} "
                     f"{c['memory_bytes'] / 2**20:11.1f}{mark}")
    return lines


def render(plan, fmt: str) -> str | bytes:
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
