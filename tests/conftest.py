"""Shared fixtures: small random graphs with the awkward cases (isolated vertices,
self-loops, duplicate edges), and the example files."""
from __future__ import annotations

import contextlib
import difflib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gnnc.graph import Graph

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"


def check_golden(stages: dict[str, str], prefix: str) -> None:
    """Compare each stage's IR text with tests/golden/<prefix>.<stage>.ir (GNNC_UPDATE_GOLDEN=1 rewrites them)."""
    for stage, text in stages.items():
        path = GOLDEN / f"{prefix}.{stage}.ir"
        if os.environ.get("GNNC_UPDATE_GOLDEN"):
            path.write_text(text)
            continue
        want = path.read_text()
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "actual"))
            pytest.fail(f"IR after {stage} differs from {path.name}:\n{diff[:4000]}")


# schedules other than the schedule pass's default (every halo overlapped, every broadcast staged, gradients
# reduced during backward): nothing overlapped (what ran before the schedule pass), and G3's bins
SCHEDULES = {"none": "schedule{overlap=off staged=off grad_overlap=off}", "bins": "schedule{bins=3}"}
# a model of max and min aggregations (split by source part, binned, staged: ReLU's zeros tie across parts)
EXTREMES = """
layer MaxConv(in, out) {
  scatter   m = src.h
  gather    a = max(m)
  transform t = linear(a, out) + linear(h, out, bias = false)
  apply     h = t
}
layer MinConv(in, out) {
  scatter   m = src.h
  gather    a = min(m)
  transform t = linear(a, out)
  apply     h = t
}
model Extremes(features, hidden = 8, classes) {
  h = MaxConv(features, hidden)(x)
  h = relu(h)
  h = MinConv(hidden, classes)(h)
  loss = cross_entropy(h, y, mask = train)
}
"""


def random_graph(n: int = 40, e: int = 160, f: int = 12, c: int = 4, seed: int = 0) -> Graph:
    """Random directed graph; the last 3 vertices are isolated; includes self-loops and duplicates."""
    # deferred (torch, and sympy through gnnc.graph: ~3 CPU-s): pytest-xdist's controller loads this file before it
    # starts its workers, and runs no test
    import numpy as np
    import torch

    from gnnc.graph import Graph

    rs = np.random.RandomState(seed)
    live = n - 3
    src = rs.randint(0, live, e)
    dst = rs.randint(0, live, e)
    loops = rs.randint(0, live, 5)
    src = np.concatenate([src, loops, src[:7]])  # self-loops, then duplicate edges
    dst = np.concatenate([dst, loops, dst[:7]])
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    train = torch.rand(n, generator=g) < 0.5
    val = ~train & (torch.rand(n, generator=g) < 0.5)
    test = ~train & ~val
    return Graph(n, src.astype(np.int64), dst.astype(np.int64), x, y, train, val, test, f"random{seed}")


def count_calls(monkeypatch, owner, name: str) -> dict[str, int]:
    """Replaces `owner.<name>` by a wrapper counting its calls into the returned {"n": ...} (reset it freely): the
    work-counting tests' one way to count (a method counts as well, the wrapper bound like the function)."""
    calls = {"n": 0}
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def fork_spy(monkeypatch, *owners) -> list[int]:
    """Each owner module's `map_processes` recorded: the item count of every call that forks (more than one
    process and item), appended to the list returned; the calls themselves run as they would."""
    import gnnc.parallel as par

    real = par.map_processes
    forks: list[int] = []

    def spy(fn, items, processes, threads_each=1):
        items = list(items)
        if processes > 1 and len(items) > 1:
            forks.append(len(items))
        return real(fn, items, processes, threads_each)

    for owner in owners:
        monkeypatch.setattr(owner, "map_processes", spy)
    return forks


def process_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass(frozen=True)
class Ran:
    """What a command did, named as subprocess.CompletedProcess names it."""
    returncode: int
    stdout: str
    stderr: str


def gnnc_in_process(*args: str, cwd: Path | str = ROOT) -> Ran:
    """`gnnc ARGS` through gnnc.cli.main in this process, for tests of what a command decides (its messages and
    exit codes 0 and 2): a `python -m gnnc` process pays about 4 s of CPU importing torch before it does anything.
    What only a process shows (signals, exit 1 or 128+N of a failed worker, `python -m gnnc`'s wiring, a fresh
    hash seed) stays with a real subprocess."""
    from gnnc import cli

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as stop:  # argparse's refusal of a flag's value, or --help
                code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
    finally:
        os.chdir(here)
    return Ran(code, out.getvalue(), err.getvalue())


# What one pytest-xdist worker may hold at once: its own ~1 GiB (torch, the test modules) and the 2-4 gloo ranks a
# distributed test launches, a few hundred MiB each.
WORKER_MEMORY_BYTES = 3 << 30


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (make test): one worker per CPU this process may use, as gnnc sizes its own threads (affinity
    mask, cgroup quota; xdist's default counts every physical core of the host), fewer where memory is short,
    and none (the tests in this process) where that leaves one. PYTEST_XDIST_AUTO_NUM_WORKERS still decides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from gnnc.host import available_memory, usable_cpus

    workers, _ = usable_cpus()
    memory = available_memory()
    if memory is not None:
        workers = min(workers, memory.bytes // WORKER_MEMORY_BYTES)
    return workers if workers > 1 else 0


@pytest.fixture
def small_graph() -> Graph:
    return random_graph()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop this process's pool of gloo ranks (tests/_rank_pool.py), if a test started one."""
    pools = sys.modules.get("_rank_pool")
    if pools is not None:
        pools.close_pools()
