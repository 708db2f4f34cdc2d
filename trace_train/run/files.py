"""Output folders that fail early, in one line: unwritable folders, full disks, a second run in one folder,
links planted by someone else.

- :func:`writable_dir` creates a folder and checks that it can be written, before any work is done,
  with a probe file of an unpredictable name created exclusively (``O_EXCL | O_NOFOLLOW``); a root
  caller's folder must be trusted (:func:`check_trusted_dir`: owned by root and writable by no one
  else, every folder above it owned by root or sticky), so no other user can have planted a link in it;
- :func:`open_no_follow`, :func:`write_file` (a temporary sibling renamed over the name, which replaces a
  link instead of writing through it) and :func:`subdir` (a folder that is not a link or a file) write
  a run directory's files without following links; a planted link is one line naming it;
- :class:`RunLock` holds ``<run_dir>/run.lock`` (``fcntl.flock``, exclusive) for a run's whole life, so
  a second run into the same folder is refused at once, naming the holder's pid. The kernel drops the
  lock when the holder exits, however it exits (a crash or ``kill -9`` included): a stale lock file
  never blocks a later run;
- :func:`reporting_full_disk` turns ``ENOSPC``/``EDQUOT`` while writing a file into
  :class:`OutOfSpaceError`, one line naming the file and the space left on its file system.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import socket
import stat
from pathlib import Path

__all__ = ["writable_dir", "RunLock", "RunDirBusyError", "OutOfSpaceError", "reporting_full_disk", "free_space",
           "check_trusted_dir", "open_no_follow", "write_file", "subdir", "UnsafePathError"]

_FULL = (errno.ENOSPC, errno.EDQUOT)


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create folder ``path`` (with parents) and check that a file can be written in it.

    Raises a ValueError naming ``what`` (for example "`run_dir`") and the reason when ``path`` is a
    file, or cannot be created or written (no permission, read-only file system), before any work is
    done that would be lost.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{what} {str(path)!r} is not writable: {err.strerror or err}") from None
    check_trusted_dir(path, what)
    try:
        probe = path / f".write-test-{secrets.token_hex(8)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{what} {str(path)!r} is not writable: {err.strerror or err}") from None
    return path


class UnsafePathError(ValueError):
    """A run directory's file or folder is a link, or a folder someone else could have planted it in."""


def check_trusted_dir(path: str | os.PathLike, what: str = "folder") -> None:
    """For a root caller, refuse ``path`` when another user can have planted something in it.

    ``path`` (after following links) must be owned by root and writable by no other user (no write bit
    for others; for its group only when the group is root's), no link on the way to it may belong to
    another user, and no folder above it may be writable by everyone without the sticky bit (``/tmp`` is
    fine). Other callers: nothing is checked (a folder they write is theirs; its files are still opened
    without following links). Folders above that belong to another user are not refused (a checkout
    mounted into a root container): that user could still swap the folder during the run."""
    if os.geteuid() != 0:
        return
    path = Path(os.path.abspath(path))
    walked = Path("/")
    for part in path.parts[1:]:
        walked = walked / part
        st = os.lstat(walked)
        if stat.S_ISLNK(st.st_mode) and st.st_uid != 0:
            raise UnsafePathError(f"{what} {str(path)!r}: {walked} is a link owned by uid {st.st_uid}; as root, "
                                  "use a folder only root can change")
    real = Path(os.path.realpath(path))
    st = os.stat(real)
    if st.st_uid != 0 or st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0):
        raise UnsafePathError(f"{what} {str(path)!r} is owned by uid {st.st_uid} (group {st.st_gid}) with mode "
                              f"{stat.S_IMODE(st.st_mode):o}: another user could plant links in it that root would "
                              "write through; as root, use a folder owned by root and writable by no one else")
    for parent in real.parents:
        st = os.stat(parent)
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(f"{what} {str(path)!r}: {parent} above it is writable by everyone (mode "
                                  f"{stat.S_IMODE(st.st_mode):o}, no sticky bit), so anyone could replace the folder")


def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)`` of a regular file; a link (or a FIFO, a device, a
    folder) at ``path`` is an :class:`UnsafePathError` naming it."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link; refusing to write through it (remove it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path} is not a regular file; refusing to use it (remove it)")
    os.set_blocking(fd, True)
    return fd


def write_file(path: str | os.PathLike, text: str, what: str = "writing") -> None:
    """Write ``text`` to ``path`` atomically: a temporary sibling (``O_EXCL``, random name), renamed over
    ``path``; a link at ``path`` is replaced, never written through. A full disk is an
    :class:`OutOfSpaceError` naming ``path``."""
    path = Path(path)
    with reporting_full_disk(path, what):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            try:
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def subdir(parent: str | os.PathLike, name: str) -> Path:
    """``parent/name`` as a folder, created if needed; a link or a file there is an
    :class:`UnsafePathError` naming it."""
    path = Path(parent) / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link; refusing to write through it (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} is a file, not a folder (remove it)")
    return path


class RunDirBusyError(ValueError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/run.lock``, held from :meth:`acquire` to :meth:`release`.

    The file records the holder's pid and host (for the refusal message only: the lock itself is the
    kernel's, so it is released when the holder dies). Locks are per open file, so a second
    :class:`RunLock` on the same folder is refused even within one process.
    """

    NAME = "run.lock"

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # a planted link: one line
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirBusyError(f"{self.path.parent} is in use by another run ({holder}); wait for it to end, "
                                  "stop it, or use another run_dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"


class OutOfSpaceError(RuntimeError):
    """A write failed because the file system is full (or the user's quota is spent); names the file."""


def free_space(path: str | os.PathLike) -> str:
    """Free space of the file system holding ``path`` (its nearest existing parent), e.g. "1.2 MB"."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "unknown"
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if free < 1000 or unit == "TB":
            return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
        free /= 1000
    return "unknown"  # pragma: no cover


@contextlib.contextmanager
def reporting_full_disk(path: str | os.PathLike, what: str = "writing"):
    """Run the block; an ``OSError`` ENOSPC/EDQUOT in it becomes :class:`OutOfSpaceError` naming ``path``."""
    try:
        yield
    except OSError as err:
        if err.errno not in _FULL:
            raise
        reason = "disk quota exceeded" if err.errno == errno.EDQUOT else "no space left on the device"
        raise OutOfSpaceError(f"{what} {path}: {reason} ({free_space(path)} free there)") from None
