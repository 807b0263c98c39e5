"""benchmarks/scale.py's results section: a run is called quiet only when every step ran quiet. The one-tenth
generate step started at load 1.44 and ended at 7.26 (other agents' work joined it); its section read "a quiet
machine", which judged the start's reading alone."""
from __future__ import annotations

import argparse

from test_scale_generator import _scale


def _section(tmp_path, monkeypatch, loads: list[tuple[str, str]]) -> str:
    scale = _scale()
    monkeypatch.setattr(scale, "loadavg", lambda: loads[0][0])
    out = tmp_path / "RESULTS.md"
    args = argparse.Namespace(fraction=0.001, products_fraction=0.01, steps="generate", limit_gib=1.0,
                              timeout=60.0, work=str(tmp_path / "work"), output=str(out))
    bench = scale.Bench(args)
    for before, after in loads:
        bench.rows.append({"step": "generate papers", "wall_s": 1.0, "peak_bytes": 2**30, "tree_bytes": 2**30,
                           "load_before": before, "load_after": after, "note": "ok"})
    bench.write()
    return out.read_text()


def test_a_run_joined_by_load_is_not_called_quiet(tmp_path, monkeypatch) -> None:
    text = _section(tmp_path, monkeypatch, [("1.44 0.58 0.23", "7.26 6.82 3.70")])
    assert "a quiet machine" not in text
    assert "at most 7.26 at a step's start or end: a loaded, shared machine" in text


def test_a_run_quiet_throughout_is_called_quiet(tmp_path, monkeypatch) -> None:
    text = _section(tmp_path, monkeypatch, [("0.30 0.20 0.10", "0.90 0.50 0.20")])
    assert "at most 0.90 at a step's start or end: a quiet machine" in text
