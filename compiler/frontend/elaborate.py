"""Elaboration: a parsed .gnn module and a configuration -> an untyped IR Program.

It binds model parameters (defaults, `--set` overrides, dims taken from the
graph), unrolls `repeat` loops, instantiates each layer call as a graph
`Layer` (its parameters bound, its statements turned into equations, in SSA
form), groups the model-level statements between them into `dense` layers,
and creates the learnable parameters each op needs and those a `param`
declaration states. `edge.NAME` reads the graph's edge data, typed by what
the graph holds (without a graph: `weight`, a number per edge, and `attr`, a
vector per edge, PyG's fields). It reports unknown
names, unknown ops, ops in the wrong primitive and neighbour access outside
`scatter`, each at the user's file:line:col. Types are left for the
`infer-shapes` pass.

Dims stay symbolic: an integer model parameter `hidden` appears in types as
the symbol `hidden`, with its value in the program's `config`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

import sympy

from gnnc.errors import GnncError, GnncTypeError, Loc
from gnnc.errors import GnncTypeError as _E
from gnnc.frontend.syntax import (Assign, Attr, BinOp, Call, CallStmt, Expr, LayerDef, ModelDef, Module, Name, Neg,
                                  Num, ParamDecl, Repeat, Stmt)
from gnnc.ir import VIEWS, Eqn, Layer, Param, Program, Type, Value, attrs_of, ops
from gnnc.ir.expr import as_expr
from gnnc.ir.reducers import REDUCERS, gather_reducers, sync_reducers
from gnnc.ir.text import LINK_TRAINING_KEYS, TRAINING_CHOICES, TRAINING_KEYS, training_problem

GRAPH_INPUTS = {
    "x": Type("vertex", (sympy.Symbol("features"),)),
    "y": Type("vertex", (), "i64"),
    "train": Type("vertex", (), "bool"),
    "val": Type("vertex", (), "bool"),
    "test": Type("vertex", (), "bool"),
}
# link prediction's pair labels (1: an edge, 0: a negative pair), read by `loss = bce(score, label)`
PAIR_LABEL = Value("label", Type("pair", (), "f32"))
MAX_UNROLL = 4096
# y's type under a loss that reads float targets (ops.OpDef.loss "targets"): a column per target, `targets` of
# them (bound from the graph, as `classes` is)
FLOAT_TARGETS = Type("vertex", (sympy.Symbol("targets"),), "f32")
# how each loss is called, for the message that refuses another
LOSS_CALLS = {"cross_entropy": "cross_entropy(logits, y, mask = train)", "mse": "mse(h, y, mask = train)",
              "bce": "bce(logits, y, mask = train)"}


def _is_pair_loss(e: Expr) -> bool:
    """`bce(score, label)`: a link-prediction loss (the labels are the pairs' `label`, not the vertices' y)."""
    return (isinstance(e, Call) and e.func == "bce" and e.inputs is None and len(e.args) == 2
            and isinstance(e.args[1], Name) and e.args[1].id == PAIR_LABEL.name)


def _loss_op(stmts) -> str | None:
    """The op of the model's first `loss = OP(...)` (inside repeat bodies too): it decides y's type."""
    for s in stmts:
        if isinstance(s, Assign) and s.target == "loss" and isinstance(s.expr, Call):
            return None if _is_pair_loss(s.expr) else s.expr.func  # a pair loss reads `label`, y stays classes
        if isinstance(s, Repeat):
            found = _loss_op(s.body)
            if found is not None:
                return found
    return None


# graph classification: a model that reads out graph rows (ops.READOUTS) is trained on labels and masks of graphs
GRAPH_LABELS = {"y": Type("graph", (), "i64"), "train": Type("graph", (), "bool"), "val": Type("graph", (), "bool"),
                "test": Type("graph", (), "bool")}


def _calls_readout(node: object) -> bool:
    """Whether a model's statements (or an expression) call a readout anywhere, repeat bodies included."""
    if isinstance(node, Call) and node.func in ops.READOUTS:
        return True
    if isinstance(node, (list, tuple)):
        return any(_calls_readout(n) for n in node)
    if isinstance(node, (Assign, Repeat, BinOp, Neg, Call)):
        return any(_calls_readout(getattr(node, f)) for f in ("expr", "body", "lhs", "rhs", "operand", "args",
                                                                 "inputs") if hasattr(node, f))
    return False


def graph_inputs(loss: str | None) -> dict[str, Type]:
    """The graph's inputs as a model with this loss op reads them: y is an integer class per vertex, or float
    targets for a loss that reads those (mse, bce)."""
    op = ops.OPS.get(loss or "")
    return {**GRAPH_INPUTS, "y": FLOAT_TARGETS} if op is not None and op.loss == "targets" else GRAPH_INPUTS


@dataclass(frozen=True)
class Const:
    """A compile-time number or dim expression."""

    expr: Any  # sympy expression or bool


Bound = Union[Value, Const]


def _one_of(reducers: tuple[str, ...]) -> str:
    """`sum(...), mean(...) or max(...)`: the calls a statement accepts, for its error message."""
    calls = [f"{r}(...)" for r in reducers]
    return calls[0] if len(calls) == 1 else ", ".join(calls[:-1]) + " or " + calls[-1]


def _num(v: int | float | bool) -> Any:
    if isinstance(v, bool):
        return v
    return sympy.Integer(v) if isinstance(v, int) else sympy.Float(v)


class _Names:
    """SSA names: the first definition of `b` in scope `s` is `s.b`, later ones `s.b.1`, ...;
    temporaries inside an expression are `s.b~1`, `s.b~2`."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.temps: dict[str, int] = {}

    def version(self, base: str) -> str:
        n = self.versions.get(base)
        self.versions[base] = 0 if n is None else n + 1
        return base if n is None else f"{base}.{n + 1}"

    def temp(self, base: str) -> str:
        n = self.temps.get(base, 0) + 1
        self.temps[base] = n
        return f"{base}~{n}"


@dataclass
class _Block:
    """Equations being collected for one layer."""

    name: str
    kind: str  # graph | dense
    prim: str = "model"
    eqns: list[Eqn] = field(default_factory=list)
    params: list[Param] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    target: str = "t"  # base name for temporaries of the statement being elaborated
    edge_values: set[str] = field(default_factory=set)  # results of scatter / softmax statements

    def param_name(self, op: str) -> str:
        k = self.op_counts.get(op, 0)
        self.op_counts[op] = k + 1
        return f"{self.name}.{op}{k}"


class Elaborator:
    def __init__(self, module: Module, config: dict[str, Any], edge_data: dict[str, int | None] | None = None):
        self.module = module
        # the graph's edge data by name and width (None: a number per edge); None: no graph at hand
        self.edge_data = edge_data
        self.file = module.file
        self.config = config
        self.layer_defs = {d.name: d for d in module.layers}
        self.names = _Names()
        self.layers: list[Layer] = []
        self.graph_count = 0
        self.dense_count = 0
        self.training: dict[str, Any] = {}

    def err(self, msg: str, loc: Loc) -> GnncTypeError:
        return GnncTypeError(msg, loc, self.module.source)

    # ----- model level -------------------------------------------------------------------------
    def model(self, m: ModelDef) -> Program:
        env: dict[str, Bound] = {}
        inputs_t = graph_inputs(_loss_op(m.stmts))
        if _calls_readout(m.stmts):
            inputs_t = {**inputs_t, **GRAPH_LABELS}
        for name, t in inputs_t.items():
            env[name] = Value(name, t)
            self.names.versions[name] = 0
        env[PAIR_LABEL.name] = PAIR_LABEL
        self.names.versions[PAIR_LABEL.name] = 0
        for p in m.params:
            val = self.config[p.name]
            if isinstance(val, bool):
                env[p.name] = Const(val)
            elif isinstance(val, float):
                env[p.name] = Const(sympy.Float(val))
            else:  # ints and unbound dims stay symbolic in types
                env[p.name] = Const(sympy.Symbol(p.name))
        self.block = self._new_dense()
        self.loss: Value | None = None
        self.logits: Value | None = None
        self._stmts(m.stmts, env)
        if self.loss is None:
            raise self.err(f"model '{m.name}' defines no loss; add "
                           f"`loss = cross_entropy(h, y, mask = train)`", m.loc)
        self._flush_dense(final=True)
        link = [k for k in LINK_TRAINING_KEYS if k in self.training]
        if link and not any(e.op in ops.PAIR_OPS for layer in self.layers for e in layer.eqns):
            raise self.err(f"training setting '{link[0]}' is for link prediction: score pairs with src./dst. "
                           "(`score = dot(src.z, dst.z)`, `loss = bce(score, label)`)", m.loc)
        layers = _with_outputs(self.layers, self.logits, self.loss)
        inputs = tuple(Value(n, t) for n, t in inputs_t.items())
        if any(v.name == PAIR_LABEL.name for layer in layers for v in layer.inputs):
            inputs += (PAIR_LABEL,)  # a link-prediction program's pair labels (only then: other programs unchanged)
        cfg = tuple(sorted((k, v) for k, v in self.config.items()))
        return Program(m.name, cfg, inputs, tuple(layers), self.logits, self.loss,
                       tuple(sorted(self.training.items())), self.file)

    def _stmts(self, stmts, env: dict[str, Bound]) -> None:
        for s in stmts:
            if isinstance(s, Assign):
                self._assign(s, env)
            elif isinstance(s, Repeat):
                self._repeat(s, env)
            elif isinstance(s, CallStmt):
                self._call_stmt(s, env)
            elif isinstance(s, ParamDecl):
                self._param_decl(s, env, None)

    def _assign(self, s: Assign, env: dict[str, Bound]) -> None:
        if s.target in GRAPH_INPUTS:
            raise self.err(f"'{s.target}' is a graph input and cannot be assigned", s.loc)
        if s.target == "loss":
            self._loss(s, env)
            return
        self.block.target = s.target
        val = self._expr(s.expr, env, "model")
        if isinstance(val, Value):
            val = self._name_result(val, s.target)
        env[s.target] = val

    def _loss(self, s: Assign, env: dict[str, Bound]) -> None:
        e = s.expr
        if not (isinstance(e, Call) and e.func in ops.loss_ops() and e.inputs is None):
            calls = [LOSS_CALLS.get(op, f"{op}(...)") for op in ops.loss_ops()]
            raise self.err(f"the loss must be {', '.join(calls[:-1])} or {calls[-1]}", s.loc)
        if self.loss is not None:
            raise self.err("the loss is defined twice", s.loc)
        if _is_pair_loss(e):  # link prediction: bce(score, label) over the pair set in use, no mask
            self._pair_loss(e, env)
            return
        kw = {k.name: k for k in e.kwargs}
        if len(e.args) != 2 or set(kw) - {"mask"}:
            what = "labels" if ops.OPS[e.func].loss == "classes" else "targets"
            raise self.err(f"{e.func} takes (logits, {what}, mask = MASK)", e.loc)
        logits = self._value(e.args[0], env, "model", "logits")
        labels = self._value(e.args[1], env, "model", "labels")
        mask = self._value(kw["mask"].value, env, "model", "mask") if "mask" in kw else env["train"]
        self.block.target = "loss"
        out = Value(self.names.version("loss"))
        self._emit(e.func, (logits, labels, mask), out, {}, e.loc)
        self.loss, self.logits = out, logits

    def _pair_loss(self, e: Call, env: dict[str, Bound]) -> None:
        """`loss = bce(score, label)`: the mean over every pair of the set in use (two inputs, no mask)."""
        if e.kwargs:
            raise self.err("bce over pairs takes (score, label): every pair of the split in use counts, no mask",
                           e.kwargs[0].loc)
        score = self._value(e.args[0], env, "model", "score")
        self.block.target = "loss"
        out = Value(self.names.version("loss"))
        self._emit("bce", (score, PAIR_LABEL), out, {}, e.loc)
        self.loss, self.logits = out, score

    def _repeat(self, s: Repeat, env: dict[str, Bound]) -> None:
        lo = self._int_const(s.start, env)
        hi = self._int_const(s.stop, env)
        if hi - lo + 1 > MAX_UNROLL:
            raise self.err(f"repeat unrolls {hi - lo + 1} times; at most {MAX_UNROLL} are allowed", s.loc)
        for i in range(lo, hi + 1):
            env[s.var] = Const(sympy.Integer(i))
            self._stmts(s.body, env)

    def _int_const(self, e: Expr, env: dict[str, Bound]) -> int:
        v = self._expr(e, env, "model")
        if isinstance(v, Value):
            raise self.err("a repeat bound must be a number", _loc(e))
        value = _evaluate(v.expr, self.config)
        if value is None or float(value) != int(value):
            raise self.err("a repeat bound must be an integer with a known value; "
                           "give its parameter a default or --set it", _loc(e))
        return int(value)

    def _call_stmt(self, s: CallStmt, env: dict[str, Bound]) -> None:
        c = s.call
        if c.func != "training" or c.inputs is not None:
            raise self.err("only `training(...)` may stand alone as a statement; "
                           "assign other calls to a name", s.loc)
        if c.args:
            raise self.err("training takes keyword arguments: "
                           + ", ".join(f"{k}=..." for k in TRAINING_KEYS), c.loc)
        for k in c.kwargs:
            if k.name not in TRAINING_KEYS:
                raise self.err(f"unknown training setting '{k.name}'{ops.suggest(k.name, TRAINING_KEYS)}",
                               k.loc)
            if TRAINING_KEYS[k.name] is str:  # a name: `optimizer = adamw`, `schedule = cosine`
                choices = TRAINING_CHOICES[k.name]
                if not isinstance(k.value, Name) or k.value.id not in choices:
                    shown = f" '{k.value.id}'" if isinstance(k.value, Name) else ""
                    raise self.err(f"training setting '{k.name}' must be one of {', '.join(choices)}, not{shown or ' an expression'}"
                                   f"{ops.suggest(k.value.id, choices) if isinstance(k.value, Name) else ''}",
                                   _loc(k.value))
                self.training[k.name] = k.value.id
                continue
            v = self._expr(k.value, env, "model")
            value = None if isinstance(v, Value) else _evaluate(v.expr, self.config)
            if value is None:
                raise self.err(f"training setting '{k.name}' must be a number", k.loc)
            want = TRAINING_KEYS[k.name]
            if want is int and float(value) != int(value):
                raise self.err(f"training setting '{k.name}' must be a whole number, not {float(value)!r}",
                               _loc(k.value))
            value = want(value)
            if k.name not in ("epochs", "lr", "weight_decay", "graph_weight_decay", "patience"):
                problem = training_problem(k.name, value)  # the run checks the older settings' ranges
                if problem is not None:
                    raise self.err(f"training setting '{k.name}' {problem}", _loc(k.value))
            self.training[k.name] = value

    # ----- layers ------------------------------------------------------------------------------
    def _new_dense(self) -> _Block:
        b = _Block(f"d{self.dense_count}", "dense")
        self.dense_count += 1
        return b

    def _flush_dense(self, final: bool = False) -> None:
        b = self.block
        if b.eqns or b.params:  # a model's `param` may be declared before a layer call that reads it
            self.layers.append(Layer(b.name, "dense", _free_inputs(b.eqns, b.params), (), tuple(b.eqns),
                                     tuple(b.params)))
            if not final:
                self.block = self._new_dense()

    def _param_decl(self, d: ParamDecl, scope: dict[str, Bound], env: dict[str, Bound] | None) -> None:
        """`param NAME[shape] = INIT`: a learnable tensor of the block being built, bound to NAME."""
        blk = self.block
        reserved = ("src", "dst", "edge") + (("h",) if blk.kind == "graph" else tuple(GRAPH_INPUTS))
        if d.name in reserved:
            what = "the layer's input" if d.name == "h" else (
                "a graph input" if d.name in GRAPH_INPUTS else "reserved for neighbour access")
            raise self.err(f"'{d.name}' is {what} and cannot name a parameter", d.name_loc)
        prim = "transform" if blk.kind == "graph" else "model"
        shape = tuple(self._dim(e, scope, prim, env, f"param {d.name}'s size") for e in d.shape)
        want = f"param {d.name}'s initial value must be a number or one of {', '.join(ops.INITIALISERS)}"
        if isinstance(d.init, Name) and d.init.id in ops.INITIALISERS:
            init: str | float = d.init.id
        elif isinstance(d.init, Name) and d.init.id not in scope and d.init.id not in (env or {}):
            raise self.err(want + ops.suggest(d.init.id, ops.INITIALISERS), d.init.loc)
        else:
            v = self._expr(d.init, scope, prim, env)
            value = None if isinstance(v, Value) else _evaluate(v.expr, self.config)
            if value is None or isinstance(value, bool) or not math.isfinite(float(value)):
                raise self.err(want, _loc(d.init))
            init = float(value)
        v = Value(self.names.version(f"{blk.name}.{d.name}"), Type("param", shape))
        blk.params.append(Param(v, init))
        scope[d.name] = v

    def _instantiate(self, c: Call, env: dict[str, Bound]) -> Value:
        d = self.layer_defs[c.func]
        bound = self._bind_layer_args(d, c, env)
        if len(c.inputs or ()) != 1 or c.inputs_kwargs:
            raise self.err(f"layer '{d.name}' takes one input: {d.name}(...)(h)", c.loc)
        h_in = self._value(c.inputs[0], env, "model", "layer input")
        self._flush_dense()
        name = f"l{self.graph_count}"
        self.graph_count += 1
        edges = "plain"
        for opt, loc in d.options:
            if opt not in VIEWS or opt == "plain":
                raise self.err(f"unknown layer option '{opt}' (known: self_loops)", loc)
            edges = opt
        outer = self.block
        self.block = blk = _Block(name, "graph")
        scope: dict[str, Bound] = {p: Const(v) for p, v in bound.items()}
        scope["h"] = h_in
        output: Value | None = None
        for st in d.stmts:
            if isinstance(st, ParamDecl):
                self._param_decl(st, scope, env)
                continue
            output = self._layer_stmt(st, scope, env) or output
        if output is None:
            raise self.err(f"layer '{d.name}' has no apply statement; the last apply defines "
                           f"the layer's output", d.loc)
        args = tuple((p.name, _attr_value(bound[p.name])) for p in d.params)
        inputs = (h_in,) + tuple(v for v in _free_inputs(blk.eqns, blk.params) if v != h_in)
        self.layers.append(Layer(name, "graph", inputs, (output,), tuple(blk.eqns),
                                 tuple(blk.params), d.name, args, edges, (), c.loc))
        self.block = outer
        return output

    def _bind_layer_args(self, d: LayerDef, c: Call, env: dict[str, Bound]) -> dict[str, Any]:
        names = [p.name for p in d.params]
        if len(c.args) > len(names):
            raise self.err(f"layer '{d.name}' takes {len(names)} parameters, got {len(c.args)}", c.loc)
        given: dict[str, Any] = {}
        for p, a in zip(names, c.args):
            given[p] = (a, _loc(a))
        for k in c.kwargs:
            if k.name not in names:
                raise self.err(f"layer '{d.name}' has no parameter '{k.name}'{ops.suggest(k.name, names)}",
                               k.loc)
            if k.name in given:
                raise self.err(f"parameter '{k.name}' of layer '{d.name}' is given twice", k.loc)
            given[k.name] = (k.value, k.loc)
        bound: dict[str, Any] = {}
        for p in d.params:
            if p.name in given:
                expr, loc = given[p.name]
                v = self._expr(expr, env, "model")
                if isinstance(v, Value):
                    raise self.err(f"parameter '{p.name}' of layer '{d.name}' must be a number or dim, "
                                   f"not a tensor; pass tensors as the layer's input", loc)
                bound[p.name] = v.expr
            elif p.default is not None:
                bound[p.name] = _num(p.default)
            else:
                raise self.err(f"layer '{d.name}' needs a value for parameter '{p.name}'", c.loc)
        return bound

    def _layer_stmt(self, st: Stmt, scope: dict[str, Bound], env: dict[str, Bound]) -> Value | None:
        blk = self.block
        blk.prim = st.prim
        blk.target = st.target
        e = st.expr
        if st.prim == "gather":
            val = self._gather(st, scope, env)
        elif st.prim == "sync":
            if not (isinstance(e, Call) and e.func in sync_reducers() and e.inputs is None
                    and len(e.args) == 1 and not e.kwargs):
                raise self.err(f"a sync statement must be {_one_of(sync_reducers())} of one value", st.loc)
            x = self._value(e.args[0], scope, "sync", "sync input", env)
            val = self._emit("sync", (x,), None, {"reduce": e.func}, e.loc)
        else:
            start = len(blk.eqns)
            v = self._expr(e, scope, st.prim, env)
            if not isinstance(v, Value):
                raise self.err(f"a {st.prim} statement must compute a tensor, not a constant", st.loc)
            if st.prim == "scatter" and len(blk.eqns) == start and v.name not in blk.edge_values:
                raise self.err("a scatter statement must produce an edge value (one message per edge); "
                               "read vertex values through src.X or dst.X", st.loc)
            val = v
        if st.target in ("src", "dst", "edge"):
            raise self.err(f"'{st.target}' is reserved for neighbour access", st.target_loc)
        val = self._name_result(val, st.target)
        scope[st.target] = val
        if st.prim == "scatter" or (st.prim == "gather" and REDUCERS[e.func].per_edge):
            blk.edge_values.add(val.name)
        return val if st.prim == "apply" else None

    def _gather(self, st: Stmt, scope: dict[str, Bound], env: dict[str, Bound]) -> Value:
        e = st.expr
        known = gather_reducers()
        if not (isinstance(e, Call) and e.inputs is None):
            raise self.err("a gather statement must be a reduction: "
                           + ", ".join(f"{r}(...)" for r in known), st.loc)
        if e.func not in known:
            raise self.err(f"unknown reducer '{e.func}' (expected one of "
                           f"{', '.join(known)}){ops.suggest(e.func, known)}",
                           e.loc)
        if len(e.args) != 1 or e.kwargs:
            raise self.err(f"{e.func} takes one argument, the messages to reduce", e.loc)
        m = self._value(e.args[0], scope, "gather", "messages", env)
        r = REDUCERS[e.func]
        if r.per_edge:  # softmax: one coefficient per edge, the op itself names the reduction
            return self._emit(r.emits, (m,), None, {}, e.loc)
        return self._emit("gather", (m,), None, {"reduce": e.func}, e.loc)

    # ----- expressions -------------------------------------------------------------------------
    def _value(self, e: Expr, scope, prim: str, what: str, env=None) -> Value:
        v = self._expr(e, scope, prim, env)
        if not isinstance(v, Value):
            raise self.err(f"expected a tensor for the {what}, got a constant", _loc(e))
        return v

    def _lookup(self, name: str, loc: Loc, scope, env) -> Bound:
        if name in scope:
            return scope[name]
        if env is not None and name in env:  # a model value read inside a layer (x0)
            return env[name]
        hint = ""
        if name in ("src", "dst", "edge"):
            hint = f"; write {name}.NAME"
        raise self.err(f"unknown name '{name}'{hint or ops.suggest(name, list(scope) + list(env or {}))}", loc)

    def _expr(self, e: Expr, scope, prim: str, env=None) -> Bound:
        if isinstance(e, Num):
            return Const(_num(e.value))
        if isinstance(e, Name):
            if e.id in ("true", "false"):
                return Const(e.id == "true")
            return self._lookup(e.id, e.loc, scope, env)
        if isinstance(e, Attr):
            return self._attr(e, scope, prim, env)
        if isinstance(e, Neg):
            v = self._expr(e.operand, scope, prim, env)
            if isinstance(v, Const):
                return Const(-_arith(v.expr, e.loc, self))
            return self._emit("neg", (v,), None, {}, e.loc)
        if isinstance(e, BinOp):
            a = self._expr(e.lhs, scope, prim, env)
            b = self._expr(e.rhs, scope, prim, env)
            if isinstance(a, Const) and isinstance(b, Const):
                x, y = _arith(a.expr, e.loc, self), _arith(b.expr, e.loc, self)
                try:
                    r = {"add": x + y, "sub": x - y, "mul": x * y}.get(e.op)
                    if r is None:
                        if e.op == "div":
                            if y == 0:
                                raise self.err("division by zero", e.loc)
                            r = x / y
                        else:
                            r = x ** y if abs(_evaluate(y, self.config) or 0) < 64 else None
                            if r is None:
                                raise self.err("exponent too large", e.loc)
                except (TypeError, ValueError, OverflowError, ZeroDivisionError):
                    raise self.err(f"cannot compute '{e.op}' of these constants", e.loc) from None
                return Const(r)
            return self._emit(e.op, (self._materialize(a, e.loc), self._materialize(b, e.loc)),
                              None, {}, e.loc)
        if isinstance(e, Call):
            return self._call(e, scope, prim, env)
        raise AssertionError(f"unknown expression node {e!r}")

    def _attr(self, e: Attr, scope, prim: str, env) -> Value:
        if e.base in ("src", "dst") and prim == "model":  # link prediction: z at the pairs' ends (ops.PAIR_OPS)
            v = self._lookup(e.field, e.loc, scope, env)
            if not isinstance(v, Value):
                raise self.err(f"{e.base}.{e.field}: '{e.field}' is a constant, not a vertex tensor", e.loc)
            return self._emit(f"pair_{e.base}", (v,), None, {}, e.loc)
        if e.base in ("src", "dst"):
            if prim != "scatter":
                raise self.err(f"{e.base}.{e.field} reads a neighbour: neighbour access is only allowed "
                               f"in scatter statements", e.loc)
            v = self._lookup(e.field, e.loc, scope, env)
            if not isinstance(v, Value):
                raise self.err(f"{e.base}.{e.field}: '{e.field}' is a constant, not a vertex tensor", e.loc)
            return self._emit(e.base, (v,), None, {}, e.loc)
        if e.base == "edge":
            if prim not in ("scatter", "gather"):
                raise self.err(f"edge.{e.field} reads edge data: only scatter and gather see edges", e.loc)
            if e.field in scope and isinstance(scope[e.field], Value):
                return scope[e.field]  # an edge value computed in this layer (attention weights)
            if e.field in ops.EDGE_DATA:
                return self._emit("edata", (), None, {"name": e.field}, e.loc)
            return self._graph_edge_data(e)
        raise self.err(f"'{e.base}.{e.field}': only src., dst. and edge. can be used with a dot", e.loc)

    def _graph_edge_data(self, e: Attr) -> Value:
        """`edge.NAME` of the graph's own edge data: typed by the graph's array ([E]: a number, [E, d]: d)."""
        if self.edge_data is None:  # no graph: PyG's field names, edge_weight [E] and edge_attr [E, edge_attr]
            known: dict[str, Any] = {n: None if n == "weight" else sympy.Symbol(f"edge_{n}")
                                     for n in ops.EDGE_DATA_WITHOUT_GRAPH}
            where = "known without a graph: " + ", ".join(ops.EDGE_DATA + ops.EDGE_DATA_WITHOUT_GRAPH)
        else:
            known = {k: None if w is None else sympy.Integer(w) for k, w in self.edge_data.items()}
            where = ("the graph has " + (", ".join(sorted(known)) if known else "none") + "; gnnc computes gcn_norm")
        if e.field not in known:
            raise self.err(f"unknown edge data 'edge.{e.field}' ({where}; or an edge value of this layer)"
                           f"{ops.suggest(e.field, list(known) + list(ops.EDGE_DATA))}", e.loc)
        attrs: dict[str, Any] = {"name": e.field}
        if known[e.field] is not None:
            attrs["width"] = known[e.field]
        return self._emit("edata", (), None, attrs, e.loc)

    def _materialize(self, b: Bound, loc: Loc) -> Value:
        if isinstance(b, Value):
            return b
        value = b.expr
        if isinstance(value, bool):
            raise self.err("a boolean cannot be used in arithmetic", loc)
        return self._emit("const", (), None, {"value": _attr_value(value)}, loc)

    def _call(self, c: Call, scope, prim: str, env) -> Bound:
        if c.inputs is not None or c.func in self.layer_defs:
            if c.func not in self.layer_defs:
                raise self.err(f"unknown layer '{c.func}'{ops.suggest(c.func, self.layer_defs)}", c.loc)
            if prim != "model":
                raise self.err(f"layer '{c.func}' can only be used in a model, not inside a layer", c.loc)
            if c.inputs is None:
                raise self.err(f"layer '{c.func}' needs its input: {c.func}(...)(h)", c.loc)
            return self._instantiate(c, env if env is not None else scope)
        f = c.func
        if f in REDUCERS and (f not in ops.OPS or (len(c.args) < 2 and not c.kwargs)):
            raise self.err(f"reducer '{f}' can only be used in a gather statement"
                           + (f" (or {'/'.join(sync_reducers())} in sync)" if REDUCERS[f].sync else "")
                           + (f"; {f}(a, b, ...) of two or more values is elementwise" if f in ops.OPS else ""),
                           c.loc)
        if f in ops.loss_ops():
            raise self.err(f"{f} can only define the model's loss", c.loc)
        if f == "training":
            raise self.err("training(...) must stand alone as a model statement", c.loc)
        if f == "dot" and len(c.args) == 2 and not c.kwargs and prim == "model":  # a pair's score: dot(src.z, dst.z)
            xs = tuple(self._value(a, scope, prim, "dot input", env) for a in c.args)
            return self._emit("inner", xs, None, {}, c.loc)
        op = ops.OPS.get(f)
        if op is None or not op.prims:
            raise GnncTypeError(ops.unknown_op(f, c.loc).message, c.loc, self.module.source)
        if prim not in op.prims:
            where = "a model" if prim == "model" else f"a {prim} statement"
            raise self.err(f"'{f}' cannot be used in {where}", c.loc)
        return self._bind(op, c, scope, prim, env)

    def _bind(self, op: ops.OpDef, c: Call, scope, prim: str, env) -> Bound:
        """A call of a defined op, bound from its signature: tensors, constant arguments, parameters."""
        f = c.func
        emitted = ops.op_def(op.ir_op)
        if op.tensors is None:  # one or more tensors, nothing else
            if not c.args or c.kwargs:
                raise self.err(f"{f} takes one or more tensors", c.loc)
            xs = tuple(self._value(a, scope, prim, f"{f} input", env) for a in c.args)
            return self._emit(op.ir_op, xs, None, {}, c.loc)
        positional = [a for a in op.args if a.positional]
        fixed = [a for a in positional if a.required and not a.keyword]
        self._check_args(c, op.tensors + len(fixed), op.tensors + len(positional),
                         {a.name for a in op.args if a.keyword})
        tensors = []
        for a in c.args[:op.tensors]:
            if op.activation:
                v = self._expr(a, scope, prim, env)
                if isinstance(v, Const):  # constant folding: log(theta / l + 1)
                    if op.fold is None or isinstance(v.expr, bool) or c.args[1:] or c.kwargs:
                        raise self.err(f"'{f}' of a constant is not supported; it applies to tensors", c.loc)
                    return Const(op.fold(v.expr))
                tensors.append(v)
            else:
                tensors.append(self._value(a, scope, prim, f"{op.ir_op} input", env))
        given = c.args[op.tensors:]
        # required arguments take positions first, optional ones in order as far as positions remain
        room = len(given) - sum(a.required for a in positional)
        chosen = []
        for a in positional:
            if a.required or room > 0:
                chosen.append(a)
                room -= not a.required
        values: dict[str, Any] = {}
        for arg, e in zip(chosen, given):
            values[arg.name] = self._arg(op, arg, e, _loc(e), scope, prim, env)
        for k in c.kwargs:
            if k.name in values:
                raise self.err(f"{f}'s argument '{k.name}' is given twice", k.loc)
            arg = next(a for a in op.args if a.name == k.name)
            values[k.name] = self._arg(op, arg, k.value, k.loc, scope, prim, env)
        for arg in op.args:
            if arg.name not in values and arg.required:
                raise self.err(arg.missing or f"{f} needs a value for '{arg.name}'", c.loc)
        attrs = {a.name: values.get(a.name, a.default) for a in op.args}
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if op.elide(attrs):
            return tensors[0]
        params = []
        specs = [p for p in emitted.params if p.when(attrs)]
        if specs:
            base = self.block.param_name(op.ir_op)
            for spec in specs:
                pv = Value(f"{base}.{spec.suffix}")
                self.block.params.append(Param(pv, spec.init))
                params.append(pv)
        return self._emit(op.ir_op, (*tensors, *params), None, attrs, c.loc)

    def _arg(self, op: ops.OpDef, arg: ops.Arg, e: Expr, loc: Loc, scope, prim, env) -> Any:
        """A constant argument's value, checked for its kind; errors point at it."""
        if arg.kind == "number":
            return self._number(e, scope, prim, env)
        if arg.kind == "probability":
            p = self._number(e, scope, prim, env)
            if not 0.0 <= p < 1.0:
                raise self.err(f"{op.name} probability must be in [0, 1), got {p}", _loc(e))
            return p
        v = self._expr(e, scope, prim, env)
        if arg.kind == "flag":
            if not (isinstance(v, Const) and isinstance(v.expr, bool)):
                raise self.err(f"{arg.name} must be true or false", loc)
            return v.expr
        return self._dim_of(v, _loc(e), f"{op.name}'s output size")

    def _dim(self, e: Expr, scope, prim, env, what: str) -> Any:
        return self._dim_of(self._expr(e, scope, prim, env), _loc(e), what)

    def _dim_of(self, v: Bound, loc: Loc, what: str) -> Any:
        """A dim: a positive integer, possibly symbolic; `what` names it in errors."""
        if isinstance(v, Value) or isinstance(v.expr, bool):
            raise self.err(f"{what} must be a dim (a number or integer parameter)", loc)
        value = _evaluate(v.expr, self.config)
        if value is not None and (float(value) != int(value) or int(value) <= 0):
            raise self.err(f"{what} must be a positive integer, got {value}", loc)
        return as_expr(v.expr)

    def _check_args(self, c: Call, lo: int, hi: int, kw: set[str]) -> None:
        if not lo <= len(c.args) <= hi:
            n = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise self.err(f"{c.func} takes {n} positional argument{'s' if hi > 1 else ''}, got {len(c.args)}",
                           c.loc)
        for k in c.kwargs:
            if k.name not in kw:
                raise self.err(f"{c.func} has no argument '{k.name}'", k.loc)

    def _number(self, e: Expr, scope, prim, env) -> float:
        v = self._expr(e, scope, prim, env)
        value = None if isinstance(v, Value) else _evaluate(v.expr, self.config)
        if value is None or isinstance(value, bool):
            raise self.err("expected a number", _loc(e))
        return float(value)

    def _emit(self, op: str, ins: tuple, out: Value | None, attrs: dict, loc: Loc) -> Value:
        blk = self.block
        if out is None:
            out = Value(self.names.temp(f"{blk.name}.{blk.target}" if blk.kind == "graph" else blk.target))
        blk.eqns.append(Eqn(op, tuple(ins), (out,), attrs_of(**attrs), blk.prim, loc))
        return out

    def _name_result(self, val: Value, target: str) -> Value:
        """Give the statement's last temporary the statement's name (SSA versioned)."""
        blk = self.block
        if blk.eqns and blk.eqns[-1].outs[0] == val and "~" in val.name:
            base = f"{blk.name}.{target}" if blk.kind == "graph" else target
            named = Value(self.names.version(base))
            blk.eqns[-1] = blk.eqns[-1].replace(outs=(named,))
            return named
        return val


def _with_outputs(layers: list[Layer], logits: Value, loss: Value) -> list[Layer]:
    """Each layer's outputs: the values it defines that later layers or the results read."""
    out = []
    later_reads: set[str] = {logits.name, loss.name}
    for layer in reversed(layers):
        defined = [p.value for p in layer.params] + [o for e in layer.eqns for o in e.outs]
        keep = [v for v in defined if v.name in later_reads]
        if layer.kind == "graph":
            keep = list(layer.outputs) + [v for v in keep if v not in layer.outputs]
        out.append(layer.replace(outputs=tuple(keep)))
        for v in layer.inputs:
            later_reads.add(v.name)
    return list(reversed(out))


def _free_inputs(eqns: list[Eqn], params: list[Param]) -> tuple[Value, ...]:
    """Values an equation list reads but does not define, in order of first use."""
    defined = {p.value.name for p in params}
    free: list[Value] = []
    for e in eqns:
        for v in e.ins:
            if v.name not in defined and v not in free:
                free.append(v)
        defined.update(o.name for o in e.outs)
    return tuple(free)


def _loc(e: Expr) -> Loc:
    return e.loc


def _arith(x: Any, loc: Loc, elab: Elaborator) -> Any:
    if isinstance(x, bool):
        raise elab.err("a boolean cannot be used in arithmetic", loc)
    return x


def _evaluate(expr: Any, config: dict[str, Any]) -> float | int | bool | None:
    """The numeric value of a constant under the configuration, or None if unbound."""
    if isinstance(expr, bool):
        return expr
    expr = as_expr(expr)
    free = expr.free_symbols
    # only the expression's own symbols: sympy's subs sorts every key it is given, and a deep model evaluates
    # a few hundred constants under its whole configuration (the same values: the other keys match nothing)
    subs = {sym: v for k, v in config.items() if v is not None and not isinstance(v, bool)
            and (sym := sympy.Symbol(k)) in free}
    val = expr.subs(subs) if subs else expr
    if val.free_symbols:
        return None
    if val.is_Integer:
        return int(val)
    try:
        f = float(val)
    except (TypeError, ValueError):
        return None
    return f


def _attr_value(v: Any) -> Any:
    """Constants as plain numbers where known, sympy expressions for symbolic dims."""
    if isinstance(v, bool):
        return v
    v = as_expr(v)
    if v.is_Integer:
        return int(v)
    if v.is_Number:
        return float(v)
    return v


def resolve_config(model: ModelDef, overrides: dict[str, str], graph_dims: dict[str, int]) -> dict[str, Any]:
    """Model parameter values: `--set` beats the graph's dims beats the default.

    A parameter left without a value stays unbound (None): checking a model
    works without a graph, running it reports the missing value.
    """
    names = {p.name: p for p in model.params}
    for k in overrides:
        if k not in names:
            raise GnncError(f"--set {k}: model '{model.name}' has no parameter '{k}'"
                            f"{ops.suggest(k, names)}")
    cfg: dict[str, Any] = {}
    for p in model.params:
        if p.name in overrides:
            cfg[p.name] = _parse_setting(p.name, overrides[p.name], p.default)
        elif p.name in graph_dims:
            cfg[p.name] = int(graph_dims[p.name])
        else:
            cfg[p.name] = p.default
    return cfg


def _parse_setting(name: str, text: str, default: Any) -> Any:
    text = str(text).strip()
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise GnncError(f"--set {name}={text}: expected a number") from None
    if not math.isfinite(value):  # `1e400` reads as inf: no width, rate or count is infinite
        raise GnncError(f"--set {name}={text}: expected a finite number")
    if isinstance(default, int) and not isinstance(default, bool) and value == int(value):
        return int(value)
    return value


def elaborate(module: Module, overrides: dict[str, str] | None = None,
              graph_dims: dict[str, int] | None = None, model_name: str | None = None,
              edge_data: dict[str, int | None] | None = None) -> Program:
    """Elaborate the module's model (the named one, or the only/last one) into IR.

    `edge_data`: the graph's edge data, name -> width (None: a number per edge), or None
    without a graph (gnnc.graph.edge_data.shapes gives it).
    """
    if not module.models:
        raise _E("no model in this file; define one with `model NAME(...) { ... }`",
                 Loc(module.file, 1, 1), module.source)
    seen: dict[str, Loc] = {}
    for d in list(module.layers) + list(module.models):
        if d.name in seen:
            raise GnncTypeError(f"'{d.name}' is defined twice (first at line {seen[d.name].line})", d.loc,
                                module.source)
        seen[d.name] = d.loc
        pnames: set[str] = set()
        for p in d.params:
            if p.name in pnames:
                raise GnncTypeError(f"parameter '{p.name}' is declared twice", p.loc, module.source)
            pnames.add(p.name)
    if model_name is None:
        model = module.models[-1]
    else:
        found = [m for m in module.models if m.name == model_name]
        if not found:
            names = [m.name for m in module.models]
            raise GnncError(f"no model named '{model_name}' in {module.file} (its models: {', '.join(names)})"
                            f"{ops.suggest(model_name, names)}")
        model = found[0]
    cfg = resolve_config(model, overrides or {}, graph_dims or {})
    return Elaborator(module, cfg, edge_data).model(model)
