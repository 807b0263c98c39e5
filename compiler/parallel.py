"""The compile's independent per-worker steps spread over processes, so that every core a compile may use works.

Why this module exists: at ogbn-products' size the compile for 8 workers spends most of its time in steps that
are one per worker and independent of one another (Algorithm 4's selection for each worker, each rank's
structures and shard file: issue 34), and on a machine of several cores it used one of them. Threads do not
serve: most of those steps are many small numpy calls and Python between them, which hold the interpreter's lock.

`map_processes(fn, items, processes)` runs `fn(item)` for every item in child processes made by fork, and
returns the results in the items' order, as `[fn(x) for x in items]` would. Fork is what makes it cheap: a child
starts with the parent's memory (the graph's maps, the partition, the row sets already built) shared until
written, so nothing of the inputs is pickled; `fn` may be a closure. Each result comes back pickled through a
pipe between this program's own processes (never read from a file). Items go to whichever child is free, one at
a time, so uneven items balance. With `processes <= 1` or fewer than two items nothing is forked: the same
calls in this process, in order (one way to compute either; the caller chooses the count, from the thread
count decided once: `gnnc.host.choose_threads`).

Each child runs torch (when the parent had imported it) with `threads_each` threads: a forked child does not
have the parent's OpenMP thread pool, and the children together should not ask for more cores than there are.
Failures: an exception in a child is raised in the parent (its traceback text as the cause), a child that ends
without an answer (a signal: the out-of-memory killer, a kill) raises `InternalError` naming how it ended; either
way the other children are stopped and reaped before the error leaves, so no process is left behind.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import traceback
from typing import Any, Callable, Iterable, TypeVar

from gnnc.errors import InternalError

T = TypeVar("T")
R = TypeVar("R")

# the job a forked child runs: set in the parent just before the fork, read by the child from its copy of memory
_JOB: tuple[Callable[[Any], Any], list[Any], int] | None = None
_IN_CHILD = False  # set in a child: a map_processes call inside one of its items runs in that child


class ChildTraceback(Exception):
    """The traceback of an exception raised in a child process, attached as its cause in the parent."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def map_processes(fn: Callable[[T], R], items: Iterable[T], processes: int, threads_each: int = 1) -> list[R]:
    """`[fn(x) for x in items]`, computed in up to `processes` forked child processes (see the module's
    docstring); in this process when `processes <= 1`, there are fewer than two items, or this is itself one
    of the children (a step nested in another's item: the cores are taken already, and a daemonic child may
    not start processes of its own)."""
    items = list(items)
    count = min(processes, len(items))
    if count <= 1 or _IN_CHILD:
        return [fn(x) for x in items]
    global _JOB
    _JOB = (fn, items, threads_each)
    context = multiprocessing.get_context("fork")
    children: list[tuple[Any, Any]] = []  # (process, the parent's end of its pipe)
    finished = False
    try:
        for _ in range(count):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_child, args=(child_end,), daemon=True, name="gnnc-compile")
            process.start()
            child_end.close()
            children.append((process, parent_end))
        results = _collect(children, len(items))
        finished = True
        return results
    finally:
        _JOB = None
        _stop(children, finished)


def _collect(children: list[tuple[Any, Any]], n: int) -> list[Any]:
    results: list[Any] = [None] * n
    following = 0  # the next item to hand out
    waiting: dict[Any, tuple[Any, int]] = {}  # pipe -> (process, the item it works on)
    for process, conn in children:
        if following < n:
            conn.send(following)
            waiting[conn] = (process, following)
            following += 1
    done = 0
    while done < n:
        ready = multiprocessing.connection.wait(list(waiting) + [p.sentinel for p, _ in waiting.values()])
        for conn in [c for c in waiting if c in ready]:
            process, item = waiting.pop(conn)
            try:
                ok, payload = conn.recv()
            except (EOFError, OSError):  # it ended while answering
                process.join(1.0)
                raise InternalError(f"a compile process ({process.name}, pid {process.pid}) {_ended(process)} "
                                    f"while working on item {item} of {n}") from None
            if not ok:
                error, text = payload
                if error is None:  # the child's exception could not be pickled: its traceback is all there is
                    raise InternalError(f"a compile process failed on item {item} of {n}:\n{text}")
                raise error from ChildTraceback(text)
            results[item] = payload
            done += 1
            if following < n:
                conn.send(following)
                waiting[conn] = (process, following)
                following += 1
        for conn, (process, item) in list(waiting.items()):
            if process.sentinel in ready and not conn.poll():  # gone with no answer in its pipe
                process.join(1.0)
                raise InternalError(f"a compile process ({process.name}, pid {process.pid}) {_ended(process)} "
                                    f"while working on item {item} of {n} (out of memory?)")
    return results


def _ended(process: Any) -> str:
    code = process.exitcode
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _stop(children: list[tuple[Any, Any]], finished: bool) -> None:
    """Every child told to finish (all items done) or terminated at once (a failure, an interrupt), then reaped."""
    for process, conn in children:
        if not finished:
            process.terminate()
            continue
        try:
            conn.send(None)
        except OSError:
            pass
    for process, conn in children:
        process.join(5.0)
        if process.is_alive():
            process.terminate()
            process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()


def _portable(err: BaseException) -> BaseException | None:
    """`err` where it comes back whole through the pipe, else None (the parent then raises its traceback's text):
    an exception travels as its class called again with its `args` (BaseException.__reduce__), which fails for one
    whose constructor takes other arguments; that call is made here, where a failure is still ours to catch."""
    try:
        rebuild, args = err.__reduce__()[:2]
        rebuild(*args)
        pickle.dumps(err)
    except Exception:
        return None
    return err


def _child(conn: Any) -> None:
    """A child's loop: an item's index in, (True, result) or (False, (exception, traceback text)) out."""
    assert _JOB is not None
    global _IN_CHILD
    _IN_CHILD = True
    fn, items, threads = _JOB
    # the parent's interrupt handler would raise KeyboardInterrupt here too: the parent decides, and stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "torch" in sys.modules:  # never import it for a child that does not use it
        sys.modules["torch"].set_num_threads(threads)
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if item is None:
            break
        try:
            answer: tuple[bool, Any] = (True, fn(items[item]))
        except BaseException as err:  # noqa: BLE001 -- every failure goes to the parent, which raises it
            answer = (False, (_portable(err), traceback.format_exc()))
        try:
            conn.send(answer)
        except Exception:  # an unpicklable result or exception: its text still reaches the parent
            conn.send((False, (None, traceback.format_exc() if answer[0] else answer[1][1])))
    conn.close()
    os._exit(0)  # no atexit handler of the parent's (its plan directory's clean-up, its progress bar) runs here
