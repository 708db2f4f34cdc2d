"""Sandboxed execution of model-written Python code, one-shot or as a persistent ReAct session.

Every run starts a fresh interpreter in a separate process (``_sandbox_child.py`` describes the process
tree) inside a throwaway working directory, and returns a :class:`SandboxResult` whose
:meth:`~SandboxResult.observation` is the text the model reads. Nothing the code does raises in the
caller: limits, crashes and timeouts all become results.

What is enforced, and where
---------------------------
The tools README's security model lists each guarantee with the test that checks it, for root and for
non-root callers; ``_sandbox_child.py`` describes the process tree. In short:

- Kernel namespaces (``namespaces="auto"`` or ``"require"``): new network namespace (no network, not
  even the host's loopback), PID namespace whose init reaps and kills everything the code started and
  whose own ``/proc`` hides the host's processes (its init also kills everything at the wall clock),
  IPC namespace, mount namespace whose root is a new one (``pivot_root``) holding only what the
  interpreter needs: the system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc``), the
  interpreter's prefix, standard library and site-packages (this package's own directory, which ships
  data, covered), a minimal ``/dev`` (no terminal); no ``/home``, ``/root``, data, Hugging Face cache or
  checkout, so code cannot read the training set's answers. Every mount is read-only except
  fresh size-limited tmpfs file systems on the working directory, ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` (private to the call, gone when it ends), and, for a non-root caller, an unprivileged user
  namespace (its capabilities are dropped before the code runs). With ``"auto"`` a kernel that refuses
  any of this costs one :class:`IsolationWarning` naming what is missing; with ``"require"``
  :class:`PythonSession` raises :class:`SandboxUnavailableError` when it is created.
- Kernel filters, with or without namespaces: resource limits (soft = hard) on CPU time, address space,
  file size, open files, core files and processes; ``no_new_privs``; a seccomp filter refusing
  ``socket(2)`` (every family, so the host's pathname Unix sockets too), ``ptrace(2)``,
  ``process_vm_readv/writev``, io_uring, SysV IPC, POSIX queues, keyrings, ``memfd_create``,
  ``TIOCSTI``/``TIOCLINUX``; a Landlock domain where the kernel has it (ABI >= 6):
  writes only beneath the working directory and the private temporary directories, no signals or
  ptrace to processes outside the run, no TCP. A root caller runs the code as ``sandbox_uid``.
- Parent (this module): wall-clock timeout (SIGKILL to the process group), output cap, a minimal fixed
  environment, a throwaway working directory.
- Interpreter: an audit hook (cannot be removed) refuses sockets, ``sqlite3`` connections, and file
  writes, removals, renames, links and mode changes outside the working directory (``dir_fd`` and
  file-descriptor forms included). It is a second line for Python-level calls; native code and
  subprocesses are held by the kernel layers.
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
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_NAMESPACE_MODES = ("auto", "require", "off")
_REQUIRED_LAYERS = ("network-namespace", "pid-namespace", "ipc-namespace", "mount-namespace",
                     "read-only-filesystem", "private-tmp", "private-root", "private-proc", "seccomp")


class IsolationWarning(RuntimeWarning):
    """The kernel refused part of the configured isolation (``namespaces="auto"`` carried on)."""


class SandboxUnavailableError(RuntimeError):
    """``namespaces="require"`` and the kernel refused part of the isolation."""


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
    """Processes the code may add (RLIMIT_NPROC headroom). RLIMIT_NPROC counts the processes of a (user
    namespace, uid) pair (Linux >= 5.14), and the code runs in a user namespace of its own (a root caller's
    ``sandbox_uid`` too: layer ``own-process-count``), so only the run's own processes count; without
    namespaces the limit counts every process of that uid, and a refused ``fork`` says so."""
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
    scratch_bytes: int = 64 << 20
    """Size of each private tmpfs (working directory, ``/tmp``, ``/var/tmp``, ``/dev/shm``)."""
    namespaces: str = "auto"
    """``"require"`` (fail when the kernel refuses a namespace layer: what a real training run should
    set), ``"auto"`` (carry on without, with one :class:`IsolationWarning`) or ``"off"``."""
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
            "scratch_bytes",
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
    missing: tuple[str, ...] = field(default_factory=tuple)
    """Why configured layers are absent (``"unshare: Operation not permitted"``); empty when none are."""
    finished: bool = False
    """The last cell returned (False when a limit or the code itself, e.g. ``os._exit``, ended the run)."""

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
    ``os.urandom``). Limits apply to the whole replay. A cell that raised or called ``sys.exit`` stays in
    the history (as in a notebook, its effects up to that point persist); a cell stopped by a limit or
    timeout, or one that ended the interpreter itself (``os._exit``), is dropped, and the session
    continues from the state before it.
    """

    def __init__(self, *, limits: SandboxLimits = SandboxLimits()):
        check_isolation(limits)
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
        if result.status in ("ok", "error") and result.finished:
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


def expected_layers(limits: SandboxLimits) -> tuple[str, ...]:
    """The isolation layers ``limits`` asks for, for this caller (user namespace when not root)."""
    if limits.namespaces == "off":
        return ()
    return (("user-namespace",) if os.geteuid() != 0 else ()) + _REQUIRED_LAYERS


_CHECKED: dict[tuple, tuple[str, ...]] = {}
_WARNED: set[tuple[str, ...]] = set()


def check_isolation(limits: SandboxLimits = SandboxLimits()) -> tuple[str, ...]:
    """Start one sandbox (once per process and setting) and return the isolation layers it obtained.

    Raises :class:`SandboxUnavailableError` when ``limits.namespaces == "require"`` and a layer is
    missing, so that a training run on a host without them fails at start-up; with ``"auto"`` the
    missing layers are reported once by an :class:`IsolationWarning`.
    """
    key = (limits.namespaces, os.geteuid(), limits.sandbox_uid, limits.sandbox_gid)
    if limits.namespaces == "off":
        return ()
    if key not in _CHECKED:
        result = _run_cells(("pass",), replay=0, limits=limits)
        if result.status != "ok":
            raise SandboxUnavailableError(f"the Python sandbox cannot start: {result.stderr.strip()}")
        _CHECKED[key] = result.isolation
    return _CHECKED[key]


def _report_missing(limits: SandboxLimits, isolation: tuple[str, ...], missing: tuple[str, ...]) -> None:
    absent = tuple(layer for layer in expected_layers(limits) if layer not in isolation)
    if not absent or absent in _WARNED:
        return
    _WARNED.add(absent)
    warnings.warn(
        f"sandbox isolation is degraded: the kernel refused {', '.join(absent)} ({'; '.join(missing)}); "
        f"model-written code runs with only {', '.join(isolation)}. Set the sandbox's "
        "namespaces='require' to fail instead.",
        IsolationWarning,
        stacklevel=4,
    )


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
    if f"[Errno {errno.EAGAIN}] Resource temporarily unavailable" in stderr:
        stderr += _process_limit_note(limits, report)
    header, _, rest = report.partition("\n")
    layers = json.loads(header)["isolation"] if header else []
    isolation = tuple(layer for layer in layers if not layer.startswith("missing: "))
    missing = tuple(layer.removeprefix("missing: ") for layer in layers if layer.startswith("missing: "))
    if report:
        _report_missing(limits, isolation, missing)
    status = _classify(exit_code, stderr, timed_out, started=bool(report))
    return SandboxResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        exit_code=None if timed_out else exit_code,
        wall_seconds=time.monotonic() - start,
        truncated_bytes=dropped,
        isolation=isolation,
        missing=missing,
        finished="finished" in rest.split(),
    )


def _process_limit_note(limits: SandboxLimits, report: str) -> str:
    """What a refused new process (EAGAIN) most likely met: the sandbox's process limit, and what it counts."""
    counted = ("this run's processes only" if "own-process-count" in report or "user-namespace" in report
               else f"every process of uid {limits.sandbox_uid if os.geteuid() == 0 else os.getuid()} on this machine "
                    "(no user namespace here)")
    return (f"\n[sandbox: a new process was refused: the limit is max_processes={limits.max_processes} more "
            f"processes, counting {counted}]\n")


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


CLEANUP_GRACE_S = 2.0
"""After the wall clock's kill, how long to wait for the sandbox's output pipes to close. Its reaper holds
them until it has killed and reaped every process the code started (or, as a PID namespace's init, the
kernel has), so their closing means nothing of the run is left; it has a second process group and its
own timer, so the caller's kill does not stop it midway. A second was too short on a loaded machine (a
fork bomb's processes still exiting after the call returned)."""

FLOOD_PAUSE_S = 0.01
"""Pause between reads of a stream already past ``max_output_bytes``: draining a cell that writes
without end cost the caller half a core; paced, a pipe's worth (64 KiB to 1 MiB) per pause."""


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
            deadline = time.monotonic() + CLEANUP_GRACE_S
            continue
        flooding = False
        for key, _ in selector.select(remaining):
            data = os.read(key.fd, 1 << 20)
            if not data:
                selector.unregister(key.fileobj)
                continue
            room = keep[key.data] - len(streams[key.data])
            streams[key.data] += data[: max(room, 0)]
            dropped += max(len(data) - max(room, 0), 0) if key.data != "report" else 0
            flooding = flooding or room <= 0
        if flooding:  # output past the cap is dropped: read it at a pace (the pipe makes the writer wait)
            time.sleep(FLOOD_PAUSE_S)
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
