"""Atomic file writes: readers see the old file or the new one, never a part; and bounded reads of text inputs.

Plans, checkpoints, shards, cached graphs, cluster profiles and the
launcher's result files all go through here. The temporary file lives in
the destination's directory (os.replace is atomic only within one file
system) and is fsynced before the rename; the directory is fsynced after it,
so the rename itself survives a power cut.

Inside a `fresh_directory` (a plan being written: a new hidden directory that
is swapped in whole when complete) a file is written under its own name and
fsynced, and each directory that received files is fsynced once at the end
(`fresh_directory`'s docstring says why that is as atomic and as durable).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator

from gnnc.errors import GnncError

# The largest text file gnnc reads by path (a .gnn model, a cluster profile). The largest shipped model is
# under 10 KiB and a profile a few KiB: 16 MiB is far beyond any real one, and refusing above it keeps a
# wrong path (/dev/zero, a FIFO, a multi-GB log) from being read until the kernel kills the process.
MAX_TEXT_INPUT_BYTES = 16 << 20


# fresh directories being filled (absolute paths) -> the directories in them that received a file, to fsync at the
# end; shared by threads (the plan shards' writer puts its files in place on a thread of its own)
_FRESH: dict[str, set[str]] = {}
_FRESH_LOCK = threading.Lock()


@contextlib.contextmanager
def fresh_directory(path: str | os.PathLike) -> Iterator[Path]:
    """`with fresh_directory(d): ...` the files `atomic_writer` (and `temporary_for`/`into_place`) write under the
    new, empty directory `d` are written under their own names, each fsynced, and every directory under `d` that
    received one (and `d`) is fsynced once when the block ends without an error. `d` must be a directory this
    process has just made under a name no reader opens (`Plan.save`'s hidden `.NAME.new-*`), and the caller must
    make it visible in one rename after the block, then fsync that rename's directory (`Plan.save`'s swap).

    Why that is as atomic and as durable as a temporary file and a rename per file (one fsync of each file, one of
    each directory, where each file took a file fsync, a rename and a directory fsync: 17 fsyncs for the 64-layer
    example's plan on 4 workers, 11 now):
    - atomic: no reader looks inside `d` before the swap, so a file there is never seen half-written; a crash or
      an error leaves a half-filled hidden directory, never the plan (`Plan.save` removes it on an error);
    - durable: a file's fsync puts its data and inode on the disk, a directory's fsync the entries made in it (the
      files' names, and a subdirectory's), all of them before the swap's rename is issued; the swap's own fsync of
      the parent then makes the rename durable. After a power cut the plan is the old one, or the new one whole,
      as with a rename per file. A file fsynced before its directory's entry is durable is not lost: the
      directory's fsync follows before anything can name it.
    A file that exists already (only possible if something else wrote into `d`) is written the usual way."""
    key = os.path.abspath(path)
    with _FRESH_LOCK:
        if key in _FRESH:
            raise ValueError(f"{key} is being filled already")
        _FRESH[key] = {key}
    ok = False
    try:
        yield Path(path)
        ok = True
    finally:
        with _FRESH_LOCK:
            touched = _FRESH.pop(key)
        if ok:
            for directory in sorted(touched, key=len, reverse=True):  # the deepest first; any order would do
                _fsync_dir(Path(directory))


def _in_fresh(directory: Path) -> bool:
    """Whether `directory` is (in) a `fresh_directory` being filled; if so it is noted for that one's fsync."""
    if not _FRESH:
        return False
    here = os.path.abspath(directory)
    with _FRESH_LOCK:
        for root, touched in _FRESH.items():
            if here == root or here.startswith(root + os.sep):
                touched.add(here)
                return True
    return False


def temporary_for(path: Path) -> tuple[int, str]:
    """(an open descriptor, its path) of a new file to write `path` through, which `into_place` then puts in place:
    a temporary beside `path` (made as tempfile.mkstemp makes it: mode 0600), or `path` itself inside a
    `fresh_directory` (with the same mode, refusing to open what is there already)."""
    if _in_fresh(path.parent):
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), str(path)
        except FileExistsError:
            pass  # not ours: through a temporary file, as anywhere else
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """`with atomic_writer(p) as f: ...` writes `p` atomically (nothing is left on an error; in a
    `fresh_directory`, the file itself is written)."""
    path = Path(path)
    fd, tmp = temporary_for(path)
    f = os.fdopen(fd, "wb")
    try:
        yield f
    except BaseException:
        f.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    into_place(f, tmp, path)


def into_place(f: IO[bytes], tmp: str, path: Path) -> None:
    """Make the written temporary file `tmp` (open as `f`, closed here) be `path` durably: fsync, rename, the
    directory's fsync; `tmp` is removed if that fails. atomic_writer's last step, and the plan shards' writer's,
    which runs it on its own thread. `tmp` is `path` itself in a `fresh_directory` (`temporary_for`): fsynced, not
    renamed, its directory fsynced once by the `fresh_directory`."""
    try:
        with f:
            f.flush()
            os.fsync(f.fileno())
        if tmp != str(path):
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if tmp != str(path) or not _in_fresh(path.parent):
        _fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically (written with os.write in 1 MiB chunks)."""
    with atomic_writer(path) as f:
        view = memoryview(data)
        while view:
            view = view[os.write(f.fileno(), view[: 1 << 20]):]


def writable_file(path: str, flag: str) -> None:
    """Refuse an output file that could not be written: a directory, in a missing or read-only directory.

    A missing directory is refused, not made: a typo in a path should not grow a tree (PyG and torch
    do not create one either)."""
    p = Path(path)
    if p.is_dir():
        raise GnncError(f"{flag} {path}: is a directory; name a file")
    if not p.parent.is_dir():
        what = "is not a directory" if p.parent.exists() else "does not exist"
        raise GnncError(f"{flag} {path}: directory {p.parent} {what}; create it first or name another file")
    if not os.access(p.parent, os.W_OK | os.X_OK) and not os.access(p, os.W_OK):
        raise GnncError(f"{flag} {path}: directory {p.parent} is not writable")


def file_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks (a shard or a graph store's array can be GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_text_input(path: str | os.PathLike, what: str, limit: int = MAX_TEXT_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file `path`, refused (GnncError, "{what}: ...") when it is not a regular file
    (a FIFO, a device, a directory) or holds more than `limit` bytes.

    Opened with O_NONBLOCK so a FIFO nobody writes to is refused instead of blocking the open, and checked with
    fstat on the opened descriptor (not a second lookup of the name); at most `limit` + 1 bytes are read, so a
    file that grows after the check is still bounded.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise GnncError(f"{what}: cannot read it: no such file") from None
    except OSError as err:
        raise GnncError(f"{what}: cannot read it ({err.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise GnncError(f"{what}: is {kind}; gnnc reads only regular files")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as err:
            raise GnncError(f"{what}: cannot read it ({err.strerror})") from None
    if len(data) > limit:
        raise GnncError(f"{what}: larger than {limit >> 20} MiB, the most gnnc reads of a text input "
                        f"({info.st_size} bytes); is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GnncError(f"{what}: not UTF-8 text (byte {err.start}: {err.reason})") from None


# --- private directories ---------------------------------------------------------------------------
# The caches of compiled libraries (loaded as code) and of converted graphs (trained on as data) must be out of
# other users' reach, and that is a property of the whole path, not of its last directory: whoever can write any
# directory above can rename the cache away and put their own in its place between a check and a use.

# The most symbolic links one path may go through (Linux's own limit, MAXSYMLINKS).
MAX_LINKS = 40
# How a directory on the way is opened: O_PATH needs no read permission (a home directory may be 0711).
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPathError(OSError):
    """A directory on the way to a private directory can be changed by another user."""


@contextlib.contextmanager
def private_dir(path: str | os.PathLike) -> Iterator[int]:
    """`with private_dir(p) as fd:` a descriptor of directory `p` that only this user (and root) can change.

    Every directory from / down is opened relative to the one above it, never following a symbolic link
    by name: each must belong to this user or root and be writable by no one else, unless it is sticky
    (as /tmp: others cannot rename or remove what is not theirs there); the last must be this user's own
    and writable by no one else. A symbolic link met on the way must be this user's or root's (in a
    directory that passed, only a sticky one lets others make links); its target is walked the same way.
    Missing directories are made 0700. Work inside through `fd` (`dir_fd=`, or `fd_path`), so that the
    checked directory is the one used. UntrustedPathError names the directory that fails; other OSErrors
    pass through.
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        text = os.path.join(os.getcwd(), text)
    todo = text.split("/")[::-1]  # names still to walk, the next one last
    chain = [os.open("/", _DIR_FLAGS)]  # the descriptors from / to where the walk is
    names: list[str] = []
    try:
        _check_dir(chain[0], "/", last=False)
        links = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if names:
                    os.close(chain.pop())
                    names.pop()
                continue
            here = "/" + "/".join([*names, name])
            target = _link_target(name, chain[-1], here)
            if target is not None:
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"too many levels of symbolic links in {text}")
                if target.startswith("/"):
                    while names:
                        os.close(chain.pop())
                        names.pop()
                todo.extend(target.split("/")[::-1])
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=chain[-1])
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # made meanwhile: checked below like any other
                    os.mkdir(name, 0o700, dir_fd=chain[-1])
                fd = os.open(name, _DIR_FLAGS, dir_fd=chain[-1])
            chain.append(fd)
            names.append(name)
            _check_dir(fd, here, last=not any(n not in ("", ".") for n in todo))
        _check_dir(chain[-1], "/" + "/".join(names), last=True)
        last = chain.pop()
    finally:
        for fd in chain:
            os.close(fd)
    try:
        yield last
    finally:
        os.close(last)


def _link_target(name: str, dir_fd: int, where: str) -> str | None:
    """What the symbolic link `name` in `dir_fd` points to, or None when it is not a link (or not there).
    In a sticky directory others can make links too: one that is not this user's or root's is refused."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    if st.st_uid not in (os.getuid(), 0):
        raise UntrustedPathError(f"{where} is a symbolic link of uid {st.st_uid}, not of this user or root")
    return os.readlink(name, dir_fd=dir_fd)


def _check_dir(fd: int, where: str, last: bool) -> None:
    st = os.fstat(fd)
    me = os.getuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPathError(f"{where} is not a directory")
    if st.st_uid != me and (last or st.st_uid != 0):
        owner = "this user" if last else "this user or root"
        raise UntrustedPathError(f"{where} is owned by uid {st.st_uid}, not by {owner} (uid {me})")
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        raise UntrustedPathError(f"{where} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}"
                                 f"{'' if last else ', not sticky'})")


def fd_path(dir_fd: int, name: str = "") -> str:
    """A path to `name` inside the directory `dir_fd` holds open, for a program that takes paths (a compiler,
    dlopen): /proc/PID/fd/N leads to the directory itself, whatever has been renamed since it was opened,
    and works in this process's children too. Linux only; elsewhere OSError."""
    base = f"/proc/{os.getpid()}/fd/{dir_fd}"
    if not os.path.isdir(base):
        raise OSError(errno.ENOTSUP, f"no {base} on this system to reach an open directory by")
    return f"{base}/{name}" if name else base
