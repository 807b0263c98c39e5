"""The schedule annotations: every execution decision the `schedule` pass writes into the IR.

(How a layer's work and messages run; the order of a training step's phases, P3's 2F2B pipeline,
is a step schedule: gnnc.plan.schedules.)

Why this module exists: the distributed runtime executes a plan's schedule
and the cost model prices it; both must read the same decisions, so they are
IR attributes whose names, values and meaning are defined once, here, and read
through `layer_schedule` / `exchange_schedule` / `program_schedule` by both
(`gnnc.runtime.distributed` and `gnnc.passes.cost`). Nothing is decided at run
time. The vocabulary:

On a communication equation:
* `halo[overlap=true]`: the exchange is posted where it stands and its readers
  run once per *source part*: first the edges from rows the worker holds,
  while the remote rows are in flight, then the edges from the remote rows
  once they have arrived (NeutronStar's DepComm overlap). `overlap=false`:
  the readers wait for every row.
* `halo[overlap=true, chunked=true]`: the remote rows come peer by peer
  (NeutronStar's chunks, section 4.3): the readers run on the held rows,
  then on each peer's rows as soon as that peer's have arrived, peers in
  ring order (rank-1, rank-2, ...), instead of once on the whole halo; in
  backward each peer's gradients are sent back as soon as they are
  computed. `chunked=false` (or absent): the remote rows as one part.
* `halo[pipelined=true]`: G3's inter-layer pipeline (section 5.2; gnnc.plan.bins.PipeChain): the previous
  graph layer's bins, as each ends, compute their rows of this halo's input and send them to the peers
  that need them; this (binned) layer runs each bin once every peer's bin its sources come in has arrived.
* `halo[method=ring]`: the message order (`HALO_METHODS`): `ring` posts one
  chunk per peer, step j sending to rank+j+1 and receiving from rank-j-1
  (NeutronStar's ring); `ring_paced` waits for each step before the next (no
  overlap); `all_to_all` is one collective.
* `bcast_rows[staged=true]`: MG-GCN's staged SpMM: the readers run once per
  row block, stage j multiplying the block received from rank j while stage
  j+1's broadcast is in flight, so a worker never holds more than two blocks
  (O(N/P + block) memory, not O(N)). `staged=false`: every block is gathered
  first, and the readers run once over all N rows.
On any other equation:
* `split=true`: the equation runs once per source part of its layer's split
  exchange (above); an aggregation combines its parts (sum and mean add the
  parts' sums, mean then divides by the global in-degree; max/min take the
  larger/smaller; `edge_softmax` takes the maximum and the denominator over
  every part).
* `bin=true`: the equation runs once per bin of its layer's output rows.
On a graph layer:
* `bins=k` (k >= 2): G3's bins: the layer's output rows in `bin_order`, cut
  into k bins of equal size; the equations marked `bin=true` run bin by bin,
  bins whose inputs are all held first while the layer's halo is in flight
  (eager computation), the others after it has arrived; each bin's
  activations are recomputed in backward, in reverse bin order, so only one
  bin's are alive at a time.
* `bin_order=boundary_bfs` (`BIN_ORDERS`): breadth-first from the vertices
  with a remote neighbour, those first (G3's priority list).
On any layer with parameters:
* `grad_bucket=b`: its parameters' gradients are summed over workers in
  all-reduce bucket b (buckets are posted in order 0, 1, ...).
On the program (`attrs` line):
* `grad_overlap=true`: a bucket's all-reduce is posted as soon as its
  gradients exist, while backward goes on; false: after backward.
* `memory_cap=BYTES`: the activation memory per worker the schedule was fitted to.

`check_schedule` refuses malformed values (a plan is data, PlanError names the
layer and the attribute).
"""
from __future__ import annotations

from dataclasses import dataclass

from gnnc.errors import PlanError
from gnnc.ir import Eqn, Layer, Program
from gnnc.plan.comm_ops import chunk_flags, exchange_of, split_flags

HALO_METHODS = ("ring", "ring_paced", "all_to_all")
BIN_ORDERS = ("boundary_bfs",)


@dataclass(frozen=True)
class ExchangeSchedule:
    """How one communication equation runs (see the module docstring)."""

    split: bool  # its split flag set (gnnc.plan.comm_ops: halo overlap=true, bcast_rows staged=true)
    method: str = "ring"  # a halo's or fetch's message order
    chunked: bool = False  # a split exchange's remote rows peer by peer (its chunk flag: halo chunked=true)


@dataclass(frozen=True)
class LayerSchedule:
    """How one layer runs: its bins and its gradient bucket."""

    bins: int = 1
    bin_order: str = "boundary_bfs"
    grad_bucket: int | None = None

    @property
    def binned(self) -> bool:
        return self.bins > 1


@dataclass(frozen=True)
class ProgramSchedule:
    """Program-wide decisions: gradient all-reduce overlap, and the memory cap the schedule fits."""

    grad_overlap: bool = False
    memory_cap: int | None = None


def exchange_schedule(e: Eqn) -> ExchangeSchedule:
    d = exchange_of(e.op)
    flag = d.split_flag if d is not None else None
    split = bool(e.attr(flag, False)) if flag else False
    chunk = d.chunk_flag if d is not None else None
    return ExchangeSchedule(split, e.attr("method", "ring"), split and chunk is not None and bool(e.attr(chunk, False)))


def layer_schedule(layer: Layer) -> LayerSchedule:
    return LayerSchedule(int(layer.attr("bins", 1)), layer.attr("bin_order", "boundary_bfs"),
                         layer.attr("grad_bucket"))


def program_schedule(program: Program) -> ProgramSchedule:
    return ProgramSchedule(bool(program.attr("grad_overlap", False)), program.attr("memory_cap"))


def split_eqn(e: Eqn) -> bool:
    """Whether `e` runs once per source part of its layer's split exchange."""
    return bool(e.attr("split", False))


def bin_eqn(e: Eqn) -> bool:
    """Whether `e` runs once per bin of its layer's output rows."""
    return bool(e.attr("bin", False))


def split_exchange(layer: Layer) -> Eqn | None:
    """The layer's exchange whose readers run per source part, if any."""
    return next((e for e in layer.eqns if exchange_schedule(e).split), None)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


def check_schedule(program: Program) -> None:
    """Refuse schedule annotations the runtime cannot follow (PlanError names the layer and attribute)."""
    if not _flag(program.attr("grad_overlap", False)):
        raise PlanError(f"program attribute grad_overlap must be true or false, not {program.attr('grad_overlap')!r}")
    cap = program.attr("memory_cap")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0):
        raise PlanError(f"program attribute memory_cap must be a positive number of bytes, not {cap!r}")
    buckets: set[int] = set()
    for layer in program.layers:
        bins, order, bucket = layer.attr("bins", 1), layer.attr("bin_order", "boundary_bfs"), layer.attr("grad_bucket")
        if not isinstance(bins, int) or isinstance(bins, bool) or bins < 1:
            raise PlanError(f"layer {layer.name}: bins must be a positive integer, not {bins!r}")
        if bins > 1 and layer.kind != "graph":
            raise PlanError(f"layer {layer.name}: only graph layers run in bins")
        if order not in BIN_ORDERS:
            raise PlanError(f"layer {layer.name}: bin_order must be one of {', '.join(BIN_ORDERS)}, not {order!r}")
        if bucket is not None:
            if not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < 0:
                raise PlanError(f"layer {layer.name}: grad_bucket must be a bucket number, not {bucket!r}")
            buckets.add(bucket)
        splits = 0
        for e in layer.eqns:
            for key in (*split_flags(), *chunk_flags(), "split", "bin", "pipelined"):
                if not _flag(e.attr(key, False)):
                    raise PlanError(f"layer {layer.name}: {e.op}'s {key} must be true or false, not {e.attr(key)!r}")
            if e.attr("method", "ring") not in HALO_METHODS:
                raise PlanError(f"layer {layer.name}: {e.op}'s method must be one of {', '.join(HALO_METHODS)}, "
                                f"not {e.attr('method')!r}")
            splits += exchange_schedule(e).split
            d = exchange_of(e.op)
            if d is not None and d.chunk_flag and e.attr(d.chunk_flag, False) and not exchange_schedule(e).split:
                raise PlanError(f"layer {layer.name}: {e.op}'s {d.chunk_flag} needs {d.split_flag}=true (its remote "
                                "rows come in chunks only when its readers run per part)")
            if bins > 1 and d is not None and d.chunk_flag and e.attr(d.chunk_flag, False):
                raise PlanError(f"layer {layer.name}: a binned layer runs whole bins, not chunks ({e.op})")
            if bins > 1 and (split_eqn(e) or exchange_schedule(e).split and not (d is not None and d.split_in_bins)):
                raise PlanError(f"layer {layer.name}: a binned layer runs whole bins, not split parts ({e.op})")
        if splits > 1 and len({e.op for e in layer.eqns if exchange_schedule(e).split}) > 1:
            raise PlanError(f"layer {layer.name}: its split exchanges must be of one kind")
        if len({exchange_schedule(e).chunked for e in layer.eqns if exchange_schedule(e).split}) > 1:
            raise PlanError(f"layer {layer.name}: its split exchanges must all come in chunks or none")
    if buckets and buckets != set(range(len(buckets))):
        raise PlanError(f"gradient buckets must be numbered 0..{len(buckets) - 1}, got {sorted(buckets)}")
