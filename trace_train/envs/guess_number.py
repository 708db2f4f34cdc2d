"""Guess the number: a synthetic multi-turn task that a tiny model can learn on a CPU.

The environment hides an integer in ``[low, high]``; each turn the agent replies with a guess and hears
"Higher", "Lower" or "Correct". The episode ends when the number is found (reward 1) or the agent has
used ``max_guesses`` turns (reward 0). An action is read as its first integer, so "7", "I guess 7" and
"7." are the same guess; an action without an integer, or one outside the range, is an invalid turn: it
gets an error observation and still uses up a guess.

Why it suits TRACE: the success probability of a prefix depends on the turns taken so far. Halving the
interval keeps success likely; wasted or invalid guesses leave fewer turns for a wider interval. With
``high - low + 1 <= 2 ** max_guesses - 1`` binary search always wins, so difficulty is set by the range
and the guess budget (:func:`make_rows`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from .base import Message, StepResult

__all__ = ["GuessNumberEnv", "GuessState", "make_rows", "random_guesser"]

SYSTEM_PROMPT = (
    "You are playing a number guessing game. The user has picked a secret whole number. "
    "Each turn, reply with exactly one guess: a single whole number and nothing else. "
    "After each guess you are told whether the secret number is higher or lower. "
    "Find the number in as few guesses as you can."
)
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class GuessState:
    """The whole state of an episode (a snapshot is this value)."""

    target: int
    low: int
    high: int
    max_guesses: int
    guesses: tuple[int | None, ...] = ()
    """One entry per turn: the guess, or None for an invalid action."""
    solved: bool = False

    @property
    def guesses_left(self) -> int:
        return self.max_guesses - len(self.guesses)

    @property
    def done(self) -> bool:
        return self.solved or self.guesses_left == 0


def make_rows(n: int, *, low: int = 1, high: int = 16, max_guesses: int = 5, seed: int = 0) -> list[dict]:
    """``n`` data set rows with targets drawn uniformly from ``[low, high]``.

    Difficulty: the range width against ``max_guesses`` (binary search needs ceil(log2(width + 1))).
    """
    if n < 0:
        raise ValueError(f"`n` must be non-negative, got {n}")
    _check_row(low, high, max_guesses, target=low)
    rng = np.random.default_rng(seed)
    targets = rng.integers(low, high + 1, size=n)
    return [{"target": int(t), "low": low, "high": high, "max_guesses": max_guesses} for t in targets]


def random_guesser(row: Mapping[str, Any]) -> list[str]:
    """A scripted player (the tiny model's warm start): each guess drawn uniformly among the numbers still
    possible, seeded by the row, until it finds the target or runs out of guesses. Every game is well formed,
    and which number it picks is far from optimal, so rewards stay mixed and RL has something to learn."""
    low, high, target = int(row["low"]), int(row["high"]), int(row["target"])
    rng = np.random.default_rng([low, high, target, int(row["max_guesses"])])
    guesses = []
    for _ in range(int(row["max_guesses"])):
        guess = int(rng.integers(low, high + 1))
        guesses.append(str(guess))
        if guess == target:
            break
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)
    return guesses


def _check_row(low: int, high: int, max_guesses: int, target: int) -> None:
    if not low <= high:
        raise ValueError(f"`low` ({low}) must not exceed `high` ({high})")
    if max_guesses < 1:
        raise ValueError(f"`max_guesses` must be at least 1, got {max_guesses}")
    if not low <= target <= high:
        raise ValueError(f"`target` {target} lies outside [{low}, {high}]")


class GuessNumberEnv:
    """The environment (see the module docstring). Rows hold ``target``, ``low``, ``high``, ``max_guesses``.

    ``system_prompt`` replaces the default rules (for example to add worked examples). ``step_seconds``
    makes every ``step`` take that long (a sleep), as a tool call with latency would: benchmarks of
    scheduling use it (``trace_train.bench.barrier``).
    """

    concurrency_safe = True
    """Every instance holds its own immutable state value and nothing else."""

    def __init__(self, *, system_prompt: str = SYSTEM_PROMPT, step_seconds: float = 0.0):
        if not system_prompt:
            raise ValueError("`system_prompt` must not be empty")
        if isinstance(step_seconds, bool) or not isinstance(step_seconds, (int, float)) \
                or not 0 <= step_seconds < float("inf"):
            raise ValueError(f"`step_seconds` must be a non-negative number of seconds, got {step_seconds!r}")
        self.system_prompt, self.step_seconds = system_prompt, float(step_seconds)
        self._state: GuessState | None = None

    @property
    def state(self) -> GuessState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._state

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        missing = {"target", "low", "high", "max_guesses"} - set(row)
        if missing:
            raise ValueError(f"guess-number rows need the keys {sorted(missing)}; got {sorted(row)}")
        low, high, max_guesses, target = (int(row[k]) for k in ("low", "high", "max_guesses", "target"))
        _check_row(low, high, max_guesses, target)
        self._state = GuessState(target=target, low=low, high=high, max_guesses=max_guesses)
        task = f"I am thinking of a number from {low} to {high}. You have {max_guesses} guesses. Your guess?"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task}]

    def step(self, action: str) -> StepResult:
        s = self.state
        if s.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        if self.step_seconds:
            time.sleep(self.step_seconds)
        match = _INTEGER.search(action)
        guess = int(match.group()) if match else None
        if guess is not None and not s.low <= guess <= s.high:
            guess = None
        solved = guess == s.target
        self._state = s = replace(s, guesses=s.guesses + (guess,), solved=solved)
        if solved:
            return StepResult(f"Correct! The number was {s.target}.", done=True)
        if guess is None:
            feedback = f"Invalid guess. Reply with one whole number from {s.low} to {s.high}."
        else:
            feedback = "Higher." if s.target > guess else "Lower."
        if s.done:
            over = f"{feedback} Out of guesses. The number was {s.target}."
            return StepResult(over, done=True, invalid=guess is None)
        left = "1 guess left." if s.guesses_left == 1 else f"{s.guesses_left} guesses left."
        return StepResult(f"{feedback} {left}", invalid=guess is None)

    def verify(self) -> float:
        return 1.0 if self.state.solved else 0.0

    def snapshot(self) -> GuessState:
        return self.state

    def restore(self, snapshot: GuessState) -> None:
        if not isinstance(snapshot, GuessState):
            raise ValueError(f"`snapshot` must be a GuessState, got {type(snapshot).__name__}")
        self._state = snapshot
