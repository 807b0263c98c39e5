"""The cost model's inputs for one compile: partition statistics, symbol values, each layer's shape.

Why this module exists: every planner (the segment DP's pricing, select-hybrid's
Algorithm 4, the pipeline's stages) and the schedule pass evaluate formulas on
the same figures of the same program, partition and cluster. `planning_inputs`
computes them from the analyses below the cost model (the partition's
statistics, the graph layers' widths, the values that need a gradient) and the
IR's op counts (gnnc.passes.cost.ops); `PlanningInputs` is the cached analysis
the passes share (`ctx.analyses.get(PlanningInputs, program)`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.graph import input_density
from gnnc.graph.store import x_nonzeros
from gnnc.ir import Program
from gnnc.passes.analysis.layers import layer_dims, param_dependent
from gnnc.passes.context import PassContext
from gnnc.passes.cost.ops import program_op_work, sparse_values
from gnnc.passes.cost.symbols import CostInputs, layer_shape
from gnnc.passes.partition.stats import compute_stats


def planning_inputs(program: Program, graph, parts: np.ndarray, profile, workers: int | None = None,
                    precision: str = "fp32", processes: int = 1):
    """What every cost formula is evaluated on: partition statistics, cost inputs (at the run's
    precision), each graph layer's shape.

    `workers`: the plan's worker count, when its last parts may be empty (the largest part id + 1 otherwise).
    `processes`: what the statistics' passes over the edges may spread over (compute_stats; `ctx.threads`).
    """
    layers = program.graph_layers()
    view = "self_loops" if any(layer.edges == "self_loops" for layer in layers) else "plain"
    stats = compute_stats(graph, parts, len(layers), view, num_parts=workers, processes=processes)
    dims, heads = layer_dims(program)
    density = input_density(graph.x, x_nonzeros(graph))  # a store's count: x not read (2.1 s cold at products)
    needs_grad = param_dependent(program)
    sparse = sparse_values(program) if density < 1.0 else set()
    shapes = [layer_shape(layer, needs_grad, sparse) for layer in layers]
    inputs = CostInputs.from_stats(stats, dims, profile.for_workers(stats.parts), heads=heads, precision=precision,
                                   op_work=program_op_work(program, input_density=density), input_density=density,
                                   shapes=shapes)
    return stats, inputs, shapes


@dataclass(frozen=True)
class PlanningInputs:
    """The `planning_inputs` of the compile's program, partition and cluster, as a cached analysis."""

    stats: Any
    inputs: Any
    shapes: list[Any]

    @classmethod
    def compute(cls, program: Program, ctx: PassContext) -> "PlanningInputs":
        return cls(*planning_inputs(program, ctx.graph, ctx.parts, ctx.cluster, ctx.workers, ctx.precision,
                                    ctx.threads))
