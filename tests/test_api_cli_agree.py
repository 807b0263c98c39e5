"""`gnnc run` is `gnnc.run`: the CLI parses its flags, calls api.run once and prints the RunResult it returns.

The CLI used to repeat the API's run path (load, compile, TrainConfig, memory check, local or distributed run,
result), and this file compared the two to keep them in step; there is one path now.
"""
from __future__ import annotations

import json

import torch

from conftest import EXAMPLES
import gnnc
from gnnc import api, cli
from gnnc.runtime.train import SUMMARY_FIELDS


def test_the_cli_runs_through_api_run(tmp_path, monkeypatch, capsys) -> None:
    model = str(EXAMPLES / "gcn.gnn")
    calls = []
    real = api.run

    def spy(*args, **kwargs):
        calls.append(kwargs)
        result = real(*args, **kwargs)
        calls.append(result)
        return result

    monkeypatch.setattr(api, "run", spy)
    assert cli.main(["run", model, "--graph", "planetoid:cora", "--set", "hidden=32", "--epochs", "2", "--seed", "1",
                     "--dump-logits", str(tmp_path / "l.pt"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(calls) == 2, "the CLI calls api.run once"
    kwargs, result = calls
    assert kwargs["epochs"] == 2 and kwargs["seed"] == 1 and kwargs["threads"] == "auto"
    # what it prints is the RunResult api.run returned, as it is
    assert printed == result.to_json() and set(printed) == set(SUMMARY_FIELDS)
    assert printed["epochs"] == 2 and printed["device"] == "cpu" and printed["precision"] == "fp32"
    assert torch.equal(result.logits, torch.load(tmp_path / "l.pt"))
    # and the API called directly with the same settings trains the same model to the same logits
    monkeypatch.setattr(api, "run", real)
    again = gnnc.run(gnnc.load_model(model, hidden=32), "planetoid:cora", epochs=2, seed=1, threads="auto")
    assert torch.equal(again.logits, result.logits) and again.test_acc == printed["test_acc"]
