"""Malformed specs: each case asserts the exact file:line:col and message the user sees."""
from __future__ import annotations

import pytest

from gnnc import api
from gnnc.errors import GnncError
from gnnc.passes.manager import run_pipeline

CASES = [
    ('layer L(in, out) {\n  scater m = src.h\n  apply h = relu(m)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:3: expected a primitive (scatter, gather, transform, sync, apply) to start a layer statement, found 'scater'"),
    ('layer L(in, out) {\n  transform t = linear(h, out) $ 2\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:32: unexpected character '$'"),
    ('layer L(in, out) {\n  transform t = linear(h, out',
     'bad.gnn:2:30: expected an expression or statement, found the end of the file'),
    ('layer L(in, out) {\n  transform t = linear(g, out)\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:24: unknown name 'g'"),
    ('layer L(in, out) {\n  transform t = linear(h, out)\n  apply h = reluu(t)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:3:13: unknown op 'reluu'; did you mean 'relu'?"),
    ('layer L(in, out) {\n  scatter m = src.h\n  gather a = median(m)\n  apply h = linear(a, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:3:14: unknown reducer 'median' (expected one of sum, mean, max, min, softmax, std); did you mean 'mean'?"),
    ('layer L(in, out) {\n  transform t = linear(h, out)\n  apply h = mean(t)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:3:13: reducer 'mean' can only be used in a gather statement (or sum/mean/max in sync)"),
    ('layer L(in, out) {\n  transform t = linear(src.h, out)\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:2:24: src.h reads a neighbour: neighbour access is only allowed in scatter statements'),
    ('layer L(in, out) {\n  transform t = linear(h, out) + linear(h, 7)\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:17: dim mismatch in 'add': [classes] vs [7]"),
    ('layer L(in, out) {\n  scatter m = h\n  gather a = sum(m)\n  apply h = linear(a, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:2:3: a scatter statement must produce an edge value (one message per edge); read vertex values through src.X or dst.X'),
    ('layer L(in, out) {\n  gather a = sum(h)\n  apply h = linear(a, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:14: 'gather' expects an edge value (a message from scatter), got a vertex value"),
    ('layer L(in, out) {\n  transform t = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:1:7: layer 'L' has no apply statement; the last apply defines the layer's output"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n}\n',
     "bad.gnn:4:7: model 'M' defines no loss; add `loss = cross_entropy(h, y, mask = train)`"),
    ('layer L(in, out) with loops {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:1:23: unknown layer option 'loops' (known: self_loops)"),
    ('layer L(in, out) {\n  scatter m = edge.weight2 * src.h\n  gather a = sum(m)\n  apply h = linear(a, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:15: unknown edge data 'edge.weight2' (known without a graph: gcn_norm, weight, attr; or an edge value of this layer); did you mean 'weight'?"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes, 3)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:5:7: layer 'L' takes 2 parameters, got 3"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:5:7: layer 'L' needs a value for parameter 'out'"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, outt = classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:5:19: layer 'L' has no parameter 'outt'; did you mean 'out'?"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = dropout(x, 1.5)\n  h = L(features, classes)(h)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:5:18: dropout probability must be in [0, 1), got 1.5'),
    ('layer L(in, out) {\n  scatter m = src.h + h\n  gather a = sum(m)\n  apply h = linear(a, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:15: cannot combine a vertex value with an edge value in 'add'; in scatter, read vertex values through src.X or dst.X"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nlayer L(in) {\n  apply h = h\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:4:7: 'L' is defined twice (first at line 1)"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = h\n}\n',
     'bad.gnn:6:3: the loss must be cross_entropy(logits, y, mask = train), mse(h, y, mask = train) or bce(logits, y, mask = train)'),
    ('layer L(in, out) {\n  transform t = L(in, out)(h)\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:17: layer 'L' can only be used in a model, not inside a layer"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes, n = 2.5) {\n  repeat i in 1..n {\n    x1 = x\n  }\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:5:18: a repeat bound must be an integer with a known value; give its parameter a default or --set it'),
    ('layer L(in, out) {\n  apply h = linear(h, 0)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:23: linear's output size must be a positive integer, got 0"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  h = L(in = features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:5:24: positional argument after a keyword argument'),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  training(epoch = 3)\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:5:12: unknown training setting 'epoch'; did you mean 'epochs'?"),
    ('layer L(in, out) {\n  transform t = concat(linear(h, out))\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:2:17: concat of one value joins its heads and needs shape [heads, out], got [classes]'),
    ('layer L(in, out) {\n  apply h = linear(h, out) * 1e999\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:30: number '1e999' is out of range"),
    ('layer L(in, out) {\n  transform t = linear(h, 2, out)\n  apply h = t\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:17: layer 'L' must output a vertex value with one feature dim, got vertex [2, classes]; use concat(...) or mean_heads(...) over heads"),
    ('layer L(in, out) {\n  sync s = softmax(h)\n  apply h = linear(s, out)\n}\nmodel M(features, classes) {\n  h = L(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     'bad.gnn:2:3: a sync statement must be sum(...), mean(...) or max(...) of one value'),
    ('model M(features, classes) {\n  h = GCN(features, classes)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:2:7: unknown layer 'GCN'"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n  x = L(features, classes)(x)\n  loss = cross_entropy(x, y, mask = train)\n}\n',
     "bad.gnn:5:3: 'x' is a graph input and cannot be assigned"),
    # the declared `in` is the input's width (issue 21, item 4), reported at the call
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, hidden = 16, classes) {\n  h = L(features, hidden)(x)\n  h = L(64, classes)(h)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:6:7: layer 'L' is called with in = 64 but its input is hidden (16) wide"),
    ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, hidden = 16, wide = 32, classes) {\n  h = L(features, hidden)(x)\n  h = L(wide, classes)(h)\n  loss = cross_entropy(h, y, mask = train)\n}\n',
     "bad.gnn:6:7: layer 'L' is called with in = wide (32) but its input is hidden (16) wide"),
]


def diagnose(source: str) -> str:
    try:
        model = api.load_model_source(source, "bad.gnn")
        run_pipeline(model.program(), ["infer-shapes", "check"])
    except GnncError as err:
        assert err.loc is not None, f"no location for: {err.message}"
        return f"{err.loc}: {err.message}"
    raise AssertionError("no error reported")


@pytest.mark.parametrize("source, expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_diagnostic(source: str, expected: str) -> None:
    assert diagnose(source) == expected


def test_error_text_has_caret_under_column() -> None:
    source, _ = CASES[0]
    with pytest.raises(GnncError) as info:
        api.load_model_source(source, "bad.gnn")
    text = str(info.value).splitlines()
    assert text[0].startswith("bad.gnn:2:3: ")
    assert text[1] == "    scater m = src.h"
    assert text[2] == "    ^"


def test_more_logits_than_classes_is_a_warning_at_the_loss(capsys) -> None:
    """Legal (the extra logits are never a label) but rarely meant: compiling for the graph says so."""
    import warnings

    from conftest import random_graph
    from gnnc.errors import GnncWarning

    source = ('layer L(in, out) {\n  apply h = linear(h, out)\n}\nmodel M(features, classes) {\n'
              '  h = L(features, 16)(x)\n  loss = cross_entropy(h, y, mask = train)\n}\n')
    graph = random_graph(n=20, e=40, f=4, c=3)
    with pytest.warns(GnncWarning) as seen:
        api.compile(api.load_model_source(source, "wide.gnn"), graph)
    assert str(seen[0].message).splitlines() == [
        "wide.gnn:6:10: warning: the logits are 16 wide but graph 'random0' has 3 classes: 13 of them never match "
        "a label", "    loss = cross_entropy(h, y, mask = train)", "           ^"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as many logits as classes: no warning
        api.compile(api.load_model_source(source.replace("16", "classes"), "ok.gnn"), graph)
