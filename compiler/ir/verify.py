"""`verify`: the IR's invariants, checked after passes (a broken one is a bug in gnnc).

It lives beside the IR rather than in it because its typed check re-runs each
op's type rule, and the op definitions (gnnc.ir.ops) are built on the IR's records.
"""
from __future__ import annotations

import operator
from typing import Any

from gnnc.errors import GnncTypeError, InternalError
from gnnc.ir import ops
from gnnc.ir.core import LAYER_KINDS, PRIMITIVES, VIEWS, Eqn, Program, Value


class VerifyError(InternalError):
    """An IR invariant is broken: a bug in a pass, not in the user's program."""


# where a check is, as text or as (layer, equation index, op): the text is built only for an error's message
# (a deep model's compile verifies ~5,000 equations after each of its passes, and formatted each place every time)
Where = str | tuple[str, int, str]


def _text(where: Where) -> str:
    return where if isinstance(where, str) else f"layer {where[0]}, equation {where[1]}: {where[2]}"


def verify(program: Program, typed: bool = False, checked: dict[Any, Any] | None = None) -> None:
    """Check the IR's invariants; raise VerifyError naming the broken one.

    1. Every value is defined once: program inputs, layer params and equation
       outputs never share a name.
    2. Every equation input is defined before use: by a program input, an
       earlier layer's output (declared in the reading layer's `inputs`), a
       param of its layer, or an earlier equation of its layer.
    3. Every layer output is defined inside the layer or passes an input through.
    4. Layer kinds and primitives are known; graph layers name an edge view.
    5. `logits` and `loss` are defined by the program.
    6. With `typed=True`: every value has a type, and a value's type is the
       same at its definition and at every use.
    7. With `typed=True`: each equation's op is defined and its type rule, re-run
       on the recorded input types, gives the recorded output types (checked
       last, so a broken use-def chain is reported as such).

    `checked`: equations whose type rule was re-run already, by id (a pass manager verifying after every pass
    passes one dict: a pass rebuilds a few layers and keeps the other equations, which are immutable, so
    their rules are not re-run after each of a deep model's passes), and the parts of the last program it passed
    (`_PASSED`): a program of those very parts (a pass that made a new Program record of the same layers: 3 of
    the 11 verifications of the 64-layer GCNII example's compile) passes as it did, unchecked. Updated in place.
    """
    parts = (program.inputs, program.layers, program.logits, program.loss)
    if checked is not None:
        passed = checked.get(_PASSED)
        if passed is not None and (passed[1] or not typed) and all(map(_same, passed[0], parts)):
            return

    defined: dict[str, Value] = {}
    retype: list[tuple[Eqn, Where]] = []  # type rules are re-run once the structure is known to be sound

    def define(v: Value, where: Where) -> None:
        if v.name in defined:
            raise VerifyError(f"value %{v.name} is defined twice ({_text(where)})")
        if typed and v.type is None:
            raise VerifyError(f"value %{v.name} has no type ({_text(where)})")
        defined[v.name] = v

    def use(v: Value, scope: dict[str, Value], where: Where) -> None:
        known = scope.get(v.name)
        if known is v:  # the definition's own value (as the passes leave nearly every use): nothing to compare
            return
        if known is None:
            raise VerifyError(f"%{v.name} is used before it is defined ({_text(where)})")
        if typed and known.type is not v.type and known.type != v.type:
            raise VerifyError(
                f"%{v.name} has type {v.type} at its use but {scope[v.name].type} "
                f"at its definition ({_text(where)})")

    for v in program.inputs:
        define(v, "program input")
    visible: dict[str, Value] = dict(defined)
    for layer in program.layers:
        if layer.kind not in LAYER_KINDS:
            raise VerifyError(f"layer {layer.name} has unknown kind {layer.kind!r}")
        if layer.kind == "graph" and layer.edges not in VIEWS:
            raise VerifyError(f"layer {layer.name} reads unknown edge view {layer.edges!r}")
        scope: dict[str, Value] = {}
        for v in layer.inputs:
            use(v, visible, f"input of layer {layer.name}")
            scope[v.name] = visible[v.name]
        for p in layer.params:
            define(p.value, f"param of layer {layer.name}")
            if p.value.type is not None and p.value.type.domain != "param":
                raise VerifyError(f"param %{p.value.name} is not in the param domain")
            scope[p.value.name] = p.value
        # the equations, the bulk (a 64-layer model's ~1,000, after each of its passes): define and use inline,
        # and a use whose value is its definition's own (as the passes leave nearly all) compares no types
        for i, e in enumerate(layer.eqns):
            if e.prim not in PRIMITIVES:
                raise VerifyError(f"unknown primitive {e.prim!r} ({_text((layer.name, i, e.op))})")
            for v in e.ins:
                known = scope.get(v.name)
                if known is not v and (known is None or typed and known.type is not v.type and known.type != v.type):
                    use(v, scope, (layer.name, i, e.op))  # (raises)
            for v in e.outs:
                if v.name in defined or typed and v.type is None:
                    define(v, (layer.name, i, e.op))  # (raises)
                defined[v.name] = v
                scope[v.name] = v
            # an equation whose rule ran already (`checked`) is not listed again
            if typed and (checked is None or checked.get(id(e)) is not e):
                retype.append((e, (layer.name, i, e.op)))
        for v in layer.outputs:
            use(v, scope, f"output of layer {layer.name}")
            visible[v.name] = scope[v.name]
    for role, v in (("logits", program.logits), ("loss", program.loss)):
        if v.name not in visible:
            raise VerifyError(f"the program's {role} %{v.name} is not defined")
    for e, where in retype:
        check_types(e, _text(where))
        if checked is not None:
            checked[id(e)] = e  # holding it: its id is not reused while the dict lives
    if checked is not None:
        checked[_PASSED] = (parts, typed)  # (held: their ids are not reused either)


_PASSED = "passed"  # `checked`'s entry of the last program's parts that passed, and whether typed


def _same(a: Any, b: Any) -> bool:
    """Whether a program part (a tuple of records, or one) is the other's very objects (records are immutable)."""
    if a is b:
        return True
    return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(operator.is_, a, b))


def check_types(e: Eqn, where: str) -> None:
    """Re-run the equation's type rule on its recorded input types; the outputs must match."""
    if e.op not in ops.OPS or ops.OPS[e.op].type_rule is None:
        raise VerifyError(f"op '{e.op}' is not defined in gnnc.ir.ops ({where})")
    try:
        want = ops.infer(e, [v.type for v in e.ins])
    except GnncTypeError as err:
        raise VerifyError(f"the type rule of '{e.op}' rejects its recorded input types: {err.message} ({where})") \
            from None
    if len(want) != len(e.outs):
        raise VerifyError(f"'{e.op}' gives {len(want)} result(s) but records {len(e.outs)} ({where})")
    for v, t in zip(e.outs, want):
        if (v.type.domain, v.type.dtype) != (t.domain, t.dtype) or not ops.same_shape(v.type.shape, t.shape):
            raise VerifyError(f"%{v.name} is recorded as {v.type} but its type rule gives {t} ({where})")
