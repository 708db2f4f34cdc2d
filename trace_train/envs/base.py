"""The environment protocol: what a multi-turn task looks like to the rollout engine.

An episode is a conversation. :meth:`Environment.reset` turns a data set row into the opening messages
(system prompt and task); each agent turn, the engine passes the model's action text to
:meth:`Environment.step` and gets an observation back, until the environment says the episode is over
or a limit ends it. The reward always comes from :meth:`Environment.verify`, the task's verifier, called
once when the rollout ends, whatever ended it.

Rules every environment follows:

* **Invalid actions never raise.** Unparseable or illegal actions become an error observation (and the
  episode usually goes on); exceptions from ``step`` are bugs.
* **Snapshots are complete.** ``restore(snapshot())`` on *any* instance, including one that was never
  reset, puts it in exactly the state it had, so a continuation branched from a prefix sees what the
  factual rollout saw at that turn. Snapshots are immutable values: later steps must not change them.
  The engine takes one after every turn (any turn boundary may become a branch point), so they should
  be cheap: a small state value, a log of the calls to replay, or copy-on-write storage.
* **Fresh instances.** The engine builds one instance per rollout with its ``make_env`` factory, and
  restores a continuation's instance from its prefix's snapshot instead of calling ``reset``.
* **Concurrency is declared.** An environment class whose instances may be stepped from several threads
  at once (each instance by one thread at a time, different instances concurrently) sets the class
  attribute ``concurrency_safe = True``. The engine then runs ``step``, ``verify``, ``snapshot`` and
  ``restore`` of different rollouts concurrently on a pool of worker threads; any other environment is
  stepped serially, on one worker thread (see :func:`is_concurrency_safe`). Safe means: no mutable
  state shared between instances (module globals, class attributes, one open connection) unless it is
  locked.

How a rollout ends (the engine records one :class:`EndReason` per leaf):

==================  ==============================================================================
``DONE``            the environment ended the episode (``StepResult.done``)
``MAX_TURNS``       ``EpisodeLimits.max_turns`` turns were taken and the episode was not done
``TURN_TOKENS``     the model's turn hit ``max_turn_tokens`` without finishing; the cut action is
                    not passed to the environment
``CONTEXT``         the context reached ``max_context_tokens``: the next turn has no room, or the
                    turn was cut by the context before finishing (not passed to the environment)
``ENV_ERROR``       a call of the environment (``step``, ``verify``, ``snapshot``, ``restore``,
                    ``make_env`` or ``reset``) raised: a bug of the environment, not of the model; reward 0
``ENV_TIMEOUT``     a call of the environment ran past the engine's per-call limit; reward 0
==================  ==============================================================================

Otherwise the leaf's reward is ``verify()`` of the state reached, so a truncated episode scores
what it achieved (for most tasks 0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

__all__ = ["Message", "StepResult", "Environment", "EpisodeLimits", "EndReason", "is_concurrency_safe"]

Message = dict[str, str]
"""A chat message, ``{"role": ..., "content": ...}``, as chat templates expect."""


@dataclass(frozen=True)
class StepResult:
    """What the environment answers to one action."""

    observation: str
    """Text shown to the model as the next user (or tool) message; an error message for invalid actions."""
    done: bool = False
    """Whether the episode is over (solved, answered, or the environment's own budget spent)."""
    role: str = "user"
    """Chat role of the observation message ("user", or "tool" for templates that have one)."""
    invalid: bool = False
    """Whether the action was rejected (the observation then says why)."""


@runtime_checkable
class Environment(Protocol):
    """A multi-turn task; see the module docstring for the contract."""

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """Start an episode for a data set row; return the opening messages (system, user)."""

    def step(self, action: str) -> StepResult:
        """Apply the model's action text (its whole turn, as decoded text)."""

    def verify(self) -> float:
        """The verifier's terminal reward for the state reached so far (0 or 1 for binary tasks)."""

    def snapshot(self) -> Any:
        """An immutable value that :meth:`restore` turns back into the current state."""

    def restore(self, snapshot: Any) -> None:
        """Return to the state captured by :meth:`snapshot` (works on a fresh instance too)."""


class EndReason(enum.Enum):
    """Why a rollout ended; see the module table."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    TURN_TOKENS = "turn_tokens"
    CONTEXT = "context"
    ENV_ERROR = "env_error"
    ENV_TIMEOUT = "env_timeout"


@dataclass(frozen=True)
class EpisodeLimits:
    """Limits that end a rollout, enforced by the engine (see the module table)."""

    max_turns: int = 8
    """Agent turns per episode."""
    max_turn_tokens: int = 64
    """New tokens the model may generate in one turn."""
    max_context_tokens: int = 2048
    """Prompt, actions and observations together; a turn never generates past it."""

    def __post_init__(self):
        for name in ("max_turns", "max_turn_tokens", "max_context_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def is_concurrency_safe(make_env: Callable[[], Any]) -> bool:
    """Whether the environments ``make_env`` builds declare ``concurrency_safe = True``.

    The attribute is looked up on the factory itself, then on what it wraps (``EnvFactory.make``,
    ``functools.partial.func``), so that no environment has to be built to find out; a factory that
    names no class answers False (stepped serially).
    """
    seen = 0
    while make_env is not None and seen < 8:
        declared = getattr(make_env, "concurrency_safe", None)
        if isinstance(declared, bool):
            return declared
        make_env = getattr(make_env, "make", None) or getattr(make_env, "func", None)
        seen += 1
    return False
