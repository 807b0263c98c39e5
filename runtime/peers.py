"""Which peers a rank of a torchrun job can still reach, to name the lost one when a collective fails.

Why this module exists: when a host's link goes down in a job that spans
machines, gloo reports only "Timed out waiting 60000ms for recv operation to
complete" on every rank, which names no one, and torchrun's agent on the
cut-off host cannot report anything (it waits on a rendezvous store it no
longer reaches). `gnnc run --nproc` names a hung rank from the exit codes it
supervises; a joined rank has only the network, so it asks the network:
at start-up the ranks exchange the addresses their gloo listens on
(`exchange_addresses`, one all-gather), and after a communication error each
rank tries a TCP connection to every other host (`diagnose`). A peer that
answers, with a connection or a refusal, is reachable; one that stays silent
for `PROBE_TIMEOUT_S` or whose network is unreachable is named. The probe
connects to MASTER_PORT, the port the job already uses (the rendezvous store
listens there on the store's host, and a refusal from the others proves they
are there); nothing new listens anywhere.
"""
from __future__ import annotations

import concurrent.futures
import errno
import socket
from dataclasses import dataclass

import torch.distributed as dist

from gnnc.runtime.netif import source_address_toward

PROBE_TIMEOUT_S = 2.0  # a peer on a working link answers a TCP SYN in well under a second


@dataclass(frozen=True)
class PeerTable:
    """Every rank's address on the job's network (by rank), and the port a reachability probe knocks on."""

    addresses: tuple[str, ...]
    port: int


def exchange_addresses(master_addr: str, master_port: int) -> PeerTable:
    """All-gather the address each rank sends from toward the rendezvous host (where its gloo listens)."""
    mine = source_address_toward(master_addr, master_port) or ""
    gathered: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return PeerTable(tuple(a or "" for a in gathered), master_port)


def probe(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `address` answers a TCP connection to `port` (accepting or refusing it), else why not."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return None  # the host is there: nothing listens on that port
    except socket.timeout:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN):
            return exc.strerror or str(exc)
        return None  # another answer (reset, ...) still comes from the host


def unreachable(table: PeerTable, rank: int, timeout_s: float = PROBE_TIMEOUT_S) -> dict[int, str]:
    """{peer rank: why it cannot be reached} for every other rank; hosts are probed once each, in parallel."""
    hosts = sorted({a for r, a in enumerate(table.addresses) if r != rank and a})
    if not hosts:
        return {}
    with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
        why = dict(zip(hosts, pool.map(lambda a: probe(a, table.port, timeout_s), hosts)))
    return {r: why[a] for r, a in enumerate(table.addresses) if r != rank and a and why[a] is not None}


def diagnose(table: PeerTable, rank: int, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """One sentence naming the peers this rank cannot reach (or saying that it reaches them all)."""
    lost = unreachable(table, rank, timeout_s)
    peers = [r for r in range(len(table.addresses)) if r != rank]
    if not lost:
        return "every peer still answers (a peer may have hung or died rather than lost its link)"
    named = ", ".join(f"rank {r} at {table.addresses[r]} ({lost[r]})" for r in sorted(lost))
    if len(lost) == len(peers) and len(peers) > 1:
        return f"cannot reach any peer: {named}; this rank's own link (at {table.addresses[rank]}) is probably down"
    return f"cannot reach {named}"
