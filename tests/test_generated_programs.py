"""Every fast path against its reference, on programs nobody wrote: gnnc.program_gen's seeded programs.

Each program type-checks (a refused one fails here: a bug of the generator or of the checker), then
trains for 2 epochs in this process: with the compiled kernels and fused chains (gnnc.runtime.fusion, the
native dropout) and with them off (`native.disabled()`, what `GNNC_NATIVE=0` does), and under `-m slow`
with the reference implementations of every op too (`use_kernels=False`: no torch CSR kernel either,
`RUNS`). The runs' gradients of every parameter at each epoch and the evaluation logits after the second
must agree to 1e-5 (relative, over the tensor; a gradient far smaller than the step's largest, as one that
is 0 in exact arithmetic, against a tenth of that largest: `_grad_floor`). The steps are SGD's, whose
updates are proportional to the gradients (see `train_two_epochs`). A sample also runs one training
step on 2 gloo processes (the plan's ranks, which fuse nothing but run the compiled dropout), compared with
one process with the fast paths. A few dozen programs here, a few hundred under `-m slow`; every failure
found is kept below as a named program (REGRESSIONS) that runs in the quick suite.

    .venv/bin/python -m pytest -m slow tests/test_generated_programs.py    # the long sweep
"""
from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from _rank_pool import pooled_launch
from gnnc import api
from gnnc.model_file import check
from gnnc.program_gen import generate
from gnnc.runtime import fusion
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.executor import init_params
from gnnc.runtime.kernels import native
from gnnc.testing import sgd_steps
from gnnc.runtime.train import TrainConfig, Worker

compiled = pytest.mark.skipif(native.library() is None, reason=f"compiled kernels: {native.status()}")

SEED = 1
QUICK = range(0, 30)  # programs in `make test`
SLOW = range(30, 330)  # and under -m slow
QUICK_RANKS = (0, 1, 2, 3)  # run on 2 processes too
SLOW_RANKS = range(4, 100)
STRATEGIES = ("depcomm", "depcache", "bcast1d")  # the 2-process plans' strategy, in turn by program
TOLERANCE = 1e-5
GRAD_FLOOR = 0.1  # see _grad_floor

# Programs the generator found failing, each kept as it failed (the fix named beside it).
REGRESSIONS: dict[str, str] = {
    # a dropout returns its input in evaluation: the elu after it wrote over h1, which the residual then read
    # (fusion.find_chains walks through the ops that may return their input, `_aliases`)
    "evaluation-dropout-alias": """
layer Conv(in, out) with self_loops {
  scatter   m = edge.gcn_norm * src.h
  gather    a = sum(m)
  transform c = linear(a, out)
  apply     h = c
}
model M(features, classes) {
  h1 = linear(x, 8)
  h2 = dropout(h1, 0.5)
  h3 = elu(h2)
  h = h3 + h1
  h = Conv(8, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
""",
    # the bias-dropout chain keeps its result for its backward; the elu's chain wrote over it ("modified by an
    # inplace operation" in the backward; fusion.find_chains: saves_result)
    "over-a-saved-result": """
layer Conv(in, out) with self_loops {
  scatter   m = edge.gcn_norm * src.h
  gather    a = sum(m)
  transform c = linear(a, out)
  apply     h = c
}
model M(features, classes) {
  h = dropout(bias(linear(x, 8)), 0.5)
  h = elu(h)
  h = linear(h, 8)
  h = Conv(8, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
""",
    # concat of one value is a view of it: the bias's chain wrote over the attention's result, which the second
    # concat then read (fusion._aliases)
    "concat-view-read-twice": """
layer Att(in, out) with self_loops {
  transform z = linear(h, 2, out, bias = false)
  scatter   e = leaky_relu(dot(src.z) + dot(dst.z), 0.2)
  gather    alpha = softmax(e)
  scatter   m = edge.alpha * src.z
  gather    a = sum(m)
  transform c = concat(a)
  apply     h = relu(bias(c)) + concat(a)
}
model M(features, classes) {
  h = Att(features, 4)(x)
  h = linear(h, classes)
  loss = cross_entropy(h, y, mask = train)
}
""",
    # generated program 0 (the generator's first version drew it too): the dropout's chain keeps its result for
    # its backward, and the elu's chain wrote over it (fusion.find_chains: saves_result)
    "generated-0": """
layer Conv1(in, out) with self_loops {
  scatter   m = max(src.h, dst.h)
  gather    a = mean(m)
  transform c = linear(a, out)
  apply     h = c
}

layer Conv4(in, out) with self_loops {
  scatter   m = dropout(edge.gcn_norm, 0.5) * src.h
  gather    a = max(m)
  transform c = linear(a, out) + linear(h, out, bias = false)
  apply     h = dropout(bias(c), 0.3)
}

model Gen(features, classes) {
  h = x
  h = Conv1(features, 6)(h)
  h = dropout(h, 0.3)
  h = elu(h)
  param g2 = 0.5
  h = g2 * h
  param g3 = 2.0
  h = g3 * h
  h = Conv4(6, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
""",
    # GATv2 as the docs write it: SpMM's head-shaped result is a view made inside a custom Function, which
    # torch forbids writing over; the concat's bias wrote over it (fusion._overwritable now asks torch's rule)
    "gatv2": """
layer GATv2Conv(in, out, heads = 1, slope = 0.2, attn_p = 0.6) with self_loops {
  transform zl = linear(h, heads, out)
  transform zr = linear(h, heads, out)
  scatter   e = dot(leaky_relu(src.zl + dst.zr, slope))
  gather    alpha = softmax(e)
  scatter   m = dropout(edge.alpha, attn_p) * src.zl
  gather    a = sum(m)
  transform c = concat(a)
  sync      s = sum(c)
  apply     h = bias(s)
}
model GATv2(features, hidden = 4, heads = 3, classes, p = 0.6) {
  h = dropout(x, p)
  h = GATv2Conv(features, hidden, heads)(h)
  h = elu(h)
  h = dropout(h, p)
  h = GATv2Conv(heads * hidden, classes, 1)(h)
  loss = cross_entropy(h, y, mask = train)
}
""",
}


def _graph(features: int, density: float | None):
    g = api.load_graph(f"sbm:n=240,features={features},classes=4,deg=4,seed=1")
    gen = torch.Generator().manual_seed(2)
    g.edge_data = {"weight": torch.rand(g.num_edges, generator=gen) + 0.1}
    if density is not None:  # bag of words: held sparse, multiplied and dropped out as sparse features
        g.x = g.x * (torch.rand(g.x.shape, generator=gen) < density)
    return g


@pytest.fixture(scope="module")
def graphs():
    """Small community graphs with edge weights (`edge.weight`), the same on every run: dense features, and
    sparse ones (a third of the programs)."""
    return {"dense": _graph(10, None), "bag-of-words": _graph(40, 0.04)}


def graph_for(seed: int, graphs):
    return graphs["bag-of-words" if seed % 3 == 2 else "dense"]


def _program(source: str, name: str, graph):
    model = api.load_model_source(source, f"{name}.gnn")
    check(model, graph)  # raises on a program the checker refuses
    return api.compile(model, graph).program


def _rel(a: torch.Tensor | None, b: torch.Tensor | None, floor: float = 0.0) -> float:
    """|a - b| / |b| over the tensor, |b| taken as at least `floor`; no gradient (None) is a zero one (a parameter
    the loss does not read: None in one process, zeros summed over ranks)."""
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        a, b = (torch.zeros_like(b if a is None else a) if t is None else t for t in (a, b))
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.all()):  # NaN or inf in the same places, and the same infinities, or a difference
        if not (torch.equal(torch.isfinite(a), torch.isfinite(b)) and torch.equal(a[~finite].nan_to_num(),
                                                                                    b[~finite].nan_to_num())):
            return float("inf")
        a, b = a[finite], b[finite]
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=max(floor, 1e-12)))


def _grad_floor(grads: dict[str, torch.Tensor | None]) -> float:
    """The norm below which a gradient is compared as if it had this norm: a tenth of the step's largest. A gradient
    that is 0 in exact arithmetic (of a destination's own score under the softmax over its in-edges, which the
    softmax does not see; of a bias under a batch norm) is rounding noise in every implementation, 1e-9 beside
    gradients of 0.1, which float32's rounding in the others (1e-7..1e-6 of the largest) would exceed."""
    return GRAD_FLOOR * max((float(g.double().norm()) for g in grads.values() if g is not None), default=0.0)


# the runs compared: the fast paths, then their references with the tolerance each is held to. GNNC_NATIVE=0 runs
# the same torch CSR products in the same order; the reference implementations (index_add over the edges in
# edge order) sum in another order, whose float32 rounding a model's later layers (a softmax of products of
# scores, two steps later) amplify past 1e-4 in places: held to 1e-3, which a wrong kernel exceeds by far.
RUNS = {"fast": ({}, 0.0), "GNNC_NATIVE=0": ({"native_on": False}, TOLERANCE),
        "reference": ({"native_on": False, "use_kernels": False}, 1e-3)}


def train_two_epochs(program, graph, native_on: bool = True,
                     use_kernels: bool = True) -> tuple[torch.Tensor, list[dict[str, torch.Tensor | None]]]:
    """(evaluation logits after 2 epochs, every parameter's gradient at each epoch), with the compiled kernels on
    or off (`native_on`) and the kernel variants of the ops (torch's CSR products) or their reference
    implementations (`use_kernels`)."""
    cfg = TrainConfig(seed=SEED, progress=False, use_kernels=use_kernels)
    with contextlib.nullcontext() if native_on else native.disabled():
        worker, params, grads = sgd_steps(program, graph, cfg)
        with torch.no_grad():
            logits, _ = worker.forward(params, False, 2)
    return logits, grads


def _ties(program) -> bool:
    """Whether `program` takes a maximum or minimum over neighbours, whose gradient at a tie (ReLU's and dropout's
    zeros) is any split among the tied edges: the CSR kernel gives it to one, the reference shares it out."""
    return any(e.op == "spmm" and e.attr("reduce") in ("max", "min") for layer in program.layers for e in layer.eqns)


def differences(program, graph, references: tuple[str, ...] = tuple(RUNS)[1:], train=train_two_epochs) -> list[str]:
    """What differs between the fast paths and each of `references` (RUNS) on `program` (empty: nothing); `train`
    runs it as `train_two_epochs` does (another task's loop: tests/test_generated_tasks.py)."""
    if _ties(program):
        references = tuple(r for r in references if RUNS[r][0].get("use_kernels", True))
    (logits, grads), *refs = (train(program, graph, **RUNS[who][0]) for who in ("fast",) + references)
    out = []
    for who, (want_logits, want_grads) in zip(references, refs):
        tolerance = RUNS[who][1]
        if _rel(logits, want_logits) > tolerance:
            out.append(f"logits differ from {who} by {_rel(logits, want_logits):.2e}")
        for epoch, (got, want) in enumerate(zip(grads, want_grads)):
            floor = _grad_floor(want)
            for k in want:
                if _rel(got[k], want[k], floor) > tolerance:
                    out.append(f"epoch {epoch}: gradient of {k} differs from {who} by "
                               f"{_rel(got[k], want[k], floor):.2e}")
    return out


def _sweep(sources: dict[str, tuple[str, Any]], references: tuple[str, ...] = tuple(RUNS)[1:],
           compile=_program, train=train_two_epochs) -> dict[str, Any]:
    """Every program's differences on its graph (name -> (source, graph)), or the error it raised; and how many
    ran a fused chain. `compile` and `train` as `_program` and `train_two_epochs` take them (another task's)."""
    ran: list[bool] = []
    run = fusion.run
    failures: dict[str, Any] = {}
    fused = 0
    for name, (source, graph) in sources.items():
        try:
            program = compile(source, name, graph)
        except Exception as err:  # noqa: BLE001 (reported, with the program, as a generator or checker bug)
            failures[name] = f"refused: {err}\n{source}"
            continue
        ran.clear()
        fusion.run = lambda chain, *args: ran.append(run(chain, *args)) or ran[-1]
        try:
            diff = differences(program, graph, references, train)
        except Exception as err:  # noqa: BLE001 (a crash of either path is a failure of this program)
            diff = [f"crashed: {type(err).__name__}: {err}"]
        finally:
            fusion.run = run
        fused += any(ran)
        if diff:
            failures[name] = "\n  ".join(diff) + f"\n{source}"
    return {"failures": failures, "fused": fused}


def _assert_sweep(sources: dict[str, tuple[str, Any]], references: tuple[str, ...] = tuple(RUNS)[1:],
                  compile=_program, train=train_two_epochs) -> None:
    result = _sweep(sources, references, compile, train)
    failures = result["failures"]
    assert not failures, "\n".join(f"{k}: {v}" for k, v in failures.items())
    assert result["fused"] > 0  # the fast paths ran


@compiled
def test_regressions_equal_the_reference(graphs) -> None:
    _assert_sweep({f"regression-{k}": (v, graphs["dense"]) for k, v in REGRESSIONS.items()})


@compiled
def test_generated_programs_equal_the_reference(graphs) -> None:
    _assert_sweep({f"gen-{s}": (generate(s), graph_for(s, graphs)) for s in QUICK}, ("GNNC_NATIVE=0",))


@compiled
@pytest.mark.slow
def test_many_generated_programs_equal_the_reference(graphs) -> None:
    _assert_sweep({f"gen-{s}": (generate(s), graph_for(s, graphs)) for s in SLOW})


def one_process_step(program, graph) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """One training step in one process with the fast paths (training logits, gradients), as `one_step`
    takes it on each rank."""
    cfg = TrainConfig(seed=SEED, progress=False)
    worker = Worker(program, graph, cfg)
    params = init_params(program, cfg.seed)
    logits, loss = worker.forward(params, True, 0)
    loss.backward()
    return logits.detach(), {k: None if p.grad is None else p.grad for k, p in params.items()}


def step_differences(name: str, got: dict[str, Any], logits: torch.Tensor,
                     grads: dict[str, torch.Tensor | None]) -> list[str]:
    """What differs between a step on ranks (`got`: its logits and gradients) and one process's."""
    out = []
    if _rel(got["logits"], logits) > TOLERANCE:
        out.append(f"{name}: logits differ by {_rel(got['logits'], logits):.2e}")
    floor = _grad_floor(grads)
    for k, g in grads.items():
        if _rel(got["grads"].get(k), g, floor) > TOLERANCE:
            out.append(f"{name}: gradient of {k} differs by {_rel(got['grads'].get(k), g, floor):.2e}")
    return out


def node_jobs(cases: list[tuple[str, str, Any, str]], tmp_path) -> list[tuple[str, Any, Any, DistJob]]:
    """(name, graph, one process's program, the ranks' job) of each (name, source, graph, strategy)."""
    todo = []
    for name, source, graph, strategy in cases:
        model = api.load_model_source(source, f"{name}.gnn")
        plan = api.compile(model, graph, workers=2, strategy=strategy, partition="hash")
        shards = plan.write_shards(tmp_path / name)
        todo.append((f"{name} ({strategy})", graph, api.compile(model, graph).program,
                     DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False))))
    return todo


def _two_ranks(seeds, graphs, tmp_path) -> None:
    """One step of each program on 2 processes (a strategy per program, in turn) against one process."""
    todo = node_jobs([(f"gen-{s}", generate(s), graph_for(s, graphs), STRATEGIES[s % len(STRATEGIES)])
                      for s in seeds], tmp_path)
    results = pooled_launch(one_step_each, 2, [job for *_, job in todo])[0]
    failures = []
    for (name, graph, single, _), got in zip(todo, results):
        failures += step_differences(name, got, *one_process_step(single, graph))
    assert not failures, "\n".join(failures)


@compiled
def test_generated_programs_on_two_processes_equal_one(graphs, tmp_path) -> None:
    _two_ranks(QUICK_RANKS, graphs, tmp_path)


@compiled
@pytest.mark.slow
def test_many_generated_programs_on_two_processes_equal_one(graphs, tmp_path) -> None:
    _two_ranks(SLOW_RANKS, graphs, tmp_path)
