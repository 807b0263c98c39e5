"""NeutronStar's Algorithm 4 as written (issue 38 item 5): V_rep, the re-measure, and the memory stop.

Section 4.2's Algorithm 4 keeps the replicated multi-hop dependencies in V_rep (line 2) and measures every
later subtree without them (lines 6 and 10), so a vertex replicated for one cached dependency is not counted
again for the next (line 13); it keeps popping after a refusal (line 8); and when the caches outgrow the memory
S it drops the dependency and returns (lines 14-15), so no later layer caches anything. gnnc's earlier reading
costed each dependency's unfolded tree alone and ended only the layer at the memory limit
(`hybrid_greedy.greedy_worker`, the "walks" rule).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.passes.planner import hybrid_greedy as hg
from gnnc.passes.planner.hybrid_greedy import InTrees, UnitCosts, greedy_paper_worker, greedy_worker


def trees(edges: list[tuple[int, int]], n: int, owned: list[int]) -> InTrees:
    """One worker's InTrees from (src, dst) edges over n vertices."""
    src = np.array([s for s, _ in edges], dtype=np.int64)
    dst = np.array([d for _, d in edges], dtype=np.int64)
    order = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    mask = np.zeros(n, dtype=bool)
    mask[owned] = True
    return InTrees(indptr, src[order], mask)


# Worker 0 owns vertex 0; 1 and 2 (another worker's) are its remote in-neighbours; 3 feeds both 1 and 2, 4 feeds 2.
SHARED = trees([(1, 0), (2, 0), (3, 1), (3, 2), (4, 2)], 5, [0])
# its dependencies over a 2-layer segment: h^0 and h^1 of vertices 1 and 2
LAYER, VERTEX = np.array([0, 0, 1, 1]), np.array([1, 2, 1, 2])


def test_a_vertex_replicated_for_one_subtree_is_not_counted_again() -> None:
    """Caching h^1 of vertex 1 replicates the input rows {1, 3} and h^1_1 (t_r = 0.5 + 0.25 + 2 x 1 = 2.75);
    h^1 of vertex 2 alone would replicate {2, 3, 4} (t_r = 0.5 + 2 x 0.25 + 3 = 4.0 >= t_c = 3.5: refused),
    but 3 is in V_rep by then, so line 10 measures 3.0 < 3.5 and caches it (line 11). The inputs replicated
    are {1, 2, 3, 4}: 3 once, not twice."""
    costs = UnitCosts(t_v=np.array([0.5, 0.5]), t_e=np.array([0.25, 0.25]), t_c=np.array([0.05, 3.5]), t_x=1.0,
                      row_bytes=np.array([8.0, 4.0, 4.0]), edge_bytes=2.0)
    cached, rep = greedy_paper_worker(SHARED, LAYER, VERTEX, costs, budget=1e9, layers=2)
    assert cached[2] and cached[3]  # both layer-1 dependencies
    assert rep.rows.tolist() == [4, 2, 0]  # inputs {1, 2, 3, 4}; h^1 of 1 and 2
    assert rep.edges.tolist() == [0, 3, 0]  # 1's in-edge and 2's two
    assert rep.memory == 4 * 8.0 + 2 * 4.0 + 3 * 2.0
    assert rep.time == pytest.approx(2.75 + 3.0)  # each replicated vertex paid once
    # the layer-0 dependencies were refused (t_x = 1 >= t_c = 0.05), but layer 1's subtrees hold their rows, so
    # the worker fetches nothing at layer 0 either: they count as cached
    assert cached[0] and cached[1]
    # the walks rule costs 2's tree alone (1.0 + its 2 in-walks x 1 = 3.0) and counts 3 in both trees
    walks = hg.Dependencies(LAYER, VERTEX, np.array([[1.0, 1.0], [1.0, 2.0]]), np.array([0, 1, 0, 1]))  # w_0, w_1
    assert hg.recompute_cost(walks, costs)[2:].sum() == pytest.approx(1.75 + 3.0)


def test_the_paper_rule_keeps_popping_after_a_refusal() -> None:
    """Line 8 pops until the queue is empty: with t_c = 3.0, vertex 2's subtree (line 6: 4.0, popped last)
    is refused, vertex 1's is not; nothing stops the layer before it pops both."""
    costs = UnitCosts(t_v=np.array([0.5, 0.5]), t_e=np.array([0.25, 0.25]), t_c=np.array([0.05, 3.0]), t_x=1.0,
                      row_bytes=np.array([8.0, 4.0, 4.0]), edge_bytes=2.0)
    cached, rep = greedy_paper_worker(SHARED, LAYER, VERTEX, costs, budget=1e9, layers=2)
    assert cached.tolist() == [True, False, True, False]  # (0, 1) is covered by (1, 1)'s subtree
    assert rep.rows.tolist() == [2, 1, 0]


def test_the_memory_stop_ends_the_algorithm_not_the_layer() -> None:
    """Layer 0 caches vertex 1's input row (10 bytes); vertex 2's would make 20 > S = 15: lines 14-15 drop it
    and return, so layer 1 caches nothing, although h^1_1 (1 byte: its input row is held already) would fit.
    The walks rule ends only layer 0 there and caches h^1_1 in layer 1."""
    alone = trees([(1, 0), (2, 0)], 3, [0])
    costs = UnitCosts(t_v=np.zeros(2), t_e=np.zeros(2), t_c=np.array([1.0, 1.0]), t_x=0.1,
                      row_bytes=np.array([10.0, 1.0, 1.0]), edge_bytes=0.0)
    cached, rep = greedy_paper_worker(alone, LAYER, VERTEX, costs, budget=15.0, layers=2)
    assert cached.tolist() == [True, False, False, False]
    assert rep.memory == 10.0 and rep.rows.tolist() == [1, 0, 0]
    deps = hg.Dependencies(LAYER, VERTEX, np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([0, 1, 0, 1]))  # no in-edges
    walks = greedy_worker(hg.recompute_cost(deps, costs), hg.communicate_cost(deps, costs),
                          hg.cache_memory(deps, costs), LAYER, VERTEX, 15.0, 2)
    assert walks.tolist() == [True, False, True, True]
    # with room for everything, the paper's rule caches all four
    everything, _ = greedy_paper_worker(alone, LAYER, VERTEX, costs, budget=1e9, layers=2)
    assert everything.all()


def test_the_runtime_holds_v_rep_and_fetches_the_rest() -> None:
    """The paper's rule predicts what runs: with its selection's cached ids, the rows each worker holds beyond
    its own at each level (gnnc.plan.rows, what the runtime computes) are V_rep's, and the rows it fetches per
    layer (its halo) are the dependencies left uncached, on a random graph and 3 workers, 3 layers."""
    from gnnc.passes.partition.stats import compute_stats
    from gnnc.plan.rows import all_row_sets, layer_specs

    graph = random_graph(300, 1200, f=16, seed=4)
    world, layers = 3, 3
    parts = np.random.default_rng(0).integers(0, world, graph.num_nodes)
    plan = api.compile(api.load_model(EXAMPLES / "gcnii.gnn", layers=layers, hidden=8), graph, workers=world,
                       strategy="hybrid")
    specs = layer_specs(plan.program)
    stats = compute_stats(graph, parts, layers, specs[0].view, num_parts=world)
    costs = UnitCosts(t_v=np.full(layers, 1.0), t_e=np.full(layers, 0.2), t_c=np.array([0.4, 2.2, 4.0]), t_x=0.3,
                      row_bytes=np.full(layers + 1, 4.0), edge_bytes=1.0)
    deps = [hg.dependencies_from_stats(stats, r, layers) for r in range(world)]
    t = [hg.in_trees(graph, stats.view, parts, r) for r in range(world)]
    result = hg.select_paper(deps, t, costs, np.zeros((world, layers)), 1e12)
    assert any(m.any() and not m.all() for m in result.cached)  # a mixed selection
    assert all(0 < mu <= 1 for mu in result.mu)
    cached = {m: [np.sort(d.vertex[c & (d.layer == m)]) for d, c in zip(deps, result.cached)] for m in range(layers)}
    rows = all_row_sets(graph, parts, world, specs, cached)
    for r in range(world):
        _, rep = greedy_paper_worker(t[r], deps[r].layer, deps[r].vertex, costs, 1e12, layers)
        owned = parts == r
        held = [int((rows[r].held_in[k] & ~owned).sum()) for k in range(layers)]
        assert held == rep.rows[:layers].astype(int).tolist(), r
        assert [len(h) for h in rows[r].halos] == result.comm_received[r].astype(int).tolist(), r
        assert result.replicated_inputs[r] == rep.rows[0] and result.memory[r] == rep.memory


def test_every_span_counted_off_its_start_equals_each_span_apiece() -> None:
    """The planner prices every span from a start off one set of runs (hybrid_greedy.StartTraffic, issue 36):
    each span's Algorithm 4 and communicate-all predictions equal select_paper's and predict's of that span's
    own dependencies, to the bit (a random graph, 3 workers, a 5-layer start whose caching stops midway)."""
    from gnnc.passes.partition.stats import compute_stats

    graph = random_graph(300, 1500, f=16, seed=5)
    world, layers = 3, 5
    parts = np.random.default_rng(1).integers(0, world, graph.num_nodes)
    stats = compute_stats(graph, parts, layers, "plain", num_parts=world)
    costs = UnitCosts(t_v=np.linspace(0.8, 1.2, layers), t_e=np.full(layers, 0.2),
                      t_c=np.array([0.4, 2.2, 4.0, 6.0, 9.0]), t_x=0.3, row_bytes=np.full(layers + 1, 4.0),
                      edge_bytes=1.0)
    longest = [hg.dependencies_from_stats(stats, r, layers) for r in range(world)]
    t = [hg.in_trees(graph, "plain", parts, r) for r in range(world)]
    for budget in (1e12, 300.0):  # caching everything worth it, and the memory stop of lines 14-15
        runs = [hg.paper_run(t[r], d.layer, d.vertex, costs, budget, layers) for r, d in enumerate(longest)]
        traffic = hg.start_traffic(longest, runs)
        for m in range(1, layers + 1):
            span = UnitCosts(costs.t_v[:m], costs.t_e[:m], costs.t_c[:m], costs.t_x, costs.row_bytes[:m + 1],
                             costs.edge_bytes)
            own = np.random.default_rng(m).random((world, m))
            deps = [hg.dependencies_prefix(d, m) for d in longest]
            pairs = [(hg.select_paper(deps, t, span, own, budget, runs=runs),
                      hg.select_paper_prefix(traffic, runs, span, own)),
                     (hg.predict(deps, span, own, [np.zeros(len(d), bool) for d in deps], source="communicate-all"),
                      hg.communicate_all(traffic, span, own))]
            for each, counted in pairs:
                assert each.time == counted.time and each.source == counted.source, (budget, m)
                for field in ("layer_times", "memory", "comm_received", "comm_sent", "recompute_rows",
                              "recompute_edges", "replicated_inputs"):
                    assert np.array_equal(getattr(each, field), getattr(counted, field)), (budget, m, field)
            assert pairs[0][0].comm_received.sum() < pairs[1][0].comm_received.sum()  # Algorithm 4 cached some
