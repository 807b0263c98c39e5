"""Issue 20, the input side: bad input is a message and exit 2, and `gnnc run PLAN` obeys its plan.

Every case used to end in a traceback (exit 1), a huge allocation or a
silently ignored flag: training flags no run can use, damaged `.npz` files
and graph-cache entries, vertex ids and labels that imply terabytes, forged
or fingerprint-less checkpoints, flags that contradict a compiled plan and a
plan whose IR strategies were edited after its shards were cut. All run
in-process through `gnnc.cli.main` on a 6-vertex graph; none starts a worker.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, ROOT
from gnnc import cli
from gnnc.errors import PlanError
from gnnc.graph import loaders
from gnnc.host import AvailableMemory
from gnnc.plan.plan_file import Plan
from gnnc.plan_flags import check_run_flags
from gnnc.runtime import checkpoint

GCN = str(EXAMPLES / "gcn.gnn")
EDGES = np.array([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 1]])


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch) -> None:
    """Graph-cache entries go to this test's directory, not the repository's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def six(tmp_path: Path, name: str = "six.npz", **fields) -> str:
    arrays = {"edge_index": EDGES, "x": np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32),
              "y": np.array([0, 1, 0, 1, 0, 1])}
    arrays.update(fields)
    np.savez(tmp_path / name, **arrays)
    return str(tmp_path / name)


def run(capsys, *args: str) -> tuple[int, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as stop:  # argparse's refusal of a flag's value (gnnc.arg_types)
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


# --- item 8: training flags no run can use -------------------------------------------------------


@pytest.mark.parametrize("flag, value", [("--epochs", "0"), ("--epochs", "-3"), ("--lr", "-1"), ("--lr", "nan"),
                                         ("--weight-decay", "-1"), ("--checkpoint-every", "0")])
def test_training_flags_no_run_can_use_are_named(tmp_path: Path, capsys, flag: str, value: str) -> None:
    code, err = run(capsys, "run", GCN, "--graph", six(tmp_path), flag, value, "--checkpoint", str(tmp_path / "ck"))
    assert code == 2
    assert f"{flag}" in err and value.lstrip("-") in err, err


# --- item 8: damaged graph files and cache entries -----------------------------------------------


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"\x93NUMPY not a zip at all" + b[:40], "not an .npz file"),
    (lambda b: b[: len(b) // 2], "not a readable .npz file (truncated or damaged"),
    (lambda b: b[:-30], "not a readable .npz file (truncated or damaged"),
])
def test_a_garbage_or_truncated_npz_is_named(tmp_path: Path, capsys, damage, message: str) -> None:
    path = Path(six(tmp_path))
    path.write_bytes(damage(path.read_bytes()))
    code, err = run(capsys, "run", GCN, "--graph", str(path), "--epochs", "1")
    assert code == 2 and message in err, err


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:]],
                         ids=["truncated", "bit-flipped"])
def test_a_damaged_cache_entry_is_rebuilt(tmp_path: Path, damage) -> None:
    path = six(tmp_path)
    cache = tmp_path / "graph-cache"
    first = loaders.load_graph(path, cache_dir=cache)
    (entry,) = cache.glob("graph-*.npz")
    entry.write_bytes(damage(entry.read_bytes()))
    again = loaders.load_graph(path, cache_dir=cache)  # rebuilt from the file, not an error on every load
    assert torch.equal(again.x, first.x) and np.array_equal(again.src, first.src)
    assert loaders._read_cached(entry, _key_of(entry)) is not None  # and the entry was written again, whole


def _key_of(entry: Path) -> str:
    with np.load(entry) as f:
        return str(f["key"])


def test_an_edge_list_with_a_huge_vertex_id_is_refused_before_allocating(tmp_path: Path, capsys) -> None:
    (tmp_path / "edges.txt").write_text("0 1\n1 999999999999\n")
    code, err = run(capsys, "run", GCN, "--graph", str(tmp_path / "edges.txt"), "--epochs", "1")
    assert code == 2
    assert "edges.txt:2: edge list: vertex id 999999999999" in err and "number the vertices from 0" in err, err


def test_a_huge_label_is_refused_naming_y(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(loaders, "available_memory", lambda: AvailableMemory(8 << 30, "test"))
    code, err = run(capsys, "run", GCN, "--graph", six(tmp_path, y=np.array([0, 1, 0, 1, 0, 10**9])), "--epochs", "1")
    assert code == 2
    assert "y: label 1000000000 at row 5 makes 1000000001 classes" in err, err


# --- item 8: checkpoints that are not a gnnc run's -----------------------------------------------


def _checkpointed_run(tmp_path: Path, capsys) -> tuple[str, Path]:
    graph = six(tmp_path)
    code, _ = run(capsys, "run", GCN, "--graph", graph, "--epochs", "2", "--checkpoint", str(tmp_path / "ck"),
                  "--checkpoint-every", "1")
    assert code == 0
    return graph, tmp_path / "ck" / "epoch-000001" / "rank-0.ckpt"


class _Payload:
    """Unpickling this runs `touch`: what a forged checkpoint would carry."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def _forge(path: Path, state) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    path.write_bytes(checkpoint.MAGIC + hashlib.sha256(payload).digest() + payload)


def test_a_forged_checkpoint_is_refused_without_running_it(tmp_path: Path, capsys) -> None:
    graph, ckpt = _checkpointed_run(tmp_path, capsys)
    _forge(ckpt, {"epoch": 1, "model": _Payload(tmp_path / "pwned")})
    code, err = run(capsys, "run", GCN, "--graph", graph, "--epochs", "3", "--checkpoint", str(tmp_path / "ck"),
                    "--resume")
    assert code == 2
    assert "refused, a checkpoint is data" in err and "weights_only" not in err, err
    assert not (tmp_path / "pwned").exists()


def test_a_checkpoint_without_a_fingerprint_is_refused(tmp_path: Path, capsys) -> None:
    graph, ckpt = _checkpointed_run(tmp_path, capsys)
    state = checkpoint.load_state(ckpt)
    del state["fingerprint"]
    checkpoint.save_state(ckpt, state)
    code, err = run(capsys, "run", GCN, "--graph", graph, "--epochs", "3", "--checkpoint", str(tmp_path / "ck"),
                    "--resume")
    assert code == 2 and "holds no run fingerprint" in err, err


# --- item 7: `gnnc run PLAN` refuses flags that contradict the plan ------------------------------


@pytest.fixture
def plan2(tmp_path: Path, capsys) -> tuple[Path, str]:
    graph = six(tmp_path)
    code, _ = run(capsys, "compile", GCN, "--graph", graph, "--workers", "2", "--strategy", "depcomm",
                  "--partition", "metis", "-o", str(tmp_path / "plan"))
    assert code == 0
    return tmp_path / "plan", graph


@pytest.mark.parametrize("flags, named", [
    (["--graph", "OTHER"], "--graph"), (["--strategy", "depcache"], "--strategy depcache: the plan runs depcomm"),
    (["--strategy", "depcomm,bcast1d"], "--strategy"), (["--partition", "hash"], "--partition hash"),
    (["--nproc", "1"], "--nproc 1: the plan was compiled for 2 workers"), (["--nproc", "4"], "--nproc 4"),
])
def test_flags_that_contradict_the_plan_are_refused(plan2, tmp_path: Path, capsys, flags, named: str) -> None:
    plan, _ = plan2
    flags = [six(tmp_path, "other.npz", x=np.ones((6, 3), np.float32)) if f == "OTHER" else f for f in flags]
    code, err = run(capsys, "run", str(plan), *flags, "--epochs", "1")
    assert code == 2 and named in err, err


def test_flags_that_agree_with_the_plan_are_accepted(plan2) -> None:
    path, graph = plan2
    check_run_flags(Plan.load(path), graph=graph, strategy="depcomm", partition="metis", nproc=2)
    check_run_flags(Plan.load(path), graph=None, strategy="depcomm,depcomm", partition=None, nproc=None)


def test_an_ir_whose_strategies_were_edited_is_refused(plan2, capsys) -> None:
    plan, _ = plan2
    data = json.loads((plan / "plan.json").read_text())
    data["ir"] = data["ir"].replace("strategy=depcomm", "strategy=bcast1d")
    data["ir_sha256"] = hashlib.sha256(data["ir"].encode()).hexdigest()  # anyone can recompute it
    (plan / "plan.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="layer l0 runs bcast1d .* its shards were cut for depcomm"):
        Plan.load(plan)
    code, err = run(capsys, "run", str(plan), "--epochs", "1")
    assert code == 2 and "the IR was edited after compiling" in err, err


# --- the launcher's own files are data too -------------------------------------------------------


def test_no_source_unpickles_or_loads_with_weights_only_off() -> None:
    pattern = re.compile(r"pickle\.loads?\(|weights_only *= *False")
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("compiler", "passes", "runtime")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_a_worker_result_must_be_plain_data() -> None:
    from gnnc.runtime.launch import _TextOnly, check_plain

    check_plain({"logits": torch.zeros(2), "history": [{"epoch": 0, "loss": 1.5}], 3: (None, "x", True)})
    with pytest.raises(TypeError, match=r"the result\['a'\]\[0\] is a numpy.ndarray"):
        check_plain({"a": [np.zeros(2)]})
    with pytest.raises(pickle.UnpicklingError, match="refused posix.system"):
        _TextOnly(io.BytesIO(pickle.dumps(_Payload(Path("/nonexistent/x"))))).load()
