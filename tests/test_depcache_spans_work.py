"""DepCache's spans priced without repeated work (issue 36: the 64-layer GCNII example on Cora within 1 s).

gnnc.passes.cost.neutronstar.DepcacheSpans sums the spans from one start together, one numpy addition per layer
into all of them (a sum per span read every one of its layers: L(L+1)/2 reads for a model's spans from layer 0),
and reads the inputs' symbols as [workers, 1] columns made when a formula reads one (evaluation.Columns), where
every one of the inputs' symbols (~2,000 for the 64-layer example) was broadcast and reshaped per instance. The
values are the same floats as the per-span sums.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, count_calls, random_graph
from gnnc import api
from gnnc.cluster import preset
from gnnc.passes.cost import neutronstar
from gnnc.passes.cost.inputs import planning_inputs

LAYERS = 16


@pytest.fixture(scope="module")
def priced():
    graph = random_graph(400, 3200, f=32, c=4, seed=3)
    program = api.compile(api.load_model(EXAMPLES / "gcnii.gnn", layers=LAYERS, hidden=16), graph).program
    parts = np.arange(graph.num_nodes) % 4
    _, inputs, shapes = planning_inputs(program, graph, parts, preset("neutronstar-ecs"), 4)
    return inputs, shapes


@pytest.mark.parametrize("halo", [False, True])
def test_every_span_from_a_start_reads_each_layer_once(priced, monkeypatch, halo) -> None:
    inputs, shapes = priced
    spans = neutronstar.DepcacheSpans(inputs, shapes, halo=halo)
    reads = count_calls(monkeypatch, neutronstar.DepcacheSpans, "_layer")
    ends = range(1, min(spans.hops, len(shapes)) + 1)
    values = [spans.value(0, end) for end in ends]
    assert reads["n"] == len(ends)  # one read per layer (136 for the 16 spans of 16 layers, per-span sums)
    monkeypatch.undo()
    for end, value in zip(ends, values):  # the per-span sums, each span's layers added first to last from 0
        fwd, bwd, memory, evaluation = sum(spans._layer(layer)[end - 1 - layer] for layer in range(end))
        assert np.array_equal(value.stage_times, np.stack([fwd, bwd, evaluation]))
        assert np.array_equal(value.worker_memory, memory)
    later = neutronstar.DepcacheSpans(inputs, shapes, halo=halo)  # the spans asked for in any order: the same
    assert [later.value(0, end).time for end in reversed(ends)] == [v.time for v in reversed(values)]


def test_the_inputs_are_not_broadcast_symbol_by_symbol(priced, monkeypatch) -> None:
    inputs, shapes = priced
    inputs.table  # made once per compile, before (not counted)
    broadcasts = count_calls(monkeypatch, np, "broadcast_to")
    spans = neutronstar.DepcacheSpans(inputs, shapes)
    spans.value(0, 2)
    # every one of the inputs' symbols was broadcast when the spans were set up (len(inputs.table) calls)
    assert broadcasts["n"] <= 4 * 2 < len(inputs.table.by_name), broadcasts["n"]


def test_alike_formulas_are_evaluated_together_to_the_same_floats(priced, monkeypatch) -> None:
    """The per-layer strategies' formulas of every layer (evaluation.evaluate_costs, as plan_costs prices them) and
    DepCache's layer terms are evaluated a group of alike formulas at a time: the same floats as one by one."""
    from gnnc.passes.cost import evaluation
    from gnnc.passes.cost.registry import planner_cost

    inputs, shapes = priced
    for strategy in ("depcomm", "bcast1d"):
        costs = [planner_cost(strategy, i, i + 1, shapes[i:i + 1]) for i in range(len(shapes))]
        exprs = [e for c in costs for e in (*c.stages, c.bytes, c.memory)]
        assert len({evaluation.alike(e)[0] for e in exprs}) <= len(exprs) // 8  # layers share their formulas' shape
        # the shapes are kept as text: no object for the garbage collector to walk (nested tuples of types were
        # ~20,000 for the 64-layer example and moved a full collection into the next compile's elaborate)
        assert all(type(key) is str for key in evaluation._SHAPES)
        together = evaluation.evaluate_costs(costs, inputs)
        for cost, value in zip(costs, together):
            alone = evaluation.evaluate_cost(cost, inputs)
            assert (value.time, value.bytes, value.memory, value.evaluation_time) == (
                alone.time, alone.bytes, alone.memory, alone.evaluation_time)
            assert np.array_equal(value.stage_times, alone.stage_times)
            assert np.array_equal(value.worker_bytes, alone.worker_bytes)
            assert np.array_equal(value.worker_memory, alone.worker_memory)
    calls = count_calls(monkeypatch, neutronstar, "evaluate_alike")
    spans = neutronstar.DepcacheSpans(inputs, shapes)
    for end in range(1, LAYERS + 1):
        spans.value(0, end)
    assert calls["n"] == 1  # every layer's terms at once (one evaluation per layer and term before)
    monkeypatch.undo()
    for layer in range(LAYERS):  # each layer's terms as its own numeric functions give them
        grid = spans._grid
        for term, expr in enumerate(neutronstar._depcache_layer(layer, shapes[layer], False)):
            alone = np.broadcast_to(evaluation.numeric_function(expr)[0](grid), (inputs.workers, spans.hops))
            assert np.array_equal(spans._terms[layer][:, term, :], alone.T)


def test_hybrid_selections_of_every_layer_are_priced_together_to_the_same_floats(priced, monkeypatch) -> None:
    """hybrid_values_of evaluates every layer's five formulas at once (the layers' selections' columns widened to
    the widest layer's): each selection's value is bit for bit its value priced alone (`hybrid_value`), spans
    from several starts included (a first layer of each)."""
    from gnnc.passes.cost import evaluation

    inputs, shapes = priced
    rng = np.random.default_rng(5)
    p = inputs.workers
    spans = [(0, end) for end in range(1, LAYERS + 1)] + [(3, 9), (3, 4), (7, LAYERS)]
    selections = []
    for start, end in spans:
        k = end - start
        rows = [rng.integers(0, 300, (p, k)).astype(np.float64) for _ in range(4)]
        selections.append((start, end, neutronstar.hybrid_values(start, *rows, rng.integers(0, 50, p))))
    calls = count_calls(monkeypatch, neutronstar, "evaluate_alike")
    together = neutronstar.hybrid_values_of(inputs, shapes, selections)
    assert calls["n"] == 1  # every layer's formulas in one call (one evaluation per layer and formula before)
    monkeypatch.undo()
    assert len({evaluation.alike(e)[0] for layer in range(1, LAYERS)
                for e in neutronstar._hybrid_layer(layer, shapes[layer], False)}) <= 12  # of 60: alike
    for (start, end, extra), value in zip(selections, together):
        alone = neutronstar.hybrid_value(start, end, shapes[start:end], inputs, extra)
        assert (value.time, value.bytes, value.memory) == (alone.time, alone.bytes, alone.memory)
        assert np.array_equal(value.stage_times, alone.stage_times)


def test_the_inputs_table_broadcasts_its_scalars_in_one_call(priced, monkeypatch) -> None:
    """symbols.per_worker makes every scalar's row a read-only view of one broadcast (one np.broadcast_to per scalar
    before: ~2,200 for the 64-layer example, 0.028 CPU s of each compile), each the same values as before."""
    from gnnc.passes.cost import symbols

    inputs, _ = priced
    values = inputs.values()
    broadcasts = count_calls(monkeypatch, np, "broadcast_to")
    rows = symbols.per_worker(values, inputs.workers)
    assert broadcasts["n"] == 1
    monkeypatch.undo()
    assert list(rows) == list(values)
    for key, value in values.items():
        row = rows[key]
        assert row.shape == (inputs.workers,) and row.dtype == np.float64
        assert np.array_equal(row, np.broadcast_to(np.asarray(value, np.float64), (inputs.workers,)))
        assert not row.flags.writeable or np.ndim(value) > 0  # a scalar's row is shared: read-only
