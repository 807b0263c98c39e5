"""The cost model prices the run's flags (issue 35): --eval-every K counts the evaluation pass once in K epochs,
--recompute one more forward pass and, in the memory pre-check, a layer's inputs kept instead of its activations;
at the defaults the predicted epoch is the planner's (no plan changes)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLES, ROOT
from gnnc import api
from gnnc.passes.cost.evaluation import evaluate_cost
from gnnc.passes.cost.inputs import planning_inputs
from gnnc.passes.cost.registry import segment_cost

GCN = str(EXAMPLES / "gcn.gnn")


def _layer_values(model: str = "gcn"):
    graph = api.load_graph("planetoid:cora")
    plan = api.compile(api.load_model(EXAMPLES / f"{model}.gnn"), graph)
    _, inputs, shapes = planning_inputs(plan.program, graph, np.zeros(graph.num_nodes, np.int64),
                                        api.resolve_cluster(None), workers=1)
    return [evaluate_cost(segment_cost("local", i, i + 1, shapes[i:i + 1]), inputs) for i in range(len(shapes))]


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_eval_every_k_counts_the_evaluation_once_in_k_epochs(model: str) -> None:
    values = _layer_values(model)
    every = sum(v.epoch_time() for v in values)
    evaluation = sum(v.evaluation_time for v in values)
    assert every == sum(v.time for v in values)  # at K=1 the planner's epoch, as before
    assert 0 < evaluation < every
    five = sum(v.epoch_time(eval_every=5) for v in values)
    assert five == pytest.approx(every - evaluation * (1 - 1 / 5), rel=1e-12)
    assert five < every


def test_recompute_adds_one_forward_pass_to_the_epoch() -> None:
    values = _layer_values()
    every = sum(v.epoch_time() for v in values)
    again = sum(v.epoch_time(recompute=True) for v in values)
    assert again == pytest.approx(every + sum(v.evaluation_time for v in values), rel=1e-12)
    assert again > every


@pytest.mark.slow
def test_the_recompute_prediction_is_near_the_measured_peak() -> None:
    """--recompute's predicted peak (passes/cost/memory.py) against the measured one, within the pre-check's 25%
    (tests/test_memory_check.py's test_the_prediction_is_near_the_measured_peak)."""
    r = subprocess.run([sys.executable, "-m", "gnnc", "run", GCN, "--graph", "planetoid:cora", "--epochs", "3",
                        "--json", "--set", "hidden=4096", "--recompute"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    measured, predicted = summary["peak_rss_bytes"], summary["predicted_peak_rss_bytes"]
    assert abs(predicted - measured) < 0.25 * measured, (predicted, measured)
