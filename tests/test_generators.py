"""rmat: and sbm: generators: spec parsing, determinism, structure, learnable features, speed."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gnnc.errors import GraphInputError
from gnnc.graph.generators import generate, parse_spec, rmat, sbm


def test_spec_defaults_and_conversions() -> None:
    kind, p = parse_spec("rmat:n=1e3,deg=4,seed=7")
    assert kind == "rmat"
    assert p == {"n": 1000, "deg": 4.0, "features": 16, "classes": 4, "seed": 7}
    assert parse_spec("sbm:n=1_000")[1]["intra"] == 0.9


@pytest.mark.parametrize("spec, message", [
    ("rmat:n=100,colour=3", "unknown key 'colour'"),
    ("rmat:n=abc", "key 'n' must be an integer >= 2, got 'abc'"),
    ("rmat:n=100.5", "key 'n' must be an integer"),
    ("rmat:deg=3", "missing key 'n'"),
    ("rmat:n=100,n=200", "key 'n' given twice"),
    ("rmat:n=100,deg", "'deg' is not key=value"),
    ("rmat:n=100,deg=-1", "key 'deg' must be a positive number"),
    ("rmat:n=100,deg=nan", "key 'deg' must be a positive number"),
    ("sbm:n=100,intra=1.5", "key 'intra' must be a number in [0, 1]"),
    ("sbm:n=100,blocks=2,classes=4", "key 'classes' (4) must not exceed 'blocks'"),
    ("rmat:n=10,deg=20", "key 'deg'"),
    ("erdos:n=10", "unknown generator 'erdos'"),
])
def test_bad_specs_name_the_key(spec: str, message: str) -> None:
    with pytest.raises(GraphInputError) as err:
        generate(spec)
    assert message in str(err.value)


def _simple_undirected(g) -> None:
    src, dst = g.src.astype(np.int64), g.dst.astype(np.int64)
    assert not np.any(src == dst), "self-loop"
    keys = src * g.num_nodes + dst
    assert len(np.unique(keys)) == len(keys), "duplicate edge"
    assert set(keys.tolist()) == set((dst * g.num_nodes + src).tolist()), "not symmetric"


def test_rmat_structure_determinism_and_split() -> None:
    g = rmat(3000, deg=6, features=8, classes=3, seed=1)
    _simple_undirected(g)
    assert g.num_edges == 3000 * 6  # duplicates topped up to the exact count
    assert g.src.dtype == np.int32 and g.x.dtype == torch.float32 and g.x.shape == (3000, 8)
    assert int(g.y.max()) < 3
    again = rmat(3000, deg=6, features=8, classes=3, seed=1)
    assert np.array_equal(g.src, again.src) and np.array_equal(g.dst, again.dst) and torch.equal(g.x, again.x)
    other = rmat(3000, deg=6, features=8, classes=3, seed=2)
    assert not np.array_equal(g.src, other.src)
    masks = torch.stack([g.train_mask, g.val_mask, g.test_mask]).int()
    assert torch.all(masks.sum(0) == 1)  # every vertex in exactly one split
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [1800, 600, 600]
    # the recursive model's skew: the lowest ids are the hubs
    deg = np.bincount(g.dst, minlength=g.num_nodes)
    assert deg[:30].mean() > 5 * deg.mean()


def test_rmat_non_power_of_two_stays_in_range() -> None:
    g = rmat(1000, deg=4, seed=3)  # 2^10 = 1024 > 1000: pairs beyond are redrawn
    assert int(max(g.src.max(), g.dst.max())) < 1000


def test_sbm_intra_fraction_and_learnable_features() -> None:
    g = sbm(4000, blocks=8, deg=10, intra=0.8, features=32, classes=8, seed=0)
    _simple_undirected(g)
    y = g.y.numpy()
    same = np.mean(y[g.src] == y[g.dst])  # classes == blocks here, so same class = same block
    assert abs(same - 0.8) < 0.02
    # nearest class mean on x alone is far above chance, and averaging over the in-neighbours
    # (one mean-aggregation layer) is better still: a GNN has something to learn
    x = g.x.numpy()

    def accuracy(feats: np.ndarray) -> float:
        train = g.train_mask.numpy()
        means = np.stack([feats[train & (y == c)].mean(0) for c in range(8)])
        pred = np.argmin(((feats[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
        test = g.test_mask.numpy()
        return float(np.mean(pred[test] == y[test]))

    deg = np.bincount(g.dst, minlength=g.num_nodes)[:, None]
    agg = np.zeros_like(x)
    np.add.at(agg, g.dst, x[g.src])
    agg = (agg + x) / (deg + 1)
    plain, smoothed = accuracy(x), accuracy(agg)
    assert plain > 0.3  # chance is 1/8
    assert smoothed > plain + 0.1


def test_sbm_classes_follow_blocks() -> None:
    g = sbm(2000, blocks=6, deg=5, intra=1.0, features=4, classes=3, seed=4)
    y = g.y.numpy()
    assert np.all(y[g.src] == y[g.dst])  # intra=1: every edge inside a block, so inside a class
    assert set(np.unique(y).tolist()) == {0, 1, 2}


def test_generate_names_the_graph_by_its_spec() -> None:
    spec = "sbm:n=300,blocks=3,deg=4,intra=0.7,features=5,classes=3,seed=2"
    g = generate(spec)
    assert g.name == spec and g.num_nodes == 300 and g.num_features == 5


@pytest.mark.slow
def test_ten_million_edges_under_30_seconds() -> None:
    for spec in ("rmat:n=1000000,deg=10,features=16,classes=4,seed=0",
                 "sbm:n=1000000,blocks=64,deg=10,intra=0.9,features=16,classes=16,seed=0"):
        start = time.perf_counter()
        g = generate(spec)
        elapsed = time.perf_counter() - start
        assert g.num_edges == 10_000_000
        assert elapsed < 30, f"{spec}: {elapsed:.1f} s"
