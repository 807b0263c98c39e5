"""A papers100M-style graph as issue 34's must-show trains it: an OGB directory with most labels NaN, converted to
the graph store, trained on sampled minibatches from the store on 2 processes (each rank mapping its shard), its
unlabelled vertices in no mask, never in the loss or a metric."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import EXAMPLES, gnnc_in_process
from gnnc.graph.loaders import load_graph
from gnnc.graph.storage import UNLABELLED
from test_ogb import papers_like


@pytest.mark.slow  # two rank processes, each importing torch: about a minute on the shared 2 cores
def test_nan_labelled_store_trains_sampled_on_two_processes(tmp_path, monkeypatch) -> None:
    """The evaluation of a sampled run on ranks runs every owned vertex through the program, the loss included:
    the unlabelled ones were in its train mask (all True) and cross_entropy raised 'Target -1 is out of bounds'
    (exit 1) at the end of the first epoch."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root, a = papers_like(tmp_path)
    store = tmp_path / "store"
    assert gnnc_in_process("convert", str(root), str(store)).returncode == 0
    g = load_graph(str(store))
    unlabelled = np.isnan(a["y"])
    assert unlabelled.sum() > 0 and (g.y.numpy()[unlabelled] == UNLABELLED).all()
    assert not ((g.train_mask | g.val_mask | g.test_mask).numpy() & unlabelled).any()
    for nproc in ("2",):
        ran = gnnc_in_process("run", str(EXAMPLES / "sage.gnn"), "--graph", str(store), "--fanout", "5,5",
                              "--batch-size", "8", "--epochs", "2", "--nproc", nproc, "--partition", "fennel",
                              "--json", "--no-progress")
        assert ran.returncode == 0, ran.stderr[-2000:]
        summary = json.loads(ran.stdout.strip().splitlines()[-1])
        assert np.isfinite(summary["train_loss"]) and 0.0 <= summary["test_acc"] <= 1.0
