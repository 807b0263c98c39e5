"""NeutronStar's Algorithm 4: a hand-worked case, a literal min-queue reference, strictness, the memory
cap, and the guarantee that Hybrid never predicts worse than the better pure strategy."""
from __future__ import annotations

import heapq
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_graph
from gnnc.cluster import preset
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.neutronstar import hybrid, hybrid_unit_costs, hybrid_values
from gnnc.passes.cost.symbols import CostInputs, LayerShape
from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.planner.hybrid_greedy import (Dependencies, UnitCosts, cache_memory, choose, communicate_cost,
                                       dependencies_from_stats, greedy_worker, predict, recompute_cost, select)

COSTS = UnitCosts(t_v=np.array([1.0, 2.0]), t_e=np.array([0.1, 0.2]), t_c=np.array([5.0, 3.0]), t_x=0.0,
                  row_bytes=np.array([4.0, 2.0, 1.0]), edge_bytes=1.0)


def deps_of(layer, vertex, walks, owner=None) -> Dependencies:
    """Dependencies with one row of walks (w_0, w_1, ...) each."""
    return Dependencies(np.asarray(layer), np.asarray(vertex), np.asarray(walks, np.float64),
                        np.arange(len(layer)), owner=owner)


def hand_deps() -> Dependencies:
    # d0: layer 0, v's input row only            t_r = 0            memory 4
    # d1: layer 1, v + 4 in-edges, 4 inputs      t_r = 1 + 0.4 = 1.4 memory 16 + 2 + 4 = 22
    # d2: layer 1, v + 20 in-edges, 20 inputs    t_r = 1 + 2.0 = 3.0 (= t_c: communicated) memory 102
    # d3: layer 1, v + 10 in-edges, 10 inputs    t_r = 1 + 1.0 = 2.0 memory 40 + 2 + 10 = 52
    return deps_of([0, 1, 1, 1], [10, 11, 12, 13], [[1, 0], [1, 4], [1, 20], [1, 10]])


def test_unit_costs_per_dependency_by_hand() -> None:
    deps = hand_deps()
    np.testing.assert_allclose(recompute_cost(deps, COSTS), [0.0, 1.4, 3.0, 2.0])
    np.testing.assert_allclose(communicate_cost(deps, COSTS), [5.0, 3.0, 3.0, 3.0])
    np.testing.assert_allclose(cache_memory(deps, COSTS), [4.0, 22.0, 102.0, 52.0])


def test_hand_worked_selection() -> None:
    deps = hand_deps()
    own = np.array([[1.0, 1.0]])
    result = select([deps], COSTS, own, memory_cap=1e9)
    assert result.cached[0].tolist() == [True, True, False, True]  # t_r = t_c is not cached: strictly less
    # layer 0: recompute d1's and d3's rows (2 x 1.0) and edges (14 x 0.1); layer 1: communicate d2 (3.0)
    np.testing.assert_allclose(result.layer_times, [[1 + 3.4, 1 + 3.0]])
    assert result.time == pytest.approx(8.4)
    assert result.memory.tolist() == [4 + 22 + 52]
    assert result.comm_received.tolist() == [[0, 1]] and result.recompute_rows.tolist() == [[2, 0]]
    assert result.replicated_inputs.tolist() == [15]


def test_strictly_less_than_t_c() -> None:
    deps = hand_deps()
    at = select([deps], COSTS, np.zeros((1, 2)), memory_cap=1e9)
    assert not at.cached[0][2]
    above = UnitCosts(COSTS.t_v, COSTS.t_e, np.array([5.0, np.nextafter(3.0, 4.0)]), 0.0, COSTS.row_bytes, 1.0)
    assert select([deps], above, np.zeros((1, 2)), memory_cap=1e9).cached[0][2]


def test_memory_cap_is_shared_by_layers_and_stops_the_queue() -> None:
    deps = hand_deps()
    zero = np.zeros((1, 2))
    # layer 0 takes 4 first; layer 1 pops d1 (22), then d3 needs 52 with 51 left: stop
    tight = select([deps], COSTS, zero, memory_cap=4 + 22 + 51)
    assert tight.cached[0].tolist() == [True, True, False, False]
    assert tight.memory[0] <= 77
    roomy = select([deps], COSTS, zero, memory_cap=4 + 22 + 52)
    assert roomy.cached[0].tolist() == [True, True, False, True]
    # the first dependency that does not fit stops its layer, even if a later one would fit
    big_first = deps_of([1, 1], [1, 2], [[1, 30], [1, 1]])
    costs = UnitCosts(np.array([1.0, 1.0]), np.zeros(2), np.array([9.0, 9.0]), 0.0, np.array([1.0, 1.0, 1.0]), 1.0)
    # queue order: vertex 1 (t_r 1.0, 30 + 1 + 30 bytes), vertex 2 (t_r 1.0: ties by vertex; 3 bytes); budget 10
    assert select([big_first], costs, np.zeros((1, 2)), memory_cap=10).cached[0].tolist() == [False, False]
    assert select([hand_deps()], COSTS, zero, memory_cap=0).cached[0].tolist() == [False] * 4


def test_predict_overlaps_communication_with_recompute() -> None:
    deps = hand_deps()
    own = np.array([[1.0, 1.0]])
    mask = [np.array([False, True, False, False])]
    # layer 0: communicate d0 (5) while recomputing d1 (1.4); layer 1: communicate d2 and d3 (6)
    assert predict([deps], COSTS, own, mask, overlap=True).time == pytest.approx((1 + 5) + (1 + 6))
    assert predict([deps], COSTS, own, mask, overlap=False).time == pytest.approx((1 + 6.4) + (1 + 6))


def test_rows_sent_follow_the_owners() -> None:
    a = deps_of([0, 0, 1], [5, 6, 5], np.ones((3, 2)), owner=np.array([1, 2, 1]))
    b = deps_of([1], [0], np.ones((1, 2)), owner=np.array([0]))
    c = deps_of(np.zeros(0, int), np.zeros(0, int), np.zeros((0, 2)), owner=np.zeros(0, int))
    masks = [np.zeros(3, bool), np.zeros(1, bool), np.zeros(0, bool)]
    r = predict([a, b, c], COSTS, np.zeros((3, 2)), masks)
    assert r.comm_received.tolist() == [[2, 1], [0, 1], [0, 0]]
    assert r.comm_sent.tolist() == [[0, 1], [1, 1], [1, 0]]
    assert r.comm_sent.sum() == r.comm_received.sum()


def test_choose_guards_against_a_greedy_that_lengthens_another_workers_layer() -> None:
    """Worker 0 moves 9 s of work to layer 0 to save 10 s at layer 1, but worker 1 already makes
    layer 1 last 10 s: per layer the greedy predicts 9 + 10, communicating everything 0 + 10."""
    costs = UnitCosts(np.array([9.0, 0.0]), np.zeros(2), np.array([100.0, 10.0]), 0.0, np.ones(3), 0.0)
    dep = deps_of([1], [7], [[1, 0]])  # v itself at layer 0, no edge, no input row
    none = deps_of(np.zeros(0, int), np.zeros(0, int), np.zeros((0, 2)))
    own = np.array([[0.0, 0.0], [0.0, 10.0]])
    greedy = select([dep, none], costs, own, 1e9)
    assert greedy.cached[0].tolist() == [True] and greedy.time == pytest.approx(19.0)
    chosen = choose([dep, none], costs, own, 1e9)
    assert chosen.source == "communicate-all" and chosen.time == pytest.approx(10.0)


# --- random instances --------------------------------------------------------------------------


def reference_worker(t_r, t_c, memory, layer, vertex, budget, layers) -> np.ndarray:
    """Algorithm 4 word for word: a heapq min-queue per layer, popped while t_r < t_c and memory fits."""
    cached = np.zeros(len(t_r), bool)
    left = budget
    for lyr in range(layers):
        queue = [(t_r[k], vertex[k], k) for k in range(len(t_r)) if layer[k] == lyr]
        heapq.heapify(queue)
        while queue:
            tr, _, k = heapq.heappop(queue)
            if not tr < t_c[k] or memory[k] > left:
                break
            cached[k] = True
            left -= memory[k]
    return cached


def random_deps(rng: np.random.Generator, n: int, layers: int, workers: int) -> Dependencies:
    layer = np.sort(rng.integers(0, layers, n))
    walks = np.concatenate([np.ones((n, 1)), rng.integers(0, 30, (n, layers - 1))], axis=1)
    vertex = rng.permutation(10 * n)[:n]
    return deps_of(layer, vertex, walks, owner=rng.integers(0, workers, n))


def random_costs(rng: np.random.Generator, layers: int) -> UnitCosts:
    # integer-valued times and bytes keep the sums exact, so the reference and the sort agree at ties
    return UnitCosts(rng.integers(0, 5, layers).astype(float), rng.integers(0, 3, layers).astype(float),
                     rng.integers(1, 60, layers).astype(float), float(rng.integers(0, 2)),
                     rng.integers(1, 5, layers + 1).astype(float), float(rng.integers(0, 3)))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), workers=st.integers(1, 4), layers=st.integers(1, 3),
       n=st.integers(0, 40), cap=st.floats(0, 3000))
def test_properties_on_random_instances(seed, workers, layers, n, cap) -> None:
    rng = np.random.default_rng(seed)
    deps = [random_deps(rng, n, layers, workers) for _ in range(workers)]
    costs = random_costs(rng, layers)
    own = rng.integers(0, 50, (workers, layers)).astype(float)
    greedy = select(deps, costs, own, cap)
    comm_all = predict(deps, costs, own, [np.zeros(len(d), bool) for d in deps])
    cache_all = predict(deps, costs, own, [np.ones(len(d), bool) for d in deps])
    for i, dep in enumerate(deps):
        ref = reference_worker(recompute_cost(dep, costs), communicate_cost(dep, costs), cache_memory(dep, costs),
                               dep.layer, dep.vertex, cap, layers)
        assert greedy.cached[i].tolist() == ref.tolist()  # the sort pops in the min-queue's order
        assert greedy.memory[i] <= cap
        # per worker, over the segment, the greedy never predicts more than a pure selection allows
        mine = greedy.layer_times[i].sum()
        assert mine <= comm_all.layer_times[i].sum() + 1e-9
        if cache_all.memory[i] <= cap:
            assert mine <= cache_all.layer_times[i].sum() + 1e-9
    if workers == 1:
        assert greedy.time <= comm_all.time + 1e-9
    best = choose(deps, costs, own, cap)
    assert best.time <= comm_all.time
    if np.all(cache_all.memory <= cap):
        assert best.time <= cache_all.time
    assert best.time <= greedy.time


def test_unit_costs_from_the_cost_model_drive_the_greedy() -> None:
    """gnnc.passes.cost.neutronstar.hybrid_unit_costs feeds Algorithm 4; a zero budget communicates everything, and the
    cost model's Hybrid formula on that selection is DepComm's."""
    rng = np.random.default_rng(0)
    p = 4
    v = np.full(p, 1000.0)
    hv = np.stack([v, v + 300, v + 900], axis=1)
    inp = CostInputs(v, v * 5, np.full(p, 300.0), np.full(p, 300.0), hv, hv * 5, (128.0, 64.0, 8.0),
                        preset("neutronstar-ecs"))
    shapes = [LayerShape(input_grad=False), LayerShape()]
    unit = hybrid_unit_costs(inp, 0, shapes)
    costs = UnitCosts(unit["t_v"], unit["t_e"], unit["t_c"], unit["t_x"], unit["row_bytes"], unit["edge_bytes"])
    # a replicated input row costs the first layer's work on it (its dense map runs before the aggregation: a
    # 128 x 64 product and its weight gradient, no other ops priced here), not 0 (session 26, neutronstar.py)
    assert costs.t_x == pytest.approx(2 * 2 * 128 * 64 / inp.profile.effective_gemm_rate)
    assert costs.t_c[0] > costs.t_c[1]  # 64 wide rows vs 8 wide rows
    deps = [random_deps(rng, 300, 2, p) for _ in range(p)]
    nothing = choose(deps, costs, unit["own_time"], memory_cap=0.0)
    assert not any(m.any() for m in nothing.cached)
    roomy = select(deps, costs, unit["own_time"], memory_cap=1e12)
    layer0 = [d.layer == 0 for d in deps]
    assert all(m[l0].all() for m, l0 in zip(roomy.cached, layer0))  # t_x far below t_c here
    values = hybrid_values(0, nothing.comm_received, nothing.comm_sent, nothing.recompute_rows,
                              nothing.recompute_edges, nothing.replicated_inputs)
    hyb = evaluate_cost(hybrid(0, 2, shapes), inp, values)
    assert hyb.bytes == pytest.approx(sum(nothing.comm_received.sum(axis=0) * [64 * 4 * 2, 8 * 4 * 2]))


def test_dependencies_from_graph_stats_unfold_the_in_trees() -> None:
    g = random_graph(60, 300, seed=2)
    parts = np.random.default_rng(0).integers(0, 3, g.num_nodes)
    stats = compute_stats(g, parts, 3)
    src, dst = g.edges("plain")
    walks = [np.ones(g.num_nodes)]  # walks[j][v]: in-walks of length j ending at v
    for _ in range(3):
        walks.append(np.bincount(dst, weights=walks[-1][src], minlength=g.num_nodes))
    for part in range(3):
        deps = dependencies_from_stats(stats, part, 3)
        ids = stats.dep_ids[stats.dep_ptr[part]:stats.dep_ptr[part + 1]]
        assert len(deps) == 3 * len(ids)
        np.testing.assert_array_equal(deps.owner, parts[deps.vertex])
        assert set(deps.vertex.tolist()) == set(ids.tolist())
        for j in range(3):
            np.testing.assert_allclose(deps.walks[deps.walk, j], walks[j][deps.vertex])
        for m in range(3):  # caching h^m_v: layer k computes distance m-1-k, from w_m input rows
            sel = deps.layer == m
            v = deps.vertex[sel]
            np.testing.assert_allclose(deps.sub_inputs[sel], walks[m][v])
            for k in range(3):  # the tables' column k, read through the unit costs of row k alone and edge k alone
                unit = np.eye(3)[k]
                want_rows = walks[m - 1 - k][v] if k < m else 0
                want_edges = walks[m - k][v] if k < m else 0
                rows = recompute_cost(deps, UnitCosts(unit, np.zeros(3), np.zeros(3), 0.0, np.zeros(4), 0.0))
                edges = recompute_cost(deps, UnitCosts(np.zeros(3), unit, np.zeros(3), 0.0, np.zeros(4), 0.0))
                np.testing.assert_allclose(rows[sel], want_rows)
                np.testing.assert_allclose(edges[sel], want_edges)
    with pytest.raises(ValueError, match="at least 4 layers"):
        dependencies_from_stats(stats, 0, 4)


def test_a_million_dependencies_in_seconds() -> None:
    rng = np.random.default_rng(1)
    workers, per_worker, layers = 8, 150_000, 2
    deps = [random_deps(rng, per_worker, layers, workers) for _ in range(workers)]
    costs = random_costs(rng, layers)
    t0 = time.perf_counter()
    result = choose(deps, costs, np.zeros((workers, layers)), memory_cap=1e6)
    assert time.perf_counter() - t0 < 10.0
    assert len(result.cached) == workers


def test_inconsistent_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="one entry per dependency"):
        Dependencies(np.array([0, 1]), np.array([1]), np.ones((2, 2)), np.arange(2))
    with pytest.raises(ValueError, match="layer by layer"):
        deps_of([1, 0], [1, 2], np.ones((2, 2)))
    with pytest.raises(ValueError, match="layers 0..1"):
        deps_of([0, 2], [1, 2], np.ones((2, 2)))
    with pytest.raises(ValueError, match="rows of walks"):
        Dependencies(np.array([0]), np.array([1]), np.ones((1, 2)), np.array([1]))
    with pytest.raises(ValueError, match="workers"):
        predict([hand_deps()], COSTS, np.zeros((2, 2)), [np.zeros(4, bool)])
    assert greedy_worker(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, int), np.zeros(0, int), 5.0, 2).size == 0
