"""Fuzzing the front end: no input ever raises anything but the project's own diagnostic.

Mutated valid specs (token insertions, deletions, swaps, duplicated lines)
and random text go through parse, elaborate and every pass of the default
pipeline; each must succeed or raise a GnncError with a location or a
message, never a Python exception of another kind.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES
from gnnc import api
from gnnc.errors import GnncError
from gnnc.passes.manager import DEFAULT_PIPELINE, run_pipeline

SOURCES = [(EXAMPLES / f"{n}.gnn").read_text() for n in ("gcn", "sage", "gin", "gat", "gcnii")]
TOKENS = ["layer", "model", "scatter", "gather", "transform", "sync", "apply", "repeat", "in", "with",
          "src.h", "dst.z", "edge.gcn_norm", "edge.alpha", "h", "x", "y", "x0", "(", ")", "{", "}", ",", "=",
          "+", "-", "*", "/", "**", "..", ".", "0", "1", "-1", "0.5", "1e308", "99999999999999999999", "true",
          "sum(", "mean(", "softmax(", "linear(", "dropout(", "concat(", "mean_heads(", "relu(", "dot(",
          "cross_entropy(", "training(", "loss", "#", "\n", "hidden", "classes", "features", "heads", "self_loops"]
DIMS = {"features": 16, "classes": 3}


def compile_text(text: str) -> None:
    try:
        model = api.load_model_source(text, "fuzz.gnn", layers="3")
    except GnncError:
        return
    try:
        program = model.program(None)
    except GnncError:
        return
    try:
        run_pipeline(program, DEFAULT_PIPELINE)
    except GnncError:
        return


def _elaborate_with_dims(text: str) -> None:
    from gnnc.frontend.elaborate import elaborate
    from gnnc.frontend.syntax import parse

    try:
        program = elaborate(parse(text, "fuzz.gnn"), {}, DIMS)
        run_pipeline(program, DEFAULT_PIPELINE)
    except GnncError as err:
        assert err.message
        str(err)  # rendering the caret must not fail either


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "swap_lines"]))
        pos = draw(st.integers(0, len(text)))
        if kind == "insert":
            text = text[:pos] + " " + draw(st.sampled_from(TOKENS)) + " " + text[pos:]
        elif kind == "delete":
            n = draw(st.integers(1, 12))
            text = text[:pos] + text[pos + n:]
        elif kind == "replace":
            n = draw(st.integers(1, 8))
            text = text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos + n:]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if kind == "dup_line":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_specs_only_raise_diagnostics(text: str) -> None:
    _elaborate_with_dims(text)


@settings(max_examples=600, deadline=None)
@given(st.text(max_size=200))
def test_random_text_only_raises_diagnostics(text: str) -> None:
    compile_text(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_token_soup_only_raises_diagnostics(text: str) -> None:
    _elaborate_with_dims(text)
