"""Fused chains in the one-process interpreter (gnnc.runtime.fusion) compute the equations they replace.

Which chains are found in the examples is stated here (a change to the IR that breaks a chain shows
up as a slower run nowhere else). Each example then runs a training forward and backward pass with
the chains fused against the same pass with the compiled kernels off (every chain declines, its
equations run) and against the reference implementations in float64: logits and every parameter
gradient. (The kernels themselves are checked in float64 in test_native_kernels; a model's hoisted
edge weights are float32.) `gnnc run` says which kernels ran.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import EXAMPLES, ROOT, random_graph

from gnnc import api
from gnnc.graph import GraphView
from gnnc.runtime import fusion, rng
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs, init_params
from gnnc.runtime.kernels import native

compiled = pytest.mark.skipif(native.library() is None, reason=f"compiled kernels: {native.status()}")

MODELS = {"gcn": {}, "sage": {}, "gin": {}, "gat": {"heads": 3, "hidden": 4}, "gcnii": {"layers": 4}}
# (kind, ops, in place) of each chain found: the attention chains, then the epilogues, in program order
CHAINS = {
    "gcn": [("epilogue", "sync bias", True), ("epilogue", "relu dropout", True), ("epilogue", "sync bias", True)],
    "sage": [("epilogue", "add sync bias", True), ("epilogue", "relu dropout", True),
             ("epilogue", "add sync bias", True)],
    "gin": [("epilogue", "relu", True), ("epilogue", "sync bias", True), ("epilogue", "relu dropout", True),
            ("epilogue", "add", True), ("epilogue", "relu", True), ("epilogue", "sync bias", True)],
    "gat": [("attention", "dot dot sddmm leaky_relu edge_softmax dropout spmm", False)] * 2
    + [("epilogue", "sync bias", True), ("epilogue", "elu dropout", True), ("epilogue", "sync bias", True)],
    "gcnii": [("epilogue", "relu", True)] + [("epilogue", "add", True), ("epilogue", "add", True),
                                             ("epilogue", "relu dropout", True)] * 4,
}


@pytest.fixture(scope="module")
def graph():
    return random_graph(n=60, e=300, f=12, c=4, seed=3)


def _program(name: str, graph):
    return api.compile(api.load_model(EXAMPLES / f"{name}.gnn", **MODELS[name]), graph).program


@pytest.mark.parametrize("name", list(MODELS))
def test_chains_found_in_the_examples(name: str, graph) -> None:
    chains = fusion.find_chains(_program(name, graph))
    assert [(c.kind, " ".join(e.op for e in c.eqns), c.inplace) for c in chains.values()] == CHAINS[name]


def _step(program, graph, use_kernels: bool, dtype: torch.dtype):
    """One training forward and backward: (logits, {param: gradient}), in `dtype`."""
    params = {k: torch.nn.Parameter(p.detach().to(dtype)) for k, p in init_params(program, 0).items()}
    inputs = graph_inputs(graph)
    inputs["x"] = inputs["x"].to(dtype)
    views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
    key = rng.stream_key(0, 1)
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), True,
                      lambda i: rng.stream_key(key, i), float(graph.train_mask.sum()), use_kernels)
    logits, loss = forward(Interpreter(program), params, inputs, ctx)
    loss.backward()
    return logits.detach(), {k: p.grad for k, p in params.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


@compiled
@pytest.mark.parametrize("name", list(MODELS))
def test_fused_chains_equal_the_equations(name: str, graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fused (float32) against the same run with the compiled kernels off (float32, the project's 1e-5) and
    against the reference equations in float64; with the kernels off, no chain runs."""
    program = _program(name, graph)
    ran = []
    run = fusion.run

    def counted(chain, *args):
        done = run(chain, *args)
        ran.append(done)
        return done

    monkeypatch.setattr(fusion, "run", counted)
    want_logits, want_grads = _step(program, graph, False, torch.float64)  # the reference equations
    assert not ran
    with native.disabled():
        torch_logits, torch_grads = _step(program, graph, True, torch.float32)
    assert len(ran) == len(CHAINS[name]) and not any(ran)  # each chain declined: its equations ran
    ran.clear()
    logits, grads = _step(program, graph, True, torch.float32)
    assert len(ran) == len(CHAINS[name]) and all(ran)  # every chain ran as its kernel
    assert _rel(logits, torch_logits) < 1e-5 and _rel(logits, want_logits) < 1e-4
    for k, g in want_grads.items():
        assert _rel(grads[k], torch_grads[k]) < 1e-5, k
        assert _rel(grads[k], g) < 1e-4, k


def test_gnnc_run_says_which_kernels_and_allocator_ran(graph, tmp_path) -> None:
    """GNNC_NATIVE=0 turns the compiled kernels off: the run trains as before and its summary says so."""
    path = tmp_path / "g.pt"
    torch.save({"edge_index": torch.stack([torch.as_tensor(graph.src), torch.as_tensor(graph.dst)]), "x": graph.x,
                "y": graph.y, "train_mask": graph.train_mask, "val_mask": graph.val_mask,
                "test_mask": graph.test_mask}, path)
    out = {}
    for switch in ("1", "0"):
        env = dict(os.environ, GNNC_NATIVE=switch)
        r = subprocess.run([sys.executable, "-m", "gnnc", "run", str(EXAMPLES / "gcn.gnn"), "--graph", str(path),
                            "--epochs", "3", "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
        out[switch] = (json.loads(r.stdout.strip().splitlines()[-1]), r.stderr)
    off, off_stderr = out["0"]
    assert off["cpu_kernels"] == "torch (compiled kernels turned off by GNNC_NATIVE=0)"
    assert "note: CPU kernels: torch (compiled kernels turned off by GNNC_NATIVE=0)" in off_stderr
    on, on_stderr = out["1"]
    assert on["cpu_kernels"] == "compiled" or on["cpu_kernels"].startswith("torch (compiled kernels unavailable")
    assert off["cpu_allocator"] == "torch's allocator (turned off by GNNC_NATIVE=0)"
    assert "note: CPU allocator: torch's allocator (turned off by GNNC_NATIVE=0)" in off_stderr
    assert on["cpu_allocator"] == "block cache" or "note: CPU allocator: torch's allocator (" in on_stderr
    assert abs(on["train_loss"] - off["train_loss"]) < 1e-5 * abs(off["train_loss"])


@compiled
def test_in_place_chains_overwrite_their_input(graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """GCN's bias writes over the SpMM's result, and the relu-dropout over the bias's (no new [vertices, width]
    tensor), within autograd's rules."""
    program = _program("gcn", graph)
    written = []
    check = fusion._overwritable
    monkeypatch.setattr(fusion, "_overwritable", lambda x: written.append(check(x)) or written[-1])
    _step(program, graph, True, torch.float32)
    assert written == [True, True, True]  # both layers' bias and the relu-dropout between them, in place


@compiled
@pytest.mark.parametrize("where", ["bf16", "standin"])
def test_no_chain_runs_at_16_bits_or_off_the_cpu(where: str, graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernels are CPU fp32 (and fp64): a run at --precision bf16 on the CPU (whose sparse-feature
    product leaves GAT's z in fp32, which the attention kernel would take) and a run on another device (the
    stand-in for a GPU) train with every chain declining, their equations run as the torch ops."""
    from standin_device import STANDIN, StandinDevice
    from gnnc.runtime.train import TrainConfig, Worker, make_optimizer

    graph = random_graph(n=60, e=300, f=12, c=4, seed=3)
    graph.x = graph.x * (torch.rand(graph.x.shape, generator=torch.Generator().manual_seed(5)) < 0.03)  # bag of words
    program = _program("gat", graph)
    ran = []
    run = fusion.run
    monkeypatch.setattr(fusion, "run", lambda chain, *args: ran.append(run(chain, *args)) or ran[-1])
    cfg = TrainConfig(progress=False, precision="bf16") if where == "bf16" else \
        TrainConfig(progress=False, device=STANDIN.type)
    with StandinDevice() if where == "standin" else contextlib.nullcontext():
        worker = Worker(program, graph, cfg)
        params = init_params(program, cfg.seed, worker.device)
        worker.train_epoch(params, make_optimizer(program, params, cfg), 0)
    assert ran and not any(ran)


@compiled
def test_a_head_shaped_aggregation_is_overwritten_within_autograd(graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """GATv2's aggregation runs as the SpMM kernel (its scores are not GAT's dots), whose result has heads: a
    tensor of its own (not a view made inside the custom Function, which torch forbids writing over and
    gnnc's first GATv2 run crashed on). The concat's bias does not write over that view in training: autograd's
    CopySlices would clone the whole gradient of its base in the backward (fusion._overwritable)."""
    source = (EXAMPLES / "gat.gnn").read_text().replace(
        "transform z = linear(h, heads, out, bias = false)           # [heads, out]\n"
        "  scatter   e = leaky_relu(dot(src.z) + dot(dst.z), slope)",
        "transform z = linear(h, heads, out, bias = false)\n"
        "  transform zr = linear(h, heads, out)\n"
        "  scatter   e = dot(leaky_relu(src.z + dst.zr, slope))", 1)
    assert "dst.zr" in source
    program = api.compile(api.load_model_source(source, "gatv2.gnn", heads=3, hidden=4), graph).program
    written = []
    check = fusion._overwritable
    monkeypatch.setattr(fusion, "_overwritable", lambda x: written.append(check(x)) or written[-1])
    _step(program, graph, True, torch.float32)
    assert written == [False, True, True]  # the first layer's bias beside the concat's view, the elu-dropout, the
    # second layer's bias over its SpMM's result
