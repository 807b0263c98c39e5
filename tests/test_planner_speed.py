"""The planner evaluates its symbolic formulas numerically (issue 36, items 1-3).

The formulas stay sympy expressions (they print, `--explain` solves them), but
choose-strategy's search must not ask sympy to decide which term of a max
dominates (an evaluating `Max`/`Min`: its assumption system took most of a deep
model's compile), and a formula is built once per (segment, strategy) and kept.
The fast path is checked against the reference path it replaced: every priced
segment's evaluation stages are the ones `xreplace` builds, and its numbers are
what substituting the figures into the formula gives, worker by worker.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import sympy
from sympy.core.operations import AssocOp
from sympy.functions.elementary.miscellaneous import MinMaxBase

import gnnc
from conftest import EXAMPLES, random_graph
from gnnc.ir.expr import as_expr
from gnnc.passes import choose_strategy
from gnnc.passes.cost import epoch, evaluation, neutronstar, registry
from gnnc.passes.cost.epoch import evaluation_of, forward_stages
from gnnc.passes.cost.evaluation import table
from gnnc.passes.cost.symbols import OP_SIDES, R_gemm, R_gemm_e, R_spmm, R_spmm_e, op_time
from gnnc.plan.strategies import STRATEGIES


@contextlib.contextmanager
def counting_max_min() -> Iterator[dict[str, int]]:
    """Count sympy Max/Min constructions: all of them, and those that evaluate (compare their arguments)."""
    counts = {"all": 0, "evaluated": 0}
    original = MinMaxBase.__new__

    def counted(cls, *args, **kwargs):
        counts["all"] += 1
        if kwargs.get("evaluate", sympy.core.parameters.global_parameters.evaluate):
            counts["evaluated"] += 1
        return original(cls, *args, **kwargs)

    MinMaxBase.__new__ = counted
    try:
        yield counts
    finally:
        MinMaxBase.__new__ = original


def _search_counts(monkeypatch, model, graph, workers: int) -> dict[str, int]:
    """Max/Min constructions inside choose-strategy's search (pricing, DP, report, crossovers) of one compile."""
    seen: dict[str, int] = {}
    search = choose_strategy.choose

    def counted(*args, **kwargs):
        with counting_max_min() as counts:
            report = search(*args, **kwargs)
        seen.update(counts)
        return report

    monkeypatch.setattr(choose_strategy, "choose", counted)
    gnnc.compile(model, graph, workers=workers)
    return seen


def test_the_search_of_a_16_layer_model_builds_no_max(monkeypatch) -> None:
    graph = random_graph(n=400, e=2400, f=16, c=4)
    model = gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=16)
    registry._built_segment_cost.cache_clear()
    cold = _search_counts(monkeypatch, model, graph, 8)
    # the first compile builds each formula once, its maxima as written: none compares its arguments
    assert cold["evaluated"] == 0, cold
    warm = _search_counts(monkeypatch, model, graph, 8)
    # a formula holds no figure of the graph or the cluster: a second compile builds none
    assert warm["all"] == 0, warm


@contextlib.contextmanager
def counting_sums_and_products() -> Iterator[dict[str, int]]:
    """Count sympy Add/Mul constructions (what building a formula is made of)."""
    counts = {"all": 0}
    original = AssocOp.__new__

    def counted(cls, *args, **kwargs):
        if cls in (sympy.Add, sympy.Mul):
            counts["all"] += 1
        return original(cls, *args, **kwargs)

    AssocOp.__new__ = counted
    try:
        yield counts
    finally:
        AssocOp.__new__ = original


def _clear_formula_caches() -> None:
    """Forget every formula built (a first compile in a fresh process)."""
    for module in (registry, neutronstar, evaluation, epoch):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def _sums_built(monkeypatch, model, graph, cold: bool = True) -> dict[str, int]:
    """Add/Mul ("sums") and Max/Min ("max") constructions inside choose-strategy's search of one compile of
    `model`: a first one in a fresh process (`cold`), or one after another."""
    seen: dict[str, int] = {}
    search = choose_strategy.choose

    def counted(*args, **kwargs):
        with counting_sums_and_products() as sums, counting_max_min() as maxima:
            report = search(*args, **kwargs)
        seen.update(sums=sums["all"], max=maxima["all"])
        return report

    monkeypatch.setattr(choose_strategy, "choose", counted)
    if cold:
        _clear_formula_caches()
    gnnc.compile(model, graph, workers=4)
    return seen


def test_formulas_built_grow_linearly_in_layers(monkeypatch) -> None:
    """The search builds each layer's formulas, not each span's: GCNII's L(L+1)/2 DepCache and Hybrid spans from
    layer 0 built O(L^2) sums (a 64-layer model's compile), its layers O(L). Four times the layers: at most
    about four times the sums (16 times with a formula per span)."""
    graph = random_graph(n=300, e=1800, f=16, c=4)
    small, large = (_sums_built(monkeypatch, gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=n), graph)["sums"]
                    for n in (6, 24))
    assert large < 5.5 * small, (small, large)  # measured: 6 layers 6,287 sums, 24 layers 27,152


@pytest.mark.slow
def test_a_64_layer_search_builds_each_layers_formulas_once(monkeypatch) -> None:
    """The deep case: GCNII x64's 2,080 DepCache and 2,080 Hybrid spans build no sum of their own: about 1,150
    sums per layer (73,330 measured), as at 6 and 24 layers (quadratic before: 8,093 at 6 layers, 62,225 at 24),
    and a second compile builds none but the epoch's few."""
    graph = random_graph(n=300, e=1800, f=16, c=4)
    model = gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=64)
    cold = _sums_built(monkeypatch, model, graph)
    assert cold["sums"] < 1500 * 64, cold
    warm = _sums_built(monkeypatch, model, graph, cold=False)
    assert warm["max"] == 0 and warm["sums"] < 2 * 64, warm


def _xreplace_evaluation(stages, layers: range):
    """The evaluation stages as they were built before the fast renaming: sympy's xreplace."""
    swap = {op_time(layer, side, "f"): op_time(layer, side, "e") for layer in layers for side in OP_SIDES}
    swap.update({R_gemm: R_gemm_e, R_spmm: R_spmm_e})
    return tuple(as_expr(s).xreplace(swap) for s in stages)


def _symbolic(expr, values, workers: int) -> np.ndarray:
    """`expr` per worker by substituting the figures into the formula (the reference path)."""
    expr = as_expr(expr)
    return np.array([float(expr.xreplace({s: sympy.Float(float(np.broadcast_to(values[s], (workers,))[i]))
                                          for s in expr.free_symbols})) for i in range(workers)])


CASES = [("gcn", {}), ("sage", {}), ("gat", {}), ("gin", {}), ("gcnii", {"layers": 4})]
GRAPHS = {"random": lambda: random_graph(n=200, e=1200, f=24, c=4),
          "rmat": lambda: gnnc.load_graph("rmat:n=600,deg=6,features=24,classes=4,seed=0")}


def _differential(name: str, overrides: dict, graph, workers: int) -> None:
    """Every segment the planner priced: fast evaluation stages == xreplace's, numbers == substitution's."""
    model = gnnc.load_model(EXAMPLES / f"{name}.gnn", **overrides)
    plan, report = plan_report(model, graph, workers)
    priced = report.priced
    p = priced.inputs.workers
    checked = 0
    for key, cost in priced.formulas.items():
        start, end, strategy = key
        if STRATEGIES[strategy].whole_model:
            continue
        layers = range(start, end)
        assert cost.evaluation_stages == _xreplace_evaluation(forward_stages(cost, end - start)[:cost.evaluation],
                                                              layers), key
        values = table(priced.inputs, priced.extras[key])
        value = priced.values[key]
        want_time = sum(float(_symbolic(stage, values, p).max()) for stage in cost.stages)
        assert value.time == pytest.approx(want_time, rel=1e-9), key
        assert value.bytes == pytest.approx(float(_symbolic(cost.bytes, values, p).sum()), rel=1e-9, abs=1e-6), key
        assert value.memory == pytest.approx(float(_symbolic(cost.memory, values, p).max()), rel=1e-9), key
        checked += 1
    assert checked >= 2
    assert list(report.strategies) == [layer.attr("strategy") for layer in plan.program.graph_layers()]


def plan_report(model, graph, workers: int):
    """One compile's plan, and choose-strategy's report (with its PricedPlan) behind it."""
    seen = {}
    search = choose_strategy.choose

    def keep(*args, **kwargs):
        seen["report"] = search(*args, **kwargs)
        return seen["report"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(choose_strategy, "choose", keep)
        plan = gnnc.compile(model, graph, workers=workers)
    return plan, seen["report"]


@pytest.mark.parametrize("name,overrides", [("gcn", {}), ("gat", {}), ("gcnii", {"layers": 4})],
                         ids=["gcn", "gat", "gcnii4"])
def test_fast_evaluation_agrees_with_the_symbolic_reference(name: str, overrides: dict) -> None:
    _differential(name, overrides, GRAPHS["random"](), 4)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4, 8])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("name,overrides", CASES, ids=[c[0] for c in CASES])
def test_fast_evaluation_agrees_on_every_example(name: str, overrides: dict, graph_name: str, workers: int) -> None:
    _differential(name, overrides, GRAPHS[graph_name](), workers)


def test_crossovers_are_numeric_and_their_equation_is_built_when_read() -> None:
    from gnnc.passes.cost.crossovers import crossover
    from gnnc.passes.cost.symbols import Cost, CostInputs, V, d
    from gnnc.cluster import preset

    x = d(1)
    ones = np.ones(2)
    inputs = CostInputs(np.array([1.0, 2.0]), ones, 0 * ones, 0 * ones, np.ones((2, 1)), np.ones((2, 1)),
                        (8.0, 100.0), preset("neutronstar-ecs"))
    first = [Cost("a", (sympy.Max(V * x, 50, evaluate=False),), 0, 0)]
    second = [Cost("b", (x + 60,), 0, 0)]
    with counting_max_min() as counts:
        [cross] = crossover(first, second, x, inputs, 1.0, 1000.0)
    assert counts["all"] == 0  # found on the compiled formulas
    assert cross.value == pytest.approx(60.0, rel=1e-12) and cross.first_faster_above is False
    assert sympy.simplify(cross.equation.lhs.subs(x, 60)) == 0  # the active piece, built now


def test_equal_dims_are_compared_without_sympy_algebra(monkeypatch) -> None:
    """The IR verifier compares every value's shape after every pass: equal dims are equal without expanding
    their difference (the 64-layer GCNII example's compile spent ~0.2 of its 3.1 CPU-s after load there)."""
    from gnnc.ir import ops

    expanded = []
    expand = sympy.expand
    monkeypatch.setattr(sympy, "expand", lambda e, *a, **k: expanded.append(e) or expand(e, *a, **k))
    n, f = sympy.symbols("n f", positive=True, integer=True)
    assert ops.same_shape((n, 2 * f + 1), (n, 2 * f + 1)) and expanded == []
    assert ops.same_dim((f + 1) * (f + 2), f**2 + 3 * f + 2) and not ops.same_dim(n, n + 1)  # other forms: algebra
    assert len(expanded) == 2


def test_algorithm_4_measures_no_level_below_an_ended_subtree(monkeypatch) -> None:
    """Line 6's measure of a layer's subtrees stops at the first level where none is left to expand: below it
    a level adds no cost and no element. The 64-layer GCNII example on Cora x4 expanded nothing in 7,153 of its
    8,189 levels (each a dozen numpy calls), 0.49 -> 0.20 CPU-s of Algorithm 4."""
    from gnnc.passes.planner import hybrid_greedy

    expanded = []
    real = hybrid_greedy._expand

    def recorded(trees, dep, *args):
        expanded.append(len(dep))
        return real(trees, dep, *args)

    monkeypatch.setattr(hybrid_greedy, "_expand", recorded)
    graph = random_graph(n=300, e=1800, f=16, c=4)
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=8), graph, workers=4, cluster="gnnpipe")
    assert expanded and 0 not in expanded, (len(expanded), expanded.count(0))


def random_segment_costs(layers: int, seed: int, one_layer: tuple[str, ...] = ("depcomm",)) -> dict:
    """A segment DP's (time, memory) table: depcache on every segment, growing with its length, and each strategy
    of `one_layer` on single layers."""
    rng = np.random.default_rng(seed)
    seg_cost = {}
    for a in range(layers):
        for z in range(a + 1, layers + 1):
            seg_cost[(a, z, "depcache")] = (float(rng.uniform(1, 2) * (z - a)), float(rng.uniform(1, 2) * (z - a)))
        for strategy in one_layer:
            seg_cost[(a, a + 1, strategy)] = (float(rng.uniform(1, 2)), float(rng.uniform(0.5, 1)))
    return seg_cost


def test_the_dp_reads_the_tie_breaking_order_only_on_ties(monkeypatch) -> None:
    """A label dominates another by (time, memory) first: the full tie-breaking key (its per-layer strategy
    order, O(L) long) is built only when both are equal, and for sorting each cell once. Building it for every
    comparison was half of the 64-layer GCNII example's DP (0.25 -> 0.13 CPU-s on Cora x4, the same table)."""
    from gnnc.passes.planner import segment_dp

    layers = 24
    seg_cost = random_segment_costs(layers, 0)
    keys = []
    real = segment_dp.Label.key
    monkeypatch.setattr(segment_dp.Label, "key", lambda self: keys.append(1) or real(self))
    result = segment_dp.solve(layers, ["depcomm", "depcache"], seg_cost)
    labels = sum(len(cell) for cell in result.table.values())
    assert len(keys) <= 2 * labels, (len(keys), labels)  # was 14,883 for 943 labels


@pytest.mark.parametrize("groups,chunks", [(1, 8), (2, 4), (3, 3)])
def test_a_pipelines_group_rows_are_counted_off_the_edges_once(monkeypatch, groups: int, chunks: int) -> None:
    """The planner prices a pipeline per group size: each one's moved rows are counted off the distinct
    (destination part, source) pairs in one sort, without building the per-chunk lists (`_lists`, an edge
    lexsort and three sorts per chunk and member) that the shards need; the same counts as those lists give."""
    from gnnc.graph import sorted_unique
    from gnnc.plan import pipeline as plan_pipeline

    graph = random_graph(n=300, e=1800, f=8, c=3)
    parts = np.random.default_rng(groups).integers(0, chunks * groups, graph.num_nodes)
    lists = plan_pipeline._lists(graph, "self_loops", parts, chunks, groups)
    member_of = parts % groups
    want = {name: np.zeros(groups, dtype=np.int64) for name in plan_pipeline.GroupRows.__dataclass_fields__}
    for (k, g), peer in lists.peer.items():
        want["received"][g] += len(peer)
        want["sent"] += np.bincount(member_of[peer], minlength=groups)
        want["later_received"][g] += len(lists.later[(k, g)])
        want["later_sent"] += np.bincount(member_of[lists.later[(k, g)]], minlength=groups)
        want["history"][g] += len(lists.hist[(k, g)])
        if groups > 1:
            ext = np.concatenate([lists.peer[(j, g)] for j in range(chunks)] + [lists.hist[(j, g)] for j in range(chunks)])
            ext = sorted_unique(ext)
            want["refresh"][g] = np.count_nonzero(member_of[ext] != g)
    monkeypatch.setattr(plan_pipeline, "_lists", lambda *a: pytest.fail("group_rows built the per-chunk lists"))
    got = plan_pipeline.group_rows(graph, "self_loops", parts, chunks, groups)
    for name, value in want.items():
        assert np.array_equal(getattr(got, name), value), name


def test_each_layout_transition_is_priced_once_per_layer(monkeypatch) -> None:
    """A transition's formula is its layouts' (the one strategy's output, the other's input), so the search
    prices it once per layout pair and layer, not per strategy pair: most strategies leave and take vertex rows
    (S(S-1)(L-1) = 756 evaluations for the 64-layer GCNII example on Cora x4, 0.12 CPU-s loaded; 63 differ:
    its four strategies all leave and take vertex rows)."""
    from gnnc.passes.planner import search

    priced = []
    real = search.boundary

    def recorded(prev, nxt, layer, *args):
        priced.append((STRATEGIES[prev].layout_out, STRATEGIES[nxt].layout_in, layer))
        return real(prev, nxt, layer, *args)

    monkeypatch.setattr(search, "boundary", recorded)
    graph = random_graph(n=200, e=1200, f=8, c=3)
    gnnc.compile(gnnc.load_model(EXAMPLES / "gcn.gnn"), graph, workers=4)
    assert priced and len(priced) == len(set(priced)), priced
