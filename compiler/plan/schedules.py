"""Schedules as descriptors: in which order a training step's phases run, and whether that is exact.

Why this module exists: a strategy says how a layer's work is split over
workers (gnnc.plan.strategies); a schedule says how steps are ordered in
time. P3 runs its push-pull minibatches as a static 2-forward/2-backward
pipeline with three minibatches in flight and weights stashed per minibatch,
whose gradients are three optimizer steps stale: a different function from
the sequential one, so it is approximate and, like an approximate strategy,
planned or accepted only with `--approximate` (gnnc.plan.approximation).
The runtime (gnnc.runtime.minibatch) executes the phases in the order the
descriptor names; the planner prices the overlap it allows.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ScheduleDef:
    """One schedule.

    exact: computes what one process computes step by step (else approximate: `--approximate` only).
    approximates: what an approximate schedule changes, for `--explain` and error messages.
    staleness: optimizer steps between reading the weights a minibatch runs on and applying its gradient
        (0: the current weights).
    in_flight: minibatches between their first and last phase at once.
    sampled_only: runs sampled minibatches only (`--fanout`), not full-graph steps.
    """

    name: str
    summary: str
    exact: bool = True
    approximates: str = ""
    staleness: int = 0
    in_flight: int = 1
    sampled_only: bool = False


SCHEDULES: Mapping[str, ScheduleDef] = MappingProxyType({s.name: s for s in (
    ScheduleDef("sequential", "one minibatch (or full-graph step) at a time, its phases in order"),
    ScheduleDef("2f2b", "P3's pipeline: 3 minibatches in flight, 2 forward and 2 backward phases per tick, "
                "weight stashing", exact=False,
                approximates="each minibatch's gradient is computed on weights 3 optimizer steps old "
                             "(w_{t+1} = w_t - lr * grad f(w_{t-3}), P3's bounded staleness)",
                staleness=3, in_flight=3, sampled_only=True),
)})


def schedule(name: str) -> ScheduleDef:
    """The descriptor of `name`; a KeyError names the known schedules."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise KeyError(f"unknown schedule {name!r} (known: {', '.join(SCHEDULES)})") from None
