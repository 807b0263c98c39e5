"""G3's inter-layer pipeline (section 5.2): a binned layer's bins, as each ends, send their rows of the next
layer's halos to the peers that need them, and the next layer runs each of its bins as soon as every peer's bin
its sources come in has arrived (`schedule{pipeline=on}`: `halo[pipelined=true]`, gnnc.plan.bins.PipeChain;
gnnc.runtime.bins, gnnc.runtime.comm.BinPipe).

The result is one process's up to the order of the floating-point sums (logits, loss and every gradient within
1e-5, as test_distributed_exact) on 2 and 4 gloo ranks, and the bytes are the plan's prediction: the same rows
move, in one message per (bin, peer).
"""
from __future__ import annotations

import pytest

from _rank_pool import pooled_launch
from conftest import EXAMPLES
from gnnc import api
from gnnc.errors import PlanError
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.plan.bins import PipeChain, pipeline_chain, pipelined, pipelines
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import bytes_and_step_failures, communities, compile_half_cached, hub_graph

SEED = 3


def _passes(bins: int, pipeline: str = "on") -> list[str]:
    return DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [f"schedule{{bins={bins} pipeline={pipeline}}}"]


def pipelined_halos(program) -> int:
    return sum(pipelined(e) for layer in program.layers for e in layer.eqns)


def cases(world: int, tmp):
    out = []
    for name, graph_of, bins in [("gcn", hub_graph, 2), ("sage", hub_graph, 3), ("gat", hub_graph, 2),
                                 ("sage", communities, 4), ("gat", communities, 3)]:
        g = graph_of()
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        plan = compile_half_cached(model, g, world, "depcomm", _passes(bins))
        assert pipelined_halos(plan.program) == (2 if name == "gat" else 1), (name, str(plan.program))
        shards = plan.write_shards(tmp / f"{name}-{graph_of.__name__}")
        job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False))
        out.append(((name, graph_of.__name__, bins), api.compile(model, g).program, g, job,
                    plan.meta.predicted_bytes_per_step))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_pipelined_bins_match_one_process(world: int, tmp_path) -> None:
    todo = cases(world, tmp_path)
    results = pooled_launch(one_step_each, world, [job for _, _, _, job, _ in todo])[0]
    failures = bytes_and_step_failures(todo, results, SEED)
    assert not failures, "\n".join(failures)


def test_the_pipeline_feeds_only_what_it_can() -> None:
    """pipeline=on marks the halos of a binned DepComm layer whose inputs the previous binned layer's rows give
    row by row (SAGE: relu, dropout, the next dense map; GAT: its map and a score, two halos); not a layer whose
    previous layer runs whole (the first), nor without bins; a halo marked where no pipeline can feed it is a
    PlanError."""
    g = hub_graph()
    sage = compile_half_cached(api.load_model(EXAMPLES / "sage.gnn"), g, 2, "depcomm", _passes(2)).program
    first, second = sage.graph_layers()
    assert pipeline_chain(sage, first) == "no graph layer before it"
    chain = pipeline_chain(sage, second)
    assert isinstance(chain, PipeChain) and chain.sender == first.name
    by_name = {layer.name: layer for layer in sage.layers}
    assert [by_name[name].eqns[k].op for name, k in chain.eqns] == ["relu", "dropout", "linear"]
    assert [pipelined(e) for e in first.eqns if e.op == "halo"] == [False]
    assert [pipelined(e) for e in second.eqns if e.op == "halo"] == [True]
    gat = compile_half_cached(api.load_model(EXAMPLES / "gat.gnn"), g, 2, "depcomm", _passes(2)).program
    assert pipelined_halos(gat) == 2 and set(pipelines(gat)) == {gat.graph_layers()[0].name}
    plain = compile_half_cached(api.load_model(EXAMPLES / "sage.gnn"), g, 2, "depcomm",
                                DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + ["schedule{pipeline=on}"]).program
    assert pipelined_halos(plain) == 0
    assert "does not run in bins" in pipeline_chain(plain, plain.graph_layers()[1])
    layers = list(plain.layers)
    k = layers.index(plain.graph_layers()[1])
    layers[k] = layers[k].replace(eqns=tuple(e.with_attrs(pipelined=True) if e.op == "halo" else e
                                             for e in layers[k].eqns))
    with pytest.raises(PlanError, match="cannot be pipelined"):
        pipelines(plain.replace(layers=tuple(layers)))
