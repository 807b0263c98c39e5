"""Compiling after partitioning, and the compile's own per-edge work (issue 34: the products-size compile for 8
workers after partitioning, <= 30 s).

`gnnc partition -o DIR` writes the split (assignment.npy, checksummed in its manifest) beside its shards, and
`gnnc compile --partition-from DIR` reads it instead of partitioning again: the plan is the one `--partition
METHOD` compiles, byte for byte.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import gnnc
from conftest import EXAMPLES, gnnc_in_process


def _shard_digests(plan_dir: Path) -> dict[str, str]:
    manifest = json.loads((plan_dir / "shards" / "manifest.json").read_text())
    return {e["file"]: e["sha256"] for e in manifest["shards"]}


def test_compile_after_partitioning_is_the_plan_of_partitioning_inside(tmp_path: Path) -> None:
    ran = gnnc_in_process("partition", "--graph", "planetoid:cora", "--parts", "4", "--method", "metis", "--seed", "3",
                          "-o", str(tmp_path / "split"), "--no-progress")
    assert ran.returncode == 0, ran.stderr
    model = str(EXAMPLES / "gcn.gnn")
    ran = gnnc_in_process("compile", model, "--graph", "planetoid:cora", "--workers", "4", "--partition-from",
                          str(tmp_path / "split"), "--strategy", "depcache", "-o", str(tmp_path / "after"), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.strip().splitlines()[-1])["partition"]["method"] == "metis"
    graph = gnnc.load_graph("planetoid:cora")
    inside = gnnc.compile(gnnc.load_model(model), graph, workers=4, strategy="depcache", partition="metis", seed=3,
                          graph_spec="planetoid:cora")
    inside.save(tmp_path / "inside")
    after = gnnc.Plan.load(tmp_path / "after")
    assert np.array_equal(after.parts, inside.parts) and after.meta.partition == inside.meta.partition
    assert _shard_digests(tmp_path / "after") == _shard_digests(tmp_path / "inside")


def test_a_split_that_does_not_fit_is_refused_with_exit_2(tmp_path: Path) -> None:
    split = tmp_path / "split"
    assert gnnc_in_process("partition", "--graph", "planetoid:cora", "--parts", "2", "--method", "chunk", "-o",
                           str(split), "--no-progress").returncode == 0
    model = str(EXAMPLES / "gcn.gnn")

    def compile_(*args: str):
        return gnnc_in_process("compile", model, "--partition-from", str(split), *args)

    ran = compile_("--graph", "planetoid:cora", "--workers", "4")
    assert ran.returncode == 2 and "has 2 parts" in ran.stderr and "Traceback" not in ran.stderr
    ran = compile_("--graph", "planetoid:citeseer", "--workers", "2")
    assert ran.returncode == 2 and "2708 vertices" in ran.stderr
    ran = compile_("--graph", "planetoid:cora", "--workers", "2", "--partition", "metis")
    assert ran.returncode == 2 and "not both" in ran.stderr
    data = (split / "assignment.npy").read_bytes()
    (split / "assignment.npy").write_bytes(data[:-8] + np.int64(1).tobytes()[::-1])  # the last vertex's part
    ran = compile_("--graph", "planetoid:cora", "--workers", "2")
    assert ran.returncode == 2 and "altered" in ran.stderr
    ran = compile_("--graph", "planetoid:cora", "--workers", "1")
    assert ran.returncode == 2 and "--workers N > 1" in ran.stderr

