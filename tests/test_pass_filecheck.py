"""The distributed passes one at a time, FileCheck style: assign-strategy, insert-comm, predict-bytes,
choose-strategy and select-hybrid, each run alone on IR prepared up to just before it.

The graph is small enough to count by hand: 4 vertices on 2 workers, edges 0->2, 1->2 and 3->0
(GCN's `self_loops` view adds one self-loop per vertex). Worker 0 holds vertices 0 and 1, worker 1
holds 2 and 3; under DepComm worker 1 fetches rows 0 and 1 (the in-neighbours of 2) and worker 0
fetches row 3 (the in-neighbour of 0): 3 rows per layer and direction.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import EXAMPLES

from gnnc.cluster import resolve_cluster
from gnnc.errors import GnncError
from gnnc.graph import Graph
from gnnc.passes.context import PassContext
from gnnc.passes.partition.core import Partition
from gnnc.testing import filecheck, run_pass

GCN = EXAMPLES / "gcn.gnn"
DIMS = {"features": 3, "classes": 2}
PREPARED = "infer-shapes,check,lower,reorder-gemm,sink-bias"  # the default pipeline, before the planning passes


def tiny_graph() -> Graph:
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    mask = torch.tensor([True, True, False, False])
    return Graph(4, np.array([0, 1, 3]), np.array([2, 2, 0]), x, torch.tensor([0, 1, 0, 1]), mask, ~mask,
                 torch.zeros(4, dtype=torch.bool), "tiny")


def context(strategy: str | None = None) -> PassContext:
    ctx = PassContext(graph=tiny_graph(), workers=2,
                      partition=Partition(np.array([0, 0, 1, 1], dtype=np.int64), 2, "given"),
                      cluster=resolve_cluster(None))
    ctx.results.strategy = strategy
    return ctx


def prepared(ctx: PassContext, upto: str = ""):
    """GCN on the tiny graph through the default pipeline and then `upto` (pipeline text)."""
    program = run_pass(PREPARED, str(GCN), dims=DIMS, ctx=ctx, prepare=False)
    return run_pass(upto, program, ctx=ctx) if upto else program


def test_assign_strategy_one_per_layer_and_segments() -> None:
    """One strategy per graph layer; a depcache run gets the first layer of its segment."""
    ctx = context("depcomm,depcache")
    out = run_pass("assign-strategy", prepared(ctx), ctx=ctx)
    filecheck(out, """
        CHECK: layer l0 graph GCNConv
        CHECK-SAME: [strategy=depcomm]
        CHECK: layer l1 graph GCNConv
        CHECK-SAME: [segment=1, strategy=depcache]
    """)


def test_assign_strategy_defaults_to_depcomm_everywhere() -> None:
    """Without a choice every graph layer runs depcomm; dense layers get no strategy."""
    ctx = context()
    out = run_pass("assign-strategy", prepared(ctx), ctx=ctx)
    filecheck(out, """
        CHECK: layer d0 dense
        CHECK-NOT: strategy=
        CHECK: layer l0 graph GCNConv{{.*}}[strategy=depcomm]
        CHECK: layer l1 graph GCNConv{{.*}}[strategy=depcomm]
    """)


def test_assign_strategy_refuses_pushpull_after_the_first_layer() -> None:
    """P3 splits the input features: pushpull on the second layer names that layer."""
    ctx = context("depcomm,pushpull")
    with pytest.raises(GnncError, match="layer l1 .*pushpull runs the first graph layer only"):
        run_pass("assign-strategy", prepared(ctx), ctx=ctx)


def test_insert_comm_halo_once_before_the_aggregation() -> None:
    """depcomm: one halo per value and layer, just before the spmm that reads neighbours' rows."""
    ctx = context("depcomm")
    out = run_pass("insert-comm", prepared(ctx, "assign-strategy"), ctx=ctx)
    filecheck(out, """
        CHECK: layer l0 graph
        CHECK: %l0.t:vertex:f32[hidden] = linear
        CHECK: %l0.t^halo:vertex:f32[hidden] = halo(%l0.t)
        CHECK-NEXT: = spmm[reduce=sum](%l0.t^halo,
        CHECK-NOT: halo(
        CHECK: layer l1 graph
        CHECK: %l1.t^halo:vertex:f32[classes] = halo(%l1.t)
        CHECK-NOT: halo(
    """)


def test_insert_comm_by_strategy() -> None:
    """bcast1d broadcasts row blocks; pushpull's sync becomes P3's pull; a late depcache segment fetches."""
    ctx = context("pushpull,bcast1d")
    out = run_pass("insert-comm", prepared(ctx, "assign-strategy"), ctx=ctx)
    filecheck(out, """
        CHECK: layer l0 graph
        CHECK-NOT: halo(
        CHECK: = reduce_scatter[reduce=sum](%l0.a)
        CHECK: layer l1 graph
        CHECK: %l1.t^bcast_rows:vertex:f32[classes] = bcast_rows(%l1.t)
    """)
    ctx = context("depcomm,depcache")
    out = run_pass("insert-comm", prepared(ctx, "assign-strategy"), ctx=ctx)
    filecheck(out, """
        CHECK: layer l1 graph
        CHECK-NEXT: param
        CHECK: in %h.2
        CHECK-NEXT: %h.2^fetch:vertex:f32[hidden] = fetch(%h.2)
        CHECK-NOT: halo(
    """)


def test_insert_comm_requires_strategies() -> None:
    """Run alone, insert-comm names what it needs instead of doing nothing."""
    ctx = context()
    with pytest.raises(GnncError, match="pass 'insert-comm' requires that graph layers carry a strategy attribute"):
        run_pass("insert-comm", prepared(ctx), ctx=ctx)


def test_predict_bytes_counts_the_halo_rows() -> None:
    """3 remote rows a layer each way (see the module docstring), 4 bytes an element, at each layer's width."""
    ctx = context("depcomm")
    out = run_pass("predict-bytes", prepared(ctx, "assign-strategy,insert-comm"), ctx=ctx)
    hidden, classes = 16, 2
    filecheck(out, f"""
        CHECK: = halo[bytes_bwd={3 * hidden * 4}, bytes_fwd={3 * hidden * 4}](%l0.t)
        CHECK: = halo[bytes_bwd={3 * classes * 4}, bytes_fwd={3 * classes * 4}](%l1.t)
    """)
    step = ctx.results.predicted_bytes
    assert step["halo"] == 2 * 3 * (hidden + classes) * 4
    params = 3 * hidden + hidden + hidden * classes + classes  # GCN's two weights and two biases
    assert step["allreduce"] == 2 * params * 4  # each worker sends its gradients once


def test_choose_strategy_within_what_is_allowed() -> None:
    """With one strategy allowed the planner picks it for every layer, records its report, and leaves the IR."""
    ctx = context()
    before = prepared(ctx)
    out = run_pass("choose-strategy{allow=depcache}", before, ctx=ctx)
    assert str(out) == str(before)
    assert ctx.results.strategy == "depcache,depcache"
    assert ctx.results.planner is not None and ctx.results.planner.strategies == ["depcache", "depcache"]


def test_choose_strategy_fixed_choice_is_not_planned() -> None:
    """`strategy=` fixes the choice: nothing is priced."""
    ctx = context()
    run_pass("choose-strategy{strategy=bcast1d}", prepared(ctx), ctx=ctx)
    assert ctx.results.strategy == "bcast1d" and ctx.results.planner is None


def test_select_hybrid_records_a_selection_per_segment() -> None:
    """A hybrid segment gets a per-worker cached set for each of its layers; the IR text is unchanged."""
    ctx = context("hybrid")
    before = prepared(ctx, "assign-strategy")
    out = run_pass("select-hybrid", before, ctx=ctx)
    assert str(out) == str(before)
    cached = ctx.results.hybrid_cached
    assert cached is not None and set(cached) == {0, 1}
    assert all(len(per_worker) == 2 for per_worker in cached.values())
    assert ctx.results.hybrid_selection
