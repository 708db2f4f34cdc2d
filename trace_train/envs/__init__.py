"""Environments behind one protocol (:mod:`.base`) and the synthetic guess-the-number task."""
from .base import EndReason, Environment, EpisodeLimits, Message, StepResult  # noqa: F401
from .guess_number import GuessNumberEnv, GuessState, make_rows  # noqa: F401
