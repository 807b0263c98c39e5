"""sink-bias alone: where a bias moves (FileCheck), where it must not, and that moving it is exact.

Exactness is checked in float64 with every parameter random (the biases
are initialised to zero, which would hide a misplaced bias) on random
graphs with isolated vertices, where a bias moved past a mean would show.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc.ir import Program
from gnnc.passes.analysis.legality import pushpull_blocker
from gnnc.passes.manager import run_pipeline
from gnnc.testing import as_program, filecheck, run_pass

SAGE = EXAMPLES / "sage.gnn"
BEFORE = ["infer-shapes", "check", "lower", "reorder-gemm"]
TOL = 1e-10


def layer_src(body: str, sync: str = "sum") -> str:
    """A one-layer model whose layer aggregates a = mean(src.h), runs `body` into t, and syncs t."""
    return ("layer L(in, out) {\n  scatter m = src.h\n  gather a = mean(m)\n"
            f"{body}\n  sync s = {sync}(t)\n  apply h = s\n}}\n"
            "model M(features, classes) {\n  h = L(features, classes)(x)\n"
            "  loss = cross_entropy(h, y, mask = train)\n}\n")


DIMS = {"features": 12, "classes": 4}

# name -> (layer body, sync reduce, whether every bias ends after the sync)
CASES = {
    "sage": ("  transform t = linear(a, out) + linear(h, out, bias = false)", "sum", True),
    "two-biases": ("  transform t = linear(a, out) + linear(h, out)", "sum", True),
    "minuend": ("  transform t = linear(a, out) - linear(h, out, bias = false)", "sum", True),
    "subtrahend": ("  transform t = linear(h, out, bias = false) - linear(a, out)", "sum", False),
    "relu": ("  transform t = relu(linear(a, out)) + linear(h, out, bias = false)", "sum", False),
    "sync-mean": ("  transform t = linear(a, out) + linear(h, out, bias = false)", "mean", False),
    "used-twice": ("  transform u = linear(a, out)\n  transform t = u + relu(u)", "sum", False),
    "bias-before-mean": ("  transform t = linear(a, out)", "sum", True),  # the bias is after the mean already
}
# a bias before the aggregation: reorder-gemm does not fire (d_out > d_in), the mean sits between bias and sync
BEFORE_MEAN = ("layer L(in, out) {\n  transform u = linear(h, out)\n  scatter m = src.u\n  gather a = mean(m)\n"
               "  sync s = sum(a)\n  apply h = s\n}\n"
               "model M(features, classes) {\n  h = L(features, classes)(x)\n"
               "  loss = cross_entropy(h, y, mask = train)\n}\n")


def outputs_f64(program: Program, graph) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter gradient in float64, with every parameter drawn at random by its name."""
    from gnnc.graph import GraphView
    from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs, init_params

    params = {}
    for name, p in init_params(program, 0).items():
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        params[name] = torch.nn.Parameter(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    inputs = graph_inputs(graph)
    inputs["x"] = inputs["x"].to_dense().double()
    views = {}
    for layer in program.graph_layers():
        view = GraphView.build(graph, layer.edges)
        view.edge_data = {k: v.double() for k, v in view.edge_data.items()}
        views[layer.edges] = view
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), False, lambda i: 0,
                      max(float(graph.train_mask.sum()), 1.0))
    logits, loss = forward(Interpreter(program), params, inputs, ctx)
    loss.backward()
    return logits.detach(), {k: p.grad.detach() for k, p in params.items() if p.grad is not None}


def assert_same_function(before: Program, after: Program, seeds=(0, 1, 2)) -> None:
    for seed in seeds:
        graph = random_graph(n=40, e=160, f=12, c=4, seed=seed)  # its last 3 vertices are isolated
        out0, g0 = outputs_f64(before, graph)
        out1, g1 = outputs_f64(after, graph)
        _close(f"logits (graph seed {seed})", out1, out0)
        assert g0.keys() == g1.keys()
        for k in g0:
            _close(f"gradient of {k} (graph seed {seed})", g1[k], g0[k])


def _close(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got - want).abs().max().item()
    assert err <= TOL * max(1.0, want.abs().max().item()), f"{what} changed by sink-bias: max error {err:.3g}"


def before_and_after(src, dims=None, overrides=None) -> tuple[Program, Program]:
    program = run_pipeline(as_program(src, dims or DIMS, overrides), BEFORE, verify_each=True)
    return program, run_pipeline(program, ["sink-bias"], verify_each=True)


def test_sage_bias_moves_after_the_sync() -> None:
    # reorder-gemm left lin_l's bias after the mean; it moves past the add and the sync, names after it kept
    out = run_pass("sink-bias", SAGE, dims={"features": 64, "classes": 3})
    filecheck(out, """
        CHECK: layer l0 graph SAGE
        CHECK: %l0.t~1^a:vertex:f32[hidden] = spmm[reduce=mean](%l0.t~1^g)
        CHECK-NEXT: %l0.t~2:vertex:f32[hidden] = linear[bias=false, out=hidden](%h, %l0.linear1.weight)
        CHECK-NEXT: %l0.t^u:vertex:f32[hidden] = add(%l0.t~1^a, %l0.t~2)
        CHECK-NEXT: %l0.s^u:vertex:f32[hidden] = sync[reduce=sum](%l0.t^u)
        CHECK-NEXT: %l0.s:vertex:f32[hidden] = bias(%l0.s^u, %l0.linear0.bias)
        CHECK-NEXT: out %l0.s
        CHECK: layer l1 graph SAGE
        CHECK-NOT: bias(
        CHECK: sync[reduce=sum]
        CHECK-NEXT: %l1.s:vertex:f32[classes] = bias(%l1.s^u, %l1.linear0.bias)
    """)


def test_sage_linear_bias_is_split_when_not_reordered() -> None:
    # d_out > d_in: the map stays after the mean with its bias operand; the bias is split off and sunk
    out = run_pass("sink-bias", SAGE, dims={"features": 4, "classes": 3}, overrides={"hidden": 64})
    filecheck(out, """
        CHECK: layer l0 graph SAGE
        CHECK: %l0.a:vertex:f32[features] = spmm[reduce=mean](%h)
        CHECK-NEXT: %l0.t~1^g:vertex:f32[hidden] = linear[bias=false, out=hidden](%l0.a, %l0.linear0.weight)
        CHECK-NOT: bias(
        CHECK: %l0.t^u:vertex:f32[hidden] = add(%l0.t~1^g, %l0.t~2)
        CHECK-NEXT: %l0.s^u:vertex:f32[hidden] = sync[reduce=sum](%l0.t^u)
        CHECK-NEXT: %l0.s:vertex:f32[hidden] = bias(%l0.s^u, %l0.linear0.bias)
    """)


def test_two_biases_both_move() -> None:
    out = run_pass("sink-bias", layer_src(CASES["two-biases"][0]), dims=DIMS)
    filecheck(out, """
        CHECK: add(%l0.t~1^a, %l0.t~2^g)
        CHECK-NEXT: sync[reduce=sum]
        CHECK-NEXT: = bias({{.*}}, %l0.linear1.bias)
        CHECK-NEXT: %l0.s:vertex:f32[classes] = bias({{.*}}, %l0.linear0.bias)
    """)


def test_minuend_moves_subtrahend_does_not() -> None:
    moved = run_pass("sink-bias", layer_src(CASES["minuend"][0]), dims=DIMS)
    filecheck(moved, "CHECK: sub(\nCHECK-NEXT: sync[reduce=sum]\nCHECK-NEXT: %l0.s:{{.*}} = bias(")
    kept = run_pass("sink-bias", layer_src(CASES["subtrahend"][0]), dims=DIMS)
    filecheck(kept, "CHECK: = bias(%l0.t~2^a, %l0.linear1.bias)\nCHECK: sub(\nCHECK: sync[\nCHECK-NOT: bias(")


@pytest.mark.parametrize("case", ["relu", "sync-mean", "used-twice"])
def test_bias_stays_where_it_would_not_commute(case: str) -> None:
    body, sync, _ = CASES[case]
    out = run_pass("sink-bias", layer_src(body, sync), dims=DIMS)
    # reorder-gemm made lin_l's bias a `bias` op after the mean; it stays before the sync
    filecheck(out, "CHECK: = bias(%l0.{{.*}}, %l0.linear0.bias)\nCHECK: sync[\nCHECK-NOT: bias(")


def test_bias_before_a_mean_stays() -> None:
    # mean over an empty neighbourhood is 0, so mean(u + b) != mean(u) + b at isolated vertices: no move
    out = run_pass("sink-bias", BEFORE_MEAN, dims={"features": 4, "classes": 8})
    filecheck(out, """
        CHECK: linear[bias=true, out=classes](%x, %l0.linear0.weight, %l0.linear0.bias)
        CHECK-NEXT: spmm[reduce=mean](%l0.u)
        CHECK-NEXT: sync[reduce=sum]
        CHECK-NOT: bias(
    """)


def test_gin_outer_bias_moves_inner_stays() -> None:
    out = run_pass("sink-bias", EXAMPLES / "gin.gnn", dims=DIMS)
    filecheck(out, """
        CHECK: layer l0 graph GIN
        CHECK: %l0.t~1:vertex:f32[hidden] = linear[bias=true, out=hidden]
        CHECK-NEXT: relu(%l0.t~1)
        CHECK-NEXT: %l0.t^g:vertex:f32[hidden] = linear[bias=false, out=hidden](%l0.t~2, %l0.linear1.weight)
        CHECK-NEXT: %l0.s^u:vertex:f32[hidden] = sync[reduce=sum](%l0.t^g)
        CHECK-NEXT: %l0.s:vertex:f32[hidden] = bias(%l0.s^u, %l0.linear1.bias)
    """)


@pytest.mark.parametrize("example", ["gcn", "gat"])
def test_layers_without_a_movable_bias_are_unchanged(example: str) -> None:
    before, after = before_and_after(EXAMPLES / f"{example}.gnn")
    assert str(after) == str(before)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sink_bias_is_exact_f64(case: str) -> None:
    body, sync, moves = CASES[case]
    before, after = before_and_after(layer_src(body, sync))
    assert (str(after) != str(before)) == moves
    assert_same_function(before, after)


@pytest.mark.parametrize("dims,overrides", [({"features": 12, "classes": 4}, None),  # layer 0 split, 1 reordered
                                            ({"features": 12, "classes": 4}, {"hidden": 8})])  # both reordered
def test_sage_is_exact_f64(dims, overrides) -> None:
    before, after = before_and_after(SAGE, dims, overrides)
    assert str(after) != str(before)
    assert_same_function(before, after)


@pytest.mark.parametrize("example", ["gin", "gcn", "gat"])
def test_examples_are_exact_f64(example: str) -> None:
    assert_same_function(*before_and_after(EXAMPLES / f"{example}.gnn"))


def test_bias_before_mean_is_exact_f64() -> None:
    assert_same_function(*before_and_after(BEFORE_MEAN, {"features": 12, "classes": 4}))


@pytest.mark.parametrize("dims,overrides", [({"features": 1433, "classes": 7}, None),
                                            ({"features": 100, "classes": 7}, {"hidden": 256})])
def test_sage_becomes_pushpull_legal(dims, overrides) -> None:
    before, after = before_and_after(SAGE, dims, overrides)
    eqn, why = pushpull_blocker(before.graph_layers()[0])
    assert eqn.op in ("bias", "linear") and "bias" in why
    assert [pushpull_blocker(layer) for layer in after.graph_layers()] == [None, None]
