"""`gnnc convert` at scale (issue 34 item 5): converting is the one read of the source, so it leaves no copy of the
graph in the load cache (at papers100M's size that copy was its whole 57 GB of features again, on the cache's disk)."""
from __future__ import annotations

from conftest import gnnc_in_process
from gnnc.graph.loaders import load_graph
from test_ogb import papers_like


def test_convert_writes_the_store_and_no_cache_entry(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root, _ = papers_like(tmp_path)
    ran = gnnc_in_process("convert", str(root), str(tmp_path / "store"))
    assert ran.returncode == 0, ran.stderr
    assert not list((tmp_path / "xdg").rglob("graph-*.npz"))  # the store is the converted graph; nothing else
    store, source = load_graph(str(tmp_path / "store")), load_graph(str(root), use_cache=False)
    assert store.num_nodes == source.num_nodes and bool((store.y == source.y).all())
