"""The environment side of a grow call: each walker's turn handed to a worker, its answer applied.

:class:`EnvTurns` belongs to one :meth:`~.scheduler.Scheduler.grow` call. The scheduler hands it every
generated turn (:meth:`EnvTurns.step`); it runs the turn's calls (``make_env`` and ``restore`` before a
walker's first turn, then ``step``, ``snapshot`` and, when the rollout ends, ``verify``) on an
:class:`~.env_calls.EnvCallPool` (a deadline per call, stuck workers replaced), and
:meth:`EnvTurns.answered` applies what came back to the walker's last turn and returns the walkers that
go on to their next turn.

**Failures end one rollout, never the batch.** An environment call that raises ends its rollout with
end reason ``env_error``, one that runs past ``RolloutConfig.env_timeout_s`` with ``env_timeout``; both
score 0 and are counted in the report's ``end_reasons``; the first failure's message and traceback is the
report's ``env_error_sample``. A pool row whose ``make_env``, ``reset`` or first ``snapshot`` raised opens
with a placeholder prompt (:class:`~.env_calls.OpeningFailed`) and each of its rollouts ends with
``env_error`` at its first environment call. So does an observation that cannot be formatted
or tokenised (not text, or a template that will not frame it) and a reward that is not a finite number:
what an environment returns is data, checked in the main thread but charged to its own rollout. Its text
enters once through :func:`~trace_train.chat.clean_text` (lone surrogates replaced), so what is stored is
what was tokenised. So does a ``step`` that returns no ``StepResult`` (None), and a message that cannot
be printed is shown as such. Every call runs on the pool with a deadline, the lockstep schedule's too
(one call at a time, waited for): a timed-out call cannot be interrupted (it is a thread), so its worker
is abandoned (a daemon thread: it holds neither the batch nor the process's exit) and replaced at once,
so calls queued behind it start; its environment is discarded. Environments should still bound their
own tool calls (the sandbox does): an abandoned call keeps its thread and whatever it holds until it
returns. ``RolloutConfig.raise_env_errors`` turns failures into exceptions, for debugging.

**Sizing the pool.** An environment that declares ``concurrency_safe`` runs on ``env_workers`` threads,
others on one. Calls that wait (a subprocess, a network round trip, a sleep) release the GIL, so up to
one worker per rollout in flight is useful; calls that compute in Python hold it, and more workers than
cores only add switching. A rule of thumb: ``env_workers`` ~ rollouts x (environment time per turn) /
(environment + generation time per turn), at most the rollouts of a call.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Callable, NamedTuple

from ..chat import ChatFormat, clean_text
from ..configs import ScheduleConfig
from ..envs.base import EndReason, Environment, is_concurrency_safe
from .env_calls import (CallClock, EnvCallPool, EnvFailure, EnvTimeout, describe_error, format_failure,
                        reward_value, walker_turn, walker_verify)
from .timeline import Timeline
from .walkers import Walker

__all__ = ["EnvTurns", "EnvCall", "env_pool"]


class EnvCall(NamedTuple):
    """An environment task in flight: its walker's clock (the walker, the time its calls took) and whether
    it is only the ``verify`` of a rollout its context ended (else a whole turn, :func:`~.env_calls.walker_turn`)."""

    clock: CallClock
    verify_only: bool


def env_pool(make_env: Callable[[], Environment], config: ScheduleConfig, *, lockstep: bool) -> EnvCallPool:
    """Workers with a deadline per call (:mod:`.env_calls`); lockstep: one call at a time, waited for."""
    if lockstep:
        return EnvCallPool(1, config.env_timeout_s, serial=True)
    workers = config.env_workers if is_concurrency_safe(make_env) else 1
    return EnvCallPool(workers, config.env_timeout_s)


class EnvTurns:
    """The environment calls of one grow call: its pool, the tasks in flight, what their answers do."""

    def __init__(self, make_env: Callable[[], Environment], chat: ChatFormat, config: ScheduleConfig,
                 timeline: Timeline, *, lockstep: bool):
        self.make_env, self.chat, self.cfg, self.timeline = make_env, chat, config, timeline
        self.pool = env_pool(make_env, config, lockstep=lockstep)
        self.running: dict[Future, EnvCall] = {}
        """Tasks submitted and not yet applied."""
        self.error_sample: str | None = None
        """The first failure (end reason, rollout, message, traceback), for the report."""
        self.turn_seconds: float | None = None
        """Running mean of the environment's time per turn (all calls of one turn)."""

    def step(self, w: Walker, text: str | None, verify: bool) -> Future:
        """Hand walker ``w``'s new turn to its environment: (make and restore it,) step it on ``text``
        unless the turn was cut (None), snapshot it, and verify it when ``verify`` or it is done."""
        clock = CallClock(w, self.timeline.add_env)
        future = self.pool.submit(clock, walker_turn, self.make_env, w.snapshot, text, verify)
        self.running[future] = EnvCall(clock, verify_only=False)
        return future

    def faster_than(self, seconds: float) -> bool:
        """Whether environment turns have taken less than ``seconds`` (running mean; True before any)."""
        return self.turn_seconds is None or self.turn_seconds < seconds

    def wait(self, window: float | None = None) -> None:
        """Wait for the first task to answer (or for the first running call's deadline), then up to
        ``window`` seconds more for the rest of its wave."""
        deadline = self.pool.next_deadline()
        wait(self.running, timeout=None if deadline is None else deadline + 0.01, return_when=FIRST_COMPLETED)
        if window is not None:
            wait(self.running, timeout=window)

    def answered(self) -> list[Walker]:
        """Apply every finished task (calls past their deadline fail with EnvTimeout first); returns the
        walkers that go on to their next turn."""
        self.pool.expire()
        ready = []
        for future in [f for f in self.running if f.done()]:
            call = self.running.pop(future)
            mean, seconds = self.turn_seconds, call.clock.seconds
            self.turn_seconds = seconds if mean is None else 0.9 * mean + 0.1 * seconds
            if self._answered(call.clock.walker, call.verify_only, future):
                ready.append(call.clock.walker)
        return ready

    def shutdown(self) -> None:
        """Never waits: a stuck call's worker is a daemon thread, abandoned."""
        self.pool.shutdown()

    def _answered(self, w: Walker, verify_only: bool, future: Future) -> bool:
        """Apply a finished environment task; True when the walker goes on to its next turn."""
        error = future.exception()
        if isinstance(error, EnvTimeout):  # the pool abandoned its worker (module env_calls)
            self._fail(w, EndReason.ENV_TIMEOUT, describe_error(error).partition(": ")[2] or "timed out")
            return False
        if error is not None:
            self._fail(w, EndReason.ENV_ERROR, describe_error(error), error)
            return False
        turn = w.turns[-1]
        if verify_only:
            try:
                turn.reward = reward_value(future.result())
            except ValueError as error:
                self._fail(w, EndReason.ENV_ERROR, describe_error(error), error)
            return False
        result, turn.snapshot, reward = future.result()
        try:  # what the environment returned is data: any fault in it ends this rollout only
            if result is not None:
                # cleaned, frame tags escaped: what is stored is what is tokenised (idempotent there)
                observation = self.chat.escape_frame_tags(clean_text(result.observation), {"role": result.role})
                message = {"role": result.role, "content": observation}
                turn.observation, turn.messages = observation, turn.messages + (message,)
                if result.done:
                    turn.end = EndReason.DONE
                elif w.depth >= self.cfg.limits.max_turns:
                    turn.end = EndReason.MAX_TURNS
            if turn.end is not None:
                turn.reward = reward_value(reward)
                return False
            action_ids = tuple(turn.completion.token_ids)
            obs_ids = tuple(self.chat.observation_ids(action_ids, turn.messages[-1]))
        except Exception as error:  # noqa: BLE001 - formatting or tokenising this observation failed
            self._fail(w, EndReason.ENV_ERROR, f"observation: {describe_error(error)}", error)
            return False
        if len(w.context) + len(action_ids) + len(obs_ids) >= self.cfg.limits.max_context_tokens:
            turn.end = EndReason.CONTEXT
            clock = CallClock(w, self.timeline.add_env)
            self.running[self.pool.submit(clock, walker_verify)] = EnvCall(clock, verify_only=True)
            return False
        turn.observation_ids = obs_ids
        w.context = w.context + list(action_ids) + list(obs_ids)
        w.boundaries.append(len(w.context))
        return True

    def _fail(self, w: Walker, reason: EndReason, message: str, error: BaseException | None = None) -> None:
        """End walker ``w``'s rollout with ``reason`` and reward 0 (or raise, with ``raise_env_errors``)."""
        if self.cfg.raise_env_errors:
            raise EnvFailure(f"environment of rollout {w.index} (from node {w.start}): {message}") from error
        if self.error_sample is None:  # the first failure of the call, for the trainer's report
            trace = format_failure(error)
            self.error_sample = f"{reason.value} in rollout {w.index} (from node {w.start}): {message}\n{trace}"
        turn = w.turns[-1]
        turn.end, turn.reward, turn.snapshot, turn.observation_ids = reason, 0.0, None, ()
        turn.messages = turn.messages[:1]
        turn.observation = f"[{reason.value}: {message}]"
        w.env = None
