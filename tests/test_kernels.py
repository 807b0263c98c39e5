"""The graph kernels (spmm, sddmm, edge_softmax) against the float64 reference.

Every kernel runs on fresh random graphs that include the awkward cases
(destinations without in-edges, sources without out-edges, self-loops,
duplicate edges, bipartite blocks in both directions, a row longer than one
Triton block, no edges at all) and on multi-head shapes; outputs and input
gradients are compared with `gnnc.runtime.kernels.reference`, and
`torch.autograd.gradcheck` checks the backward passes in float64 on tiny
inputs. The Triton kernels run under Triton's CPU interpreter when triton is
installed, writing into NaN-filled output buffers so that an unwritten
element fails; tests marked `gpu` repeat the checks on CUDA.
"""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnc.runtime import kernels
from gnnc.graph import CSR
from gnnc.runtime.kernels import cpu
from gnnc.runtime.kernels import reference as ref

HAS_CUDA = torch.cuda.is_available()
GRAPHS = ("square", "bipartite_wide", "bipartite_tall", "hub", "empty")


def seed_of(*parts: object) -> int:
    """A seed that differs per test case and is the same on every run (str hashes are salted)."""
    return zlib.crc32(repr(parts).encode())


def make_csr(kind: str, seed: int = 0) -> CSR:
    """A random CSR of the named shape (see the module docstring for what each exercises)."""
    rs = np.random.RandomState(seed)
    if kind == "square":  # the last 4 vertices have no edges at all
        n_dst = n_src = 30
        src, dst = rs.randint(0, 26, 110), rs.randint(0, 26, 110)
        loops = rs.randint(0, 26, 6)
        src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
    elif kind == "bipartite_wide":  # more sources than destinations (a halo block)
        n_dst, n_src = 10, 35
        src, dst = rs.randint(0, 31, 70), rs.randint(0, 8, 70)
    elif kind == "bipartite_tall":
        n_dst, n_src = 35, 8
        src, dst = rs.randint(0, 7, 70), rs.randint(0, 30, 70)
    elif kind == "hub":  # one row longer than the Triton kernels' edge block (32)
        n_dst = n_src = 20
        src = np.concatenate([rs.randint(0, 20, 75), rs.randint(0, 20, 25)])
        dst = np.concatenate([np.zeros(75, dtype=np.int64), rs.randint(1, 18, 25)])
    elif kind == "empty":
        n_dst, n_src = 5, 7
        src = dst = np.zeros(0, dtype=np.int64)
    elif kind == "tiny":  # for gradcheck: 6 vertices, one isolated, a duplicate and a self-loop
        n_dst = n_src = 6
        src = np.array([0, 1, 1, 2, 3, 4, 4, 2, 0])
        dst = np.array([1, 0, 0, 2, 2, 2, 0, 4, 4])
    else:
        raise ValueError(kind)
    if len(src):  # duplicate a few edges
        pick = rs.randint(0, len(src), 5)
        src, dst = np.concatenate([src, src[pick]]), np.concatenate([dst, dst[pick]])
    return CSR.from_edges(src.astype(np.int64), dst.astype(np.int64), n_dst, n_src)


def make_weight(csr: CSR, kind: str, feat: tuple[int, ...], gen: torch.Generator,
                dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "scalar":
        return torch.rand(csr.nnz, generator=gen, dtype=dtype) + 0.1
    if kind == "col":
        return torch.rand(csr.nnz, 1, generator=gen, dtype=dtype) + 0.1
    if kind == "head":
        return torch.rand(csr.nnz, feat[0], generator=gen, dtype=dtype) + 0.1
    raise ValueError(kind)


def compare(fn, ref_fn, inputs: list[torch.Tensor], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """fn(*inputs) against ref_fn in float64: the output and the gradient of every input."""
    ours = [t.detach().clone().requires_grad_(True) for t in inputs]
    theirs = [t.detach().to(torch.float64).cpu().requires_grad_(True) for t in inputs]
    out = fn(*ours)
    expect = ref_fn(*theirs)
    assert out.shape == expect.shape
    assert out.dtype == inputs[0].dtype
    torch.testing.assert_close(out.detach().cpu().double(), expect.detach(), rtol=rtol, atol=atol)
    g = torch.randn(expect.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(99))
    got = torch.autograd.grad(out, ours, g.to(out.dtype).to(out.device), allow_unused=True)
    # (the reference of a graph without edges does not depend on its inputs at all)
    want = (torch.autograd.grad(expect, theirs, g, allow_unused=True) if expect.requires_grad
            else (None,) * len(theirs))
    for t, a, b in zip(theirs, got, want):
        b = torch.zeros_like(t) if b is None else b
        assert a is not None, "no gradient reached an input"
        assert a.shape == b.shape
        torch.testing.assert_close(a.detach().cpu().double(), b, rtol=rtol, atol=atol * 10)


# (feature shape, weight kind): flat features (MKL's narrow path and the
# spmm_reduce kernel from width 64), heads with per-head weights, per-head scalars.
SPMM_CASES = [((5,), "none"), ((5,), "scalar"), ((5,), "col"), ((80,), "none"), ((80,), "scalar"),
              ((3, 4), "none"), ((3, 4), "scalar"), ((3, 4), "head"), ((3,), "head"), ((2, 70), "head")]


# ---------------------------------------------------------------------------
# CPU: against the reference
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", GRAPHS)
@pytest.mark.parametrize("reduce", kernels.REDUCES)
@pytest.mark.parametrize("feat,wkind", SPMM_CASES)
def test_spmm_matches_reference(kind: str, reduce: str, feat: tuple[int, ...], wkind: str) -> None:
    csr = make_csr(kind, seed=len(feat) + 7 * kernels.REDUCES.index(reduce))
    gen = torch.Generator().manual_seed(seed_of(kind, reduce, feat, wkind))
    x = torch.randn((csr.n_src,) + feat, generator=gen)
    w = make_weight(csr, wkind, feat, gen)
    inputs = [x] if w is None else [x, w]
    compare(lambda x, w=None: kernels.spmm(csr, x, w, reduce), lambda x, w=None: ref.spmm(csr, x, w, reduce), inputs)


@pytest.mark.parametrize("kind", GRAPHS)
@pytest.mark.parametrize("feat,wkind", SPMM_CASES)
def test_spmm_add_matches_reference(kind: str, feat: tuple[int, ...], wkind: str) -> None:
    """acc + spmm, accumulated in place (a split or staged aggregation's running sum): value and the
    gradients of acc, x and the weights."""
    csr = make_csr(kind, seed=len(feat) + 3)
    gen = torch.Generator().manual_seed(seed_of("add", kind, feat, wkind))
    acc = torch.randn((csr.n_dst,) + feat, generator=gen)
    x = torch.randn((csr.n_src,) + feat, generator=gen)
    w = make_weight(csr, wkind, feat, gen)

    def ours(acc, x, w=None):
        return kernels.spmm_add_(acc * 1.0, csr, x, w)  # a fresh accumulator: the op writes into it

    def theirs(acc, x, w=None):
        return acc + ref.spmm(csr, x, w, "sum")

    compare(ours, theirs, [acc, x] if w is None else [acc, x, w])


@pytest.mark.parametrize("reduce", kernels.REDUCES)
@pytest.mark.parametrize("kind", ["square", "bipartite_wide"])
def test_generic_spmm_matches_reference(kind: str, reduce: str) -> None:
    """The gather/scatter fallback used for max/min off the CPU."""
    csr = make_csr(kind, seed=3)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(csr.n_src, 3, 4, generator=gen)
    w = make_weight(csr, "head", (3, 4), gen)
    compare(lambda x, w: cpu.generic_spmm(csr, x, w, reduce), lambda x, w: ref.spmm(csr, x, w, reduce), [x, w])


def test_spmm_rows_without_in_edges_are_zero() -> None:
    csr = make_csr("square")
    isolated = (csr.in_degree() == 0).nonzero().flatten()
    assert len(isolated) >= 4
    x = torch.randn(csr.n_src, 6) - 10.0  # max/min of nothing must not leak -inf, +inf or a stale value
    for reduce in kernels.REDUCES:
        out = kernels.spmm(csr, x, None, reduce)
        assert torch.equal(out[isolated], torch.zeros(len(isolated), 6)), reduce
        assert (out[csr.in_degree() > 0] != 0).all(), reduce


SDDMM_CASES = [("add", (5,), (5,)), ("mul", (5,), (5,)), ("add", (3,), (3,)), ("add", (3, 4), (3,)),
               ("mul", (3,), (3, 4)), ("dot", (6,), (6,)), ("dot", (3, 4), (3, 4)), ("dot", (1, 4), (1, 4))]


@pytest.mark.parametrize("kind", GRAPHS)
@pytest.mark.parametrize("op,fa,fb", SDDMM_CASES)
def test_sddmm_matches_reference(kind: str, op: str, fa: tuple, fb: tuple) -> None:
    csr = make_csr(kind, seed=11)
    gen = torch.Generator().manual_seed(seed_of(kind, op, fa, fb))
    a = torch.randn((csr.n_src,) + fa, generator=gen)
    b = torch.randn((csr.n_dst,) + fb, generator=gen)
    compare(lambda a, b: kernels.sddmm(csr, a, b, op), lambda a, b: ref.sddmm(csr, a, b, op), [a, b])


@pytest.mark.parametrize("kind", GRAPHS)
@pytest.mark.parametrize("heads", [None, 1, 3])
def test_edge_softmax_matches_reference(kind: str, heads: int | None) -> None:
    csr = make_csr(kind, seed=13)
    shape = (csr.nnz,) if heads is None else (csr.nnz, heads)
    e = torch.randn(shape, generator=torch.Generator().manual_seed(17)) * 3
    compare(lambda e: kernels.edge_softmax(csr, e), lambda e: ref.edge_softmax(csr, e), [e])


def test_edge_softmax_is_stable_and_normalised() -> None:
    csr = make_csr("hub", seed=2)
    e = torch.randn(csr.nnz, 2, generator=torch.Generator().manual_seed(0)) * 1e4  # exp() would overflow
    s = kernels.edge_softmax(csr, e)
    assert torch.isfinite(s).all()
    sums = torch.zeros(csr.n_dst, 2).index_add_(0, csr.dst_index(), s)
    has_edges = csr.in_degree() > 0
    torch.testing.assert_close(sums[has_edges], torch.ones(int(has_edges.sum()), 2))
    torch.testing.assert_close(s.double(), ref.edge_softmax(csr, e), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# gradcheck in float64
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("reduce", kernels.REDUCES)
@pytest.mark.parametrize("feat,wkind", [((3,), "none"), ((3,), "scalar"), ((2, 3), "head"), ((64,), "scalar")])
def test_spmm_gradcheck(reduce: str, feat: tuple, wkind: str) -> None:
    csr = make_csr("tiny")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((csr.n_src,) + feat, generator=gen, dtype=torch.float64, requires_grad=True)
    w = make_weight(csr, wkind, feat, gen, torch.float64)
    inputs = (x,) if w is None else (x, w.requires_grad_(True))
    # width 64 takes the spmm_reduce kernel; its full Jacobian is large, so check random projections of it
    assert torch.autograd.gradcheck(lambda *t: kernels.spmm(csr, t[0], t[1] if len(t) > 1 else None, reduce),
                                    inputs, fast_mode=feat == (64,))


@pytest.mark.parametrize("op,fa,fb", [("add", (3,), (3,)), ("mul", (2, 3), (2,)), ("dot", (2, 3), (2, 3))])
def test_sddmm_gradcheck(op: str, fa: tuple, fb: tuple) -> None:
    csr = make_csr("tiny")
    gen = torch.Generator().manual_seed(2)
    a = torch.randn((csr.n_src,) + fa, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn((csr.n_dst,) + fb, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: kernels.sddmm(csr, a, b, op), (a, b))


def test_edge_softmax_gradcheck() -> None:
    csr = make_csr("tiny")
    e = torch.randn(csr.nnz, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    assert torch.autograd.gradcheck(lambda e: kernels.edge_softmax(csr, e), (e,))


# ---------------------------------------------------------------------------
# Structure built once; work skipped; no per-edge feature rows
# ---------------------------------------------------------------------------

def test_structure_is_built_once_per_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple] = []
    original = cpu.Pattern.__init__

    def counting_init(self, crow, col, perm, shape, heads):
        built.append((shape, heads))
        original(self, crow, col, perm, shape, heads)

    monkeypatch.setattr(cpu.Pattern, "__init__", counting_init)
    csr = make_csr("square")
    x = torch.randn(csr.n_src, 2, 4, requires_grad=True)
    w = torch.rand(csr.nnz, 2, requires_grad=True)
    for _ in range(3):
        kernels.spmm(csr, x, w).sum().backward()
        kernels.spmm(csr, x, None, "mean").sum().backward()
    # the structure and its transpose, once for each head count used (2 for the weights, 1 for mean)
    assert sorted(built) == [((30, 30), 1), ((30, 30), 1), ((60, 60), 2), ((60, 60), 2)]
    assert cpu.pattern(csr, True, 1, x.device) is cpu.pattern(csr, True, 1, x.device)


def test_backward_skips_gradients_nobody_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    csr = make_csr("square")
    x = torch.randn(csr.n_src, 5)
    w = torch.rand(csr.nnz)
    real_sum, real_dot = cpu.spmm_sum, cpu.sampled_dot

    def no_transposed(*args, transposed=False, **kw):
        assert not transposed, "computed d/dx although x needs no gradient"
        return real_sum(*args, transposed=transposed, **kw)

    def no_dot(*args, **kw):
        raise AssertionError("computed d/dweight although the weight needs no gradient")

    monkeypatch.setattr(cpu, "spmm_sum", no_transposed)
    kernels.spmm(csr, x, w.clone().requires_grad_(True)).sum().backward()
    monkeypatch.setattr(cpu, "spmm_sum", real_sum)
    monkeypatch.setattr(cpu, "sampled_dot", no_dot)
    kernels.spmm(csr, x.clone().requires_grad_(True), w).sum().backward()
    monkeypatch.setattr(cpu, "sampled_dot", real_dot)


def _largest_allocation(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((ev.cpu_memory_usage for ev in prof.events()), default=0)


@pytest.mark.parametrize("heads", [None, 4])
def test_spmm_does_not_build_a_row_per_edge(heads: int | None) -> None:
    """Forward and backward (x and weight) allocate nothing near nnz x F; the gather path would."""
    rs = np.random.RandomState(0)
    n, m, f = 2000, 60000, 64
    csr = CSR.from_edges(rs.randint(0, n, m), rs.randint(0, n, m), n)
    feat = (f,) if heads is None else (heads, f // heads)
    x = torch.randn((n,) + feat, requires_grad=True)
    w = torch.rand((m,) if heads is None else (m, heads), requires_grad=True)
    per_edge_rows = m * f * 4
    kernels.spmm(csr, x, w).sum().backward()  # build the cached structure first
    ours = _largest_allocation(lambda: kernels.spmm(csr, x, w).sum().backward())
    gather = _largest_allocation(lambda: cpu.generic_spmm(csr, x, w, "sum").sum().backward())
    assert gather >= per_edge_rows  # the probe sees a [nnz, F] allocation when there is one
    assert ours < per_edge_rows / 4


# ---------------------------------------------------------------------------
# Argument checking
# ---------------------------------------------------------------------------

def test_bad_arguments_are_named() -> None:
    csr = make_csr("square")
    x = torch.randn(csr.n_src, 2, 3)
    with pytest.raises(ValueError, match="unknown reduce"):
        kernels.spmm(csr, x, reduce="prod")
    with pytest.raises(ValueError, match="source rows"):
        kernels.spmm(csr, x[:-1])
    with pytest.raises(ValueError, match="edges"):
        kernels.spmm(csr, x, torch.rand(csr.nnz - 1))
    with pytest.raises(ValueError, match="leading dims"):
        kernels.spmm(csr, x, torch.rand(csr.nnz, 3))
    with pytest.raises(TypeError, match="differ"):
        kernels.spmm(csr, x, torch.rand(csr.nnz, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating"):
        kernels.spmm(csr, torch.ones(csr.n_src, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown sddmm op"):
        kernels.sddmm(csr, x, x, "sub")
    with pytest.raises(ValueError, match="equal feature shapes"):
        kernels.sddmm(csr, x, x[:, :1], "dot")
    with pytest.raises(ValueError, match="edges"):
        kernels.edge_softmax(csr, torch.randn(csr.nnz + 1))


# ---------------------------------------------------------------------------
# Triton kernels under the CPU interpreter (and on CUDA when present)
# ---------------------------------------------------------------------------

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def test_triton_kernels_under_interpreter() -> None:
    """Runs the test_interp_* tests below in a child process with TRITON_INTERPRET=1.

    Triton reads the variable when it is first imported (its own library
    functions are decorated then), and in this process torch_geometric or
    another test may already have imported it for real.
    """
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if IN_INTERPRETER:
        pytest.skip("already the child process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                            "-k", "test_interp_", "-rs"],
                           env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True)
    report = child.stdout[-4000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert "skipped" not in child.stdout.splitlines()[-1], report
    assert " passed" in child.stdout.splitlines()[-1], report


@pytest.fixture(scope="module")
def interpreted():
    """The Triton backend, interpreted on CPU tensors (only in the child process above)."""
    if not IN_INTERPRETER:
        pytest.skip("runs in the TRITON_INTERPRET=1 child of test_triton_kernels_under_interpreter")
    from gnnc.runtime.kernels import triton_kernels

    return triton_kernels


def _poisoned(shape: tuple, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@pytest.mark.parametrize("kind", ["square", "bipartite_wide", "hub", "empty"])
@pytest.mark.parametrize("wkind", ["none", "scalar", "head"])
@pytest.mark.parametrize("mean", [False, True])
def test_interp_spmm_writes_every_row(interpreted, kind: str, wkind: str, mean: bool) -> None:
    csr = make_csr(kind, seed=21)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(csr.n_src, 3, 5, generator=gen, dtype=torch.float64)
    w = make_weight(csr, wkind, (3, 5), gen, torch.float64)
    w2 = None if w is None else w.reshape(csr.nnz, math.prod(w.shape[1:]))
    out = _poisoned((csr.n_dst, 15), torch.float64)
    interpreted.launch_spmm(csr.indptr, csr.indices, x.reshape(csr.n_src, 15), w2, mean, out=out)
    expect = ref.spmm(csr, x, w, "mean" if mean else "sum").reshape(csr.n_dst, 15)
    torch.testing.assert_close(out, expect)


@pytest.mark.parametrize("kind", ["square", "bipartite_tall", "hub"])
def test_interp_sddmm_and_softmax_write_every_entry(interpreted, kind: str) -> None:
    csr = make_csr(kind, seed=23)
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(csr.n_src, 3, 5, generator=gen, dtype=torch.float64)
    b = torch.randn(csr.n_dst, 3, 5, generator=gen, dtype=torch.float64)
    src, dst = csr.indices, csr.dst_index()
    for op in ("add", "mul"):
        out = _poisoned((csr.nnz, 15), torch.float64)
        interpreted.launch_sddmm(src, dst, a.reshape(-1, 15), b.reshape(-1, 15), op, out=out)
        torch.testing.assert_close(out, ref.sddmm(csr, a, b, op).reshape(csr.nnz, 15))
    out = _poisoned((csr.nnz, 3), torch.float64)
    interpreted.launch_sddmm_dot(src, dst, a, b, out=out)
    torch.testing.assert_close(out, ref.sddmm(csr, a, b, "dot"))
    e = torch.randn(csr.nnz, 3, generator=gen, dtype=torch.float64) * 50
    s = _poisoned((csr.nnz, 3), torch.float64)
    interpreted.launch_softmax(csr.indptr, e, out=s)
    torch.testing.assert_close(s, ref.edge_softmax(csr, e))
    g = torch.randn(csr.nnz, 3, generator=gen, dtype=torch.float64)
    ge = _poisoned((csr.nnz, 3), torch.float64)
    interpreted.launch_softmax_backward(csr.indptr, s, g, out=ge)
    e_ref = e.clone().requires_grad_(True)
    (expect,) = torch.autograd.grad(ref.edge_softmax(csr, e_ref), e_ref, g)
    torch.testing.assert_close(ge, expect)


@pytest.mark.parametrize("kind", ["square", "bipartite_wide", "hub"])
@pytest.mark.parametrize("reduce,wkind", [("sum", "none"), ("sum", "head"), ("mean", "scalar")])
def test_interp_spmm_autograd(interpreted, kind: str, reduce: str, wkind: str) -> None:
    csr = make_csr(kind, seed=25)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(csr.n_src, 2, 3, generator=gen)
    w = make_weight(csr, wkind, (2, 3), gen)
    inputs = [x] if w is None else [x, w]
    compare(lambda x, w=None: interpreted.spmm(csr, x, w, reduce), lambda x, w=None: ref.spmm(csr, x, w, reduce),
            inputs)


@pytest.mark.parametrize("op,feat", [("add", (2, 3)), ("mul", (4,)), ("dot", (2, 3)), ("dot", (4,))])
def test_interp_sddmm_autograd(interpreted, op: str, feat: tuple) -> None:
    csr = make_csr("bipartite_wide", seed=27)
    gen = torch.Generator().manual_seed(10)
    a = torch.randn((csr.n_src,) + feat, generator=gen)
    b = torch.randn((csr.n_dst,) + feat, generator=gen)
    compare(lambda a, b: interpreted.sddmm(csr, a, b, op), lambda a, b: ref.sddmm(csr, a, b, op), [a, b])


def test_interp_edge_softmax_autograd(interpreted) -> None:
    csr = make_csr("hub", seed=29)
    e = torch.randn(csr.nnz, 2, generator=torch.Generator().manual_seed(12)) * 4
    compare(lambda e: interpreted.edge_softmax(csr, e), lambda e: ref.edge_softmax(csr, e), [e])


def test_interp_gradcheck(interpreted) -> None:
    csr = make_csr("tiny")
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(csr.n_src, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.rand(csr.nnz, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: interpreted.spmm(csr, x, w, "mean"), (x, w))
    b = torch.randn(csr.n_dst, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: interpreted.sddmm(csr, a, b, "dot"), (x, b))
    assert torch.autograd.gradcheck(lambda e: interpreted.edge_softmax(csr, e), (w,))


gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]


@pytest.mark.parametrize("kind", ["square", "bipartite_wide", "hub", "empty"])
@pytest.mark.parametrize("reduce", kernels.REDUCES)
@pytest.mark.parametrize("feat,wkind", [((5,), "scalar"), ((80,), "none"), ((3, 4), "head")])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_spmm_on_device(device: str, kind: str, reduce: str, feat: tuple, wkind: str) -> None:
    csr = make_csr(kind, seed=31)
    gen = torch.Generator().manual_seed(16)
    x = torch.randn((csr.n_src,) + feat, generator=gen).to(device)
    w = make_weight(csr, wkind, feat, gen)
    inputs = [x] if w is None else [x, w.to(device)]
    compare(lambda x, w=None: kernels.spmm(csr, x, w, reduce), lambda x, w=None: ref.spmm(csr, x, w, reduce), inputs)


@pytest.mark.parametrize("kind", ["square", "bipartite_tall", "hub"])
@pytest.mark.parametrize("op,fa,fb", SDDMM_CASES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_sddmm_and_softmax_on_device(device: str, kind: str, op: str, fa: tuple, fb: tuple) -> None:
    csr = make_csr(kind, seed=33)
    gen = torch.Generator().manual_seed(18)
    a = torch.randn((csr.n_src,) + fa, generator=gen).to(device)
    b = torch.randn((csr.n_dst,) + fb, generator=gen).to(device)
    compare(lambda a, b: kernels.sddmm(csr, a, b, op), lambda a, b: ref.sddmm(csr, a, b, op), [a, b])
    e = torch.randn(csr.nnz, 3, generator=gen).to(device) * 10
    compare(lambda e: kernels.edge_softmax(csr, e), lambda e: ref.edge_softmax(csr, e), [e])


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_cuda_launchers_write_every_row(device: str) -> None:
    pytest.importorskip("triton")
    from gnnc.runtime.kernels import triton_kernels as tk

    csr = make_csr("hub", seed=35)
    gen = torch.Generator().manual_seed(20)
    x = torch.randn(csr.n_src, 3, 5, generator=gen)
    w = torch.rand(csr.nnz, 3, generator=gen)
    out = _poisoned((csr.n_dst, 15), torch.float32, device)
    tk.launch_spmm(csr.indptr.to(device), csr.indices.to(device), x.reshape(-1, 15).to(device), w.to(device),
                   out=out)
    torch.testing.assert_close(out.cpu().double(), ref.spmm(csr, x, w).reshape(csr.n_dst, 15), rtol=1e-4, atol=1e-5)
    e = torch.randn(csr.nnz, 3, generator=gen)
    s = _poisoned((csr.nnz, 3), torch.float32, device)
    tk.launch_softmax(csr.indptr.to(device), e.to(device), out=s)
    torch.testing.assert_close(s.cpu().double(), ref.edge_softmax(csr, e), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n,width,col_offset,p", [(37, 1, 0, 0.5), (50, 19, 3, 0.3), (1, 130, 0, 0.9), (0, 8, 1, 0.5),
                                                  (200, 64, 5, 0.1)])
def test_interp_dropout_draws_rngs_mask(interpreted, n: int, width: int, col_offset: int, p: float) -> None:
    """The fused dropout applies exactly rng's counter-based mask (x * rng.dropout_mask, the CPU's compiled dropout
    too), forward and backward, on random row ids and column offsets: the same bits, not a close mask."""
    from gnnc.runtime import rng

    gen = torch.Generator().manual_seed(n + width)
    x = torch.randn(n, width, generator=gen)
    rows = torch.randperm(10 * n + 1, generator=gen)[:n]
    key = rng.stream_key(3, n, width)
    mask = rng.dropout_mask(key, rows, (width,), p, col_offset)
    out = _poisoned((n, width), torch.float32)
    interpreted.launch_dropout(x, rows, key, rng.threshold(p), 1.0 / (1.0 - p), col_offset, out=out)
    assert torch.equal(out, x * mask)
    assert torch.equal(out, rng.dropout(x, key, rows, p, col_offset))  # the CPU's compiled kernel
    xg = x.clone().requires_grad_(True)
    y = interpreted.dropout(xg, rows, key, rng.threshold(p), 1.0 / (1.0 - p), col_offset)
    g = torch.randn(n, width, generator=gen)
    y.backward(g)
    assert torch.equal(y.detach(), out) and torch.equal(xg.grad, g * mask)
