"""P3 section 3.2.2 under push-pull (issue 38 items 1 and 2): each rank holds, differentiates and updates only its
feature slice's rows of W1, which is never all-reduced; GAT's attention scores are synced (summed over the ranks)
before the softmax, so its first layer runs push-pull too.

Predicted and measured all-reduce bytes leave W1 out on 2 and 4 ranks and count GAT's two score syncs; logits and
every gradient (W1's assembled from the ranks' slices) equal one process's; training with Adam, weight decay and
clipping, stopped and resumed from checkpoints, ends on one process's weights, W1 whole in the run's weights (what
--save-model writes).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES
from gnnc import api
from gnnc.ir.dims import eval_dim
from gnnc.passes.analysis.legality import pushpull_blocker, synced_scores
from gnnc.plan.slices import split_weights
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import SEED, hub_graph, reference, rel

W1 = {"gcn": {"l0.linear0.weight"}, "sage": {"l0.linear0.weight", "l0.linear1.weight"}, "gat": {"l0.linear0.weight"}}


def numel(program, names=None) -> int:
    cfg = program.config_dict()
    return sum(int(np.prod([eval_dim(d, cfg) for d in p.value.type.shape])) for p in program.params()
               if names is None or p.value.name in names)


def test_split_weights_are_the_first_layers_partial_products() -> None:
    g = hub_graph()
    for name, want in W1.items():
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        assert split_weights(api.compile(model, g, workers=2, strategy="pushpull,depcomm", partition="hash").program
                             ) == want
        assert split_weights(api.compile(model, g, workers=2, strategy="depcomm", partition="hash").program) == set()
        assert split_weights(api.compile(model, g).program, pushpull=True) == want  # before insert-comm: its sync


def test_gats_scores_are_synced_in_full_graph_steps_only() -> None:
    """Full-graph steps sum GAT's scores over the ranks (insert-comm's sync_scores); sampled minibatches do not, so
    there its first layer still cannot run push-pull, the refusal naming the score."""
    layer = api.compile(api.load_model(EXAMPLES / "gat.gnn"), hub_graph()).program.graph_layers()[0]
    assert pushpull_blocker(layer, sync_scores=True) is None
    assert [e.op for e in synced_scores(layer)] == ["dot", "dot"]
    blocked = pushpull_blocker(layer)
    assert blocked is not None and blocked[0].op == "dot" and "attention" in blocked[1]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_w1_is_never_all_reduced_and_the_step_is_one_processs(world: int, tmp_path) -> None:
    g = hub_graph()
    cases = []
    for name in W1:
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        plan = api.compile(model, g, workers=world, strategy="pushpull,depcomm", partition="hash")
        predicted = plan.meta.predicted_bytes_per_step
        scores = [e for layer in plan.program.layers for e in layer.eqns if e.op == "sync_scores"]
        # GAT: its two scores per vertex and head all-reduced, forward and backward (none elsewhere)
        heads = plan.program.config_dict().get("heads", 1)
        assert sum(e.attr("bytes_fwd") + e.attr("bytes_bwd") for e in scores) == (
            (2 * 2 * 2 * (world - 1) * g.num_nodes * heads * 4) if name == "gat" else 0)
        # the all-reduce of every weight but W1 (W1's share of it is 0), and the scores'
        assert predicted["allreduce"] == 2 * (world - 1) * 4 * (numel(plan.program) - numel(plan.program, W1[name])) \
            + sum(e.attr("bytes_fwd") + e.attr("bytes_bwd") for e in scores)
        job = DistJob(str(plan.program), str(plan.write_shards(tmp_path / name)),
                      TrainConfig(seed=SEED, progress=False, use_kernels=False))
        cases.append((name, api.compile(model, g).program, job, predicted))
    results = pooled_launch(one_step_each, world, [job for _, _, job, _ in cases])[0]
    for (name, single, _, predicted), got in zip(cases, results):
        measured = {op: got["bytes_by_op"].get(op, 0) for op in predicted}
        assert measured == predicted, name
        logits, loss, grads = reference(single, g)
        assert rel(got["logits"], logits) < 1e-5
        assert abs(got["loss"] - loss) <= 1e-5 * abs(loss)
        for k, want in grads.items():  # W1's gradient: every rank's slice, assembled
            assert got["grads"][k].shape == want.shape, k
            assert rel(got["grads"][k], want) < 1e-5, (name, k)


@pytest.mark.slow
def test_training_resumed_under_pushpull_ends_on_one_processs_weights(tmp_path) -> None:
    """Adam's moments and weight decay on the sliced W1, the clipping norm over the ranks' slices, checkpoints of
    the slices and the whole W1 in the run's weights: 2 epochs, stop, resume to 4, as 4 epochs on one process."""
    g = hub_graph()
    model = api.load_model(EXAMPLES / "sage.gnn")
    settings = dict(seed=1, lr=0.05, weight_decay=5e-3, clip=0.05, want_logits=False)
    one = api.run(api.compile(model, g), g, epochs=4, **settings)
    plan = api.compile(model, g, workers=2, strategy="pushpull,depcomm", partition="hash")
    api.run(plan, g, epochs=2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1, **settings)
    resumed = api.run(plan, g, epochs=4, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1, resume=True,
                      **settings)
    assert resumed is not None and resumed.history[-1]["epoch"] == 3
    assert sorted(resumed.weights) == sorted(one.weights)
    for k, want in one.weights.items():
        assert resumed.weights[k].shape == want.shape, k
        assert rel(resumed.weights[k], want) < 1e-5, k
    assert not torch.equal(one.weights["l0.linear0.weight"], api.run(api.compile(model, g), g, epochs=1,
                                                                    **settings).weights["l0.linear0.weight"])
