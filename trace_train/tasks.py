"""Tasks: an environment plus its training and evaluation rows, by name (the trainer's ``task.name``).

A :class:`TaskSpec` says how to build a task from a :class:`TaskConfig`; ``TASKS`` maps names to specs.
``build_task`` returns a :class:`Task`: a factory of fresh environments (the rollout engine makes one per
rollout), the training rows, the held-out rows and whether rewards are 0/1.

============  ======================================================================================
name          what it is
============  ======================================================================================
guess_number  the synthetic multi-turn game of ``trace_train.envs.guess_number`` (rows generated from
              ``options``: low, high, max_guesses; ``train_size`` and ``eval_size`` rows)
============  ======================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from trace_theory._registry import Registry

from .envs.guess_number import GuessNumberEnv, make_rows

__all__ = ["TaskConfig", "Task", "TaskSpec", "TASKS", "build_task"]


@dataclass(frozen=True)
class TaskConfig:
    name: str = "guess_number"
    """A registered task (see the module table)."""
    train: str | None = None
    """Training data: a Hugging Face data set id or a local JSONL/Parquet file (tasks with real data)."""
    eval: str | None = None
    """Held-out data, same forms (defaults to a slice the task documents)."""
    train_size: int = 4096
    """Rows to draw or keep for training."""
    eval_size: int = 64
    """Held-out rows."""
    reward: str = "exact"
    """Reward variant where a task has several (e.g. QA: exact, f1_match, f1)."""
    options: dict = field(default_factory=dict)
    """Task-specific settings (documented per task)."""

    def __post_init__(self):
        spec = TASKS[self.name]  # unknown names fail here with the known ones
        if self.train_size < 1 or self.eval_size < 1:
            raise ValueError("`train_size` and `eval_size` must be at least 1")
        spec.validate(self)


@dataclass(frozen=True)
class Task:
    make_env: Callable[[], Any]
    train_rows: list
    eval_rows: list
    binary_rewards: bool = True


@dataclass(frozen=True)
class TaskSpec:
    build: Callable[[TaskConfig, int], Task]
    validate: Callable[[TaskConfig], None] = lambda cfg: None
    binary_rewards: Callable[[TaskConfig], bool] = lambda cfg: True


TASKS: Registry[TaskSpec] = Registry("task")


def build_task(cfg: TaskConfig, *, seed: int) -> Task:
    return TASKS[cfg.name].build(cfg, seed)


_GUESS_OPTIONS = {"low": 1, "high": 16, "max_guesses": 5}


def _guess_options(cfg: TaskConfig) -> dict:
    unknown = set(cfg.options) - set(_GUESS_OPTIONS)
    if unknown:
        raise ValueError(f"unknown guess_number option(s) {sorted(unknown)}; known: {sorted(_GUESS_OPTIONS)}")
    return {**_GUESS_OPTIONS, **cfg.options}


def _validate_guess(cfg: TaskConfig) -> None:
    if cfg.train is not None or cfg.eval is not None:
        raise ValueError("guess_number generates its rows: leave `task.train` and `task.eval` unset")
    make_rows(0, **_guess_options(cfg))  # checks low <= high and max_guesses >= 1


def _build_guess(cfg: TaskConfig, seed: int) -> Task:
    options = _guess_options(cfg)
    return Task(GuessNumberEnv, make_rows(cfg.train_size, seed=seed, **options),
                make_rows(cfg.eval_size, seed=seed + 1_000_003, **options))


TASKS.add("guess_number", TaskSpec(_build_guess, _validate_guess))
