"""The segment DP against brute force over every segmentation, its tie-breaking rule and its memory cap."""
from __future__ import annotations

import itertools
import random

import pytest

from gnnc.errors import GnncError
from gnnc.passes.planner import segment_dp
from gnnc.passes.planner.segment_dp import assignment_key, backtrack, best_label, fill_table, solve, solve_pure

SINGLE = ("a", "b")  # single-layer strategies: length-1 segments only
MULTI = ("m", "n")  # segment strategies: any length


def _split(v):
    return (float(v[0]), float(v[1])) if isinstance(v, tuple) else (float(v), 0.0)


def assignments(num_layers, strategies, seg_cost, trans, combine="sum"):
    """Every allowed assignment, from every segmentation (itertools.product over cut points) and every
    strategy per segment: yields (tie-breaking key, segments), the key starting with (time, memory)."""
    rank = {s: i for i, s in enumerate(strategies)}

    def comb(x, y):
        return x + y if combine == "sum" else max(x, y)

    for cuts in itertools.product((False, True), repeat=num_layers - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [num_layers]
        spans = list(zip(bounds, bounds[1:]))
        for strats in itertools.product(strategies, repeat=len(spans)):
            keys = [(s, e, x) for (s, e), x in zip(spans, strats)]
            if any(k not in seg_cost for k in keys):
                continue
            total, mem, prev = 0.0, 0.0, None
            for s, e, x in keys:  # the same left-to-right sums as the DP
                tt, tm = _split(trans.get((prev, x, s), 0.0))
                t, m = _split(seg_cost[(s, e, x)])
                total = total + tt + t
                mem = comb(comb(mem, tm), m)
                prev = x
            et, em = _split(trans.get((prev, None, num_layers), 0.0))
            total, mem = total + et, comb(mem, em)
            yield (total, mem, tuple(rank[x] for s, e, x in keys for _ in range(s, e)), len(keys),
                   tuple(e for _, e, _ in keys)), keys


def brute_force(num_layers, strategies, seg_cost, trans, cap, combine="sum"):
    feasible = [a for a in assignments(num_layers, strategies, seg_cost, trans, combine)
                if cap is None or a[0][1] <= cap]
    return min(feasible) if feasible else None


def random_instance(rng: random.Random, integer: bool):
    num_layers = rng.randint(1, 5)
    strategies = rng.sample(SINGLE + MULTI, rng.randint(1, 4))
    value = (lambda: float(rng.randint(0, 3))) if integer else (lambda: rng.uniform(0.0, 10.0))
    seg_cost = {}
    for start in range(num_layers):
        for end in range(start + 1, num_layers + 1):
            for s in strategies:
                if (s in SINGLE and end != start + 1) or rng.random() < 0.2:
                    continue
                seg_cost[(start, end, s)] = (value(), value())
    trans = {}
    for layer in range(num_layers + 1):
        for prev in [None, *strategies]:
            for nxt in [None, *strategies]:
                if rng.random() < 0.3 and (prev is None) == (layer == 0) and (nxt is None) == (layer == num_layers):
                    trans[(prev, nxt, layer)] = (value(), value()) if rng.random() < 0.5 else value()
    return num_layers, strategies, seg_cost, trans


@pytest.mark.parametrize("integer", [False, True], ids=["random-costs", "tied-costs"])
@pytest.mark.parametrize("combine", ["sum", "max"])
def test_dp_equals_brute_force(integer: bool, combine: str) -> None:
    rng = random.Random(1234 + integer + 2 * (combine == "max"))
    checked = 0
    for _ in range(150):
        num_layers, strategies, seg_cost, trans = random_instance(rng, integer)
        memories = [key[1] for key, _ in assignments(num_layers, strategies, seg_cost, trans, combine)]
        # a cap among the assignments' memories, so it binds and also lets some through
        cap = rng.choice([None, rng.uniform(min(memories), max(memories)) if memories else 1.0])
        expected = brute_force(num_layers, strategies, seg_cost, trans, cap, combine)
        if expected is None:
            with pytest.raises(GnncError):
                solve(num_layers, strategies, seg_cost, trans, cap, combine)
            continue
        result = solve(num_layers, strategies, seg_cost, trans, cap, combine)
        got = [(s.start, s.end, s.strategy) for s in result.best.segments]
        assert got == expected[1], (num_layers, strategies, seg_cost, trans, cap)
        assert (result.best.time, result.best.memory) == expected[0][:2]
        checked += 1
    assert checked > 60  # most instances have an answer


def test_result_does_not_depend_on_dict_order() -> None:
    rng = random.Random(7)
    for _ in range(40):
        num_layers, strategies, seg_cost, trans = random_instance(rng, integer=True)
        try:
            first = solve(num_layers, strategies, seg_cost, trans)
        except GnncError:
            continue
        items = list(seg_cost.items())
        rng.shuffle(items)
        titems = list(trans.items())
        rng.shuffle(titems)
        again = solve(num_layers, strategies, dict(items), dict(titems))
        assert again.best == first.best
        assert again.alternatives == first.alternatives


def test_ties_break_by_time_then_memory_then_strategy_order_then_fewer_segments() -> None:
    seg = {(0, 1, "a"): (1, 1), (0, 1, "b"): (1, 1), (1, 2, "a"): (1, 1), (1, 2, "b"): (1, 1)}
    assert solve(2, ["a", "b"], seg).best.strategies == ("a", "a")
    assert solve(2, ["b", "a"], seg).best.strategies == ("b", "b")  # the caller's order decides
    seg2 = {**seg, (0, 1, "b"): (1, 0.5)}  # same time, less memory wins over the preferred strategy
    assert solve(2, ["a", "b"], seg2).best.strategies == ("b", "a")
    # one segment of m over two layers vs two of m: equal time, memory and strategies -> fewer segments
    seg3 = {(0, 2, "m"): (2, 2), (0, 1, "m"): (1, 1), (1, 2, "m"): (1, 1)}
    assert [(s.start, s.end) for s in solve(2, ["m"], seg3).best.segments] == [(0, 2)]
    # equal everything but where the segments end: the shorter first segment
    seg4 = {(0, 1, "m"): (1, 1), (1, 3, "m"): (2, 2), (0, 2, "m"): (2, 2), (2, 3, "m"): (1, 1)}
    assert [(s.start, s.end) for s in solve(3, ["m"], seg4).best.segments] == [(0, 1), (1, 3)]


def test_memory_cap_needs_the_slower_prefix() -> None:
    # cell (2, m) is reached by m[0:2] (fast, 10 bytes) and by a then m[1:2] (slow, 2 bytes);
    # only the slow one leaves room for the last layer under a cap of 8
    seg = {(0, 2, "m"): (1, 10), (0, 1, "a"): (2, 1), (1, 2, "m"): (1, 1), (2, 3, "a"): (1, 5)}
    free = solve(3, ["a", "m"], seg)
    assert free.best.strategies == ("m", "m", "a") and free.best.memory == 15
    capped = solve(3, ["a", "m"], seg, memory_cap=8)
    assert capped.best.strategies == ("a", "m", "a")
    assert (capped.best.time, capped.best.memory) == (4, 7)
    assert len(capped.table[(2, "m")]) == 1 and len(free.table[(2, "m")]) == 2  # both kept without a cap
    with pytest.raises(GnncError, match="least memory any assignment needs is 7"):
        solve(3, ["a", "m"], seg, memory_cap=6)
    # the alternatives still show the fastest, marked as not fitting, after those that fit
    assert capped.alternatives[0] == capped.best
    assert capped.alternatives[-1].strategies == ("m", "m", "a") and not capped.alternatives[-1].fits(8)


def test_transitions_are_charged_between_segments_and_at_the_ends() -> None:
    seg = {(0, 1, "a"): (1, 0), (0, 1, "b"): (1.5, 0), (1, 2, "a"): (3, 0), (1, 2, "b"): (1, 0)}
    assert solve(2, ["a", "b"], seg).best.strategies == ("a", "b")
    trans = {("a", "b", 1): 2.0}  # switching layouts costs more than it saves
    best = solve(2, ["a", "b"], seg, trans).best
    assert best.strategies == ("b", "b") and best.time == 2.5
    trans[(None, "b", 0)] = 10.0  # b cannot take the input as it comes
    assert solve(2, ["a", "b"], seg, trans).best.strategies == ("a", "a")
    end = solve(2, ["a", "b"], seg, {("b", None, 2): (5.0, 3.0)}).best  # nor hand b's output to the loss
    assert end.strategies == ("a", "a")


def test_uncovered_layer_is_an_error() -> None:
    with pytest.raises(GnncError, match="covers layers 0..2"):
        solve(3, ["a"], {(0, 1, "a"): (1, 0), (2, 3, "a"): (1, 0)})


def test_backtrack_and_alternatives() -> None:
    seg = {(0, 1, "a"): (1, 1), (1, 2, "a"): (1, 1), (0, 2, "m"): (3, 3), (0, 1, "b"): (0.5, 2),
           (1, 2, "b"): (4, 1)}
    result = solve(2, ["a", "b", "m"], seg, {("b", "a", 1): 1.0})
    table = fill_table(2, ["a", "b", "m"], seg, {("b", "a", 1): 1.0}, None)
    cell, index = best_label(table, 2, ["a", "b", "m"])
    assert backtrack(table, cell, index, seg) == result.best
    names = [a.strategies for a in result.alternatives]
    assert names[0] == result.best.strategies == ("a", "a")
    assert ("m", "m") in names and ("b", "b") in names
    assert ("b", "a") not in names  # 2.5 s and 3 bytes: (a, a) ends with a and beats it on both
    for a in result.alternatives:  # each prediction is the sum of its parts
        parts = sum(s.time for s in a.segments) + (1.0 if a.strategies == ("b", "a") else 0.0)
        assert a.time == pytest.approx(parts)
    assert solve_pure(2, "m", seg).strategies == ("m", "m")
    rank = {"a": 0, "b": 1, "m": 2}
    keys = [assignment_key(a, rank) for a in result.alternatives]
    assert keys == sorted(keys)


def test_deep_models_plan_quickly(monkeypatch) -> None:
    """GCNII depth: 64 layers, five single-layer strategies and a segment strategy of any length. Its work is
    counted, not timed (a wall-time bound failed under load): 8,131,923 label comparisons at 8240f0a, about 5
    CPU-s; a DP that compares a quarter more than that is slower on every machine."""
    rng = random.Random(3)
    num_layers = 64
    seg = {}
    for start in range(num_layers):
        for s in ("a", "b", "c", "d", "e"):
            seg[(start, start + 1, s)] = (rng.uniform(1, 2), rng.uniform(1, 2))
        for end in range(start + 1, num_layers + 1):
            seg[(start, end, "m")] = (1.2 * (end - start), 3.0 * (end - start) ** 0.5)
    trans = {(p, q, layer): 0.1 for p in "abcdem" for q in "abcdem" if p != q for layer in range(1, num_layers)}
    comparisons = 0
    dominates = segment_dp._dominates

    def counted(a, b) -> bool:
        nonlocal comparisons
        comparisons += 1
        return dominates(a, b)

    monkeypatch.setattr(segment_dp, "_dominates", counted)
    result = solve(num_layers, list("abcdem"), seg, trans, memory_cap=150.0)
    assert comparisons <= 10_000_000, comparisons
    assert result.best.memory <= 150.0 and len(result.best.strategies) == num_layers
