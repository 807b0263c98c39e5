"""Run cases on the emulated cluster: the planner's prediction beside a measured torchrun job.

Why this exists: the planner is validated by cases (a model, a graph, a
cluster, an assignment), each compiled with the cluster's measured profile
and run across the emulated hosts. The pieces:

* `measure_profile`: `gnnc probe --network` on the emulated hosts, the
  profile the planner prices that cluster with (without `base`, every rank
  also measures its machine, at once, and rank 0's figures are kept);
* `compile_plan`: the plan for one assignment (or the planner's choice),
  compiled in this process with that profile and saved with its shards;
* `prediction`: what the plan predicts per epoch (gnnc.passes.cost.epoch:
  the training step and the evaluation pass after it, from the schedule the
  runtime follows), the bytes predict-bytes counted for both, and each
  rank's peak memory (gnnc.memory_check, on the plan's shards);
* `run_plans`: several plans trained one after another in one torchrun job
  on the cluster (run_plans.py), in one pass or several in alternating
  order, rank 0's summary of each;
* `measured`, `row`: the run's figures beside the prediction, compared like
  with like: the epoch is the step plus the evaluation, the bytes the step's
  plus the evaluation's.

`run_case` does one case on a fresh cluster (smoke.py); the validation grid
(grid.py) runs many on clusters it keeps.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emulated import EmulatedCluster

ROOT = Path(__file__).resolve().parents[2]
RUN_PLANS = Path(__file__).resolve().with_name("run_plans.py")


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


def measure_profile(hosts: int, bandwidth: str, out: Path, base: Path | None = None,
                    nproc_per_host: int = 1, timeout_s: float = 900.0,
                    cluster: EmulatedCluster | None = None) -> Path:
    """`gnnc probe --network` on the emulated cluster (`cluster` as it is shaped now, else a fresh one):
    the profile the planner prices this cluster with.

    `base`: a profile whose machine figures to keep (the links are measured anew); without it every rank
    measures its own machine at once and rank 0's figures are kept (gnnc.cli's probe --network).
    """
    args = ["-m", "gnnc", "probe", "--network", "-o", str(out)] + (["--base", str(base)] if base else [])
    if cluster is None:
        with EmulatedCluster(hosts, bandwidth) as fresh:
            results = fresh.run_torchrun(args, nproc_per_host, timeout_s=timeout_s, run_id="gnnc-probe")
    else:
        results = cluster.run_torchrun(args, nproc_per_host, timeout_s=timeout_s, run_id="gnnc-probe")
    if results[0][0] != 0 or not out.exists():
        raise CaseFailed(f"gnnc probe --network at {bandwidth} failed: {results[0][2].strip()[-2000:]}")
    return out


def compile_plan(model: Any, graph: Any, graph_spec: str, workers: int, profile: Path, out: Path,
                 strategy: str | None = None, partition: str = "metis") -> Any:
    """Compile one assignment (`strategy`, or the planner's choice when None) for `profile` and save it
    with its shards to `out`; returns the plan as loaded back (with its shard directory)."""
    from gnnc import api  # deferred: the cluster scripts import this module without gnnc's weight

    plan = api.compile(model, graph, workers=workers, strategy=strategy, partition=partition,
                       cluster=str(profile), graph_spec=graph_spec)
    out.parent.mkdir(parents=True, exist_ok=True)  # a plan is written into an existing directory only
    plan.save(out)
    return api.Plan.load(out)


def prediction(plan: Any) -> dict[str, Any]:
    """What `plan` predicts per epoch: its schedule's epoch (the training step and the evaluation pass), the
    bytes predict-bytes counted for each, the planner's own estimate of the step's bytes (its alternatives'
    formulas, when it chose), and the largest rank's peak memory (gnnc.memory_check on the plan's shards);
    and whether it replicates remote dependencies (`replicates`)."""
    from gnnc.inspect_plan import predicted_epoch  # deferred, as above
    from gnnc.memory_check import estimate_run_memory

    epoch = predicted_epoch(plan)
    planner = plan.meta.planner
    strategies = [layer.attr("strategy") for layer in plan.program.graph_layers()]
    planner_bytes = next((a["bytes"] for a in (planner.alternatives if planner else None) or []
                          if a["strategies"] == strategies), None)
    memory = estimate_run_memory(plan, shard_dir=plan.shard_dir)
    return {"strategies": strategies, "caches": replicates(plan), "epoch_s": epoch["epoch_time_s"],
            "step_s": epoch["step_time_s"],
            "eval_s": epoch["eval_time_s"], "bytes": sum((plan.meta.predicted_bytes_per_step or {}).values()),
            "eval_bytes": sum((plan.meta.predicted_eval_bytes_per_epoch or {}).values()),
            "planner_bytes": planner_bytes, "peak_memory_bytes": memory.peak}


def replicates(plan: Any) -> bool:
    """Whether `plan` replicates remote dependencies (computes rows it does not own instead of fetching them): a
    layer whose strategy computes its whole neighbourhood (DepCache's row rule), or a segment that computes the
    rows its selection caches (Hybrid's) and caches any (plan.meta.hybrid)."""
    from gnnc.plan.strategies import STRATEGIES  # deferred, as above

    rules = {STRATEGIES[layer.attr("strategy")].rows for layer in plan.program.graph_layers()}
    return "neighbourhood" in rules or ("selected" in rules and any(
        count > 0 for seg in plan.meta.hybrid or [] for layer in seg["cached_per_layer"] for count in layer))


def run_plans(cluster: EmulatedCluster, plans: list[Path], epochs: int, nproc_per_host: int = 1,
              timeout_s: float = 1800.0, run_id: str = "gnnc-plans", passes: int = 1,
              drop_after_first: float | None = None, pass_seconds: float | None = None) -> list[dict[str, Any]]:
    """Train `plans` one after another in one torchrun job on `cluster`, `passes` times (every other pass in
    reverse order: run_plans.py), after the first pass only those within `drop_after_first` times the fastest
    (and the first plan), each for `epochs` a pass or, with `pass_seconds`, fewer where its predicted epoch is long
    (run_plans.epochs_for); rank 0's summary of each, in order (its `passes`: how many it ran)."""
    drop = ["--drop-after-first", str(drop_after_first)] if drop_after_first else []
    drop += ["--pass-seconds", str(pass_seconds)] if pass_seconds else []
    results = cluster.run_torchrun([str(RUN_PLANS), "--epochs", str(epochs), "--passes", str(passes), *drop,
                                    *map(str, plans)], nproc_per_host, timeout_s=timeout_s, run_id=run_id)
    status, stdout, stderr = results[0]
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if status != 0 or len(rows) != len(plans):
        raise CaseFailed(f"training {len(plans)} plans on the emulated cluster exited {status} after "
                         f"{len(rows)}: {stderr.strip()[-3000:]}")
    return rows


def measured(run: dict[str, Any]) -> dict[str, Any]:
    """A run's epoch as the prediction counts it: the step plus the evaluation, their bytes likewise."""
    return {"epoch_s": run["epoch_time_s"] + run["eval_time_s"], "step_s": run["epoch_time_s"],
            "eval_s": run["eval_time_s"], "bytes": run["bytes_sent_per_epoch"],
            "eval_bytes": run["eval_bytes_sent_per_epoch"], "peak_rss_bytes": run["peak_rss_bytes"],
            "test_acc": run["test_acc"], "passes": run.get("passes", 1), "epochs_timed": run.get("epochs_timed")}


def row(case: Case, predicted: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One assignment of one case: predicted and measured side by side."""
    got = measured(run)
    return {"case": asdict(case), "strategies": predicted["strategies"], "caches": predicted["caches"],
            "predicted_epoch_s": predicted["epoch_s"], "measured_epoch_s": got["epoch_s"],
            "predicted_step_s": predicted["step_s"], "measured_step_s": got["step_s"],
            "predicted_eval_s": predicted["eval_s"], "measured_eval_s": got["eval_s"],
            "predicted_bytes": predicted["bytes"] + predicted["eval_bytes"],
            "measured_bytes": got["bytes"] + got["eval_bytes"],
            "predicted_step_bytes": predicted["bytes"], "measured_step_bytes": got["bytes"],
            "predicted_eval_bytes": predicted["eval_bytes"], "measured_eval_bytes": got["eval_bytes"],
            "planner_bytes": predicted["planner_bytes"],
            "predicted_memory_bytes": predicted["peak_memory_bytes"], "measured_peak_rss_bytes": got["peak_rss_bytes"],
            "test_acc": got["test_acc"], "passes": got["passes"], "epochs_timed": got["epochs_timed"]}


def run_case(case: Case, profile: Path, workdir: Path | None = None, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Compile `case` for `profile` and run it on a fresh emulated cluster: predicted and measured figures
    (`row`). Raises CaseFailed when a step fails."""
    from gnnc import api  # deferred, as above

    model = api.load_model(case.model, **dict(s.split("=", 1) for s in case.sets))
    graph = api.load_graph(case.graph)
    with tempfile.TemporaryDirectory(prefix="gnnc-case-", dir=workdir) as tmp:
        plan = compile_plan(model, graph, case.graph, case.workers, profile, Path(tmp) / "plan", case.strategy,
                            case.partition or "metis")
        predicted = prediction(plan)
        with EmulatedCluster(case.hosts, case.bandwidth) as cluster:
            run = run_plans(cluster, [Path(tmp) / "plan"], case.epochs, case.nproc_per_host, timeout_s,
                            run_id="gnnc-case")[0]
    return row(case, predicted, run)
