"""IR text round-trip: parse(print(ir)) == ir for every IR the passes produce."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES
from gnnc import api
from gnnc.frontend.elaborate import elaborate
from gnnc.ir.text import IRSyntaxError, parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE, run_pipeline

NAMES = ["gcn", "sage", "gin", "gat", "gcnii"]
SOURCES = {n: (EXAMPLES / f"{n}.gnn").read_text() for n in NAMES}


def programs(name: str, overrides: dict[str, str], dims: dict[str, int]):
    model = api.load_model_source(SOURCES[name], f"examples/{name}.gnn")
    p = elaborate(model.module, overrides, dims)
    out = [p]
    run_pipeline(p, DEFAULT_PIPELINE, after=lambda _n, q: out.append(q))
    return out


@settings(max_examples=500, deadline=None)
@given(name=st.sampled_from(NAMES), hidden=st.integers(1, 512), features=st.integers(1, 4096),
       classes=st.integers(2, 64), stage=st.integers(0, len(DEFAULT_PIPELINE)), bound=st.booleans())
def test_round_trip(name, hidden, features, classes, stage, bound) -> None:
    overrides = {"hidden": str(hidden)}
    if name == "gcnii":
        overrides["layers"] = "3"
    dims = {"features": features, "classes": classes} if bound else {}
    program = programs(name, overrides, dims)[stage]
    text = str(program)
    again = parse_ir(text)
    assert again == program
    assert str(again) == text


def test_hand_written_snippet() -> None:
    text = (
        "program P(classes=3, features=4)\n"
        '  source "hand.ir"\n'
        "  inputs %x:vertex:f32[features], %y:vertex:i64[], %train:vertex:bool[], %val:vertex:bool[], "
        "%test:vertex:bool[]\n"
        "layer l0 graph Agg(in=features) edges=plain\n"
        "  in %x:vertex:f32[features]\n"
        "  %m:edge:f32[features] = src(%x)  # scatter\n"
        "  %a:vertex:f32[features] = gather[reduce=sum](%m)  # gather\n"
        "  out %a\n"
        "layer d0 dense\n"
        "  in %a:vertex:f32[features], %y:vertex:i64[], %train:vertex:bool[]\n"
        "  %loss:scalar:f32[] = cross_entropy(%a, %y, %train)  # model\n"
        "  out %loss\n"
        "  result logits=%a loss=%loss\n")
    p = parse_ir(text)
    assert str(p) == text
    lowered = run_pipeline(p, ["lower"])
    assert "spmm[reduce=sum](%x)" in str(lowered)


def test_bad_ir_names_the_line() -> None:
    text = str(programs("gcn", {}, {})[1]).replace("= linear[", "= linear(", 1)
    with pytest.raises(IRSyntaxError) as info:
        parse_ir(text, "bad.ir")
    assert info.value.loc.file == "bad.ir" and info.value.loc.line > 5


def test_use_before_definition_is_reported() -> None:
    text = str(programs("sage", {}, {})[0])
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if "gather[reduce=mean]" in line)
    lines[i - 1], lines[i] = lines[i], lines[i - 1]
    with pytest.raises(IRSyntaxError, match="used before it is defined"):
        parse_ir("\n".join(lines))


FEATURES = """
layer L(in, out, eps = 0.5) with self_loops {
  param     e = eps
  param     w[out] = glorot
  scatter   m = sigmoid(dot(edge.attr)) * edge.weight * src.h
  gather    a = sum(m)
  transform z = (1 + e) * h + a
  apply     h = max(linear(z, out) * w, linear(z, out), 0 - w)
}
model M(features, hidden = 8, classes) {
  param g = -1.5e-3
  h = batch_norm(L(features, hidden)(x), momentum = 0.2)
  h = min(g * h, h)
  h = linear(h, classes)
  loss = cross_entropy(h, y, mask = train)
}
"""


@pytest.mark.parametrize("dims", [{}, {"features": 5, "classes": 3}], ids=["unbound", "bound"])
def test_params_edge_data_batch_norm_and_max_round_trip(dims) -> None:
    """`param` initial values, edge data widths (symbolic without a graph), batch_norm, maximum and hoist's marks."""
    model = api.load_model_source(FEATURES, "features.gnn")
    edges = {"weight": None, "attr": 4} if dims else None
    p = elaborate(model.module, {}, dims, edge_data=edges)
    stages = [p]
    run_pipeline(p, DEFAULT_PIPELINE, after=lambda _n, q: stages.append(q))
    for program in stages:
        text = str(program)
        assert parse_ir(text) == program and str(parse_ir(text)) == text
    text = str(stages[-1])
    assert "= -0.0015" in text and "batch_norm[eps=1e-05, momentum=0.2]" in text and "maximum(" in text
    assert ("width=4" if dims else "width=edge_attr") in text
