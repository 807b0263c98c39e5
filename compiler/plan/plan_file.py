"""A compiled plan on disk: `plan.json` (versioned schema) beside `parts.npy` and every rank's shard.

`plan.json` holds the model's source and configuration for the record, the
compiled IR (what runs: `gnnc run PLAN` re-parses it and refuses an IR that
does not match its checksum), the per-layer strategies, the planner's
predictions and the checksums of the other files, so a plan is data that
a later process loads without the compiler that wrote it.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnc.errors import GnncError, PlanError, write_failure
from gnnc.graph.sampling import SamplingConfig
from gnnc.files import atomic_write, fresh_directory
from gnnc.ir import Program
from gnnc.ir.text import parse_ir
from gnnc.plan.pipeline import is_pipeline
from gnnc.plan.pipeline_shards import write_pipeline_shards
from gnnc.plan.plan_meta import PlanMeta
from gnnc.plan.sampled_shards import check_sampled_shards_match, write_sampled_shards
from gnnc.plan.shard_files import read_manifest
from gnnc.plan.shards import check_shards_match, write_plan_shards
from gnnc.plan.strategies import STRATEGIES, names

PLAN_SCHEMA = "gnnc.plan/1"
PLAN_FILES = {"parts.npy", "shards/manifest.json"}  # the files beside plan.json that `shards` checksums
# plan.json's own keys; every other one is a field of PlanMeta (an unknown one is refused, naming it)
PLAN_KEYS = {"schema", "model", "graph", "config", "training", "passes", "workers", "layers", "ir", "ir_sha256",
             "shards"}


@dataclass(frozen=True)
class ModelSource:
    """The .gnn text a plan was compiled from and the overrides it was elaborated with."""

    file: str
    source: str
    name: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()


@dataclass
class Plan:
    """A compiled model: IR after the pipeline, and what produced it."""

    program: Program
    model: ModelSource
    graph_spec: str | None
    passes: list[str]
    workers: int = 1
    meta: PlanMeta = field(default_factory=PlanMeta)
    parts: Any = None  # part of every vertex, when compiled for several workers
    cached: Any = None  # hybrid: per graph layer, per rank, the dependencies cached (global ids)
    graph: Any = field(default=None, repr=False, compare=False)  # what it was compiled on (not saved)
    # (layer specs, every rank's row sets) compile's predict-bytes built, for writing the shards (not saved)
    row_sets: Any = field(default=None, repr=False, compare=False)
    shard_dir: Path | None = None  # per-rank shards, once written (`save`) or found (`load`)
    threads: int = field(default=1, compare=False)  # processes `save` may write shards with (compile's; not saved)

    @property
    def sampling(self) -> SamplingConfig | None:
        """The fan-outs and batch size of a plan for sampled minibatches, None for full-graph steps."""
        return self.meta.sampling

    @property
    def schedule(self) -> str:
        """The step schedule (gnnc.plan.schedules)."""
        return self.meta.schedule or "sequential"

    def to_json(self) -> dict[str, Any]:
        ir = str(self.program)
        return {
            "schema": PLAN_SCHEMA,
            "model": {"file": os.path.basename(self.model.file), "source": self.model.source,
                      "name": self.program.name, "overrides": dict(self.model.overrides)},
            "graph": self.graph_spec,
            "config": {k: _jsonable(v) for k, v in self.program.config},
            "training": dict(self.program.training),
            "passes": self.passes,
            "workers": self.workers,
            "layers": [_layer_summary(layer) for layer in self.program.layers],
            "ir": ir,
            "ir_sha256": hashlib.sha256(ir.encode()).hexdigest(),
            **self.meta.to_json(),
        }

    def save(self, directory: str | os.PathLike, progress: Any = None) -> Path:
        """Write the plan: per-rank shards (when compiled for several workers), then `plan.json`.

        The plan is written into a new directory beside `directory` and swapped in whole at the end, so a
        failure (a full disk, an interrupt) leaves the old plan as it was, or none and nothing half-written.
        The parent directory must exist (a mistyped -o is named, not created); an existing `directory` must
        be a plan or empty (the swap replaces it whole: no other file of it would survive).
        """
        d = Path(directory)
        if not d.parent.is_dir():
            raise PlanError(f"cannot write the plan {d}: directory {d.parent} does not exist")
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            raise PlanError(f"cannot write the plan {d}: it exists and is not a directory")
        if d.is_dir() and any(d.iterdir()) and not (d / "plan.json").is_file():
            raise PlanError(f"cannot write the plan {d}: it is a directory that holds no plan; give a new or empty "
                            f"one (writing the plan replaces the directory whole)")
        try:
            new = _sibling(d, "new")
            try:
                # the new directory is private until the swap: its files are written in place and each directory
                # is fsynced once, before the swap (gnnc.files.fresh_directory says why that is atomic and durable)
                with fresh_directory(new):
                    self._write(new, progress)
                _swap_in(new, d)
            except BaseException:
                shutil.rmtree(new, ignore_errors=True)
                raise
        except OSError as err:
            raise write_failure(err, f"the plan {d}") from None
        except GnncError as err:
            if isinstance(err.__cause__, OSError):  # a shard's write, named by its file in the hidden new plan
                raise write_failure(err.__cause__, f"the plan {d}") from None
            raise
        if self.shard_dir is not None:
            self.shard_dir = d / "shards"
        return d

    def _write(self, d: Path, progress: Any) -> None:
        """Every file of the plan into the new, empty directory `d`; `plan.json`, which holds the others'
        checksums, last."""
        data = self.to_json()
        if self.parts is not None:
            buf = io.BytesIO()
            np.save(buf, np.asarray(self.parts, dtype=np.int64), allow_pickle=False)
            atomic_write(d / "parts.npy", buf.getvalue())
            data["shards"] = {"parts.npy": hashlib.sha256(buf.getvalue()).hexdigest()}
            if self.graph is not None:
                self.shard_dir = self.write_shards(d / "shards", progress)
                manifest = (self.shard_dir / "manifest.json").read_bytes()
                data["shards"]["shards/manifest.json"] = hashlib.sha256(manifest).hexdigest()
        # compact: json's C encoder runs only without indent (the indented plan.json of the gcnii example, 0.6 MB,
        # took 3x as long); `gnnc inspect PLAN --format json` prints it indented
        text = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
        atomic_write(d / "plan.json", text.encode())

    def write_shards(self, directory: str | os.PathLike, progress: Any = None) -> Path:
        """Every rank's shard of this plan (gnnc.plan.shards) into `directory`."""
        if self.graph is None or self.parts is None:
            raise PlanError("writing a plan's shards needs the graph it was compiled for and its partition")
        if self.sampling is not None:
            write_sampled_shards(self.program, self.graph, self.parts, self.workers, directory)
            return Path(directory)
        if is_pipeline(self.program):  # its partition is the chunking; each rank holds its chunks' structure
            write_pipeline_shards(self.program, self.graph, self.parts, self.workers, directory, progress)
            return Path(directory)
        write_plan_shards(self.program, self.graph, self.parts, self.workers, directory,
                          self.cached, progress, self.row_sets, processes=self.threads)
        return Path(directory)

    @staticmethod
    def load(directory: str | os.PathLike) -> "Plan":
        """Read a plan directory; anything malformed or not matching its checksums is a PlanError.

        Everything in it is data: the IR is read by gnnc's own parser (`gnnc.ir.text`), the
        only other files opened are the two a plan writes (`PLAN_FILES`), and arrays load
        without pickle.
        """
        path = Path(directory) / "plan.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(f"{directory}: not a plan directory (no plan.json)") from None
        except (OSError, ValueError, RecursionError) as err:
            raise PlanError(f"{path}: unreadable plan: {err}") from None
        if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
            raise PlanError(f"{path}: unknown plan schema {data.get('schema') if isinstance(data, dict) else None!r}"
                            f" (expected {PLAN_SCHEMA})")
        try:
            m = data["model"]
            model = ModelSource(str(m["file"]), str(m["source"]), str(m["name"]),
                                tuple(sorted((str(k), str(v)) for k, v in dict(m["overrides"]).items())))
            ir = data["ir"]
            passes = [str(p) for p in data["passes"]]
            workers = data.get("workers", 1)
            shards = data.get("shards") or {}
        except (KeyError, TypeError, ValueError) as err:
            raise PlanError(f"{path}: missing or malformed field {err}") from None
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise PlanError(f"{path}: 'workers' must be a positive integer, got {workers!r}")
        if not isinstance(data.get("graph"), (str, type(None))):
            raise PlanError(f"{path}: 'graph' must be a graph spec or null, got {data['graph']!r}")
        if not isinstance(shards, dict) or not set(shards) <= PLAN_FILES:
            raise PlanError(f"{path}: 'shards' must map {' and '.join(sorted(PLAN_FILES))} to checksums")
        if not isinstance(ir, str) or hashlib.sha256(ir.encode()).hexdigest() != data.get("ir_sha256"):
            raise PlanError(f"{path}: the plan's IR does not match its checksum (edited or truncated); "
                            f"compile it again")
        program = parse_ir(ir, f"{path}:ir")
        parts = None
        for name, digest in shards.items():
            blob_path = Path(directory) / name
            try:
                blob = blob_path.read_bytes()
            except FileNotFoundError:
                raise PlanError(f"{blob_path}: shard missing") from None
            except OSError as err:
                raise PlanError(f"{blob_path}: unreadable: {err.strerror or err}") from None
            if hashlib.sha256(blob).hexdigest() != digest:
                raise PlanError(f"{blob_path}: shard does not match its checksum (truncated or edited)")
            if name == "parts.npy":
                try:
                    parts = np.load(io.BytesIO(blob), allow_pickle=False)
                except (ValueError, OSError, EOFError) as err:
                    raise PlanError(f"{blob_path}: not a partition array: {err}") from None
        meta = PlanMeta.from_json({k: v for k, v in data.items() if k not in PLAN_KEYS}, len(program.graph_layers()),
                                  lambda message: PlanError(f"{path}: {message}"))
        _check_strategies(program, workers, path)
        shard_dir = Path(directory) / "shards" if "shards/manifest.json" in shards else None
        if shard_dir is not None:
            manifest = read_manifest(shard_dir)
            if manifest.get("kind") == "sampled":  # sampled shards: the feature layout the first layer reads
                check_sampled_shards_match(manifest, program, str(shard_dir))
            else:
                check_shards_match(manifest, program, str(shard_dir))
        return Plan(program, model, data.get("graph"), passes, workers, meta, parts, shard_dir=shard_dir)


def _sibling(d: Path, kind: str) -> Path:
    """A new directory beside `d` (same file system, so renaming it onto `d` is one step), made as `mkdir` makes
    any (the umask's mode), hidden by its leading dot."""
    while True:
        path = d.parent / f".{d.name}.{kind}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _swap_in(new: Path, d: Path) -> None:
    """Make the directory `new` be `d` in one step: a rename when `d` does not exist, else an exchange of the
    two (the old plan is removed after). Where the system cannot exchange, `d` is moved aside first, so that a
    crash between the two renames leaves the old plan whole under `.NAME.old-*`."""
    if not d.exists():
        os.rename(new, d)
    elif _exchange(new, d):
        shutil.rmtree(new, ignore_errors=True)  # the old plan, now under the new one's name
    else:
        old = _sibling(d, "old")
        os.rename(d, old / "plan")
        os.rename(new, d)
        shutil.rmtree(old, ignore_errors=True)
    fd = os.open(d.parent, os.O_RDONLY)  # the renames themselves survive a power cut
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux's renameat2 with RENAME_EXCHANGE); False where the C library or the file
    system has no such call."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _check_strategies(program: Program, workers: int, path: Path) -> None:
    """Every layer's strategy is a registered one this many workers run: an edited name would otherwise run as
    another strategy's rows (or fail as a KeyError deep in the runtime), and a plan of one worker runs only the
    one-worker strategy."""
    for layer in program.layers:
        name = layer.attr("strategy", "local")
        known = STRATEGIES.get(name)
        if known is None or not known.runnable:
            raise PlanError(f"{path}: layer {layer.name} names strategy {name!r}, which is not one gnnc runs "
                            f"(known: {', '.join(names(runnable=True))}); compile the plan again")
        if workers == 1 and not known.single_worker:
            raise PlanError(f"{path}: layer {layer.name} names strategy {name!r} in a plan of one worker, which runs "
                            f"{', '.join(names(single_worker=True))} only; compile the plan again")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


def _layer_summary(layer) -> dict[str, Any]:
    return {"name": layer.name, "kind": layer.kind, "op": layer.op, "edges": layer.edges,
            "strategy": layer.attr("strategy", "local"),
            "ops": [e.op for e in layer.eqns],
            "params": {p.value.name: [str(d) for d in p.value.type.shape] if p.value.type else None
                       for p in layer.params}}
