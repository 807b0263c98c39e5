"""benchmarks/scale.py's streaming generator: the papers100M-like OGB directory it writes in blocks is one gnnc
loads with every count right (vertices, edges, features, classes), its unlabelled vertices NaN and in no mask,
written in blocks that divide neither count, and seeded: the same files on every run."""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from conftest import ROOT
from gnnc.graph.loaders import load_graph
from gnnc.graph.storage import UNLABELLED


def _scale():
    if str(ROOT / "benchmarks") not in sys.path:  # scale.py imports its neighbour products.py
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_papers_like_directory_loads_with_its_sizes_and_unlabelled_vertices(tmp_path, monkeypatch) -> None:
    scale = _scale()
    n, e, f, c = 3000, 40_000, 8, 5
    monkeypatch.setattr(scale, "BLOCK", 777)  # blocks that divide neither count
    info = scale.generate_ogb(tmp_path / "a", n, e, f, c, scale.PAPERS_SPLIT)
    now = time.time()
    with monkeypatch.context() as later:
        later.setattr(time, "time", lambda: now + 86_400)  # written a day later: no clock in the bytes
        scale.generate_ogb(tmp_path / "b", n, e, f, c, scale.PAPERS_SPLIT)
    for name in ("raw/data.npz", "raw/node-label.npz", "split/time/train.csv.gz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    g = load_graph(str(tmp_path / "a"), use_cache=False)
    assert (g.num_nodes, g.num_edges, g.x.shape[1]) == (n, e, f) and g.num_classes <= c
    assert bool((g.src != g.dst).all())  # R-MAT's self-loops drawn again
    y = g.y.numpy()
    labelled = y != UNLABELLED
    masks = (g.train_mask | g.val_mask | g.test_mask).numpy()
    assert np.array_equal(masks, labelled) and 0 < labelled.mean() < 0.05
    assert info["train"] == int(g.train_mask.sum()) and abs(info["train"] / n - scale.PAPERS_SPLIT[0]) < 0.006
    hub = np.bincount(g.dst, minlength=n)
    assert hub[: n // 16].sum() > hub[-n // 16:].sum() * 4  # R-MAT's skew: the low ids are the hubs
