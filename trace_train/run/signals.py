"""Stopping a run on SIGINT or SIGTERM: after the step under way, or at once on a second signal.

* **First signal:** the run finishes the step under way, checkpoints it and stops
  (:class:`RunInterrupted`, exit ``128 + signum``); the handler only sets :attr:`StopOnSignal.requested`.
* **Second signal:** the handler raises :class:`RunInterrupted` in the main thread at once (the newest
  checkpoint on disk is kept). Python runs signal handlers only between bytecodes of the main thread,
  so a main thread held in native code (a kernel launch, a C extension's loop) or joined to a stuck
  thread would never see it: the signals are therefore also written to a wakeup pipe
  (``signal.set_wakeup_fd``) that a watchdog thread reads, and when the process has not ended
  :data:`GRACE_S` seconds after the second signal, the watchdog flushes the standard streams, prints
  one line and ends the process with ``os._exit(128 + signum)``.
* **Stuck threads at exit:** :func:`finish_process` ends a command-line run after its last line is
  written: when a thread that is not a daemon is still alive (a stuck call that the interpreter would
  join at exit), it flushes the standard streams and calls ``os._exit`` with the run's exit code instead
  of waiting. The environment-call workers are daemon threads anyway (:mod:`..rollout.env_calls`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from typing import Callable

__all__ = ["RunInterrupted", "StopOnSignal", "finish_process", "GRACE_S"]

GRACE_S = 20.0
"""Seconds between a second signal and the watchdog's ``os._exit`` when the process has not ended."""

_JOIN_S = 5.0
"""How long :meth:`StopOnSignal.restore` waits for the watchdog to read the closed pipe and end."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM ended the run; ``signum`` says which, the message what was saved."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum


class StopOnSignal:
    """SIGINT and SIGTERM ask the run to stop after the current step; a second one stops it at once.

    Parameters
    ----------
    saved_step : callable
        Returns the step of the newest checkpoint on disk (None: none yet), for the messages.
    announce : bool
        Print the "stopping after this step" line (rank 0 only).
    prog : str
        The program name the lines start with.

    Installed in the main thread only (elsewhere it does nothing); :meth:`restore` puts the previous
    handlers and wakeup descriptor back and ends the watchdog.
    """

    def __init__(self, saved_step: Callable[[], int | None], *, announce: bool = True, prog: str = "trace-train",
                 grace_s: float = GRACE_S):
        self.saved_step, self.announce, self.prog, self.grace_s = saved_step, announce, prog, grace_s
        self.requested, self.forced, self.signum = False, False, 0
        self._previous: dict = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._ended = threading.Event()
        self._watchdog: threading.Thread | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._start_watchdog()

    # ---- the handler (main thread) -------------------------------------------------------------------

    def _saved(self) -> str:
        saved = self.saved_step()
        return "nothing saved since the start" if saved is None else \
            f"nothing saved since step {saved} (its checkpoint is kept)"

    def _handle(self, signum, frame) -> None:
        if self.requested:
            self.forced = True
            raise RunInterrupted(signum, self._saved())
        self.requested, self.signum = True, signum
        if self.announce:
            from .console import say  # on its own line, above the progress bar

            say(f"{self.prog}: stopping after this step (signal again to stop at once)")

    # ---- the watchdog (a daemon thread reading the wakeup pipe) --------------------------------------

    def _start_watchdog(self) -> None:
        try:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (OSError, ValueError):  # no pipes or not allowed here: the handler alone
            return
        self._wakeup = (r, w)
        args = (r, self._ended, self.grace_s, weakref.ref(self))
        self._watchdog = threading.Thread(target=_watch, args=args, name="trace-signal-watchdog", daemon=True)
        self._watchdog.start()

    def _exit_now(self, signum: int) -> None:
        """The watchdog's end of a held process: one line, then ``os._exit(128 + signum)``."""
        try:
            sys.stdout.flush()
            print(f"{self.prog}: stopped at once by a second signal, {self.grace_s:.0f} s after it: the "
                  f"process was held (a stuck thread or native call); {self._saved()}", file=sys.stderr,
                  flush=True)
        finally:
            os._exit(128 + signum)

    def restore(self) -> None:
        """Put the previous handlers and wakeup descriptor back, and end the watchdog before returning."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self._ended.set()
        if self._wakeup is not None:
            r, w = self._wakeup
            with _quiet():
                signal.set_wakeup_fd(self._old_wakeup)
            self._wakeup = None
            with _quiet():
                os.close(w)  # the watchdog reads the end of the pipe and returns
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(_JOIN_S)
            self._watchdog = None


def _watch(fd: int, ended: threading.Event, grace_s: float, owner: "weakref.ref[StopOnSignal]") -> None:
    """The watchdog thread: count the signals written to the wakeup pipe ``fd``; :data:`grace_s` seconds
    after the second one, unless the run ended (``ended``) meanwhile, end the process.

    It holds only a weak reference to its :class:`StopOnSignal`, whose ``saved_step`` reaches the whole run:
    a thread that outlived the run and dropped the last reference to it would free the run's tensors while
    the interpreter exits, and that aborts the process ("terminate called without an active exception":
    freeing a tensor asks for the GIL, and Python 3.11 ends a daemon thread that asks for the GIL during
    finalization with ``pthread_exit``, whose unwinding cannot cross PyTorch's destructor).
    :meth:`StopOnSignal.restore` also joins it, so no watchdog is alive when the interpreter exits.
    """
    try:
        signum = _second_signal(fd)
    finally:
        with _quiet():
            os.close(fd)
    if signum is None or ended.wait(grace_s):
        return
    stop = owner()
    if stop is not None:
        stop._exit_now(signum)


def _second_signal(fd: int) -> int | None:
    """The number of the second SIGINT/SIGTERM read from ``fd``; None when the pipe closes first."""
    seen = 0
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return None
        if not data:  # restore() closed the write end
            return None
        for signum in data:
            if signum in _SIGNALS:
                seen += 1
                if seen >= 2:
                    return signum


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        return kind is not None and issubclass(kind, (OSError, ValueError))


def finish_process(code: int) -> int:
    """Return ``code``, or end the process with it at once when a non-daemon thread is still alive
    (after flushing the standard streams): a stuck thread must not hold a finished run's process."""
    stuck = [t for t in threading.enumerate()
             if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    if not stuck:
        return code
    for stream in (sys.stdout, sys.stderr):
        with _quiet():
            stream.flush()
    os._exit(code)
