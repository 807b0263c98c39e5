"""hoist (issue 21, item 10): parameter-free, dropout-free computations of the inputs, computed once per run.

The pass alone against golden IR (SGC's propagations, GIN's first
aggregation), exact as a rewrite, idempotent, and blind to what changes
between steps (parameters, dropout, batch norm); the runtime computes a
hoisted equation in the first forward pass of a run only and training gives
the same logits as without the pass. On 2 processes (hoisted halos and
fetches, each rank caching its rows) see test_language_distributed.
"""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, check_golden, random_graph
from gnnc import api
from gnnc.frontend.elaborate import elaborate
from gnnc.passes.manager import DEFAULT_PIPELINE
from gnnc.runtime import implementations
from gnnc.runtime.train import TrainConfig, train
from gnnc.testing import assert_rewrite_exact, filecheck, run_pass

CORA = {"features": 1433, "classes": 7}


@pytest.mark.parametrize("name", ["sgc", "gin"])
def test_golden(name: str) -> None:
    # a path relative to the repository, so the printed `source` line is the same on every machine
    model = api.load_model_source((EXAMPLES / f"{name}.gnn").read_text(), f"examples/{name}.gnn")
    program = elaborate(model.module, {}, CORA)
    check_golden({"hoist": str(run_pass("hoist", program, prepare=True))}, name)


def test_marks_what_reads_only_the_inputs() -> None:
    out = run_pass("hoist", EXAMPLES / "gin.gnn", dims=CORA)
    filecheck(out, """
        CHECK: layer l0 graph GIN
        CHECK: spmm[hoisted=true, reduce=sum](%x)
        CHECK: mul[hoisted=true]
        CHECK: %l0.z:vertex:f32[features] = add[hoisted=true]
        CHECK-NOT: hoisted
        CHECK: layer l1 graph GIN
    """)
    # GCN reads dropout(x) first: nothing is the same in every step
    assert "hoisted" not in str(run_pass("hoist", EXAMPLES / "gcn.gnn", dims=CORA))


def test_batch_norm_and_parameters_stop_it_and_it_is_idempotent() -> None:
    source = """
    layer P() {
      scatter m = src.h
      gather  a = sum(m)
      apply   h = a
    }
    model M(features, classes) {
      h = P()(batch_norm(x))
      h = P()(x) + linear(h, features)
      loss = cross_entropy(linear(h, classes), y, mask = train)
    }
    """
    once = run_pass("hoist", source, dims={"features": 4, "classes": 2})
    assert str(once).count("hoisted=true") == 1  # the second P's aggregation of x only
    assert str(run_pass("hoist", once)) == str(once)
    stale = str(once).replace("linear[bias=true, out=features]", "linear[bias=true, hoisted=true, out=features]")
    assert str(run_pass("hoist", stale)) == str(once)  # a wrong mark is taken away


@pytest.mark.parametrize("name", ["sgc", "gin"])
def test_exact_as_a_rewrite(name: str) -> None:
    assert_rewrite_exact("hoist", EXAMPLES / f"{name}.gnn")


def test_a_run_computes_hoisted_equations_once_with_the_same_result(monkeypatch) -> None:
    graph = random_graph(n=40, e=160, f=6, c=3, seed=2)
    model = api.load_model(EXAMPLES / "sgc.gnn")
    hoisted = api.compile(model, graph).program
    plain = api.compile(model, graph, passes=[p for p in DEFAULT_PIPELINE if p != "hoist"]).program
    assert "hoisted=true" in str(hoisted) and "hoisted" not in str(plain)
    calls = {"spmm": 0}
    for key, impl in list(implementations.IMPLEMENTATIONS.items()):
        if key[0] == "spmm":
            def counted(e, ins, view, ctx, fn=impl.fn):
                calls["spmm"] += 1
                return fn(e, ins, view, ctx)
            counting = implementations.Implementation(counted, impl.sparse_input)
            monkeypatch.setitem(implementations.IMPLEMENTATIONS, key, counting)
    cfg = TrainConfig(epochs=4, lr=0.2, progress=False)
    once = train(hoisted, graph, cfg)
    assert calls["spmm"] == 2  # K = 2 propagations, in the first forward pass of the run
    every = train(plain, graph, cfg)
    assert calls["spmm"] == 2 + 2 * 2 * 4  # then per forward pass: a training and an evaluation one per epoch
    assert torch.equal(once.logits, every.logits)
