"""Environment calls that always end: worker threads with a deadline per call, stuck workers replaced.

An environment is user code (a plugin, a tool, a verifier): a call may raise, return garbage or never
return. The rollout scheduler runs every call through an :class:`EnvCallPool`:

* **Every call has a deadline.** The calls of one walker's turn (``make_env``, ``restore``, ``step``,
  ``snapshot``, ``verify``; ``make_env``, ``reset``, ``snapshot`` when a pool row opens) run on a worker,
  one after another; each call's clock starts when the call starts, and a call that has not returned
  ``timeout_s`` later (``RolloutConfig.env_timeout_s``) fails its task with :class:`EnvTimeout`.
* **A stuck worker is abandoned and replaced.** A Python thread cannot be interrupted, so the worker of
  a timed-out call is left to finish (or hang) on its own: whatever it returns later is discarded, and a
  fresh worker takes its place at once. A call queued behind a stuck one therefore starts no later than
  the stuck call's deadline, and the pool keeps its size however many calls hang; with ``W`` workers a
  task that waits behind ``q`` others ends within ``(ceil(q / W) + 1) * c * timeout_s`` of its
  submission (``c`` calls per task). In an environment that is not concurrency-safe (one worker) the
  replacement runs beside the abandoned call: the environment's instance of the stuck call is discarded,
  but state it shares with other instances is the environment's own affair.
* **Nothing waits for a stuck worker at exit.** Workers are daemon threads (``ThreadPoolExecutor``'s
  are joined at interpreter exit, which is how one hung call used to hold the process after the run
  ended); :func:`abandoned_calls` counts the workers left behind that are still in their call (one
  whose late call returns ends and is no longer counted: a tool now and then slower than the deadline
  costs nothing lasting), and with :data:`MAX_ABANDONED` of them stuck at once in one process the pool
  refuses new work with :class:`EnvCallsStuck`, rather than leak threads without bound; ``trace-train``
  turns it into its environment-failure stop (a checkpoint and one line).

What an environment returns is checked by the scheduler (:func:`reward_value`, :func:`describe_error`
here): a failure of any kind ends one rollout with ``env_error`` or ``env_timeout``, never the batch.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable

__all__ = ["EnvFailure", "EnvTimeout", "OpeningFailed", "CallClock", "EnvCallPool", "reward_value",
           "describe_error", "format_failure", "abandoned_calls", "MAX_ABANDONED", "EnvCallsStuck"]

MAX_ABANDONED = 1024
"""Abandoned workers still in their call at once, per process, at which pools refuse new work."""

_abandoned = 0
_abandoned_lock = threading.Lock()


def abandoned_calls() -> int:
    """Workers of this process abandoned past their deadline and still in their call now; each is a
    daemon thread that ends (and leaves this count) when its call returns, if it ever does."""
    return _abandoned


class EnvFailure(RuntimeError):
    """An environment call raised or ran out of time (raised only with ``raise_env_errors``)."""


class EnvCallsStuck(EnvFailure):
    """:data:`MAX_ABANDONED` environment calls of this process are stuck past their deadline at once."""


class EnvTimeout(Exception):
    """An environment call ran past its deadline (``env_timeout_s``)."""


class OpeningFailed:
    """The snapshot of a pool row whose ``make_env``, ``reset`` or first ``snapshot`` raised or timed out.

    The engine opens the row with :attr:`PROMPT` instead of the environment's messages; restoring this
    snapshot raises (:class:`EnvTimeout` when the opening timed out), so each rollout from the row ends at
    its first environment call with ``env_error`` (``env_timeout``) and reward 0, counted and masked like
    any other environment failure, and the batch goes on."""

    PROMPT = "[env_error: the environment could not be reset for this task]"

    def __init__(self, message: str, error: BaseException):
        self.message, self.error = message, error

    def fail(self):
        if isinstance(self.error, EnvTimeout):
            raise EnvTimeout(f"reset timed out for {self.message}") from self.error
        raise RuntimeError(f"reset failed for {self.message}") from self.error


def describe_error(error: BaseException) -> str:
    """``Type: message`` of ``error``, whatever its ``__str__`` does (raises, returns a non-string)."""
    name = _safe(lambda: type(error).__name__, "Exception")
    text = _safe(lambda: str(error), None)
    if text is None:
        return f"{name}: <message could not be printed>"
    return f"{name}: {text}" if text else name


def format_failure(error: BaseException | None) -> str:
    """The traceback of ``error`` as text ("" without one), or a line saying it could not be printed."""
    if error is None:
        return ""
    return _safe(lambda: "".join(traceback.format_exception(error)),
                 f"(traceback of {describe_error(error)} could not be printed)\n")


def _safe(fn: Callable[[], Any], fallback):
    try:
        value = fn()
    except Exception:  # noqa: BLE001 - printing user objects must not raise
        return fallback
    return value if isinstance(value, str) else fallback


def reward_value(value) -> float:
    """``value`` as a finite float; a ValueError naming it otherwise (NaN would poison the batch, and a
    huge integer, a string or None is no reward)."""
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError, ArithmeticError) as error:
        raise ValueError(f"verify() returned {_short_repr(value)}, not a number ({describe_error(error)})") from None
    except Exception as error:  # noqa: BLE001 - a __float__ of user code
        raise ValueError(f"verify() returned a value whose float() raised {describe_error(error)}") from None
    if not math.isfinite(reward):
        raise ValueError(f"verify() returned a non-finite reward {reward}")
    return reward


def _short_repr(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"an integer of {value.bit_length()} bits"
    text = _safe(lambda: repr(value), None)
    name = _safe(lambda: type(value).__name__, "object")
    if text is None:
        return f"a {name}"
    return text if len(text) <= 80 else f"a {name} ({text[:60]}...)"


class CallClock:
    """The calls of one task (a walker's turn, a row's opening), timed call by call.

    ``clock(name, fn, *args)`` runs ``fn(*args)`` and records its interval (``on_interval(start, end)``,
    ``seconds``); while it runs, ``since`` is its start, which the pool compares with its deadline."""

    def __init__(self, walker=None, on_interval: Callable[[float, float], None] | None = None):
        self.walker, self.on_interval = walker, on_interval
        self.since: float | None = None
        """Start of the call running now (None between calls)."""
        self.name = ""
        self.seconds = 0.0
        """Time the calls took so far."""

    def __call__(self, name: str, fn: Callable, *args):
        self.name, self.since = name, time.perf_counter()
        try:
            return fn(*args)
        finally:
            end = time.perf_counter()
            if self.on_interval is not None:
                self.on_interval(self.since, end)
            self.seconds += end - self.since
            if self.walker is not None:
                self.walker.env_seconds += end - self.since
            self.since = None


class _Task:
    __slots__ = ("future", "clock", "fn", "args", "worker")

    def __init__(self, future: Future, clock: CallClock, fn: Callable, args: tuple):
        self.future, self.clock, self.fn, self.args = future, clock, fn, args
        self.worker: _Worker | None = None


def _release_abandoned() -> None:
    global _abandoned
    with _abandoned_lock:
        _abandoned -= 1


class _Worker:
    __slots__ = ("task", "abandoned")

    def __init__(self):
        self.task: _Task | None = None
        self.abandoned = False


class EnvCallPool:
    """``workers`` daemon threads running tasks ``fn(clock, *args)``; see the module docstring.

    :meth:`submit` returns a future; :meth:`expire` fails the futures of tasks whose running call is past
    ``timeout_s`` with :class:`EnvTimeout` and replaces their workers; :meth:`next_deadline` is the time
    left until the first running call's deadline; :meth:`run` submits one task and waits for it (or its
    deadline). ``timeout_s=None`` means no deadline (calls may then hold a worker forever)."""

    def __init__(self, workers: int, timeout_s: float | None, *, name: str = "trace-env", serial: bool = False):
        if workers < 1:
            raise ValueError(f"an environment call pool needs at least one worker, got {workers}")
        self.timeout_s, self.name, self.size = timeout_s, name, workers
        self.serial = serial
        """Whether :meth:`submit` waits for each task (the lockstep schedule: one call at a time, in order)."""
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._idle = 0
        self._started = 0
        self._closed = False

    # ---- workers ------------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        """One more worker (called with the lock held); started lazily, up to ``size`` live ones."""
        worker = _Worker()
        self._workers.append(worker)
        self._started += 1
        threading.Thread(target=self._work, args=(worker,), name=f"{self.name}-{self._started}",
                         daemon=True).start()

    def _work(self, worker: _Worker) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            with self._lock:
                if task.future.done():  # dropped at shutdown
                    self._idle += 1
                    continue
                task.worker, worker.task = worker, task
            try:
                result, error = task.fn(task.clock, *task.args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                result, error = None, exc
            with self._lock:
                worker.task = None
                if worker.abandoned:  # past its deadline: the future already failed, a replacement runs
                    _release_abandoned()  # its call returned: no longer stuck
                    return
                self._idle += 1  # free for the next task (claimed by submit, as ThreadPoolExecutor does)
                if not task.future.done():
                    if error is None:
                        task.future.set_result(result)
                    else:
                        task.future.set_exception(error)

    # ---- the caller's side --------------------------------------------------------------------------

    def submit(self, clock: CallClock, fn: Callable, *args) -> Future:
        """Run ``fn(clock, *args)`` on a worker; its calls made through ``clock`` are timed."""
        if self._closed:
            raise RuntimeError("the environment call pool is shut down")
        if _abandoned >= MAX_ABANDONED:
            raise EnvCallsStuck(f"{_abandoned} environment calls are stuck past env_timeout_s at once in this "
                                "process; the environment does not bound its own calls (a tool without a timeout?)")
        future: Future = Future()
        future.set_running_or_notify_cancel()
        with self._lock:  # an idle worker takes it, else a new one up to `size`
            if self._idle > 0:
                self._idle -= 1
            elif len(self._workers) < self.size:
                self._start_worker()
        self._queue.put(_Task(future, clock, fn, args))
        if self.serial:
            self._wait(future)
        return future

    def _wait(self, future: Future) -> None:
        while not future.done():
            deadline = self.next_deadline()
            try:
                future.result(timeout=None if deadline is None else deadline + 0.01)
            except Exception:  # noqa: BLE001 - read by the caller, once the future is done
                pass
            self.expire()

    def _running(self) -> list[_Task]:
        with self._lock:
            return [w.task for w in self._workers if w.task is not None and not w.abandoned]

    def next_deadline(self) -> float | None:
        """Seconds until the first running call passes its deadline (``timeout_s`` with none running,
        None without a deadline)."""
        if self.timeout_s is None:
            return None
        now = time.perf_counter()
        starts = [t.clock.since for t in self._running() if t.clock.since is not None]
        return max(0.0, min((s + self.timeout_s - now for s in starts), default=self.timeout_s))

    def expire(self) -> list[tuple[Future, CallClock, str]]:
        """Fail every task whose running call is past the deadline; returns ``(future, clock, call name)``
        of each. Their workers are abandoned and replaced."""
        global _abandoned
        if self.timeout_s is None:
            return []
        now, expired = time.perf_counter(), []
        with self._lock:
            for worker in list(self._workers):
                task = worker.task
                since = task.clock.since if task is not None else None
                if worker.abandoned or since is None or now - since <= self.timeout_s or task.future.done():
                    continue
                worker.abandoned = True
                self._workers.remove(worker)
                name = task.clock.name
                task.future.set_exception(EnvTimeout(f"{name}() ran past env_timeout_s={self.timeout_s} s"))
                expired.append((task.future, task.clock, name))
                with _abandoned_lock:
                    _abandoned += 1
                if not self._closed:
                    self._start_worker()
        return expired

    def run(self, clock: CallClock, fn: Callable, *args):
        """Submit ``fn(clock, *args)`` and wait for it; raises what it raised, or :class:`EnvTimeout` at
        its running call's deadline (its worker is abandoned and replaced)."""
        future = self.submit(clock, fn, *args)
        self._wait(future)
        return future.result()

    def shutdown(self) -> None:
        """Stop the workers once their queued tasks are done or dropped; never waits for them."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            n = len(self._workers)
        while True:  # drop what is still queued: its futures are cancelled
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                break
            if task is not None and not task.future.done():
                task.future.set_exception(RuntimeError("the environment call pool was shut down"))
        for _ in range(n):
            self._queue.put(None)


# ---------------------------------------------------------------------------------------------------
# The tasks of a walker (run on a worker through its clock)
# ---------------------------------------------------------------------------------------------------


def walker_turn(clock: CallClock, make_env, snapshot, text: str | None, verify: bool):
    """One turn of ``clock.walker``: (build and restore its environment,) step it on ``text`` unless the
    turn was cut (None), snapshot it, and verify it when ``verify`` or the environment says it is done.
    Returns ``(step result, snapshot, verify's value or None)``; a ``step`` that returns anything but a
    :class:`~..envs.base.StepResult` (anything without its ``observation``, ``done`` and ``role``, None
    included) is a TypeError, an environment error."""
    w = clock.walker
    if isinstance(snapshot, OpeningFailed):
        clock("reset", snapshot.fail)
    if w.env is None:
        env = clock("make_env", make_env)
        clock("restore", env.restore, snapshot)
        w.env = env
    result = None
    if text is not None:
        result = clock("step", w.env.step, text)
        if not all(hasattr(result, a) for a in ("observation", "done", "role")):
            raise TypeError(f"step() returned {_short_repr(result)}, not a StepResult")
    state = clock("snapshot", w.env.snapshot)
    done = verify or (result is not None and result.done)
    return result, state, clock("verify", w.env.verify) if done else None


def walker_verify(clock: CallClock):
    """``verify`` of ``clock.walker``'s environment (a rollout ended by its context)."""
    return clock("verify", clock.walker.env.verify)


def open_row(clock: CallClock, make_env, row):
    """A pool row's opening: a fresh environment, its ``reset(row)`` messages and its first snapshot."""
    env = clock("make_env", make_env)
    messages = clock("reset", env.reset, row)
    return messages, clock("snapshot", env.snapshot)
