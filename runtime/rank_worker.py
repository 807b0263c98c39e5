"""The entry point a full-graph plan's rank process runs: the worker its plan needs, trained and reported.

It sits above both workers it picks from: the data-parallel one (gnnc.runtime.distributed) and GNNPipe's
stage worker (gnnc.runtime.pipeline), which builds on the first; sampled plans have their own entry point
(gnnc.runtime.minibatch_dist.sampled_worker).
"""
from __future__ import annotations

from gnnc.plan.pipeline import is_pipeline
from gnnc.runtime.distributed import DistJob, DistWorker, train_and_report
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.pipeline import PipelineWorker
from gnnc.runtime.train import RunResult


def worker(cfg: DistConfig, job: DistJob) -> RunResult | None:
    """One rank's training run; rank 0 returns the run's result (with the logits in global order)."""
    return train_and_report(PipelineWorker(cfg, job) if is_pipeline(job.program) else DistWorker(cfg, job),
                            cfg, job)
