"""infer-shapes: give every value its type (domain, dtype, symbolic feature shape).

Walks the program in order, creates the shapes of parameters from the
inputs of the ops that own them (linear(h, out) makes a [d_in, out] weight),
and reports dim and domain mismatches at the equation's source location,
and a layer called with an `in` that is not its input's width at the call.
"""
from __future__ import annotations

from gnnc.ir import ops
from gnnc.passes.check import check_declared_input, check_layer_output, check_statement
from gnnc.ir import Eqn, Layer, Param, Program, Type, Value
from gnnc.passes.manager import PassContext, register_pass


def _retype(v: Value, types: dict[str, Type]) -> Value:
    t = types.get(v.name)
    return v if t is None or v.type == t else v.replace(type=t)


@register_pass("infer-shapes", "type every value: domain, dtype and symbolic feature shape")
def infer_shapes(program: Program, ctx: PassContext) -> Program:
    types: dict[str, Type] = {v.name: v.type for v in program.inputs if v.type is not None}
    config = program.config_dict()
    layers: list[Layer] = []
    for layer in program.layers:
        owner = {p.value.name: p for p in layer.params}
        for p in layer.params:
            if p.value.type is not None:
                types[p.value.name] = p.value.type
        eqns: list[Eqn] = []
        for e in layer.eqns:
            in_types = []
            pending = [v for v in e.ins if v.name in owner and v.name not in types]
            if pending:
                x = types[e.ins[0].name]
                for v, shape in zip(e.ins[1:], ops.param_shapes(e, x)):
                    if v.name in owner and v.name not in types:
                        types[v.name] = Type("param", shape)
            for v in e.ins:
                in_types.append(types[v.name])
            out_types = ops.infer(e, in_types)
            for v, t in zip(e.outs, out_types):
                types[v.name] = t
            typed = e.replace(ins=tuple(_retype(v, types) for v in e.ins),
                              outs=tuple(_retype(v, types) for v in e.outs))
            if layer.kind == "graph":
                check_statement(typed)
            eqns.append(typed)
        params = tuple(Param(_retype(p.value, types), p.init) for p in layer.params)
        typed_layer = layer.replace(
            eqns=tuple(eqns), params=params,
            inputs=tuple(_retype(v, types) for v in layer.inputs),
            outputs=tuple(_retype(v, types) for v in layer.outputs))
        check_layer_output(typed_layer)
        check_declared_input(typed_layer, config)
        layers.append(typed_layer)
    return program.replace(layers=tuple(layers), logits=_retype(program.logits, types),
                           loss=_retype(program.loss, types))
