"""An equation run once per source part (gnnc.runtime.parts) equals the same equation on the whole view.

Value and gradient, in float64, for every aggregation the overlap splits: sum and mean (the parts'
sums, mean divided by the whole in-degree), max and min (ties between parts share the gradient as
one process does: evenly over every edge that reaches the extreme), and the edge softmax (maximum and
denominator over all parts). The source rows hold repeated values so that ties across parts happen.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnc.graph import CSR, GraphView
from gnnc.ir import Eqn, Type, Value
from gnnc.plan.rows import LayerGraph
from gnnc.runtime.executor import ExecContext, Interpreter
from gnnc.runtime.parts import PartRun, Parts, PartStream, run_split

N_DST, N_HELD, N_HALO = 7, 5, 6


def layer_graph(seed: int) -> LayerGraph:
    rs = np.random.RandomState(seed)
    src = rs.randint(0, N_HELD + N_HALO, 60)
    dst = rs.randint(0, N_DST - 1, 60)  # the last destination has no in-edge
    csr = CSR.from_edges(src, dst, N_DST, N_HELD + N_HALO)
    eids = torch.arange(csr.nnz)
    view = GraphView(csr, csr.indices, csr.dst_index(), eids, {"w": torch.rand(csr.nnz, dtype=torch.float64)},
                     csr.in_degree().to(torch.float64))
    return LayerGraph(N_HELD, N_DST, {"plain": view})


def _eqn(op: str, ins: list[str], out_domain: str, **attrs) -> Eqn:
    typ = Type(out_domain, (3,), "f32")
    return Eqn(op, tuple(Value(n, typ if n != "w" else Type("edge", ())) for n in ins), (Value("out", typ),),
               tuple(sorted(attrs.items())))


CTX = ExecContext({}, torch.arange(N_DST), {}, False, lambda i: i, 1.0, use_kernels=False)


def whole_and_parts(e: Eqn, ins: list[torch.Tensor], lg: LayerGraph):
    interp = Interpreter.__new__(Interpreter)  # only its eqn(): no program needed
    view = lg.views["plain"]
    whole = interp.eqn(e, ins, view, CTX)
    run = PartRun(lg.parts("plain", (0, N_HELD, N_HELD + N_HALO)))
    x = ins[0]
    stream = PartStream(x[:N_HELD], iter([x[N_HELD:]]), 2)
    split = run_split(e, [stream, *ins[1:]], run, lambda eq, xs, v: interp.eqn(eq, xs, v, CTX))
    return whole, split


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_aggregations_split_by_source_part_equal_the_whole(seed: int, reduce: str) -> None:
    lg = layer_graph(seed)
    # few distinct values: ties between rows held here and rows of the halo
    x0 = torch.tensor(np.random.RandomState(seed).randint(-2, 3, (N_HELD + N_HALO, 3)), dtype=torch.float64)
    grad_out = torch.rand(N_DST, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    ins = [x0.clone().requires_grad_()]
    w = [lg.views["plain"].edge_data["w"]] if reduce in ("sum", "mean") else []
    e = _eqn("spmm", ["x"] + (["w"] if w else []), "vertex", reduce=reduce)
    whole, _ = whole_and_parts(e, ins + w, lg)
    (gw,) = torch.autograd.grad(whole, ins, grad_out)
    ins2 = [x0.clone().requires_grad_()]
    _, split = whole_and_parts(e, ins2 + w, lg)
    (gs,) = torch.autograd.grad(split, ins2, grad_out)
    torch.testing.assert_close(split, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gs, gw, rtol=1e-12, atol=1e-12)
    if reduce in ("max", "min"):  # the case is about ties across parts: make sure there are some
        held, halo = x0[:N_HELD], x0[N_HELD:]
        assert bool((held[:, None, :] == halo[None, :, :]).any())


@pytest.mark.parametrize("seed", range(3))
def test_edge_softmax_over_every_part_equals_the_whole(seed: int) -> None:
    lg = layer_graph(seed)
    view = lg.views["plain"]
    scores = torch.randn(view.csr.nnz, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    grad = torch.randn_like(scores)
    interp = Interpreter.__new__(Interpreter)
    e = Eqn("edge_softmax", (Value("e", Type("edge", (2,))),), (Value("alpha", Type("edge", (2,))),))
    s1 = scores.clone().requires_grad_()
    whole = interp.eqn(e, [s1], view, CTX)
    (g1,) = torch.autograd.grad(whole, [s1], grad)
    run = PartRun(lg.parts("plain", (0, N_HELD, N_HELD + N_HALO)))
    s2 = scores.clone().requires_grad_()
    parts = Parts(s2[p] for p in run.parts.pos)
    split = run_split(e, [parts], run, lambda eq, xs, v: interp.eqn(eq, xs, v, CTX))
    assembled = torch.empty_like(whole)
    for p, piece in zip(run.parts.pos, split):
        assembled[p] = piece.detach()
    torch.testing.assert_close(assembled, whole.detach(), rtol=1e-12, atol=1e-12)
    (g2,) = torch.autograd.grad(list(split), [s2], [grad[p] for p in run.parts.pos])
    torch.testing.assert_close(g2, g1, rtol=1e-12, atol=1e-12)
