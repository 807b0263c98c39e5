"""Run one case on the emulated cluster: the planner's prediction beside a measured torchrun job.

Why this exists: the planner is validated by cases (a model, a graph, a
cluster, an assignment), each compiled with the cluster's measured profile
and run across the emulated hosts. `run_case` does one: it needs a profile
of the cluster at the case's bandwidth (`measure_profile`, which runs
`gnnc probe --network` on the emulated hosts), compiles the plan with it
(`gnnc compile --cluster PROFILE --json`: the predicted epoch, bytes and
peak memory), runs `gnnc run PLAN` under torchrun on every host, and returns
the measured figures beside the predicted ones. `smoke.py` runs a few; the
validation grid runs many.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emulated import EmulatedCluster

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """One validation case.

    strategy: one per graph layer (`--strategy`), or None for the planner's choice.
    sets: model parameters (`--set NAME=VALUE`).
    """

    model: str
    graph: str
    bandwidth: str
    hosts: int = 2
    nproc_per_host: int = 1
    strategy: str | None = None
    partition: str | None = None
    sets: tuple[str, ...] = ()
    epochs: int = 6
    name: str = field(default="", compare=False)

    @property
    def workers(self) -> int:
        return self.hosts * self.nproc_per_host


class CaseFailed(RuntimeError):
    """A case could not be compiled or run; the message carries the tool's own words."""


def _gnnc(*args: str, timeout_s: float = 900.0) -> str:
    r = subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout_s)
    if r.returncode != 0:
        raise CaseFailed(f"gnnc {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise CaseFailed(f"no JSON summary in the output:\n{text[-2000:]}")


def measure_profile(hosts: int, bandwidth: str, out: Path, base: Path | None = None,
                    nproc_per_host: int = 1, timeout_s: float = 900.0) -> Path:
    """`gnnc probe --network` on a fresh emulated cluster: the profile the planner prices this cluster with.

    `base`: a profile whose machine figures to keep (the links are measured anew); without it host 0
    measures its own (kernel rates on its share of the cores, and NeutronStar's fit).
    """
    args = ["-m", "gnnc", "probe", "--network", "-o", str(out)] + (["--base", str(base)] if base else [])
    with EmulatedCluster(hosts, bandwidth) as cluster:
        results = cluster.run_torchrun(args, nproc_per_host, timeout_s=timeout_s, run_id="gnnc-probe")
    if results[0][0] != 0 or not out.exists():
        raise CaseFailed(f"gnnc probe --network at {bandwidth} failed: {results[0][2].strip()[-2000:]}")
    return out


def _compile_args(case: Case, profile: Path) -> list[str]:
    args = [case.model, "--graph", case.graph, "--workers", str(case.workers), "--cluster", str(profile), "--json"]
    if case.partition:
        args += ["--partition", case.partition]
    for s in case.sets:
        args += ["--set", s]
    return args


def predict(case: Case, profile: Path, plan: Path) -> dict[str, Any]:
    """Compile `case` into `plan` and return what the planner predicts for the assignment the plan runs.

    The planner's choice carries its own prediction. A fixed assignment (`case.strategy`) is
    compiled as given, and its prediction is the planner's price for that same assignment among
    the alternatives it weighs when allowed exactly its strategies. Bytes are also counted
    exactly on the partition (predict-bytes), which is what a run must measure.
    """
    compiled = _last_json(_gnnc("compile", *_compile_args(case, profile), "-o", str(plan),
                                *(["--strategy", case.strategy] if case.strategy else [])))
    predicted = dict(compiled["predicted"])
    planner_bytes = None
    if case.strategy:
        allow = ",".join(sorted(set(compiled["strategies"])))
        priced = _last_json(_gnnc("compile", *_compile_args(case, profile), "--allow", allow))
        match = [a for a in priced["alternatives"] if a["strategies"] == compiled["strategies"]]
        if not match:
            raise CaseFailed(f"the planner did not price {','.join(compiled['strategies'])} among its alternatives")
        predicted["epoch_time_s"], predicted["peak_memory_bytes"] = match[0]["time_s"], match[0]["memory_bytes"]
        planner_bytes = match[0]["bytes"]
    return {"strategies": compiled["strategies"], "epoch_time_s": predicted["epoch_time_s"],
            "bytes_per_epoch": predicted["bytes_per_epoch"], "planner_bytes": planner_bytes,
            "peak_memory_bytes": predicted["peak_memory_bytes"]}


def run_case(case: Case, profile: Path, workdir: Path | None = None, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Compile `case` for `profile` and run it on an emulated cluster: predicted and measured figures.

    Measured (rank 0's `gnnc run --json`): the epoch time (median after the first), the bytes all
    ranks sent per epoch, the largest rank's peak RSS. Predicted: see `predict`. Raises CaseFailed
    when a step fails.
    """
    with tempfile.TemporaryDirectory(prefix="gnnc-case-", dir=workdir) as tmp:
        plan = Path(tmp) / "plan"
        predicted = predict(case, profile, plan)
        with EmulatedCluster(case.hosts, case.bandwidth) as cluster:
            results = cluster.run_torchrun(["-m", "gnnc", "run", str(plan), "--epochs", str(case.epochs), "--json",
                                            "--no-progress"], case.nproc_per_host, timeout_s=timeout_s,
                                           run_id="gnnc-case")
        status, stdout, stderr = results[0]
        if status != 0:
            raise CaseFailed(f"gnnc run on the emulated cluster exited {status}: {stderr.strip()[-2000:]}")
        run = _last_json(stdout)
    return {"case": asdict(case), "strategies": predicted["strategies"],
            "predicted_epoch_s": predicted["epoch_time_s"], "measured_epoch_s": run["epoch_time_s"],
            "predicted_bytes": predicted["bytes_per_epoch"], "planner_bytes": predicted["planner_bytes"],
            "measured_bytes": run["bytes_sent_per_epoch"],
            "predicted_memory_bytes": predicted["peak_memory_bytes"], "measured_peak_rss_bytes": run["peak_rss_bytes"],
            "test_acc": run["test_acc"],
            # the other hosts' agents: torchrun's store host may leave before them, which some report as a failure
            "other_hosts_status": [r[0] for r in results[1:]]}
