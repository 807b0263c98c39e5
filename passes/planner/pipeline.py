"""Planning GNNPipe's pipeline: cut the graph into chunks, balance the stages by predicted cost, price it.

Why this module exists: the planner (choose-strategy) prices a pipeline
beside the exact strategies and the `stage-pipeline` pass writes the one it
runs into the IR; both make the same decisions here, from the same inputs:

* chunks: K = 4 S METIS parts of the whole graph (GNNPipe's K = 4M, one
  stage per worker); with G workers per stage each chunk is cut by METIS
  again into G sub-chunks, one per group member (`chunk_parts`);
* stages: contiguous runs of the program's layers, each starting at a graph
  layer (stage 0 also holds the dense layers before the first one), cut
  where the largest stage's predicted work (forward plus backward: the
  `local` formula of each graph layer, the dense maps of each dense layer)
  is smallest (`balance_stages`, a min-max DP), not by layer count;
* the group size G (a divisor of the worker count, S = P/G >= 2 stages and
  no more stages than graph layers): the user's, else the cheapest.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.ir import Layer, Program
from gnnc.ir.dims import eval_dim
from gnnc.passes.analysis.layers import param_dependent
from gnnc.passes.cost import gnnpipe
from gnnc.passes.cost.evaluation import CostValue, evaluate, evaluate_cost
from gnnc.passes.cost.local import local
from gnnc.passes.cost.registry import segment_cost
from gnnc.passes.cost.symbols import N, CostInputs, Cost
from gnnc.passes.partition import partition_graph
from gnnc.passes.partition.core import chunks_for_pipeline
from gnnc.plan import pipeline as plan_pipeline


def balance_stages(work: Sequence[float], cuts: Sequence[int], stages: int) -> list[int]:
    """The positions (among `cuts`, increasing) where stages 1..S-1 start, minimising the largest stage's work.

    Stage j holds items [start_j, start_{j+1}) of `work` (stage 0 from 0, the last to the end).
    Among optimal choices the one whose positions, read left to right, come first wins.
    best[j][c]: the least max-work of items [0, cuts[c]) in j stages ending just before cuts[c].
    """
    if stages < 1 or stages - 1 > len(cuts):
        raise ValueError(f"{stages} stages need {stages - 1} cut positions, {len(cuts)} allowed")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(work, dtype=np.float64))])
    ends = list(cuts) + [len(work)]  # a stage ends at a cut or at the end

    def span(a: int, b: int) -> float:
        return float(prefix[b] - prefix[a])

    inf = float("inf")
    # best[j][e]: (max work, the cuts) of j+1 stages covering [0, ends[e])
    best: list[list[tuple[float, tuple[int, ...]]]] = [[(span(0, e), ()) for e in ends]]
    for j in range(1, stages):
        row = []
        for e, end in enumerate(ends):
            cand = (inf, ())
            for c in range(len(cuts)):
                start = cuts[c]
                if start >= end or best[j - 1][c][0] == inf:
                    continue
                prev, chosen = best[j - 1][c]
                value = (max(prev, span(start, end)), chosen + (start,))
                if value < cand:
                    cand = value
            row.append(cand)
        best.append(row)
    value, chosen = best[stages - 1][-1]
    if value == inf:
        raise ValueError(f"no way to cut {len(work)} items into {stages} stages at {list(cuts)}")
    return list(chosen)


def chunk_parts(graph, chunks: int, groups: int, seed: int = 0) -> np.ndarray:
    """The pipeline's partition: `parts[v] = k*G + g`, chunk k of K (METIS), sub-chunk g of G (METIS in it).

    Kept with the graph's derived views (`Graph._views`, as its CSR): METIS is a pure function of the graph,
    the counts and the seed, and a planner prices a pipeline per group size on every compile (GCNII x32 on the
    89,000-vertex SBM x8: 27 METIS runs, ~3 CPU-s; stage-pipeline prices the chosen size again when the user
    fixes another). A copy of the kept one: the plan's partition is its caller's to change."""
    key = ("pipeline_chunk_parts", int(chunks), int(groups), int(seed))
    if key not in graph._views:
        graph._views[key] = _chunk_parts(graph, chunks, groups, seed)
    return graph._views[key].copy()


def _chunk_parts(graph, chunks: int, groups: int, seed: int) -> np.ndarray:
    if chunks > graph.num_nodes:
        raise GnncError(f"the pipeline's {chunks} chunks exceed the graph's {graph.num_nodes} vertices")
    base = partition_graph(graph, chunks, "metis", seed=seed)
    if groups == 1:
        return np.asarray(base.assignment, dtype=np.int64)
    parts = np.empty(graph.num_nodes, dtype=np.int64)
    for k in range(chunks):
        members = base.members(k)
        if len(members) < groups:
            raise GnncError(f"pipeline chunk {k} has {len(members)} vertices, fewer than the {groups} workers "
                            f"of a stage: use fewer chunks or workers")
        for g, ids in enumerate(chunks_for_pipeline(graph, groups, base, part=k, seed=seed)):
            parts[ids] = k * groups + g
    return parts


def layer_work(program: Program, inputs: CostInputs, shapes: Sequence[Any]) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer of the program on the whole graph (one worker)."""
    needs = param_dependent(program)
    cfg = program.config_dict()
    fwd, bwd = [], []
    graph_index = {layer.name: k for k, layer in enumerate(program.graph_layers())}
    for layer in program.layers:
        if layer.kind == "graph":
            value = evaluate_cost(local(graph_index[layer.name], shapes[graph_index[layer.name]]), inputs)
            fwd.append(float(value.stage_times[0].max()))
            bwd.append(float(value.stage_times[1].max()))
        else:
            f, b = dense_work(layer, cfg, needs, N)
            fwd.append(float(evaluate(f, inputs)[0]))
            bwd.append(float(evaluate(b, inputs)[0]))
    return fwd, bwd


def dense_work(layer: Layer, cfg: dict[str, Any], needs_grad: set[str], rows) -> tuple[Any, Any]:
    """Forward and backward time of a dense layer's dense maps on `rows` rows (elementwise ops are left out)."""
    f, b = gnnpipe.ZERO, gnnpipe.ZERO
    for e in layer.eqns:
        if e.op != "linear":
            continue
        d_in = eval_dim(e.ins[0].type.shape[-1], cfg)
        d_out = eval_dim(e.outs[0].type.shape[-1], cfg) if len(e.outs[0].type.shape) == 1 else \
            int(np.prod([eval_dim(d, cfg) for d in e.outs[0].type.shape]))
        tf, tb = gnnpipe.dense_time(rows, d_in, d_out, e.ins[0].name in needs_grad)
        f, b = f + tf, b + tb
    return f, b


@dataclass
class PipelineChoice:
    """One priced pipeline: its shape, its chunking, its cost and the symbol values behind it.

    stage_of: the stage of every program layer; split: each stage's graph layers [a, b).
    """

    groups: int
    chunks: int
    history_every: int
    stage_of: list[int]
    split: list[tuple[int, int]]
    pipe_grad: list[bool]
    parts: np.ndarray
    cost: Cost
    extra: dict[Any, Any]
    value: CostValue
    history_update: str = plan_pipeline.HISTORY_UPDATE

    @property
    def stages(self) -> int:
        return len(self.split)


def group_options(workers: int, graph_layers: int, groups: int = 0) -> list[int]:
    """The group sizes G a pipeline may use: G divides the workers, 2 <= S = P/G <= graph layers."""
    if groups:
        if workers % groups or workers // groups < 2:
            raise GnncError(f"--pipeline-groups {groups}: the {workers} workers must split into at least two "
                            f"stages of {groups}")
        if workers // groups > graph_layers:
            raise GnncError(f"--pipeline-groups {groups}: {workers // groups} stages for {graph_layers} graph "
                            f"layers (a stage needs one); use larger groups")
        return [groups]
    return [g for g in range(1, workers + 1) if workers % g == 0 and 2 <= workers // g <= graph_layers]


def point_to_point_bandwidth(profile, stages: int, groups: int) -> float:
    """Bytes/s of the slowest stage boundary: a member sends to its peer of the next stage, inside a machine
    at the intra-node rate, across machines sharing the machine's link with the other members crossing."""
    if profile.t_c is not None:
        return 1.0 / profile.t_c
    per_node = profile.devices_per_node
    rates = []
    for s in range(stages - 1):
        crossing = [g for g in range(groups) if (s * groups + g) // per_node != ((s + 1) * groups + g) // per_node]
        rates.append(profile.inter_bandwidth / len(crossing) if crossing else profile.intra_bandwidth)
    return min(rates) if rates else profile.intra_bandwidth


def price(program: Program, graph, inputs: CostInputs, shapes: Sequence[Any], profile, workers: int,
          groups: int = 0, history_every: int = plan_pipeline.HISTORY_EVERY, seed: int = 0,
          chunks: int | None = None, history_update: str = plan_pipeline.HISTORY_UPDATE) -> list[PipelineChoice]:
    """Every pipeline the planner may run (one per group size), cheapest first.

    `groups` 0: every size `group_options` allows; `chunks` None: GNNPipe's 4 per stage; `history_update`
    (gnnc.plan.pipeline.HISTORY_UPDATES): recorded (both settings move and compute the same).
    """
    layers = program.graph_layers()
    L = len(layers)
    options = group_options(workers, L, groups)
    if not options:
        return []
    fwd, bwd = layer_work(program, inputs, shapes)
    work = [f + b for f, b in zip(fwd, bwd)]
    graph_pos = [k for k, layer in enumerate(program.layers) if layer.kind == "graph"]
    needs = param_dependent(program)
    cfg = program.config_dict()
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers) else "plain"
    choices = []
    for g in options:
        stages = workers // g
        k_chunks = chunks or plan_pipeline.CHUNKS_PER_STAGE * stages
        cuts = balance_stages(work, graph_pos[1:], stages)
        bounds = [0, *cuts, len(program.layers)]
        stage_of = [s for s in range(stages) for _ in range(bounds[s], bounds[s + 1])]
        split = [(graph_pos.index(bounds[s]) if s else 0,
                  graph_pos.index(bounds[s + 1]) if s + 1 < stages else L) for s in range(stages)]
        parts = chunk_parts(graph, k_chunks, g, seed)
        extra: dict[Any, Any] = {gnnpipe.bw_pipe: point_to_point_bandwidth(profile, stages, g),
                                 gnnpipe.bw_group: profile.effective_bandwidth(g) if g > 1 else 1.0}
        pipe_grad = []
        for s in range(stages):
            if s:
                values = plan_pipeline.boundary_values(program, stage_of, s)
                extra[gnnpipe.boundary_width(s)] = float(sum(plan_pipeline.value_width(program, v) for v in values))
                pipe_grad.append(any(v.name in needs for v in values))
            df = db = gnnpipe.ZERO
            for layer, st in zip(program.layers, stage_of):
                if st == s and layer.kind != "graph":
                    f, b_ = dense_work(layer, cfg, needs, N / g)
                    df, db = df + f, db + b_
            extra[gnnpipe.dense_forward(s)] = float(evaluate(df, inputs)[0])
            extra[gnnpipe.dense_backward(s)] = float(evaluate(db, inputs)[0])
        extra[gnnpipe.boundary_width(stages)] = 0.0
        moved = plan_pipeline.group_rows(graph, view, parts, k_chunks, g)
        extra[gnnpipe.HR] = float(moved.history.sum())
        extra[gnnpipe.GR], extra[gnnpipe.GS] = float(moved.received.max()), float(moved.sent.max())
        extra[gnnpipe.GT] = float(moved.received.sum())
        extra[gnnpipe.GL] = float(moved.later_received.sum())
        extra[gnnpipe.GLM] = float(max(moved.later_received.max(), moved.later_sent.max()))
        extra[gnnpipe.RR] = float(moved.refresh.max())
        stage_params = [float(sum(np.prod([eval_dim(d, cfg) for d in p.value.type.shape]) for layer, st in
                                  zip(program.layers, stage_of) if st == s for p in layer.params))
                        for s in range(stages)]
        # tuples, so that segment_cost keeps the formula: a list option builds it afresh (sympy, ~0.3 CPU-s per
        # group size for GCNII x32) on every compile of the same model
        cost = segment_cost("pipeline", 0, L, shapes, split=tuple(split), chunks=k_chunks, groups=g,
                            history_every=history_every, pipe_grad=tuple(pipe_grad), stage_params=tuple(stage_params))
        value = evaluate_cost(cost, inputs, extra)
        choices.append(PipelineChoice(g, k_chunks, history_every, stage_of, split, pipe_grad, parts, cost, extra,
                                      value, history_update))
    return sorted(choices, key=lambda c: (c.value.time, c.groups))



def pipeline_summary(choice: PipelineChoice, refresh_bytes: dict[str, int] | None) -> dict[str, Any]:
    """What a plan records of its pipeline: the shape, GPipe's bubble, the refresh traffic, the prediction."""
    S, K = choice.stages, choice.chunks
    return {"stages": S, "groups": choice.groups, "chunks": K, "history_every": choice.history_every,
            "history_update": choice.history_update,
            "split": [list(s) for s in choice.split],
            # GPipe: a pass takes K+S-1 steps where each stage computes in K of them
            "bubble": {"stretch": (K + S - 1) / K, "idle_fraction": (S - 1) / (K + S - 1)},
            "history_reads_per_layer": int(choice.extra[gnnpipe.HR]),
            "refresh_bytes": dict(refresh_bytes or {}),
            "predicted": {"time_s": choice.value.time, "bytes": choice.value.bytes,
                          "memory_bytes": choice.value.memory}}
