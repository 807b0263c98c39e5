"""A kit for testing passes one at a time, the way LLVM tests use FileCheck.

    from gnnc.testing import run_pass, filecheck, assert_rewrite_exact

    out = run_pass("lower", "examples/sage.gnn", dims={"features": 8, "classes": 3})
    filecheck(out, '''
        CHECK: layer l0 graph SAGE
        CHECK: spmm[reduce=mean]
        CHECK-NOT: gather[
    ''')
    assert_rewrite_exact("reorder-gemm", "examples/sage.gnn")

`run_pass` takes IR as text, as a Program, or a `.gnn` file (elaborated and
run through the passes that must come before the one under test).
`filecheck` raises `FileCheckError` whose message names the failing CHECK
line and shows where in the output the search stood.
`assert_rewrite_exact` checks that a rewrite leaves the model's outputs
and gradients unchanged on a random graph.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from gnnc.frontend.elaborate import elaborate
from gnnc.frontend.syntax import parse
from gnnc.graph import GraphView
from gnnc.graph import Graph
from gnnc.ir import Program, verify
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE, PassContext, parse_pipeline, passes, run_pipeline
from gnnc.runtime import optim, rng
from gnnc.runtime.executor import ExecContext, Interpreter, forward, graph_inputs, init_params
from gnnc.runtime.train import TrainConfig, Worker, train_step


class FileCheckError(AssertionError):
    """A CHECK line did not hold; the message shows the check and the output around it."""


def as_program(ir: str | Program | os.PathLike, dims: dict[str, int] | None = None,
               overrides: dict[str, Any] | None = None) -> Program:
    """IR from a Program, IR text, or a .gnn file path / source text (elaborated)."""
    if isinstance(ir, Program):
        return ir
    text = str(ir)
    if isinstance(ir, os.PathLike) or (text.endswith(".gnn") and "\n" not in text):
        path = Path(text)
        module = parse(path.read_text(), str(path))
        return elaborate(module, {k: str(v) for k, v in (overrides or {}).items()}, dims or {})
    if text.lstrip().startswith("program "):
        return parse_ir(text)
    return elaborate(parse(text, "<test>"), {k: str(v) for k, v in (overrides or {}).items()}, dims or {})


def _prerequisites(first: str) -> list[str]:
    """The default-pipeline passes that come before the first pass under test."""
    if first in DEFAULT_PIPELINE:
        return DEFAULT_PIPELINE[: DEFAULT_PIPELINE.index(first)]
    return [n for n in DEFAULT_PIPELINE if n in ("infer-shapes", "check")]


def run_pass(pipeline: str, ir: str | Program | os.PathLike, *, dims: dict[str, int] | None = None,
             overrides: dict[str, Any] | None = None, ctx: PassContext | None = None,
             prepare: bool | None = None) -> Program:
    """Run the named pass (or pipeline text, `a,b{key=value}`) on `ir`; verify after each pass.

    A `.gnn` input is first taken through the default passes that precede
    the one under test (`prepare=False` to skip that); IR text runs as given.
    `ctx`: the graph, workers, partition and cluster the passes may consult.
    """
    specs = parse_pipeline(pipeline)
    program = as_program(ir, dims, overrides)
    is_text = isinstance(ir, str) and str(ir).lstrip().startswith("program ")
    if prepare is None:
        prepare = not is_text and not isinstance(ir, Program)
    ctx = ctx or PassContext()
    if prepare:
        program = run_pipeline(program, _prerequisites(specs[0].name), ctx, verify_each=True)
    return run_pipeline(program, specs, ctx, verify_each=True)


_DIRECTIVE = re.compile(r"^\s*(?://|#)?\s*(CHECK(?:-NEXT|-NOT|-SAME)?):\s?(.*)$")


def _pattern(text: str) -> re.Pattern:
    """Literal text, with {{regex}} blocks as in FileCheck."""
    parts = re.split(r"\{\{(.*?)\}\}", text.strip())
    out = []
    for i, p in enumerate(parts):
        out.append(p if i % 2 else re.escape(p))
    return re.compile("".join(out))


def filecheck(output: str | Program, checks: str) -> None:
    """Match CHECK / CHECK-NEXT / CHECK-SAME / CHECK-NOT lines against `output`, FileCheck style.

    CHECK finds its pattern on a line after the previous match; CHECK-NEXT on
    the very next line; CHECK-SAME on the same line as the previous match,
    after it; CHECK-NOT must not match between the previous match and the
    next positive match (or the end). Patterns are literal text with
    `{{regex}}` blocks.
    """
    lines = str(output).splitlines()
    directives = []
    for k, raw in enumerate(checks.splitlines(), 1):
        m = _DIRECTIVE.match(raw)
        if m:
            directives.append((k, m.group(1), m.group(2), _pattern(m.group(2))))
    if not directives:
        raise FileCheckError("no CHECK lines given")
    pos = -1  # index of the line of the last positive match
    col = 0
    pending_not: list = []

    def context(at: int) -> str:
        lo, hi = max(at - 2, 0), min(at + 3, len(lines))
        return "\n".join(f"{'>' if i == at else ' '} {i + 1:4d} | {lines[i]}" for i in range(lo, hi))

    def flush_nots(until: int) -> None:
        for k, kind, text, pat in pending_not:
            for i in range(pos + 1 if pos >= 0 else 0, until):
                if pat.search(lines[i]):
                    raise FileCheckError(f"check line {k}: CHECK-NOT: {text}\n  found on output line {i + 1}:\n"
                                         f"{context(i)}")
        pending_not.clear()

    for k, kind, text, pat in directives:
        if kind == "CHECK-NOT":
            pending_not.append((k, kind, text, pat))
            continue
        if kind == "CHECK-SAME":
            m = pat.search(lines[pos], col) if 0 <= pos < len(lines) else None
            if not m:
                raise FileCheckError(f"check line {k}: CHECK-SAME: {text}\n  not found on output line "
                                     f"{pos + 1}:\n{context(max(pos, 0))}")
            col = m.end()
            continue
        if kind == "CHECK-NEXT":
            nxt = pos + 1
            if nxt >= len(lines) or not pat.search(lines[nxt]):
                raise FileCheckError(f"check line {k}: CHECK-NEXT: {text}\n  expected on output line {nxt + 1}, "
                                     f"the line after the previous match:\n{context(min(nxt, len(lines) - 1))}")
            flush_nots(nxt)
            pos, col = nxt, pat.search(lines[nxt]).end()
            continue
        found = None
        for i in range(pos + 1, len(lines)):
            m = pat.search(lines[i])
            if m:
                found = (i, m.end())
                break
        if found is None:
            start = max(pos + 1, 0)
            raise FileCheckError(f"check line {k}: CHECK: {text}\n  not found after output line {pos + 1}; "
                                 f"the search started here:\n{context(min(start, len(lines) - 1))}")
        flush_nots(found[0])
        pos, col = found
    flush_nots(len(lines))


def random_graph(n: int = 30, e: int = 120, features: int = 8, classes: int = 3, seed: int = 0):
    """A small random graph with self-loops, duplicate edges and isolated vertices."""
    import numpy as np


    rs = np.random.RandomState(seed)
    live = max(n - 2, 1)
    src = np.concatenate([rs.randint(0, live, e), [0, 0]])
    dst = np.concatenate([rs.randint(0, live, e), [0, 0]])
    g = torch.Generator().manual_seed(seed)
    train = torch.rand(n, generator=g) < 0.6
    return Graph(n, src, dst, torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g),
                 train, ~train, ~train, f"random{seed}")


def outputs_and_grads(program: Program, graph, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter gradient of one loss evaluation (no dropout)."""
    verify(program, typed=True)
    params = init_params(program, seed)
    views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), False, lambda i: 0,
                      max(float(graph.train_mask.sum()), 1.0))
    logits, loss = forward(Interpreter(program), params, graph_inputs(graph), ctx)
    loss.backward()
    return logits.detach(), {k: p.grad.detach() if p.grad is not None else torch.zeros_like(p)
                             for k, p in params.items()}


def first_training_step(program: Program, graph, seed: int, use_kernels: bool = False
                        ) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
    """Logits, loss and every parameter's gradient of a run's first training step in one process, dropout on and
    its masks drawn as epoch 0 of a run seeded `seed` draws them: what a distributed step must reproduce.
    `use_kernels`: the ops' kernels (torch's CSR products) instead of their reference implementations."""
    params = init_params(program, seed)
    views = {layer.edges: GraphView.build(graph, layer.edges) for layer in program.graph_layers()}
    kb = rng.stream_key(seed, 0)
    ctx = ExecContext(views, torch.arange(graph.num_nodes), program.config_dict(), True,
                      lambda i: rng.stream_key(kb, i), max(float(graph.train_mask.sum()), 1.0), use_kernels)
    logits, loss = forward(Interpreter(program), params, graph_inputs(graph), ctx)
    loss.backward()
    return logits.detach(), float(loss.detach()), {k: p.grad for k, p in params.items()}


def sgd_steps(program: Program, graph, cfg: TrainConfig, epochs: int = 2
              ) -> tuple[Worker, dict[str, torch.nn.Parameter], list[dict[str, torch.Tensor | None]]]:
    """One process's first `epochs` training steps from `cfg.seed`'s parameters: the worker, its parameters after
    them and every parameter's gradient at each step. SGD (lr 0.01), not the runs' Adam: Adam's step is about
    lr * sign(gradient) however small the gradient, so the rounding noise of a gradient that is 0 in exact
    arithmetic (a bias under a batch norm) moves a parameter by lr either way, which the evaluation (running
    statistics) then shows."""
    worker = Worker(program, graph, cfg)
    params = init_params(program, cfg.seed)
    opt = optim.SGD(list(params.values()), lr=0.01)
    grads = []
    for epoch in range(epochs):
        train_step(worker, params, opt, None, epoch)
        grads.append({k: None if p.grad is None else p.grad.detach().clone() for k, p in params.items()})
    return worker, params, grads


def assert_rewrite_exact(pipeline: str, ir: str | Program | os.PathLike, *, graph=None, rtol: float = 1e-5,
                         dims: dict[str, int] | None = None, overrides: dict[str, Any] | None = None) -> Program:
    """Run a rewrite and check outputs and gradients are unchanged (relative error <= rtol).

    Without `graph`, a random graph as wide as `dims` says (features, classes);
    a given graph must agree with `dims` (an AssertionError names the field).
    """
    if graph is None:
        widths = {k: int(v) for k, v in (dims or {}).items() if k in ("features", "classes")}
        graph = random_graph(**widths)
    have = {"features": graph.num_features, "classes": graph.num_classes}
    given = dims or {}
    misfit = [k for k in ("features", "classes") if k in given
              and (int(given[k]) != have[k] if k == "features" else int(given[k]) < have[k])]
    if misfit:
        k = misfit[0]
        raise AssertionError(f"dims {k}={given[k]} does not fit the graph given, which has {k}={have[k]}: pass dims "
                             f"that match it, or no graph (a random one is then made as wide as the dims)")
    dims = dims or have
    specs = parse_pipeline(pipeline)
    before = as_program(ir, dims, overrides)
    if not isinstance(ir, Program) and not str(ir).lstrip().startswith("program "):
        before = run_pipeline(before, _prerequisites(specs[0].name), verify_each=True)
    after = run_pipeline(before, specs, verify_each=True)
    out0, g0 = outputs_and_grads(before, graph)
    out1, g1 = outputs_and_grads(after, graph)
    _close("outputs", out1, out0, rtol)
    assert set(g0) == set(g1), f"the rewrite changed the parameters: {sorted(set(g0) ^ set(g1))}"
    for k in g0:
        _close(f"gradient of {k}", g1[k], g0[k], rtol)
    return after


def _close(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = float((got - want).norm() / want.norm().clamp(min=1e-12))
    if err > rtol:
        raise AssertionError(f"{what} changed by the rewrite: relative error {err:.3g} > {rtol}")


def known_passes() -> list[str]:
    return sorted(passes())
