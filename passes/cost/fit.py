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
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from gnnc.ir import Program
from gnnc.passes.choose_strategy import layer_dims, layer_shape
from gnnc.passes.cost.compute import compute_backward, compute_forward
from gnnc.passes.cost.symbols import R_gemm, R_spmm, d, heads
from gnnc.passes.predict_bytes import param_dependent

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
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(a / norms, y)
    return coef / norms


def per_unit_work(program: Program) -> list[tuple[float, float, int]]:
    """Per graph layer: the cost model's forward-plus-backward seconds of one vertex and of one edge
    when t_v = t_e = 1, and the width of the rows the layer exchanges."""
    dims, n_heads = layer_dims(program)
    needs = param_dependent(program)
    out = []
    for i, layer in enumerate(program.graph_layers()):
        shape = layer_shape(layer, needs)
        subs = {d(i): dims[i], d(i + 1): dims[i + 1], heads(i): n_heads[i], R_gemm: 2.0, R_spmm: 1.0}
        vertex = compute_forward(i, shape, 1, 0) + compute_backward(i, shape, 1, 0)
        edge = compute_forward(i, shape, 0, 1) + compute_backward(i, shape, 0, 1)
        out.append((float(vertex.subs(subs)), float(edge.subs(subs)), int(shape.width(i).subs(subs))))
    return out


def joint_rates(samples: Sequence[Sample],
                 work: list[tuple[float, float, int]]) -> tuple[float | None, float | None]:
    """The cost model's t_v, t_e: one pair for every layer, with an intercept per layer, fitted to
    all timings through the model's per-vertex and per-edge work. None where the fit gives 0
    (the profile then keeps deriving that figure from the kernel rate)."""
    rows, y = [], []
    for n, edges, seconds in samples:
        for i, (per_vertex, per_edge, _) in enumerate(work):
            rows.append([per_vertex * n, per_edge * edges[i]] + [1.0 if j == i else 0.0 for j in range(len(work))])
            y.append(seconds[i])
    coef = _nnls_scaled(np.asarray(rows), np.asarray(y))
    return (float(coef[0]) or None), (float(coef[1]) or None)


def fit_profile(program: Program, samples: Sequence[Sample], widths: Sequence[int], bandwidth: float) -> dict:
    """NeutronStar's T_v, T_e, T_c per layer width (`unit_costs`) and the cost model's t_v, t_e, t_c, as
    ClusterProfile fields, from the probe's layer timings of `program` (widths: d_0..d_L)."""
    work = per_unit_work(program)
    layers = []
    for i, (_, _, row_width) in enumerate(work):
        fit = fit_unit_costs([s[0] for s in samples], [s[1][i] for s in samples], [s[2][i] for s in samples])
        layers.append({"d_in": widths[i], "d_out": widths[i + 1], "row_width": row_width, "T_v": fit.T_v,
                       "T_e": fit.T_e, "T_c": row_width * 4 / bandwidth, "const": fit.const})
    t_v, t_e = joint_rates(samples, work)
    return {"unit_costs": layers, "t_v": t_v, "t_e": t_e, "t_c": 1.0 / bandwidth}


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
    return "\n".join(lines) + "\n"
