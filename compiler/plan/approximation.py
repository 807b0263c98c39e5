"""`--approximate`: which strategies and schedules compute something else than one process, and the gate.

Why this module exists: gnnc's contract is exactness (docs/design.md section 8);
approximate ways of training (GNNPipe's historical embeddings, P3's stale
pipeline, MG-GCN's gradient shortcuts) are opt-in. Whether one is approximate
is a fact of its descriptor (`StrategyDef.exact`, `ScheduleDef.exact`, each
with a sentence saying what it approximates), so the CLI, the API and the
planner all ask here: without `--approximate` a named approximate strategy
or schedule is refused (GnncError, exit 2) and the planner considers exact
ones only; with it, `--explain` and the plan say what is approximated.
"""
from __future__ import annotations

from collections.abc import Iterable

from gnnc.errors import GnncError
from gnnc.plan.schedules import SCHEDULES
from gnnc.plan.strategies import STRATEGIES


def approximations(strategies: Iterable[str], schedule: str | None = None) -> list[str]:
    """What the named strategies and schedule approximate, one sentence each ("" none: all exact)."""
    out = []
    for name in dict.fromkeys(strategies):
        sd = STRATEGIES.get(name)
        if sd is not None and not sd.exact:
            out.append(f"strategy {name}: {sd.approximates}")
    sched = SCHEDULES.get(schedule) if schedule else None
    if sched is not None and not sched.exact:
        out.append(f"schedule {sched.name}: {sched.approximates}")
    return out


def require_exact(strategies: Iterable[str], schedule: str | None, approximate: bool) -> None:
    """Refuse, naming each, the approximate strategies and schedule a user asked for without --approximate."""
    if approximate:
        return
    found = approximations(strategies, schedule)
    if found:
        raise GnncError("; ".join(found) + ". These are approximate (not the single-process result): "
                        "pass --approximate to allow them")


def is_exact(strategies: Iterable[str], schedule: str | None = None) -> bool:
    return not approximations(strategies, schedule)
