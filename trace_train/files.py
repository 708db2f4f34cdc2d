"""Output folders that fail early, in one line, when they cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["writable_dir"]


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
