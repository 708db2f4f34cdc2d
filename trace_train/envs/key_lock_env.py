"""Key, then lock: a two-turn task built for TRACE's prefix stage (``task.name=key_lock``).

The prompt shows a lock engraved with a mark and K keys, each a colour with a mark. Turn 1 the agent
names a key; the right one is the key whose mark matches the lock's. The feedback says whether the door
opened. Turn 2 is a binary choice between the left and the right chest; behind an open door a lamp is
lit (the treasure is in the left chest) or dark (the right chest). The reward is

    1[key = the key with the lock's mark] * 1[chest = left if the lamp is lit else right].

Both right answers can be read from the visible text (the system prompt states both rules), so RL can
learn them, and the key outcome is in the transcript ("The door opens" / "The door stays shut"), so a
predictor can read it at the prefix. Every episode is two turns: behind a shut door the agent still
picks a chest, without the lamp, and cannot win. This is the tree of the simulator's key-lock world
(``simulations.key_lock``): a player that picks a key and a chest at random has V(root) = 1/(2K), a
right-key prefix V = 1/2, a wrong-key prefix V = 0.

An action is read as the first key colour (turn 1) or the first of "left" / "right" (turn 2) it names,
case-insensitively; a turn 1 naming none of the row's keys is an invalid turn (the door stays shut), a
turn 2 naming neither chest is invalid (no chest opened). Rows (:func:`make_rows`) mix the number of keys
K over ``keys``; the scripted player (:func:`random_player`, the tiny model's warm start) picks a key and
a chest at random, so it is right about the key 1/K of the time and about the chest half of the time.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .base import Message, StepResult

__all__ = ["KeyLockEnv", "KeyLockState", "make_rows", "random_player", "COLOURS", "MARKS", "SYSTEM_PROMPT"]

COLOURS = ("red", "blue", "green", "gold", "black", "white", "pink", "grey")
MARKS = ("star", "moon", "sun", "leaf", "fish", "bird", "wave", "bell")
CHESTS = ("left", "right")
SYSTEM_PROMPT = (
    "You are at a locked door. The key whose mark matches the mark on the lock opens it. Reply to the "
    "first question with the colour of one key and nothing else. Behind an open door are two chests: if "
    "the lamp is lit the treasure is in the left chest, if it is dark it is in the right chest. Reply to "
    "the second question with left or right."
)
_WORD = re.compile(r"[a-z]+")


def _check_keys(keys: Any) -> list[int]:
    if isinstance(keys, int) and not isinstance(keys, bool):
        keys = [keys]
    if not isinstance(keys, (list, tuple)) or not keys or not all(
            isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= len(COLOURS) for k in keys):
        raise ValueError(f"key_lock: `keys` must be a key count or a list of them, each from 1 to {len(COLOURS)}, "
                         f"got {keys!r}")
    return list(keys)


def make_rows(n: int, *, keys: Sequence[int] | int = (2, 4, 8), seed: int = 0) -> list[dict]:
    """``n`` rows: K drawn uniformly from ``keys``, K distinct colours and marks, the right key and the lamp
    uniform. A row: ``id``, ``keys`` (colours), ``marks`` (one per key), ``lock`` (the right key's mark),
    ``right_key``, ``lamp`` ("lit" or "dark") and ``right_chest``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"`n` must be a non-negative integer, got {n!r}")
    counts = _check_keys(keys)
    rng = np.random.default_rng([seed, 56])
    rows = []
    for i in range(n):
        k = int(rng.choice(counts))
        colours = [COLOURS[j] for j in rng.permutation(len(COLOURS))[:k]]
        marks = [MARKS[j] for j in rng.permutation(len(MARKS))[:k]]
        right = int(rng.integers(k))
        lamp = "lit" if rng.integers(2) == 0 else "dark"
        rows.append({"id": f"key_lock/K{k}/{seed}-{i}", "keys": colours, "marks": marks, "lock": marks[right],
                     "right_key": colours[right], "lamp": lamp, "right_chest": "left" if lamp == "lit" else "right"})
    return rows


def random_player(row: Mapping[str, Any]) -> list[str]:
    """The scripted player of the warm start: a key and a chest drawn uniformly, seeded by the row (right
    about the key 1/K of the time, about the chest half of the time), so the warmed model answers in the
    task's format and starts low (V(root) about 1/(2K)), with the rules left for RL to learn."""
    rng = np.random.default_rng(zlib.crc32(repr((row.get("id"), list(row["keys"]), row["lamp"])).encode()))
    return [str(row["keys"][int(rng.integers(len(row["keys"])))]), CHESTS[int(rng.integers(2))]]


def _first(words: Sequence[str], action: str) -> str | None:
    """The first of ``words`` that ``action`` names (as a whole word, case-insensitively)."""
    for word in _WORD.findall(str(action).lower()):
        if word in words:
            return word
    return None


@dataclass(frozen=True)
class KeyLockState:
    """The whole state of an episode (a snapshot is this value)."""

    keys: tuple[str, ...]
    right_key: str
    lamp: str
    key: str | None = None
    """The key tried (None: not yet, or an invalid turn 1)."""
    turns: int = 0
    chest: str | None = None

    @property
    def opened(self) -> bool:
        return self.turns >= 1 and self.key == self.right_key

    @property
    def done(self) -> bool:
        return self.turns >= 2


class KeyLockEnv:
    """The environment (see the module docstring); rows from :func:`make_rows`."""

    concurrency_safe = True
    """Every instance holds its own immutable state value and nothing else."""

    def __init__(self, *, system_prompt: str = SYSTEM_PROMPT):
        if not system_prompt:
            raise ValueError("`system_prompt` must not be empty")
        self.system_prompt = system_prompt
        self._state: KeyLockState | None = None

    @property
    def state(self) -> KeyLockState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._state

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        missing = {"keys", "marks", "lock", "right_key", "lamp"} - set(row)
        if missing:
            raise ValueError(f"key_lock rows need the keys {sorted(missing)}; got {sorted(row)}")
        keys, marks = list(row["keys"]), list(row["marks"])
        if not keys or len(keys) != len(marks) or row["right_key"] not in keys or row["lamp"] not in ("lit", "dark") \
                or marks[keys.index(row["right_key"])] != row["lock"] or not set(keys) <= set(COLOURS):
            raise ValueError("key_lock: a row needs as many marks as keys (colours of COLOURS), a right key among "
                             "them whose mark is the lock's, and a lamp 'lit' or 'dark'")
        self._state = KeyLockState(tuple(keys), str(row["right_key"]), str(row["lamp"]))
        listed = ", ".join(f"{c} key ({m})" for c, m in zip(keys, marks))
        plural = "key" if len(keys) == 1 else "keys"
        task = f"The lock bears a {row['lock']}. You hold {len(keys)} {plural}: {listed}. Which key do you use?"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task}]

    def step(self, action: str) -> StepResult:
        s = self.state
        if s.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        if s.turns == 0:
            key = _first(s.keys, action)
            self._state = s = replace(s, key=key, turns=1)
            question = "Which chest do you open, left or right?"
            if s.opened:
                return StepResult(f"The door opens. The lamp is {s.lamp}. {question}")
            if key is None:
                return StepResult(f"Invalid key: reply with one of {', '.join(s.keys)}. The door stays shut. "
                                  f"{question}", invalid=True)
            return StepResult(f"The door stays shut. {question}")
        chest = _first(CHESTS, action)
        self._state = s = replace(s, chest=chest, turns=2)
        if chest is None:
            return StepResult("Invalid chest: reply left or right. No chest is opened.", done=True, invalid=True)
        found = s.opened and chest == ("left" if s.lamp == "lit" else "right")
        return StepResult("You found the treasure!" if found else "The chest is empty.", done=True)

    def verify(self) -> float:
        s = self.state
        return 1.0 if s.done and s.opened and s.chest == ("left" if s.lamp == "lit" else "right") else 0.0

    def metrics(self) -> dict[str, float]:
        """``success`` (the reward) and ``opened`` (the right key was used)."""
        return {"success": self.verify(), "opened": float(self.state.opened)}

    def snapshot(self) -> KeyLockState:
        return self.state

    def restore(self, snapshot: KeyLockState) -> None:
        if not isinstance(snapshot, KeyLockState):
            raise ValueError(f"`snapshot` must be a KeyLockState, got {type(snapshot).__name__}")
        self._state = snapshot
