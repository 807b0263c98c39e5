"""Link prediction's pair rows on several ranks: which rank scores each pair, which rows it fetches.

A pair (u, v) of a pair set is scored on the rank owning its source u; the destination's row, when another
rank owns v, is fetched like a halo row: each rank that needs remote destinations receives each of them once
(deduplicated over its pairs), from its owner, ordered by (owner, vertex id). The runtime's pair exchange
(gnnc.runtime.pair_exchange) follows these rows and predict-bytes counts them (`fetched_rows`), so the bytes a
run measures and the plan's prediction come from the same function: forward, each fetched row once; backward,
its gradient sent back to the owner.

Every rank computes every rank's fetch lists from the pair set and the ownership of the vertices alone (no
message is needed to agree on them): a fixed pair set once, a training epoch's negatives (drawn identically on
every rank from the run's seed) once per epoch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnc.plan.halo import HaloPlan


def _fetch_keys(src: Tensor, dst: Tensor, owner: Tensor, world: int) -> Tensor:
    """Sorted unique keys (r * world + p) * N + v, one per remote destination row v that rank r (scoring a
    pair into v) fetches from its owner p != r."""
    n = owner.shape[0]
    r, p = owner[src], owner[dst]
    remote = r != p
    return torch.unique((r[remote] * world + p[remote]) * n + dst[remote])


def fetched_rows(src: Tensor, dst: Tensor, owner: Tensor, world: int) -> int:
    """How many destination rows the ranks fetch in all to score pairs (src, dst) (module docstring)."""
    return int(_fetch_keys(src, dst, owner, world).numel())


@dataclass(frozen=True)
class PairRows:
    """One rank's share of a pair set: the places (in the set) of the pairs it scores, their sources' rows
    among its own, their destinations' rows in [own rows; fetched rows], and the fetch as a halo plan."""

    index: Tensor
    src: Tensor
    dst: Tensor
    fetch: HaloPlan


def pair_rows(src: Tensor, dst: Tensor, owner: Tensor, local: Tensor, rank: int, world: int,
              n_owned: int) -> PairRows:
    """Rank `rank`'s PairRows of pairs (src, dst): `owner[v]` the rank owning vertex v, `local[v]` its row
    among its owner's own rows. One host read (the fetch counts: the exchange's message sizes)."""
    n = owner.shape[0]
    keys = _fetch_keys(src, dst, owner, world)
    receiver, sender = (keys // n) // world, (keys // n) % world
    recv = keys[receiver == rank]  # by (owner, vertex): the order the halo exchange delivers them in
    recv_counts = torch.bincount(sender[receiver == rank], minlength=world)
    send = keys[sender == rank]  # by (receiver, vertex): each peer's send list in its receive order
    send_counts = torch.bincount(receiver[sender == rank], minlength=world)
    counts = torch.stack([recv_counts, send_counts]).tolist()
    send_idx = tuple(torch.split(local[send % n], counts[1]))
    mine = torch.nonzero(owner[src] == rank).reshape(-1)
    s, d = src[mine], dst[mine]
    d_owner = owner[d]
    fetched = n_owned + torch.searchsorted(recv, (rank * world + d_owner) * n + d)
    return PairRows(mine, local[s], torch.where(d_owner == rank, local[d], fetched),
                    HaloPlan(send_idx, tuple(int(c) for c in counts[0])))
