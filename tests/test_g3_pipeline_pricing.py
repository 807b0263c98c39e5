"""The schedule pass prices G3's inter-layer pipeline (section 5.2) and decides it under `schedule{pipeline=auto}`.

A pipelined halo is in flight from the sending layer's first bin: the window it leaves after the sender's last bin
is gnnc.passes.cost.overlap.pipelined_window (checked here against a step-by-step simulation of the sender's bins
posting their messages on a link that carries one at a time), against k messages per peer and the chain's
equations run once per bin (`pipeline_dispatch`). The pass pipelines a layer where that is cheaper, and the
predicted epoch of a pipelined plan is priced with it (gnnc.passes.cost.scheduled reads the marks).
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import sympy

from conftest import EXAMPLES, check_golden
from gnnc import api
from gnnc.cluster import OpRate, preset
from gnnc.passes.cost.overlap import pipeline_dispatch, pipelined_window
from gnnc.passes.cost.symbols import P, T_call_b, T_call_f, alpha
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.bins import pipelined

GRAPH = "sbm:n=2000,blocks=8,deg=10,intra=0.5,features=64,classes=8,seed=0"


def _simulated(exch: float, sent: float, held: float, remote: float, k: int) -> float:
    """The receiver's window after the sender's last bin, event by event: bin j (of k, sent / k each) posts its
    message (exch / k) as it ends; the link carries one message at a time; the receiver's held bins run from the
    sender's end, its other bins once the last message is in."""
    link_free = 0.0
    for j in range(1, k + 1):
        link_free = max(link_free, j * sent / k) + exch / k
    return max(link_free - sent, held) + remote


@pytest.mark.parametrize("exch, sent, held, remote, k", list(itertools.product(
    (0.0, 1.0, 7.0), (0.0, 2.0, 30.0), (0.0, 3.0), (0.5,), (1, 2, 5))))
def test_the_pipelined_window_is_the_last_message_after_the_senders_last_bin(exch, sent, held, remote, k) -> None:
    got = float(pipelined_window(sympy.Float(exch), sympy.Float(sent), sympy.Float(held), sympy.Float(remote), k))
    assert got == pytest.approx(_simulated(exch, sent, held, remote, k), abs=1e-12)


def test_a_pipeline_costs_k_minus_one_more_messages_and_chain_runs() -> None:
    """Per direction: (k - 1)(P - 1) more messages at alpha each, the chain's equations k - 1 more times."""
    at = {P: 4, alpha: 1e-3, T_call_f: 1e-4, T_call_b: 3e-4}
    assert float(pipeline_dispatch(4, 3, "f").subs(at)) == pytest.approx(3 * (3 * 1e-3 + 3 * 1e-4))
    assert float(pipeline_dispatch(4, 3, "b").subs(at)) == pytest.approx(3 * (3 * 1e-3 + 3 * 3e-4))
    assert float(pipeline_dispatch(4, 3, "b", messages=False).subs(at)) == pytest.approx(3 * 3 * 3e-4)
    assert float(pipeline_dispatch(1, 3, "f").subs(at)) == 0.0


def _cluster(latency: float, call: float):
    """neutronstar-ecs at 50 MB/s with slow aggregation (the sender's bins long enough to hide the next halo behind,
    as test_chunk_overlap's case), with this message start and dispatch."""
    base = preset("neutronstar-ecs")
    return dataclasses.replace(base, inter_bandwidth=50e6, intra_bandwidth=50e6, workers=4, latency=latency,
                               spmm_rate=1.4e8,
                               op_rates=(*(r for r in base.op_rates if r.op != "call"), OpRate("call", call, call)))


def _compiled(model: str, cluster, pipeline: str, graph=None):
    g = graph if graph is not None else api.load_graph(GRAPH)
    return api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), g, workers=4, strategy="depcomm",
                       partition="metis", cluster=cluster,
                       passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [f"schedule{{bins=4 pipeline={pipeline}}}"])


def _marked(program) -> list[bool]:
    return [any(pipelined(e) for e in layer.eqns if e.op == "halo") for layer in program.graph_layers()]


def test_the_schedule_pipelines_where_it_pays() -> None:
    """pipeline=auto: on a slow link with messages and dispatch nearly free the second layer's halo is pipelined
    (the first has no binned layer before it); at 2 ms a message (what a gloo send post took on the loaded
    2-core box, benchmarks/RESULTS-seeds.md) the 9 more messages each way outweigh it and nothing is. The report's
    times are the formula's, and the predicted epoch of pipeline=on differs from off's by exactly that layer's;
    off (the default) marks nothing and reports nothing new."""
    g = api.load_graph(GRAPH)
    for latency, expected in ((1e-6, [False, True]), (2e-3, [False, False])):
        cluster = _cluster(latency, 1e-6)
        auto = _compiled("sage", cluster, "auto", g)
        [entry] = auto.meta.schedule_report["pipeline"]
        assert entry["layer"] == auto.program.graph_layers()[1].name
        assert entry["pipelined"] == (entry["pipelined_time_s"] < entry["time_s"]) == expected[1], entry
        assert _marked(auto.program) == expected
        if latency > 1e-6:
            continue
        on, off = (_compiled("sage", cluster, p, g) for p in ("on", "off"))
        assert "pipeline" not in off.meta.schedule_report and _marked(off.program) == [False, False]
        on_s, off_s = on.meta.schedule_report["predicted_time_s"], off.meta.schedule_report["predicted_time_s"]
        assert on_s - off_s == pytest.approx(entry["pipelined_time_s"] - entry["time_s"], rel=1e-6, abs=1e-9)
        assert auto.meta.schedule_report["predicted_time_s"] == pytest.approx(min(on_s, off_s), rel=1e-9)


def test_golden_pipelined_schedule() -> None:
    """The IR the schedule pass writes when it pipelines (GAT: both halos of the second layer, its map and its
    source scores, fed by the first layer's bins)."""
    out: dict[str, str] = {}
    # a path relative to the repository, so the printed `source` line is the same on every machine
    model = api.load_model_source((EXAMPLES / "gat.gnn").read_text(), "examples/gat.gnn")
    api.compile(model, api.load_graph(GRAPH), workers=4, strategy="depcomm",
                partition="metis", cluster=_cluster(1e-6, 1e-6),
                passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + ["schedule{bins=4 pipeline=auto}"],
                after=lambda n, p: out.__setitem__(n, str(p)) if n == "schedule" else None)
    assert out["schedule"].count("pipelined=true") == 2
    check_golden({"schedule": out["schedule"]}, "gat-pipeline-auto")
