"""NeutronStar's chunks (section 4.3): an overlapped halo's remote edges run on each peer's rows as they arrive,
in ring order, and backward sends each peer's gradients back as soon as they are computed
(`halo[overlap=true, chunked=true]`, gnnc.plan.schedule_attrs; gnnc.runtime.comm.ChunkedHalo).

The result is one process's up to the order of the floating-point sums (logits, loss and every gradient within
1e-5, as test_distributed_exact), on 2 and 4 gloo ranks, for every kind of aggregation split by part (sum, mean,
max, min, the attention softmax), and the bytes are the plan's prediction; the schedule pass chooses chunks
where the cost model prices them cheaper (gnnc.passes.cost.overlap).
"""
from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, EXTREMES
from gnnc import api
from gnnc.ir.text import parse_ir
from gnnc.passes.cost.overlap import overlap_window
from gnnc.passes.cost.symbols import P
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.schedule_attrs import exchange_schedule
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import bytes_and_step_failures, communities, compile_half_cached, hub_graph

SEED = 3
CHUNKED = "schedule{chunked=on}"


def _model(name: str):
    if name == "extremes":
        return api.load_model_source(EXTREMES, "extremes.gnn")
    return api.load_model(EXAMPLES / f"{name}.gnn")


def chunked_halos(program) -> int:
    return sum(exchange_schedule(e).chunked for layer in program.layers for e in layer.eqns)


def cases(world: int, tmp):
    out = []
    for name, graph_of, strategy in [("gcn", hub_graph, "depcomm"), ("sage", hub_graph, "depcomm"),
                                     ("gat", hub_graph, "depcomm"), ("extremes", hub_graph, "depcomm"),
                                     ("sage", communities, "hybrid"), ("gat", communities, "hybrid,depcomm")]:
        g = graph_of()
        model = _model(name)
        plan = compile_half_cached(model, g, world, strategy, DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [CHUNKED])
        assert chunked_halos(plan.program) >= 1, (name, strategy)
        shards = plan.write_shards(tmp / f"{name}-{strategy}")
        job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False))
        out.append(((name, graph_of.__name__, strategy), api.compile(model, g).program, g, job,
                    plan.meta.predicted_bytes_per_step))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_chunked_halos_match_one_process(world: int, tmp_path) -> None:
    todo = cases(world, tmp_path)
    results = pooled_launch(one_step_each, world, [job for _, _, _, job, _ in todo])[0]
    failures = bytes_and_step_failures(todo, results, SEED)
    assert not failures, "\n".join(failures)


# --- what the schedule pass chooses and how the cost model prices it ------------------------------------------


def _per_chunk(exch: float, held: float, remote: float, peers: int) -> float:
    """The chunked window by its recurrence: chunk k in after k * exch / n, its work after the previous chunk's."""
    t = held
    for k in range(1, peers + 1):
        t = max(t, k * exch / peers) + remote / peers
    return t


@pytest.mark.parametrize("exch, held, remote", [(1.0, 0.1, 0.3), (1.0, 2.0, 0.5), (0.2, 0.1, 3.0), (5.0, 0.0, 0.0)])
def test_the_chunked_window_is_the_per_chunk_recurrence(exch: float, held: float, remote: float) -> None:
    for workers in (2, 3, 4, 8):
        window = overlap_window(sympy.Float(exch), sympy.Float(held), sympy.Float(remote), True, sympy.Integer(0))
        got = float(window.subs(P, workers))
        assert got == pytest.approx(_per_chunk(exch, held, remote, workers - 1))
        whole = float(overlap_window(sympy.Float(exch), sympy.Float(held), sympy.Float(remote), False, sympy.Integer(0)))
        assert got <= whole + 1e-12  # chunks never wait longer, their dispatch aside




def test_the_schedule_chunks_the_layers_where_it_pays() -> None:
    """Per layer, the cheaper priced alternative: at 400 Mb/s with slow aggregation SAGE's layers hide more of
    their halo in chunks than the two extra parts' dispatch costs (4 workers: the held rows and 3 peers against
    the held rows and the halo), with fast aggregation there is little remote work to hide and neither layer
    chunks; on Cora at the default cluster's link no layer chunks (tests/test_schedule.py)."""
    import dataclasses

    from gnnc.cluster import preset

    g = api.load_graph("sbm:n=4000,blocks=8,deg=10,intra=0.5,features=128,classes=8,seed=0")
    for spmm_rate, expected in ((1.4e8, [True, True]), (1.4e10, [False, False])):
        cluster = dataclasses.replace(preset("neutronstar-ecs"), inter_bandwidth=50e6, intra_bandwidth=50e6,
                                      workers=4, spmm_rate=spmm_rate)
        plan = api.compile(api.load_model(EXAMPLES / "sage.gnn"), g, workers=4, strategy="depcomm",
                           partition="metis", cluster=cluster)
        report = plan.meta.schedule_report
        for seg in report["segments"]:
            times = {tuple(sorted(a["options"].items())): a["time_s"] for a in seg["alternatives"]}
            chunked = times[(("bins", 1), ("chunked", True), ("overlap", True))]
            whole = times[(("bins", 1), ("chunked", False), ("overlap", True))]
            assert seg["options"]["chunked"] == (chunked < whole)
        assert [seg["options"]["chunked"] for seg in report["segments"]] == expected, spmm_rate
        halos = [[exchange_schedule(e).chunked for e in layer.eqns if e.op == "halo"]
                 for layer in plan.program.graph_layers()]
        assert halos == [[c] for c in expected]


def test_chunks_only_of_an_overlapped_ring() -> None:
    """`chunked` needs the halo split (its readers per part) and the ring (a peer's receive waited alone)."""
    from gnnc.errors import PlanError
    from gnnc.plan.schedule_attrs import check_schedule

    g = hub_graph()
    model = api.load_model(EXAMPLES / "gcn.gnn")
    for sched in ("schedule{overlap=off chunked=on}", "schedule{method=all_to_all chunked=on}"):
        plan = api.compile(model, g, workers=2, strategy="depcomm", passes=DEFAULT_PIPELINE
                           + DISTRIBUTED_PIPELINE[:-1] + [sched])
        assert chunked_halos(plan.program) == 0, sched
    text = str(api.compile(model, g, workers=2, strategy="depcomm", passes=DEFAULT_PIPELINE
                           + DISTRIBUTED_PIPELINE[:-1] + ["schedule{overlap=off}"]).program)
    bad = parse_ir(text.replace("overlap=false", "chunked=true, overlap=false", 1))
    with pytest.raises(PlanError, match="chunked needs overlap=true"):
        check_schedule(bad)


def test_a_ranks_chunks_run_in_ring_order() -> None:
    """Rank 1 of 4 receives from 0, then 3, then 2 (NeutronStar's ring): after the held rows (part 0), the parts of
    ranks 0, 3, 2 (parts 1, 3, 2: one per other rank, by rank; no empty part of its own, which would run every
    per-part equation once more); a part is waited for when first read, in that order."""
    from gnnc.runtime import comm
    from gnnc.runtime.distributed import Exchange
    from gnnc.runtime.parts import PartStream

    ex = Exchange.__new__(Exchange)
    ex.rank, ex.world = 1, 4
    assert ex.chunk_order() == (0, 1, 3, 2)
    assert [src for _, src in comm.ring_schedule(1, 4)] == [0, 3, 2]
    arrived: list[int] = []

    def later():
        for p in ex.chunk_order()[1:]:
            arrived.append(p)
            yield torch.full((1, 1), float(p))

    stream = PartStream(torch.zeros(1, 1), later(), 4, ex.chunk_order()[1:])
    assert float(stream.part(2)[0, 0]) == 2 and arrived == [1, 3, 2]  # waits for the parts that come before
    assert stream.whole().flatten().tolist() == [0, 1, 2, 3] and arrived == [1, 3, 2]  # held in part order


@pytest.mark.parametrize("exch, held, remote", [(1.0, 0.1, 0.3), (1.0, 2.0, 0.5), (0.2, 0.1, 3.0), (5.0, 0.0, 0.0)])
def test_the_exposed_communication_is_the_window_less_its_work(exch: float, held: float, remote: float) -> None:
    """What chunk_overlap.py predicts as a rank's blocked halo time: the window (its dispatch apart) less the held
    and remote work, whole and chunked."""
    from gnnc.passes.cost.overlap import exposed_communication

    for workers in (2, 3, 4, 8):
        for chunked in (False, True):
            args = (sympy.Float(exch), sympy.Float(held), sympy.Float(remote))
            window = float(overlap_window(*args, chunked, sympy.Integer(0)).subs(P, workers))
            assert float(exposed_communication(*args, chunked).subs(P, workers)) == pytest.approx(
                window - held - remote, abs=1e-12)


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_a_part_is_charged_the_equations_that_run_per_part(name: str) -> None:
    """Each extra part of a chunked halo is priced at the dispatch of the equations that run once per part (those
    the schedule pass marks `split`: SAGE's mean, GAT's five on edges), not of every op of the layer (9 for SAGE):
    the cost model's count is the plan's."""
    from gnnc.passes.cost.ops import program_op_work
    from gnnc.plan.schedule_attrs import split_eqn

    g = hub_graph()
    model = _model(name)
    plan = api.compile(model, g, workers=4, strategy="depcomm", passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1]
                       + [CHUNKED])
    split = [sum(split_eqn(e) for e in layer.eqns) for layer in plan.program.graph_layers()]
    work = program_op_work(api.compile(model, g).program)
    assert [w.part_calls_forward for w in work] == split
    assert all(w.part_calls_forward < w.calls_forward for w in work)


def test_a_rank_that_posts_early_waits_for_the_last_peer() -> None:
    """The arrival spread (issue 38 item 4): a rank that posts `late` seconds before its last peer waits for an
    exchange of exch + late, less the work it overlaps; 0 is the model's every-rank-at-once."""
    from gnnc.passes.cost.overlap import exposed_communication

    for chunked in (False, True):
        for exch, held, remote, late in [(1.0, 0.2, 0.3, 0.5), (1.0, 2.0, 0.5, 0.5), (1.0, 2.0, 0.5, 1.5)]:
            args = (sympy.Float(exch), sympy.Float(held), sympy.Float(remote), chunked)
            at_once = float(exposed_communication(*args).subs(P, 4))
            shifted = float(exposed_communication(*args, sympy.Float(late)).subs(P, 4))
            if not chunked:  # the window starts `late` before the exchange does
                assert shifted == pytest.approx(float(exposed_communication(sympy.Float(exch + late), *args[1:])))
            assert at_once <= shifted <= at_once + late + 1e-12
    # whole halo: the held work hides the lateness first
    assert float(exposed_communication(sympy.Float(1.0), sympy.Float(2.0), sympy.Float(0.5), False,
                                       sympy.Float(0.5))) == 0.0
    assert float(exposed_communication(sympy.Float(1.0), sympy.Float(2.0), sympy.Float(0.5), False,
                                       sympy.Float(1.5))) == pytest.approx(0.5)
