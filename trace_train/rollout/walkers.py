"""The records of a grow call's rollouts in progress: a :class:`Walker` and its recorded :class:`Turn` s.

The scheduler (:mod:`.scheduler`) generates a walker's turns and commits them to the batch at the end;
its environment side (:mod:`.env_turns`) applies each environment answer to the walker's last turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from ..backends.base import Completion
from ..envs.base import EndReason, Environment, Message

__all__ = ["Turn", "Walker", "Anchor"]


@dataclass
class Turn:
    """One recorded turn of a walker, committed to the forest at the end."""

    completion: Completion
    text: str
    messages: tuple[Message, ...]
    observation: str = ""
    observation_ids: tuple[int, ...] = ()
    snapshot: Any = None
    end: EndReason | None = None
    reward: float | None = None


class Anchor(NamedTuple):
    """Turn ``turn`` of walker ``walker``: where a streamed continuation branches off, a node only once
    committed (hashes as the tuple ``(walker, turn)``)."""

    walker: int
    turn: int


@dataclass
class Walker:
    """A rollout in progress: its start node, its environment, its exact context and recorded turns."""

    index: int
    start: int
    start_depth: int
    context: list[int]
    env: Environment | None = None
    turns: list[Turn] = field(default_factory=list)
    env_seconds: float = 0.0
    """Time its environment calls took (the rollout's own environment time)."""
    snapshot: Any = None
    """The environment state it starts from (its start node's snapshot)."""
    seeds: Callable[[int], int] | None = None
    """Sampling seed of its t-th turn; None: the grow call's ``seed + t W + index``."""
    anchor: Anchor | None = None
    """A streamed continuation: the walker's turn it branches from; None: it starts at node ``start``."""
    boundaries: list[int] = field(default_factory=list)
    """Length of ``context`` after each turn that went on (its prefixes' token ids)."""

    @property
    def depth(self) -> int:
        return self.start_depth + len(self.turns)

    @property
    def ended(self) -> bool:
        return bool(self.turns) and self.turns[-1].reward is not None
