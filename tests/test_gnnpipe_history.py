"""GNNPipe's history as published (its trick 3) is the default; the previous epoch's rows are a named setting.

GNNPipe (section 3.2.4) reads the neighbours a chunk needs but no chunk has processed yet this epoch from the
embeddings of epoch alpha*floor((t-1)/alpha): every epoch of a window of alpha starts from the same rows (those
processed this epoch are read current, its Algorithm 1). gnnc used to start each epoch from what the previous
epoch's chunks left. Now `stage-pipeline{history_update=refresh}` (the default) starts every epoch from the last
refresh and `history_update=chunk` is the old behaviour; the plan records which, and `shuffle_chunks=false`
turns trick 1 off to measure it.
"""
from __future__ import annotations

import pytest

from _rank_pool import pooled_launch
from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.errors import GnncError, PlanError
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE
from gnnc.plan.pipeline import HISTORY_UPDATE, schedule_of
from gnnc.runtime.pipeline import chunk_order

GRAPH = random_graph(n=90, e=420, f=10, c=4, seed=11)


def _compile(options: str, groups: int = 2):
    model = api.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    passes = [*DEFAULT_PIPELINE, "choose-strategy{strategy=pipeline}", "assign-strategy", "select-hybrid",
              f"stage-pipeline{{pipeline_groups={groups} {options}}}", "insert-comm", "predict-bytes"]
    return api.compile(model, GRAPH, workers=4, passes=passes, approximate=True)


def test_published_history_is_the_default_and_the_plan_records_the_setting() -> None:
    assert HISTORY_UPDATE == "refresh"
    published, per_chunk = _compile(""), _compile("history_update=chunk")
    assert schedule_of(published.program).history_update == "refresh"
    assert schedule_of(per_chunk.program).history_update == "chunk"
    assert published.meta.pipeline["history_update"] == "refresh"
    assert per_chunk.meta.pipeline["history_update"] == "chunk"
    assert "chunk_history=false" in str(published.program) and "chunk_history=true" in str(per_chunk.program)


def test_both_settings_move_the_same_bytes() -> None:
    """Processed neighbours are read current in both (GNNPipe's Algorithm 1: with groups of 2 a passing chunk
    hands its peers its rows); the settings differ only in where an epoch's history starts."""
    published, per_chunk = _compile(""), _compile("history_update=chunk")
    assert published.meta.predicted_bytes_per_step == per_chunk.meta.predicted_bytes_per_step
    assert published.meta.pipeline["refresh_bytes"] == per_chunk.meta.pipeline["refresh_bytes"]


@pytest.fixture(scope="module")
def one_step_of_each_update(tmp_path_factory) -> dict[str, tuple]:
    """update -> (plan, rank 0's step of epoch 2 after epoch 1's), both plans' steps in one 2-rank launch
    (starting the ranks is most of the cost)."""
    from gnnc.runtime.distributed import DistJob
    from gnnc.runtime.pipeline import one_step_each
    from gnnc.runtime.train import TrainConfig
    from test_pipeline import SEED

    model = api.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    plans, jobs = {}, []
    for update in ("refresh", "chunk"):
        passes = [*DEFAULT_PIPELINE, "choose-strategy{strategy=pipeline}", "assign-strategy", "select-hybrid",
                  f"stage-pipeline{{history_update={update}}}", "insert-comm", "predict-bytes"]
        plans[update] = plan = api.compile(model, GRAPH, workers=2, passes=passes, approximate=True)
        shards = plan.write_shards(tmp_path_factory.mktemp(update) / "plan")
        jobs.append(DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False)))
    got = pooled_launch(one_step_each, 2, jobs, [(1, 2)] * len(jobs))[0]
    return {update: (plans[update], step) for update, step in zip(plans, got)}


@pytest.mark.parametrize("update", ["refresh", "chunk"])
def test_an_epoch_after_the_refresh_starts_from_it_only_when_published(update: str, one_step_of_each_update) -> None:
    """Refresh in epoch 0, a step in epoch 1, then the step of epoch 2, on 2 ranks. Published (trick 3), epoch
    2's chunks start from the refresh's history, as epoch 1's did: its step is the one-process reference that
    starts from the refresh (test_pipeline.pipelined_reference). Per chunk, epoch 2 starts from what epoch 1's
    chunks left: another step. Before the setting gnnc always did the latter."""
    import numpy as np
    from test_pipeline import pipelined_reference, rel

    plan, got = one_step_of_each_update[update]
    chunk_of = np.asarray(plan.parts) // schedule_of(plan.program).groups
    logits, loss, _ = pipelined_reference(plan.program, GRAPH, chunk_of, 2)
    assert (rel(got["logits"], logits) < 1e-5) == (update == "refresh"), rel(got["logits"], logits)


def test_unknown_history_update_is_refused_naming_the_choices() -> None:
    with pytest.raises(GnncError, match="history_update must be one of refresh, chunk"):
        _compile("history_update=latest")


def test_a_plan_without_the_setting_is_refused() -> None:
    """A pipeline plan compiled before the setting existed ran the per-chunk update: it is not silently read
    as the published history."""
    text = str(_compile("").program).replace("chunk_history=false, ", "").replace(", chunk_history=false", "")
    assert "chunk_history" not in text
    with pytest.raises(PlanError, match="chunk_history=true\\|false.*recompile"):
        schedule_of(parse_ir(text))


def test_chunk_shuffling_can_be_turned_off_for_the_ablation() -> None:
    assert schedule_of(_compile("").program).shuffle_chunks
    assert not schedule_of(_compile("shuffle_chunks=false").program).shuffle_chunks
    assert chunk_order(0, 5, 8, shuffle=False) == list(range(8)) == chunk_order(0, 6, 8, shuffle=False)
    assert chunk_order(0, 5, 8) != chunk_order(0, 6, 8)


def test_a_pipeline_plan_trains_to_the_end() -> None:
    """`gnnc run` of a pipeline plan: training ends with the weights copied to the host, which asked every
    worker for its ops' running state, and the pipeline's worker had none (AttributeError: 'PipelineWorker'
    object has no attribute 'state', on every rank). Two ranks, two epochs (one launch: starting the ranks is
    what takes the time; tests/test_pipeline.py runs both settings' steps)."""
    model = api.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    plan = api.compile(model, GRAPH, workers=2, strategy="pipeline", approximate=True)
    result = api.run(plan, GRAPH, epochs=2, seed=0, nproc=2)
    assert len(result.history) == 2 and result.logits.shape == (GRAPH.num_nodes, GRAPH.num_classes)
