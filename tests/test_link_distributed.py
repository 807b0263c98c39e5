"""Link prediction on several gloo ranks (issue 37 item 1, distributed): what one process computes, bytes predicted.

examples/link_gae.gnn on Cora, compiled for 2 ranks (the planner's strategies) and for 4 (DepComm: the encoder's
halo exchange beside the pairs'). Each rank scores the pairs whose sources it owns and fetches the remote
destinations' rows (gnnc.runtime.pair_exchange). For two epochs' training sets (the fixed positives, each epoch's
negatives) and the evaluation pairs, from the initial weights: every score, the loss and every parameter gradient
within 1e-5 of one process, and the bytes each exchange moved equal to the plan's prediction (the positives' and the
evaluation pairs' at compile time, each epoch's negatives by replaying that epoch's draw, exact on the CPU); then a
two-epoch run's losses and AUCs equal to one process's. One launch per world size.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, gnnc_in_process
from gnnc import api
from gnnc.errors import GnncError
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.link_task import LinkWorker, fit_link
from gnnc.runtime.pair_exchange import EVAL_LABEL, NEGATIVES_LABEL, TRAIN_LABEL, LinkJob, link_steps, link_worker
from gnnc.runtime.train import TrainConfig

SEED = 3
EPOCHS = [0, 1]
PAIR_LABELS = (TRAIN_LABEL, NEGATIVES_LABEL, EVAL_LABEL)


def _steps_and_run(cfg: DistConfig, job: LinkJob) -> tuple[Any, Any]:
    steps = link_steps(cfg, job, EPOCHS)
    result = link_worker(cfg, job)
    return steps, None if result is None else [(h["loss"], h["val_auc"], h["test_auc"], h["test_mrr"],
                                                h["bytes_sent"], h["eval_bytes_sent"]) for h in result.history]


@pytest.fixture(scope="module")
def cora():
    return api.load_graph("planetoid:cora")


@pytest.fixture(scope="module")
def model():
    return api.load_model(EXAMPLES / "link_gae.gnn")


@pytest.fixture(scope="module")
def one_process(model, cora):
    """One process's steps (as link_steps computes them) and its two-epoch run."""
    program = api.compile(model, cora, seed=SEED).program
    cfg = TrainConfig.resolve(program, epochs=len(EPOCHS), seed=SEED)
    w = LinkWorker(program, cora, cfg)
    params = w.initial_params(SEED)
    steps = []
    for epoch in EPOCHS:
        neg = w.negatives(epoch)
        pairs = torch.cat([w.train_pos, neg], 1)
        labels = torch.cat([torch.ones(w.train_pos.shape[1]), torch.zeros(neg.shape[1])])
        for p in params.values():
            p.grad = None
        scores, loss = w.forward(params, True, epoch, pairs, labels)
        loss.backward()
        with torch.no_grad():
            eval_scores, _ = w.forward(params, False, epoch, w.eval_pairs, w.eval_labels)
        steps.append({"scores": scores.detach().reshape(-1), "loss": float(loss.detach()), "eval_scores": eval_scores.reshape(-1),
                      "grads": {k: p.grad.detach().clone() for k, p in params.items()}})
    run = fit_link(LinkWorker(program, cora, cfg), cfg)
    return steps, [(h["loss"], h["val_auc"], h["test_auc"], h["test_mrr"]) for h in run.history]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


@pytest.mark.parametrize("world, strategy", [(2, None), (4, "depcomm")])
def test_link_prediction_on_ranks_is_one_process(world: int, strategy: str | None, model, cora, one_process,
                                                 tmp_path) -> None:
    plan = api.compile(model, cora, workers=world, strategy=strategy, seed=SEED)
    predicted, predicted_eval = plan.meta.predicted_bytes_per_step, plan.meta.predicted_eval_bytes_per_epoch
    assert predicted["pairs"] > 0 and predicted_eval["pairs"] > 0
    plan.write_shards(tmp_path)
    cfg = TrainConfig.resolve(plan.program, epochs=len(EPOCHS), seed=SEED)
    split = api._link_split(plan, cora, SEED)
    # a generous bound on the rendezvous and every collective: four ranks starting on a loaded machine are slow
    steps, history = pooled_launch(_steps_and_run, world, LinkJob(str(plan.program), str(tmp_path), cfg, split=split),
                                   timeout_s=180)[0]
    ref_steps, ref_history = one_process
    failures = []
    for epoch, got, ref in zip(EPOCHS, steps, ref_steps):
        for key in ("scores", "eval_scores"):
            if rel(got[key], ref[key]) > 1e-5:
                failures.append(f"epoch {epoch}: {key} differ by {rel(got[key], ref[key]):.2e}")
        if abs(got["loss"] - ref["loss"]) > 1e-5 * abs(ref["loss"]):
            failures.append(f"epoch {epoch}: loss {got['loss']} vs {ref['loss']}")
        for k, g in ref["grads"].items():
            if rel(got["grads"][k], g) > 1e-5:
                failures.append(f"epoch {epoch}: gradient of {k} differs by {rel(got['grads'][k], g):.2e}")
        # bytes: the pairs' exchanges as predicted, and every other exchange as the encoder's plan predicts it
        step, evaluation = got["bytes"], got["eval_bytes"]

        def measured(counts: dict[str, int], label: str) -> int:
            return sum(n for key, n in counts.items() if key.split("/")[0] == label)

        def by_op(counts: dict[str, int], op: str) -> int:
            return sum(n for key, n in counts.items() if key.split("/")[1] == op and key.split("/")[0] not in PAIR_LABELS)

        negatives = api.predict_negative_bytes(plan, cora, epoch)
        print(f"world {world}, epoch {epoch}: pairs {measured(step, TRAIN_LABEL)} (predicted {predicted['pairs']}), "
              f"negatives {measured(step, NEGATIVES_LABEL)} ({negatives}), evaluation pairs "
              f"{measured(evaluation, EVAL_LABEL)} ({predicted_eval['pairs']}), encoder halo {by_op(step, 'halo')} "
              f"({predicted['halo']})")
        assert negatives > 0
        wanted = {"pairs": predicted["pairs"], "negatives": negatives, "halo": predicted["halo"],
                  "allreduce": predicted["allreduce"], "eval pairs": predicted_eval["pairs"],
                  "eval halo": predicted_eval["halo"]}
        got_bytes = {"pairs": measured(step, TRAIN_LABEL), "negatives": measured(step, NEGATIVES_LABEL),
                     "halo": by_op(step, "halo"), "allreduce": by_op(step, "allreduce"),
                     "eval pairs": measured(evaluation, EVAL_LABEL), "eval halo": by_op(evaluation, "halo")}
        if got_bytes != wanted:
            failures.append(f"epoch {epoch}: measured bytes {got_bytes} != predicted {wanted}")
    assert not failures, "\n".join(failures)
    assert len(history) == len(ref_history)
    for epoch, ((loss, *aucs, sent, eval_sent), (ref_loss, *ref_aucs)) in enumerate(zip(history, ref_history)):
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        assert aucs == pytest.approx(ref_aucs, abs=1e-6)  # one pair ranked otherwise moves an AUC by > 3e-6
        # the run's own count (gnnc run --json's bytes_sent_per_epoch): every exchange of the step, as predicted
        assert sent == sum(predicted.values()) + api.predict_negative_bytes(plan, cora, epoch)
        assert eval_sent == sum(predicted_eval.values())


def test_a_plan_compiled_for_another_seed_is_refused(model, cora) -> None:
    """The encoder's graph is the seed's split's message-passing graph: another seed's run would leak edges."""
    plan = api.compile(model, cora, workers=2, seed=SEED)
    with pytest.raises(GnncError, match="compiled on the edge split of seed 3"):
        api.run(plan, cora, epochs=1, seed=SEED + 1)


def test_what_is_still_refused() -> None:
    ran = gnnc_in_process("run", str(EXAMPLES / "link_gae.gnn"), "--graph", "planetoid:cora", "--epochs", "1",
                          "--nproc", "2", "--fanout", "5,5", "--batch-size", "64")
    assert ran.returncode == 2 and "without --fanout" in ran.stderr, ran.stderr
    ran = gnnc_in_process("run", str(EXAMPLES / "link_gae.gnn"), "--graph", "planetoid:cora", "--epochs", "1",
                          "--nproc", "2", "--strategy", "pushpull,depcomm")
    assert ran.returncode == 2 and "push-pull" in ran.stderr, ran.stderr
