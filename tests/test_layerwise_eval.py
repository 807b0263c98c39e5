"""--eval-every K (issue 35, item 2): the evaluation's forward pass over every vertex runs after every K-th epoch
only (and the first epoch run and the last), with the same training and the same final logits as evaluating every
epoch; a bad K exits 2 naming the flag."""
from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api, cli
from gnnc.runtime import train as train_module

GCN = str(EXAMPLES / "gcn.gnn")


def _run(graph, monkeypatch, **kwargs):
    evaluations: list[int] = []
    forward = train_module.Worker.forward

    def counted(self, params, training, epoch):
        if not training:
            evaluations.append(epoch)
        return forward(self, params, training, epoch)

    monkeypatch.setattr(train_module.Worker, "forward", counted)
    result = api.run(api.load_model(GCN), graph, epochs=7, seed=3, **kwargs)
    monkeypatch.setattr(train_module.Worker, "forward", forward)
    return result, evaluations


def test_evaluation_every_k_epochs_trains_the_same(monkeypatch) -> None:
    graph = random_graph(n=60, e=300, f=8, c=3, seed=1)
    every, each = _run(graph, monkeypatch)
    sparse, when = _run(graph, monkeypatch, eval_every=3)
    assert each == list(range(7)) and when == [0, 3, 6]  # the first, every third, the last
    assert [r["evaluated"] for r in sparse.history] == [True, False, False, True, False, False, True]
    assert torch.equal(sparse.logits, every.logits)  # the training does not depend on how often it is evaluated
    assert [r["loss"] for r in sparse.history] == [r["loss"] for r in every.history]
    assert sparse.best_epoch in when and sparse.history[sparse.best_epoch]["evaluated"]
    for r in sparse.history:  # between evaluations, the last evaluation's figures
        if not r["evaluated"]:
            last = max(e for e in when if e < r["epoch"])
            assert r["val_acc"] == sparse.history[last]["val_acc"]


@pytest.mark.parametrize("k", ["0", "-2", "x"])
def test_a_bad_eval_every_exits_2_naming_the_flag(k: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", GCN, "--graph", "planetoid:cora", "--eval-every", k])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --eval-every:" in err and "unrecognized" not in err


def test_train_config_refuses_a_bad_eval_every() -> None:
    with pytest.raises(train_module.GnncError, match="--eval-every: must be a whole number of at least 1"):
        train_module.TrainConfig(eval_every=0)
