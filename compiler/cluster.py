"""Cluster profiles: the hardware figures the cost model turns into seconds.

Why this module exists: the planner predicts the time, bytes and memory of
every strategy from graph statistics *and* the machines that will run it. A
`ClusterProfile` holds those machine figures (workers, links, memory, compute
rates) in one validated, immutable record; profiles come from the presets of
docs/design.md section 9 (`gnnc clusters` lists them), from a JSON file
(`--cluster FILE`) or from `gnnc probe` (the `local` preset).

Units, everywhere: bytes, bytes per second (one direction of a link; a
full-duplex link moves that much each way), seconds, FLOP per second. The SpMM
rate is in *edge-feature multiply-adds per second* (one source element times
one edge weight added into one destination element); the presets derive it
from the memory bandwidth because SpMM is memory-bound (see `_spmm_rate`).

The preset figures are transcribed from the vendors' public specifications
and the link speeds docs/design.md states; each carries a comment naming its
source. They are never adjusted to make a planner decision come out: a
decision that needs a different figure is a bug in the cost model, not in a
preset. Latencies are the exception the datasheets leave open: they are
order-of-magnitude assumptions for the software stack over each link kind,
marked as such where they are set.

The JSON format (`version` 1) holds every field of `ClusterProfile` by name. `gnnc probe` also
writes `unit_costs`, NeutronStar's T_v, T_e, T_c per layer width as it fitted them (a list of
`LayerUnitCosts` objects); the field is optional, left out when empty, so files without it (and
every older profile) still load, and a profile without a fit is written exactly as before.
`gnnc probe --network` (under torchrun) adds `links` and `collectives`, what it measured between
the job's ranks (`LinkMeasurement`, `CollectiveMeasurement`), optional and left out when empty in
the same way. `gnnc probe` also writes `op_rates` (`OpRate`: seconds per element of each class of the
IR's other ops, forward and backward), optional likewise; a profile without them prices those ops from
its memory bandwidth (`ClusterProfile.op_rate`). It also writes `kernel_rates` (`KernelRate`: the dense map's
three products and the aggregation forward and backward, timed alone at several widths), optional likewise; a
profile without them prices every width at the one rate (`ClusterProfile.kernel_slowdown`). It also writes
`size_rates` (`SizeRate`: elementwise ops and the aggregation timed at several working-set sizes), optional
likewise; a profile without them prices every size at the one rate (`ClusterProfile.size_factor` is 1).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gnnc.errors import GnncError
from gnnc.files import atomic_write, read_text_input

PROFILE_VERSION = 1

GB = 1e9  # vendors' GB/s and GB of bandwidth are decimal
GIB = 1 << 30  # GPU memory sizes are binary (a "16 GB" HBM2 stack holds 16 GiB)
GBIT = 1e9 / 8  # one Gb/s in bytes/s
TFLOPS = 1e12


@dataclass(frozen=True)
class LayerUnitCosts:
    """NeutronStar's unit costs at one layer width (its Algorithm 4 and Eq. 1-3), as `gnnc probe` fits them.

    d_in, d_out: the layer's input and output widths; row_width: the width of the rows the layer
        exchanges (d_out when its dense map runs first, as in GCN).
    T_v: seconds per vertex computed (forward plus backward: the dense map and what runs per row).
    T_e: seconds per edge aggregated (forward plus backward).
    T_c: seconds per row of row_width elements communicated, one way, at the measured bandwidth.
    const: seconds per layer call that neither count explains (the fit's intercept).
    """

    d_in: int
    d_out: int
    row_width: int
    T_v: float
    T_e: float
    T_c: float
    const: float = 0.0


@dataclass(frozen=True)
class LinkMeasurement:
    """One direction of a link between two ranks, as `gnnc probe --network` measured it.

    src, dst: the ranks; same_host: whether they share a host (the link is then the machine's own).
    latency: seconds, half the round trip of a one-element message.
    bandwidth: bytes/s of a large message from src to dst.
    """

    src: int
    dst: int
    same_host: bool
    latency: float
    bandwidth: float


@dataclass(frozen=True)
class CollectiveMeasurement:
    """One collective over every rank, as `gnnc probe --network` measured it.

    op: "all_reduce" or "all_to_all"; bytes: the buffer each rank holds; seconds: the median call;
    bandwidth: bytes/s each rank sent (a ring all-reduce sends 2(P-1)/P of the buffer, an all-to-all (P-1)/P).
    """

    op: str
    bytes: int
    seconds: float
    bandwidth: float


# The classes of ops the cost model prices per element (gnnc.passes.cost.ops says which op is which),
# and what a profile without a measurement derives their cost from: bytes moved per element, forward
# and backward, read at the memory bandwidth (memory-bound work: a derivation, not a measurement).
#   elementwise: read and write one float (8); backward reads the gradient and the saved input, writes one (12)
#   dropout: read and write one float, one mask byte (9), backward the same (9); `dropout_row`, per row
#       dropped out, is what drawing a row's mask costs besides its elements (its key's hash): 0 derived
#   copy: a row gathered or assembled (index_select, cat, index_add): read and write one float (8, 8)
#   attention: sddmm and edge_softmax per edge and head: two edge operations at the SpMM rate's 16 bytes
#       each (the estimate the cost model used before op costs were measured: 4 per edge and head for
#       score, leaky_relu, softmax and dropout, of which leaky_relu and dropout are now their own ops);
#       `attention_row`, per edge whatever its heads, is what an edge costs besides them (its index read,
#       its destination's segment): 0 derived. Timed alone on a 16,000-vertex R-MAT graph the softmax of
#       8 heads took 3.8 times that of 1, not 8.
#   loss: cross_entropy per logit: log-softmax reads twice and writes once, plus the pick (16); backward (12)
#   optimizer: Adam per parameter element: reads param, grad, two moments, writes param and moments (28)
# `call` (seconds per op executed, forward or backward) and `optimizer_call` (per parameter tensor of
# an optimizer step) are not per element; without a measurement they are CALL_OVERHEAD_S.
OP_CLASSES = ("elementwise", "dropout", "dropout_row", "copy", "attention", "attention_row", "loss", "optimizer",
              "optimizer_call", "call")
_OP_BYTES = MappingProxyType({"elementwise": (8.0, 12.0), "dropout": (9.0, 9.0), "dropout_row": (0.0, 0.0),
                              "copy": (8.0, 8.0), "attention": (32.0, 32.0), "attention_row": (0.0, 0.0),
                              "loss": (16.0, 12.0), "optimizer": (28.0, 0.0)})
CALL_OVERHEAD_S = 10e-6  # assumed: a framework's dispatch of one op (Python, a kernel launch), ~10 us


@dataclass(frozen=True)
class OpRate:
    """What one class of ops costs on these machines, as `gnnc probe` measured it (through gnnc's executor).

    op: one of OP_CLASSES; forward, backward: seconds per element (per op executed for `call`,
    per parameter tensor for `optimizer_call`; an optimizer step has no backward: 0).
    """

    op: str
    forward: float
    backward: float


# The kernels `kernel_rates` times at several widths (gnnc.runtime.probe.kernel_rate_samples): a dense map
# x[rows, k] @ W[k, n] forward, its weight gradient x^T @ g and its input gradient g @ W^T (FLOP/s), and the
# aggregation A @ x[:, n] forward, A^T @ g backward and the gradient of A's values (edge-feature
# multiply-adds/s; k is 0 for one value per edge, else the heads of per-head values, as attention's).
KERNELS = ("gemm_f", "gemm_dw", "gemm_dx", "spmm_f", "spmm_b", "spmm_dw")


@dataclass(frozen=True)
class KernelRate:
    """One kernel at one shape, as `gnnc probe` timed it alone: `kernel` (KERNELS) reading k-wide rows and
    writing n-wide ones (an aggregation: n its width per head, k its heads when its edge values are per head,
    as attention's, 0 for one value per edge) at `rate` (FLOP/s of a dense map, edge-feature multiply-adds/s
    of an aggregation, all heads counted)."""

    kernel: str
    k: int
    n: int
    rate: float


# What `size_rates` times at several working-set sizes (gnnc.runtime.probe.size_rate_samples): the elementwise
# ops forward and backward ("elementwise.forward", "elementwise.backward": seconds per element, the class's
# OpRate) and the aggregation's kernels ("spmm_f", "spmm_b": KERNELS' rates at one value per edge).
SIZED = ("elementwise.forward", "elementwise.backward", "spmm_f", "spmm_b")


@dataclass(frozen=True)
class SizeRate:
    """One op's or kernel's time per unit of work at one working set, as `gnnc probe` timed it alone: `kind`
    (SIZED) on `rows` rows of `width` fp32 elements (its working set: rows * width * 4 bytes; an aggregation's
    source rows, on an R-MAT graph of `rows` vertices at the probe's degree), `factor` times its time per unit of
    work at the probe's reference size (the largest timed, factor 1: the size the rest of the profile's rates,
    OpRate and KernelRate, were measured at)."""

    kind: str
    rows: int
    width: int
    factor: float

    @property
    def bytes(self) -> float:
        return 4.0 * self.rows * self.width


@dataclass(frozen=True)
class ClusterProfile:
    """The machines a plan runs on.

    name: how presets and files call it.
    workers: the number of workers (one per GPU, or per process on a CPU
        machine) the cluster offers; a plan may use fewer.
    devices_per_node: workers sharing one machine (and its network link).
    intra_bandwidth: bytes/s one worker can send to another on its machine.
    inter_bandwidth: bytes/s of one machine's network link (shared by the
        machine's workers).
    latency: seconds to start one message (the alpha of alpha-beta costs).
    topology: the interconnect in words ("ethernet", "infiniband", "pcie",
        "nvlink-hybrid-cube-mesh", "nvswitch", "shared-memory").
    memory_per_worker: bytes of device memory one worker may fill.
    memory_bandwidth: bytes/s of one worker's device memory.
    gemm_rate: dense FP32 FLOP/s of one worker (a multiply-add is 2 FLOP).
    spmm_rate: edge-feature multiply-adds per second of one worker.
    t_v, t_e, t_c: NeutronStar's measured unit costs, when `gnnc probe`
        measured them: seconds per vertex per d_in*d_out multiply-add of the
        dense map, seconds per edge per feature of the aggregation, seconds
        per byte of a communicated row. They override the rates above where
        the cost model needs them (`effective_*`); None: derive from rates.
        `gnnc probe` fits them (gnnc.passes.cost.fit) to timings of gnnc's own executor (runtime/probe.py).
    t_v_forward, t_e_forward: the same fitted to the dense maps and aggregations forward alone, as
        the evaluation pass runs them (a dense map's backward products run at another rate);
        None: t_v, t_e (`effective_*_forward`).
    description: one line for `gnnc clusters`.
    unit_costs: the per-layer-width T_v, T_e, T_c behind t_v, t_e, t_c, in NeutronStar's units
        (`LayerUnitCosts`); empty unless `gnnc probe` fitted them.
    links, collectives: what `gnnc probe --network` measured between the ranks of a torchrun job
        (per link and direction; per collective), behind inter_bandwidth, intra_bandwidth and latency;
        empty otherwise.
    op_rates: what each class of the IR's other ops costs per element (`OpRate`), as `gnnc probe`
        measured it; a class it does not list is derived (`op_rate`).
    gemm_rate_bf16, gemm_rate_fp16: dense FLOP/s of one worker in bfloat16 / float16 with float32
        accumulation (a GPU's tensor cores), what `--precision bf16|fp16` prices dense maps at;
        None: no faster than gemm_rate (the type has no hardware path there, or nobody measured it).
    spmm_rate_16: edge-feature multiply-adds per second with 16-bit rows; None: spmm_rate.
    kernel_rates: the dense map's products and the aggregation timed alone at several widths
        (`KernelRate`); what `kernel_slowdown` scales the fitted rates by at a layer's widths. Empty: every
        width runs at the one rate.
    size_rates: elementwise ops and the aggregation timed at several working sets (`SizeRate`); what
        `size_factor` scales their rates by at an op's own working set. Empty: every size at the one rate.
    """

    name: str
    workers: int
    devices_per_node: int
    intra_bandwidth: float
    inter_bandwidth: float
    latency: float
    topology: str
    memory_per_worker: float
    memory_bandwidth: float
    gemm_rate: float
    spmm_rate: float
    t_v: float | None = None
    t_e: float | None = None
    t_c: float | None = None
    t_v_forward: float | None = None
    t_e_forward: float | None = None
    description: str = ""
    unit_costs: tuple[LayerUnitCosts, ...] = ()
    links: tuple[LinkMeasurement, ...] = ()
    collectives: tuple[CollectiveMeasurement, ...] = ()
    op_rates: tuple[OpRate, ...] = ()
    gemm_rate_bf16: float | None = None
    gemm_rate_fp16: float | None = None
    spmm_rate_16: float | None = None
    kernel_rates: tuple[KernelRate, ...] = ()
    size_rates: tuple[SizeRate, ...] = ()

    def __post_init__(self) -> None:
        _validate({f.name: getattr(self, f.name) for f in fields(self)}, f"cluster profile '{self.name}'")

    @property
    def nodes(self) -> int:
        """Machines the full cluster spans."""
        return math.ceil(self.workers / self.devices_per_node)

    def for_workers(self, workers: int) -> ClusterProfile:
        """The same machines with `workers` of them in use; more than the cluster has is an error."""
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise GnncError(f"workers must be a positive integer, got {workers!r}")
        if workers > self.workers:
            raise GnncError(f"cluster '{self.name}' has {self.workers} workers; {workers} were asked for "
                            f"(field 'workers')")
        return replace(self, workers=workers)

    def worker_bandwidth(self, workers: int | None = None) -> float:
        """Bytes/s one worker moves to its peers when `workers` workers exchange data evenly.

        Workers fill machines in order. A worker's traffic is spread evenly
        over its peers: the share for the peers on its machine goes at
        `intra_bandwidth`; the rest leaves through the machine's link, which
        the machine's workers share. The result is the harmonic mix of the
        two, the rate at which a worker's whole share completes.
        """
        p = self.workers if workers is None else workers
        if p <= 1:
            return self.intra_bandwidth
        local = min(self.devices_per_node, p)
        f_intra = (local - 1) / (p - 1)
        if f_intra >= 1.0:
            return self.intra_bandwidth
        per_worker_inter = self.inter_bandwidth / local
        return 1.0 / (f_intra / self.intra_bandwidth + (1.0 - f_intra) / per_worker_inter)

    @property
    def effective_gemm_rate(self) -> float:
        """FLOP/s of the dense map: from the measured t_v when there is one."""
        return 2.0 / self.t_v if self.t_v is not None else self.gemm_rate

    @property
    def effective_spmm_rate(self) -> float:
        """Edge-feature multiply-adds per second: from the measured t_e when there is one."""
        return 1.0 / self.t_e if self.t_e is not None else self.spmm_rate

    @property
    def effective_gemm_rate_forward(self) -> float:
        """FLOP/s of a dense map forward alone (the evaluation pass): from t_v_forward, else the rate above."""
        return 2.0 / self.t_v_forward if self.t_v_forward is not None else self.effective_gemm_rate

    @property
    def effective_spmm_rate_forward(self) -> float:
        """Edge-feature multiply-adds/s of an aggregation forward alone: from t_e_forward, else the rate above."""
        return 1.0 / self.t_e_forward if self.t_e_forward is not None else self.effective_spmm_rate

    def rates_at(self, precision: str) -> tuple[float, float]:
        """(GEMM FLOP/s, SpMM multiply-adds/s) of one worker computing at `precision` (gnnc.plan.precision).

        fp32: the effective rates. bf16/fp16: the 16-bit figures where the profile has them; the fp32 ones
        otherwise (a conservative price: no slower, perhaps no faster).
        """
        if precision == "fp32":
            return self.effective_gemm_rate, self.effective_spmm_rate
        gemm = {"bf16": self.gemm_rate_bf16, "fp16": self.gemm_rate_fp16}[precision]
        return (gemm if gemm is not None else self.effective_gemm_rate,
                self.spmm_rate_16 if self.spmm_rate_16 is not None else self.effective_spmm_rate)

    def forward_rates_at(self, precision: str) -> tuple[float, float]:
        """`rates_at` for dense maps and aggregations forward alone (the evaluation pass): fp32 from
        t_v_forward and t_e_forward where the probe fitted them; at 16 bits the 16-bit rates."""
        if precision == "fp32":
            return self.effective_gemm_rate_forward, self.effective_spmm_rate_forward
        return self.rates_at(precision)

    def effective_bandwidth(self, workers: int | None = None) -> float:
        """Bytes/s per worker for exchanges: from the measured t_c when there is one."""
        return 1.0 / self.t_c if self.t_c is not None else self.worker_bandwidth(workers)

    def op_rate(self, op: str, direction: str) -> float:
        """Seconds per element of op class `op` (OP_CLASSES) going `direction` ("forward", "backward"):
        the measured figure where `op_rates` has one, else derived from the memory bandwidth (the
        bytes of `_OP_BYTES`) or, for `call` and `optimizer_call`, CALL_OVERHEAD_S."""
        if op not in OP_CLASSES or direction not in ("forward", "backward"):
            raise ValueError(f"no op rate for {op!r} {direction!r} (classes: {', '.join(OP_CLASSES)})")
        for rate in self.op_rates:
            if rate.op == op:
                return rate.forward if direction == "forward" else rate.backward
        if op in ("call", "optimizer_call"):
            return 0.0 if op == "optimizer_call" and direction == "backward" else CALL_OVERHEAD_S
        forward, backward = _OP_BYTES[op]
        return (forward if direction == "forward" else backward) / self.memory_bandwidth

    def kernel_slowdown(self, kernel: str, k: float, n: float) -> float:
        """How many times longer than at its fastest timed shape `kernel` (KERNELS) takes per unit of work
        at widths k, n (an aggregation: k its heads of per-head edge values, 0 for one value per edge; n its
        width per head), by `kernel_rates`: the fastest forward rate of its kind (a dense map's or an
        aggregation's) over its rate here, interpolated in log width and log rate between the widths timed and
        held at the edges (an aggregation at the head count timed nearest, 0 counting as one head). 1.0 without
        `kernel_rates` (every width at the one fitted rate).

        The fitted rates (t_v, t_e) are rates at that fastest shape: gnnc.passes.cost.fit divides the probe's
        own layers' work by the same factors before fitting them.
        """
        return kernel_slowdown(self.kernel_rates, kernel, k, n)

    def size_factor(self, kind: str, working_set: float, reference: float | None = None) -> float:
        """How many times its reference time per unit of work `kind` (SIZED) takes on a working set of
        `working_set` bytes, by `size_rates`; over its factor at `reference` bytes when given (an aggregation's
        width table was timed on the probe's graph at each width: the size term then moves the rate from the
        probe's rows to the layer's at the same width, not from one width to another). 1.0 without `size_rates`
        for `kind` (a profile probed before them prices every size as before).

        The form: log factor linear in log bytes between the sizes timed, held at the smallest and the largest
        (the reference, 1). Why: an op's time per element is flat while its working set fits a cache level and
        flat again once it streams from memory; between the sizes timed the share of accesses that hit falls
        as the set outgrows each level, which no two points pin down further, and a log-linear blend is
        monotone and exact at every size timed, as `kernel_slowdown` interpolates in log width. Held at the
        largest: the probe's other rates were measured there, and above it nothing was timed."""
        return size_factor(self.size_rates, kind, working_set, reference)

    def to_dict(self) -> dict[str, Any]:
        data = {"version": PROFILE_VERSION, **asdict(self)}
        for key in ("unit_costs", "links", "collectives", "op_rates", "kernel_rates", "size_rates"):
            data[key] = [dict(u) for u in data[key]]
            if not data[key]:
                del data[key]  # optional: a profile without a fit or a network probe reads as it always did
        for key in _OPTIONAL_RATES:
            if data[key] is None:
                del data[key]  # likewise: a profile without 16-bit or forward rates is written as before
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON (atomically: a reader never sees half a file)."""
        atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster profile") -> ClusterProfile:
        """Build a profile from parsed JSON; a missing, unknown or bad field is a GnncError naming it."""
        if not isinstance(data, dict):
            raise GnncError(f"{where}: expected a JSON object, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("version", PROFILE_VERSION)
        if version != PROFILE_VERSION:
            raise GnncError(f"{where}: field 'version' is {version!r}; this gnnc reads version {PROFILE_VERSION}")
        known = {f.name: f for f in fields(cls)}
        for key in sorted(data):
            if key not in known:
                raise GnncError(f"{where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name in data:
                values[name] = data[name]
            elif f.default is MISSING:
                raise GnncError(f"{where}: missing field '{name}'")
            else:
                values[name] = f.default
        values["unit_costs"] = _records_from_json(values["unit_costs"], LayerUnitCosts, "unit_costs", where,
                                                  frozenset({"const"}))
        values["links"] = _records_from_json(values["links"], LinkMeasurement, "links", where)
        values["collectives"] = _records_from_json(values["collectives"], CollectiveMeasurement, "collectives", where)
        values["op_rates"] = _records_from_json(values["op_rates"], OpRate, "op_rates", where)
        values["kernel_rates"] = _records_from_json(values["kernel_rates"], KernelRate, "kernel_rates", where)
        values["size_rates"] = _records_from_json(values["size_rates"], SizeRate, "size_rates", where)
        _validate(values, where)  # with the caller's `where` (the file), before __post_init__ repeats it
        # JSON integers in float fields (e.g. "latency": 0) become floats, so equal profiles compare equal
        return cls(**{k: float(v) if _FIELD_KIND[k].startswith("float") and v is not None else v
                      for k, v in values.items()})


def kernel_slowdown(rates: Sequence[KernelRate], kernel: str, k: float, n: float) -> float:
    """`ClusterProfile.kernel_slowdown` on these `rates` (what gnnc.passes.cost.fit uses before a profile exists)."""
    if kernel not in KERNELS:
        raise ValueError(f"no kernel {kernel!r} (kernels: {', '.join(KERNELS)})")
    table = {(r.k, r.n): r.rate for r in rates if r.kernel == kernel}
    if not table:
        return 1.0
    if not kernel.startswith("gemm"):  # an aggregation's kernel depends on its heads: no interpolation across them
        def heads_apart(timed: int) -> float:
            return abs(math.log(max(timed, 1) / max(k, 1)))
        nearest = min({timed for timed, _ in table}, key=lambda timed: (heads_apart(timed), timed))
        table = {key: rate for key, rate in table.items() if key[0] == nearest}
    forward = kernel.split("_")[0] + "_f"  # the fastest of its kind: a dense map's or an aggregation's forward
    fastest = max(r.rate for r in rates if r.kernel == forward)
    return fastest / _interpolate_rate(table, k, n)


def size_factor(rates: Sequence[SizeRate], kind: str, working_set: float, reference: float | None = None) -> float:
    """`ClusterProfile.size_factor` on these `rates`."""
    table = sorted((r.bytes, r.factor) for r in rates if r.kind == kind)
    if not table:
        return 1.0
    at = _log_linear(table, working_set)
    return at / _log_linear(table, reference) if reference is not None else at


def _log_linear(table: list[tuple[float, float]], x: float) -> float:
    """y at x from (x, y) points sorted by x: log y linear in log x between them, held beyond the ends."""
    if x <= table[0][0]:
        return table[0][1]
    if x >= table[-1][0]:
        return table[-1][1]
    hi = next(i for i, (xi, _) in enumerate(table) if xi >= x)
    (x0, y0), (x1, y1) = table[hi - 1], table[hi]
    f = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) * (1 - f) + math.log(y1) * f)


def _interpolate_rate(table: dict[tuple[int, int], float], k: float, n: float) -> float:
    """The rate at (k, n) from rates timed on a grid of (k, n): bilinear in (log k, log n) of log rate, each width
    held within the widths timed; where the grid lacks a corner, the nearest shape timed (in log widths)."""
    def bracket(values: list[int], x: float) -> tuple[int, int, float]:
        if len(values) == 1 or x <= values[0]:
            return values[0], values[0], 0.0
        if x >= values[-1]:
            return values[-1], values[-1], 0.0
        hi = next(i for i, v in enumerate(values) if v >= x)
        lo_v, hi_v = values[hi - 1], values[hi]
        return lo_v, hi_v, math.log(x / lo_v) / math.log(hi_v / lo_v)

    k0, k1, fk = bracket(sorted({key[0] for key in table}), k)
    n0, n1, fn = bracket(sorted({key[1] for key in table}), n)
    corners = ((k0, n0), (k0, n1), (k1, n0), (k1, n1))
    if not all(c in table for c in corners):
        def distance(key: tuple[int, int]) -> float:
            return abs(math.log(max(key[0], 1) / max(k, 1))) + abs(math.log(key[1] / max(n, 1)))
        return table[min(table, key=distance)]
    log = {c: math.log(table[c]) for c in corners}
    at_n0 = log[(k0, n0)] * (1 - fk) + log[(k1, n0)] * fk
    at_n1 = log[(k0, n1)] * (1 - fk) + log[(k1, n1)] * fk
    return math.exp(at_n0 * (1 - fn) + at_n1 * fn)


_FIELD_KIND = MappingProxyType({
    "name": "str", "workers": "int", "devices_per_node": "int", "intra_bandwidth": "float",
    "inter_bandwidth": "float", "latency": "float", "topology": "str", "memory_per_worker": "float",
    "memory_bandwidth": "float", "gemm_rate": "float", "spmm_rate": "float", "t_v": "float?",
    "t_e": "float?", "t_c": "float?", "t_v_forward": "float?", "t_e_forward": "float?", "description": "str",
    "unit_costs": "unit_costs", "links": "links", "collectives": "collectives", "op_rates": "op_rates",
    "gemm_rate_bf16": "float?", "gemm_rate_fp16": "float?", "spmm_rate_16": "float?",
    "kernel_rates": "kernel_rates", "size_rates": "size_rates",
})
_OPTIONAL_RATES = ("t_v_forward", "t_e_forward", "gemm_rate_bf16", "gemm_rate_fp16", "spmm_rate_16")
_UNITS = MappingProxyType({
    "intra_bandwidth": "bytes/s", "inter_bandwidth": "bytes/s", "latency": "seconds",
    "memory_per_worker": "bytes", "memory_bandwidth": "bytes/s", "gemm_rate": "FLOP/s",
    "spmm_rate": "edge-feature multiply-adds/s", "t_v": "seconds", "t_e": "seconds", "t_c": "seconds/byte",
    "t_v_forward": "seconds", "t_e_forward": "seconds",
    "gemm_rate_bf16": "FLOP/s", "gemm_rate_fp16": "FLOP/s", "spmm_rate_16": "edge-feature multiply-adds/s",
})


def _records_from_json(value: Any, kind: type, name: str, where: str,
                       optional: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    """`unit_costs`, `links` or `collectives` from JSON (a list of objects with `kind`'s fields, those in
    `optional` may be left out) or as built in Python; a bad entry is named."""
    if not isinstance(value, (list, tuple)):
        raise GnncError(f"{where}: field '{name}' must be a list, got {value!r}")
    known = {f.name for f in fields(kind)}
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, kind):
            out.append(entry)
        elif isinstance(entry, dict) and known - optional <= set(entry) <= known:
            out.append(kind(**entry))
        else:
            extra = f" ({', '.join(sorted(optional))} optional)" if optional else ""
            raise GnncError(f"{where}: field '{name}' entry {i} must be an object with the fields "
                            f"{', '.join(sorted(known))}{extra}, got {entry!r}")
    return tuple(out)


def _tuple_of(value: Any, kind: type, name: str, where: str) -> None:
    """A profile's record field holds a tuple of `kind` records, or its error names the field."""
    if not isinstance(value, tuple) or not all(isinstance(u, kind) for u in value):
        raise GnncError(f"{where}: field '{name}' must be a tuple of {kind.__name__}, got {value!r}")


def _finite(v: Any) -> bool:
    """A finite int or float read from a profile (a bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_measurements(value: Any, kind: type, name: str, where: str) -> None:
    """Each `links`/`collectives` entry: integer ranks and bytes, a known op, finite positive times and rates."""
    _tuple_of(value, kind, name, where)
    for i, u in enumerate(value):
        for f in fields(kind):
            v = getattr(u, f.name)
            if f.name in ("src", "dst", "bytes"):
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
            elif f.name == "same_host":
                ok = isinstance(v, bool)
            elif f.name == "op":
                ok = v in ("all_reduce", "all_to_all")
            else:
                ok = _finite(v) and (
                    v >= 0 if f.name == "latency" else v > 0)
            if not ok:
                raise GnncError(f"{where}: field '{name}' entry {i}: '{f.name}' is not valid, got {v!r}")


def _check_unit_costs(value: Any, where: str) -> None:
    """Each entry: positive integer widths, non-negative finite T_v, T_e and const, positive T_c."""
    _tuple_of(value, LayerUnitCosts, "unit_costs", where)
    for i, u in enumerate(value):
        for name in ("d_in", "d_out", "row_width"):
            v = getattr(u, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GnncError(f"{where}: field 'unit_costs' entry {i}: '{name}' must be a positive integer, "
                                f"got {v!r}")
        for name in ("T_v", "T_e", "T_c", "const"):
            v = getattr(u, name)
            ok = _finite(v) and (
                v > 0 if name == "T_c" else v >= 0)
            if not ok:
                raise GnncError(f"{where}: field 'unit_costs' entry {i}: '{name}' must be a "
                                f"{'positive' if name == 'T_c' else 'non-negative'} number (seconds), got {v!r}")


def _check_op_rates(value: Any, where: str) -> None:
    """Each entry: a known class, once, with finite non-negative seconds."""
    _tuple_of(value, OpRate, "op_rates", where)
    seen: set[str] = set()
    for i, u in enumerate(value):
        if u.op not in OP_CLASSES or u.op in seen:
            raise GnncError(f"{where}: field 'op_rates' entry {i}: 'op' must be one of {', '.join(OP_CLASSES)}, "
                            f"each once, got {u.op!r}")
        seen.add(u.op)
        for name in ("forward", "backward"):
            v = getattr(u, name)
            if not (_finite(v) and v >= 0):
                raise GnncError(f"{where}: field 'op_rates' entry {i}: '{name}' must be a non-negative number "
                                f"(seconds), got {v!r}")


def _check_kernel_rates(value: Any, where: str) -> None:
    """Each entry: a known kernel, integer widths (k positive for a dense map, 0 or a head count for an
    aggregation; n positive), a finite positive rate, each shape once."""
    _tuple_of(value, KernelRate, "kernel_rates", where)
    seen: set[tuple[str, int, int]] = set()
    for i, u in enumerate(value):
        if u.kernel not in KERNELS:
            raise GnncError(f"{where}: field 'kernel_rates' entry {i}: 'kernel' must be one of {', '.join(KERNELS)}, "
                            f"got {u.kernel!r}")
        for name in ("k", "n"):
            v = getattr(u, name)
            dense = u.kernel.startswith("gemm")
            if not (isinstance(v, int) and not isinstance(v, bool)
                    and (v >= 1 if (name == "n" or dense) else v >= 0)):
                want = "a positive integer" if (name == "n" or dense) else "0 or a head count for an aggregation"
                raise GnncError(f"{where}: field 'kernel_rates' entry {i}: '{name}' must be {want}, got {v!r}")
        if not (_finite(u.rate) and u.rate > 0):
            raise GnncError(f"{where}: field 'kernel_rates' entry {i}: 'rate' must be a positive number, "
                            f"got {u.rate!r}")
        if (u.kernel, u.k, u.n) in seen:
            raise GnncError(f"{where}: field 'kernel_rates' entry {i}: {u.kernel} at k={u.k}, n={u.n} is listed twice")
        seen.add((u.kernel, u.k, u.n))


def _check_size_rates(value: Any, where: str) -> None:
    """Each entry: a known kind, positive integer rows and width, a finite positive factor, each size once."""
    _tuple_of(value, SizeRate, "size_rates", where)
    seen: set[tuple[str, float]] = set()
    for i, u in enumerate(value):
        if u.kind not in SIZED:
            raise GnncError(f"{where}: field 'size_rates' entry {i}: 'kind' must be one of {', '.join(SIZED)}, "
                            f"got {u.kind!r}")
        for name in ("rows", "width"):
            v = getattr(u, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise GnncError(f"{where}: field 'size_rates' entry {i}: '{name}' must be a positive integer, "
                                f"got {v!r}")
        if not (_finite(u.factor) and u.factor > 0):
            raise GnncError(f"{where}: field 'size_rates' entry {i}: 'factor' must be a positive number, "
                            f"got {u.factor!r}")
        if (u.kind, u.bytes) in seen:
            raise GnncError(f"{where}: field 'size_rates' entry {i}: {u.kind} at {u.bytes:.0f} bytes is listed twice")
        seen.add((u.kind, u.bytes))


def _check_types(data: dict[str, Any], where: str) -> None:
    for key, value in data.items():
        kind = _FIELD_KIND[key]
        if kind == "unit_costs":
            _check_unit_costs(value, where)
            continue
        if kind == "op_rates":
            _check_op_rates(value, where)
            continue
        if kind == "kernel_rates":
            _check_kernel_rates(value, where)
            continue
        if kind == "size_rates":
            _check_size_rates(value, where)
            continue
        if kind in ("links", "collectives"):
            _check_measurements(value, LinkMeasurement if kind == "links" else CollectiveMeasurement, kind, where)
            continue
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                kind == "float?" and value is None)
        if not ok:
            want = {"str": "a string", "int": "an integer", "float": "a number", "float?": "a number or null"}[kind]
            raise GnncError(f"{where}: field '{key}' must be {want}, got {value!r}")


def _validate(p: dict[str, Any], where: str) -> None:
    """Every figure must be usable by the cost model: the right type, positive, finite."""
    _check_types(p, where)
    for key in ("name", "topology"):
        if not p[key]:
            raise GnncError(f"{where}: field '{key}' must not be empty")
    for key in ("workers", "devices_per_node"):
        if p[key] < 1:
            raise GnncError(f"{where}: field '{key}' must be at least 1, got {p[key]}")
    for key in ("intra_bandwidth", "inter_bandwidth", "memory_per_worker", "memory_bandwidth", "gemm_rate",
                "spmm_rate", "t_v", "t_e", "t_c", *_OPTIONAL_RATES):
        value = p[key]
        if value is None:
            continue
        if not math.isfinite(value) or value <= 0:
            raise GnncError(f"{where}: field '{key}' must be a positive number ({_UNITS[key]}), got {value!r}")
    if not math.isfinite(p["latency"]) or p["latency"] < 0:
        raise GnncError(f"{where}: field 'latency' must be a non-negative number (seconds), got {p['latency']!r}")


def load_profile(path: str | os.PathLike[str]) -> ClusterProfile:
    """Read a profile written by `ClusterProfile.save` or `gnnc probe`."""
    where = f"cluster profile {os.fspath(path)}"
    text = read_text_input(path, where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GnncError(f"{where}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    return ClusterProfile.from_dict(data, where)


# --- presets -----------------------------------------------------------------------------------

# Per-direction speeds of the links the presets use.
PCIE3_X16 = 8e9 * 16 * (128 / 130) / 8  # PCI-SIG PCIe 3.0: 8 GT/s per lane, 128b/130b coding: 15.75 GB/s
PCIE4_X16 = 16e9 * 16 * (128 / 130) / 8  # PCI-SIG PCIe 4.0: 16 GT/s per lane: 31.5 GB/s

# Latency assumptions (no datasheet gives the start-up time a collective library sees):
ETHERNET_LATENCY = 50e-6  # assumed: TCP sockets through the kernel, tens of microseconds per message
INFINIBAND_LATENCY = 5e-6  # assumed: RDMA verbs plus library overhead, a few microseconds
GPU_LINK_LATENCY = 10e-6  # assumed: NVLink/PCIe transfers launched as GPU work, ~10 us per message


def _spmm_rate(memory_bandwidth: float, bytes_per_element: int = 4) -> float:
    """Edge-feature multiply-adds/s of a memory-bound SpMM.

    Each multiply-add reads one source element that, on a large sparse graph,
    is not reused from cache (MG-GCN: SpMM is bandwidth-bound), so the rate is
    the memory bandwidth over the bytes of one element (4 in FP32, 2 in 16
    bits). A derivation from the datasheet's bandwidth, not a measurement.
    """
    return memory_bandwidth / bytes_per_element


def _gpu(name: str, description: str, *, workers: int, devices_per_node: int, intra: float, inter: float,
         latency: float, topology: str, memory: float, bandwidth: float, fp32: float,
         bf16: float | None = None, fp16: float | None = None) -> ClusterProfile:
    """A GPU cluster: fp32, bf16 and fp16 the GPU's dense rates (the 16-bit ones with fp32 accumulation,
    None where the datasheet gives no tensor-core figure for the type); SpMM rates from its memory bandwidth."""
    return ClusterProfile(name=name, workers=workers, devices_per_node=devices_per_node, intra_bandwidth=intra,
                          inter_bandwidth=inter, latency=latency, topology=topology, memory_per_worker=memory,
                          memory_bandwidth=bandwidth, gemm_rate=fp32, spmm_rate=_spmm_rate(bandwidth),
                          description=description, gemm_rate_bf16=bf16, gemm_rate_fp16=fp16,
                          spmm_rate_16=_spmm_rate(bandwidth, 2))


def _p3() -> ClusterProfile:
    # P3 (OSDI'21) evaluation cluster, docs/design.md section 9: 4 machines x 4 P100, 10 Gb/s Ethernet.
    # NVIDIA Tesla P100 datasheet, PCIe 16 GB card: 9.3 TFLOPS FP32, 16 GB CoWoS HBM2 at 732 GB/s.
    # (The SXM2 card would come with NVLink, which docs/design.md does not mention, so the PCIe card
    # and a PCIe 3.0 x16 path between a machine's GPUs are assumed.)
    return _gpu("p3", "P3: 4 machines x 4 P100 (PCIe), 10 Gb/s Ethernet", workers=16, devices_per_node=4,
                intra=PCIE3_X16, inter=10 * GBIT, latency=ETHERNET_LATENCY, topology="ethernet",
                memory=16 * GIB, bandwidth=732 * GB, fp32=9.3 * TFLOPS)


def _t4_ecs(name: str, workers: int) -> ClusterProfile:
    # NeutronStar (SIGMOD'22) Aliyun ECS cluster, docs/design.md section 1 and 9: one T4 per machine, 6 Gb/s.
    # NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 16 GB GDDR6 at 320 GB/s, PCIe 3.0 x16 host link.
    return _gpu(name, f"NeutronStar ECS: {workers} machines x 1 T4, 6 Gb/s network", workers=workers,
                devices_per_node=1, intra=PCIE3_X16, inter=6 * GBIT, latency=ETHERNET_LATENCY,
                topology="ethernet", memory=16 * GIB, bandwidth=320 * GB, fp32=8.1 * TFLOPS)


def _neutronstar_ibv() -> ClusterProfile:
    # NeutronStar's InfiniBand cluster, docs/design.md: 8 machines x 1 V100, 100 Gb/s InfiniBand.
    # NVIDIA V100 datasheet, PCIe card (one GPU per machine, so no NVLink): 14 TFLOPS FP32,
    # 16 GB HBM2 at 900 GB/s, PCIe 3.0 x16 host link.
    return _gpu("neutronstar-ibv", "NeutronStar IB: 8 machines x 1 V100, 100 Gb/s InfiniBand", workers=8,
                devices_per_node=1, intra=PCIE3_X16, inter=100 * GBIT, latency=INFINIBAND_LATENCY,
                topology="infiniband", memory=16 * GIB, bandwidth=900 * GB, fp32=14 * TFLOPS)


def _g3() -> ClusterProfile:
    # G3 (SIGMOD'23) cluster, docs/design.md: 16 machines x 1 RTX 3090, 10 Gb/s.
    # NVIDIA GeForce RTX 3090 specifications / Ampere GA102 whitepaper: 35.6 TFLOPS peak FP32,
    # 24 GB GDDR6X at 936 GB/s, PCIe 4.0 x16 host link. GA102 whitepaper, appendix: RTX 3090 peak FP16 and
    # BF16 Tensor TFLOPS with FP32 accumulate 71 dense (142 with sparsity).
    return _gpu("g3", "G3: 16 machines x 1 RTX 3090, 10 Gb/s Ethernet", workers=16, devices_per_node=1,
                intra=PCIE4_X16, inter=10 * GBIT, latency=ETHERNET_LATENCY, topology="ethernet",
                memory=24 * GIB, bandwidth=936 * GB, fp32=35.6 * TFLOPS, bf16=71 * TFLOPS, fp16=71 * TFLOPS)


def _gnnpipe() -> ClusterProfile:
    # GNNPipe cluster, docs/design.md: 2 machines x 4 RTX A5000, PCIe 4.0 inside, 200 Gb/s between.
    # NVIDIA RTX A5000 datasheet: 27.8 TFLOPS FP32, 24 GB GDDR6 at 768 GB/s, PCIe 4.0 x16; tensor
    # performance 222.2 TFLOPS with sparsity, i.e. 111.1 dense (FP16 and BF16, FP32 accumulation).
    return _gpu("gnnpipe", "GNNPipe: 2 machines x 4 RTX A5000, PCIe 4.0 inside, 200 Gb/s between",
                workers=8, devices_per_node=4, intra=PCIE4_X16, inter=200 * GBIT, latency=INFINIBAND_LATENCY,
                topology="pcie+infiniband", memory=24 * GIB, bandwidth=768 * GB, fp32=27.8 * TFLOPS,
                bf16=111.1 * TFLOPS, fp16=111.1 * TFLOPS)


def _dgx1() -> ClusterProfile:
    # NVIDIA DGX-1 with Tesla V100 datasheet: 8 x V100 SXM2 (16 GB each, 128 GB total), NVLink
    # hybrid cube-mesh. V100 SXM2 datasheet: 15.7 TFLOPS FP32, 900 GB/s HBM2, six NVLink2 links of
    # 25 GB/s per direction (docs/design.md: "6 links x 25 GB/s"; NVIDIA's "300 GB/s" counts both ways).
    # A GPU's links reach only 4 of its 7 peers (some pairs have two links), so 150 GB/s is its
    # total send rate, not what one pair gets: the profile keeps the aggregate and names the topology.
    # V100 SXM2 datasheet: 125 TFLOPS tensor performance (FP16 products, FP32 accumulation); Volta has no
    # BF16 tensor cores, so bf16 is priced at the FP32 rate.
    return _gpu("dgx1", "DGX-1: 8 V100 (SXM2), NVLink hybrid cube-mesh, 6 links x 25 GB/s", workers=8,
                devices_per_node=8, intra=6 * 25 * GB, inter=6 * 25 * GB, latency=GPU_LINK_LATENCY,
                topology="nvlink-hybrid-cube-mesh", memory=16 * GIB, bandwidth=900 * GB, fp32=15.7 * TFLOPS,
                fp16=125 * TFLOPS)


def _dgx_a100() -> ClusterProfile:
    # NVIDIA DGX A100 datasheet: 8 x A100 SXM4 40 GB (320 GB total), 6 NVSwitches.
    # A100 datasheet (SXM4 40 GB): 19.5 TFLOPS FP32 (without tensor cores), 1,555 GB/s HBM2,
    # NVLink "600 GB/s" (docs/design.md: NVSwitch 600 GB/s) = 12 NVLink3 links x 25 GB/s per direction x 2
    # directions, i.e. 300 GB/s each way; the profile records one direction, like every other link.
    # A100 datasheet: BF16 and FP16 Tensor Core 312 TFLOPS dense (624 with sparsity).
    return _gpu("dgx-a100", "DGX A100: 8 A100 (40 GB), NVSwitch 600 GB/s (300 GB/s each way)", workers=8,
                devices_per_node=8, intra=300 * GB, inter=300 * GB, latency=GPU_LINK_LATENCY,
                topology="nvswitch", memory=40 * GIB, bandwidth=1555 * GB, fp32=19.5 * TFLOPS,
                bf16=312 * TFLOPS, fp16=312 * TFLOPS)


# Read-only: presets are built on demand, so nothing here can be changed by a caller.
_PRESETS = MappingProxyType({
    "p3": _p3,
    "neutronstar-ecs": lambda: _t4_ecs("neutronstar-ecs", 8),
    "neutronstar-ecs16": lambda: _t4_ecs("neutronstar-ecs16", 16),
    "neutronstar-ibv": _neutronstar_ibv,
    "g3": _g3,
    "gnnpipe": _gnnpipe,
    "dgx1": _dgx1,
    "dgx-a100": _dgx_a100,
})
PRESET_NAMES = (*_PRESETS, "local")


def default_probe_file(device: str = "cpu") -> Path:
    """Where `gnnc probe --device DEVICE` writes this machine's profile unless told otherwise: one file
    per device (`probe.json` for the CPU, `probe-cuda.json` for the GPUs)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gnnc" / ("probe.json" if device == "cpu" else f"probe-{device}.json")


def preset(name: str, probe_file: str | os.PathLike[str] | None = None, device: str = "cpu") -> ClusterProfile:
    """A named preset; `local` is the profile `gnnc probe --device DEVICE` wrote (to `probe_file` or the
    default place for that device)."""
    if name == "local":
        path = Path(probe_file) if probe_file is not None else default_probe_file(device)
        if not path.exists():
            flag = "" if device == "cpu" else f" --device {device}"
            raise GnncError(f"cluster 'local' is measured by `gnnc probe{flag}`, and {path} does not exist yet; "
                            f"run `gnnc probe{flag}` or name another cluster ({', '.join(_PRESETS)})")
        return replace(load_profile(path), name="local")
    make = _PRESETS.get(name)
    if make is None:
        raise GnncError(f"unknown cluster preset '{name}' (known: {', '.join(PRESET_NAMES)})")
    return make()


def list_presets(probe_file: str | os.PathLike[str] | None = None) -> list[tuple[str, str]]:
    """(name, one-line description) of every preset, for `gnnc clusters`."""
    out = [(name, make().description) for name, make in _PRESETS.items()]
    path = Path(probe_file) if probe_file is not None else default_probe_file()
    if path.exists():
        try:
            local = load_profile(path)
            out.append(("local", f"this machine, measured by gnnc probe ({path}): {local.workers} workers"))
        except GnncError as err:
            out.append(("local", f"this machine: {path} is unusable ({err})"))
    else:
        out.append(("local", f"this machine, once `gnnc probe` has written {path}"))
    return out


def load_cluster(spec: str, probe_file: str | os.PathLike[str] | None = None, device: str = "cpu") -> ClusterProfile:
    """`--cluster PRESET|FILE`: a preset name, else a JSON profile file; `local` is `device`'s probe."""
    if spec in PRESET_NAMES:
        return preset(spec, probe_file, device)
    if os.path.exists(spec) or spec.endswith(".json"):
        return load_profile(spec)
    raise GnncError(f"--cluster {spec}: neither a preset ({', '.join(PRESET_NAMES)}) nor a profile file")


DEFAULT_CLUSTER = "neutronstar-ecs"  # what the planner prices on when no --cluster is given


def resolve_cluster(spec: "str | ClusterProfile | None", device: str = "cpu") -> ClusterProfile:
    """The profile a compile prices on: a preset or file name, a profile as given, else the default preset.
    `device` (`gnnc compile --device`) picks which of this machine's probes `local` reads."""
    if spec is None or spec == "":
        return preset(DEFAULT_CLUSTER)
    return load_cluster(spec, device=device) if isinstance(spec, str) else spec
