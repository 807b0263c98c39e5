"""A part with no vertex runs like any other: every strategy, logits and gradients equal to one process.

METIS leaves parts empty on small or disconnected graphs (a 3-vertex graph in 2 parts gave one part
everything), and so can any partitioner when the workers are many; a rank with no row used to crash
in its first reshape. One launch of 4 ranks runs every case: a 5-vertex ring whose METIS split
leaves two middle parts empty, and whose hash split leaves the last part empty (the planner's
statistics then count 4 parts, not 3). More workers than vertices is refused before the run.
"""
from __future__ import annotations

import numpy as np
from _rank_pool import pooled_launch
from conftest import EXAMPLES
from test_distributed_exact import SEED, reference, rel
from gnnc import api, cli
from gnnc.graph.loaders import build_graph
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.train import TrainConfig

WORLD = 4
# METIS: parts 1 and 2 empty; hash: part 3 empty; GAT: heads reshaped on a rank with no row
CASES = [("gcn", s, "metis") for s in ("depcomm", "depcache", "hybrid", "bcast1d", "pushpull,depcomm")] + [
    ("gcn", "hybrid,depcomm", "hash"), ("gat", "depcomm", "metis")]


def ring(n: int = 5):
    src = np.arange(n)
    ei = np.stack([np.concatenate([src, (src + 1) % n]), np.concatenate([(src + 1) % n, src])])
    x = (np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 7) % 1.3
    return build_graph(ei, x, np.arange(n) % 2, None, "ring", "ring")


def test_every_strategy_runs_exactly_with_empty_parts(tmp_path) -> None:
    graph = ring()
    todo = []
    for name, strategy, method in CASES:
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        plan = api.compile(model, graph, workers=WORLD, strategy=strategy, partition=method)
        assert (np.bincount(plan.parts, minlength=WORLD) == 0).any(), (name, strategy, method)
        shards = plan.write_shards(tmp_path / f"{name}-{strategy}-{method}")
        job = DistJob(str(plan.program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False))
        todo.append(((name, strategy, method), api.compile(model, graph).program, job))
    results = pooled_launch(one_step_each, WORLD, [job for _, _, job in todo])[0]
    failures = []
    for (key, single, _), got in zip(todo, results):
        logits, _, grads = reference(single, graph)
        if rel(got["logits"], logits) > 1e-5:
            failures.append(f"{key}: logits differ by {rel(got['logits'], logits):.2e}")
        failures += [f"{key}: gradient of {k} differs by {rel(got['grads'][k], g):.2e}"
                     for k, g in grads.items() if rel(got["grads"][k], g) > 1e-5]
    assert not failures, "\n".join(failures)


def test_more_workers_than_vertices_is_refused_before_the_run(tmp_path, capsys) -> None:
    np.savez(tmp_path / "three.npz", edge_index=np.array([[0, 1, 1, 2], [1, 0, 2, 1]]),
             x=np.ones((3, 2), np.float32), y=np.array([0, 1, 0]))
    code = cli.main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", str(tmp_path / "three.npz"), "--nproc", "4",
                     "--epochs", "1"])
    assert code == 2
    assert "--nproc 4: more workers than the graph's 3 vertices" in capsys.readouterr().err
