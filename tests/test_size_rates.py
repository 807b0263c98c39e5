"""Working-set-aware rates (issue 36): the probe's timings at several sizes, the fit's factors
(gnnc.cluster.SizeRate, gnnc.passes.cost.fit.fit_size_rates), their log-linear blend
(`ClusterProfile.size_factor`), and the cost inputs pricing each elementwise op and aggregation at its own working
set; a profile without them loads and prices as it did."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from conftest import random_graph
from gnnc import api
from gnnc.cluster import ClusterProfile, OpRate, SizeRate, preset
from gnnc.errors import GnncError
from gnnc.passes.cost.fit import fit_size_rates
from gnnc.passes.cost.symbols import LayerOpWork, kernel_factor, op_time

# a known two-size rate: 0.3 ns per element in cache (2,048 x 64), 1.2 ns at the reference (30,000 x 64)
SMALL, LARGE, WIDTH = 2048, 30000, 64
IN_CACHE, OUT_OF_CACHE = 0.3e-9, 1.2e-9


def _samples() -> list[dict]:
    out = []
    for kind, scale in (("elementwise.forward", 1.0), ("elementwise.backward", 1.5), ("spmm_f", 0.5),
                        ("spmm_b", 0.6)):
        out += [{"kind": kind, "rows": LARGE, "width": WIDTH, "seconds": scale * OUT_OF_CACHE},
                {"kind": kind, "rows": SMALL, "width": WIDTH, "seconds": scale * IN_CACHE}]
    return out


def _sized(profile: ClusterProfile) -> ClusterProfile:
    return replace(profile, size_rates=tuple(fit_size_rates(_samples())))


def test_the_fit_recovers_a_known_two_size_rate() -> None:
    """Synthetic timings at two sizes: factors over the larger (the reference, 1), the rate exact at both sizes
    timed, log-linear in bytes between them, held beyond them."""
    rates = fit_size_rates(_samples())
    forward = sorted((r for r in rates if r.kind == "elementwise.forward"), key=lambda r: r.rows)
    assert [(r.rows, r.width) for r in forward] == [(SMALL, WIDTH), (LARGE, WIDTH)]
    assert [r.factor for r in forward] == pytest.approx([IN_CACHE / OUT_OF_CACHE, 1.0])
    p = _sized(preset("g3"))
    small, large = 4.0 * SMALL * WIDTH, 4.0 * LARGE * WIDTH
    assert p.size_factor("elementwise.forward", small) == pytest.approx(0.25)
    assert p.size_factor("elementwise.forward", large) == pytest.approx(1.0)
    assert p.size_factor("elementwise.forward", small / 10) == pytest.approx(0.25)  # held: in cache
    assert p.size_factor("elementwise.forward", large * 10) == pytest.approx(1.0)  # held: the reference
    middle = math.sqrt(small * large)  # halfway in log bytes: halfway in log rate
    assert p.size_factor("elementwise.forward", middle) == pytest.approx(math.sqrt(0.25))
    # relative to another reference: the ratio of the two factors (an aggregation's width table's graph)
    assert p.size_factor("spmm_f", small, middle) == pytest.approx(0.25 / 0.5)
    assert preset("g3").size_factor("elementwise.forward", small) == 1.0  # no table: one rate for every size


def test_a_smaller_size_is_never_fitted_slower_than_a_larger_one() -> None:
    """An interrupted sample (a smaller size timed slower than a larger one) is held at the larger's factor."""
    timed = [{"kind": "elementwise.backward", "rows": n, "width": WIDTH, "seconds": t}
             for n, t in ((SMALL, 0.3e-9), (8192, 1.5e-9), (LARGE, 1.2e-9))]
    assert [r.factor for r in fit_size_rates(timed)] == pytest.approx([0.25, 1.0, 1.0])


def test_a_profile_with_size_rates_round_trips_and_checks_its_entries() -> None:
    p = _sized(preset("g3"))
    data = json.loads(p.to_json())
    assert len(data["size_rates"]) == 8 and "size_rates" not in json.loads(preset("g3").to_json())
    assert ClusterProfile.from_dict(data) == p
    bad = dict(data, size_rates=[dict(data["size_rates"][0], kind="gemm_f")])
    with pytest.raises(GnncError, match="size_rates"):
        ClusterProfile.from_dict(bad)
    twice = dict(data, size_rates=[data["size_rates"][0]] * 2)
    with pytest.raises(GnncError, match="listed twice"):
        ClusterProfile.from_dict(twice)


def _inputs(profile: ClusterProfile, vertices: int, edges: int):
    from gnnc.passes.cost.inputs import planning_inputs

    graph = random_graph(vertices, edges, f=64, c=8, seed=0)
    program = api.compile(api.load_model("examples/gcn.gnn", hidden=64), graph).program
    return planning_inputs(program, graph, np.zeros(graph.num_nodes, np.int64), profile, 1)[1]


def test_an_old_profile_loads_and_prices_as_before() -> None:
    """A profile written before size_rates (no field) loads, and every op time and kernel factor is the one
    rate's, whatever the rows: the values the cost model gave it before working sets were priced."""
    old = replace(preset("g3"), op_rates=(OpRate("elementwise", 1e-9, 2e-9),))
    data = old.to_dict()
    assert "size_rates" not in data
    loaded = ClusterProfile.from_dict(json.loads(json.dumps(data)))
    assert loaded.size_rates == ()
    for n in (200, 3000):
        table = _inputs(loaded, n, 5 * n).values()
        work = _inputs(loaded, n, 5 * n).op_work[0]
        assert table[op_time(0, "out", "f")] == work.seconds(loaded, "out", "f")  # the unsized price
        assert table[kernel_factor(0, "spmm_f")] == loaded.kernel_slowdown("spmm_f", 0, 64)


def test_a_small_op_is_priced_cheaper_per_element_than_a_large_one() -> None:
    """Given size_rates, an elementwise op on a small graph's rows costs less per element than on a large
    graph's, and so does the aggregation; without them both cost the same."""
    work = LayerOpWork(forward=(("out", "elementwise", 64.0),), backward=(("out", "elementwise", 64.0),))
    p = _sized(replace(preset("g3"), op_rates=(OpRate("elementwise", 1.2e-9, 1.8e-9),)))
    assert work.seconds(p, "out", "f", rows=SMALL) == pytest.approx(64 * 0.3e-9)
    assert work.seconds(p, "out", "f", rows=LARGE) == pytest.approx(64 * 1.2e-9)
    assert work.seconds(p, "out", "b", rows=LARGE * 4) == pytest.approx(64 * 1.8e-9)
    small, large = (_inputs(p, n, 5 * n).values() for n in (1000, 60000))
    assert small[op_time(0, "out", "f")] < large[op_time(0, "out", "f")]
    assert small[kernel_factor(0, "spmm_f")] < large[kernel_factor(0, "spmm_f")]
    assert large[kernel_factor(0, "spmm_f")] == pytest.approx(p.kernel_slowdown("spmm_f", 0, 64))
    plain = replace(p, size_rates=())
    a, b = (_inputs(plain, n, 5 * n).values() for n in (1000, 60000))
    assert a[op_time(0, "out", "f")] == b[op_time(0, "out", "f")]


def test_the_probe_times_every_kind_at_every_size() -> None:
    from gnnc.runtime.probe import size_rate_samples

    got = size_rate_samples(1, rows=(64, 256), width=8, degree=4.0, repeats=1, rounds=2)  # one entry per size
    assert sorted((z["kind"], z["rows"]) for z in got) == sorted(
        (kind, n) for kind in ("elementwise.forward", "elementwise.backward", "spmm_f", "spmm_b") for n in (64, 256))
    assert all(z["seconds"] >= 0 and z["width"] == 8 for z in got)
    replace(preset("g3"), size_rates=tuple(fit_size_rates(got)))  # a valid profile field


def test_a_jobs_probe_takes_the_median_of_every_ranks_sizes_and_fits_them() -> None:
    """`gnnc probe --network` (the grid's profiles): each rank times the sizes at its own moment, the fit takes
    their median per kind and size, and the profile it writes holds size_rates; a rank's timings without them
    (a probe before them) give none."""
    from gnnc.passes.cost.fit import fit_profile
    from gnnc.runtime.probe import PROBE_MODEL, PROBE_WIDTHS, across_ranks

    def rank(scale: float, with_sizes: bool = True) -> dict:
        timings = {"layers": [(30000, [150000, 150000], [1e-2, 2e-2]), (30000, [510000, 510000], [3e-2, 4e-2]),
                              (90000, [450000, 450000], [5e-2, 6e-2])],
                   "forward": [(30000, [150000, 150000], [5e-3, 1e-2]), (30000, [510000, 510000], [1e-2, 2e-2]),
                               (90000, [450000, 450000], [2e-2, 3e-2])],
                   "ops": {"dispatch": [], "eqns": [], "copies": [], "adam": []}, "kernels": []}
        if with_sizes:
            timings["sizes"] = [{**z, "seconds": z["seconds"] * (scale if z["rows"] == SMALL else 1.0)}
                                for z in _samples()]
        return timings

    got = across_ranks([rank(1.0), rank(3.0), rank(2.0)])
    assert got["sizes"] == [{**z, "seconds": z["seconds"] * (2.0 if z["rows"] == SMALL else 1.0)} for z in _samples()]
    assert across_ranks([rank(1.0, False), rank(2.0, False)])["sizes"] == []
    features, hidden, classes = PROBE_WIDTHS
    model = api.load_model_source(PROBE_MODEL, "<probe>", features=features, hidden=hidden, classes=classes)
    program = api.compile(model, random_graph(50, 200, f=features, c=classes, seed=0)).program
    fitted = fit_profile(program, got["layers"], PROBE_WIDTHS, 1e9, forward=got["forward"], sizes=got["sizes"])
    factors = {(r["kind"], r["rows"]): r["factor"] for r in fitted["size_rates"]}
    assert factors[("elementwise.forward", SMALL)] == pytest.approx(2 * IN_CACHE / OUT_OF_CACHE)
    assert "size_rates" not in fit_profile(program, got["layers"], PROBE_WIDTHS, 1e9, forward=got["forward"])
