"""Output folders that fail early, in one line: unwritable folders, full disks, a second run in one folder.

- :func:`writable_dir` creates a folder and checks that it can be written, before any work is done;
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
import shutil
import socket
from pathlib import Path

__all__ = ["writable_dir", "RunLock", "RunDirBusyError", "OutOfSpaceError", "reporting_full_disk", "free_space"]

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
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{what} {str(path)!r} is not writable: {err.strerror or err}") from None
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
