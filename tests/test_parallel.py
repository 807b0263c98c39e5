"""gnnc.parallel.map_processes: the compile's per-worker steps in forked processes give what the same calls in
one process give, in order; failures in a child (an exception, a signal) surface in the parent and leave no
child behind; the thread count is decided once and reaches the passes and the plan."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from gnnc.errors import GnncError, InternalError
from gnnc.parallel import ChildTraceback, map_processes


def _no_children_left() -> bool:
    """None of map_processes' children is alive or unreaped (a test run's worker may hold other children)."""
    return not [p for p in multiprocessing.active_children() if p.name == "gnnc-compile"]


def test_results_in_order_from_closures_as_in_one_process():
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(int(n)) for n in rng.integers(1, 5000, size=13)]
    scale = 3.0

    def work(i: int) -> tuple[int, np.ndarray, float]:  # a closure over arrays the children inherit, not pickled
        time.sleep(0.001 * (i % 3))  # uneven: items finish out of order
        return i, data[i] * scale, float(data[i].sum())

    alone = map_processes(work, range(len(data)), processes=1)
    together = map_processes(work, range(len(data)), processes=3)
    assert [r[0] for r in together] == list(range(len(data)))
    for a, b in zip(alone, together):
        assert a[0] == b[0] and a[2] == b[2]
        np.testing.assert_array_equal(a[1], b[1])
    assert _no_children_left()


def test_children_are_other_processes_and_one_item_is_not_forked():
    parent = os.getpid()
    pids = map_processes(lambda _: os.getpid(), range(6), processes=2)
    assert parent not in pids and 1 <= len(set(pids)) <= 2
    assert map_processes(lambda _: os.getpid(), [0], processes=4) == [parent]
    assert map_processes(lambda _: os.getpid(), range(3), processes=1) == [parent] * 3
    assert map_processes(lambda _: os.getpid(), [], processes=4) == []


def test_a_call_nested_in_a_childs_item_runs_in_that_child():
    def inner(_: int) -> list[int]:
        return map_processes(lambda _: os.getpid(), range(3), processes=2)

    for inner_pids in map_processes(inner, range(2), processes=2):  # each item's inner calls in its own child
        assert len(set(inner_pids)) == 1 and inner_pids[0] != os.getpid()
    assert _no_children_left()


def test_children_run_torch_with_the_threads_given():
    import torch

    counts = map_processes(lambda _: torch.get_num_threads(), range(4), processes=2, threads_each=1)
    assert counts == [1, 1, 1, 1]


def test_an_exception_in_a_child_is_raised_in_the_parent_with_its_traceback():
    def work(i: int) -> int:
        if i == 5:
            raise GnncError(f"item {i} is bad")
        return i

    with pytest.raises(GnncError, match="item 5 is bad") as caught:
        map_processes(work, range(8), processes=2)
    assert isinstance(caught.value.__cause__, ChildTraceback)
    assert "in work" in str(caught.value.__cause__)
    assert _no_children_left()


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int):  # pickling rebuilds it from args (one): it cannot come back whole
        super().__init__(f"{a}+{b}")


def test_an_exception_that_cannot_be_pickled_arrives_as_its_traceback():
    def work(i: int) -> int:
        if i == 1:
            raise _Unpicklable(1, 2)
        return i

    with pytest.raises(InternalError, match="_Unpicklable: 1\\+2"):
        map_processes(work, range(4), processes=2)
    assert _no_children_left()


def test_a_killed_child_is_an_internal_error_and_the_others_are_stopped():
    def work(i: int) -> int:
        if i == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
        time.sleep(60)  # the other child: stopped by the parent, not waited for
        return i

    started = time.monotonic()
    with pytest.raises(InternalError, match="killed by SIGKILL"):
        map_processes(work, range(4), processes=2)
    assert time.monotonic() - started < 30
    assert _no_children_left()


def test_compile_decides_threads_once_and_keeps_them_on_the_plan(tmp_path):
    from gnnc import api
    from gnnc.host import choose_threads

    model = api.load_model("examples/gcn.gnn")
    graph = api.load_graph("sbm:n=160,blocks=8,deg=4,intra=0.97,features=10,classes=4,seed=1")
    plan = api.compile(model, graph, workers=2, strategy="depcache", threads=3)
    assert plan.threads == 3
    assert api.compile(model, graph, workers=2, strategy="depcache").threads == choose_threads().threads
