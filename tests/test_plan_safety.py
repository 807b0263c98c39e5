"""A plan is data: no text in a plan file, IR or attribute ever reaches Python evaluation (issue 20, item 1).

`ir_sha256` is a checksum anyone can recompute, so an edited plan is as
trusted as the file it sits in. Dims and attribute values used to go through
`sympy.sympify`, which evaluates Python: the payload below created a file on
`gnnc inspect` and `gnnc run`. Now they are read by gnnc's own grammar
(`gnnc.ir.expr`); the payload is refused with an exit 2 naming the field,
and a fuzz test holds every path from IR text and plan JSON to that: nothing
but gnnc's own errors, and no call to eval, exec, sympify or parse_expr.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import sympy
import sympy.parsing.sympy_parser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES, gnnc_in_process
from gnnc import api
from gnnc.errors import GnncError
from gnnc.ir import dim
from gnnc.ir.dims import eval_dim, eval_number
from gnnc.ir.expr import ExprSyntaxError, parse_expr
from gnnc.ir.text import IRSyntaxError, parse_ir
from gnnc.plan.plan_file import Plan

PAYLOAD = ("features+0*x.__class__.__new__.__globals__['__builtins__']['__import__']('os')"
           ".system('touch pwned')")
INPUT_DIM = "%x:vertex:f32[features]"
DROPOUT = "dropout[p=0.5]"


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    """A two-worker GCN plan on a small generated graph: plan.json, parts.npy and two shards."""
    model = api.load_model(EXAMPLES / "gcn.gnn")
    spec = "rmat:n=64"
    plan = api.compile(model, api.load_graph(spec), workers=2, graph_spec=spec)
    return plan.save(tmp_path_factory.mktemp("plan") / "gcn")


def _edited(plan_dir: Path, into: Path, old: str, new: str) -> Path:
    """A copy of the plan whose IR has `old` replaced by `new` and its checksum recomputed."""
    shutil.copytree(plan_dir, into)
    data = json.loads((into / "plan.json").read_text())
    assert old in data["ir"]
    data["ir"] = data["ir"].replace(old, new, 1)
    data["ir_sha256"] = hashlib.sha256(data["ir"].encode()).hexdigest()
    (into / "plan.json").write_text(json.dumps(data))
    return into


@contextlib.contextmanager
def no_evaluation() -> Iterator[list[str]]:
    """eval, exec, sympify and sympy's text parser raise, and are recorded even if something catches that.

    Python's import system runs a module's code with exec; sympy imports some modules on first use
    (`Mod` its assumptions wrapper), so exec called from importlib itself goes through.
    """
    calls: list[str] = []
    saved = {(builtins, "eval"): builtins.eval, (builtins, "exec"): builtins.exec,
             (sympy, "sympify"): sympy.sympify,
             (sympy.parsing.sympy_parser, "parse_expr"): sympy.parsing.sympy_parser.parse_expr}

    def refuse(name: str, original: Any):
        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "exec" and sys._getframe(1).f_code.co_filename.startswith("<frozen importlib"):
                return original(*args, **kwargs)
            calls.append(name)
            raise AssertionError(f"{name} was called on {args[:1]!r}")
        return call

    for (module, name), original in saved.items():
        setattr(module, name, refuse(name, original))
    try:
        yield calls
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)


# --- the payload, through every door the issue names -------------------------------------------------


def test_payload_through_an_input_dim(plan_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = json.loads((plan_dir / "plan.json").read_text())["ir"].replace(INPUT_DIM, f"%x:vertex:f32[{PAYLOAD}]")
    with no_evaluation() as calls, pytest.raises(IRSyntaxError) as info:
        parse_ir(text, "plan.json:ir")
    assert not calls and not (tmp_path / "pwned").exists()
    assert "dim 0 of %x" in info.value.message and "is not a dim or number expression" in info.value.message
    assert info.value.loc.line == 1 + text.splitlines().index(next(l for l in text.splitlines()
                                                                   if l.startswith("  inputs ")))  # its line


def test_payload_through_a_layer_attribute(plan_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = json.loads((plan_dir / "plan.json").read_text())["ir"].replace(DROPOUT, f"dropout[p={PAYLOAD}]")
    with no_evaluation() as calls, pytest.raises(IRSyntaxError) as info:
        parse_ir(text, "plan.json:ir")
    assert not calls and not (tmp_path / "pwned").exists()
    assert info.value.message.startswith("dropout attribute p: ")
    assert "dropout[p=features+0*x" in text.splitlines()[info.value.loc.line - 1]


@pytest.mark.parametrize("read", [dim, lambda t: eval_dim(t, {"features": 4}),
                                  lambda t: eval_number(t, {"features": 4})],
                         ids=["ir.dim", "eval_dim", "eval_number"])
def test_payload_through_the_dim_helpers(read, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with no_evaluation() as calls, pytest.raises(ExprSyntaxError, match="is not a dim or number expression"):
        read(PAYLOAD)
    assert not calls and not (tmp_path / "pwned").exists()


def _gnnc(*args: str, cwd: Path):
    return gnnc_in_process(*args, cwd=cwd)  # a payload run here would write its file just the same


@pytest.mark.parametrize("old,new,field", [(INPUT_DIM, f"%x:vertex:f32[{PAYLOAD}]", "dim 0 of %x"),
                                           (DROPOUT, f"dropout[p={PAYLOAD}]", "dropout attribute p")],
                         ids=["input-dim", "dropout-attribute"])
@pytest.mark.parametrize("command", [["inspect"], ["run", "--epochs", "1"]], ids=["inspect", "run"])
def test_cli_refuses_a_crafted_plan(plan_dir, tmp_path, old, new, field, command) -> None:
    crafted = _edited(plan_dir, tmp_path / "crafted", old, new)
    r = _gnnc(command[0], str(crafted), *command[1:], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"{field}: " in r.stderr.splitlines()[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "pwned").exists()


# --- what the printer writes still reads back; what it cannot write is refused ------------------------


@pytest.mark.parametrize("text", ["hidden", "heads*hidden", "-hidden+2*x", "x/2", "3/2", "x**(-2)", "1/x",
                                  "log(theta/3+1)", "Max(3,x)", "Min(1,hidden,x)", "floor(x/2)", "Mod(x,3)",
                                  "sqrt(x)", "Abs(x)", "tanh(x)", "exp(x)", "1.0e-5*x", "2**x"])
def test_printed_expressions_read_back(text) -> None:
    with no_evaluation() as calls:
        value = parse_expr(text, "dim")
    assert not calls
    assert str(value).replace(" ", "") == text


@pytest.mark.parametrize("text,reason", [
    ("x.__class__", "unexpected '.'"), ("__import__(os)", "unknown function '__import__'"),
    ("x[0]", "unexpected '['"), ("lambda: 1", "unexpected ':'"), ("'a'", "unexpected \"'\""),
    ("9**9**9**9", "the power 9**387420489 is out of range"), ("1e999999999", "out of range"),
    ("2**1024", "out of range"), ("floor(exp(exp(100)))", "out of range"), ("x/0", "not a finite real number"),
    ("(-1)**0.5", "not a finite real number"), ("Mod(3,0)", "Modulo by zero"), ("(" * 100 + "x" + ")" * 100,
                                                                                "nested deeper"),
    ("x" * 3000, "at most"), ("", "empty"), ("log(1,2)", "log takes 1 argument"), ("2x", "unexpected 'x'"),
])
def test_anything_else_is_refused(text, reason) -> None:
    with no_evaluation() as calls, pytest.raises(ExprSyntaxError, match="^attribute p: ") as info:
        parse_expr(text, "attribute p")
    assert not calls and reason in info.value.message


# --- fuzz: random and mutated IR text and plan JSON ---------------------------------------------------

EXPR_TOKENS = ["x", "hidden", "0", "1", "2", "7", "0.5", "1e300", "1e-300", "99999999999999999999", "+", "-", "*",
               "/", "//", "%", "**", "(", ")", ",", "log(", "exp(", "floor(", "Mod(", "Max(", "sqrt(", "Abs(",
               "tanh(", "ceiling(", "Min(", "E", "I", "oo", ".", "[", "'", "_", " "]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.sampled_from(EXPR_TOKENS), max_size=30))
def test_fuzz_expressions(tokens: list[str]) -> None:
    """Token soup, mostly near-valid: an expression or an ExprSyntaxError, never a hang or another error."""
    text = "".join(tokens)
    with no_evaluation() as calls:
        try:
            value = parse_expr(text, "fuzz")
        except ExprSyntaxError as err:
            assert err.message.startswith("fuzz: ")
        else:
            assert isinstance(value, sympy.Expr)
    assert not calls


IR_TEXTS = [str(api.load_model(EXAMPLES / f"{n}.gnn").program(None)) for n in ("gcn", "gat", "gcnii")]
EVIL = ["__import__('os')", ".__class__", "[", "]", "(", ")", "'", '"', "lambda", "**", "9**9**9", "1e99999",
        "%", "//", "/0", "Max(", "log(", "exec(", "eval", "=", ",", "#", ":", "%x", "\n", "nan", "inf", "-",
        "1" * 50, "Mod(1,0)", "(" * 80, "\x00", "\u00e9", "E", "I", "oo", "zoo", "sqrt(-1)"]


@st.composite
def mutated(draw, texts: list[str]) -> str:
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "swap_lines"]))
        pos = draw(st.integers(0, len(text)))
        if kind == "insert":
            text = text[:pos] + draw(st.sampled_from(EVIL) | st.text(max_size=8)) + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 20)):]
        elif kind == "replace":
            text = text[:pos] + draw(st.sampled_from(EVIL)) + text[pos + 1:]
        else:
            lines = text.splitlines(keepends=True)
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if kind == "dup_line":
                lines.insert(i, lines[j])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "".join(lines)
    return text


def _only_our_errors(call) -> None:
    with no_evaluation() as calls:
        try:
            call()
        except GnncError as err:
            assert err.message
            str(err)  # rendering the caret must not fail either
    assert not calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated(IR_TEXTS) | st.text(max_size=200))
def test_fuzz_ir_text(text: str) -> None:
    _only_our_errors(lambda: parse_ir(text, "fuzz.ir"))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=6)


@st.composite
def mutated_plan(draw, plan: dict[str, Any]) -> str:
    """plan.json with fields replaced, removed or added, its IR mutated (checksum recomputed), or its bytes cut."""
    data = json.loads(json.dumps(plan))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "remove", "nested", "ir", "ir", "shards"]))
        key = draw(st.sampled_from(sorted(data)) if data else st.text(max_size=5))
        if kind == "field":
            data[key] = draw(JSON)
        elif kind == "remove":
            data.pop(key, None)
        elif kind == "nested" and isinstance(data.get(key), dict) and data[key]:
            data[key][draw(st.sampled_from(sorted(data[key])))] = draw(JSON)
        elif kind == "ir":
            data["ir"] = draw(mutated([plan["ir"]]))
            data["ir_sha256"] = hashlib.sha256(data["ir"].encode()).hexdigest()
        elif kind == "shards":
            data["shards"] = {draw(st.sampled_from(["parts.npy", "../plan.json", "/", "\x00", "shards", "", "."])
                                   | st.text(max_size=8)): draw(st.text(max_size=64))}
    text = json.dumps(data)
    if draw(st.booleans()):
        return text
    return text[:draw(st.integers(0, len(text)))]


@pytest.fixture(scope="module")
def plan_json(plan_dir) -> dict[str, Any]:
    Plan.load(plan_dir)  # a valid plan loads (and every module loading uses is imported before the fuzz)
    return json.loads((plan_dir / "plan.json").read_text())


def test_fuzz_plan_json(plan_dir, plan_json) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=mutated_plan(plan_json) | st.text(max_size=100))
    def check(text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "plan"
            shutil.copytree(plan_dir, d)
            (d / "plan.json").write_text(text, encoding="utf-8", errors="surrogatepass")
            _only_our_errors(lambda: Plan.load(d))

    check()
