"""The compiled CPU kernels (gnnc.runtime.kernels.native) against float64 references and their torch twins.

Dropout must draw the very bits the torch code draws (a distributed rank and one process share masks),
so it is compared for equality. The fused chains (gnnc.runtime.fusion) are compared with the unfused
equations computed in float64 by plain torch autograd on fresh random inputs: the output and the
gradient of every input, in float32 and float64, on the awkward graphs of test_kernels (destinations
without in-edges, duplicates, self-loops, bipartite blocks, a hub, no edges) and on inputs large enough
that the kernels run on several threads. Without the compiled library every caller must take the torch
path: forced here with `native.disabled()` and by a library that cannot be built.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from test_kernels import make_csr, seed_of

from gnnc.runtime import fusion, rng
from gnnc.runtime.kernels import native
from gnnc.runtime.kernels import reference as ref

compiled = pytest.mark.skipif(native.library() is None, reason=f"compiled kernels: {native.status()}")

DTYPES = (torch.float32, torch.float64)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-11, atol=1e-12)}  # as test_kernels


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(*parts))


# ----- dropout: the same bits as the torch code


@compiled
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,col_offset", [((37, 5), 0), ((37, 5), 3), ((300, 130), 1), ((12, 3, 4), 0)])
def test_dropout_equals_the_torch_draws_bit_for_bit(dtype: torch.dtype, shape: tuple, col_offset: int) -> None:
    gen = _gen("dropout", dtype, shape, col_offset)
    x = torch.randn(shape, generator=gen, dtype=dtype)
    rows = torch.randint(0, 1 << 40, (shape[0],), generator=gen)  # global ids past 32 bits: their low bits count
    key, p = rng.stream_key(7, 3), 0.37
    g = torch.randn(shape, generator=gen, dtype=dtype)
    results = []
    for compiled in (True, False):
        xi = x.clone().requires_grad_(True)
        if compiled:
            out = rng.dropout(xi, key, rows, p, col_offset)
        else:
            with native.disabled():
                out = rng.dropout(xi, key, rows, p, col_offset)
        out.backward(g)
        results.append((out.detach(), xi.grad))
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2) and torch.equal(g1, g2)
    kept = (o2 != 0).double().mean()
    assert abs(float(kept) - (1 - p)) < 0.1


@compiled
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_at_nonzeros_equals_the_torch_draws(dtype: torch.dtype) -> None:
    gen = _gen("dropout_at", dtype)
    nnz = 500
    rows, cols = torch.randint(0, 40, (nnz,), generator=gen), torch.randint(0, 97, (nnz,), generator=gen)
    ids = torch.randint(0, 1 << 35, (40,), generator=gen)
    values = torch.randn(nnz, generator=gen, dtype=dtype)
    key = rng.stream_key(3, 1)
    got = rng.dropout_at(values, key, rows, ids, cols, 0.5)
    with native.disabled():
        want = rng.dropout_at(values, key, rows, ids, cols, 0.5)
    assert torch.equal(got, want)


# ----- the epilogue: drop(act(x [+ y] [+ bias]))

ACTS = {"identity": (fusion.IDENTITY, 0.0, lambda t: t), "relu": (1, 0.0, F.relu),
        "elu": (2, 1.3, lambda t: F.elu(t, 1.3)), "leaky_relu": (3, 0.2, lambda t: F.leaky_relu(t, 0.2))}


def _ctx_dropout(n: int, p: float | None, seed: int):
    """(rows, key, threshold, scale) of a dropout over n rows, or no dropout."""
    if p is None:
        return None, 0, 0, 1.0
    rows = torch.randperm(10 * n, generator=torch.Generator().manual_seed(seed))[:n]
    return rows, rng.stream_key(seed, 5), rng.threshold(p), 1.0 / (1.0 - p)


@compiled
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("with_y,with_bias,p", [(False, True, 0.5), (True, True, None), (True, False, 0.3),
                                                 (False, True, None)])
@pytest.mark.parametrize("shape", [(29, 7), (300, 2, 64)])  # the second runs on several threads
def test_epilogue_equals_the_equations_in_float64(dtype, act, with_y, with_bias, p, shape) -> None:
    gen = _gen("epilogue", dtype, act, with_y, with_bias, p, shape)
    x = torch.randn(shape, generator=gen, dtype=dtype)
    y = torch.randn(shape, generator=gen, dtype=dtype) if with_y else None
    bias = torch.randn(shape[1:], generator=gen, dtype=dtype) if with_bias else None
    code, param, fn = ACTS[act]
    rows, key, thresh, scale = _ctx_dropout(shape[0], p, seed_of(shape, act))
    spec = (code, param, None if rows is None else native.int64(rows), key, 3, thresh, scale)

    inputs = [t for t in (x, y, bias) if t is not None]
    ours = [t.clone().requires_grad_(True) for t in inputs]
    theirs = [t.double().requires_grad_(True) for t in inputs]

    def split(ts):
        it = iter(ts)
        return next(it), (next(it) if with_y else None), (next(it) if with_bias else None)

    ox, oy, ob = split(ours)
    out = fusion._Epilogue.apply(ox, oy, ob, spec)
    tx, ty, tb = split(theirs)
    pre = tx if ty is None else tx + ty
    pre = pre if tb is None else pre + tb
    want = fn(pre)
    if rows is not None:
        with native.disabled():  # the torch draws, at the same rows, key and column offset
            want = rng.dropout(want, key, rows, p, 3)
    assert out.dtype == dtype and out.shape == want.shape
    torch.testing.assert_close(out.detach().double(), want.detach(), **TOL[dtype])
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, ours, g.to(dtype))
    expect = torch.autograd.grad(want, theirs, g)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a.double(), b, **TOL[dtype])


@compiled
def test_epilogue_bias_gradient_is_torchs_sum_to_the_bit() -> None:
    """The fused chain's bias gradient is summed as autograd sums `x + bias` (reference logits stay the same)."""
    gen = _gen("bias-bits")
    x, b = torch.randn(500, 96, generator=gen), torch.randn(96, generator=gen)
    rows, key, thresh, scale = _ctx_dropout(500, 0.5, 11)
    g = torch.randn(500, 96, generator=gen)
    xb, bb = x.clone().requires_grad_(True), b.clone().requires_grad_(True)
    fusion._Epilogue.apply(xb, None, bb, (1, 0.0, rows, key, 0, thresh, scale)).backward(g)
    xu, bu = x.clone().requires_grad_(True), b.clone().requires_grad_(True)
    with native.disabled():
        rng.dropout(F.relu(xu + bu), key, rows, 0.5).backward(g)
    assert torch.equal(bb.grad, bu.grad) and torch.equal(xb.grad, xu.grad)


# ----- attention: scores, edge softmax, dropout of the coefficients and the weighted sum, in one pass

def _attention_reference(csr, z, s, t, slope, drop):
    """The unfused equations in float64: sddmm(add), leaky_relu, edge_softmax, dropout, spmm(sum)."""
    e = F.leaky_relu(ref.sddmm(csr, s, t, "add"), slope)
    alpha = ref.edge_softmax(csr, e)
    if drop is not None:
        edge_ids, key, p = drop
        with native.disabled():
            alpha = rng.dropout(alpha, key, edge_ids, p)
    return ref.spmm(csr, z, alpha, "sum")


ATTENTION_GRAPHS = ("square", "bipartite_wide", "bipartite_tall", "hub", "empty")


@compiled
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ATTENTION_GRAPHS)
@pytest.mark.parametrize("heads,depth", [(1, 5), (3, 4)])
@pytest.mark.parametrize("p", [None, 0.4])
def test_attention_from_scores_equals_the_equations(dtype, kind, heads, depth, p) -> None:
    csr = make_csr(kind, seed=seed_of(kind, heads) % 1000)
    gen = _gen("attention", dtype, kind, heads, depth, p)
    z = torch.randn(csr.n_src, heads, depth, generator=gen, dtype=dtype)
    s = torch.randn(csr.n_src, heads, generator=gen, dtype=dtype)
    t = torch.randn(csr.n_dst, heads, generator=gen, dtype=dtype)
    _check_attention(csr, [z, s, t], dots=False, slope=0.2, p=p, dtype=dtype, gen=gen)


@compiled
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,n,edges,heads,depth", [("square", 0, 0, 2, 3), ("hub", 0, 0, 1, 6),
                                                       ("large", 400, 3000, 4, 8)])  # large: several threads
@pytest.mark.parametrize("p", [None, 0.6])
def test_attention_with_dot_scores_equals_the_equations(dtype, kind, n, edges, heads, depth, p) -> None:
    """GAT: s and t are dots of z's own rows with a_src and a_dst; z's gradient gathers all three uses."""
    if kind == "large":
        g = torch.Generator().manual_seed(5)
        src, dst = torch.randint(0, n, (edges,), generator=g), torch.randint(0, n - 10, (edges,), generator=g)
        from gnnc.graph import CSR

        csr = CSR.from_edges(src.numpy(), dst.numpy(), n, n)
    else:
        csr = make_csr(kind, seed=4)
    gen = _gen("attention-dots", dtype, kind, heads, depth, p)
    z = torch.randn(csr.n_src, heads, depth, generator=gen, dtype=dtype)
    a_src = torch.randn(heads, depth, generator=gen, dtype=dtype)
    a_dst = torch.randn(heads, depth, generator=gen, dtype=dtype)
    _check_attention(csr, [z, a_src, a_dst], dots=True, slope=0.2, p=p, dtype=dtype, gen=gen)


def _check_attention(csr, inputs, dots: bool, slope: float, p: float | None, dtype, gen) -> None:
    heads, depth = inputs[0].shape[1], inputs[0].shape[2]
    edge_ids = torch.randperm(3 * csr.nnz + 1, generator=gen)[:csr.nnz]
    key = rng.stream_key(9, 2)
    spec = (csr, csr.n_src, csr.n_dst, heads, depth, slope, None if p is None else edge_ids, key, 0,
            rng.threshold(p or 0.0), 1.0 / (1.0 - (p or 0.0)))
    ours = [t.clone().requires_grad_(True) for t in inputs]
    theirs = [t.double().requires_grad_(True) for t in inputs]
    if dots:
        out = fusion._Attention.apply(ours[0], None, None, ours[1], ours[2], spec)
        z, a_src, a_dst = theirs
        want = _attention_reference(csr, z, (z * a_src).sum(-1), (z[: csr.n_dst] * a_dst).sum(-1), slope,
                                    None if p is None else (edge_ids, key, p))
    else:
        out = fusion._Attention.apply(ours[0], ours[1], ours[2], None, None, spec)
        want = _attention_reference(csr, *theirs, slope, None if p is None else (edge_ids, key, p))
    assert out.dtype == dtype and out.shape == (csr.n_dst, heads, depth)
    torch.testing.assert_close(out.detach().double(), want.detach(), **TOL[dtype])
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, ours, g.to(dtype))
    expect = (torch.autograd.grad(want, theirs, g, allow_unused=True) if want.requires_grad
              else (None,) * len(theirs))
    for t, a, b in zip(theirs, got, expect):
        b = torch.zeros_like(t) if b is None else b
        torch.testing.assert_close(a.double(), b, **TOL[dtype])


# ----- the float exp the kernels call (exp_f32 in native.c: vectorisable, not libm's)


@compiled
def test_the_float_exp_is_within_two_ulp_of_the_exact_one_over_the_float_range() -> None:
    g = _gen("exp")
    x = torch.cat([torch.empty(200_000).uniform_(-110.0, 95.0, generator=g), torch.randn(100_000, generator=g),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.72, 88.73, -87.3, -103.9, -104.5, -200.0, 200.0,
                                 float("inf"), float("-inf"), float("nan")])])
    out = torch.empty_like(x)
    native.fn(native.library(), "exp", torch.float32)(native.ptr(x), native.ptr(out), x.numel())
    exact = torch.exp(x.double())
    finite = torch.isfinite(exact) & (exact < torch.finfo(torch.float32).max)
    normal = finite & (exact >= torch.finfo(torch.float32).tiny)
    # a float's spacing at the exact value: two of them at most
    ulp = torch.exp2(torch.floor(torch.log2(exact[normal])) - 23)
    assert ((out[normal].double() - exact[normal]).abs() <= 2 * ulp).all()
    # subnormal results: within the smallest spacing of a few; overflow and the specials as torch's exp
    sub = finite & ~normal
    assert ((out[sub].double() - exact[sub]).abs() <= 4 * 2.0**-149).all()
    assert torch.equal(out[~finite].isinf(), torch.exp(x[~finite]).isinf())
    assert out[x == float("inf")].item() == float("inf") and out[x == float("-inf")].item() == 0.0
    assert out[x.isnan()].isnan().all()


# ----- without the compiled library


@compiled
def test_every_kernel_takes_the_torch_path_when_turned_off() -> None:
    x = torch.randn(10, 4)
    with native.disabled():
        assert native.library() is None and native.usable(x) is None
        assert native.status().startswith("torch (compiled kernels turned off")
    assert native.status() == "compiled"


def test_a_library_that_cannot_be_built_leaves_the_torch_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No compiler, or one that fails: no exception, the torch implementations run, and status says why."""
    for state, why in ((dict(compiler=None), "no C compiler"), (dict(compiler="/bin/false"), "the build failed")):
        monkeypatch.setattr(native._State, "lib", None)
        monkeypatch.setattr(native._State, "tried", False)
        monkeypatch.setattr(native._State, "off", "")
        monkeypatch.setattr(native, "find_compiler", lambda c=state["compiler"]: c)
        monkeypatch.setattr(native, "cache_dir", lambda: tmp_path)
        assert native.library() is None
        assert why in native.status()
        x = torch.randn(6, 3, requires_grad=True)
        out = rng.dropout(x, 5, torch.arange(6), 0.5)  # the torch path, no error
        out.sum().backward()
        assert x.grad is not None
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".so")]  # nothing half-built is left


def test_the_build_is_cached_and_renamed_into_place(tmp_path) -> None:
    compiler = native.find_compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    first, why = native.build(compiler, tmp_path)
    assert first is not None, why
    mtime = first.stat().st_mtime_ns
    again, _ = native.build(compiler, tmp_path)
    assert again == first and first.stat().st_mtime_ns == mtime  # found, not rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", first.name]  # no temporary left


def test_workers_started_together_build_once_and_load_the_same_library(tmp_path) -> None:
    """Ranks building at once into one fresh directory: one compiles, the others wait and load its file."""
    import subprocess
    import sys

    if native.find_compiler() is None:
        pytest.skip("no C compiler")
    code = ("import ctypes, sys; from pathlib import Path; from gnnc.runtime.kernels import native; "
            "path, why = native.build(native.find_compiler(), Path(sys.argv[1])); ctypes.CDLL(str(path)); print(path)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1 and sorted(x.name for x in tmp_path.iterdir()) == [".lock", Path(paths.pop()).name]


def test_the_cache_directory_must_be_private(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    shared = tmp_path / "shared" / "gnnc" / "native"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "shared"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    chosen = native.cache_dir()
    assert chosen == tmp_path / "home" / ".cache" / "gnnc" / "native"  # the writable-by-all one is passed over
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700


@compiled
def test_an_in_place_epilogue_tells_autograd() -> None:
    """Written over an input that autograd keeps (here relu's result), the backward must refuse, not be wrong."""
    a = torch.randn(40, 6, requires_grad=True)
    x = F.relu(a)
    out = fusion._Epilogue.apply(x, None, torch.randn(6), (fusion.IDENTITY, 0.0, None, 0, 0, 0, 1.0), True)
    assert out.data_ptr() == x.data_ptr()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _producers(csr):
    """Each op a chain may overwrite the result of (fusion._OVERWRITABLE), as the executor computes it."""
    from gnnc.runtime import kernels

    w = torch.randn(6, 6)
    return {
        "spmm": lambda x: kernels.spmm(csr, x, None, "sum"),
        "linear": lambda x: x @ w,
        "add": lambda x: x + x,
        "sub": lambda x: x - 1.0,
        "mul": lambda x: x * x,
        "bias": lambda x: x + w[0],
        "dropout": lambda x: rng.dropout(x, 3, torch.arange(len(x)), 0.5),
        "concat": lambda x: x.reshape(len(x), 3, 2).reshape(len(x), 6),
        "mean_heads": lambda x: x.reshape(len(x), 2, 6).mean(1),
    }


@compiled
def test_overwritable_ops_do_not_keep_their_result() -> None:
    """Every op whose result a chain may overwrite has a backward that does not read that result."""
    csr = make_csr("square", seed=1)
    producers = _producers(csr)
    assert set(producers) == set(fusion._OVERWRITABLE)
    for name, op in producers.items():
        leaf = torch.randn(csr.n_src, 6 if name != "mean_heads" else 12, requires_grad=True)
        y = op(leaf * 1.0)  # as in a layer: computed from values, not from a leaf
        if y._is_view():
            # a view is never written over in training (autograd's CopySlices would clone its base's gradient);
            # only an evaluation, which keeps no backward, writes over it
            assert not fusion._overwritable(y), name
            with torch.no_grad():
                assert fusion._overwritable(op(leaf * 1.0)), name
            continue
        assert fusion._overwritable(y), name
        out = fusion._Epilogue.apply(y, None, torch.randn(6), (1, 0.0, None, 0, 0, 0, 1.0), True)
        out.sum().backward()  # raises if the op kept the result it was given
        assert leaf.grad is not None, name
    leaf = torch.randn(4, 6, requires_grad=True)
    assert not fusion._overwritable(leaf) and not fusion._overwritable(leaf.reshape(4, 3, 2))
