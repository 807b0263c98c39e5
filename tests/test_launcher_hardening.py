"""Inputs and launches a hostile user tried (issue 40, item 3): unbounded text inputs, every rank stopped,
sampled runs past the memory check, and the launcher's refusals of a bad environment."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from conftest import EXAMPLES, ROOT

from gnnc.cluster import load_profile
from gnnc.errors import GnncError
from gnnc.files import read_text_input
from gnnc.model_file import load_model


def gnnc(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
         memory_limit: int | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; `memory_limit` bounds its address space, so a command that reads without end fails fast
    (MemoryError) instead of taking the machine's memory."""
    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=None if env is None else {**os.environ, **env}, preexec_fn=limit)


# --- unbounded text inputs ---------------------------------------------------------------------------


def test_check_dev_zero_is_refused_at_once() -> None:
    # Before: read /dev/zero until the OOM killer (22.5 GB); here until the 2 GiB limit, then a traceback.
    r = gnnc("check", "/dev/zero", timeout=60, memory_limit=2 << 30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: /dev/zero: is a device; gnnc reads only regular files"


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Bound a call that would block forever without the fix (SIGALRM raises in the main thread)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_model_file_fifo_directory_and_size(tmp_path) -> None:
    fifo = tmp_path / "model.gnn"
    os.mkfifo(fifo)
    # Before: open() of a FIFO with no writer blocked forever.
    with alarm(10), pytest.raises(GnncError, match=r"model.gnn: is a FIFO; gnnc reads only regular files"):
        load_model(fifo)
    with pytest.raises(GnncError, match=r": is a directory"):
        load_model(tmp_path)
    big = tmp_path / "big.gnn"
    big.write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(GnncError, match=r"big.gnn: larger than 16 MiB"):
        load_model(big)
    big.write_bytes(b"\xff\xfe")
    with pytest.raises(GnncError, match=r"big.gnn: not UTF-8 text"):
        load_model(big)


def test_cluster_profile_uses_the_same_bounded_reader(tmp_path) -> None:
    fifo = tmp_path / "cluster.json"
    os.mkfifo(fifo)
    with alarm(10), pytest.raises(GnncError, match=r"cluster profile .*cluster.json: is a FIFO"):
        load_profile(fifo)
    big = tmp_path / "c.json"
    big.write_bytes(b" " * 100)
    with pytest.raises(GnncError, match=r"larger than 0 MiB"):
        read_text_input(big, str(big), limit=99)
    assert read_text_input(big, str(big), limit=100) == " " * 100
