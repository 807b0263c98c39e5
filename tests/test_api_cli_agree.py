"""The tutorial through the Python API and through the CLI gives the same plan bytes and logits."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from conftest import EXAMPLES, ROOT
import gnnc
from gnnc.runtime.train import RunResult


def cli(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def test_api_and_cli_agree(tmp_path) -> None:
    model_path = str(EXAMPLES / "gcn.gnn")
    # compile: same plan bytes
    model = gnnc.load_model(model_path, hidden=32)
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(model, graph, graph_spec="planetoid:cora")
    plan.save(tmp_path / "api")
    cli("compile", model_path, "--graph", "planetoid:cora", "--set", "hidden=32", "-o", str(tmp_path / "cli"))
    assert (tmp_path / "api" / "plan.json").read_bytes() == (tmp_path / "cli" / "plan.json").read_bytes()
    # run: same logits, one process
    result = gnnc.run(plan, graph, epochs=5, seed=1)
    cli("run", str(tmp_path / "cli"), "--epochs", "5", "--seed", "1", "--dump-logits", str(tmp_path / "l.pt"))
    assert torch.equal(result.logits, torch.load(tmp_path / "l.pt"))
    # and distributed, two workers
    dist = gnnc.run(model, "planetoid:cora", nproc=2, strategy="depcomm", epochs=3, seed=1)
    r = cli("run", model_path, "--graph", "planetoid:cora", "--set", "hidden=32", "--nproc", "2", "--strategy",
            "depcomm", "--epochs", "3", "--seed", "1", "--dump-logits", str(tmp_path / "d.pt"), "--json")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["strategies"] == ["depcomm", "depcomm"]
    assert torch.allclose(dist.logits, torch.load(tmp_path / "d.pt"), rtol=0, atol=0)
    # one result type for one process and for N (issue 21, item 11), with the summary the CLI prints
    assert type(result) is type(dist) is RunResult and (result.world_size, dist.world_size) == (1, 2)
    assert result.summary().keys() == dist.summary().keys() and dist.strategies == ["depcomm", "depcomm"]
    assert set(dist.summary()) <= set(summary) and dist.test_acc == summary["test_acc"]
