"""The op registry (gnnc.ir.ops): definitions drive binding, passes, the runtime and verify."""
from __future__ import annotations

from typing import Iterator

import pytest
import sympy
import torch
import torch.nn.functional as F

from conftest import EXAMPLES
from gnnc.ir import ops
from gnnc.cli import main
from gnnc.ir import Eqn, Layer, Program, Type, Value, attrs_of
from gnnc.ir import VerifyError, verify
from gnnc.passes.analysis.legality import pushpull_blocker
from gnnc.passes.insert_comm import insert_comm
from gnnc.passes.manager import PassContext
from gnnc.runtime.executor import ExecContext, Interpreter
from gnnc.runtime.implementations import IMPLEMENTATIONS
from gnnc.testing import filecheck, run_pass

DIMS = {"features": 8, "classes": 3}
GCN = EXAMPLES / "gcn.gnn"


@pytest.fixture
def neighbour_op() -> Iterator[str]:
    """A test op typed like spmm that reads its first operand through edges, removed afterwards."""
    op = ops.define_op(ops.OpDef("test_neighbour_sum", ops.op_def("spmm").type_rule, reads_neighbours=(0,)))
    yield op.name
    del ops.OPS[op.name]


def _lowered_gcn() -> Program:
    return run_pass("lower", GCN, dims=DIMS)


def _replace_op(program: Program, old: str, new: str, strategy: str | None = None) -> Program:
    """Rename every `old` equation of the graph layers to `new`; optionally set their strategy."""
    layers = []
    for layer in program.layers:
        if layer.kind == "graph":
            layer = layer.replace(eqns=tuple(e.replace(op=new) if e.op == old else e for e in layer.eqns))
            if strategy is not None:
                layer = layer.replace(attrs=attrs_of(**{**dict(layer.attrs), "strategy": strategy}))
        layers.append(layer)
    return program.replace(layers=tuple(layers))


def test_define_op_refuses_a_second_definition() -> None:
    with pytest.raises(ValueError, match="op 'relu' is already defined"):
        ops.define_op(ops.OpDef("relu", ops.op_def("relu").type_rule))


def test_callable_ops_come_from_the_definitions() -> None:
    assert {"relu", "linear", "matmul", "dropout", "concat", "cross_entropy"} <= set(ops.callable_ops())
    assert not {"spmm", "halo", "src", "const"} & set(ops.callable_ops())
    assert ops.COMM_OPS == ("halo", "fetch", "bcast_rows", "reduce_scatter", "sync_scores", "history")


def test_every_ir_op_has_a_reference_implementation() -> None:
    # an exchange runs through the exchange registry (gnnc.runtime.implementations.implements_exchange)
    typed = {name for name, op in ops.OPS.items() if op.type_rule is not None and not op.comm}
    assert typed == {op for op, variant in IMPLEMENTATIONS if variant == "reference"}
    assert {op for op, variant in IMPLEMENTATIONS if variant == "kernels"} == {"spmm", "sddmm", "edge_softmax"}


def test_reads_neighbours_trait_gets_a_halo(neighbour_op: str) -> None:
    # insert-comm knows nothing of the test op: the trait alone makes it fetch remote rows
    program = _replace_op(_lowered_gcn(), "spmm", neighbour_op, strategy="depcomm")
    out = insert_comm(program, PassContext())
    verify(out, typed=True)
    filecheck(out, f"""
        CHECK: %l0.t^halo:vertex:f32[hidden] = halo(%l0.t)
        CHECK-NEXT: %l0.a:vertex:f32[hidden] = {neighbour_op}[reduce=sum](%l0.t^halo, %l0.m~1)
    """)


def test_without_the_trait_no_halo_is_inserted() -> None:
    op = ops.define_op(ops.OpDef("test_local_sum", ops.op_def("spmm").type_rule))
    try:
        out = insert_comm(_replace_op(_lowered_gcn(), "spmm", op.name, strategy="depcomm"), PassContext())
    finally:
        del ops.OPS[op.name]
    assert "halo" not in str(out)


def test_linear_in_trait_decides_pushpull_legality(neighbour_op: str) -> None:
    layer = _replace_op(_lowered_gcn(), "spmm", neighbour_op).graph_layers()[0]
    eqn, why = pushpull_blocker(layer)
    assert (eqn.op, why) == (neighbour_op, f"'{neighbour_op}' is not linear in the layer's input")
    linear = ops.define_op(ops.OpDef("test_linear_sum", ops.op_def("spmm").type_rule,
                                     linear_in=lambda e, reads: reads[0] and not any(reads[1:])))
    try:
        assert pushpull_blocker(_replace_op(_lowered_gcn(), "spmm", linear.name).graph_layers()[0]) is None
    finally:
        del ops.OPS[linear.name]


_AGGREGATE_FIRST = """
layer AggFirst(in, out) with self_loops {
  scatter   m = edge.gcn_norm * src.h
  gather    a = sum(m)
  BODY
}

model M(features, hidden = 16, classes) {
  h = AggFirst(features, hidden)(x)
  loss = cross_entropy(h, y, mask = train)
}
"""


@pytest.mark.parametrize("body,blocker", [
    # aggregated features reach the sync with no dense map: each worker's partial is its own columns
    ("sync      s = sum(a)\n  apply     h = linear(s, out)",
     ("sync", "no dense map before the sync: each worker's partial would be its own slice of the features, "
              "which the sync cannot add")),
    # a dense map's partial added to a slice of the aggregated features
    ("transform t = linear(a, in, bias = false) + a\n  sync      s = sum(t)\n  apply     h = linear(s, out)",
     ("add", "'add' combines a feature slice with a partial sum of a dense map")),
    # GCN's order, the dense map after the aggregation: legal
    ("transform t = linear(a, out, bias = false)\n  sync      s = sum(t)\n  apply     h = s", None),
])
def test_pushpull_needs_a_dense_map_over_the_feature_slice_before_the_sync(tmp_path, body, blocker) -> None:
    path = tmp_path / "agg.gnn"
    path.write_text(_AGGREGATE_FIRST.replace("BODY", body))
    layer = run_pass("lower", path, dims={"features": 8, "classes": 3, "hidden": 8}).graph_layers()[0]
    got = pushpull_blocker(layer)
    assert (got if got is None else (got[0].op, got[1])) == blocker


def _retyped(program: Program, name: str, t: Type) -> Program:
    """Change a value's recorded type at its definition and every use (a consistent but wrong IR)."""
    def fix(v: Value) -> Value:
        return v.replace(type=t) if v.name == name else v

    def layer_fix(layer: Layer) -> Layer:
        return layer.replace(inputs=tuple(map(fix, layer.inputs)), outputs=tuple(map(fix, layer.outputs)),
                             eqns=tuple(e.replace(ins=tuple(map(fix, e.ins)), outs=tuple(map(fix, e.outs)))
                                        for e in layer.eqns))

    return program.replace(layers=tuple(layer_fix(layer) for layer in program.layers))


def test_verify_reruns_the_type_rules() -> None:
    program = run_pass("infer-shapes", GCN, dims=DIMS)
    t = program.graph_layers()[0].eqns[0].outs[0].type
    broken = _retyped(program, "l0.t", t.replace(shape=(sympy.Symbol("classes"),)))
    verify(broken)  # the structure is sound: only the type rule notices
    with pytest.raises(VerifyError) as info:
        verify(broken, typed=True)
    assert info.value.message == ("%l0.t is recorded as vertex:f32[classes] but its type rule gives "
                                  "vertex:f32[hidden] (layer l0, equation 0: linear)")


def test_verify_names_an_undefined_op() -> None:
    program = _replace_op(run_pass("infer-shapes", GCN, dims=DIMS), "linear", "no_such_op")
    with pytest.raises(VerifyError) as info:
        verify(program, typed=True)
    assert info.value.message == "op 'no_such_op' is not defined in gnnc.ir.ops (layer l0, equation 0: no_such_op)"


def test_a_verifier_failure_is_an_internal_error_exit_1(tmp_path, capsys) -> None:
    plugin = tmp_path / "breaker.py"
    plugin.write_text(
        "from gnnc.passes.manager import register_pass\n\n"
        "@register_pass('test-break-ir-cli', 'drops the first equation of every graph layer')\n"
        "def breaker(program, ctx):\n"
        "    return program.replace(layers=tuple(layer.replace(eqns=layer.eqns[1:]) if layer.kind == 'graph'\n"
        "                                        else layer for layer in program.layers))\n")
    code = main(["compile", str(GCN), "--plugin", str(plugin), "--set", "features=8", "--set", "classes=3",
                 "--passes", "infer-shapes,test-break-ir-cli", "-o", str(tmp_path / "plan")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("internal error (a bug in gnnc, please report it): after pass 'test-break-ir-cli'")


def test_silu_matches_torch_on_random_inputs() -> None:
    # the op added as the demonstration: one definition (gnnc.ir.ops) and one implementation
    program = run_pass("infer-shapes", "layer L(in, out) {\n  apply h = silu(h)\n}\n"
                       "model M(features, classes) {\n  h = L(features, classes)(x)\n"
                       "  loss = cross_entropy(h, y, mask = train)\n}\n", dims=DIMS)
    eqn = program.graph_layers()[0].eqns[0]
    assert eqn.op == "silu"
    ctx = ExecContext({}, torch.arange(50), program.config_dict(), False, lambda i: 0, 1.0)
    gen = torch.Generator().manual_seed(14)
    for _ in range(3):
        x = torch.randn(50, 8, generator=gen, dtype=torch.float64) * 4
        got = Interpreter(program).eqn(eqn, [x.float()], None, ctx)  # the runtime's f32
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), F.silu(x), rtol=1e-6, atol=1e-6)  # a float64 reference
