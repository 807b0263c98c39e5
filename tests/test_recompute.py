"""--recompute (issue 35, item 1): a training step keeps only the graph layers' inputs and runs each layer again in
its backward (gnnc.runtime.recompute), with the same gradients, running state and logits as without; it keeps less;
the memory pre-check prices it; several processes or sampled minibatches are refused with exit 2."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api, cli, memory_check
from gnnc.program_gen import generate
from gnnc.runtime import recompute as recompute_module
from gnnc.runtime.executor import init_params
from gnnc.testing import sgd_steps
from gnnc.runtime.train import TrainConfig, Worker

BN = """
layer Conv(in, out) with self_loops {
  transform t = linear(h, out, bias = false)
  scatter   m = edge.gcn_norm * src.t
  gather    a = sum(m)
  apply     h = relu(batch_norm(a))
}
model M(features, classes) {
  h = dropout(x, 0.5)
  h = Conv(features, 16)(h)
  h = dropout(h, 0.5)
  h = Conv(16, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""


def _model(source: str):
    kind, name = source.split(":")
    if kind == "example":
        sets = {"gat": {"heads": 3, "hidden": 4}, "gcnii": {"layers": 4}}.get(name, {})
        return api.load_model(EXAMPLES / f"{name}.gnn", **sets)
    return api.load_model_source(BN if name == "bn" else generate(int(name)), f"{name}.gnn")


def _train(program, graph, recompute: bool):
    cfg = TrainConfig(seed=1, progress=False, recompute=recompute)
    worker, params, out = sgd_steps(program, graph, cfg)
    with torch.no_grad():
        out.append({"logits": worker.forward(params, False, 2)[0], **worker.state})
    return out


@pytest.mark.parametrize("source", [f"example:{m}" for m in ("gcn", "sage", "gat", "gin", "gcnii")] + ["gen:bn"]
                         + [f"gen:{s}" for s in range(12)])
def test_recomputed_layers_give_the_same_gradients_state_and_logits(source: str) -> None:
    graph = random_graph(n=80, e=400, f=10, c=4, seed=2)
    graph.edge_data = {"weight": torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(2)) + 0.1}
    program = api.compile(_model(source), graph).program
    want, got = _train(program, graph, False), _train(program, graph, True)
    for g, w in zip(got, want):
        for k in w:
            assert (g[k] is None and w[k] is None) or close(g[k], w[k]), (source, k)


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-6) -> bool:
    """Equal within rtol of the tensor's largest magnitude: a GCN-like first layer's weight gradient is summed over
    row blocks under --recompute (gnnc.runtime.recompute._FirstLayer), not in one product, and so are the next
    weight's and the biases' (tests/test_recompute_chunked.py)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if torch.equal(got, want):
        return True
    scale = want.abs().max().item() if want.numel() else 0.0
    return bool((got - want).abs().max().item() <= rtol * scale)


def _saved_bytes(program, graph, recompute: bool, monkeypatch) -> int:
    """What a training forward keeps until its backward: the tensors autograd saves and those a checkpoint holds
    as its region's inputs, by storage, less the graph's own features (held anyway)."""
    worker = Worker(program, graph, TrainConfig(seed=1, progress=False, recompute=recompute))
    params = init_params(program, 1)
    worker.forward(params, True, 0)[1].backward()
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[(st.data_ptr(), st.nbytes())] = st.nbytes()
        return t

    def holding(fn, *args, **kwargs):
        for t in args:
            pack(t)
        return checkpoint(fn, *args, **kwargs)

    checkpoint = recompute_module.checkpoint
    monkeypatch.setattr(recompute_module, "checkpoint", holding)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = worker.forward(params, True, 1)
    loss.backward()
    x = worker.inputs["x"].untyped_storage()
    seen.pop((x.data_ptr(), x.nbytes()), None)
    return sum(seen.values())


@pytest.mark.parametrize("name", ["gat", "sage", "gcn"])
def test_a_recomputed_step_keeps_less(name: str, monkeypatch) -> None:
    graph = random_graph(n=400, e=3000, f=10, c=4, seed=2)
    program = api.compile(_model(f"example:{name}"), graph).program
    kept, recomputed = (_saved_bytes(program, graph, r, monkeypatch) for r in (False, True))
    # GCN keeps its first layer's output either way (the next layer's weight gradient reads it) and, under
    # --recompute, the last layer's logits as without (the layer after the first, in blocks, runs as without: its
    # values are [N, classes]); what its blocks save is at the step's peak (tests/test_recompute_chunked.py)
    assert recomputed <= {"gcn": 1.0}.get(name, 0.8) * kept, (kept, recomputed)


def test_the_memory_check_prices_recomputation(tmp_path, monkeypatch) -> None:
    """Counted by hand on a 40-vertex ring for GCN (hidden 16, 5 features, 3 classes), whose first layer runs in
    blocks (gnnc.runtime.recompute.first_layer): that layer's input, output and a block of its product's columns
    (not its product beside its aggregation) and structure, the next layer's whole `layer_memory` (it runs as
    without recomputation), and a backward that holds only the next layer's output gradient (the others are
    written over the first layer's output); a first layer not in blocks (here by `first_layer_in_blocks`
    answering no): its whole `layer_memory` (it is not run again), every other layer's input rows (but the first
    layer's output) and structure kept, and the largest of those layers' whole `layer_memory` while it is run
    again (passes/cost/memory.py)."""
    n = 40
    src = np.arange(n)
    ei = np.stack([np.concatenate([src, (src + 1) % n]), np.concatenate([(src + 1) % n, src])])
    np.savez(tmp_path / "ring.npz", edge_index=ei, x=np.ones((n, 5), np.float32), y=np.arange(n) % 3)
    graph = api.load_graph(str(tmp_path / "ring.npz"))
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn", hidden=16), graph)
    full = memory_check.estimate_run_memory(plan, graph=graph)
    blocks = memory_check.estimate_run_memory(plan, graph=graph, recompute=True)
    monkeypatch.setattr(memory_check, "first_layer_in_blocks", lambda program: False)
    est = memory_check.estimate_run_memory(plan, graph=graph, recompute=True)
    e = 80 + 40  # the self_loops view
    whole = [4 * (n * 5 + n * 16 + n * 16) + e * 12, 4 * (n * 16 + n * 3 + n * 3) + e * 12]
    backward = max(4 * (n * 5 + n * 16), 4 * (n * 16 + n * 3))
    assert full.terms["activations"] == sum(whole) + backward
    # in blocks: the product's block is min(16, FIRST_LAYER_COLUMNS = 32) columns wide, as wide as the product here
    assert blocks.terms["activations"] == 4 * (n * 5 + n * 16 + n * 16) + e * 12 + whole[1] + 4 * n * 3
    # the second layer's input rows are the first layer's output, counted in whole[0]: its structure only
    assert est.terms["activations"] == whole[0] + e * 12 + whole[1] + backward
    for other in (blocks, est):
        assert {k: v for k, v in other.terms.items() if k != "activations"} == \
            {k: v for k, v in full.terms.items() if k != "activations"}


def test_the_pricing_blocks_as_wide_as_the_runtime() -> None:
    from gnnc.passes.cost import memory
    assert memory.FIRST_LAYER_COLUMNS == recompute_module.COLUMN_BLOCK


@pytest.mark.parametrize("extra", [["--nproc", "2"], ["--fanout", "5,5", "--batch-size", "16"]])
def test_recompute_on_several_processes_or_minibatches_exits_2(extra: list[str], capsys) -> None:
    assert cli.main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--epochs", "1", "--recompute",
                     *extra]) == 2
    assert "--recompute runs one process's full-graph training" in capsys.readouterr().err


def test_gnnc_run_recompute_trains_as_without(capsys) -> None:
    args = ["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--epochs", "2", "--json"]
    runs = []
    for more in ([], ["--recompute"]):
        assert cli.main(args + more) == 0
        runs.append(capsys.readouterr().out.strip().splitlines()[-1])
    import json
    a, b = (json.loads(r) for r in runs)
    assert a["train_loss"] == b["train_loss"] and a["test_acc"] == b["test_acc"]
    assert b["predicted_peak_rss_bytes"] != a["predicted_peak_rss_bytes"]  # the pre-check priced it
