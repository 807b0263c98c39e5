"""benchmarks/scale.py's compile step (`compile_child`, issue 34's "compile for 8 workers after partitioning"): the
phases it reports and its total CPU, which counts the compile's forked processes (gnnc.parallel) as well as its
own; on a small store, so that the step the full-size must-show runs is itself tested."""
from __future__ import annotations

from conftest import EXAMPLES, random_graph
from test_scale_generator import _scale


def test_compile_child_reports_phases_threads_and_its_childrens_cpu(tmp_path) -> None:
    from gnnc.cli import main
    from gnnc.graph.store import write_store

    scale = _scale()
    write_store(random_graph(n=600, e=6000, f=8, c=4, seed=3), tmp_path / "store")
    assert main(["partition", "--graph", str(tmp_path / "store"), "--parts", "8", "--method", "fennel",
                 "-o", str(tmp_path / "split"), "--no-progress"]) == 0
    out = scale.compile_child({"kind": "compile", "graph": str(tmp_path / "store"),
                               "model": str(EXAMPLES / "sage.gnn"), "split": str(tmp_path / "split"),
                               "out": str(tmp_path / "plan")})
    assert {"load", "statistics", "passes", "save"} <= set(out["phases"])  # structures: in children where forked
    assert out["threads"] >= 1 and out["children_cpu_s"] >= 0.0
    assert out["total_cpu_s"] >= sum(p["cpu_s"] for p in out["phases"].values()) - 1e-6
    assert len(out["strategies"]) == 2 and out["plan_bytes"] > 0
