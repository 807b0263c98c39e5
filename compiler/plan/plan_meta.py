"""The shapes of the records `plan.json` keeps beside the IR: the partition, the planner's report and the
schedule pass's report.

Why this module exists: `gnnc inspect` and `gnnc run --json` read these records field by field, and a plan is
data anyone can edit (its checksum is recomputable). `Plan.load` checks each record against its shape here,
so a malformed one is a PlanError naming the field (exit 2), never a TypeError or IndexError in whatever reads
it later. A shape is: one of the leaf kinds below, `[shape]` (a list of them), a tuple of shapes (a list of
exactly those), `{"key": shape, "key?": shape}` (a dict with those keys, `?` marking an optional one; other
keys are allowed and never read), `Nullable(shape)`, or a function returning what is wrong (None when fine).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NUMBER, INTEGER, STRING, BOOLEAN, ANYTHING = "a number", "an integer", "a string", "true or false", "anything"


@dataclass(frozen=True)
class Nullable:
    shape: Any


def mismatch(value: Any, shape: Any, where: str) -> str | None:
    """What is wrong with `value` against `shape`, naming the field (`planner.alternatives[2].time_s`); None if
    it fits."""
    if isinstance(shape, Nullable):
        return None if value is None else mismatch(value, shape.shape, where)
    if callable(shape):
        wrong = shape(value)
        return None if wrong is None else f"'{where}' must be {wrong}, got {_short(value)}"
    if isinstance(shape, str):
        ok = {NUMBER: isinstance(value, (int, float)) and not isinstance(value, bool),
              INTEGER: isinstance(value, int) and not isinstance(value, bool),
              STRING: isinstance(value, str), BOOLEAN: isinstance(value, bool), ANYTHING: True}[shape]
        return None if ok else f"'{where}' must be {shape}, got {_short(value)}"
    if isinstance(shape, (list, tuple)):
        if not isinstance(value, list) or (isinstance(shape, tuple) and len(value) != len(shape)):
            want = "a list" if isinstance(shape, list) else f"a list of {len(shape)}"
            return f"'{where}' must be {want}, got {_short(value)}"
        shapes = shape * len(value) if isinstance(shape, list) else shape
        return next((m for i, (v, s) in enumerate(zip(value, shapes))
                     if (m := mismatch(v, s, f"{where}[{i}]")) is not None), None)
    if not isinstance(value, dict):
        return f"'{where}' must be an object, got {_short(value)}"
    for key, sub in shape.items():
        name = key.rstrip("?")
        if name not in value:
            if key.endswith("?"):
                continue
            return f"'{where}' lacks '{name}'"
        wrong = mismatch(value[name], sub, f"{where}.{name}")
        if wrong is not None:
            return wrong
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def shapes(graph_layers: int) -> dict[str, Any]:
    """The shape of each record, for a plan of `graph_layers` graph layers (what layer indices index)."""
    def layer(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < graph_layers
        return None if ok else f"a graph layer index (0..{graph_layers - 1})"

    def span(v: Any) -> str | None:
        ok = (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
              and 0 <= v[0] < v[1] <= graph_layers)
        return None if ok else f"a span [first, end) of graph layers within 0..{graph_layers}"

    piece = {"layer": Nullable(layer), "op": STRING, "track": lambda v: None if v in ("compute", "mixed", "communication")
             else "compute, mixed or communication", "overlap": ANYTHING, "start_s": [NUMBER],
             "time_s": [NUMBER]}
    stage = {"direction": STRING, "kind": STRING, "strategy": Nullable(STRING), "layers": [layer],
             "segment": Nullable(span), "start_s": NUMBER, "time_s": NUMBER, "pieces": [piece]}
    schedule = {"time_s": NUMBER, "workers": lambda v: None if isinstance(v, int) and not isinstance(v, bool) and v >= 1
                else "a positive integer",
                "per": STRING, "cluster?": Nullable(STRING), "stages": [stage]}
    options = {"bins?": NUMBER}
    strategies = [STRING]
    return {
        "partition": {"method": STRING, "parts": INTEGER, "seed": INTEGER, "of?": STRING},
        "planner": {"cluster?": Nullable(STRING), "strategies": strategies, "predicted_time_s": NUMBER,
                    "predicted_memory_bytes": NUMBER, "crossovers?": [STRING],
                    "alternatives?": [{"strategies": strategies, "time_s": NUMBER, "bytes": NUMBER,
                                       "memory_bytes": NUMBER, "schedule?": STRING, "user_costs?": [STRING],
                                       "approximate?": [STRING], "formulas?": _string_map}],
                    "segments?": [(layer, lambda v: None if isinstance(v, int) and not isinstance(v, bool)
                                   and 0 < v <= graph_layers else f"an end layer within 1..{graph_layers}", STRING)],
                    "segment_costs?": [{"layers": span, "strategy": STRING, "time_s": NUMBER, "bytes": NUMBER,
                                        "memory_bytes": NUMBER}],
                    "schedule?": Nullable(schedule)},
        "schedule_report": {"predicted_time_s?": Nullable(NUMBER),
                            "segments?": [{"layers": span, "strategy": STRING, "options": options,
                                           "alternatives?": [{"options": options, "time_s?": NUMBER}],
                                           "why?": STRING}],
                            "grad_alternatives?": Nullable([{"grad_overlap": ANYTHING, "time_s": NUMBER}]),
                            "grad_buckets?": NUMBER, "activation_bytes?": Nullable(NUMBER),
                            "activation_kept_bytes?": NUMBER, "memory_cap?": Nullable(NUMBER), "notes?": [STRING],
                            "predicted?": Nullable(schedule)},
        # --workers auto: each worker count tried and its predicted epoch (None where the planner found none)
        "workers_considered": [{"workers": lambda v: None if isinstance(v, int) and not isinstance(v, bool)
                                and v >= 1 else "a positive integer", "time_s": Nullable(NUMBER)}],
    }


def _string_map(v: Any) -> str | None:
    ok = isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
    return None if ok else "an object of strings"


def check_meta(meta: dict[str, Any], graph_layers: int, fail: Callable[[str], Exception]) -> None:
    """Raise `fail(message)` for the first record of `meta` that does not fit its shape."""
    for key, shape in shapes(graph_layers).items():
        if key in meta:
            wrong = mismatch(meta[key], shape, key)
            if wrong is not None:
                raise fail(wrong)
    report = meta.get("schedule_report") or {}
    if report.get("activation_bytes") is not None and "activation_kept_bytes" not in report:
        raise fail("'schedule_report' gives 'activation_bytes' without 'activation_kept_bytes'")
    for workers, stage in _stages(meta):
        if any(len(piece[k]) != workers for piece in stage["pieces"] for k in ("start_s", "time_s")):
            raise fail(f"a predicted stage's pieces must give 'start_s' and 'time_s' for each of the schedule's "
                       f"{workers} workers")
        drawn = stage["kind"] not in ("allreduce", "optimizer", "transition")  # drawn as the layers they run
        if drawn and (not stage["layers"] or stage["segment"] is None):
            raise fail(f"a predicted stage of kind {stage['kind']!r} must name its layers and its segment")


def _stages(meta: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(its schedule's workers, stage) for every stage of the predicted schedules `meta` holds (shapes checked)."""
    out = []
    for schedule in ((meta.get("planner") or {}).get("schedule"), (meta.get("schedule_report") or {}).get("predicted")):
        if schedule:
            out += [(schedule["workers"], stage) for stage in schedule["stages"]]
    return out
