"""Seeded random `.gnn` programs, for differential tests of whatever runs them.

    from gnnc.program_gen import generate

    source = generate(7)                      # the same text for the same seed, on every machine
    model = gnnc.load_model_source(source, "gen-7.gnn")

A program is a random stack of the language's ops: graph layers (sums, means, maxima and minima of
neighbours' rows, weighted by `edge.gcn_norm`, `edge.weight` or nothing; attention as GAT scores it,
`leaky_relu(dot(src.z) + dot(dst.z))`, or as GATv2, `dot(leaky_relu(src.zl + dst.zr))`, with its
softmax, a dropout of the coefficients and per-head maps, concatenated or averaged; SAGE's and GIN's
combinations with learnable scalars), and between them chains of activations, dropouts, dense maps,
`batch_norm`, `layer_norm`, learnable parameters and residuals (model values read by name, in the model
and inside layers, as GCNII's `x0`). Every width is a literal or `features`/`classes`, so each call's `in`
is checked against its input.

`generate(seed, task=...)` draws the same encoders for the other tasks a user can write: `regress`
(`loss = mse(h, y, mask = train)` over `targets` float columns), `multilabel` (`bce` on `targets` 0/1 columns),
both also reading the edges' features (`edge.attr`, `EDGE_FEATURES` wide: a sigmoid gate of messages, their mean
into the vertices); `graph` (graph classification: readouts `global_sum_pool`, `global_mean_pool`,
`global_max_pool`, alone or concatenated, then dense layers on graph rows; no edge data, as the graph datasets
have none); `link` (link prediction: `score = dot(src.z, dst.z)`, or an MLP on `src.z * dst.z` or
`concat(src.z, dst.z)`, `loss = bce(score, label)`). The default task, `classify`, draws exactly what it drew
before the others existed (tests keep programs by seed).

Every program this module produces type-checks (`gnnc check`: `gnnc.model_file.check`) on a graph with
`edge_weight` (and `edge_attr`, EDGE_FEATURES wide, for `regress`, `multilabel` and `link`): a refused program is a bug of this generator or of the checker, never skipped
(tests/test_generated_programs.py). A test runs the programs and compares two ways of computing them:
the compiled fast paths and the torch reference (`GNNC_NATIVE=0`), one process and two.
"""
from __future__ import annotations

import random

ACTIVATIONS = ("relu", "elu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "softplus")
HIDDEN = (4, 6, 8)
TASKS = ("classify", "regress", "multilabel", "graph", "link")
EDGE_FEATURES = 3  # the width of `edge.attr` the task programs that read it expect
# the edge data each task's programs may read: graph datasets have none (gnnc.graph.tu_dataset)
_EDGES = {"classify": ("weight",), "regress": ("weight", "attr"), "multilabel": ("weight", "attr"), "graph": (),
          "link": ("weight", "attr")}
READOUTS = ("global_sum_pool", "global_mean_pool", "global_max_pool")


class _Program:
    """The text of one program being drawn: its layers, and the model's statements."""

    def __init__(self, rnd: random.Random, edges: tuple[str, ...] = ("weight",)) -> None:
        self.rnd = rnd
        self.edges = edges  # the graph's edge data the program may read (`edge.weight`, `edge.attr`)
        self.layers: list[str] = []
        self.body: list[str] = []
        self.named: list[tuple[str, str]] = []  # model values kept by name (residuals), with their widths
        self.fresh = 0

    def name(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def p(self) -> str:
        return self.rnd.choice(("0.1", "0.3", "0.5"))

    def act(self, x: str) -> str:
        a = self.rnd.choice(ACTIVATIONS)
        if a == "leaky_relu":
            return f"leaky_relu({x}, {self.rnd.choice(('0.01', '0.2'))})"
        if a == "elu" and self.rnd.random() < 0.3:
            return f"elu({x}, 0.5)"
        return f"{a}({x})"

    def maybe_sync(self, lines: list[str]) -> str:
        """A sync of the layer's `c` or none (a no-op in one process, a reduction on ranks); the value to go on."""
        if self.rnd.random() < 0.7:
            lines.append("sync      s = sum(c)")
            return "s"
        return "c"

    def tail(self, x: str, norms: bool = True) -> str:
        """A random epilogue over `x`: [bias], [a normalisation], [activation], [dropout], each or not.

        A normalisation comes before the dropout: normalising rows a dropout has left with a few small
        values divides by their norm, whose rounding then dominates every gradient (no implementation's
        fault, and no model's practice). No `l2_normalize`: a row of zeros (a vertex without in-edges, a
        zero-initialised bias) has 1e12 times its gradient (x / max(|x|, 1e-12)), and the first step blows
        the model up into values whose every rounding shows."""
        r = self.rnd
        if r.random() < 0.4:
            x = f"bias({x})"
        if r.random() < 0.15 and norms:  # the draw made all the same: `classify` programs stay as they were
            x = r.choice(("layer_norm", "batch_norm")) + f"({x})"
        if r.random() < 0.6:
            x = self.act(x)
        if r.random() < 0.4:
            x = f"dropout({x}, {self.p()})"
        return x

    def rows(self, x: str, width: str) -> tuple[str, str]:
        """A few statements over the graph or pair rows `x` (width `width`): activations, dropouts, dense maps and
        scalings, no normalisation (vertex rows' alone) and no vertex value; the new value's name and width."""
        r = self.rnd
        for _ in range(r.randint(0, 3)):
            kind = r.choice(("act", "dropout", "linear", "linear", "scale"))
            if kind == "act":
                self.stmt(f"{x} = {self.act(x)}")
            elif kind == "dropout":
                self.stmt(f"{x} = dropout({x}, {self.p()})")
            elif kind == "linear":
                width = str(r.choice(HIDDEN))
                self.stmt(f"{x} = {self.tail(f'linear({x}, {width})', norms=False)}")
            else:
                g = self.name("g")
                self.stmt(f"param {g} = {r.choice(('0.5', '2.0'))}")
                self.stmt(f"{x} = {g} * {x}")
        return x, width

    # ----- graph layers: each returns the call's text and its output width

    def conv(self, w_in: str, w_out: str, residual: tuple[str, str] | None) -> str:
        """A message-passing layer (GCN, SAGE, GIN, GraphConv shapes) defined here; returns its call's name."""
        r = self.rnd
        name = self.name("Conv")
        loops = r.random() < 0.5
        coef = r.choice([c for c in (["", "edge.gcn_norm * ", "edge.weight * ", f"dropout(edge.gcn_norm, {self.p()}) * "]
                                     if loops else ["", "edge.weight * ", "edge.gcn_norm * "])
                         if "edge.weight" not in c or "weight" in self.edges])
        if "attr" in self.edges and r.random() < 0.3:  # a gate learned from the edge's features
            coef = "sigmoid(dot(edge.attr)) * "
        reducer = r.choice(("sum", "sum", "mean", "max", "min"))
        lines = []
        transform_first = r.random() < 0.5
        if transform_first:
            lines.append(f"transform t = linear(h, out, bias = {r.choice(('true', 'false'))})")
            src = "t"
        else:
            src = "h"
        message = r.choice([f"{coef}src.{src}", f"{coef}src.{src}", f"{self.act('src.' + src)}",
                            f"src.{src} - dst.{src}", f"max(src.{src}, dst.{src})"])
        lines.append(f"scatter   m = {message}")
        lines.append(f"gather    a = {reducer}(m)")
        if transform_first:
            combine = r.choice(["a", "a + t", "bias(a)"])
            width = "out"
        else:
            combine = r.choice([f"linear(a, out) + linear(h, out, bias = false)", "linear(a, out)",
                                "linear((1 + e) * h + a, out)", f"linear({self.act('linear((1 + e) * h + a, out)')}, out)"])
            if "(1 + e)" in combine:
                lines.insert(0, f"param     e = {r.choice(('0.0', '0.3'))}")
        t = combine
        if residual is not None and residual[1] == w_out and r.random() < 0.5:
            t = f"{r.choice(('0.9', '0.5'))} * ({t}) + {r.choice(('0.1', '0.5'))} * {residual[0]}"
        lines.append(f"transform c = {t}")
        lines.append(f"apply     h = {self.tail(self.maybe_sync(lines))}")
        with_ = " with self_loops" if loops else ""
        self.layers.append(f"layer {name}(in, out){with_} {{\n  " + "\n  ".join(lines) + "\n}\n")
        return name

    def attention(self, heads: int, concat: bool) -> str:
        """GAT or GATv2 attention with `heads` heads, concatenated or averaged; returns the layer's name."""
        r = self.rnd
        name = self.name("Att")
        bias = r.choice(("true", "false"))
        v2 = r.random() < 0.5
        lines = []
        if v2:
            lines += [f"transform zl = linear(h, {heads}, out, bias = {bias})",
                      f"transform zr = linear(h, {heads}, out, bias = {r.choice(('true', 'false'))})"]
            score = r.choice([f"dot(leaky_relu(src.zl + dst.zr, {r.choice(('0.2', '0.01'))}))",
                              "dot(src.zl + dst.zr)"])
            z = "zl"
        else:
            lines.append(f"transform z = linear(h, {heads}, out, bias = {bias})")
            score = r.choice([f"leaky_relu(dot(src.z) + dot(dst.z), {r.choice(('0.2', '0.01'))})",
                              "dot(src.z) + dot(dst.z)", "dot(src.z) * dot(dst.z)"])
            z = "z"
        lines.append(f"scatter   e = {score}")
        lines.append("gather    alpha = softmax(e)")
        coef = f"dropout(edge.alpha, {self.p()})" if r.random() < 0.6 else "edge.alpha"
        lines.append(f"scatter   m = {coef} * src.{z}")
        lines.append("gather    a = sum(m)")
        join = 'concat' if concat else 'mean_heads'
        lines.append(f"transform c = {join}(a)")
        last = self.maybe_sync(lines)
        skip = f" + {join}(a)" if r.random() < 0.2 else ""  # the aggregation read twice
        lines.append(f"apply     h = {self.tail(last)}{skip}")
        loops = " with self_loops" if r.random() < 0.8 else ""
        self.layers.append(f"layer {name}(in, out){loops} {{\n  " + "\n  ".join(lines) + "\n}\n")
        return name

    # ----- the model

    def stmt(self, text: str) -> None:
        self.body.append(text)

    def dense(self, h: str, width: str) -> tuple[str, str]:
        """A few model statements over `h` (width `width`); returns the new value's name and width."""
        r = self.rnd
        for _ in range(r.randint(0, 5)):
            kind = r.choice(("act", "act", "dropout", "linear", "norm", "param", "residual", "jk"))
            if kind == "act":
                self.stmt(f"h = {self.act('h')}")
            elif kind == "dropout":
                self.stmt(f"h = dropout(h, {self.p()})")
            elif kind == "linear":
                width = str(r.choice(HIDDEN))
                self.stmt(f"h = {self.tail(f'linear(h, {width})')}")
            elif kind == "norm":
                self.stmt(f"h = {r.choice(('batch_norm', 'layer_norm'))}(h)")
            elif kind == "param":
                if r.random() < 0.5:
                    g = self.name("g")
                    self.stmt(f"param {g} = {r.choice(('0.5', '1.0', '2.0'))}")
                    self.stmt(f"h = {g} * h")
                else:
                    # a vector added: never zeros, whose sum with h a max(h, r) of a value r kept before would
                    # tie with r everywhere, then (one step later) wherever rounding drops the small vector
                    g = self.name("v")
                    self.stmt(f"param {g}[{width}] = {r.choice(('ones', 'glorot'))}")
                    self.stmt(f"h = h + {g}")
            elif kind == "residual":
                same = [n for n, w in self.named if w == width]
                if same:
                    self.stmt(f"h = h + {r.choice(same)}")
                else:
                    kept = self.name("r")
                    self.stmt(f"{kept} = h")
                    self.named.append((kept, width))
            else:  # jumping knowledge: the elementwise max, or the concatenation, with an earlier value
                same = [n for n, w in self.named if w == width]
                if same:
                    other = r.choice(same)
                    if r.random() < 0.5:
                        self.stmt(f"h = {r.choice(('max', 'min'))}(h, {other})")
                    else:
                        self.stmt(f"h = concat(h, {other})")
                        width = str(2 * int(width)) if width.isdigit() else f"2 * {width}"
        return h, width


EDGE_MEAN = """layer EdgeMean() {
  scatter   m = edge.attr
  gather    a = mean(m)
  apply     h = a
}
"""


def _encoder(g: _Program, n_layers: int, out: str) -> None:
    """The vertex model: graph layers and dense statements from x to `h`, `out` wide (a width's text)."""
    r = g.rnd
    width = "features"
    if r.random() < 0.4:
        g.stmt(f"h = dropout(x, {g.p()})")
    else:
        g.stmt("h = x")
    if r.random() < 0.3:
        hidden = str(r.choice(HIDDEN))
        g.stmt(f"h = {g.tail(f'linear(h, {hidden})')}")
        width = hidden
    if "attr" in g.edges and r.random() < 0.4:  # the mean of the in-edges' features beside the vertex's own
        hidden = str(r.choice(HIDDEN))
        g.layers.append(EDGE_MEAN)
        g.stmt(f"h = {g.tail(f'linear(concat(h, EdgeMean()(x)), {hidden})')}")
        width = hidden
    if width != "features" and r.random() < 0.5:
        g.stmt("x0 = h")
        g.named.append(("x0", width))
    for k in range(n_layers):
        last = k == n_layers - 1
        w_out = out if last else str(r.choice(HIDDEN))
        if r.random() < 0.35:
            heads = 1 if last else r.choice((1, 2, 3))
            concat = not last and r.random() < 0.6
            name = g.attention(heads, concat)
            g.stmt(f"h = {name}({width}, {w_out})(h)")
            width = str(heads * int(w_out)) if concat else w_out
        else:
            residual = next(((n, w) for n, w in g.named if n == "x0"), None)
            name = g.conv(width, w_out, residual)
            g.stmt(f"h = {name}({width}, {w_out})(h)")
            width = w_out
        if not last:
            _, width = g.dense("h", width)
    if width != out:  # a last jumping-knowledge step may have widened the output
        g.stmt(f"h = linear(h, {out})")


def generate(seed: int, layers: int | None = None, task: str = "classify") -> str:
    """The text of a random well-typed model (`model Gen`) for `task` (TASKS), the same for the same seed, `layers`
    and task."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (expected one of {', '.join(TASKS)})")
    r = random.Random(seed)
    g = _Program(r, _EDGES[task])
    n_layers = layers if layers is not None else r.randint(1, 3)
    if task == "classify":
        _encoder(g, n_layers, "classes")
        params, loss = "features, classes", "cross_entropy(h, y, mask = train)"
    elif task in ("regress", "multilabel"):
        _encoder(g, n_layers, "targets")
        params, loss = "features, targets", f"{'mse' if task == 'regress' else 'bce'}(h, y, mask = train)"
    elif task == "graph":
        width = str(r.choice(HIDDEN))
        _encoder(g, n_layers, width)
        pools = r.sample(READOUTS, r.choice((1, 1, 2)))
        g.stmt(f"g = {pools[0]}(h)" if len(pools) == 1 else f"g = concat({', '.join(f'{p}(h)' for p in pools)})")
        g.rows("g", str(len(pools) * int(width)))
        g.stmt("g = linear(g, classes)")
        params, loss = "features, classes", "cross_entropy(g, y, mask = train)"
    else:
        latent = str(r.choice(HIDDEN))
        _encoder(g, n_layers, latent)
        g.stmt("z = h")
        kind = r.choice(("dot", "dot", "hadamard", "concat"))
        if kind == "dot":
            g.stmt("score = dot(src.z, dst.z)")
        else:
            pair = "src.z * dst.z" if kind == "hadamard" else "concat(src.z, dst.z)"
            g.stmt(f"p = {pair}")
            g.rows("p", latent if kind == "hadamard" else str(2 * int(latent)))
            g.stmt("score = linear(p, 1)")
        params, loss = "features", "bce(score, label)"
    body = "\n  ".join(g.body)
    return "".join(l + "\n" for l in g.layers) + (
        f"model Gen({params}) {{\n  {body}\n  loss = {loss}\n}}\n")
