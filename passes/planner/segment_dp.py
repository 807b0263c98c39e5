"""The planner's choice: a dynamic program over segments of layers (Alpa-style, pure).

Why this module exists: a model's layers need not all run one strategy.
docs/design.md section 5.6 cuts the layers 0..L-1 into contiguous segments, each
run with one strategy (single-layer strategies are segments of length one;
DepCache and Hybrid may span several), pays a transition wherever the
layout changes between segments, and stays under a per-worker memory cap.
Like Alpa's stage construction (alpa/pipeline_parallel/stage_construction.py)
the search is a pure function of cost tables, so it is tested against a
brute-force enumeration and knows nothing of the IR or the cost formulas.

Inputs:
  seg_cost[(start, end, strategy)] = (time, memory) for the segment of
      layers [start, end); a missing key means the segment is not allowed.
  transition_cost[(prev, next, layer)] = time (or (time, memory)) to go
      from a segment running `prev` to one running `next` that starts at
      `layer`; prev None is the model's input (layer 0), next None its
      output (layer L). A missing key costs nothing.
  memory_cap: the most memory an assignment may use (None: no cap).

An assignment's time is the sum, left to right, of its segments' times and
its transitions'. Its memory is the sum of its segments' (and transitions')
memory: every segment's activations stay alive until its backward pass, so
they add up (`memory_combine="max"` treats memory as a per-segment peak
instead).

Tie-breaking rule (deterministic, independent of dict order): the smallest
time wins; among equal times, the smallest memory; then the assignment whose
per-layer strategy list comes first when each strategy is replaced by its
position in `strategies` (earlier strategies preferred, layer 0 first);
then the one with fewer segments; then the one whose segment ends, read
left to right, come first (shorter early segments). Times are compared exactly, as floats
summed in the same left-to-right order by the DP and by any enumeration.
"""
from __future__ import annotations

import bisect
import functools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gnnc.errors import GnncError

SegKey = tuple[int, int, str]
TransKey = tuple[str | None, str | None, int]


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    strategy: str
    time: float
    memory: float


@dataclass(frozen=True)
class Assignment:
    """Segments covering layers 0..L-1, with the total time and memory (transitions included)."""

    segments: tuple[Segment, ...]
    time: float
    memory: float

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategy of every layer."""
        return tuple(s.strategy for s in self.segments for _ in range(s.start, s.end))

    def fits(self, memory_cap: float | None) -> bool:
        return memory_cap is None or self.memory <= memory_cap


@dataclass(frozen=True)
class Label:
    """One entry of a DP cell: a partial assignment of layers 0..end-1, by its last segment.

    time, memory: totals so far (the last segment's transition from its
    predecessor included). segments: how many. segment: the last
    segment (start, end, strategy). prev: (cell, index) of the label it
    extends, or None for the first segment. position: the last segment's strategy's position in the
    strategies. parent: the label it extends (what `prev` points at), read only to build `order` and `ends`.

    `order` (the per-layer strategy positions so far) and `ends` (where each segment ends) are built from the
    parents when first read: the tie-breaking order reads them only on an exact (time, memory) tie, and
    building an O(L) tuple for every extension was most of a deep model's DP (8,454 extensions of up to 64
    layers for the 64-layer GCNII example on Cora x4, 5 fills).
    """

    time: float
    memory: float
    segments: int
    segment: SegKey
    prev: tuple[tuple[int, str], int] | None
    position: int = field(default=0, compare=False)
    parent: Label | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def order(self) -> tuple[int, ...]:
        """The per-layer strategy positions of layers 0..end-1."""
        start, end, _ = self.segment
        return (self.parent.order if self.parent else ()) + (self.position,) * (end - start)

    @functools.cached_property
    def ends(self) -> tuple[int, ...]:
        """Where each segment ends, left to right."""
        return (self.parent.ends if self.parent else ()) + (self.segment[1],)

    def key(self) -> tuple[float, float, tuple[int, ...], int, tuple[int, ...]]:
        """The tie-breaking order (module docstring); a prefix that comes first stays first when
        both prefixes are extended by the same segments."""
        return (self.time, self.memory, self.order, self.segments, self.ends)


Table = dict[tuple[int, str], tuple[Label, ...]]


@dataclass(frozen=True)
class DPResult:
    """The best assignment, the DP table, and the alternatives worth showing.

    table[(end, strategy)]: the cell for "layers 0..end-1 assigned, the last
    segment runs `strategy` and ends at `end`": its non-dominated labels
    (no other label there has both less or equal time and less or equal
    memory and comes first in the tie-breaking order), sorted by that order.
    Keeping every non-dominated (time, memory) pair, not just the fastest,
    is what makes the memory cap exact: a slower prefix may be the only one
    that leaves room for the rest.
    alternatives: the best assignment ending with each strategy, the best
    using a single strategy throughout, and the fastest ignoring the cap,
    each with its prediction (`fits` says whether it respects the cap);
    those that fit first, each group in the tie-breaking order, without
    duplicates.
    """

    best: Assignment
    table: Table
    alternatives: tuple[Assignment, ...]


def _split(value: float | tuple[float, float]) -> tuple[float, float]:
    if isinstance(value, tuple):
        return float(value[0]), float(value[1])
    return float(value), 0.0


def _dominates(a: Label, b: Label) -> bool:
    """`a` makes `b` useless: no worse in time and memory, and first in the tie-breaking order. The order
    starts with (time, memory), so it is read only when both are equal (building the keys for every pair was
    most of a deep model's DP: 508,064 comparisons for the 64-layer GCNII example on Cora x4)."""
    return a.time <= b.time and a.memory <= b.memory and (a.time < b.time or a.memory < b.memory
                                                           or a.key() <= b.key())


_time = operator.attrgetter("time")  # a label's time, read by bisect without a Python call per probe


def _insert(labels: list[Label], new: Label) -> None:
    """Add `new` to a cell's labels unless one of them dominates it, dropping those it dominates.

    The labels are kept in increasing time, hence decreasing memory (no two of them dominate each other: of two
    with equal times, the one with less memory, or first in the order, would). So the only label that can
    dominate `new` is the last one not slower than it, and those `new` dominates are the run from the first one
    not faster than it while their memory is not below its: two comparisons and a slice, where every label was
    compared twice (a deep model's DP makes ~10,000 insertions into cells of dozens of labels)."""
    t = new.time
    before = bisect.bisect_right(labels, t, key=_time)
    if before and _dominates(labels[before - 1], new):
        return
    first = bisect.bisect_left(labels, t, key=_time)
    end = first
    while end < len(labels) and _dominates(new, labels[end]):
        end += 1
    labels[first:end] = [new]


def solve(num_layers: int, strategies: Sequence[str], seg_cost: Mapping[SegKey, tuple[float, float]],
          transition_cost: Mapping[TransKey, float | tuple[float, float]] | None = None,
          memory_cap: float | None = None, memory_combine: str = "sum") -> DPResult:
    """The minimum-time assignment of `strategies` to segments of layers 0..num_layers-1.

    Raises GnncError when no assignment exists, or none fits `memory_cap`
    (the message gives the least memory any assignment needs).
    """
    trans = transition_cost or {}
    table, capped = _fill(num_layers, strategies, seg_cost, trans, memory_cap, memory_combine)
    pick = best_label(table, num_layers, strategies)
    if pick is None:
        raise GnncError(_no_assignment(num_layers, strategies, seg_cost, trans, memory_cap, memory_combine))
    best = backtrack(table, pick[0], pick[1], seg_cost)
    alternatives = _alternatives(num_layers, strategies, seg_cost, trans, memory_cap, memory_combine, table, best,
                                 None if capped else table)
    return DPResult(best, table, alternatives)


def fill_table(num_layers: int, strategies: Sequence[str], seg_cost: Mapping[SegKey, tuple[float, float]],
               transition_cost: Mapping[TransKey, float | tuple[float, float]],
               memory_cap: float | None, memory_combine: str = "sum") -> Table:
    """The DP table (see `DPResult.table`): cells filled boundary by boundary, left to right.

    Cell (end, s) receives, for every allowed segment (start, end, s) and
    every label of every cell (start, s') -- or the empty prefix when start
    is 0 -- the label extended by the transition s' -> s at `start` and the
    segment; dominated labels and labels over the cap are dropped.
    """
    return _fill(num_layers, strategies, seg_cost, transition_cost, memory_cap, memory_combine)[0]


def _fill(num_layers: int, strategies: Sequence[str], seg_cost: Mapping[SegKey, tuple[float, float]],
          transition_cost: Mapping[TransKey, float | tuple[float, float]],
          memory_cap: float | None, memory_combine: str = "sum") -> tuple[Table, bool]:
    """`fill_table`, and whether the cap dropped any label (if none, the table is the uncapped one too)."""
    if num_layers < 1:
        raise ValueError("the DP needs at least one layer")
    if memory_combine not in ("sum", "max"):
        raise ValueError(f"memory_combine is 'sum' or 'max', not {memory_combine!r}")
    rank = {s: i for i, s in enumerate(strategies)}
    if len(rank) != len(strategies):
        raise ValueError(f"strategies must be distinct: {list(strategies)}")
    trans = transition_cost
    # segments by start, in a fixed order (end, then strategy position), so the DP never depends on dict order
    by_start: dict[int, list[tuple[int, str, float, float]]] = {}
    for (start, end, strategy), value in seg_cost.items():
        if strategy not in rank or not 0 <= start < end <= num_layers:
            continue
        t, m = _split(value)
        if m < 0:
            raise ValueError(f"segment {(start, end, strategy)} has negative memory {m}")
        by_start.setdefault(start, []).append((end, strategy, t, m))
    for segs in by_start.values():
        segs.sort(key=lambda seg: (seg[0], rank[seg[1]]))

    def add_memory(total: float, extra: float) -> float:
        return total + extra if memory_combine == "sum" else max(total, extra)

    cells: dict[tuple[int, str], list[Label]] = {}
    capped = False
    # Boundaries in increasing order: every label at `start` is final before segments leave from it.
    for start in range(num_layers):
        # the labels each segment leaving `start` extends, by cell (None: the empty prefix at layer 0)
        sources: list[tuple[tuple[int, str] | None, Sequence[Label | None]]]
        if start == 0:
            sources = [(None, (None,))]
        else:
            sources = [((start, s), cells[(start, s)]) for s in strategies if cells.get((start, s))]
        for end, strategy, t, m in by_start.get(start, ()):
            position = rank[strategy]
            into = cells.setdefault((end, strategy), [])
            et, em = _split(trans.get((strategy, None, num_layers), 0.0)) if end == num_layers else (0.0, 0.0)
            for cell, labels in sources:
                # the transition into this segment depends on the cell, not on the label: looked up once per cell
                tt, tm = _split(trans.get((cell[1] if cell is not None else None, strategy, start), 0.0))
                for index, lab in enumerate(labels):
                    # the same sums, in the same order, as an assignment's left-to-right total
                    time = (lab.time if lab else 0.0) + tt + t
                    memory = add_memory(add_memory(lab.memory if lab else 0.0, tm), m)
                    if end == num_layers:
                        time, memory = time + et, add_memory(memory, em)
                    if memory_cap is not None and memory > memory_cap:
                        capped = True
                        continue
                    _insert(into, Label(time, memory, (lab.segments if lab else 0) + 1, (start, end, strategy),
                                        (cell, index) if cell is not None else None, position, lab))
        # The cells ending at start+1 are final now (`prev` indices refer to their order). `_insert` keeps a cell
        # in strictly increasing time (of two labels with equal times one dominates the other), so its order
        # already is the tie-breaking order, which starts with the time: it is not sorted again (a sort by
        # `Label.key` built every label's O(L) order tuple).
    return ({cell: tuple(labels) for cell, labels in sorted(cells.items(), key=lambda c: (c[0][0], rank[c[0][1]]))
             if labels}, capped)


def best_label(table: Table, num_layers: int, strategies: Sequence[str]) -> tuple[tuple[int, str], int] | None:
    """The (cell, index) of the best complete assignment, by the tie-breaking rule; None if there is none."""
    finals = [(lab, (num_layers, s), k) for s in strategies for k, lab in enumerate(table.get((num_layers, s), ()))]
    if not finals:
        return None
    # the order starts with (time, memory): the full keys (O(L) tuples) only of the labels tied there
    least = min((lab.time, lab.memory) for lab, _, _ in finals)
    tied = [(lab, cell, k) for lab, cell, k in finals if (lab.time, lab.memory) == least]
    if len(tied) == 1:
        return tied[0][1], tied[0][2]
    _, cell, index = min((lab.key(), cell, k) for lab, cell, k in tied)
    return cell, index


def backtrack(table: Table, cell: tuple[int, str], index: int,
              seg_cost: Mapping[SegKey, tuple[float, float]]) -> Assignment:
    """Follow `prev` pointers from label `index` of `cell` back to layer 0."""
    last = table[cell][index]
    segments: list[Segment] = []
    lab: Label | None = last
    while lab is not None:
        start, end, strategy = lab.segment
        t, m = _split(seg_cost[lab.segment])
        segments.append(Segment(start, end, strategy, t, m))
        lab = table[lab.prev[0]][lab.prev[1]] if lab.prev is not None else None
    return Assignment(tuple(reversed(segments)), last.time, last.memory)


def solve_pure(num_layers: int, strategy: str, seg_cost: Mapping[SegKey, tuple[float, float]],
               transition_cost: Mapping[TransKey, float | tuple[float, float]] | None = None,
               memory_combine: str = "sum") -> Assignment:
    """The best assignment running `strategy` on every layer, ignoring the memory cap."""
    only = {k: v for k, v in seg_cost.items() if k[2] == strategy}
    table = fill_table(num_layers, [strategy], only, transition_cost or {}, None, memory_combine)
    pick = best_label(table, num_layers, [strategy])
    if pick is None:
        raise GnncError(f"strategy '{strategy}' cannot cover layers 0..{num_layers - 1}")
    return backtrack(table, pick[0], pick[1], only)


def _alternatives(num_layers: int, strategies: Sequence[str], seg_cost: Mapping[SegKey, tuple[float, float]],
                  trans: Mapping[TransKey, float | tuple[float, float]], memory_cap: float | None,
                  memory_combine: str, table: Table, best: Assignment,
                  uncapped: Table | None = None) -> tuple[Assignment, ...]:
    """`DPResult.alternatives` (`table`: filled under `memory_cap`). `uncapped`: the table without the cap when
    the caller has it (`table` itself when the cap dropped no label: the fill is not run twice)."""
    found: dict[tuple[SegKey, ...], Assignment] = {}

    def keep(a: Assignment) -> None:
        found.setdefault(tuple((s.start, s.end, s.strategy) for s in a.segments), a)

    keep(best)
    if memory_cap is not None:  # the fastest regardless of memory, to say what the cap costs
        free = uncapped if uncapped is not None else fill_table(num_layers, strategies, seg_cost, trans, None,
                                                                memory_combine)
        pick = best_label(free, num_layers, strategies)
        if pick is not None:
            keep(backtrack(free, pick[0], pick[1], seg_cost))
    for s in strategies:
        if table.get((num_layers, s)):
            keep(backtrack(table, (num_layers, s), 0, seg_cost))
    for s in strategies:
        try:
            # uncapped, so a pure strategy that does not fit is still shown (and `fits` says so)
            keep(solve_pure(num_layers, s, seg_cost, trans, memory_combine))
        except GnncError:
            continue
    rank = {s: i for i, s in enumerate(strategies)}
    return tuple(sorted(found.values(), key=lambda a: (not a.fits(memory_cap), assignment_key(a, rank))))


def assignment_key(a: Assignment, rank: Mapping[str, int]) -> tuple[float, float, tuple[int, ...], int,
                                                                    tuple[int, ...]]:
    """The tie-breaking order of whole assignments (`rank`: each strategy's position)."""
    return (a.time, a.memory, tuple(rank[x] for x in a.strategies), len(a.segments),
            tuple(s.end for s in a.segments))


def _no_assignment(num_layers: int, strategies: Sequence[str], seg_cost: Mapping[SegKey, tuple[float, float]],
                   trans: Mapping[TransKey, float | tuple[float, float]], memory_cap: float | None,
                   memory_combine: str) -> str:
    names = ", ".join(strategies)
    uncovered = f"no assignment of {names} covers layers 0..{num_layers - 1} (some layer has no allowed segment)"
    if memory_cap is None:
        return uncovered
    table = fill_table(num_layers, strategies, seg_cost, trans, None, memory_combine)
    finals = [lab.memory for s in strategies for lab in table.get((num_layers, s), ())]
    if not finals:
        return uncovered
    return (f"no assignment of {names} fits the memory cap of {memory_cap:.6g} bytes per worker; "
            f"the least memory any assignment needs is {min(finals):.6g} bytes")
