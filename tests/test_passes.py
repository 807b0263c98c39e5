"""Each pass alone, on small inputs, with FileCheck expectations and numerical checks (gnnc.testing)."""
from __future__ import annotations

import pytest

from conftest import EXAMPLES
from gnnc.ir import Eqn, Value, VerifyError, verify
from gnnc.passes.manager import PassContext, register_pass, run_pipeline
from gnnc.testing import FileCheckError, as_program, assert_rewrite_exact, filecheck, run_pass

DIMS = {"features": 8, "classes": 3}
SAGE = EXAMPLES / "sage.gnn"
GCN = EXAMPLES / "gcn.gnn"
GAT = EXAMPLES / "gat.gnn"


def layer_src(body: str, opts: str = "") -> str:
    return (f"layer L(in, out) {opts} {{\n{body}\n}}\n"
            "model M(features, classes) {\n  h = L(features, classes)(x)\n"
            "  loss = cross_entropy(h, y, mask = train)\n}\n")


def test_infer_shapes_types_params_from_inputs() -> None:
    # linear(h, heads, out) on an [in] input makes an [in, heads*out] weight and a [heads, out] value
    out = run_pass("infer-shapes", layer_src("  transform z = linear(h, 2, out)\n  apply h = concat(z)"), dims=DIMS)
    filecheck(out, """
        CHECK: param %l0.linear0.weight:param:f32[features,2*classes] = glorot
        CHECK: %l0.z:vertex:f32[2,classes] = linear[bias=true, heads=2, out=classes]
        CHECK-NEXT: %l0.h:vertex:f32[2*classes] = concat(%l0.z)
    """)


def test_lower_copy_sum_becomes_spmm() -> None:
    # gather(sum) of src.h is one spmm; the per-edge copy disappears
    out = run_pass("lower", layer_src("  scatter m = src.h\n  gather a = sum(m)\n  apply h = linear(a, out)"),
                   dims=DIMS)
    filecheck(out, """
        CHECK: %l0.a:vertex:f32[features] = spmm[reduce=sum](%x)
        CHECK-NOT: src(
        CHECK: linear
    """)


def test_lower_weighted_mean_keeps_weights() -> None:
    # an edge weight times src.h under mean folds into spmm's weights
    src = layer_src("  scatter m = edge.gcn_norm * src.h\n  gather a = mean(m)\n  apply h = linear(a, out)",
                    "with self_loops")
    out = run_pass("lower", src, dims=DIMS)
    filecheck(out, """
        CHECK: = edata[name=gcn_norm]()
        CHECK-NEXT: %l0.a:vertex:f32[features] = spmm[reduce=mean](%x, %l0.m~1)
    """)


def test_lower_max_is_not_weighted() -> None:
    # max of weighted messages is not an spmm: the pattern must not fire
    src = layer_src("  scatter m = edge.gcn_norm * src.h\n  gather a = max(m)\n  apply h = linear(a, out)",
                    "with self_loops")
    out = run_pass("lower", src, dims=DIMS)
    filecheck(out, "CHECK: gather[reduce=max]\nCHECK-NOT: spmm")


def test_lower_attention_to_sddmm_and_softmax() -> None:
    out = run_pass("lower", GAT, dims=DIMS)
    filecheck(out, """
        CHECK: layer l0 graph GATConv
        CHECK: = dot(%l0.z, %l0.dot0.att)
        CHECK: = dot(%l0.z, %l0.dot1.att)
        CHECK: = sddmm[op=add](
        CHECK: = edge_softmax(
        CHECK: = spmm[reduce=sum](%l0.z,
        CHECK-NOT: src(
    """)


def test_lower_leaves_shared_messages_alone() -> None:
    # the message is used twice, so it must still be built once per edge
    src = layer_src("  scatter m = src.h\n  gather a = sum(m)\n  gather b = max(m)\n"
                    "  apply h = linear(a + b, out)")
    out = run_pass("lower", src, dims=DIMS)
    filecheck(out, "CHECK: src(%x)\nCHECK: gather[reduce=sum]\nCHECK: gather[reduce=max]")


@pytest.mark.parametrize("example", ["gcn", "sage", "gin", "gat", "gcnii"])
def test_lower_is_exact(example: str) -> None:
    overrides = {"layers": 3} if example == "gcnii" else None
    assert_rewrite_exact("lower", EXAMPLES / f"{example}.gnn", overrides=overrides)


def test_reorder_gemm_moves_linear_before_mean() -> None:
    out = run_pass("reorder-gemm", SAGE, dims={"features": 64, "classes": 3})
    filecheck(out, """
        CHECK: layer l0 graph SAGE
        CHECK: %l0.t~1^g:vertex:f32[hidden] = linear[bias=false, out=hidden](%h, %l0.linear0.weight)
        CHECK-NEXT: %l0.t~1^a:vertex:f32[hidden] = spmm[reduce=mean](%l0.t~1^g)
        CHECK-NEXT: %l0.t~1:vertex:f32[hidden] = bias(%l0.t~1^a, %l0.linear0.bias)
    """)


def test_reorder_gemm_keeps_order_when_widening() -> None:
    # d_out > d_in: aggregating first is cheaper, nothing moves
    out = run_pass("reorder-gemm", SAGE, dims={"features": 4, "classes": 3}, overrides={"hidden": 64})
    filecheck(out, "CHECK: layer l0 graph SAGE\nCHECK: spmm[reduce=mean](%h)\nCHECK-NEXT: linear[bias=true")


def test_reorder_gemm_unknown_dims_leave_layer() -> None:
    out = run_pass("reorder-gemm", SAGE)  # features unbound: d_in unknown
    filecheck(out, "CHECK: layer l0 graph SAGE\nCHECK: spmm[reduce=mean](%h)")


@pytest.mark.parametrize("example", ["sage", "gcn"])
def test_reorder_gemm_is_exact(example: str) -> None:
    assert_rewrite_exact("reorder-gemm", EXAMPLES / f"{example}.gnn", dims={"features": 8, "classes": 3})


def test_check_rejects_multihead_layer_output() -> None:
    from gnnc.errors import GnncTypeError

    with pytest.raises(GnncTypeError, match="must output a vertex value with one feature dim"):
        run_pass("check", layer_src("  apply h = linear(h, 2, out)"), dims=DIMS)


def test_verify_names_use_before_definition() -> None:
    program = run_pass("infer-shapes", GCN, dims=DIMS)
    layer = program.layers[1]
    broken = layer.replace(eqns=(layer.eqns[2], layer.eqns[1], layer.eqns[0]) + layer.eqns[3:])
    program = program.replace(layers=(program.layers[0], broken) + program.layers[2:])
    with pytest.raises(VerifyError) as info:
        verify(program)
    assert info.value.message == "%l0.t is used before it is defined (layer l0, equation 0: src)"


def test_verify_names_type_mismatch() -> None:
    program = run_pass("infer-shapes", GCN, dims=DIMS)
    layer = program.layers[1]
    e = layer.eqns[0]
    wrong = e.replace(outs=(Value(e.outs[0].name, e.outs[0].type.replace(domain="edge")),))
    program = program.replace(layers=(program.layers[0], layer.replace(eqns=(wrong,) + layer.eqns[1:]))
                              + program.layers[2:])
    with pytest.raises(VerifyError, match=r"%l0.t has type vertex:f32\[hidden\] at its use but "
                                          r"edge:f32\[hidden\] at its definition"):
        verify(program, typed=True)


def test_manager_names_the_pass_that_broke_the_ir() -> None:
    @register_pass("test-break-ir", "drops the first equation of every graph layer (a broken pass)")
    def breaker(program, ctx: PassContext):
        return program.replace(layers=tuple(
            layer.replace(eqns=layer.eqns[1:]) if layer.kind == "graph" else layer for layer in program.layers))

    program = as_program(GCN, DIMS)
    with pytest.raises(VerifyError, match=r"after pass 'test-break-ir' \(ran: infer-shapes, test-break-ir\)"):
        run_pipeline(program, ["infer-shapes", "test-break-ir"], verify_each=True)


def test_filecheck_reports_check_not() -> None:
    with pytest.raises(FileCheckError, match="check line 2: CHECK-NOT: b"):
        filecheck("a\nb\nc\n", "CHECK: a\nCHECK-NOT: b\nCHECK: c")


def test_filecheck_next_must_be_adjacent() -> None:
    filecheck("a\nb\nc\n", "CHECK: a\nCHECK-NEXT: b\nCHECK-SAME: \nCHECK-NEXT: c")
    with pytest.raises(FileCheckError, match="check line 2: CHECK-NEXT: c"):
        filecheck("a\nb\nc\n", "CHECK: a\nCHECK-NEXT: c")


def test_filecheck_regex_blocks() -> None:
    filecheck("%l0.m~1:edge = edata()", "CHECK: %l0.m~{{[0-9]+}}:edge")
    with pytest.raises(FileCheckError):
        filecheck("%l0.m~x:edge", "CHECK: %l0.m~{{[0-9]+}}:edge")


def test_rewrite_check_catches_a_wrong_rewrite() -> None:
    @register_pass("test-wrong-rewrite", "turns every sum aggregation into a mean (not exact)")
    def wrong(program, ctx):
        def fix(e: Eqn) -> Eqn:
            return e.with_attrs(reduce="mean") if e.op == "spmm" and e.attr("reduce") == "sum" else e
        return program.replace(layers=tuple(layer.replace(eqns=tuple(fix(e) for e in layer.eqns))
                                            for layer in program.layers))

    with pytest.raises(AssertionError, match="outputs changed by the rewrite"):
        assert_rewrite_exact("lower,test-wrong-rewrite", EXAMPLES / "gin.gnn")


def test_rewrite_exact_makes_its_random_graph_as_wide_as_the_dims() -> None:
    # the default random graph has 8 features; dims of another width used to end in a raw torch shape error
    assert_rewrite_exact("reorder-gemm", SAGE, dims={"features": 16, "classes": 5})
    from gnnc.testing import random_graph

    with pytest.raises(AssertionError, match="dims features=16 does not fit the graph given, which has features=8"):
        assert_rewrite_exact("reorder-gemm", SAGE, dims={"features": 16, "classes": 3}, graph=random_graph())
