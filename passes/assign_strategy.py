"""assign-strategy: annotate every graph layer with the strategy that runs it.

The strategy is choose-strategy's decision (`ctx.results.strategy`): the
planner's, or the user's (`--strategy S` for every layer, or `S1,S2,...`
one per graph layer); without one, `depcomm`. With one worker every layer
is `local`. The runtime executes `depcomm` and
`bcast1d` (vertex-partitioned, freely mixed per layer); `depcache` and
`hybrid` as segments of consecutive layers (attribute `segment`: the
segment's first graph layer; a segment after layer 0 fetches the
neighbourhood of its input on entry); and `pushpull` on the first graph layer (P3: that layer's
input is split along the feature dim; the layers after it are
vertex-partitioned). Asking for an illegal or unsupported assignment is an
error that names the layer and the op that forbids it.
"""
from __future__ import annotations

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir.ops import op_def
from gnnc.passes.analysis.legality import fetchable, pushpull_blocker, vertex_inputs
from gnnc.passes.cost.inputs import PlanningInputs
from gnnc.passes.manager import PassContext, register_pass
from gnnc.plan.strategies import STRATEGIES, names as strategy_names

DEFAULT_STRATEGY = "depcomm"  # what several workers run when neither the user nor the planner chose
DEFAULT_SAMPLED = "dp-sample"  # the same for sampled minibatches


def spans_segment(name: str) -> bool:
    """Whether strategy `name` runs consecutive layers as one segment (depcache, hybrid)."""
    return STRATEGIES[name].span == "segment"


def strategies_for(program: Program, spec: str | list[str] | None, workers: int, batching: str = "full") -> list[str]:
    layers = program.graph_layers()
    if workers == 1:
        (local,) = strategy_names(single_worker=True)
        if spec not in (None, local) and spec != [local] * len(layers):
            raise GnncError(f"--strategy {spec}: one worker runs every layer locally; use --nproc N > 1")
        return [local] * len(layers)
    if spec is None:
        spec = DEFAULT_STRATEGY if batching == "full" else DEFAULT_SAMPLED
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    if len(names) == 1 and batching == "sampled" and names[0] in STRATEGIES and STRATEGIES[names[0]].first_layer_only:
        names = names + [DEFAULT_SAMPLED] * (len(layers) - 1)  # P3: the layers after its first run data-parallel
    elif len(names) == 1:
        names = names * len(layers)
    if len(names) != len(layers):
        raise GnncError(f"--strategy names {len(names)} strategies for {len(layers)} graph layers")
    for layer, s in zip(layers, names):
        if s not in STRATEGIES:
            raise GnncError(f"unknown strategy '{s}' (known: {', '.join(STRATEGIES)})")
        if STRATEGIES[s].single_worker:
            raise GnncError(f"layer {layer.name} ({layer.op}): '{s}' needs a single worker")
        if batching not in STRATEGIES[s].batching:
            mode = "full-graph steps" if batching == "full" else "sampled minibatches (--fanout)"
            raise GnncError(f"layer {layer.name} ({layer.op}): '{s}' does not train {mode}, which run "
                            f"{', '.join(strategy_names(batching=batching, single_worker=False))}")
        if not STRATEGIES[s].runnable:
            raise GnncError(f"layer {layer.name} ({layer.op}): the runtime does not execute '{s}' yet "
                            f"(it runs {', '.join(strategy_names(runnable=True, single_worker=False))})")
    for i, (layer, s) in enumerate(zip(layers, names)):
        if not STRATEGIES[s].first_layer_only:
            continue
        if i != 0:
            raise GnncError(f"layer {layer.name} ({layer.op}): {s} runs the first graph layer only "
                            f"(P3 splits the input features; later layers are vertex-partitioned)")
        if STRATEGIES[s].layout_in == "feature":
            check_pushpull(program, layer, sync_scores=batching == "full")
    return names


def check_pushpull(program: Program, layer, sync_scores: bool = False) -> None:
    """Raise, naming the op, unless `layer` may run pushpull and everything before it is feature-local
    (`sync_scores`: attention scores are summed over the workers, as full-graph steps do)."""
    blocked = pushpull_blocker(layer, sync_scores)
    if blocked is not None:
        eqn, why = blocked
        raise GnncError(f"layer {layer.name} ({layer.op}) cannot run pushpull: {why}", eqn.loc if eqn else layer.loc)
    for before in program.layers:
        if before is layer:
            break
        for e in before.eqns:
            if op_def(e.op).needs_whole_rows:
                raise GnncError(f"pushpull splits the input features, but '{e.op}' before layer {layer.name} "
                                f"needs whole rows", e.loc)


def segment_starts(names: list[str], planned: list[tuple[int, int, str]] | None = None) -> list[int]:
    """The first graph layer of each layer's segment: the planner's segments, else runs of one
    depcache/hybrid strategy (a per-layer strategy is a segment of its own)."""
    if planned:
        return [next(a for a, b, _ in planned if a <= k < b) for k in range(len(names))]
    starts: list[int] = []
    for k, s in enumerate(names):
        starts.append(starts[-1] if spans_segment(s) and k and names[k - 1] == s else k)
    return starts


def check_segment_inputs(program: Program, names: list[str], starts: list[int]) -> None:
    """Refuse a segment entered after layer 0 that holds a layer that is not `fetchable`."""
    for k, (layer, s) in enumerate(zip(program.graph_layers(), names)):
        if spans_segment(s) and starts[k] != 0 and not fetchable(layer):
            outside = vertex_inputs(layer)
            raise GnncError(f"layer {layer.name}: a {s} segment that starts after the first graph layer fetches "
                            f"one input's rows on entry, but this layer reads {len(outside)} vertex values "
                            f"({', '.join('%' + v.name for v in outside)}); start the segment at the first layer",
                            layer.loc)


@register_pass("assign-strategy", "annotate graph layers with their strategy: choose-strategy's, else the default",
               requires=("typed",), preserves=(PlanningInputs,))
def assign_strategy(program: Program, ctx: PassContext) -> Program:
    names = strategies_for(program, ctx.results.strategy, ctx.workers, "full" if ctx.sampling is None else "sampled")
    starts = segment_starts(names, ctx.results.segments)
    check_segment_inputs(program, names, starts)
    it = iter(zip(names, starts))
    layers = []
    for layer in program.layers:
        if layer.kind == "graph":
            strategy, start = next(it)
            attrs = dict(layer.attrs)
            attrs["strategy"] = strategy
            if spans_segment(strategy):
                attrs["segment"] = start
            layer = layer.replace(attrs=tuple(sorted(attrs.items())))
        layers.append(layer)
    return program.replace(layers=tuple(layers))
