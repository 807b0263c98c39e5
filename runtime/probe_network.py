"""`gnnc probe --network`: measure the links between the ranks of a torchrun job, for a cluster profile.

Why this module exists: `gnnc probe` alone measures one machine, and its
"link" is two processes on loopback. A plan for several machines is priced
on their network, so under torchrun every rank joins one measurement:

* per link, in both directions, one pair at a time (so no link shares its
  bandwidth with another measurement) while the other ranks compute, as
  they do when two ranks exchange during training (`_computing`): the
  latency, half the median round trip of a one-element message, and the
  bandwidth, a `NETWORK_BYTES` message's size over the median time it
  takes to arrive (its round trip with a one-element reply, less two
  latencies: the alpha-beta reading of the time). A rank sharing its core
  with a computing one answers a message only once it is scheduled: on 4
  emulated hosts on 2 cores, 4.6 ms per round trip instead of 80 us idle;
  on hosts with cores of their own the two agree;
* the collectives the runtime uses: an all-reduce and an all-to-all of
  `NETWORK_BYTES` per rank, each the median of a few after a warm-up;
* what an exchange costs a step beyond its bytes (`_exchange_overhead`):
  every rank posts a one-element receive from and send to every peer, as
  the halo exchange does, works meanwhile, then waits; the mean over many
  tries of the time this adds to the same work timed alone. An idle round
  trip is not what a step pays: on 2 emulated hosts with a core each, a
  round trip took 50-90 us while an exchange beside 0.5 ms of work added
  1.8-3.2 ms to it on average (gloo's I/O thread and the rank share the
  core; in a step, a tenth of the exchanges took 3.5-4 ms to post), and the
  steps' exchanges and all-reduces measured 10-15 ms above what 50 us per
  message priced. The mean, not the median: an epoch pays every exchange.

Ranks on one host are recognised by their address on the job's network (the
one they reach MASTER_ADDR from). `profile_fields` turns the measurements
into ClusterProfile fields: the median cross-host link is the profile's
`inter_bandwidth`, the median same-host link its `intra_bandwidth`, and
every link and collective is kept (`links`, `collectives`) beside them.
The profile's `latency` (alpha) is the mean over the cross-host links, not
their median: an exchange starts a message to every peer, (P-1) start-ups
that the cost model prices as (P-1) x latency, and their sum over a rank's
peers averages (P-1) x the mean. A slow link is one of them, not an
outlier to drop: on 4 emulated hosts on 2 cores the two pairs sharing a
core take 2.0 ms, the other links 40-49 us (median 44 us, mean 0.69 ms),
and every halo exchange there took 3-10 ms. Where an exchange costs more
than its start-ups (the exchange overhead above, over P-1), the latency is
that share of it, so that (P-1) x latency is what an exchange adds.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from gnnc.runtime.launch import DistConfig
from gnnc.runtime.peers import exchange_addresses

NETWORK_BYTES = 16 * 2**20  # 134 ms at 1 Gb/s, 5 ms at 25 Gb/s: start-up costs vanish in it
REPEATS = 5
# One-element round trips cost microseconds but vary by milliseconds on a loaded machine (gloo's I/O
# thread must be scheduled on both ends): many of them, for a median (and a mean) that holds still.
SMALL_REPEATS = 60
EXCHANGE_WORK = 20  # 128 x 128 products overlapping each timed exchange: about 0.5 ms on one core


def _round_trip(out: torch.Tensor, back: torch.Tensor, peer: int, first: bool) -> float:
    """Seconds for `out` to go from the first rank of the pair to the other and `back` to return
    (meaningful on the first rank only)."""
    t0 = time.perf_counter()
    if first:
        dist.send(out, peer)
        dist.recv(back, peer)
    else:
        dist.recv(out, peer)
        dist.send(back, peer)
    return time.perf_counter() - t0


def _work() -> Callable[[], None]:
    """A few hundred microseconds of dense work: what a rank computes while its exchange is in flight."""
    a = torch.randn(128, 128)
    return lambda: [a @ a for _ in range(EXCHANGE_WORK)]


def _exchange_overhead(world: int, rank: int, repeats: int) -> float:
    """The mean seconds an exchange adds to work it overlaps, as every rank exchanges at once in a step: each
    posts a one-element receive from and send to every peer (gnnc.runtime.comm's halo exchange: receives
    first), computes, then waits. Timed against the same work alone, the two interleaved so that both
    see the same machine. Rank 0's figure (every rank took part in each)."""
    peers = [p for p in range(world) if p != rank]
    got = {p: torch.zeros(1) for p in peers}
    one = torch.zeros(1)
    work = _work()
    extra = []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        work()
        alone = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        posted = [dist.irecv(got[p], p) for p in peers] + [dist.isend(one, p) for p in peers]
        work()
        for p in posted:
            p.wait()
        if i:
            extra.append(time.perf_counter() - t0 - alone)
    return max(statistics.fmean(extra), 0.0)


def _measure_pair(rank: int, a: int, b: int, large: torch.Tensor, repeats: int) -> list[dict[str, Any]]:
    """Ranks a and b measure their link a->b, then b->a; each direction is timed by its sender, which
    returns it (the receiver's clock would also count the wait for the sender to start)."""
    peer = b if rank == a else a
    one, reply = torch.zeros(1), torch.zeros(1)
    out = []
    for src, dst in ((a, b), (b, a)):
        first = rank == src
        small = [_round_trip(one, reply, peer, first) for _ in range(SMALL_REPEATS + 1)][1:]
        times = [_round_trip(large, reply, peer, first) for _ in range(repeats + 1)][1:]
        if first:
            latency, seconds = statistics.median(small) / 2, statistics.median(times)
            out.append({"src": src, "dst": dst, "latency": latency,
                        "bandwidth": large.numel() * large.element_size() / max(seconds - 2 * latency, 1e-9)})
    return out


def _collective(op: str, world: int, nbytes: int, repeats: int) -> dict[str, Any]:
    """The median seconds of one collective over `nbytes` per rank, and the bandwidth it shows per rank."""
    n = nbytes // 4 // world * world
    x = torch.ones(n)
    y = torch.empty_like(x)

    def once() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if op == "all_reduce":
            dist.all_reduce(x)
        else:
            dist.all_to_all_single(y, x)
        return time.perf_counter() - t0

    seconds = statistics.median([once() for _ in range(repeats + 1)][1:])
    # what each rank sends: a ring all-reduce 2(P-1)/P of the buffer (its "bus bandwidth"), an all-to-all (P-1)/P
    sent = n * 4 * (world - 1) / world * (2 if op == "all_reduce" else 1)
    return {"op": op, "bytes": n * 4, "seconds": seconds, "bandwidth": sent / seconds}


@contextlib.contextmanager
def _computing(busy: bool) -> Iterator[None]:
    """While the block runs, a thread of this rank multiplies matrices (torch releases the GIL), when `busy`."""
    if not busy:
        yield
        return
    stop = threading.Event()

    def compute() -> None:
        a = torch.randn(192, 192)
        while not stop.is_set():
            a = (a @ a).clamp_(-1.0, 1.0)

    thread = threading.Thread(target=compute, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def network_probe(cfg: DistConfig, nbytes: int = NETWORK_BYTES, repeats: int = REPEATS) -> dict[str, Any] | None:
    """Every rank runs this under torchrun (`join_torchrun`); rank 0 returns the measurements, others None."""
    world = cfg.world_size
    addresses = exchange_addresses(cfg.master_addr, cfg.master_port).addresses
    large = torch.ones(nbytes // 4)
    links: list[dict[str, Any]] = []
    for a in range(world):
        for b in range(a + 1, world):
            dist.barrier()  # one link at a time: the others compute until the next barrier
            with _computing(cfg.rank not in (a, b)):
                if cfg.rank in (a, b):
                    links += _measure_pair(cfg.rank, a, b, large, repeats)
                dist.barrier()
    dist.barrier()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, links)
    collectives = [_collective(op, world, nbytes, repeats) for op in ("all_reduce", "all_to_all")]
    overhead = _exchange_overhead(world, cfg.rank, SMALL_REPEATS)
    if cfg.rank != 0:
        return None
    for link in (x for part in gathered for x in part):
        link["same_host"] = addresses[link["src"]] == addresses[link["dst"]]
    return {"addresses": list(addresses), "links": sorted((x for part in gathered for x in part),
                                                          key=lambda x: (x["src"], x["dst"])),
            "collectives": collectives, "exchange_overhead": overhead}


def links_then_machines(cfg: DistConfig, time_machine: Callable[[Callable[[], None]], tuple[dict, Any]]
                        ) -> tuple[dict[str, Any], Any, list[dict]] | None:
    """The links (`network_probe`), then every rank's machine timed at once, as a job's ranks compute at once.

    `time_machine(barrier)` times this rank's machine, each timing of a layer started on every rank at the
    same moment through `barrier`, and returns (what every rank sends rank 0, what only rank 0's is kept of).
    Rank 0 returns (the links, its own kept part, every rank's sent part); the others None.
    """
    measured = network_probe(cfg)
    sent, kept = time_machine(dist.barrier)
    every: list | None = [None] * cfg.world_size if cfg.rank == 0 else None
    dist.gather_object(sent, every, dst=0)
    return None if measured is None else (measured, kept, every)


def profile_fields(measured: dict[str, Any]) -> dict[str, Any]:
    """ClusterProfile fields from `network_probe`'s measurements (the machine's own figures come elsewhere)."""
    addresses = measured["addresses"]
    per_host = {a: addresses.count(a) for a in addresses}
    links = measured["links"]
    cross = [x for x in links if not x["same_host"]] or links
    same = [x for x in links if x["same_host"]]
    inter = statistics.median(x["bandwidth"] for x in cross)
    hosts, ranks = len(per_host), max(per_host.values())
    return {"workers": len(addresses), "devices_per_node": ranks, "inter_bandwidth": inter,
            "intra_bandwidth": statistics.median(x["bandwidth"] for x in same) if same else inter,
            "latency": max(statistics.fmean(x["latency"] for x in cross),
                           measured.get("exchange_overhead", 0.0) / max(len(addresses) - 1, 1)),
            "topology": "ethernet (measured)",
            "description": f"{hosts} hosts x {ranks} ranks as measured by gnnc probe --network",
            "links": [{k: x[k] for k in ("src", "dst", "same_host", "latency", "bandwidth")} for x in links],
            "collectives": measured["collectives"]}
