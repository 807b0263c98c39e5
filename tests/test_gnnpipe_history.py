"""GNNPipe's history as published (its trick 3) is the default; the per-chunk update is a named setting.

GNNPipe (section 3.2.4) fixes the historical embeddings between refreshes every alpha epochs: consecutive
epochs read the same rows. gnnc used to overwrite the history with each chunk's rows as the chunk passed (with
groups of G > 1, handing the peers those rows: extra bytes). Now `stage-pipeline{history_update=refresh}` (the
default) keeps the history fixed and `history_update=chunk` is the old behaviour; the plan records which, the
prediction counts the handed rows only under `chunk`, and `shuffle_chunks=false` turns trick 1 off to measure
it. tests/test_pipeline.py runs both settings on 2 and 4 ranks against a one-process reference.
"""
from __future__ import annotations

import pytest

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


def test_only_the_per_chunk_update_hands_rows_to_the_peers() -> None:
    """With groups of 2 a passing chunk hands its peers the rows they read from their history elsewhere
    (the `later` exchange); the published history moves nothing between refreshes, so the step's history
    bytes are only the chunks' peer rows and their gradients."""
    published, per_chunk = _compile(""), _compile("history_update=chunk")
    fixed, handed = published.meta.predicted_bytes_per_step, per_chunk.meta.predicted_bytes_per_step
    assert fixed["pipe"] == handed["pipe"] and fixed["allreduce"] == handed["allreduce"]
    assert 0 < fixed["history"] < handed["history"]
    assert published.meta.pipeline["refresh_bytes"] == per_chunk.meta.pipeline["refresh_bytes"]
    assert published.meta.pipeline["predicted"]["bytes"] < per_chunk.meta.pipeline["predicted"]["bytes"]


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
