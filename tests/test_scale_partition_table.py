"""benchmarks/scale.py's products-partition step (issue 34's must-show row: METIS and Fennel into 2/4/8 on the
products-size store): one table with both methods side by side, and a METIS killed at the memory limit named as
such in its cells, not dropped."""
from __future__ import annotations

import argparse

from test_scale_generator import _scale


def _row(step: str, out: dict | None, error: str | None = None) -> dict:
    r = {"step": step, "wall_s": 12.5, "peak_bytes": 3 * 2**30, "tree_bytes": 3 * 2**30,
         "load_before": "1.00 1.00 1.00", "load_after": "1.00 1.00 1.00", "rc": 0 if out else -9}
    if out:
        r["out"] = out
    if error:
        r["error"] = error
    return r


def test_metis_and_fennel_side_by_side_with_an_out_of_memory_row(tmp_path) -> None:
    scale = _scale()
    assert "products-partition" in scale.STEPS
    ok = {"time_s": 10.0, "edge_cut": 1234, "cut_fraction": 0.25, "balance": 1.03}
    rows = [_row("metis 2 (products)", ok), _row("metis 8 (products)", None, "out of memory at 6.0 GiB"),
            _row("fennel 2 (products)", {**ok, "balance": 1.1}), _row("fennel 8 (products)", ok),
            _row("convert products", None)]
    lines = scale.side_by_side(rows, 6.0)
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| parts | METIS s (wall) | METIS peak GiB | METIS edge cut | METIS balance | Fennel")
    assert table[1] == "| 2 | 10.0 (12.5) | 3.00 | 1,234 (25.0%) | 1.030 | 10.0 (12.5) | 3.00 | 1,234 (25.0%) | 1.100 |"
    assert table[2].startswith("| 8 | out of memory at 6.0 GiB | 3.00 (at the kill) |")
    assert table[2].endswith("| 10.0 (12.5) | 3.00 | 1,234 (25.0%) | 1.030 |")
    assert scale.side_by_side([_row("convert products", None)], 6.0) == []


def test_the_section_carries_the_table_and_the_matching(tmp_path) -> None:
    scale = _scale()
    out = tmp_path / "RESULTS.md"
    args = argparse.Namespace(fraction=0.001, products_fraction=0.1, steps="products-partition", limit_gib=6.0,
                              timeout=60.0, work=str(tmp_path / "work"), output=str(out), metis_matching="rm")
    bench = scale.Bench(args)
    bench.rows.append(_row("metis 4 (products)", {"time_s": 1.0, "edge_cut": 5, "cut_fraction": 0.5,
                                                  "balance": 1.0}))
    bench.write()
    text = out.read_text()
    assert "--steps products-partition --metis-matching rm`" in text
    assert "| 4 | 1.0 (12.5) | 3.00 | 5 (50.0%) | 1.000 | not run |" in text


def test_a_symmetric_products_like_graph_holds_every_edge_both_ways(tmp_path) -> None:
    """`--products-symmetric`: ogbn-products' edge list is undirected (61.9M pairs, 123.7M directed edges);
    directed R-MAT edges gave METIS a symmetric graph of ~1.7x the entries the real graph gives it."""
    import numpy as np

    scale = _scale()
    info = scale.generate_ogb(tmp_path / "ogb", 500, 3001, 4, 3, scale.PRODUCTS_SPLIT, symmetric=True)
    data = np.load(tmp_path / "ogb" / "raw" / "data.npz")
    src, dst = data["edge_index"]
    assert info["edges"] == len(src) == int(data["num_edges_list"][0]) == 3000
    pairs = np.stack([src, dst], 1)
    assert np.array_equal(np.sort(pairs.view("i8,i8"), axis=0), np.sort(pairs[:, ::-1].copy().view("i8,i8"), axis=0))
    assert not np.any(src == dst)
