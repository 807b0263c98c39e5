"""`PlanMeta`: what `plan.json` keeps beside the IR (the partition, the planner's report, the schedule pass's
report, predicted bytes, ...), as one typed record with one JSON round trip.

Why this module exists: the compiler writes these records, and `gnnc inspect`, `gnnc run` and the API read them
field by field, so they are one frozen dataclass read by attribute, never a dict read by string key. Its JSON
form is generated from the fields (`to_json`, `from_json`): a field added to the record is saved and loaded
with no list of names to update. A plan is data anyone can edit (its checksum is recomputable), so `from_json`
checks everything against the fields' types and the shapes below: an unknown, missing or wrongly typed field is
a PlanError naming it (exit 2), never a TypeError or IndexError in whatever reads it later, and nothing is
evaluated.

The records the planning passes build and nothing in the compiler reads by name (the planner's alternatives,
the predicted schedule, the schedule pass's report, the pipeline's summary) stay JSON values inside the record,
checked against a shape: one of the leaf kinds below, `[shape]` (a list of them), a tuple of shapes (a list of
exactly those), `{"key": shape, "key?": shape}` (a dict with those keys, `?` marking an optional one; other
keys are allowed and never read), `Nullable(shape)`, or a function returning what is wrong (None when fine).
"""
# no `from __future__ import annotations`: the fields' types are objects the reader walks, never text it would
# have to evaluate (typing.get_type_hints calls eval)
import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from gnnc.errors import GnncError
from gnnc.graph.sampling import SamplingConfig
from gnnc.plan.precision import DEFAULT_PRECISION, PRECISIONS
from gnnc.plan.schedules import SCHEDULES

NUMBER, INTEGER, STRING, BOOLEAN, ANYTHING = "a number", "an integer", "a string", "true or false", "anything"
# The schedule pass's report holds the predicted epoch it drew, which is also the planner's record's `schedule`
# (gnnc.passes.schedule sets both to one drawing): plan.json writes it once, under planner.schedule, and the
# report says where it is (`"predicted_in": PREDICTED_IN` in place of `predicted`); reading the plan puts it back
# in the report. A plan written before (both copies) reads as it did.
PREDICTED_IN = "planner.schedule"


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
                            "predicted?": Nullable(schedule),
                            "predicted_in?": lambda v: None if v == PREDICTED_IN else f"{PREDICTED_IN!r}"},
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


def _check_fields(meta: dict[str, Any], fail: Callable[[str], Exception]) -> None:
    """A plan's schedule, approximations, byte counts, precision and stand-ins are data of known values (the
    sampling field is checked as it is read: SamplingConfig.from_json)."""
    if "schedule" in meta and meta["schedule"] not in SCHEDULES:
        raise fail(f"unknown schedule {meta['schedule']!r} (known: {', '.join(SCHEDULES)})")
    notes = meta.get("approximations", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise fail("'approximations' must be a list of sentences")
    for key in ("predicted_bytes_per_epoch", "predicted_eval_bytes_per_epoch"):
        counts = meta.get(key, {})
        if not isinstance(counts, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                   for v in counts.values()):
            raise fail(f"'{key}' must map names to integers")
    if "precision" in meta and meta["precision"] not in PRECISIONS:
        raise fail(f"'precision' must be one of {', '.join(PRECISIONS)}, got {meta['precision']!r}")
    stand_ins = meta.get("graph_stand_ins", {})
    if not isinstance(stand_ins, dict) or not all(isinstance(v, str) for v in stand_ins.values()):
        raise fail("'graph_stand_ins' must map field names to descriptions")


def _check_pipeline_field(meta: dict[str, Any], fail: Callable[[str], Exception]) -> None:
    """A plan's `pipeline` record (what --explain and inspect show of it) is data of known shape; what runs is the
    IR's annotations (gnnc.plan.pipeline)."""
    pipe = meta.get("pipeline")
    if pipe is None:
        return

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    ok = (isinstance(pipe, dict) and all(count(pipe.get(k)) for k in ("stages", "groups", "chunks", "history_every",
                                                                        "history_reads_per_layer"))
          and isinstance(pipe.get("split"), list)
          and all(isinstance(s, list) and len(s) == 2 and all(count(x) for x in s) for s in pipe["split"])
          and isinstance(pipe.get("bubble"), dict)
          and all(isinstance(pipe["bubble"].get(k), (int, float)) for k in ("stretch", "idle_fraction")))
    if not ok:
        raise fail("'pipeline' must hold the stage, group, chunk and history counts, the split and the bubble")


# --- the typed record -------------------------------------------------------------------------------------
# Its JSON form is generated from the fields: a field at its default is not written (so an fp32 plan, an exact
# plan, a plan of one worker is the file it always was), every other one is; a JSON value (`Any`, or a dict or
# list of them) is written as it is, after the shapes above have checked it on the way in.

class Record:
    """A record of `plan.json`: its JSON form is generated from its fields (`_encode`)."""

    def to_json(self) -> dict[str, Any]:
        return _encode(self)


@dataclass(frozen=True)
class Partition(Record):
    """How the vertices were split among the workers (gnnc.passes.partition)."""

    method: str
    parts: int
    seed: int
    of: str | None = None  # what the parts are, when not one per worker (a pipeline's chunks)


@dataclass(frozen=True)
class PlannerRecord(Record):
    """choose-strategy's report (gnnc.passes.planner.report.PlannerReport) as the plan keeps it."""

    strategies: list[str]
    predicted_time_s: float
    predicted_memory_bytes: float
    cluster: str | None = None
    # every assignment priced: {"strategies", "time_s", "bytes", "memory_bytes", "schedule"?, "formulas"?, ...}
    alternatives: list[dict[str, Any]] | None = None
    crossovers: list[str] | None = None
    segments: list[list[Any]] | None = None  # the chosen [start, end, strategy]
    segment_costs: list[dict[str, Any]] | None = None  # every segment priced
    # the predicted epoch per stage and worker, for `gnnc inspect --format gantt|trace`
    schedule: dict[str, Any] | None = None


@dataclass(frozen=True)
class WorkersTried(Record):
    """--workers auto: one worker count tried and its predicted epoch (None where the planner found none)."""

    workers: int
    time_s: float | None


@dataclass(frozen=True)
class PlanMeta(Record):
    """Everything a plan records beside its IR, model and passes (each field a key of `plan.json`)."""

    partition: Partition | None = None
    planner: PlannerRecord | None = None
    precision: str = DEFAULT_PRECISION  # the bytes predicted per element and the rates priced; what a run uses
    sampling: SamplingConfig | None = None  # sampled minibatches: fan-outs and batch size
    schedule: str | None = None  # the step schedule of a sampled plan (gnnc.plan.schedules)
    predicted_bytes_per_step: dict[str, int] | None = None  # full-graph training, by exchange
    predicted_bytes_per_epoch: dict[str, int] | None = None  # sampled minibatches, by exchange
    predicted_eval_bytes_per_epoch: dict[str, int] | None = None
    approximations: tuple[str, ...] = ()  # what an approximate strategy or schedule changes, one sentence each
    hybrid: list[dict[str, Any]] | None = None  # select-hybrid's prediction, one entry per hybrid segment
    schedule_report: dict[str, Any] | None = None  # what the schedule pass compared and chose
    pipeline: dict[str, Any] | None = None  # GNNPipe's shape, bubble, refresh traffic and prediction
    workers_considered: tuple[WorkersTried, ...] = ()  # --workers auto
    graph_stand_ins: dict[str, str] | None = None  # graph fields stood in for, by name: what a run states

    @staticmethod
    def from_json(data: dict[str, Any], graph_layers: int, fail: Callable[[str], Exception]) -> "PlanMeta":
        """Read back what `to_json` wrote, for a plan of `graph_layers` graph layers; `fail(message)` is the
        error raised for the first field that is unknown, missing or not of its type."""
        _check_fields(data, fail)
        _check_pipeline_field(data, fail)
        check_meta(data, graph_layers, fail)
        return _with_predicted(_decode(data, PlanMeta, "", fail), fail)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (`_encode`), the predicted schedule once (`PREDICTED_IN`): the 64-layer GCNII example's
        is ~140 KB of JSON, encoded and written twice before."""
        report, planner = self.schedule_report, self.planner
        drawn = (report or {}).get("predicted")
        if drawn is None or planner is None or planner.schedule is None or not (
                drawn is planner.schedule or drawn == planner.schedule):
            return _encode(self)
        report = {**{k: v for k, v in report.items() if k != "predicted"}, "predicted_in": PREDICTED_IN}
        return _encode(dataclasses.replace(self, schedule_report=report))


def _with_predicted(meta: PlanMeta, fail: Callable[[str], Exception]) -> PlanMeta:
    """`meta` with its schedule report's predicted epoch put back where plan.json names it (`PREDICTED_IN`)."""
    report = meta.schedule_report
    if not report or "predicted_in" not in report:
        return meta
    if report.get("predicted") is not None:
        raise fail("'schedule_report' gives both 'predicted' and 'predicted_in'")
    if meta.planner is None or meta.planner.schedule is None:
        raise fail(f"'schedule_report.predicted_in' names {PREDICTED_IN!r}, which the plan does not hold")
    kept = {k: v for k, v in report.items() if k != "predicted_in"}
    return dataclasses.replace(meta, schedule_report={**kept, "predicted": meta.planner.schedule})


_PLAIN = (str, int, float, type(None))  # bool is an int
_LEAF_TYPES = frozenset({str, int, float, bool, type(None)})  # exactly these types: a leaf as it is


def _encode(value: Any) -> Any:
    # the leaves first: a plan's JSON values (alternatives, schedules, segment costs) are ~20,000 numbers and
    # strings on a 64-layer model, each of which was asked whether it is a dataclass before anything else; inside
    # a list or dict a leaf of a plain type is taken as it is, without a call of its own (~12,000 calls a plan)
    if isinstance(value, _PLAIN):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, SamplingConfig):
            return value.to_json()
        return {f.name: v if type(v) in _LEAF_TYPES else _encode(v) for f in dataclasses.fields(value)
                if (v := getattr(value, f.name)) != _default(f)}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _LEAF_TYPES else _encode(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in _LEAF_TYPES else _encode(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


_LEAVES = {str: STRING, bool: BOOLEAN, int: INTEGER, float: NUMBER}


def _decode(value: Any, hint: Any, where: str, fail: Callable[[str], Exception]) -> Any:
    """`value` (from JSON) as `hint` says, or `fail` naming the field `where` (`planner.strategies[1]`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(value, inner, where, fail)
    if hint is SamplingConfig:
        try:
            return SamplingConfig.from_json(value, "plan")
        except GnncError as err:  # its own reader's message, which names the field, under the plan's path
            raise fail(err.message.removeprefix("plan: ")) from None
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise fail(f"'{where or 'the plan'}' must be an object, got {_short(value)}")
        known = {f.name: f for f in dataclasses.fields(hint)}
        prefix = f"{where}." if where else ""
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise fail(f"unknown field '{prefix}{unknown[0]}' (known: {', '.join(known)})")
        given = {}
        for name, f in known.items():
            if name in value:
                given[name] = _decode(value[name], f.type, prefix + name, fail)
            elif _default(f) is dataclasses.MISSING:
                raise fail(f"'{where or 'the plan'}' lacks '{name}'")
        return hint(**given)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise fail(f"'{where}' must be a list, got {_short(value)}")
        items = [_decode(v, args[0], f"{where}[{i}]", fail) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise fail(f"'{where}' must be an object, got {_short(value)}")
        return {k: _decode(v, args[1], f"{where}.{k}", fail) for k, v in value.items()}
    wrong = mismatch(value, _LEAVES[hint], where)
    if wrong is not None:
        raise fail(wrong)
    return value
