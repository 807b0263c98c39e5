"""predict-bytes: the exact logical payload of every communication op of one training step.

Counted on the partitioned graph with the runtime's conventions (see
gnnc.runtime.comm: what a rank sends to other ranks, not what a ring
relays), so a run's measured bytes must equal these numbers exactly:

* `halo` of a width-w value in layer l: forward sum_p |H_p^l| rows (each
  owner sends each row once per needing part: the remote in-neighbours B_p
  under depcomm, those a hybrid selection does not cache under hybrid; see
  gnnc.plan.rows), backward the same rows back;
* `fetch` on entering a depcache/hybrid segment after layer 0: the rows of
  its replicated neighbourhood each worker does not own, there and (for a
  gradient) back; counted with `halo`, whose exchange it is;
* `bcast_rows`: every block to the P-1 other ranks, forward and backward;
* `reduce_scatter` (P3's pull): each rank sends the N - |V_r| rows it does
  not own, forward; backward all-gathers (P-1) N rows;
* the gradient all-reduce: 2 (P-1) x the replicated parameters' size (all but
  P3's split weights under pushpull, which each rank holds, differentiates
  and updates as its feature slice's rows only: gnnc.plan.slices.split_weights);
* an op that all-reduces statistics of every rank's rows (batch_norm: its
  sums, sums of squares and row count in float64, `allreduce_elements`):
  2 (P-1) x those bytes forward, and the same backward; counted with the
  gradient all-reduce, whose op it shares.

* link prediction's pair exchange (`predict_pair_bytes`, not a pass: api.compile calls it with the run's edge
  split): each pair scored on its source's rank fetches its destination's row from the owner, each row once per
  rank; forward those rows, backward their gradients (key `pairs` of a training step: the fixed positives; of
  an evaluation: the validation and test pairs; an epoch's negatives are counted from that epoch's draw).

A communication op the `hoist` pass marks runs once per run, not per step:
it is annotated with its bytes but not counted in the step's totals.

Element sizes follow the run's precision (gnnc.plan.precision): activations
and their gradients travel in it (4 bytes at fp32, 2 at bf16 and fp16; the
runtime casts before each exchange), parameter gradients in fp32 (4 bytes)
at every precision.

A backward message exists only when its input depends on a parameter
(autograd skips the dual op otherwise). Each comm equation gets attributes
`bytes_fwd` and `bytes_bwd`; the program's total is in `ctx.results.predicted_bytes`.

The evaluation pass a run makes after each step (gnnc.runtime.train.fit)
sends every exchange's forward bytes once more, and nothing backward (no
gradient, and batch_norm then reads its running statistics): its total is
in `ctx.results.predicted_eval_bytes` (`evaluation_bytes`), which the run's
`eval_bytes_sent_per_epoch` must equal.

A pipeline (gnnc.plan.pipeline) counts instead, per training step: `pipe`,
every vertex's boundary row into each stage after the first (its width the
boundary values side by side), and its gradient back where it has one;
`history`, the chunk rows a member fetches from its group peers in each
history layer (G > 1; the out-of-chunk rows come from the history and cost
nothing), and their gradients back, plus the chunk rows it hands its peers'
histories as the chunk passes (forward only); `allreduce`, each group's all-reduce of
its stage's weights, 2 (G-1) x their size (nothing with one worker per
stage). A history refresh, once every alpha epochs, sends the boundary rows
forward once more and fetches, per history layer, the peer rows of the
member's chunks: `ctx.results.pipeline_bytes`.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.ir.ops import op_def
from gnnc.passes.analysis.layers import param_dependent
from gnnc.passes.manager import PassContext, register_pass
from gnnc.passes.planner.sampled import predict_sampled
from gnnc.plan import pipeline as plan_pipeline
from gnnc.plan.comm_ops import byte_kinds, exchange_of
from gnnc.plan.pair_rows import fetched_rows
from gnnc.plan.precision import DEFAULT_PRECISION, GRAD_BYTES, element_bytes
from gnnc.plan.rows import all_row_sets, layer_specs
from gnnc.plan.slices import split_weights

STATISTICS_BYTES = 8  # float64: batch_norm sums its statistics in double precision, at every precision
PIPELINE_ELEMENT_BYTES = element_bytes(DEFAULT_PRECISION)  # a pipeline runs in fp32 (16 bits refused below)


def _width(shape, config) -> int:

    w = 1
    for d in shape:
        w *= eval_dim(d, config)
    return w


def predict(program: Program, graph, parts: np.ndarray, world: int,
            cached: dict[int, list[np.ndarray]] | None = None,
            precision: str = DEFAULT_PRECISION, sets: list[Any] | None = None) -> tuple[Program, dict[str, int]]:
    """The program with every exchange's bytes annotated, and the totals by kind; `sets`: every rank's
    row sets of the program's layer specs, when the caller built them (else built here)."""
    config = program.config_dict()
    elem = element_bytes(precision)
    if sets is None:
        sets = all_row_sets(graph, parts, world, layer_specs(program), cached)
    graph_index = {layer.name: k for k, layer in enumerate(program.graph_layers())}
    n = graph.num_nodes
    needs_grad = param_dependent(program)
    totals = {**dict.fromkeys(byte_kinds(), 0), "allreduce": 0}
    layers = []
    for layer in program.layers:
        eqns = []
        for e in layer.eqns:
            d = exchange_of(e.op)
            if d is not None and d.rows is not None:  # its byte rule (gnnc.plan.comm_ops)
                w = _width(e.ins[0].type.shape, config) * elem
                fwd = d.rows(sets, graph_index.get(layer.name, -1), world, n) * w
                bwd = fwd if d.backward and e.ins[0].name in needs_grad else 0
                if not e.attr("hoisted"):  # a hoisted exchange runs in the first step only
                    totals[d.counted_as] = totals.get(d.counted_as, 0) + fwd + bwd
                e = e.with_attrs(bytes_fwd=fwd, bytes_bwd=bwd)
            elif op_def(e.op).allreduce_elements is not None:
                fwd = 2 * (world - 1) * eval_dim(op_def(e.op).allreduce_elements(e), config) * STATISTICS_BYTES
                bwd = fwd if e.ins[0].name in needs_grad else 0
                totals["allreduce"] += fwd + bwd
                e = e.with_attrs(bytes_fwd=fwd, bytes_bwd=bwd)
            eqns.append(e)
        # a layer with no exchange keeps its record (a new one, equal, made the IR verified again for nothing)
        layers.append(layer if all(map(operator.is_, eqns, layer.eqns)) else layer.replace(eqns=tuple(eqns)))
    split = split_weights(program)
    numel = sum(_width(p.value.type.shape, config) for p in program.params() if p.value.name not in split)
    totals["allreduce"] += 2 * (world - 1) * numel * GRAD_BYTES
    return program.replace(layers=tuple(layers)), totals


def predict_pair_bytes(program: Program, pairs: np.ndarray, parts: np.ndarray, world: int,
                       precision: str = DEFAULT_PRECISION) -> tuple[int, int]:
    """Forward and backward bytes of scoring `pairs` ([2, k]: sources, destinations) of a link-prediction
    program on `world` ranks owning the vertices as `parts` says: each `pair_dst` fetches, at its value's width,
    the destination rows its pairs' source ranks do not own (gnnc.plan.pair_rows, the rows the runtime's pair
    exchange moves), and sends their gradients back when that value needs one."""
    p = torch.as_tensor(np.asarray(pairs), dtype=torch.int64)
    rows = fetched_rows(p[0], p[1], torch.as_tensor(np.asarray(parts), dtype=torch.int64), world)
    config, elem, needs_grad = program.config_dict(), element_bytes(precision), param_dependent(program)
    fwd = bwd = 0
    for layer in program.layers:
        for e in layer.eqns:
            if e.op == "pair_dst":
                nbytes = rows * _width(e.ins[0].type.shape, config) * elem
                fwd += nbytes
                bwd += nbytes if e.ins[0].name in needs_grad else 0
    return fwd, bwd


def evaluation_bytes(program: Program) -> dict[str, int]:
    """Bytes of one evaluation pass by communication kind: the forward bytes of every exchange not hoisted
    (counted as its descriptor says: a fetch as a halo exchange), as `predict` annotated them."""
    totals = dict.fromkeys(byte_kinds(), 0)
    for layer in program.layers:
        for e in layer.eqns:
            d = exchange_of(e.op)
            if d is not None and not e.attr("hoisted"):
                totals[d.counted_as] = totals.get(d.counted_as, 0) + int(e.attr("bytes_fwd", 0))
    return totals


def predict_pipeline(program: Program, graph, parts: np.ndarray) -> tuple[Program, dict[str, int], dict[str, int]]:
    """A pipeline's bytes (module docstring): the program with its history ops annotated, the training
    step's totals, and a refresh's."""
    sched = plan_pipeline.schedule_of(program)
    config = program.config_dict()
    needs_grad = param_dependent(program)
    G, K = sched.groups, sched.chunks
    step = {"pipe": 0, "history": 0, "allreduce": 0}
    refresh = {"pipe": 0, "history": 0}
    for s in range(1, sched.stages):
        width = plan_pipeline.boundary_width(program, sched.stage_of, s) * PIPELINE_ELEMENT_BYTES
        step["pipe"] += graph.num_nodes * width * (2 if sched.pipe_grad[s - 1] else 1)
        refresh["pipe"] += graph.num_nodes * width
    rows: dict[str, plan_pipeline.GroupRows] = {}
    layers = []
    for layer in program.layers:
        eqns = []
        for e in layer.eqns:
            d = exchange_of(e.op)
            if d is not None and d.rows is None:  # GNNPipe's history: counted here (module docstring)
                if layer.edges not in rows:
                    rows[layer.edges] = plan_pipeline.group_rows(graph, layer.edges, parts, K, G)
                moved = rows[layer.edges]
                w = _width(e.ins[0].type.shape, config) * PIPELINE_ELEMENT_BYTES
                grads = int(moved.received.sum()) * w
                fwd = grads + int(moved.later_received.sum()) * w
                bwd = grads if e.ins[0].name in needs_grad else 0
                step["history"] += fwd + bwd
                refresh["history"] += int(moved.refresh.sum()) * w
                e = e.with_attrs(bytes_fwd=fwd, bytes_bwd=bwd)
            eqns.append(e)
        layers.append(layer.replace(eqns=tuple(eqns)))
        if G > 1:
            numel = sum(_width(p.value.type.shape, config) for p in layer.params)
            step["allreduce"] += 2 * (G - 1) * numel * GRAD_BYTES
    return program.replace(layers=tuple(layers)), step, refresh


@register_pass("predict-bytes", "annotate communication ops with their exact bytes per training step",
               requires=("strategies", "partition"))
def predict_bytes(program: Program, ctx: PassContext) -> Program:
    if ctx.workers == 1:
        return program
    if ctx.sampling is not None:  # per epoch, from the planner's dry run of the sampler
        program, ctx.results.predicted_bytes = predict_sampled(program, ctx)
        return program
    if plan_pipeline.is_pipeline(program):
        if ctx.precision != DEFAULT_PRECISION:
            raise GnncError(f"--precision {ctx.precision}: GNNPipe's pipeline runs in {DEFAULT_PRECISION} for now")
        program, totals, ctx.results.pipeline_bytes = predict_pipeline(program, ctx.graph, ctx.results.pipeline.parts)
    else:
        specs = layer_specs(program)
        sets = all_row_sets(ctx.graph, ctx.parts, ctx.workers, specs, ctx.results.hybrid_cached)
        ctx.results.row_sets = (specs, sets)
        program, totals = predict(program, ctx.graph, ctx.parts, ctx.workers, ctx.results.hybrid_cached,
                                  ctx.precision, sets)
        ctx.results.predicted_eval_bytes = evaluation_bytes(program)
    ctx.results.predicted_bytes = totals
    return program
