"""gnnc.runtime.optim: torch.optim's SGD, Adam and AdamW without the torch._dynamo import their wrappers make on
first use (1.4-1.7 CPU-s in every training process). Their updates and state_dicts are torch.optim's, bit for bit,
either way across a checkpoint; a training process never imports torch._dynamo."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from gnnc.runtime import optim

# what `--optimizer` offers, with the settings make_optimizer passes on (per-group weight decay, SGD's momentum)
KINDS = {
    "sgd": lambda cls, groups, lr: cls(groups, lr=lr, momentum=0.0),
    "sgd-momentum": lambda cls, groups, lr: cls(groups, lr=lr, momentum=0.9),
    "adam": lambda cls, groups, lr: cls(groups, lr=lr),
    "adamw": lambda cls, groups, lr: cls(groups, lr=lr),
}
CLASSES = {"sgd": "SGD", "sgd-momentum": "SGD", "adam": "Adam", "adamw": "AdamW"}


def generated_params(seed: int) -> list[dict]:
    """1-2 parameter groups of 1-4 parameters each, of random shapes (a scalar among them) and weight decays."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(int(torch.randint(1, 3, (), generator=g))):
        shapes = [tuple(int(d) for d in torch.randint(1, 6, (int(torch.randint(0, 3, (), generator=g)),),
                                                      generator=g))
                  for _ in range(int(torch.randint(1, 5, (), generator=g)))]
        groups.append({"params": [torch.randn(s, generator=g, dtype=torch.float32) for s in shapes],
                       "weight_decay": [0.0, 5e-4, 0.01][int(torch.randint(0, 3, (), generator=g))]})
    return groups


def copies(groups: list[dict]) -> list[dict]:
    return [{**grp, "params": [torch.nn.Parameter(p.clone()) for p in grp["params"]]} for grp in groups]


def train(opt: torch.optim.Optimizer, seed: int, steps: int) -> None:
    """`steps` steps of random gradients (some parameters without one, as a step where nothing reached them),
    the learning rate stepped by a StepLR as a schedule would."""
    g = torch.Generator().manual_seed(seed + 1000)
    params = [p for grp in opt.param_groups for p in grp["params"]]
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        for p in params:
            grad = torch.randn(p.shape, generator=g)
            if float(torch.rand((), generator=g)) > 0.2:
                (p * grad).sum().backward()
        opt.step()
        schedule.step()


def assert_same_state(ours: dict, theirs: dict) -> None:
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for k, per in ours["state"].items():
        assert per.keys() == theirs["state"][k].keys()
        for key, value in per.items():
            assert torch.equal(value, theirs["state"][k][key]), (k, key)


@pytest.mark.parametrize("kind", KINDS)
def test_every_optimizer_steps_and_saves_as_torch_optims(kind: str) -> None:
    """On generated parameter sets: the same parameters bit for bit after a few steps, the same state_dict, and
    each continues bit for bit from the other's state_dict (checkpoints written before this module resume)."""
    for seed in range(12):
        groups, lr = generated_params(seed), [0.1, 0.01, 0.003][seed % 3]
        ours_p, theirs_p = copies(groups), copies(groups)
        ours = KINDS[kind](getattr(optim, CLASSES[kind]), ours_p, lr)
        theirs = KINDS[kind](getattr(torch.optim, CLASSES[kind]), theirs_p, lr)
        assert isinstance(ours, type(theirs)) and type(ours).__name__ == type(theirs).__name__
        train(ours, seed, 5)
        train(theirs, seed, 5)
        for a, b in zip((p for grp in ours_p for p in grp["params"]), (p for grp in theirs_p for p in grp["params"])):
            assert torch.equal(a, b) and a.grad_fn is None, (kind, seed)
        assert_same_state(ours.state_dict(), theirs.state_dict())
        # across: each loads the other's state and steps on; both stay equal
        swapped_ours, swapped_theirs = copies(ours_p), copies(theirs_p)
        resumed_ours = KINDS[kind](getattr(optim, CLASSES[kind]), swapped_ours, lr)
        resumed_theirs = KINDS[kind](getattr(torch.optim, CLASSES[kind]), swapped_theirs, lr)
        resumed_ours.load_state_dict(theirs.state_dict())
        resumed_theirs.load_state_dict(ours.state_dict())
        train(resumed_ours, seed + 1, 3)
        train(resumed_theirs, seed + 1, 3)
        for a, b in zip((p for grp in swapped_ours for p in grp["params"]),
                        (p for grp in swapped_theirs for p in grp["params"])):
            assert torch.equal(a, b), (kind, seed)
        assert_same_state(resumed_ours.state_dict(), resumed_theirs.state_dict())


def test_a_training_process_imports_no_torch_dynamo(tmp_path) -> None:
    """One fresh process trains GCN on Cora with each optimizer, a schedule, clipping, a checkpoint and a resume
    (every optimizer method a run calls), then shows what it imported."""
    script = textwrap.dedent(f"""
        import sys
        from gnnc.cli import main
        ckpt = {str(tmp_path / "ckpt")!r}
        common = ["run", "examples/gcn.gnn", "--graph", "planetoid:cora", "--no-progress"]
        saved = ["--checkpoint", ckpt, "--checkpoint-every", "1", "--schedule-lr", "cosine", "--clip-grad", "1"]
        runs = [["--epochs", "1", *saved], ["--epochs", "2", *saved, "--resume"],
                ["--epochs", "1", "--optimizer", "sgd", "--momentum", "0.9"],
                ["--epochs", "1", "--optimizer", "adamw"]]
        for extra in runs:
            code = main(common + extra)
            if code:
                sys.exit(code)
        print("torch._dynamo" in sys.modules, "gnnc.runtime.optim" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["False", "True"], "a training process imported torch._dynamo"
