"""G3's locality-aware iterative partitioner (G3, SIGMOD'23, Algorithm 1).

In G3's graph-parallel training every worker receives, each layer, the rows
of its remote neighbours B_i; the slowest receiver sets the pace, so G3
balances |B_i| across parts, not only vertices and edges. It starts from
multi-constraint METIS (volume objective, vertex and degree balance) and
then repeatedly takes the parts with the most and the fewest remote
vertices (max, min) and swaps a vertex of each: from max, the vertex with
the most remote neighbours; from min, the vertex with the fewest neighbours
outside max, argmin |N(v) \\ V_max|. It stops when 1 - min/max < 0.5%, when
the assignment repeats (a cycle), or at a time limit.

Three starts (`start`): 'metis-mc', G3's; 'metis', edge-cut METIS; and
'hubs' (`hub_split`), which gives the highest-degree vertices parts of their
own beside a METIS split of the rest. On power-law graphs the hub start
reaches a lower max |B_i| than either METIS start, and a lower sum than
G3's (1.17x edge-cut METIS's, against 1.50x from G3's start), at the cost
of compute balance and of the send side, which G3 does not balance (on
benchmarks/partition.py's 1M-vertex R-MAT: degree balance 3.40, against
4.00 for edge-cut METIS and 1.04 from G3's start; the most rows a part
sends 2.9x that from G3's start); on graphs without hubs (SBM) it is worse
than both starts on |B_i| too. It is not the default.

The remote sets are kept incrementally (`RemoteSets`): cnt[i, u] counts the
neighbours of u inside part i, so u is in B_i exactly when u is outside i
and cnt[i, u] > 0; moving a vertex updates the counts of its neighbours
only, O(deg). Beyond the paper:

* candidates are ranked by their exact effect on |B_max| and |B_min|
  (`select='gain'`, the default; `select='paper'` ranks by the paper's
  criteria), evaluated for a batch of candidates at once; after max's ranked
  candidates come its vertices whose move changes no |B_i| (isolated ones),
  so that a swap can be min's vertex's move alone;
* a swap is applied tentatively and rejected (undone) if it does not bring
  |B_max| and |B_min| closer together without overshooting ('no_progress'),
  pushes sum |B_i| above sum_factor x the start's ('sum'; default 1.20: the
  swaps trade some total traffic for a lower maximum, but only so much), or
  breaks the degree balance (max/mean degree sum above the start's or
  1 + degree_tolerance, whichever is larger: 'degree'); the stats report the
  bounds, the final sum and the rejections by reason (`Swapper`);
* a batch with no accepted swap tries the next pair of parts, and the
  search stops when no pair has an acceptable swap ('stalled').

B_i here is over the symmetric simple graph (neighbours in either
direction); for a graph whose edge set is symmetric it is exactly the set of
remote in-neighbours the statistics pass reports.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.passes.partition import metis as partition_metis
from gnnc.passes.partition.hub_split import hub_split
from gnnc.passes.partition.core import PartitionInput

STARTS = ("metis-mc", "metis", "hubs")
SELECTS = ("gain", "paper")
MASK64 = (1 << 64) - 1


class RemoteSets:
    """Per-part remote sets with in-part neighbour counts, updated in O(deg) per move.

    part[v]: the part of v. cnt[i, u]: neighbours of u inside part i (int32
    [P, N]). size[i] = |B_i| = #{u : part[u] != i and cnt[i, u] > 0}.
    load[i]: the summed vertex weights (degrees) of part i.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, parts: int,
                 weights: np.ndarray):
        self.indptr, self.indices, self.parts = indptr, indices, parts
        self.n = len(indptr) - 1
        self.part = np.array(assignment, dtype=np.int64)
        self.weights = weights
        self.cnt = self._counts()
        self.size = self.recount()
        self.load = np.bincount(self.part, weights=weights, minlength=parts).astype(np.float64)

    def _counts(self) -> np.ndarray:
        rows = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.indptr))
        # entry (u, v): v is a neighbour of u, so u has one neighbour in part[v]
        flat = np.bincount(self.part[self.indices] * self.n + rows, minlength=self.parts * self.n)
        return flat.reshape(self.parts, self.n).astype(np.int32)

    def recount(self) -> np.ndarray:
        """|B_i| from the counts' definition, recomputed from scratch (checks the incremental sizes)."""
        cnt = self._counts()
        outside = self.part[None, :] != np.arange(self.parts)[:, None]
        return np.count_nonzero((cnt > 0) & outside, axis=1).astype(np.int64)

    def brute_force(self) -> list[set[int]]:
        """B_i as sets, straight from the adjacency (for tests)."""
        rows = np.repeat(np.arange(self.n), np.diff(self.indptr))
        out: list[set[int]] = [set() for _ in range(self.parts)]
        for u, v in zip(rows.tolist(), self.indices.tolist()):
            if self.part[u] != self.part[v]:
                out[int(self.part[v])].add(int(u))
        return out

    def neighbours(self, v: int) -> np.ndarray:
        return self.indices[self.indptr[v]:self.indptr[v + 1]]

    def move(self, v: int, b: int) -> None:
        """Move v to part b, updating the counts of its neighbours and |B_a|, |B_b|."""
        a = int(self.part[v])
        if a == b:
            return
        nb = self.neighbours(v)  # no self-loops, no duplicates: each neighbour once
        pn = self.part[nb]
        ca = self.cnt[a, nb] - 1
        self.cnt[a, nb] = ca
        self.size[a] -= np.count_nonzero((ca == 0) & (pn != a))  # u lost its last link into a
        cb = self.cnt[b, nb] + 1
        self.cnt[b, nb] = cb
        self.size[b] += np.count_nonzero((cb == 1) & (pn != b))  # u gained its first link into b
        self.part[v] = b
        if self.cnt[a, v] > 0:  # v now lives outside a but still has neighbours there
            self.size[a] += 1
        if self.cnt[b, v] > 0:  # v was remote to b; now it is owned
            self.size[b] -= 1
        w = self.weights[v]
        self.load[a] -= w
        self.load[b] += w

    def deltas(self, vertices: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """For vertices of part a moved alone to part b: the change of |B_a| and of |B_b| each causes."""
        lens = self.indptr[vertices + 1] - self.indptr[vertices]
        owner = np.repeat(np.arange(len(vertices)), lens)
        offsets = np.cumsum(lens) - lens
        pos = self.indptr[vertices][owner] + np.arange(int(lens.sum())) - offsets[owner]
        u = self.indices[pos]
        pu = self.part[u]
        lost = (pu != a) & (self.cnt[a, u] == 1)
        gained = (pu != b) & (self.cnt[b, u] == 0)
        k = len(vertices)
        d_a = -np.bincount(owner, weights=lost, minlength=k) + (self.cnt[a, vertices] > 0)
        d_b = np.bincount(owner, weights=gained, minlength=k) - (self.cnt[b, vertices] > 0)
        return d_a.astype(np.int64), d_b.astype(np.int64)


def _zobrist(v: int, p: int, parts: int, salt: int) -> int:
    """A 64-bit random key per (vertex, part); the XOR over vertices hashes an assignment."""
    x = (v * parts + p + salt * 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Limits:
    """What an accepted swap must respect beyond the paper.

    degree: the largest max/mean degree load allowed. remote_sum: the largest
    sum |B_i| allowed (the start's sum times `sum_factor`).
    """

    degree: float
    remote_sum: float


class Swapper:
    """Applies swaps to `rs` under `limits`, counts rejections by reason and detects cycles.

    A swap is applied tentatively (two O(deg) moves) and undone when it fails
    a check, so the sizes tested are the exact incremental ones and a
    rejected swap leaves `rs` as it was.
    """

    REASONS = ("no_progress", "sum", "degree")

    def __init__(self, rs: RemoteSets, limits: Limits, salt: int,
                 on_swap: Callable[[RemoteSets], None] | None = None):
        self.rs, self.limits, self.salt, self.on_swap = rs, limits, salt, on_swap
        self.rejected = {why: 0 for why in self.REASONS}
        self.swaps = 0
        self.cycled = False
        # the XOR of per-(vertex, part) keys relative to the start: equal hashes mean a repeated assignment
        self.state_hash = 0
        self.seen = {self.state_hash}

    def check(self, a: int, b: int, before_a: int, before_b: int) -> str | None:
        """Why the swap just applied between a (the larger |B|) and b must be undone, or None."""
        rs = self.rs
        after_a, after_b = int(rs.size[a]), int(rs.size[b])
        hi, lo = max(after_a, after_b), min(after_a, after_b)
        # closer together without overshooting: the larger does not grow, the smaller does not shrink
        if not (hi < before_a and lo >= before_b or hi <= before_a and lo > before_b):
            return "no_progress"
        if int(rs.size.sum()) > self.limits.remote_sum:
            return "sum"
        if _balance(rs.load) > self.limits.degree + 1e-12:
            return "degree"
        return None

    def try_swap(self, v: int, w: int, a: int, b: int) -> bool:
        """Swap v (in a) and w (in b) if the result passes every check; undo it otherwise."""
        rs = self.rs
        before_a, before_b = int(rs.size[a]), int(rs.size[b])
        rs.move(v, b)
        rs.move(w, a)
        why = self.check(a, b, before_a, before_b)
        if why is not None:
            rs.move(w, b)
            rs.move(v, a)
            self.rejected[why] += 1
            return False
        self._record(v, w, a, b)
        return True

    def _record(self, v: int, w: int, a: int, b: int) -> None:
        parts, salt = self.rs.parts, self.salt
        self.state_hash ^= (_zobrist(v, a, parts, salt) ^ _zobrist(v, b, parts, salt)
                            ^ _zobrist(w, b, parts, salt) ^ _zobrist(w, a, parts, salt))
        self.swaps += 1
        if self.state_hash in self.seen:
            self.cycled = True
        self.seen.add(self.state_hash)
        if self.on_swap is not None:
            self.on_swap(self.rs)


def run(inp: PartitionInput, parts: int, seed: int, start: str = "metis-mc", select: str = "gain",
        tolerance: float = 0.005, time_limit: float = 90.0, degree_tolerance: float = 0.05,
        sum_factor: float = 1.20, batch: int = 512, max_swaps: int | None = None, core_parts: int = 2,
        on_swap: Callable[[RemoteSets], None] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithm 1 from a METIS start; see the module docstring for every option's role.

    time_limit counts from the call, the start included: the start and the
    count setup always finish, and the swaps stop at the limit (within one
    batch). core_parts is the hub start's number of METIS parts.
    """
    _check_options(start, select, sum_factor, core_parts)
    t0 = time.perf_counter()
    initial, start_stats = _start(inp, parts, seed, start, core_parts)
    t_start = time.perf_counter() - t0
    indptr, indices = inp.undirected
    weights = inp.in_degree.astype(np.float64)
    rs = RemoteSets(indptr, indices, initial, parts, weights)
    start_sizes = rs.size.copy()
    limits = Limits(degree=max(_balance(rs.load), 1.0 + degree_tolerance),
                    remote_sum=sum_factor * float(start_sizes.sum()))
    swapper = Swapper(rs, limits, salt=seed + 1, on_swap=on_swap)
    reason = _search(rs, swapper, select, batch, tolerance, t0 + time_limit, max_swaps)

    final = rs.size
    sizes = np.bincount(rs.part, minlength=parts)
    return rs.part.copy(), {
        "start": start,
        "select": select,
        "start_stats": start_stats,
        "start_time_s": t_start,
        "remote_start": start_sizes.tolist(),
        "remote": final.tolist(),
        "remote_ratio_start": _ratio(start_sizes),
        "remote_ratio": _ratio(final),
        "remote_sum_start": int(start_sizes.sum()),
        "remote_sum": int(final.sum()),
        "remote_sum_bound": int(limits.remote_sum),  # sums are integers: floor keeps the same test
        "sum_factor": sum_factor,
        "degree_limit": limits.degree,
        "swaps": swapper.swaps,
        "rejected": dict(swapper.rejected),
        "stop": reason,
        "vertex_balance": float(sizes.max() / sizes.mean()),
        "degree_balance_start": _balance(np.bincount(initial, weights=weights, minlength=parts)),
        "degree_balance": _balance(rs.load),
        "beyond_paper": (f"swaps ranked by exact gain ({select}); rejected if the degree balance exceeds "
                         f"{limits.degree:.4f}, if sum |B_i| exceeds {int(limits.remote_sum)} "
                         f"(start {int(start_sizes.sum())} x {sum_factor:.2f}), or if |B_max|, |B_min| do not "
                         f"get closer; rejections {swapper.rejected}"),
    }


def _check_options(start: str, select: str, sum_factor: float, core_parts: int) -> None:
    if start not in STARTS:
        raise GnncError(f"g3: start must be one of {', '.join(STARTS)}, got '{start}'")
    if select not in SELECTS:
        raise GnncError(f"g3: select must be one of {', '.join(SELECTS)}, got '{select}'")
    if not sum_factor >= 1.0:  # below 1 the start itself breaks the bound (and NaN fails too)
        raise GnncError(f"g3: sum_factor must be at least 1.0 (a multiple of the start's sum |B_i|), got {sum_factor}")
    if isinstance(core_parts, bool) or not isinstance(core_parts, (int, np.integer)) or core_parts < 1:
        raise GnncError(f"g3: core_parts must be a positive integer, got {core_parts!r}")


def _start(inp: PartitionInput, parts: int, seed: int, start: str,
           core_parts: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The partition the swaps start from: G3's multi-constraint METIS, the edge-cut one, or hub parts."""
    if start == "hubs":
        return hub_split(inp, parts, seed, core_parts)
    if start == "metis-mc":
        return partition_metis.run(inp, parts, seed, objective="vol", constraints="vertices+degree")
    return partition_metis.run(inp, parts, seed)


def _search(rs: RemoteSets, swapper: Swapper, select: str, batch: int, tolerance: float, deadline: float,
            max_swaps: int | None) -> str:
    """Swap until balanced, a cycle, the deadline, max_swaps or no acceptable swap; the reason it stopped."""
    if rs.parts < 2:
        return "balanced"
    while True:
        hi, lo = int(rs.size.max()), int(rs.size.min())
        if hi == 0 or 1.0 - lo / hi < tolerance:
            return "balanced"
        if time.perf_counter() > deadline:
            return "time limit"
        if max_swaps is not None and swapper.swaps >= max_swaps:
            return "max_swaps"
        accepted = 0
        for a, b in _pairs(rs.size):
            accepted = _batch(rs, a, b, select, batch, swapper.try_swap, deadline, tolerance)
            if accepted:
                break
        if swapper.cycled:
            return "cycle"
        if not accepted:
            return "stalled: no acceptable swap between any pair of parts"


def _balance(load: np.ndarray) -> float:
    mean = float(load.mean())
    return float(load.max()) / mean if mean > 0 else 1.0


def _ratio(sizes: np.ndarray) -> float:
    lo = int(sizes.min())
    return float(sizes.max()) / lo if lo > 0 else float("inf")


def _pairs(size: np.ndarray) -> list[tuple[int, int]]:
    """Pairs of parts to try, most promising first: (max, min), then max with the next smallest
    parts, then the next largest parts with min."""
    order = np.argsort(size, kind="stable")
    lo, hi = [int(p) for p in order], [int(p) for p in order[::-1]]
    mean = float(size.mean())
    pairs = [(hi[0], b) for b in lo if size[b] < mean]
    pairs += [(a, lo[0]) for a in hi[1:] if size[a] > mean]
    return list(dict.fromkeys(pairs))


def _batch(rs: RemoteSets, a: int, b: int, select: str, k: int,
           try_swap: Callable[[int, int, int, int], bool], deadline: float, tolerance: float) -> int:
    """Rank up to k candidates of a and of b, then try swaps in rank order; the number accepted.

    Continues while a stays above the mean and b below it (the swaps still
    move both toward the balance), so one ranking serves many swaps.
    """
    va = np.nonzero(rs.part == a)[0]
    wb = np.nonzero(rs.part == b)[0]
    if len(va) == 0 or len(wb) == 0:
        return 0
    if select == "paper":
        deg_a = rs.indptr[va + 1] - rs.indptr[va]
        remote_nbrs = deg_a - rs.cnt[a, va]  # neighbours of v outside a (v is in a)
        v_order = va[np.argsort(-remote_nbrs, kind="stable")[:k]]
        deg_b = rs.indptr[wb + 1] - rs.indptr[wb]
        outside_max = deg_b - rs.cnt[a, wb]  # |N(w) \ V_max|
        w_order = wb[np.argsort(outside_max, kind="stable")[:k]]
    else:
        # v: a -> b changes B_a by la and B_b by jb: it closes the gap by g = jb - la at a cost
        # s = la + jb to the sum; best: most gap closed per unit of sum, among those that close it
        la, jb = rs.deltas(va, a, b)
        g, s = jb - la, la + jb
        useful = np.nonzero(g > 0)[0]
        key = s[useful] / g[useful]
        # then vertices whose move changes neither |B| nor the gap (isolated ones, say): with them a
        # swap is w's move alone, the only progress left when every useful v would overshoot
        # (a hub part, whose other vertices are isolated: `hub_split`)
        neutral = va[(g == 0) & (s <= 0)][:k]
        v_order = np.concatenate([va[useful[np.lexsort((-g[useful], key))[:k]]], neutral])[:k]
        # w: b -> a changes B_b by lb and B_a by ja; prefer the largest gap closed, then cheapest
        lb, ja = rs.deltas(wb, b, a)
        gw, sw = lb - ja, lb + ja
        w_order = wb[np.lexsort((sw, -gw))[:k]]
    mean = float(rs.size.mean())
    accepted = 0
    wi = 0
    for v in v_order.tolist():
        if wi >= len(w_order) or time.perf_counter() > deadline:
            break
        if not (rs.size[a] > mean and rs.size[b] < mean) or 1.0 - rs.size[b] / max(rs.size[a], 1) < tolerance:
            break
        w = int(w_order[wi])
        if rs.part[v] != a or rs.part[w] != b:
            continue
        if try_swap(v, w, a, b):
            accepted += 1
            wi += 1
    return accepted
