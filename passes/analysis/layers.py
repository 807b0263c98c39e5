"""What the planner, the cost model and the byte count read off a program: widths, heads, gradients.

Why this module exists: choose-strategy, `gnnc probe`'s fit, the run's memory
check and predict-bytes all need the same two facts about a program, each graph
layer's width and head count and which values need a gradient; they read them
here, below every module that uses them.
"""
from __future__ import annotations

from gnnc.ir import Program
from gnnc.ir.dims import eval_dim


def layer_dims(program: Program) -> tuple[list[float], list[float]]:
    """d_0..d_L (input width of each graph layer, then the last output) and heads per layer."""

    cfg = program.config_dict()
    layers = program.graph_layers()
    if not layers:  # a model of dense layers only (an MLP baseline) has no graph layer to measure
        return [], []
    dims = [float(eval_dim(layers[0].inputs[0].type.shape[0], cfg))]
    heads = []
    for layer in layers:
        dims.append(float(eval_dim(layer.outputs[0].type.shape[0], cfg)))
        h = next((e.attr("heads") for e in layer.eqns if e.op == "linear" and e.attr("heads") is not None), None)
        heads.append(float(eval_dim(h, cfg)) if h is not None else 1.0)
    return dims, heads


def param_dependent(program: Program) -> set[str]:
    """The values that depend on a parameter: those a backward pass computes a gradient for."""
    dep = {p.value.name for p in program.params()}
    for layer in program.layers:
        for e in layer.eqns:
            if any(v.name in dep for v in e.ins):
                dep.update(o.name for o in e.outs)
    return dep
