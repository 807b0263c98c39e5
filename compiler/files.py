"""Atomic file writes: readers see the old file or the new one, never a part.

Plans, checkpoints, shards, cached graphs, cluster profiles and the
launcher's result files all go through here. The temporary file lives in
the destination's directory (os.replace is atomic only within one file
system) and is fsynced before the rename; the directory is fsynced after it,
so the rename itself survives a power cut.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """`with atomic_writer(p) as f: ...` writes `p` atomically (nothing is left on an error)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically (written with os.write in 1 MiB chunks)."""
    with atomic_writer(path) as f:
        view = memoryview(data)
        while view:
            view = view[os.write(f.fileno(), view[: 1 << 20]):]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
