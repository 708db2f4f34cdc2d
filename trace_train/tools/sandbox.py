"""Sandboxed execution of model-written Python code, one-shot or as a persistent ReAct session.

Every run starts a fresh interpreter in a separate process (``_sandbox_child.py`` describes the process
tree) inside a throwaway working directory, and returns a :class:`SandboxResult` whose
:meth:`~SandboxResult.observation` is the text the model reads. Nothing the code does raises in the
caller: limits, crashes and timeouts all become results.

What is enforced, and where
---------------------------
Kernel (cannot be lifted from inside, because the code runs without privileges to raise hard limits):

- ``RLIMIT_CPU`` = ``cpu_seconds`` (SIGXCPU, then SIGKILL one second later), ``RLIMIT_AS`` =
  ``memory_bytes`` (allocations fail with MemoryError), ``RLIMIT_FSIZE`` = ``max_file_bytes``,
  ``RLIMIT_NOFILE`` = ``max_open_files``, ``RLIMIT_CORE`` = 0, all with soft = hard.
- ``RLIMIT_NPROC`` = (processes the sandbox user already has) + ``max_processes``. Linux counts this limit
  per user and ignores it for root, so when the caller is root the code runs as the unprivileged
  ``sandbox_uid``/``sandbox_gid`` (default nobody); sandboxes running at the same time share that count.
  As that user the code can write only to its working directory and to world-writable directories.
- New network namespace (no interface but a loopback that is down: no network at all, not even to the
  host's loopback) and new PID namespace whose init is the sandbox's own reaper: when a run ends, every
  process it started is killed, including ones that left the process group. When the caller is not root
  a user namespace is created as well; if the kernel refuses namespaces, ``namespaces="auto"`` carries on
  without them (reported in :attr:`SandboxResult.isolation`) and ``"require"`` fails the run.
- New mount namespace. When the code will run as the sandbox user, every directory on the way to the
  interpreter's ``sys.path`` that others may not traverse (``/root`` when Python lives there) is
  covered with an empty tmpfs into which only the interpreter's directories are bind-mounted back:
  the code can import the standard library and the installed packages and sees nothing else there.
  Without namespaces this is impossible, and such an interpreter can then import only the modules it
  had loaded before dropping privileges.

Parent (this module):

- Wall-clock timeout: the whole process group is killed with SIGKILL at ``wall_seconds``.
- Output: the first ``max_output_bytes`` of stdout and of stderr are kept; the rest is read and dropped,
  so a flood of output cannot exhaust the caller's memory.
- Environment: a minimal fixed environment (no inherited variables, so no secrets and no PYTHONPATH),
  ``PYTHONHASHSEED`` and ``random`` seeded with ``seed``; the working directory is deleted afterwards.

Interpreter (an audit hook installed before the code runs; hooks cannot be removed):

- Creating any socket raises PermissionError; opening a file for writing, or removing, renaming,
  linking or changing a path outside the working directory raises PermissionError. The hook sees
  Python-level operations only; native code and subprocesses are contained by the kernel layers above.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_NAMESPACE_MODES = ("auto", "require", "off")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits and isolation settings of one sandboxed run."""

    wall_seconds: float = 10.0
    """Wall-clock limit; the process group is killed when it is reached."""
    cpu_seconds: int = 5
    """CPU-time limit per process (RLIMIT_CPU)."""
    memory_bytes: int = 1 << 30
    """Address-space limit per process (RLIMIT_AS)."""
    max_processes: int = 16
    """Processes the code may add for the sandbox user (RLIMIT_NPROC headroom)."""
    max_file_bytes: int = 16 << 20
    """Largest file the code may write (RLIMIT_FSIZE)."""
    max_open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_output_bytes: int = 8192
    """Bytes kept from each of stdout and stderr."""
    sandbox_uid: int = 65534
    """User the code runs as when the caller is root."""
    sandbox_gid: int = 65534
    """Group the code runs as when the caller is root."""
    namespaces: str = "auto"
    """``"auto"`` (use network and PID namespaces when the kernel allows), ``"require"`` or ``"off"``."""
    seed: int = 0
    """Seed of ``random`` and of ``PYTHONHASHSEED``, so that replayed cells recompute the same state."""

    def __post_init__(self):
        if not self.wall_seconds > 0:
            raise ValueError(f"`wall_seconds` must be positive, got {self.wall_seconds!r}")
        for name in (
            "cpu_seconds",
            "memory_bytes",
            "max_processes",
            "max_file_bytes",
            "max_open_files",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        for name in ("sandbox_uid", "sandbox_gid", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}")
        if self.sandbox_uid == 0 or self.sandbox_gid == 0:
            raise ValueError("`sandbox_uid` and `sandbox_gid` must not be 0 (root)")
        if self.namespaces not in _NAMESPACE_MODES:
            raise ValueError(f"`namespaces` must be one of {_NAMESPACE_MODES}, got {self.namespaces!r}")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    ``status`` is one of ``"ok"`` (exit code 0), ``"error"`` (the code raised or exited non-zero),
    ``"timeout"`` (wall clock), ``"cpu_limit"`` (SIGXCPU), ``"memory_limit"`` (the code died of a
    MemoryError), ``"file_size_limit"`` (it died writing past ``max_file_bytes``), ``"killed"``
    (another signal, e.g. SIGKILL after an ignored SIGXCPU) or ``"sandbox_error"`` (the sandbox could
    not start; ``stderr`` says why).
    """

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    wall_seconds: float
    truncated_bytes: int = 0
    """Output bytes dropped beyond ``max_output_bytes`` (both streams together)."""
    isolation: tuple[str, ...] = field(default_factory=tuple)
    """Isolation layers the child confirmed before running the code."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def observation(self) -> str:
        """The text shown to the model: output, errors and, unless ``ok``, why the run stopped."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append(self.stderr.rstrip("\n"))
        if self.truncated_bytes:
            parts.append(f"[output truncated: {self.truncated_bytes} more bytes]")
        if not self.ok:
            parts.append(f"[execution stopped: {_STATUS_TEXT[self.status]}]")
        return "\n".join(parts) if parts else "[no output]"


_STATUS_TEXT = {
    "error": "the code raised an error or exited with a non-zero status",
    "timeout": "wall-clock time limit exceeded",
    "cpu_limit": "CPU time limit exceeded",
    "memory_limit": "memory limit exceeded",
    "file_size_limit": "file size limit exceeded",
    "killed": "the process was killed",
    "sandbox_error": "the sandbox failed to start",
}


def run_python(code: str, *, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return its result (never raises for bad code)."""
    if not isinstance(code, str):
        raise TypeError(f"`code` must be a str, got {type(code).__name__}")
    return _run_cells((code,), replay=0, limits=limits)


class PythonSession:
    """A persistent Python tool for ReAct episodes: variables survive from one call to the next.

    The state is the tuple of cells run so far. Each :meth:`run` starts a fresh sandbox, replays the
    earlier cells silently (same seed, same working directory contents recreated) and then runs the new
    one, so :meth:`snapshot` is a tuple copy and :meth:`restore` is exact for code whose result depends
    only on the seeded ``random`` module, ``PYTHONHASHSEED`` and its own inputs (not on the clock or
    ``os.urandom``). Limits apply to the whole replay. A cell that raised stays in the history (as in a
    notebook, its effects up to the error persist); a cell stopped by a limit or timeout is dropped, and
    the session continues from the state before it.
    """

    def __init__(self, *, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        self._cells: tuple[str, ...] = ()

    @property
    def cells(self) -> tuple[str, ...]:
        return self._cells

    def run(self, code: str) -> SandboxResult:
        """Run one cell on top of the session's state; return its result."""
        if not isinstance(code, str):
            raise TypeError(f"`code` must be a str, got {type(code).__name__}")
        result = _run_cells(self._cells + (code,), replay=len(self._cells), limits=self.limits)
        if result.status in ("ok", "error"):
            self._cells += (code,)
        return result

    def snapshot(self) -> tuple[str, ...]:
        """The session's state: the cells run so far."""
        return self._cells

    def restore(self, snapshot: tuple[str, ...]) -> None:
        """Return to a state taken by :meth:`snapshot` (of this or any session)."""
        if not isinstance(snapshot, tuple) or not all(isinstance(cell, str) for cell in snapshot):
            raise ValueError("`snapshot` must be a tuple of code strings from PythonSession.snapshot()")
        self._cells = snapshot


# ----------------------------------------------------------------------------------------------------


def _run_cells(cells: tuple[str, ...], *, replay: int, limits: SandboxLimits) -> SandboxResult:
    drop = [limits.sandbox_uid, limits.sandbox_gid] if os.geteuid() == 0 else None
    workdir = tempfile.mkdtemp(prefix="trace-sandbox-")
    report_read, report_write = os.pipe()
    start = time.monotonic()
    try:
        if drop:
            os.chown(workdir, *drop)
        request = {
            "cells": list(cells),
            "replay": replay,
            "workdir": workdir,
            "limits": asdict(limits),
            "drop_to": drop,
            "namespaces": limits.namespaces,
            "seed": limits.seed,
            "report_fd": report_write,
        }
        process = subprocess.Popen(
            [sys.executable, "-s", "-P", str(_CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_child_environment(limits, workdir),
            start_new_session=True,
            pass_fds=(report_write,),
        )
        os.close(report_write)
        report_write = -1
        try:
            process.stdin.write(json.dumps(request).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        streams, dropped, timed_out = _collect(process, report_read, limits, start)
        _kill_group(process)
        exit_code = process.wait()
    finally:
        for fd in (report_read, report_write):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    stdout, stderr, report = (
        streams[key].decode("utf-8", "replace") for key in ("stdout", "stderr", "report")
    )
    isolation = tuple(json.loads(report)["isolation"]) if report else ()
    status = _classify(exit_code, stderr, timed_out, started=bool(report))
    return SandboxResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        exit_code=None if timed_out else exit_code,
        wall_seconds=time.monotonic() - start,
        truncated_bytes=dropped,
        isolation=isolation,
    )


def _child_environment(limits: SandboxLimits, workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": str(limits.seed),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def _collect(process: subprocess.Popen, report_fd: int, limits: SandboxLimits, start: float):
    """Read stdout, stderr and the isolation report until all close or the wall clock runs out."""
    keep = {"stdout": limits.max_output_bytes, "stderr": limits.max_output_bytes, "report": 1 << 16}
    streams = {key: bytearray() for key in keep}
    dropped = 0
    timed_out = False
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ, "stdout")
    selector.register(process.stderr, selectors.EVENT_READ, "stderr")
    selector.register(report_fd, selectors.EVENT_READ, "report")
    deadline = start + limits.wall_seconds
    while selector.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if timed_out:  # pipes still held open after the kill: give up on them
                break
            timed_out = True
            _kill_group(process)
            deadline = time.monotonic() + 1.0
            continue
        for key, _ in selector.select(remaining):
            data = os.read(key.fd, 65536)
            if not data:
                selector.unregister(key.fileobj)
                continue
            room = keep[key.data] - len(streams[key.data])
            streams[key.data] += data[: max(room, 0)]
            dropped += max(len(data) - max(room, 0), 0) if key.data != "report" else 0
    selector.close()
    process.stdout.close()
    process.stderr.close()
    return streams, dropped, timed_out


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(exit_code: int, stderr: str, timed_out: bool, *, started: bool) -> str:
    if timed_out:
        return "timeout"
    if not started:
        return "sandbox_error"
    signals = {128 + signal.SIGXCPU: "cpu_limit", 128 + signal.SIGXFSZ: "file_size_limit"}
    if exit_code in signals:
        return signals[exit_code]
    if exit_code > 128:
        return "killed"
    if exit_code == 0:
        return "ok"
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if last_line.startswith("MemoryError"):
        return "memory_limit"
    # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE fails with EFBIG instead of killing it.
    return "file_size_limit" if f"[Errno {errno.EFBIG}]" in last_line else "error"
