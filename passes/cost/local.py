"""One worker, the whole graph: compute only (the planner's baseline for `--workers auto`)."""
from __future__ import annotations

from gnnc.passes.cost.compute import compute_forward, compute_backward, layer_memory, layer_ops
from gnnc.passes.cost.registry import cost_formula
from gnnc.passes.cost.symbols import N, E_tot, LayerShape, Cost, ZERO


@cost_formula("local")
def local(layer: int, shape: LayerShape) -> Cost:
    """One worker runs the layer on the whole graph (N rows, E_tot edges): compute only (its kernels
    and its other ops)."""
    fwd = compute_forward(layer, shape, N, E_tot) + layer_ops(layer, N, N, E_tot, "f")
    bwd = compute_backward(layer, shape, N, E_tot) + layer_ops(layer, N, N, E_tot, "b")
    memory = layer_memory(layer, shape, N, ZERO, N, E_tot)
    return Cost(f"local[{layer}]", (fwd, bwd), ZERO, memory)
