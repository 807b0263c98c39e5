"""Pricing a hybrid segment: NeutronStar's Algorithm 4, communicate-all or cache-all, whichever predicts less.

Why this module exists: choose-strategy prices a `hybrid` segment with the
selection select-hybrid will make, and select-hybrid makes it; both call
`select` here, which runs Algorithm 4 (gnnc.passes.planner.hybrid_greedy) on
the partition's statistics with unit costs from the cost model
(gnnc.passes.cost.neutronstar.hybrid_unit_costs) and keeps the cheapest of its
selection, fetching everything and caching everything.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.passes.cost.evaluation import compile_cost
from gnnc.passes.cost.neutronstar import DepcacheSpans, hybrid_unit_costs, hybrid_values, hybrid_values_of
from gnnc.passes.cost.registry import planner_cost, segment_cost, user_cost
from gnnc.passes.planner import hybrid_greedy as hg


@dataclass
class Selection:
    """A hybrid segment's selection: the cached ids per layer and worker, and its predicted cost."""

    cached: dict[int, list[np.ndarray]] | None  # None where the caller did not ask for them (`select_spans`)
    source: str  # "greedy" (Algorithm 4), "communicate-all" or "cache-all"
    values: dict[Any, np.ndarray] | None  # the hybrid formula's symbols (cost.neutronstar.hybrid_values); None
    # when the formula that priced it needs none (cache-all, priced as depcache)
    time: float
    received: np.ndarray  # [workers, layers] rows communicated
    value: Any = None  # the formula's cost.evaluation.CostValue with this selection
    start: int = 0
    end: int = 0
    shapes: tuple[Any, ...] = ()  # the segment's layers' shapes
    mu: np.ndarray | None = None  # per worker, equation 3's factor of Algorithm 4 (its greedy's, with ids only)

    @property
    def formula(self) -> Any:
        """The Cost that priced it: the hybrid formula, or depcache's with its empty halo for cache-all (a user's
        DepCache formula as it is; built when read: the planner prices a selection numerically,
        gnnc.passes.cost.neutronstar.hybrid_value)."""
        if self.source != "cache-all":
            return segment_cost("hybrid", self.start, self.end, self.shapes)
        if user_cost("depcache"):
            return planner_cost("depcache", self.start, self.end, self.shapes)
        return segment_cost("depcache", self.start, self.end, self.shapes, halo=True)


@dataclass
class _StartRuns:
    """One span start's Algorithm 4 runs (`hybrid_greedy.PaperRun`, one per worker), kept for the next
    `select_spans` on the same statistics, graph and parts: select-hybrid selects the chosen span after
    choose-strategy ran its start for every span. Weak references: it never keeps a compile's graph alive."""

    of: tuple[weakref.ref, weakref.ref, weakref.ref]  # stats, graph, parts
    start: int
    cap: float
    costs: hg.UnitCosts  # the unit costs the runs were made with, over their layers
    runs: list[hg.PaperRun]

    def serves(self, stats, graph, parts, start: int, cap: float, costs: hg.UnitCosts) -> bool:
        """Whether these runs are the ones `costs` (over as many or fewer layers) would make: a run decides
        layer after layer, so a shorter span's is the prefix of a longer one's with the same first costs."""
        layers = len(costs.t_c)
        mine = self.costs
        return (all(r() is o for r, o in zip(self.of, (stats, graph, parts))) and self.start == start
                and self.cap == cap and layers <= len(mine.t_c) and mine.t_x == costs.t_x
                and mine.edge_bytes == costs.edge_bytes
                and all(np.array_equal(np.asarray(a)[:len(b)], b) for a, b in
                        ((mine.t_v, costs.t_v), (mine.t_e, costs.t_e), (mine.t_c, costs.t_c),
                         (mine.row_bytes, costs.row_bytes))))


_last_runs: list[_StartRuns] = []  # the last start select_spans ran (at most one: each holds tables per worker)


def select(stats, inputs, shapes, memory_cap: float | None, start: int, end: int,
           cache_all_value=None, graph=None, parts=None, rule: str | None = None, processes: int = 1) -> Selection:
    """Algorithm 4 over graph layers [start, end), unless communicating or caching everything predicts less.

    Each candidate is priced as the runtime will execute it, so the segment
    the planner prices is the one that runs: Algorithm 4's selection and
    communicate-all (exactly depcomm there) by the planner's own
    `cost.neutronstar.hybrid` formula; cache-all by DepCache's formula with its
    empty halo's buffers (`depcache(halo=True)`: the plan still runs each layer's
    halo and split aggregation, and measured slower than DepCache),
    because caching every dependency gives each worker DepCache's rows (the
    nested L-hop neighbourhood, gnnc.plan.rows) and an empty halo, and the
    per-dependency subtrees `hybrid_greedy.predict` sums for it count a row
    shared by two subtrees twice (an upper bound, not a price; Algorithm 4's
    own selection under the rule "paper" counts V_rep's rows once). Hence a
    Hybrid segment never predicts more than DepComm, nor than DepCache where
    DepCache fits `memory_cap` (issue 16). Ties keep the
    greedy's. `cache_all_value`: cache-all's value on [start, end) when the caller has priced it already
    (`depcache(halo=True)`'s, or a user's DepCache formula's). The selections are priced numerically
    (`hybrid_values_of`), without
    building the segment's formula (`Selection.formula` builds it when read).
    `rule` (hybrid_greedy.RULES): "paper", Algorithm 4 as NeutronStar writes it (V_rep excluded from later
    subtrees, so a row shared by two cached subtrees is counted once, as the runtime computes it; the memory
    stop ending the algorithm), its subtrees measured on `graph` split by `parts`; "walks", the earlier
    reading (each dependency's unfolded tree alone, a layer ended at its first refusal), kept to measure the
    two (benchmarks/RESULTS-seeds.md, "NeutronStar Algorithm 4"); None: hybrid_greedy.DEFAULT_RULE.
    `processes`: the workers' runs of Algorithm 4 spread over up to this many processes (hybrid_greedy.paper_runs:
    the same runs; the compile's `ctx.threads`).
    """
    known = {} if cache_all_value is None else {(start, end): cache_all_value}
    [best] = select_spans(stats, inputs, shapes, memory_cap, [(start, end)], known, with_ids=True, graph=graph,
                          parts=parts, rule=rule, processes=processes)
    return best


def select_spans(stats, inputs, shapes, memory_cap: float | None, spans: Sequence[tuple[int, int]],
                 cache_all_values: Mapping[tuple[int, int], Any] | None = None,
                 with_ids: bool = False, graph=None, parts=None, rule: str | None = None,
                 processes: int = 1) -> list[Selection]:
    """`select` on each of `spans` ((start, end) over the model's layers, `shapes` every layer's), the selections
    of every span priced together (`hybrid_values_of`: one numpy call per layer, not per span and layer).
    `with_ids`: keep each selection's cached ids (`Selection.cached`, what select-hybrid writes); the planner
    needs only the values (None there: a deep model's spans would hold their dependencies all at once).
    `processes`: as `select`'s."""
    rule = rule or hg.DEFAULT_RULE
    if rule not in hg.RULES:
        raise ValueError(f"hybrid rule {rule!r}: one of {', '.join(hg.RULES)}")
    if rule == "paper" and (graph is None or parts is None):
        raise ValueError("Algorithm 4 as written measures the subtrees on the graph: pass graph and parts")
    world = inputs.workers
    trees = hg.workers_trees(graph, stats.view, parts, world) if rule == "paper" else None
    cap = memory_cap if memory_cap else float("inf")
    units: dict[Any, Any] = {}  # each layer's unit costs, shared by the spans holding it
    runs: dict[int, list[Any]] = {}  # per start, its workers' runs: PaperRun with `with_ids`, else RunTotals
    longest_deps: dict[int, list[hg.Dependencies]] = {}
    traffic: dict[int, hg.StartTraffic] = {}
    if trees is not None:
        _start_runs(stats, inputs, shapes, spans, graph, parts, trees, cap, with_ids, processes, units, runs,
                    longest_deps, traffic)
    cache_all_values = dict(cache_all_values or {})
    depcache = None
    requests: list[tuple[int, int, dict[Any, np.ndarray]]] = []
    found = []  # per span: [(source, values or None, request index or None, comm_received, cached ids or None, mu)]
    for start, end in spans:
        unit = hybrid_unit_costs(inputs, start, shapes[start:end], cache=units)
        costs = hg.UnitCosts(unit["t_v"], unit["t_e"], unit["t_c"], unit["t_x"], unit["row_bytes"],
                             unit["edge_bytes"])
        if trees is not None:
            if with_ids:  # a span's dependencies are the first of its start's longest span's (built once per start)
                deps = [hg.dependencies_prefix(d, end - start) for d in longest_deps[start]]
                greedy = hg.select_paper(deps, trees, costs, unit["own_time"], cap, runs=runs[start])
                everything = hg.predict(deps, costs, unit["own_time"], [np.zeros(len(d), bool) for d in deps],
                                        source="communicate-all")
            else:  # the planner's spans: their rows counted off the start's (hybrid_greedy.StartTraffic)
                greedy = hg.select_paper_prefix(traffic[start], runs[start], costs, unit["own_time"])
                everything = hg.communicate_all(traffic[start], costs, unit["own_time"])
        else:
            deps = [hg.dependencies_from_stats(stats, r, end - start) for r in range(world)]
            greedy = hg.select(deps, costs, unit["own_time"], cap)
            everything = hg.predict(deps, costs, unit["own_time"], [np.zeros(len(d), bool) for d in deps],
                                    source="communicate-all")
        # cache-all is priced by DepCache's formula: of its own prediction only the (empty) fetches are read
        candidates = [greedy, everything, None]
        mine = []
        for cand in candidates:
            ids = None
            if with_ids:
                masks = [np.ones(len(d), bool) for d in deps] if cand is None else cand.cached
                # a layer's dependencies are consecutive (hybrid_greedy.Dependencies): sliced, not masked out of
                # every layer's (32 passes over 570,000 dependencies per worker and selection, GCNII x32 on the SBM)
                bounds = [np.searchsorted(dep.layer, np.arange(end - start + 1)) for dep in deps]
                ids = {start + m: [np.sort(np.asarray(dep.vertex)[b[m]:b[m + 1]][np.asarray(mask)[b[m]:b[m + 1]]])
                                   .astype(np.int64) for dep, mask, b in zip(deps, masks, bounds)]
                       for m in range(end - start)}
            if cand is None:
                mine.append(("cache-all", None, None, np.zeros((world, end - start)), ids, None))
                if (start, end) not in cache_all_values:  # a user's DepCache formula prices it where one is
                    if user_cost("depcache"):
                        cache_all_values[start, end] = compile_cost(
                            planner_cost("depcache", start, end, shapes[start:end]))(inputs)
                    else:  # DepCache's rows with the empty halo's buffers (neutronstar.depcache's `halo`)
                        depcache = depcache or DepcacheSpans(inputs, shapes, halo=True)
                        cache_all_values[start, end] = depcache.value(start, end)
                continue
            values = hybrid_values(start, cand.comm_received, cand.comm_sent, cand.recompute_rows,
                                   cand.recompute_edges, cand.replicated_inputs)
            requests.append((start, end, values))
            mine.append((cand.source, values, len(requests) - 1, cand.comm_received, ids, cand.mu))
        found.append(mine)
    priced = hybrid_values_of(inputs, shapes, requests)
    out = []
    for (start, end), mine in zip(spans, found):
        best: Selection | None = None
        for source, values, request, received, ids, mu in mine:
            value = cache_all_values[start, end] if request is None else priced[request]
            if request is None and value.memory > cap:
                continue  # the DP would refuse the segment: leave the choice to the selections that fit
            if best is None or value.time < best.time:
                best = Selection(ids, source, values, value.time, received, value, start, end,
                                 tuple(shapes[start:end]), mu)
        assert best is not None
        out.append(best)
    return out


def _start_runs(stats, inputs, shapes, spans: Sequence[tuple[int, int]], graph, parts, trees: list[hg.InTrees],
                cap: float, with_ids: bool, processes: int, units: dict[Any, Any], runs: dict[int, list[Any]],
                longest_deps: dict[int, list[hg.Dependencies]], traffic: dict[int, hg.StartTraffic]) -> None:
    """Algorithm 4's runs of every start of `spans`, into `runs`, `longest_deps` and (without `with_ids`) `traffic`.

    Algorithm 4 decides layer after layer: a span's selection is the first layers of the longest span from its
    start, so each start runs once per worker (hybrid_greedy.PaperRun), over its longest span. Every start's runs
    are made by one `hybrid_greedy.starts_runs` call (one fork for all of them where they fork: no core waits
    between starts). Without `with_ids` (the planner's spans) a start's runs come back as their totals and its
    StartTraffic is counted where each run is made, so this process holds no rep_when table but the last start's,
    kept whole for the next select (`_last_runs`, what select-hybrid reads); with `with_ids` they come back whole
    (select-hybrid's masks read rep_when: one start, its span's)."""
    starts = list(dict.fromkeys(a for a, _ in spans))  # in the order the spans first name them
    if not starts:
        return
    longest = {a: max(b for a2, b in spans if a2 == a) for a in starts}
    # a start's dependencies depend on its span's length only: a shorter one's are the first entries of the
    # deepest's (dependencies_prefix, views), built once per worker for every start
    deepest = max(longest[a] - a for a in starts)
    built = [hg.dependencies_from_stats(stats, r, deepest) for r in range(len(trees))]
    full = {}
    for a in starts:
        unit = hybrid_unit_costs(inputs, a, shapes[a:longest[a]], cache=units)
        full[a] = hg.UnitCosts(unit["t_v"], unit["t_e"], unit["t_c"], unit["t_x"], unit["row_bytes"],
                               unit["edge_bytes"])
        longest_deps[a] = [hg.dependencies_prefix(d, longest[a] - a) for d in built]
    # the runs the last select made serve its start again (the first start only: a start run here replaces them)
    served = starts[0] if _last_runs and _last_runs[0].serves(stats, graph, parts, starts[0], cap,
                                                                full[starts[0]]) else None
    if served is not None:
        runs[served] = _last_runs[0].runs
        if not with_ids:
            traffic[served] = hg.start_traffic(longest_deps[served], runs[served])
    todo = [a for a in starts if a != served]
    if not todo:
        return
    jobs = [hg.StartJob(longest_deps[a], full[a], cap, longest[a] - a, whole=with_ids or a == todo[-1],
                        traffic=not with_ids) for a in todo]
    for a, (made, counted) in zip(todo, hg.starts_runs(trees, jobs, processes)):
        runs[a] = made
        if counted is not None:
            traffic[a] = counted
    _last_runs.clear()  # the last start run here, whole (one start's tables per worker at most)
    _last_runs.append(_StartRuns((weakref.ref(stats), weakref.ref(graph), weakref.ref(parts)), todo[-1], cap,
                                 full[todo[-1]], runs[todo[-1]]))
