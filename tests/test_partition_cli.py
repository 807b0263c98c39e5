"""`gnnc partition`: shards written, the estimate printed first, the JSON summary last, exit 2 on bad input."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from gnnc import cli, partition_cli
from gnnc.passes.partition.stats import compute_stats
from gnnc.passes.partition.core import partition_graph
from gnnc.graph.loaders import load_graph
from gnnc.plan.shard_files import assemble, verify_shards

SPEC = "sbm:n=600,blocks=4,deg=5,intra=0.9,features=6,classes=4,seed=1"


@pytest.mark.parametrize("method", ["hash", "chunk", "metis", "g3", "random"])
def test_json_summary_matches_the_statistics(method, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the generator cache goes to ./.gnnc-cache
    out = tmp_path / "shards"
    code = cli.main(["partition", "--graph", SPEC, "--parts", "3", "--method", method, "-o", str(out), "--json",
                     "--no-progress"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "estimated peak memory" in lines[0]
    summary = json.loads(lines[-1])
    for key in ("method", "parts", "time_s", "edge_cut", "vertices", "edges", "remote", "peak_rss_bytes"):
        assert key in summary, key
    graph = load_graph(SPEC)
    expected = compute_stats(graph, partition_graph(graph, 3, method), layers=2)
    assert summary["method"] == method and summary["parts"] == 3
    assert summary["remote"] == expected.remote.tolist() and summary["edge_cut"] == expected.edge_cut
    assert summary["vertices"] == expected.vertices.tolist() and summary["edges"] == expected.edges.tolist()
    assert summary["peak_rss_bytes"] > 0
    verify_shards(out)
    rebuilt = assemble(out)
    assert np.array_equal(rebuilt.src, graph.src) and np.array_equal(rebuilt.dst, graph.dst)


def test_method_options_reach_the_partitioner(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = "rmat:n=3000,deg=6,features=4,classes=2,seed=0"
    code = cli.main(["partition", "--graph", spec, "--parts", "4", "--method", "g3", "--option", "start=hubs",
                     "--option", "core_parts=2", "--option", "sum_factor=1.5", "-o", str(tmp_path / "o"),
                     "--json", "--stats", "--no-progress"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["options"] == {"start": "hubs", "core_parts": 2, "sum_factor": 1.5}
    stats = summary["partition_stats"]
    assert stats["start"] == "hubs" and stats["sum_factor"] == 1.5 and stats["start_stats"]["core_parts"] == 2
    graph = load_graph(spec)
    expected = partition_graph(graph, 4, "g3", start="hubs", sum_factor=1.5)
    assert summary["remote"] == compute_stats(graph, expected, layers=2).remote.tolist()


def test_stats_table_through_run(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    partition_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["partition", "--graph", "planetoid:cora", "--parts", "2", "--method", "metis",
                              "-o", str(tmp_path / "o"), "--stats", "--no-progress", "--layers", "3"])
    assert partition_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "hop3 V" in out and "replication" in out and "sum |B_i|" in out


@pytest.mark.parametrize("argv, message", [
    (["--graph", "planetoid:cora", "--parts", "0", "--method", "hash"], "--parts must be a positive integer"),
    (["--graph", "planetoid:cora", "--parts", "3000", "--method", "hash"], "parts (3000) exceeds"),
    (["--graph", "no-such-graph.npz", "--parts", "2", "--method", "hash"], "no such file"),
    (["--graph", "rmat:n=100,deg=3,speed=2", "--parts", "2", "--method", "hash"], "unknown key 'speed'"),
    (["--graph", "planetoid:cora", "--parts", "2", "--method", "g3", "--option", "start"], "--option must be KEY=VALUE"),
    (["--graph", "planetoid:cora", "--parts", "2", "--method", "hash", "--option", "start=hubs"],
     "unknown option 'start' for partitioning method 'hash'"),
    (["--graph", "planetoid:cora", "--parts", "2", "--method", "g3", "--option", "start=wheel"],
     "g3: start must be one of"),
    # seed twice to the partitioner was a TypeError traceback
    (["--graph", "planetoid:cora", "--parts", "2", "--method", "metis", "--option", "seed=1"],
     "--option seed=1: the seed is given by --seed"),
])
def test_bad_input_exits_2(argv, message, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = cli.main(["partition", *argv, "-o", str(tmp_path / "o"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
