"""Aggregation reducers as descriptors (gnnc.ir.reducers) and `std`, added through one.

`std` is one `define_reducer` (compiler/ir/reducers.py) plus one `@finalises`
(runtime/kernels/reducers.py). Checked here: its forward and backward against
a float64 per-row loop and PyG's StdAggregation on random inputs (and
gradcheck), through the reference interpreter's path (per-edge messages) and
the kernels' (CSR sums); from the language (`gather a = std(m)`) in one process
against PyG; on 2 gloo processes under strategies whose split exchanges
aggregate each row's edges part by part (overlapped halo, staged broadcast,
bins) against one process; and its cost. A reducer defined from outside gnnc
runs from the language too.
"""
from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch

from _rank_pool import pooled_launch
from conftest import random_graph
from gnnc import api
from gnnc.testing import first_training_step
from gnnc.errors import GnncError
from gnnc.graph import CSR
from gnnc.ir.reducers import REDUCERS, ReducerCost, ReducerDef, define_reducer, reducer
from gnnc.passes.analysis.legality import pushpull_blocker
from gnnc.passes.cost.compute import aggregation_time, layer_memory
from gnnc.passes.cost.ops import program_op_work
from gnnc.passes.cost.symbols import LayerShape, layer_shape
from gnnc.runtime import kernels
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.executor import init_params
from gnnc.runtime.kernels import reducers
from gnnc.runtime.train import TrainConfig

SEED = 3
STD_LAYER = """
layer StdConv(in, out) {
  scatter   m = src.h
  gather    a = std(m)
  transform t = linear(a, out) + linear(h, out, bias = false)
  apply     h = t
}
"""
STD_MODEL = STD_LAYER + """
model M(features, classes) {
  h = relu(StdConv(features, 8)(x))
  h = StdConv(8, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""


def csr_of(seed: int, n_dst: int = 12, n_src: int = 15, nnz: int = 40) -> CSR:
    """Random edges, duplicates included; the last two destinations have no in-edge and two have exactly one."""
    rs = np.random.RandomState(seed)
    src, dst = rs.randint(0, n_src, nnz), rs.randint(0, n_dst - 4, nnz)
    src = np.concatenate([src, rs.randint(0, n_src, 2), src[:3]])
    dst = np.concatenate([dst, [n_dst - 4, n_dst - 3], dst[:3]])
    return CSR.from_edges(src.astype(np.int64), dst.astype(np.int64), n_dst, n_src)


def oracle(csr: CSR, m: torch.Tensor) -> torch.Tensor:
    """Float64 std per destination, one row at a time from its messages (torch.var, biased): PyG's masking of
    variances at or below 1e-5 to 0, rows without in-edges 0."""
    rows = []
    for d in range(csr.n_dst):
        lo, hi = int(csr.indptr[d]), int(csr.indptr[d + 1])
        if lo == hi:
            rows.append(m.new_zeros(m.shape[1:]))
            continue
        var = m[lo:hi].var(0, unbiased=False)
        rows.append(torch.where(var > 1e-5, var.clamp(min=1e-5).sqrt(), torch.zeros_like(var)))
    return torch.stack(rows)


def messages(csr: CSR, x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    m = x[csr.indices]
    return m if w is None else m * w.reshape(w.shape + (1,) * (m.dim() - w.dim()))


def pyg_std(csr: CSR, m: torch.Tensor) -> torch.Tensor:
    tg = pytest.importorskip("torch_geometric")
    return tg.nn.aggr.StdAggregation()(m, csr.dst_index(), dim_size=csr.n_dst, dim=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("feat,weighted", [((5,), False), ((5,), True), ((3, 4), False)])
def test_std_matches_a_float64_reference_and_pyg(seed: int, feat: tuple[int, ...], weighted: bool) -> None:
    csr = csr_of(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    x = torch.randn((csr.n_src,) + feat, generator=gen, dtype=torch.float64) * 2 + 0.5
    w = torch.rand(csr.nnz, generator=gen, dtype=torch.float64) + 0.5 if weighted else None
    m = messages(csr, x, w)
    want = oracle(csr, m)
    deg = csr.in_degree().to(torch.float64)
    ref_path = reducers.aggregate("std", m, csr.dst_index(), csr.n_dst, deg)
    kernel_path = kernels.spmm(csr, x, w, "std")
    torch.testing.assert_close(ref_path, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kernel_path, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(want[-2:], torch.zeros_like(want[-2:]))  # rows without in-edges
    assert (want[:-4] > 0).all()  # the rows with several in-edges have a spread: the test compares real values
    # the backward, against PyG's on the same messages
    inputs = [x.clone().requires_grad_()] + ([w.clone().requires_grad_()] if weighted else [])
    pyg_inputs = [t.clone().detach().requires_grad_() for t in inputs]
    g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    out = kernels.spmm(csr, inputs[0], inputs[1] if weighted else None, "std")
    theirs = pyg_std(csr, messages(csr, pyg_inputs[0], pyg_inputs[1] if weighted else None))
    torch.testing.assert_close(out, theirs, rtol=1e-10, atol=1e-12)
    ours_grad = torch.autograd.grad(out, inputs, g)
    their_grad = torch.autograd.grad(theirs, pyg_inputs, g)
    for a, b in zip(ours_grad, their_grad):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_std_gradcheck(weighted: bool) -> None:
    csr = csr_of(7, n_dst=8, n_src=9, nnz=24)
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(csr.n_src, 3, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    inputs = (x,) + ((torch.rand(csr.nnz, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(),) * weighted
    dst, deg = csr.dst_index(), csr.in_degree().to(torch.float64)
    assert torch.autograd.gradcheck(lambda *t: kernels.spmm(csr, t[0], t[1] if weighted else None, "std"), inputs)
    assert torch.autograd.gradcheck(
        lambda *t: reducers.aggregate("std", messages(csr, t[0], t[1] if weighted else None), dst, csr.n_dst, deg),
        inputs)


def one_process(program, graph, use_kernels: bool = False):
    logits, _, grads = first_training_step(program, graph, SEED, use_kernels)
    return logits, grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def test_std_from_the_language_matches_pyg() -> None:
    """`gather a = std(m)` lowers to spmm[reduce=std]; one process equals the same model written with PyG's
    StdAggregation, logits and every gradient, with the kernels and with the reference implementations."""
    tg = pytest.importorskip("torch_geometric")
    graph = random_graph(n=50, e=220, f=10, c=4, seed=5)
    program = api.compile(api.load_model_source(STD_MODEL, "std.gnn"), graph).program
    assert "spmm[reduce=std](%h)" in str(program).replace("hoisted=true, ", "")
    params = init_params(program, SEED)
    named = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    x, src, dst = graph.x, torch.as_tensor(graph.src), torch.as_tensor(graph.dst)
    aggr = tg.nn.aggr.StdAggregation()

    def conv(h: torch.Tensor, k: int) -> torch.Tensor:
        a = aggr(h[src], dst, dim_size=graph.num_nodes)
        return a @ named[f"l{k}.linear0.weight"] + named[f"l{k}.linear0.bias"] + h @ named[f"l{k}.linear1.weight"]

    out = conv(conv(x, 0).relu(), 1)
    m = graph.train_mask
    torch.nn.functional.cross_entropy(out[m], graph.y[m], reduction="sum").div(float(m.sum())).backward()
    for use_kernels in (False, True):
        logits, grads = one_process(program, graph, use_kernels)
        assert rel(logits, out.detach()) < 1e-5, use_kernels
        for k, p in named.items():
            assert rel(grads[k], p.grad) < 1e-5, (use_kernels, k)


@pytest.mark.parametrize("old,new,message", [
    ("gather    a = std(m)\n", "gather    a = sum(m)\n  sync      s = std(a)\n",
     r"std.gnn:5:3: a sync statement must be sum\(\.\.\.\), mean\(\.\.\.\) or max\(\.\.\.\) of one value"),
    ("apply     h = t", "apply     h = std(t)", r"6:17: reducer 'std' can only be used in a gather statement\n"),
    ("std(m)", "stdev(m)", r"expected one of sum, mean, max, min, softmax, std\b.*did you mean .std.\?")],
    ids=["in-sync", "in-apply", "misspelt"])
def test_std_in_the_language_is_a_gather_reducer_only(old: str, new: str, message: str) -> None:
    graph = random_graph(n=30, e=100, f=6, c=3, seed=1)
    with pytest.raises(GnncError, match=message):
        api.compile(api.load_model_source(STD_MODEL.replace(old, new), "std.gnn"), graph)


def test_a_plan_naming_an_unknown_reducer_is_refused() -> None:
    """Plans are data: an aggregation whose reduce names no reducer is a type error naming it, not a KeyError."""
    from gnnc.ir.text import parse_ir
    from gnnc.ir.verify import VerifyError, verify

    graph = random_graph(n=30, e=100, f=6, c=3, seed=1)
    text = str(api.compile(api.load_model_source(STD_MODEL, "std.gnn"), graph).program)
    with pytest.raises(VerifyError, match="'spmm' has reduce='median'; expected one of sum, mean, max, min, std"):
        verify(parse_ir(text.replace("reduce=std", "reduce=median")), typed=True)


def test_std_is_not_linear_so_pushpull_refuses_it() -> None:
    graph = random_graph(n=30, e=100, f=6, c=3, seed=1)
    source = STD_LAYER.replace("apply     h = t", "sync      s = sum(t)\n  apply     h = s") + """
model M(features, classes) {
  h = StdConv(features, classes)(x)
  loss = cross_entropy(h, y, mask = train)
}
"""
    program = api.compile(api.load_model_source(source, "std.gnn"), graph).program
    eqn, why = pushpull_blocker(program.graph_layers()[0])
    assert eqn.op == "spmm" and eqn.attr("reduce") == "std" and "not linear" in why


# strategy, schedule pass (None: the default one, which overlaps the halo and stages the broadcast), kernels
DISTRIBUTED = [("depcomm", None, False), ("bcast1d", None, False), ("depcomm", "schedule{bins=3}", False),
               ("depcomm", "schedule{overlap=off staged=off}", False), ("bcast1d", None, True)]


def predicted_bytes(plan) -> dict[str, int]:
    """The bytes per step a plan predicts (its meta: a dict until the typed PlanMeta of issue 39 lands)."""
    meta = plan.meta
    return meta["predicted_bytes_per_step"] if isinstance(meta, dict) else meta.predicted_bytes_per_step


def test_std_on_two_processes_equals_one_process(tmp_path) -> None:
    """Split exchanges aggregate a row's in-edges part by part (the held rows, then the halo's; rank j's block
    at stage j of the broadcast; bins): std's sums of m and m*m add over the parts and finalise once, so 2 gloo
    processes give one process's logits and gradients (1e-5) and send the bytes the plan predicted."""
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
    from gnnc.plan.schedule_attrs import exchange_schedule

    graph = random_graph(n=60, e=260, f=10, c=4, seed=7)
    model = api.load_model_source(STD_MODEL, "std.gnn")
    single = api.compile(model, graph).program
    todo, splits = [], 0
    for strategy, schedule, use_kernels in DISTRIBUTED:
        passes = None if schedule is None else DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [schedule]
        plan = api.compile(model, graph, workers=2, strategy=strategy, partition="metis", passes=passes)
        splits += any(exchange_schedule(e).split for layer in plan.program.layers for e in layer.eqns
                      if e.op in ("halo", "bcast_rows"))
        shards = plan.write_shards(tmp_path / f"{strategy}-{len(todo)}")
        job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=use_kernels))
        todo.append(((strategy, schedule, use_kernels), job, predicted_bytes(plan)))
    assert splits >= 3  # the overlapped halo, the staged broadcast (twice): std's partial sums are exercised
    results = pooled_launch(one_step_each, 2, [job for _, job, _ in todo])[0]
    logits, grads = one_process(single, graph)
    ops = {"halo": "halo", "bcast_rows": "broadcast", "reduce_scatter": "reduce_scatter", "allreduce": "allreduce"}
    failures = []
    for (key, _, predicted), got in zip(todo, results):
        if rel(got["logits"], logits) > 1e-5:
            failures.append(f"{key}: logits differ by {rel(got['logits'], logits):.2e}")
        failures += [f"{key}: gradient of {k} differs by {rel(got['grads'][k], g):.2e}"
                     for k, g in grads.items() if rel(got["grads"][k], g) > 1e-5]
        measured = {k: got["bytes_by_op"].get(op, 0) for k, op in ops.items()}
        if measured != predicted:
            failures.append(f"{key}: measured bytes {measured} != predicted {predicted}")
    assert not failures, "\n".join(failures)


def test_std_is_priced_as_its_own_work() -> None:
    """The cost model reads the reducer's ReducerCost: std's two sums per edge, its finalise per output row and
    its sums kept for the backward; a sum's expressions are the ones they were."""
    graph = random_graph(n=30, e=100, f=6, c=3, seed=1)
    programs = {r: api.compile(api.load_model_source(STD_MODEL.replace("std(m)", f"{r}(m)"), "m.gnn"), graph).program
                for r in ("sum", "max", "std")}
    shapes = {r: layer_shape(p.graph_layers()[1], set()) for r, p in programs.items()}
    assert shapes["sum"].aggregation == ReducerCost() and shapes["std"].aggregation == reducer("std").cost
    plain = LayerShape()
    nnz, rows, width = sympy.symbols("nnz rows width", positive=True)
    assert aggregation_time(1, shapes["sum"], nnz, width) == aggregation_time(1, plain, nnz, width)
    assert float(sympy.simplify(aggregation_time(1, shapes["std"], nnz, width) / aggregation_time(1, plain, nnz, width))) == 2
    extra = layer_memory(1, shapes["std"], rows, 0, rows, nnz) - layer_memory(1, plain, rows, 0, rows, nnz)
    assert sympy.simplify(extra) != 0
    work = {r: program_op_work(p) for r, p in programs.items()}
    out_elementwise = {r: sum(n for side, cls, n in w[1].forward if (side, cls) == ("out", "elementwise"))
                       for r, w in work.items()}
    # std's finalise on each of layer 1's 8-wide aggregated rows: 6 elementwise operations per element (max, not
    # linear either, leaves the layer as it is written, as std does, and has no finalise)
    assert out_elementwise["std"] - out_elementwise["max"] == 6 * 8


@pytest.fixture
def sumsq():
    """A reducer defined from outside gnnc (as a --plugin module would): the sum of squared messages."""
    define_reducer(ReducerDef("sumsq", powers=(2,)))

    @reducers.finalises("sumsq")
    def _sumsq(sums: tuple[torch.Tensor, ...], deg: torch.Tensor) -> torch.Tensor:
        return sums[0]

    yield
    del REDUCERS["sumsq"], reducers.FINALISE["sumsq"]


def test_a_reducer_is_its_definition_and_its_finalise(sumsq) -> None:
    graph = random_graph(n=30, e=100, f=6, c=3, seed=1)
    program = api.compile(api.load_model_source(STD_MODEL.replace("std(m)", "sumsq(m)"), "sumsq.gnn"), graph).program
    assert "reduce=sumsq" in str(program)
    csr = graph.csr("plain")
    x = torch.randn(csr.n_src, 4, dtype=torch.float64)
    want = torch.zeros(csr.n_dst, 4, dtype=torch.float64).index_add(0, csr.dst_index(), x[csr.indices] ** 2)
    torch.testing.assert_close(kernels.spmm(csr, x, None, "sumsq"), want)
    runs = [one_process(program, graph, use_kernels)[0] for use_kernels in (False, True)]
    assert torch.isfinite(runs[0]).all() and rel(runs[1], runs[0]) < 1e-5
