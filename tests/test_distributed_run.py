"""`gnnc run --nproc N` as a user runs it: same logits as one process, faults, resume, torchrun.

The launcher runs in this process (gnnc.cli.main, conftest.gnnc_in_process) where a test checks what the run
computes or refuses: its workers are real processes all the same. A signal's effect and torchrun start
`python -m gnnc`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, ROOT, gnnc_in_process as gnnc

GCN = str(EXAMPLES / "gcn.gnn")


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


RUN_BASE = ("run", GCN, "--graph", "planetoid:cora", "--epochs", "20", "--seed", "0")


@pytest.fixture(scope="module")
def one_process_logits(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    path = tmp_path_factory.mktemp("one") / "one.pt"
    one = gnnc(*RUN_BASE, "--dump-logits", str(path))
    assert one.returncode == 0, one.stderr
    return torch.load(path)


# The command-line path of `--nproc N --strategy S`: every strategy on 2 processes, two of them on 4 as well
# (the other three on 4 under -m slow).
# Each strategy's exactness on 2 and 4 processes (logits, loss, every gradient, 1e-5) is
# tests/test_distributed_exact.py's, in one launch per world size; each case here costs a launch of its own.
@pytest.mark.parametrize("strategy, nproc", [("depcomm", 2), ("depcache", 2), ("hybrid", 2), ("bcast1d", 2),
                                             ("pushpull,depcomm", 2), ("hybrid", 4), ("pushpull,depcomm", 4),
                                             *(pytest.param(s, 4, marks=pytest.mark.slow)
                                               for s in ("depcomm", "depcache", "bcast1d"))])
def test_nproc_logits_match_one_process(strategy: str, nproc: int, one_process_logits: torch.Tensor,
                                        tmp_path: Path) -> None:
    out = tmp_path / f"{nproc}.pt"
    r = gnnc(*RUN_BASE, "--nproc", str(nproc), "--strategy", strategy, "--dump-logits", str(out))
    assert r.returncode == 0, r.stderr
    assert rel(torch.load(out), one_process_logits) < 1e-4, f"{strategy} x{nproc}"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigkill_of_one_rank_stops_every_process(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "gnnc", "run", GCN, "--graph", "planetoid:cora", "--nproc", "2",
                             "--strategy", "depcomm", "--epochs", "100000", "--metrics", str(metrics)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training started:\n{proc.stderr.read()}")
        time.sleep(0.2)
    assert metrics.exists(), "training did not start"
    def cmdline(pid: int) -> str:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")

    ranks = sorted(p for p in _children(proc.pid) if "spawn_main" in cmdline(p) and "resource_tracker" not in cmdline(p))
    assert len(ranks) >= 2, f"expected two worker processes, found {ranks}"
    victim = ranks[-1]
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=90)
    elapsed = time.time() - t0
    assert proc.returncode != 0
    assert elapsed < 60, f"took {elapsed:.1f} s to stop"
    assert "rank" in err and ("SIGKILL" in err or "signal" in err), err
    assert "Traceback" not in err.splitlines()[-1]
    for pid in ranks:
        assert not _alive(pid), f"worker {pid} is still running"


def test_resume_reproduces_the_loss_curve(tmp_path: Path) -> None:
    base = ["run", GCN, "--graph", "planetoid:cora", "--nproc", "2", "--strategy", "depcomm", "--seed", "2"]
    full = gnnc(*base, "--epochs", "12", "--metrics", str(tmp_path / "full.jsonl"))
    assert full.returncode == 0, full.stderr
    ck = tmp_path / "ck"
    first = gnnc(*base, "--epochs", "6", "--checkpoint", str(ck), "--checkpoint-every", "3",
                 "--metrics", str(tmp_path / "a.jsonl"))
    assert first.returncode == 0, first.stderr
    second = gnnc(*base, "--epochs", "12", "--checkpoint", str(ck), "--checkpoint-every", "3", "--resume",
                  "--metrics", str(tmp_path / "b.jsonl"))
    assert second.returncode == 0, second.stderr

    def losses(path: Path) -> dict[int, float]:
        return {r["epoch"]: r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["rank"] == 0}

    want = losses(tmp_path / "full.jsonl")
    got = {**losses(tmp_path / "a.jsonl"), **losses(tmp_path / "b.jsonl")}
    assert sorted(got) == list(range(12))
    for epoch in range(12):
        assert abs(got[epoch] - want[epoch]) <= 1e-6 * max(1.0, abs(want[epoch])), epoch


def test_plan_with_corrupt_shard_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    r = gnnc("compile", GCN, "--graph", "planetoid:cora", "--workers", "2", "--strategy", "depcomm", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    data = (plan / "parts.npy").read_bytes()
    (plan / "parts.npy").write_bytes(data[: len(data) // 2])
    r = gnnc("run", str(plan), "--nproc", "2", "--epochs", "1")
    assert r.returncode == 2 and "does not match its checksum" in r.stderr
    (plan / "parts.npy").unlink()
    r = gnnc("run", str(plan), "--nproc", "2", "--epochs", "1")
    assert r.returncode == 2 and "shard missing" in r.stderr


def test_ranks_read_only_their_shards(tmp_path: Path) -> None:
    """A compiled plan runs after its graph file is gone; a damaged rank shard is refused with exit 2."""
    from conftest import random_graph

    g = random_graph(n=300, e=1500, f=8, c=3, seed=1)
    npz = tmp_path / "g.npz"
    import numpy as np

    np.savez(npz, edge_index=np.stack([g.src, g.dst]), x=g.x.numpy(), y=g.y.numpy(),
             train_mask=g.train_mask.numpy(), val_mask=g.val_mask.numpy(), test_mask=g.test_mask.numpy())
    plan = tmp_path / "plan"
    r = gnnc("compile", GCN, "--graph", str(npz), "--workers", "2", "--strategy", "depcomm", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (plan / "shards").iterdir()) == ["manifest.json", "rank-00000.npz",
                                                                   "rank-00001.npz"]
    ref = gnnc("run", str(plan), "--nproc", "2", "--epochs", "3", "--dump-logits", str(tmp_path / "a.pt"))
    assert ref.returncode == 0, ref.stderr
    npz.unlink()
    r = gnnc("run", str(plan), "--nproc", "2", "--epochs", "3", "--dump-logits", str(tmp_path / "b.pt"))
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt"))
    shard = plan / "shards" / "rank-00001.npz"
    shard.write_bytes(shard.read_bytes()[:-10])
    r = gnnc("run", str(plan), "--nproc", "2", "--epochs", "1")
    assert r.returncode == 2 and "rank-00001.npz" in r.stderr and "truncated" in r.stderr, r.stderr


@pytest.mark.slow
def test_two_torchrun_nodes_match_nproc_4(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    r = gnnc("compile", GCN, "--graph", "planetoid:cora", "--workers", "4", "--strategy", "depcomm", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = gnnc("run", str(plan), "--nproc", "4", "--epochs", "5", "--dump-logits", str(tmp_path / "ref.pt"))
    assert r.returncode == 0, r.stderr
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "gnnc-test",
           "--local-addr", "127.0.0.1", "-m", "gnnc", "run", str(plan), "--epochs", "5",
           "--dump-logits", str(tmp_path / "tr.pt")]
    nodes = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [n.communicate(timeout=600) for n in nodes]
    for n, (out, err) in zip(nodes, outs):
        assert n.returncode == 0, err
    assert torch.equal(torch.load(tmp_path / "tr.pt"), torch.load(tmp_path / "ref.pt"))
