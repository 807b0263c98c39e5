"""--recompute's first layer in blocks (gnnc.runtime.recompute._FirstLayer, issue 35): a GCN-like first region and
the next layer's product computed a block of columns at a time forward and a block of rows at a time backward give
the run's values without --recompute (logits and gradients within 1e-6 relative: the region's gradients are
summed over row blocks), for the shapes it takes, with many blocks; the shapes it does not take run as before
(bitwise); and the step holds one [vertices, hidden] tensor less at its peak."""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.runtime import block_cache
from gnnc.runtime import recompute
from gnnc.runtime.executor import Interpreter, init_params
from gnnc.runtime.train import TrainConfig, Worker
from gnnc.testing import sgd_steps
from test_memory_products import _step_peak
from test_recompute import close

LAYER = """
layer Conv(in, out) with self_loops {{
  transform t = linear(h, out, bias = false)
  scatter   m = {weight} * src.t
  gather    a = {reduce}(m)
  apply     h = bias(a)
}}
model M(features, hidden = 16, classes, p = 0.5) {{
  {first}
  h = Conv(features, hidden)(h)
  h = {act}(h)
  h = dropout(h, p)
  {middle}
  h = Conv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}}
"""

# (name, source): the chunked shapes (feature dropout or none, relu or elu, edge data, three layers) and two it
# leaves alone (a mean, a first layer whose linear has a bias)
SHAPES = {
    "gcn": None,
    "no-feature-dropout": LAYER.format(weight="edge.gcn_norm", reduce="sum", first="h = x", act="relu", middle=""),
    "elu-edge-weight": LAYER.format(weight="edge.weight", reduce="sum", first="h = dropout(x, p)", act="elu",
                                    middle=""),
    "three-layers": LAYER.format(weight="edge.gcn_norm", reduce="sum", first="h = dropout(x, p)", act="relu",
                                 middle="h = Conv(hidden, hidden)(h)\n  h = relu(h)"),
    "mean": LAYER.format(weight="edge.gcn_norm", reduce="mean", first="h = dropout(x, p)", act="relu", middle=""),
}
CHUNKED = {"gcn", "no-feature-dropout", "elu-edge-weight", "three-layers"}


def _graph():
    graph = random_graph(n=300, e=3000, f=20, c=5, seed=2)
    graph.edge_data = {"weight": torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(2)) + 0.1}
    return graph


def _program(name: str, graph, hidden: int):
    model = api.load_model(EXAMPLES / "gcn.gnn", hidden=hidden) if SHAPES[name] is None else \
        api.load_model_source(SHAPES[name], f"{name}.gnn", hidden=hidden)
    return api.compile(model, graph).program


def _train(program, graph, recompute_: bool) -> list[dict]:
    worker, params, out = sgd_steps(program, graph, TrainConfig(seed=1, progress=False, recompute=recompute_))
    with torch.no_grad():
        out.append({"logits": worker.forward(params, False, 2)[0]})
    return out


# hidden 16: MKL's product; 100: the reduce kernel, and a partial column block
@pytest.mark.parametrize("name, hidden", [(n, h) for n in sorted(CHUNKED) for h in (16, 100)] + [("mean", 100)])
def test_blocks_give_the_values_of_the_run_without_recompute(name: str, hidden: int, monkeypatch) -> None:
    monkeypatch.setattr(recompute, "BLOCK_BYTES", 2048)  # blocks of 5-32 rows: every loop runs many times
    graph = _graph()
    program = _program(name, graph, hidden)
    first = recompute.first_layer(program, Interpreter(program).chains)
    assert (first is not None) == (name in CHUNKED)
    want, got = _train(program, graph, False), _train(program, graph, True)
    for step, (g, w) in enumerate(zip(got, want)):
        for k in w:
            if w[k] is None:
                assert g[k] is None, k
            elif first is not None:
                # the region's gradients (both weights, the bias) are summed over row blocks, and later steps start
                # from the parameters they moved: equal within rounding. Bitwise only where the block sums happen
                # to add in the kernel's order (an AVX-512 Xeon did for all but the first weight; an AVX2 EPYC
                # differs by up to 3.6e-7 in W1, W2 and the biases)
                assert close(g[k], w[k]), (step, k, ((g[k] - w[k]).abs().max() / w[k].abs().max()).item())
            else:
                assert torch.equal(g[k], w[k]), (step, k)


def test_the_evaluation_computes_the_first_layer_in_row_blocks(monkeypatch) -> None:
    """As (A[rows] x) W1 (gnnc.runtime.recompute._evaluate): within rounding of the run without --recompute."""
    monkeypatch.setattr(recompute, "BLOCK_BYTES", 2048)
    graph = _graph()
    program = _program("gcn", graph, 100)
    params = init_params(program, 1)
    logits = []
    for r, chunk in ((False, None), (True, None), (True, 40)):
        worker = Worker(program, graph, TrainConfig(seed=1, progress=False, recompute=r, eval_chunk=chunk))
        with torch.no_grad():
            logits.append(worker.forward(params, False, 0)[0])
    assert close(logits[1], logits[0]) and not torch.equal(logits[1], logits[0])  # reassociated
    # --eval-chunk: the next layer, whose product the blocks computed, runs whole; the others layer-wise
    assert close(logits[2], logits[0])


def test_the_step_holds_one_hidden_tensor_less_at_its_peak(monkeypatch) -> None:
    """The large blocks' high-water mark of a GCN step (hidden 128) under --recompute, with the first layer in
    blocks and without (`first_layer` matching nothing: the run before this function): its forward held the product
    beside the aggregation and its backward the layer's output beside its gradient, two [N, 128] tensors where the
    blocks hold one."""
    if not block_cache.install():
        pytest.skip(f"no block cache here ({block_cache.status()}): nothing counts live blocks")
    n, hidden = 6000, 128
    graph = random_graph(n=n, e=60000, f=32, c=8, seed=3)
    program = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=hidden), graph).program

    def step_peak() -> int:
        before, high = _step_peak(program, graph, True)
        return high - before

    blocks = step_peak()
    monkeypatch.setattr(recompute, "first_layer", lambda *args: None)
    whole = step_peak()
    assert blocks <= whole - 0.9 * n * hidden * 4, (whole / 2**20, blocks / 2**20)


GENERATED = """
layer Conv(in, out) with self_loops {{
  transform t = linear(h, out, bias = false)
  scatter   m = {weight} * src.t
  gather    a = {reduce}(m)
  apply     h = {apply}
}}
model M(features, hidden = 16, classes, p = {p}) {{
  {first}
  h = Conv(features, hidden)(h)
  {epilogue}
  {middle}
  h = Conv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}}
"""


def generated_first_layer(seed: int) -> tuple[str, bool]:
    """A random model of the shapes around `_FirstLayer`'s (feature dropout, edge weights, bias, each activation
    with its parameter, dropout after it, more layers; a mean, a value read twice), and whether it is one."""
    import random
    r = random.Random(seed)
    act = r.choice(["", "h = relu(h)", f"h = elu(h, {r.choice([0.5, 1.0, 2.0])})",
                    f"h = leaky_relu(h, {r.choice([0.01, 0.2])})"])
    dropped, bias = r.random() < 0.6, r.random() < 0.7
    reduce, twice = r.choice(["sum", "sum", "sum", "mean"]), r.random() < 0.2
    epilogue = "\n  ".join(s for s in (act, "h = dropout(h, p)" if dropped else "", "h = h + h" if twice else "") if s)
    source = GENERATED.format(
        weight=r.choice(["edge.gcn_norm", "edge.weight"]), reduce=reduce, apply="bias(a)" if bias else "a",
        p=r.choice([0.1, 0.5]), first=r.choice(["h = x", "h = dropout(x, p)"]), epilogue=epilogue,
        middle=r.choice(["", "h = Conv(hidden, hidden)(h)\n  h = relu(h)"]))
    return source, reduce == "sum" and not twice and bool(act or dropped or bias)


@pytest.mark.parametrize("seed", range(12))
def test_generated_models_give_the_values_of_the_run_without_recompute(seed: int, monkeypatch) -> None:
    """The fast path against the reference on generated models: the ones `first_layer` takes, computed in blocks,
    and the ones it leaves alone, within 1e-6 of the run without --recompute (differentially, not on examples)."""
    monkeypatch.setattr(recompute, "BLOCK_BYTES", 2048)
    source, chunked = generated_first_layer(seed)
    graph = _graph()
    program = api.compile(api.load_model_source(source, f"gen{seed}.gnn", hidden=[8, 40, 100][seed % 3]),
                          graph).program
    assert (recompute.first_layer(program, Interpreter(program).chains) is not None) == chunked, source
    want, got = _train(program, graph, False), _train(program, graph, True)
    for step, (g, w) in enumerate(zip(got, want)):
        for k in w:
            assert (g[k] is None) == (w[k] is None), k
            if w[k] is not None:
                assert close(g[k], w[k]), (step, k, source)


def test_generated_models_take_the_blocks_often() -> None:
    """The generator above reaches the fast path in most of its draws and leaves it in some."""
    taken = [generated_first_layer(seed)[1] for seed in range(12)]
    assert 6 <= sum(taken) <= 11, taken
