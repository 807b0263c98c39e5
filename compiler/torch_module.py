"""A trained gnnc model as a plain `torch.nn.Module` (`gnnc.to_torch`), for PyTorch and PyG code.

    module = gnnc.to_torch(plan, "ckpt/")            # the weights of `gnnc run --checkpoint ckpt/`
    logits = module(data.x, data.edge_index)          # a PyG Data's fields, or any tensors

The module does not reimplement the ops: it runs the model's IR with the runtime's interpreter and kernels
(gnnc.runtime.executor), as one gnnc process does, so its logits are gnnc's. What it adds is the graph: each
call builds the edge views the layers read (self-loops, `gcn_norm`, the CSR) from `edge_index` and
`edge_weight`, kept while the same `edge_index` tensor comes back. The weights are its parameters, named as
in the IR (`l0.linear0.weight`), so `state_dict()` and `load_state_dict` speak gnnc's names and an optimizer
trains them like any module's. In training mode its dropout draws gnnc's counter-based masks for
(`seed`, the number of training calls so far): the n-th training call draws what epoch n of a gnnc run with
that seed draws.

The weights come from where a user has them (gnnc.saved_model.load_weights): a dict of tensors by IR
name, a checkpoint directory or file that `gnnc run --checkpoint` wrote (its rank 0 file: every rank holds
every weight), or a model file that `gnnc run --save-model` wrote. A weight missing, left over or of another
shape is refused naming it: such weights belong to another model, or to this one at another width.
`gnnc.api.to_torch` compiles the model for one process and puts the two together.

Neither `torch.jit.script` nor `torch.export` can take the module: building the edge views reads
`edge_index`'s values on the host (numpy), which both refuse (tests/test_to_torch.py shows what each says).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gnnc.errors import GnncError
from gnnc.graph import Graph, GraphView, edge_data
from gnnc.ir import Program
from gnnc.ir.dims import eval_dim
from gnnc.runtime import device as devices
from gnnc.runtime import rng
from gnnc.runtime.executor import ExecContext, Interpreter, check_dims_fit, graph_inputs, init_state
from gnnc.runtime.predict import KeepingInterpreter, chunk_rows

# where the running state of ops (batch_norm's statistics) sits among the module's buffers
STATE = "state"


class GnncModule(torch.nn.Module):
    """A compiled one-process gnnc program with its weights; `forward(x, edge_index, edge_weight=None)` returns
    the logits, [x.shape[0], classes]. See the module docstring."""

    def __init__(self, program: Program, weights: Mapping[str, torch.Tensor], seed: int = 0):
        super().__init__()
        self.program = program
        self.seed = seed
        self.steps = 0  # training calls so far: the dropout masks' epoch
        self._interp = Interpreter(program)
        self._config = program.config_dict()
        expected = param_shapes(program)
        state = init_state(program)
        _check_names(weights, list(expected), list(state))
        for name, shape in expected.items():
            _add(self, name, torch.nn.Parameter(_checked(weights, name, shape).detach().clone().float()))
        for name, default in state.items():
            value = _checked(weights, name, tuple(default.shape)) if name in weights else default
            _add(self, f"{STATE}.{name}", value.detach().clone().float(), buffer=True)
        self._names = list(expected)
        self._state_names = list(state)
        # (edge_index, its version, edge_weight, its version, graph, views) of the last call
        self._graph: tuple[Any, ...] | None = None

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        check_dims_fit(self.program, int(x.shape[-1]), 0, "to_torch")
        graph, views = self._views(x, edge_index, edge_weight)
        return self._run(graph, views, x.device)

    def predict(self, graph: Graph, output: str | None = None) -> torch.Tensor:
        """`gnnc predict`'s: in evaluation mode, on a gnnc Graph (its edge data all there), every vertex's logits,
        or the output of the layer named `output` (`l0`: the first graph layer's embeddings), or the vertex value
        of the IR of that name."""
        if output is not None:
            output = value_named(self.program, output)
        check_dims_fit(self.program, graph.num_features, 0, graph.name)
        edge_data.check_fits(self.program, graph.edge_data, graph.name, self._config)
        device = next(self.parameters(), torch.zeros(0)).device  # where the module is (`.cuda()` moves it)
        views = {v: devices.place(GraphView.build(graph, v), device)
                 for v in sorted({layer.edges for layer in self.program.graph_layers()})}
        was = self.training
        self.eval()
        try:
            with torch.no_grad():
                # the logits run as fused chains, which hold no edge value: layer-wise only for another value
                chunk = None if output is None else chunk_rows(self.program, graph.num_nodes, output)
                return self._run(graph, views, device, output, chunk)
        finally:
            self.train(was)

    def _run(self, graph: Graph, views: dict[str, GraphView], device: torch.device,
             output: str | None = None, chunk: int | None = None) -> torch.Tensor:
        """The logits (or the value `output`) of the program on `graph` with this module's weights."""
        params = {name: self.get_parameter(name) for name in self._names}
        state = {name: self.get_buffer(f"{STATE}.{name}") for name in self._state_names}
        if self.training:
            key = rng.stream_key(self.seed, self.steps)
            self.steps += 1
        else:
            key = 0  # no dropout draws in evaluation
        # A value other than the logits is kept past its last reader, and read from equations run one by one:
        # a fused chain computes its inner values nowhere and may write its result over its input.
        interp = self._interp if output is None else KeepingInterpreter(self.program, output)
        ctx = ExecContext(views, torch.arange(graph.num_nodes, device=device), self._config, self.training,
                          lambda i: rng.stream_key(key, i), 1.0, state=state, fuse=output is None, eval_chunk=chunk)
        # the features as gnnc holds them (sparse when few are nonzero); labels and masks only for the loss
        inputs = {k: t.to(device) for k, t in graph_inputs(graph).items()}
        env = dict(inputs)
        for layer in self.program.layers:
            interp.run_layer(layer, env, params, ctx)
        if output is None:
            return env[self.program.logits.name]
        return env[output] if output in inputs else interp.kept_value

    def _views(self, x: torch.Tensor, edge_index: torch.Tensor,
               edge_weight: torch.Tensor | None) -> tuple[Graph, dict[str, GraphView]]:
        """The graph around `x` and the edge views the layers read, built again only for other edges."""
        cached = self._graph
        if (cached is not None and cached[0] is edge_index and cached[1] == edge_index._version
                and cached[2] is edge_weight and cached[3] == getattr(edge_weight, "_version", None)
                and cached[4].num_nodes == x.shape[0]):
            graph, views = cached[4], cached[5]
            graph.x = x
            return graph, views
        graph = _graph(self.program, x, edge_index, edge_weight)
        views = {v: devices.place(GraphView.build(graph, v), x.device)
                 for v in sorted({layer.edges for layer in self.program.graph_layers()})}
        self._graph = (edge_index, edge_index._version, edge_weight, getattr(edge_weight, "_version", None),
                       graph, views)
        return graph, views


def value_named(program: Program, name: str) -> str:
    """The vertex value `predict --output NAME` names: a layer's output (NAME a layer: l0, l1, d1, ...) or the
    value of that name; GnncError listing the layers otherwise."""
    layers = {layer.name: layer.outputs[0].name for layer in program.layers
              if layer.outputs and layer.outputs[0].type is not None and layer.outputs[0].type.domain == "vertex"}
    if name in layers:
        return layers[name]
    values = {v.name for v in program.inputs if v.type is not None and v.type.domain == "vertex"}
    values.update(o.name for layer in program.layers for e in layer.eqns for o in e.outs
                  if o.type is not None and o.type.domain == "vertex")
    if name not in values:
        raise GnncError(f"--output {name}: model {program.name} has no layer or vertex value of that name (its "
                        f"layers: {', '.join(layers)}; or the name of a vertex value of its IR, which `gnnc inspect "
                        "PLAN --format ir` shows)")
    return name


def _graph(program: Program, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor | None) -> Graph:
    """A gnnc Graph of `x`'s rows and these edges (no labels: the module computes logits, not a loss)."""
    if x.dim() != 2:
        raise GnncError(f"to_torch: x must be [nodes, features], not of shape {list(x.shape)}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise GnncError(f"to_torch: edge_index must be [2, edges], not of shape {list(edge_index.shape)}")
    n = int(x.shape[0])
    ei = edge_index.detach().cpu().numpy().astype(np.int64, copy=False)
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise GnncError(f"to_torch: edge_index holds vertex {int(ei.min() if ei.min() < 0 else ei.max())}, "
                        f"outside the {n} rows of x")
    data = {} if edge_weight is None else edge_data.validate(
        {edge_data.WEIGHT: edge_weight.detach().cpu().numpy()}, ei.shape[1], "to_torch: edge_weight")
    empty = torch.zeros(n, dtype=torch.bool)
    graph = Graph(n, ei[0], ei[1], x, torch.zeros(n, dtype=torch.int64), empty, empty, empty, "to_torch",
                  edge_data=data)
    edge_data.check_fits(program, graph.edge_data, "to_torch", program.config_dict())
    return graph


def param_shapes(program: Program) -> dict[str, tuple[int, ...]]:
    """Every weight of the program by IR name, in program order, with its shape."""
    cfg = program.config_dict()
    return {p.value.name: tuple(eval_dim(d, cfg) for d in p.value.type.shape) for p in program.params()}


def _check_names(weights: Mapping[str, torch.Tensor], params: list[str], state: list[str]) -> None:
    """Every weight given and none besides them (the ops' running state may be absent: it starts fresh)."""
    missing = [n for n in params if n not in weights]
    extra = [str(n) for n in weights if n not in params and n not in state]
    if missing or extra:
        said = [f"missing {', '.join(missing)}" if missing else "",
                f"not in the model: {', '.join(extra)}" if extra else ""]
        raise GnncError(f"these weights do not belong to this model ({'; '.join(s for s in said if s)})")


def _checked(weights: Mapping[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    value = weights[name]
    if not isinstance(value, torch.Tensor):
        raise GnncError(f"weight {name}: expected a tensor, got a {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise GnncError(f"weight {name} has shape {list(value.shape)} but the model's is {list(shape)} "
                        "(another width of the model, or another graph's features or classes)")
    return value


def _add(module: torch.nn.Module, name: str, value: torch.Tensor, buffer: bool = False) -> None:
    """Register `value` under its dotted IR name, in nested containers, so that state_dict() keys are IR names."""
    *path, leaf = name.split(".")
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    if buffer:
        module.register_buffer(leaf, value)
    else:
        module.register_parameter(leaf, value)
