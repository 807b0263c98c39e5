"""Fitting the cost model to this machine: NeutronStar's T_v, T_e, T_c and the model's t_v, t_e, t_c.

Why this module exists: `gnnc probe` measures (gnnc.runtime.probe times bare
kernels, the link and each layer of a short test training), and the figures
the planner prices with are fitted here, beside the formulas they feed. The
rates of bare kernels miss what a training step pays around them, so per
layer width non-negative least squares fits time = T_v*V + T_e*E + const to
the layer timings on graphs whose vertex and edge counts vary independently;
T_c is the measured bandwidth per row of the exchanged width. The cost
model's single t_v, t_e (per unit of work, see gnnc.cluster.ClusterProfile)
are fitted jointly to the same timings through the model's own per-vertex
and per-edge work (`compute_forward`/`compute_backward`), so that the model,
evaluated on the probe's layers, predicts the times the probe measured.

The IR's other ops (gnnc.passes.cost.ops) are fitted first (`fit_op_rates`):
per op class, seconds per element forward and backward, and one dispatch
cost per op, from every equation the probe timed alone; row copies and
Adam steps likewise. The layer timings hold some of those ops (a bias, each
op's dispatch), so their modelled time is taken off the timings before
t_v and t_e are fitted: nothing is counted twice.

Elementwise ops and the aggregation timed at several working sets (`fit_size_rates`) become factors of their
time per unit of work over the largest size's (the reference, where the other rates were measured): the
cost model prices each op at its own working set (gnnc.cluster.ClusterProfile.size_factor). The layer
timings are taken at or above the reference size, so t_v and t_e are fitted as before.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from gnnc.cluster import OP_CLASSES, KernelRate, OpRate, SizeRate, kernel_slowdown
from gnnc.ir import Program
from gnnc.passes.analysis.layers import layer_dims, param_dependent
from gnnc.passes.cost.compute import compute_backward, compute_forward
from gnnc.passes.cost.ops import PER_ROW, class_of, program_op_work
from gnnc.passes.cost.symbols import R_gemm, R_spmm, d, heads, kernel_factors, layer_shape

# (vertices, edges per graph layer, seconds per graph layer) of one timed test graph
Sample = tuple[int, list[int], list[float]]


@dataclass(frozen=True)
class UnitCostFit:
    """time = T_v*V + T_e*E + const, fitted by non-negative least squares; rms: the residual (seconds)."""

    T_v: float
    T_e: float
    const: float
    rms: float


def fit_unit_costs(vertices: Sequence[float], edges: Sequence[float], seconds: Sequence[float]) -> UnitCostFit:
    """Least-squares T_v, T_e, const from (V, E, time) samples, all three kept non-negative.

    Non-negative because a negative time per vertex is noise, not a cost; with at least three
    samples of independent V and E the constants of exact timings are recovered exactly.
    """
    v, e, t = (np.asarray(a, dtype=np.float64) for a in (vertices, edges, seconds))
    if not (len(v) == len(e) == len(t)) or len(t) < 3:
        raise ValueError(f"need at least 3 samples of equal length, got {len(v)}, {len(e)}, {len(t)}")
    a = np.stack([v, e, np.ones_like(v)], axis=1)
    coef = _nnls_scaled(a, t)
    rms = float(np.sqrt(np.mean((a @ coef - t) ** 2)))
    return UnitCostFit(float(coef[0]), float(coef[1]), float(coef[2]), rms)


def _nnls_scaled(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS on columns scaled to unit norm: V, E and 1 differ by orders of magnitude, which would
    otherwise decide the solver's tolerance for the small columns."""
    # deferred: scipy.optimize is a heavy import that only `gnnc probe`'s fit uses, and every compile and run
    # imports this module with the cost model
    from scipy.optimize import nnls

    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(a / norms, y)
    return coef / norms


def per_unit_work(program: Program, backward: bool = True,
                  kernel_rates: Sequence[KernelRate] = ()) -> list[tuple[float, float, int]]:
    """Per graph layer: the cost model's forward-plus-backward (`backward` False: forward) seconds of one
    vertex and of one edge when t_v = t_e = 1, and the width of the rows the layer exchanges; each kernel's
    work scaled by its slowdown at the layer's widths on `kernel_rates` (so that the rates fitted to it are
    those of the fastest widths, as the cost model reads them: gnnc.passes.cost.compute)."""
    dims, n_heads = layer_dims(program)
    needs = param_dependent(program)
    shapes = [layer_shape(layer, needs) for layer in program.graph_layers()]
    factors = kernel_factors(shapes, dims, n_heads, functools.partial(kernel_slowdown, kernel_rates))
    out = []
    for i, shape in enumerate(shapes):
        subs = {d(i): dims[i], d(i + 1): dims[i + 1], heads(i): n_heads[i], R_gemm: 2.0, R_spmm: 1.0, **factors}
        vertex = compute_forward(i, shape, 1, 0) + (compute_backward(i, shape, 1, 0) if backward else 0)
        edge = compute_forward(i, shape, 0, 1) + (compute_backward(i, shape, 0, 1) if backward else 0)
        out.append((float(vertex.subs(subs)), float(edge.subs(subs)), int(shape.width(i).subs(subs))))
    return out


def joint_rates(samples: Sequence[Sample], work: list[tuple[float, float, int]],
                kernels: tuple[float, float] | None = None) -> tuple[float | None, float | None]:
    """The cost model's t_v, t_e: one pair for every layer, with an intercept per layer, fitted to
    all timings through the model's per-vertex and per-edge work. None where the fit gives 0
    (the profile then keeps deriving that figure from the kernel rate).

    `kernels`: the dense map's and the aggregation's seconds per unit of work timed alone (`kernel_table_rates`).
    Then one factor is fitted, by which the layers run slower (or faster) than their kernels alone, and
    t_v, t_e are those times it: the kernels' ratio is the table's. Fitted freely, the two trade against each
    other and the intercepts (five probes of one machine within ten minutes put t_e at 9.9 to 21 G/s while
    its SpMM, timed alone, ran at 8.9 to 9.2 G/s every time), and a graph with another ratio of edges to
    vertices than the probe's inherits the error."""
    rows, y = [], []
    for n, edges, seconds in samples:
        for i, (per_vertex, per_edge, _) in enumerate(work):
            work_columns = ([per_vertex * n * kernels[0] + per_edge * edges[i] * kernels[1]] if kernels
                            else [per_vertex * n, per_edge * edges[i]])
            rows.append(work_columns + [1.0 if j == i else 0.0 for j in range(len(work))])
            y.append(seconds[i])
    coef = _nnls_scaled(np.asarray(rows), np.asarray(y))
    if kernels:
        return (float(coef[0]) * kernels[0] or None), (float(coef[0]) * kernels[1] or None)
    return (float(coef[0]) or None), (float(coef[1]) or None)


def kernel_table_rates(kernel_rates: Sequence[KernelRate]) -> tuple[float, float] | None:
    """(t_v, t_e) of the kernels timed alone at their fastest widths: 2 / the fastest dense map's FLOP/s,
    1 / the fastest aggregation's multiply-adds/s; None without both."""
    best = {k: max((r.rate for r in kernel_rates if r.kernel == k), default=0.0) for k in ("gemm_f", "spmm_f")}
    if not all(best.values()):
        return None
    return 2.0 / best["gemm_f"], 1.0 / best["spmm_f"]


class _Rates:
    """Op rates as a profile offers them (`op_rate`), for pricing the probe's own layers."""

    def __init__(self, rates: Sequence[OpRate]):
        self._by_op = {r.op: r for r in rates}

    def op_rate(self, op: str, direction: str) -> float:
        r = self._by_op.get(op)
        return 0.0 if r is None else (r.forward if direction == "forward" else r.backward)


def other_ops_seconds(program: Program, samples: Sequence[Sample], rates: Sequence[OpRate],
                      phases: tuple[str, ...] = ("f", "b")) -> list[list[float]]:
    """Per sample and graph layer: the modelled seconds of the layer's own other ops (not its dense layers),
    forward plus backward (`phases`: ("e",) for a forward as the evaluation runs it), on the sample's V rows
    and E edges."""
    work = program_op_work(program, dense=False)
    prices = _Rates(rates)
    out = []
    for n, edges, _ in samples:
        row = []
        for i, w in enumerate(work):
            t = 0.0
            for phase in phases:
                t += (n * (w.seconds(prices, "in", phase) + w.seconds(prices, "out", phase))
                      + edges[i] * w.seconds(prices, "edge", phase) + w.seconds(prices, "call", phase))
            row.append(t)
        out.append(row)
    return out


def fit_op_rates(samples: dict) -> list[OpRate]:
    """Seconds per element of each op class, forward and backward, and per op dispatched (`call`), per Adam
    parameter element and tensor (`optimizer`, `optimizer_call`), from `gnnc.runtime.probe.probe_op_samples`.

    The dispatch of one op is the median time of the equations timed on a graph too small for their work
    to show ("dispatch"); each class's seconds per element the median over its timings on the large graphs
    of (time - dispatch) / elements. Medians, because on shared cores a timing now and then is interrupted
    and least squares would follow it. Dropout's and attention's seconds per element and per row
    (`dropout_row`, `attention_row`: gnnc.passes.cost.ops.PER_ROW) by non-negative least squares: dropout's
    timings mix wide vertex values and narrow edge ones, attention's edges of two heads and of one. Row
    copies: the median seconds per element; Adam: non-negative least squares over its elements and its
    tensors (a step's per-tensor work is not small beside its elements).
    """
    dispatch = [(class_of(op, k), f, b_) for op, k, _, _, f, b_ in samples["dispatch"]]
    call_f = float(np.median([f for _, f, _ in dispatch]))
    call_b = float(np.median([b_ for _, _, b_ in dispatch if b_ > 0] or [0.0]))
    by_class: dict[str, list[tuple[float, float, float, float]]] = {}
    for op, inputs, rows, n, f, b_ in samples["eqns"]:
        cls = class_of(op, inputs)
        if cls not in (None, "free") and n > 0:
            by_class.setdefault(cls, []).append((float(rows), float(n), f - call_f, b_ - call_b))
    out = []
    for cls in OP_CLASSES:
        if cls not in by_class:
            continue
        timed = by_class[cls]
        if cls in PER_ROW:  # per element and per row: both, by least squares
            a = np.asarray([[n, rows] for rows, n, _, _ in timed])
            cf, cb = (_nnls_scaled(a, np.maximum([t[k] for t in timed], 0.0)) for k in (2, 3))
            out += [OpRate(cls, float(cf[0]), float(cb[0])), OpRate(PER_ROW[cls], float(cf[1]), float(cb[1]))]
            continue
        out.append(OpRate(cls, max(float(np.median([f / n for _, n, f, _ in timed])), 0.0),
                          max(float(np.median([b_ / n for _, n, _, b_ in timed])), 0.0)))
    out.append(OpRate("call", call_f, call_b))
    copies = np.asarray(samples["copies"], dtype=np.float64)
    out.append(OpRate("copy", float(np.median(copies[:, 1] / copies[:, 0])),
                      float(np.median(copies[:, 2] / copies[:, 0]))))
    adam = np.asarray(samples["adam"], dtype=np.float64)
    opt = _nnls_scaled(adam[:, :2], adam[:, 2])
    out += [OpRate("optimizer", float(opt[0]), 0.0), OpRate("optimizer_call", float(opt[1]), 0.0)]
    return out


def fit_size_rates(samples: Sequence[dict]) -> list[SizeRate]:
    """`size_rates` from `gnnc.runtime.probe.size_rate_samples`' timings: per kind, each size's seconds per unit
    of work over the largest size's (factor 1 there, the reference), no larger than any larger size's factor
    (the smallest from there up). A kind whose reference took no time (nothing measurable) is left out: every
    size is then priced at the one rate.

    Why no larger: a smaller working set is never slower per unit of work on the same kernel (it reads a subset
    of the cache levels the larger one reads), and on shared cores a sample is now and then interrupted: four
    probes at once on 2 cores timed relu's backward on 8,192 rows at 1.29 of its time on 30,000."""
    by_kind: dict[str, list[dict]] = {}
    for sample in samples:
        by_kind.setdefault(sample["kind"], []).append(sample)
    out = []
    for kind, timed in by_kind.items():
        timed = sorted(timed, key=lambda z: z["rows"] * z["width"])
        reference = timed[-1]["seconds"]
        if reference <= 0:
            continue
        factors, lowest = [], 1.0
        for z in reversed(timed):
            lowest = min(lowest, max(z["seconds"], 1e-3 * reference) / reference)
            factors.append(lowest)
        out += [SizeRate(kind, int(z["rows"]), int(z["width"]), f) for z, f in zip(timed, reversed(factors))]
    return out


def _without_other_ops(program: Program, samples: Sequence[Sample], rates: Sequence[OpRate],
                       phases: tuple[str, ...]) -> list[Sample]:
    other = other_ops_seconds(program, samples, rates, phases)
    return [(n, edges, [max(t - o, 0.0) for t, o in zip(seconds, ops)])
            for (n, edges, seconds), ops in zip(samples, other)]


def fit_profile(program: Program, samples: Sequence[Sample], widths: Sequence[int], bandwidth: float,
                op_rates: Sequence[OpRate] = (), forward: Sequence[Sample] = (),
                kernel_rates: Sequence[KernelRate] = (), sizes: Sequence[dict] = ()) -> dict:
    """NeutronStar's T_v, T_e, T_c per layer width (`unit_costs`) and the cost model's t_v, t_e, t_c, as
    ClusterProfile fields, from the probe's layer timings of `program` (widths: d_0..d_L). With `op_rates`
    (`fit_op_rates`), the layers' other ops are taken off the timings first, and the rates join the fields.
    With `forward` (the same layers' forward alone, as the evaluation runs it), t_v_forward and t_e_forward
    are fitted to them likewise, through the model's forward work. With `kernel_rates` (the kernels timed
    alone at several widths), t_v and t_e are the rates at the fastest widths (`per_unit_work`) in the ratio
    of the kernels' fastest rates (`joint_rates`), and the table joins the fields. With `sizes`
    (`size_rate_samples`), their factors (`fit_size_rates`) join the fields as `size_rates`."""
    if op_rates:
        samples = _without_other_ops(program, samples, op_rates, ("f", "b"))
        forward = _without_other_ops(program, forward, op_rates, ("e",)) if forward else forward
    work = per_unit_work(program, kernel_rates=kernel_rates)
    layers = []
    for i, (_, _, row_width) in enumerate(work):
        fit = fit_unit_costs([s[0] for s in samples], [s[1][i] for s in samples], [s[2][i] for s in samples])
        layers.append({"d_in": widths[i], "d_out": widths[i + 1], "row_width": row_width, "T_v": fit.T_v,
                       "T_e": fit.T_e, "T_c": row_width * 4 / bandwidth, "const": fit.const})
    kernels = kernel_table_rates(kernel_rates)
    t_v, t_e = joint_rates(samples, work, kernels)
    fields = {"unit_costs": layers, "t_v": t_v, "t_e": t_e, "t_c": 1.0 / bandwidth}
    if forward:
        fields["t_v_forward"], fields["t_e_forward"] = joint_rates(
            forward, per_unit_work(program, backward=False, kernel_rates=kernel_rates), kernels)
    if op_rates:
        fields["op_rates"] = [{"op": r.op, "forward": r.forward, "backward": r.backward} for r in op_rates]
    if kernel_rates:
        fields["kernel_rates"] = [asdict(r) for r in kernel_rates]
    if sizes:
        fields["size_rates"] = [asdict(r) for r in fit_size_rates(sizes)]
    return fields


def describe_unit_costs(profile) -> str:
    """NeutronStar's figures of a profile, one line per layer width, for `gnnc probe`'s output."""
    if not profile.unit_costs:
        return "no NeutronStar unit costs in this profile\n"
    lines = ["NeutronStar unit costs (2-layer GCN through gnnc's executor, forward + backward):",
             f"  {'layer':>12s} {'T_v ns/vertex':>14s} {'T_e ns/edge':>12s} {'T_c ns/row':>11s} {'const us':>9s}"]
    for u in profile.unit_costs:
        lines.append(f"  {f'{u.d_in}->{u.d_out}':>12s} {u.T_v * 1e9:14.2f} {u.T_e * 1e9:12.3f} {u.T_c * 1e9:11.2f} "
                     f"{u.const * 1e6:9.1f}")

    def rate(value, unit: str) -> str:
        return "- (kept from the kernel rate)" if value is None else f"{value:.4g} {unit}"

    lines.append(f"  cost model: t_v {rate(profile.t_v, 's per vertex per d_in*d_out')}, "
                 f"t_e {rate(profile.t_e, 's per edge per feature')}, t_c {rate(profile.t_c, 's per byte')}")
    lines.append(f"  forward alone (the evaluation pass): t_v {rate(profile.t_v_forward, 's')}, "
                 f"t_e {rate(profile.t_e_forward, 's')}")
    if profile.kernel_rates:
        widths = (8, 16, 64, 256)
        lines.append("  kernels by width, times the fastest's seconds per unit of work "
                     f"(widths {'/'.join(map(str, widths))}):")
        for kernel, k, label in (("gemm_f", 64, "dense map x W, 64 wide in, n out"),
                                 ("gemm_dw", 64, "its weight gradient"), ("gemm_dx", 64, "its input gradient"),
                                 ("spmm_f", 0, "aggregation of n-wide rows"), ("spmm_b", 0, "its backward"),
                                 ("spmm_dw", 0, "its edge values' gradient"),
                                 ("spmm_f", 8, "attention's, 8 heads of n"), ("spmm_b", 8, "its backward"),
                                 ("spmm_dw", 8, "its coefficients' gradient")):
            factors = " / ".join(f"{profile.kernel_slowdown(kernel, k, n):.2f}" for n in widths)
            lines.append(f"    {label:>34s} {factors}")
    if profile.size_rates:
        lines.append("  by working set, times the reference size's seconds per unit of work (rows x width):")
        for kind in sorted({r.kind for r in profile.size_rates}):
            timed = sorted((r for r in profile.size_rates if r.kind == kind), key=lambda r: r.bytes)
            lines.append(f"    {kind:>20s} " + " / ".join(f"{r.factor:.2f} at {r.rows}x{r.width}" for r in timed))
    if profile.op_rates:
        lines.append("  other ops (ns per element forward / backward; call: us per op; optimizer_call: us per tensor):")
        for r in profile.op_rates:
            scale, unit = (1e6, "us") if r.op.endswith("call") else (1e9, "ns")
            lines.append(f"    {r.op:>14s} {r.forward * scale:10.3f} / {r.backward * scale:10.3f} {unit}")
    return "\n".join(lines) + "\n"
