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


def explain(plan) -> str:
    """Strategies per graph layer, with the planner's alternatives when it recorded them."""
    lines = [f"plan for {plan.workers} worker(s)"]
    part = plan.meta.get("partition")
    if part:
        lines[0] += f", {part['method']} partition"
    for layer in plan.program.graph_layers():
        lines.append(f"  {layer.name} {layer.op}: {layer.attr('strategy', 'local')}"
                     + ("" if plan.workers > 1 else " (one worker)"))
    alts = plan.meta.get("alternatives")
    if alts:
        lines.append("alternatives:")
        lines.extend(f"  {a}" for a in alts)
    return "\n".join(lines) + "\n"


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
    raise GnncError(f"unknown format '{fmt}'")
