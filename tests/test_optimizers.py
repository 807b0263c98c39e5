"""Optimizers, learning-rate schedules and gradient clipping (issue 41, item 1).

The learning-rate curve of every optimizer and schedule is torch's own (and the closed form it follows); SGD with
momentum and a clipped AdamW on 2 gloo ranks equal one process; a run resumed with a schedule follows the
uninterrupted one; bad values are exit 2 with the flag or the file:line:col.
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.cli import main as gnnc_main
from gnnc.errors import GnncError
from gnnc.runtime import optim
from gnnc.runtime.train import LRSchedule, TrainConfig

EPOCHS, LR = 30, 0.1
# (optimizer, schedule, warmup)
COMBINATIONS = [(opt, sched, warm) for opt in ("sgd", "adam", "adamw")
                for sched in ("none", "step", "cosine", "plateau") for warm in (0, 5)]


def val_accs(n: int) -> list[float]:
    """A validation accuracy that rises, then stalls (plateau's drops happen), then rises again."""
    return [min(k, 8) / 10 if k < 20 else 0.9 + k / 1000 for k in range(n)]


def torch_curve(opt_name: str, sched: str, warmup: int) -> list[float]:
    """The rates torch's own optimizer and schedulers give a toy parameter, epoch by epoch (built here, not by
    gnnc): LinearLR's warm-up chained with StepLR/CosineAnnealingLR by SequentialLR, or handing over to
    ReduceLROnPlateau (mode max, on the validation accuracy)."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt_name]([p], lr=LR)
    S = torch.optim.lr_scheduler
    warm = S.LinearLR(opt, start_factor=1 / (warmup + 1), total_iters=warmup) if warmup else None
    main = {"step": lambda: S.StepLR(opt, step_size=7, gamma=0.5),
            "cosine": lambda: S.CosineAnnealingLR(opt, T_max=EPOCHS - warmup)}.get(sched, lambda: None)()
    plateau = S.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=2) if sched == "plateau" else None
    if warm is not None and main is not None:
        main, warm = S.SequentialLR(opt, [warm, main], milestones=[warmup]), None
    out = []
    for k, acc in enumerate(val_accs(EPOCHS)):
        out.append(opt.param_groups[0]["lr"])
        (p ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
        if main is not None:
            main.step()
        elif warm is not None and k < warmup:
            warm.step()
        elif plateau is not None:
            plateau.step(acc)
    return out


def closed_form(sched: str, warmup: int) -> list[float] | None:
    """The curve on paper, where it has one (plateau's depends on the accuracies)."""
    out = []
    for k in range(EPOCHS):
        if k < warmup:
            out.append(LR * (k + 1) / (warmup + 1))
        elif sched == "none":
            out.append(LR)
        elif sched == "step":
            out.append(LR * 0.5 ** ((k - warmup) // 7))
        elif sched == "cosine":
            out.append(LR * (1 + math.cos(math.pi * (k - warmup) / (EPOCHS - warmup))) / 2)
        else:
            return None
    return out


@pytest.mark.parametrize("opt_name, sched, warmup", COMBINATIONS,
                         ids=[f"{o}-{s}-warmup{w}" for o, s, w in COMBINATIONS])
def test_learning_rate_curve_is_torchs(opt_name: str, sched: str, warmup: int) -> None:
    cfg = TrainConfig(epochs=EPOCHS, lr=LR, optimizer=opt_name, schedule=sched, warmup=warmup, lr_step_size=7,
                      lr_gamma=0.5, lr_patience=2, lr_factor=0.5, progress=False)
    p = torch.nn.Parameter(torch.ones(3))
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt_name]([p], lr=LR)
    schedule = LRSchedule(opt, cfg)
    got = []
    for acc in val_accs(EPOCHS):
        got.append(opt.param_groups[0]["lr"])
        (p ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
        schedule.step(acc)
    assert got == torch_curve(opt_name, sched, warmup)
    paper = closed_form(sched, warmup)
    if paper is not None:
        assert got == pytest.approx(paper, rel=1e-9, abs=1e-15)
    if sched == "plateau":
        assert min(got) < LR  # the stall dropped the rate


def test_a_run_trains_at_the_schedules_rates() -> None:
    """`lr` in each epoch's record is the rate the epoch trained at, the schedule's (gnnc.run end to end)."""
    model = api.load_model(EXAMPLES / "gcn.gnn")
    result = api.run(model, random_graph(seed=3), epochs=12, lr=0.05, optimizer="sgd", momentum=0.9,
                     lr_schedule="cosine", warmup=3)
    assert [r["lr"] for r in result.history] == pytest.approx(
        [0.05 * (k + 1) / 4 if k < 3 else 0.05 * (1 + math.cos(math.pi * (k - 3) / 9)) / 2 for k in range(12)])


def test_default_optimizer_is_adam_at_a_constant_rate() -> None:
    from gnnc.runtime.train import make_optimizer
    from gnnc.runtime.executor import init_params

    program = api.compile(api.load_model(EXAMPLES / "gcnii.gnn"), random_graph()).program
    opt = make_optimizer(program, init_params(program, 0, torch.device("cpu")), TrainConfig())
    assert type(opt) is optim.Adam and not LRSchedule(opt, TrainConfig()).state_dict().keys() - {"steps"}


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_per_group_weight_decay(opt_name: str) -> None:
    """GCNII's graph layers keep their own weight decay under every optimizer."""
    from gnnc.runtime.train import make_optimizer
    from gnnc.runtime.executor import init_params

    program = api.compile(api.load_model(EXAMPLES / "gcnii.gnn"), random_graph()).program
    cfg = TrainConfig(optimizer=opt_name, weight_decay=5e-4, graph_weight_decay=0.01)
    opt = make_optimizer(program, init_params(program, 0, torch.device("cpu")), cfg)
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [5e-4, 0.01]


def two_ranks_and_one(tmp_path, **settings):
    model = api.load_model(EXAMPLES / "gcn.gnn")
    graph = random_graph(n=120, e=600, f=8, c=3, seed=5)
    one = api.run(model, graph, epochs=6, seed=1, **settings)
    two = api.run(model, graph, epochs=6, seed=1, nproc=2, strategy="depcomm", **settings)
    return one, two


@pytest.mark.parametrize("settings", [  # about 10 s each: 2 spawned ranks
    {"optimizer": "sgd", "momentum": 0.9, "lr": 0.5},
    # a norm far under the gradients' (about 1e-1 here): every step clips
    {"optimizer": "adamw", "clip": 1e-3, "lr_schedule": "cosine", "warmup": 2},
    {"optimizer": "sgd", "momentum": 0.9, "lr": 0.5, "clip": 1e-2, "lr_schedule": "plateau", "lr_patience": 0},
], ids=["sgd-momentum", "adamw-clip-cosine-warmup", "sgd-clip-plateau"])
def test_two_ranks_equal_one_process(tmp_path, settings) -> None:
    one, two = two_ranks_and_one(tmp_path, **settings)
    assert two.world_size == 2
    assert torch.allclose(one.logits, two.logits, atol=1e-5, rtol=1e-5), (one.logits - two.logits).abs().max()
    assert [r["lr"] for r in one.history] == pytest.approx([r["lr"] for r in two.history])
    assert [r["loss"] for r in one.history] == pytest.approx([r["loss"] for r in two.history], rel=1e-5)


def test_clipping_changes_the_step() -> None:
    """A clip under the gradient's norm changes the trajectory, one far over it does not."""
    model = api.load_model(EXAMPLES / "gcn.gnn")
    graph = random_graph(n=120, e=600, f=8, c=3, seed=5)
    free = api.run(model, graph, epochs=4, optimizer="sgd", lr=0.5)
    loose = api.run(model, graph, epochs=4, optimizer="sgd", lr=0.5, clip=1e6)
    tight = api.run(model, graph, epochs=4, optimizer="sgd", lr=0.5, clip=1e-3)
    assert torch.equal(free.logits, loose.logits)
    assert not torch.allclose(free.logits, tight.logits)


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("settings", [
    {"optimizer": "sgd", "momentum": 0.9, "lr": 0.3, "lr_schedule": "step", "lr_step_size": 4, "warmup": 2},
    {"optimizer": "adamw", "lr_schedule": "cosine", "warmup": 3, "clip": 0.05},
    {"optimizer": "sgd", "momentum": 0.5, "lr": 0.3, "lr_schedule": "plateau", "lr_patience": 1, "warmup": 2},
], ids=["sgd-step", "adamw-cosine", "sgd-plateau"])
def test_resume_with_a_schedule_follows_the_uninterrupted_run(tmp_path, settings) -> None:
    model = api.load_model(EXAMPLES / "gcn.gnn")
    graph = random_graph(n=120, e=600, f=8, c=3, seed=7)
    full = api.run(model, graph, epochs=12, seed=2, **settings)

    def stop(rec):
        if rec["epoch"] == 7:  # after the save of epoch 5, before the one of epoch 8
            raise Interrupted

    ck = str(tmp_path / "ck")
    with pytest.raises(Interrupted):
        api.run(model, graph, epochs=12, seed=2, checkpoint_dir=ck, checkpoint_every=3, on_epoch=stop, **settings)
    resumed = api.run(model, graph, epochs=12, seed=2, checkpoint_dir=ck, checkpoint_every=3, resume=True,
                      **settings)
    assert [r["epoch"] for r in resumed.history] == list(range(12))
    assert [r["lr"] for r in resumed.history] == [r["lr"] for r in full.history]
    assert [r["loss"] for r in resumed.history] == pytest.approx([r["loss"] for r in full.history], rel=1e-6)
    assert torch.allclose(resumed.logits, full.logits, atol=1e-6)


def test_resume_with_another_optimizer_is_refused(tmp_path) -> None:
    model = api.load_model(EXAMPLES / "gcn.gnn")
    graph = random_graph(seed=7)
    ck = str(tmp_path / "ck")
    api.run(model, graph, epochs=3, checkpoint_dir=ck, checkpoint_every=3, optimizer="sgd", momentum=0.9)
    with pytest.raises(GnncError) as err:
        api.run(model, graph, epochs=6, checkpoint_dir=ck, checkpoint_every=3, resume=True, optimizer="adamw")
    assert err.value.exit_code == 2 and "optimizer" in str(err.value)


MODEL = """layer L(in, out) {{
  apply h = linear(h, out)
}}
model M(features, classes) {{
  h = L(features, classes)(x)
  training({settings})
  loss = cross_entropy(h, y, mask = train)
}}
"""


@pytest.mark.parametrize("settings, expected", [
    ("optimizer = rmsprop", "bad.gnn:6:24: training setting 'optimizer' must be one of sgd, adam, adamw, not "
                            "'rmsprop'"),
    ("schedule = cosin", "bad.gnn:6:23: training setting 'schedule' must be one of none, step, cosine, plateau, not "
                         "'cosin'; did you mean 'cosine'?"),
    ("optimizer = 3", "bad.gnn:6:24: training setting 'optimizer' must be one of sgd, adam, adamw, not an "
                      "expression"),
    ("momentum = 1.5", "bad.gnn:6:23: training setting 'momentum' must be at least 0.0 and below 1.0, not 1.5"),
    ("warmup = 2.5", "bad.gnn:6:21: training setting 'warmup' must be a whole number, not 2.5"),
    ("clip = 0", "bad.gnn:6:19: training setting 'clip' must be above 0.0, not 0.0"),
    ("lr_factor = 1", "bad.gnn:6:24: training setting 'lr_factor' must be above 0.0 and below 1.0, not 1.0"),
])
def test_bad_language_values_name_the_place(settings: str, expected: str) -> None:
    with pytest.raises(GnncError) as err:
        api.load_model_source(MODEL.format(settings=settings), "bad.gnn").program()
    assert f"{err.value.loc}: {err.value.message}" == expected
    assert err.value.exit_code == 2


def test_language_settings_reach_the_run_and_the_ir() -> None:
    from gnnc.ir.text import parse_ir

    source = MODEL.format(settings="optimizer = sgd, momentum = 0.9, schedule = plateau, warmup = 2, clip = 1.0, "
                                   "lr_patience = 3, lr_factor = 0.5, epochs = 10")
    program = api.load_model_source(source, "ok.gnn").program()
    assert dict(program.training) == {"optimizer": "sgd", "momentum": 0.9, "schedule": "plateau", "warmup": 2,
                                      "clip": 1.0, "lr_patience": 3, "lr_factor": 0.5, "epochs": 10}
    assert dict(parse_ir(str(program)).training) == dict(program.training)
    cfg = TrainConfig.resolve(program, schedule="cosine")  # a flag over the model's
    assert (cfg.optimizer, cfg.momentum, cfg.schedule, cfg.warmup, cfg.clip) == ("sgd", 0.9, "cosine", 2, 1.0)


def test_ir_training_line_is_typed() -> None:
    from gnnc.ir.text import IRSyntaxError, parse_ir

    program = api.load_model_source(MODEL.format(settings="optimizer = adamw"), "ok.gnn").program()
    text = str(program)
    assert "optimizer=adamw" in text
    with pytest.raises(IRSyntaxError, match="training setting 'optimizer' must be one of sgd, adam, adamw"):
        parse_ir(text.replace("optimizer=adamw", "optimizer=lbfgs"))
    with pytest.raises(IRSyntaxError, match="training setting 'clip' must be above 0.0"):
        parse_ir(text.replace("optimizer=adamw", "clip=-1.0"))


@pytest.mark.parametrize("flags, expected", [
    (["--optimizer", "rmsprop"], "--optimizer: invalid choice: 'rmsprop'"),
    (["--schedule-lr", "linear"], "--schedule-lr: invalid choice: 'linear'"),
    (["--momentum", "-0.1"], "--momentum"),
    (["--clip-grad", "0"], "--clip-grad: must be above 0"),
    (["--warmup", "1.5"], "--warmup: expected a whole number"),
    (["--lr-gamma", "2"], "--lr-gamma"),
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum or training(momentum=...): only sgd takes a momentum"),
    (["--optimizer", "sgd", "--momentum", "1"], "--momentum or training(momentum=...): must be at least 0.0 and "
                                                "below 1.0, not 1.0"),
    (["--warmup", "5", "--epochs", "5"], "--warmup or training(warmup=...): 5 epochs of warm-up leave none"),
    (["--schedule-lr", "plateau", "--lr-factor", "1"], "--lr-factor or training(lr_factor=...): must be above 0.0 "
                                                       "and below 1.0"),
])
def test_bad_flags_are_exit_2_naming_the_flag(flags, expected, capsys) -> None:
    argv = ["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--no-progress", *flags]
    try:
        code = gnnc_main(argv)
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    assert code == 2
    assert expected in capsys.readouterr().err
