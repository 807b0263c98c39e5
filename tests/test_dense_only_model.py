"""A model of dense layers only (an MLP baseline, which PyG users run beside their GNNs) trains in one process and
is refused, with exit 2, where a plan would split a graph it does not read: the run's memory check and the
planner read each graph layer's width and had none to read (an IndexError, exit 1)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import gnnc_in_process

MLP = """
model MLP(features, hidden = 32, classes) {
  h = linear(x, hidden)
  h = relu(h)
  h = linear(h, classes)
  training(epochs = 40, lr = 0.01)
  loss = cross_entropy(h, y, mask = train)
}
"""


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.gnn"
    path.write_text(MLP)
    return path


def test_an_mlp_trains_in_one_process(mlp: Path) -> None:
    ran = gnnc_in_process("run", str(mlp), "--graph", "planetoid:cora", "--json", "--no-progress")
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["test_acc"] > 0.3  # an MLP on Cora's words alone reaches about 0.55; chance is 0.14


@pytest.mark.parametrize("flags", [("--nproc", "2"), ("--fanout", "5", "--batch-size", "64")])
def test_a_plan_that_splits_the_graph_is_refused(mlp: Path, flags: tuple[str, ...]) -> None:
    ran = gnnc_in_process("run", str(mlp), "--graph", "planetoid:cora", *flags)
    assert ran.returncode == 2
    assert "without a graph layer" in ran.stderr
