"""Plans, logits and predicted bytes stay byte-identical across refactors.

`tests/reference/` holds what the compiler produced for every example on
Cora before the architecture refactor (issue 14): each plan's `plan.json`
(IR, per-layer strategies, the planner's predictions and predicted bytes,
and the checksums of every rank's shard) and the logits after two epochs of
training in one process. A change that alters any of them fails here; an
intended change regenerates them with `GNNC_UPDATE_REFERENCE=1` and says so
in its commit.

The logits are computed with one intra-op thread: float sums in a different
order would differ in the last bit, and this test compares bytes. For the same
reason a run without gnnc's compiled CPU kernels has its own GAT logits
(`reference_logits`), and bytes are compared only on the kind of CPU the logits
were made on (`logits-machine.json`: torch's vector ISA and the CPU's vector
flags, which both torch's kernels and gnnc's `-march=native` build follow; an
AVX-512 Xeon and an AVX2 EPYC differ by up to 1.2e-6 in GIN's logits). On
another kind the logits are held to the exactness bar, 1e-5 relative.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, ROOT

import gnnc
from gnnc.runtime.kernels import native

REFERENCE = ROOT / "tests" / "reference"
UPDATE = bool(os.environ.get("GNNC_UPDATE_REFERENCE"))
EXAMPLE_NAMES = ["gcn", "sage", "gin", "gat", "gcnii"]
# (example, workers, strategy or None for the planner's choice, overrides)
PLANS = [(name, 1, None, {}) for name in EXAMPLE_NAMES] + [
    (name, 4, strategy, {"layers": 4} if name == "gcnii" else {})
    for name in EXAMPLE_NAMES
    for strategy in (None, "depcomm", "depcache", "hybrid", "bcast1d")
] + [
    ("gcn", 4, "pushpull,depcomm", {}),
    ("sage", 2, "pushpull,bcast1d", {}),
    ("gcn", 4, "depcomm,depcache", {}),
    ("gat", 2, "bcast1d,hybrid", {}),
]


def _case_id(case) -> str:
    name, workers, strategy, overrides = case
    sets = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    return f"{name}-w{workers}-{(strategy or 'planner').replace(',', '+')}{sets}"


@pytest.fixture(scope="module")
def cora():
    return gnnc.load_graph("planetoid:cora")


def _model(name: str, overrides: dict):
    # a path relative to the repository, so the plan's `source` line is the same on every machine
    return gnnc.load_model_source((EXAMPLES / f"{name}.gnn").read_text(), f"examples/{name}.gnn", **overrides)


@pytest.mark.parametrize("case", PLANS, ids=_case_id)
def test_plan_is_unchanged(case, cora, tmp_path: Path) -> None:
    name, workers, strategy, overrides = case
    plan = gnnc.compile(_model(name, overrides), cora, workers=workers, strategy=strategy,
                        graph_spec="planetoid:cora", cluster="neutronstar-ecs" if workers > 1 else None)
    plan.save(tmp_path / "plan")
    # compared as data: plan.json is written compact (json's fast encoder), the references indented so that a
    # regenerated one reads as a diff
    got = json.loads((tmp_path / "plan" / "plan.json").read_text())
    path = REFERENCE / f"{_case_id(case)}.plan.json"
    if UPDATE:
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(path.read_text())
    got, want = _one_schedule(got), _one_schedule(want)
    if got != want:
        differing = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        pytest.fail(f"{path.name}: the plan differs from the reference in {differing}")


def _one_schedule(data: dict) -> dict:
    """A plan.json as written since session 25 (the predicted schedule once, under planner.schedule: the schedule
    report names it, gnnc.plan.plan_meta.PREDICTED_IN), whichever way it was written: references written before
    hold it in both places."""
    report = data.get("schedule_report") or {}
    if "predicted" in report and report["predicted"] == (data.get("planner") or {}).get("schedule"):
        data["schedule_report"] = {**{k: v for k, v in report.items() if k != "predicted"},
                                   "predicted_in": "planner.schedule"}
    return data


MACHINE_FILE = REFERENCE / "logits-machine.json"


def machine() -> dict:
    """What decides the last bits of the logits here: torch's CPU kernels' ISA, the CPU's vector flags (gnnc's
    compiled kernels are built for this CPU) and whether those kernels were built at all."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = {f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "fma", "sse4"))}
                break
    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_vector_flags": sorted(flags),
            "compiled_kernels": native.library() is not None}


def reference_logits(name: str) -> Path:
    """The reference logits of an example. Without gnnc's compiled CPU kernels (no C compiler, GNNC_NATIVE=0)
    GAT's attention and ELU run as torch ops, whose exp (Sleef's) differs from libm's in the last bits:
    such a run has its own file where one is stored (`<name>.torch-kernels.logits.npy`)."""
    own = REFERENCE / f"{name}.torch-kernels.logits.npy"
    return own if native.library() is None and own.exists() else REFERENCE / f"{name}.logits.npy"


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_logits_are_unchanged(name: str, cora) -> None:
    model = _model(name, {"layers": 4} if name == "gcnii" else {})
    result = gnnc.run(gnnc.compile(model, cora), cora, epochs=2, seed=0, threads=1)
    got = result.logits.detach().numpy()
    path = reference_logits(name)
    if UPDATE:
        np.save(path, got, allow_pickle=False)
        MACHINE_FILE.write_text(json.dumps(machine(), indent=1, sort_keys=True) + "\n")
        return
    want = np.load(path, allow_pickle=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    if machine() == json.loads(MACHINE_FILE.read_text()):
        assert got.tobytes() == want.tobytes(), f"{name}: logits differ (max abs {np.abs(got - want).max():.3g})"
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name}, on another kind of CPU")
