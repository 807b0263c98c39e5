"""Synthetic graphs by spec: R-MAT (skewed, like web and social graphs) and a
contextual stochastic block model (communities whose labels a GNN can learn).

Benchmarks and tests need graphs of any size without downloading anything,
and the same spec must give the same graph on every machine, so both
generators are seeded and fully vectorised (numpy, no Python loop over
edges): `rmat:n=1000000,deg=10,...` (10M edges) builds in seconds.

Both return undirected graphs stored as directed edges in both directions,
without self-loops or duplicate edges; `deg` is the average in-degree (so
about n*deg directed edges). Vertex ids keep R-MAT's skew: low ids are the
hubs, as the recursive model produces them; this is the ordering MG-GCN's
random permutation is meant to undo, so it is kept on purpose. Masks are a
seeded 60/20/20 train/val/test split.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gnnc.errors import GraphInputError
from gnnc.graph import Graph, index_dtype, sorted_unique

# R-MAT quadrant probabilities (a: top-left, b: top-right, c: bottom-left, d = 1-a-b-c).
RMAT_A, RMAT_B, RMAT_C = 0.57, 0.19, 0.19
# How far apart the class means are, in units of the per-feature noise, summed over all
# features: a linear model on x alone gets a fair but imperfect accuracy, and averaging
# over same-class neighbours (what a GNN does on a homophilous graph) sharpens it.
CLASS_SEPARATION = 3.0
# Drawing stops after this many top-up rounds even if duplicates keep the edge count short
# (only on tiny or saturated graphs, where n*deg/2 distinct pairs may not exist).
MAX_ROUNDS = 64


@dataclass(frozen=True)
class Param:
    """One `key=value` of a generator spec: its type, default (None: required) and check."""

    kind: type
    default: Any
    check: Callable[[Any], bool]
    requirement: str


def _positive(v: Any) -> bool:
    return v > 0


def _nonnegative(v: Any) -> bool:
    return v >= 0


RMAT_PARAMS: Mapping[str, Param] = {
    "n": Param(int, None, lambda v: v >= 2, "an integer >= 2"),
    "deg": Param(float, 10.0, _positive, "a positive number"),
    "features": Param(int, 16, _positive, "a positive integer"),
    "classes": Param(int, 4, lambda v: v >= 1, "an integer >= 1"),
    "seed": Param(int, 0, _nonnegative, "a non-negative integer"),
}
SBM_PARAMS: Mapping[str, Param] = {
    "n": Param(int, None, lambda v: v >= 2, "an integer >= 2"),
    "blocks": Param(int, 16, lambda v: v >= 1, "an integer >= 1"),
    "deg": Param(float, 6.0, _positive, "a positive number"),
    "intra": Param(float, 0.9, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
    "features": Param(int, 16, _positive, "a positive integer"),
    "classes": Param(int, 4, lambda v: v >= 1, "an integer >= 1"),
    "seed": Param(int, 0, _nonnegative, "a non-negative integer"),
}
REGRESS_PARAMS: Mapping[str, Param] = {
    "n": Param(int, None, lambda v: v >= 2, "an integer >= 2"),
    "deg": Param(float, 8.0, _positive, "a positive number"),
    "features": Param(int, 16, _positive, "a positive integer"),
    "targets": Param(int, 1, _positive, "a positive integer"),
    "noise": Param(float, 0.1, _nonnegative, "a non-negative number"),
    "seed": Param(int, 0, _nonnegative, "a non-negative integer"),
}
PROTEINS_PARAMS: Mapping[str, Param] = {
    "n": Param(int, None, lambda v: v >= 2, "an integer >= 2"),
    "deg": Param(float, 20.0, _positive, "a positive number"),
    "features": Param(int, 8, _positive, "a positive integer"),
    "tasks": Param(int, 112, _positive, "a positive integer"),
    "edge_features": Param(int, 8, _positive, "a positive integer"),
    "seed": Param(int, 0, _nonnegative, "a non-negative integer"),
}
GENERATORS: Mapping[str, Mapping[str, Param]] = {"rmat": RMAT_PARAMS, "sbm": SBM_PARAMS, "regress": REGRESS_PARAMS,
                                                 "proteins": PROTEINS_PARAMS}
# regress: the weight of the vertex's own features in its target, beside the smooth function of its neighbours'
SELF_WEIGHT = 0.5
# proteins: the spread of a vertex's latent profile against its edges' noise, and of the tasks' label noise
PROTEINS_EDGE_NOISE = 0.5
PROTEINS_LABEL_NOISE = 0.5


def _convert(kind: type, text: str) -> Any:
    """int accepts 1000000, 1_000_000 and 1e6; float any Python float literal."""
    if kind is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            value = float(text)  # 1e6; ValueError propagates for junk
            if not value.is_integer():
                raise ValueError(text) from None
            return int(value)
    return float(text)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`rmat:n=10,deg=3` -> ('rmat', {all parameters, defaults filled in}).

    Unknown keys, repeated keys, values of the wrong type or range and missing
    required keys raise GraphInputError naming the key.
    """
    kind, _, body = spec.partition(":")
    if kind not in GENERATORS:
        raise GraphInputError(f"unknown generator '{kind}' in '{spec}' (known: {', '.join(GENERATORS)})")
    schema = GENERATORS[kind]
    values: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq:
            raise GraphInputError(f"{kind}: '{item}' is not key=value (in '{spec}')")
        if key not in schema:
            raise GraphInputError(f"{kind}: unknown key '{key}' (known: {', '.join(schema)})")
        if key in values:
            raise GraphInputError(f"{kind}: key '{key}' given twice")
        param = schema[key]
        try:
            value = _convert(param.kind, text.strip())
        except ValueError:
            raise GraphInputError(f"{kind}: key '{key}' must be {param.requirement}, got '{text}'") from None
        if not (math.isfinite(value) and param.check(value)):
            raise GraphInputError(f"{kind}: key '{key}' must be {param.requirement}, got '{text}'")
        values[key] = value
    for key, param in schema.items():
        if key not in values:
            if param.default is None:
                raise GraphInputError(f"{kind}: missing key '{key}' ({param.requirement})")
            values[key] = param.default
    return kind, values


def generate(spec: str) -> Graph:
    """The graph a generator spec names (see `parse_spec`)."""
    kind, params = parse_spec(spec)
    g = {"rmat": rmat, "sbm": sbm, "regress": regress, "proteins": proteins}[kind](**params)
    g.name = spec
    return g


def split_masks(n: int, rng: np.random.Generator, fractions: tuple[float, float] = (0.6, 0.2)
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded random train/val/test split: `fractions` of train and val, the rest test."""
    order = rng.permutation(n)
    n_train = int(round(fractions[0] * n))
    n_val = int(round(fractions[1] * n))
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][order[:n_train]] = True
    masks[1][order[n_train:n_train + n_val]] = True
    masks[2][order[n_train + n_val:]] = True
    return masks[0], masks[1], masks[2]


def class_features(y: np.ndarray, features: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """float32 [n, features]: a random mean per class plus unit Gaussian noise."""
    means = rng.standard_normal((classes, features), dtype=np.float32)
    # scale the means so that two class means are about CLASS_SEPARATION noise units apart
    means *= np.float32(CLASS_SEPARATION / math.sqrt(2.0 * features))
    x = rng.standard_normal((len(y), features), dtype=np.float32)
    x += means[y]
    return x


def _distinct_pairs(draw: Callable[[int], tuple[np.ndarray, np.ndarray]], n: int, target: int,
                    rng: np.random.Generator) -> np.ndarray:
    """`target` distinct undirected pairs (keys lo*n+hi, lo < hi) from a pair sampler.

    Duplicates and self-loops are dropped and topped up in rounds (each round
    a vectorised draw of the shortfall); if the rounds overshoot, a random
    subset of the last round's new pairs is dropped so every pair drawn has
    the same chance to stay.
    """
    keys = np.zeros(0, dtype=np.int64)
    for _ in range(MAX_ROUNDS):
        short = target - len(keys)
        if short <= 0:
            break
        a, b = draw(int(short * 1.1) + 16)
        keep = a != b
        a, b = a[keep], b[keep]
        new = sorted_unique(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
        if len(keys):
            pos = np.minimum(np.searchsorted(keys, new), len(keys) - 1)
            new = new[keys[pos] != new]
        if len(new) > short:
            new = np.sort(rng.choice(new, size=short, replace=False))
        keys = np.sort(np.concatenate([keys, new]))
    return keys


def _graph_from_pairs(keys: np.ndarray, n: int, x: np.ndarray, y: np.ndarray, rng: np.random.Generator,
                      name: str, pair_attr: np.ndarray | None = None) -> Graph:
    """Both directions of every pair; edges ordered by destination, then source. `y`: integer classes, or float
    targets kept as they are; `pair_attr`: a feature row per pair, on both of its edges (`edge.attr`)."""
    dt = index_dtype(n)
    lo, hi = (keys // n).astype(dt), (keys % n).astype(dt)
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    order = np.argsort(dst.astype(np.int64) * n + src, kind="stable")
    src, dst = src[order], dst[order]
    train, val, test = split_masks(n, rng)
    edge_data = {} if pair_attr is None else {"attr": torch.from_numpy(np.concatenate([pair_attr, pair_attr])[order])}
    return Graph(n, src, dst, torch.from_numpy(x), torch.from_numpy(y if y.dtype.kind == "f" else y.astype(np.int64)),
                 torch.from_numpy(train), torch.from_numpy(val), torch.from_numpy(test), name=name,
                 edge_data=edge_data)


def _uniform_pairs(n: int, deg: float, rng: np.random.Generator) -> np.ndarray:
    """About n*deg/2 distinct undirected pairs drawn uniformly (an Erdos-Renyi graph of average degree `deg`)."""
    return _distinct_pairs(lambda m: (rng.integers(0, n, size=m), rng.integers(0, n, size=m)), n,
                           _target_pairs(n, deg), rng)


def _neighbour_mean(keys: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Every vertex's mean of its neighbours' rows of `values` ([n, d]; 0 without a neighbour)."""
    lo, hi = keys // n, keys % n
    total = np.zeros((n, values.shape[1]))
    np.add.at(total, lo, values[hi])
    np.add.at(total, hi, values[lo])
    deg = np.bincount(lo, minlength=n) + np.bincount(hi, minlength=n)
    return total / np.maximum(deg, 1)[:, None]


def regress(n: int, deg: float = 8.0, features: int = 16, targets: int = 1, noise: float = 0.1,
            seed: int = 0) -> Graph:
    """Node regression with a known target: uniform random edges, Gaussian features, and per target t
    y[v, t] = sin(a_t(v)) + SELF_WEIGHT * b_t(v) + noise * N(0, 1), with a_t the standardised projection of the
    mean of v's neighbours' features on a fixed random direction and b_t its own features' on another: a
    smooth function of the aggregated neighbourhood that a one-layer linear model cannot fit but a GNN can.
    float32 [n, targets] targets."""
    _check_size(n, deg)
    rng = np.random.default_rng(seed)
    keys = _uniform_pairs(n, deg, rng)
    x = rng.standard_normal((n, features), dtype=np.float32)
    w = rng.standard_normal((2, features, targets))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    a = _neighbour_mean(keys, n, x.astype(np.float64)) @ w[0]
    a /= np.maximum(a.std(axis=0), 1e-12)
    y = np.sin(a) + SELF_WEIGHT * (x @ w[1]) + noise * rng.standard_normal((n, targets))
    return _graph_from_pairs(keys, n, x, y.astype(np.float32), rng,
                             f"regress:n={n},deg={deg:g},features={features},targets={targets},noise={noise:g},"
                             f"seed={seed}")


def proteins(n: int, deg: float = 20.0, features: int = 8, tasks: int = 112, edge_features: int = 8,
             seed: int = 0) -> Graph:
    """A graph like ogbn-proteins: `tasks` binary targets per vertex that the vertex features do not predict
    and its edges' features do. Every vertex has a latent profile (edge_features wide, Gaussian); an edge's
    features are the sigmoid of its ends' profiles' mean plus noise (in (0, 1), as proteins' association
    scores; the same on both directions), the features are noise, and target t is 1 where a fixed random
    direction's projection of the vertex's profile plus noise exceeds the task's threshold (its positive rate
    drawn in [0.05, 0.5]). Averaging a vertex's edge features recovers its profile, so a model that reads them
    (`scatter m = edge.attr; gather a = mean(m)`) predicts the targets; float32 [n, tasks] 0/1 targets."""
    _check_size(n, deg)
    rng = np.random.default_rng(seed)
    keys = _uniform_pairs(n, deg, rng)
    profile = rng.standard_normal((n, edge_features))
    lo, hi = keys // n, keys % n
    mixed = (profile[lo] + profile[hi]) / 2 + PROTEINS_EDGE_NOISE * rng.standard_normal((len(keys), edge_features))
    attr = (1 / (1 + np.exp(-mixed))).astype(np.float32)
    x = rng.standard_normal((n, features), dtype=np.float32)
    w = rng.standard_normal((edge_features, tasks))
    w /= np.linalg.norm(w, axis=0, keepdims=True)
    score = profile @ w + PROTEINS_LABEL_NOISE * rng.standard_normal((n, tasks))
    rate = rng.uniform(0.05, 0.5, size=tasks)
    threshold = np.array([np.quantile(score[:, t], 1 - rate[t]) for t in range(tasks)])
    y = (score > threshold).astype(np.float32)
    return _graph_from_pairs(keys, n, x, y, rng, f"proteins:n={n},deg={deg:g},features={features},tasks={tasks},"
                                                 f"edge_features={edge_features},seed={seed}", pair_attr=attr)


def rmat(n: int, deg: float = 10.0, features: int = 16, classes: int = 4, seed: int = 0) -> Graph:
    """An R-MAT graph (a=0.57, b=0.19, c=0.19) on n vertices with average degree `deg`.

    Each undirected edge picks its endpoints one bit at a time, each bit
    choosing a quadrant of the adjacency matrix with probabilities a, b, c, d;
    pairs landing outside [0, n) (when n is not a power of two) are redrawn.
    Labels are uniform over `classes`, features follow the label.
    """
    _check_size(n, deg)
    rng = np.random.default_rng(seed)
    scale = max(1, math.ceil(math.log2(n)))
    thresholds = np.array([RMAT_A, RMAT_A + RMAT_B, RMAT_A + RMAT_B + RMAT_C], dtype=np.float32)

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        src = np.zeros(m, dtype=np.int64)
        dst = np.zeros(m, dtype=np.int64)
        for _ in range(scale):  # one pass per bit level, vectorised over all m edges
            r = rng.random(m, dtype=np.float32)
            src <<= 1
            dst <<= 1
            src += r >= thresholds[1]  # quadrants c and d: lower half
            dst += (r >= thresholds[0]) & (r < thresholds[1]) | (r >= thresholds[2])  # b and d: right half
        inside = (src < n) & (dst < n)
        return src[inside], dst[inside]

    keys = _distinct_pairs(draw, n, _target_pairs(n, deg), rng)
    y = rng.integers(0, classes, size=n)
    x = class_features(y, features, classes, rng)
    return _graph_from_pairs(keys, n, x, y, rng, f"rmat:n={n},deg={deg:g},features={features},"
                                                 f"classes={classes},seed={seed}")


def sbm(n: int, blocks: int = 16, deg: float = 6.0, intra: float = 0.9, features: int = 16, classes: int = 4,
        seed: int = 0) -> Graph:
    """A contextual stochastic block model.

    Vertices fall into `blocks` near-equal random blocks; a fraction `intra`
    of each vertex's edges (in expectation) stays inside its block, the rest
    go to uniformly chosen vertices of other blocks. The class of a vertex is
    its block modulo `classes` (so classes follow blocks), and its features
    are its class mean plus noise.
    """
    _check_size(n, deg)
    if classes > blocks:
        raise GraphInputError(f"sbm: key 'classes' ({classes}) must not exceed 'blocks' ({blocks}): "
                              f"classes follow blocks")
    if blocks > n:
        raise GraphInputError(f"sbm: key 'blocks' ({blocks}) must not exceed 'n' ({n})")
    # one block: there is no outside to connect to
    p_inside = 1.0 if blocks == 1 else intra
    rng = np.random.default_rng(seed)
    block = rng.permutation(n) % blocks
    members = np.argsort(block, kind="stable")  # vertices grouped by block
    size = np.bincount(block, minlength=blocks)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        u = rng.integers(0, n, size=m)
        bu = block[u]
        inside = rng.random(m) < p_inside
        r = rng.random(m)
        # inside: a uniform member of u's block; outside: a uniform position among the
        # n - size[bu] vertices of other blocks, skipping over u's block in `members`
        k_in = start[bu] + (r * size[bu]).astype(np.int64)
        k_out = (r * (n - size[bu])).astype(np.int64)
        k_out += np.where(k_out >= start[bu], size[bu], 0)
        k = np.where(inside, k_in, np.minimum(k_out, n - 1))
        return u, members[k]

    keys = _distinct_pairs(draw, n, _target_pairs(n, deg), rng)
    y = block % classes
    x = class_features(y, features, classes, rng)
    return _graph_from_pairs(keys, n, x, y, rng, f"sbm:n={n},blocks={blocks},deg={deg:g},intra={intra:g},"
                                                 f"features={features},classes={classes},seed={seed}")


def _check_size(n: int, deg: float) -> None:
    if deg > n - 1:
        raise GraphInputError(f"key 'deg' ({deg:g}) must be below n ({n}): there are only n-1 possible neighbours")


def _target_pairs(n: int, deg: float) -> int:
    """Undirected pairs for an average degree `deg`: each gives two directed edges."""
    return max(1, int(round(n * deg / 2)))
