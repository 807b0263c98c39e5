"""Halo plans: which rows a rank sends to each peer, and how many it receives.

The plan's shards store them (gnnc.plan.shards) and the runtime's
communication ops follow them (gnnc.runtime.comm), so the record lives
with the plan, below both.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class HaloPlan:
    """Which local rows this rank sends to each peer, and how many rows it receives from each.

    `send_idx[p]` holds local row indices sent to rank p (one row per
    (vertex, remote rank) pair); `recv_counts[p]` is the number of rows p
    sends here, which must equal `len(send_idx[here])` on p
    (`check_halo_plan` verifies it). The received rows are ordered by
    (peer, position in the peer's send list). Entries for this rank are empty.
    """

    send_idx: tuple[Tensor, ...]
    recv_counts: tuple[int, ...]

    @property
    def send_counts(self) -> list[int]:
        return [int(i.numel()) for i in self.send_idx]

    @property
    def n_halo(self) -> int:
        return int(sum(self.recv_counts))

    def recv_offsets(self) -> list[int]:
        out = [0]
        for c in self.recv_counts:
            out.append(out[-1] + int(c))
        return out

    def map_tensors(self, fn: Callable[[Tensor], Tensor]) -> "HaloPlan":
        """This plan with its send lists mapped by `fn` (e.g. copied to the GPU the exchange runs on)."""
        return HaloPlan(tuple(fn(i) for i in self.send_idx), self.recv_counts)
