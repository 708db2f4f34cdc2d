"""TextArena's single-player games (``textarena`` 0.7.4) as environments: ``task.name=textarena
task.env.env_id=FrozenLake-v0``.

A row names a game id, its constructor options and a seed; :meth:`TextArenaEnv.reset` builds the game
unwrapped, resets it with that seed and shows the game's own opening observation as the user message.
Each turn the model's whole text is the action, in the game's own format (``[up]``, ``[A C]``,
``[12]``: TextArena reads the first bracketed move); the observation is what the game says back (its
messages since the last turn, without the echo of the action), and at the end the game's reason.

**Reward.** TextArena ends a single-player game with a reward in [0, 1]: 1 for a win, and for a loss or
an invalid move (one retry is allowed, the second invalid move in a row ends the game) the game's own
share of completion (FrozenLake: the share of the way to the goal, at most 0.95). The verifier is binary,
``reward = 1[score >= success_threshold]`` (default 1: a win), and :meth:`TextArenaEnv.score` keeps the
raw score (0 while the game is not over, e.g. cut by the engine's turn limit).

**Randomness.** TextArena games draw from the process-wide ``random`` module (``random.seed(seed)`` at
reset, and some games after it: Blackjack's cards, 2048's tiles). Each environment keeps its own
``random`` state and swaps it in, under one lock, around every call into the game, so interleaved
rollouts do not change each other's draws and a snapshot (the game deep-copied together with that state)
replays a branch exactly.

**Refused ids** fail in one line: unknown ids (with close matches), games for more than one player (a
game is single-player when its reset with one player gives TextArena's ``SinglePlayerState``), games that
need nltk data that is not installed (word games: ``words``, ``averaged_perceptron_tagger_eng``; nothing
is downloaded, ``nltk.download`` is held off while a game module imports) and games that do not import.

**Rows** (:func:`make_rows`): each row is a seed whose opening no earlier row shows; a game whose opening
does not depend on the seed (Mastermind, TowerOfHanoi, GuessTheNumber, Minesweeper: only the hidden state
differs) gets "Game <seed>." as the opening's first line, so its held-out games are new prompts with new
hidden states. The trainer splits the rows by a hash of their prompt (``trace_train.tasks``), so no
held-out opening occurs in training.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import random
import re
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .base import Message, StepResult

__all__ = ["TextArenaEnv", "TextArenaSnapshot", "make_rows", "demonstration", "check_game", "SYSTEM_PROMPT",
           "EXPERT_GAMES"]

SYSTEM_PROMPT = ("You are playing a single-player text game. Each turn, reply with exactly one move, written "
                 "in square brackets in the format the game asks for, and nothing else.")
PATIENCE = 64
"""Draws of a game's seed in a row without a new opening before :func:`make_rows` takes the game as exhausted."""
_RANDOM_LOCK = threading.Lock()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---------------------------------------------------------------------------------------------------
# Finding and checking games
# ---------------------------------------------------------------------------------------------------


def _registry() -> dict:
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError:
        raise ValueError("task textarena needs the package textarena (pip install 'trace-rl[testbeds]')") from None
    return ENV_REGISTRY


@contextmanager
def _no_downloads():
    """Hold off ``nltk.download`` (TextArena's word games call it when imported): nothing is fetched at run
    time; a missing corpus then fails at reset with nltk's LookupError, reported in one line."""
    try:
        import nltk
    except ImportError:
        yield
        return
    saved = nltk.download
    nltk.download = lambda *args, **kwargs: False
    try:
        yield
    finally:
        nltk.download = saved


def _one_line(error: BaseException) -> str:
    text = _ANSI.sub("", str(error)).strip()
    return " ".join(text.split())[:300] or type(error).__name__


def _missing_resource(error: LookupError) -> str | None:
    match = re.search(r"Resource\s+(\S+)\s+not found", _ANSI.sub("", str(error)))
    return match.group(1).strip("'\"") if match else None


def _build(env_id: str, kwargs: Mapping[str, Any]):
    """The game ``env_id`` unwrapped, with its registered options and ``kwargs`` over them."""
    registry = _registry()
    if not isinstance(env_id, str) or env_id not in registry:
        close = difflib.get_close_matches(str(env_id), list(registry), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown textarena game {env_id!r}{hint}")
    spec = registry[env_id]
    try:
        with _no_downloads():
            entry = spec.entry_point
            if isinstance(entry, str):
                module, _, name = entry.partition(":")
                entry = getattr(importlib.import_module(module), name)
            return entry(**{**spec.kwargs, **dict(kwargs)})
    except LookupError as error:
        raise _data_error(env_id, error) from None
    except TypeError as error:
        raise ValueError(f"textarena game {env_id!r} rejects `game_kwargs` {dict(kwargs)}: {_one_line(error)}") \
            from None
    except Exception as error:  # noqa: BLE001 - a game module that does not import or build: one line
        raise ValueError(f"textarena game {env_id!r} cannot be built: {type(error).__name__}: "
                         f"{_one_line(error)}") from None


def _data_error(env_id: str, error: LookupError) -> ValueError:
    resource = _missing_resource(error)
    if resource is None:
        return ValueError(f"textarena game {env_id!r} is missing data: {_one_line(error)}")
    return ValueError(f"textarena game {env_id!r} needs the nltk resource {resource!r}, which is not installed "
                      f"and is not downloaded at run time (install it where there is a network: python -m "
                      f"nltk.downloader {resource}, or set NLTK_DATA)")


def _reset(game, env_id: str, seed: int) -> None:
    """Reset ``game`` for one player; a game for more than one player is refused in one line."""
    from textarena.state import SinglePlayerState

    try:
        with _no_downloads():
            game.reset(num_players=1, seed=seed)
    except LookupError as error:
        raise _data_error(env_id, error) from None
    except (AssertionError, ValueError) as error:
        raise ValueError(f"textarena game {env_id!r} is not a single-player game (its reset with one player "
                         f"says: {_one_line(error)}); only single-player games are supported") from None
    except Exception as error:  # noqa: BLE001 - a game that cannot start (missing files): one line
        raise ValueError(f"textarena game {env_id!r} cannot be reset: {type(error).__name__}: "
                         f"{_one_line(error)}") from None
    state = getattr(game, "state", None)
    if not isinstance(state, SinglePlayerState):
        raise ValueError(f"textarena game {env_id!r} is not a single-player game (it keeps a "
                         f"{type(state).__name__}); only single-player games are supported")


# ---------------------------------------------------------------------------------------------------
# One game with its own random state
# ---------------------------------------------------------------------------------------------------


class _Game:
    """A TextArena game with its private ``random`` state (see the module docstring)."""

    def __init__(self, env_id: str, kwargs: Mapping[str, Any], seed: int):
        self.env_id, self.kwargs, self.seed = env_id, dict(kwargs), int(seed)
        self.game = _build(env_id, kwargs)
        self.random_state = random.Random(self.seed).getstate()
        self.call(lambda: _reset(self.game, env_id, self.seed))

    def call(self, fn):
        """``fn()`` with this game's ``random`` state in the process-wide ``random`` module."""
        with _RANDOM_LOCK:
            outer = random.getstate()
            random.setstate(self.random_state)
            try:
                return fn()
            finally:
                self.random_state = random.getstate()
                random.setstate(outer)

    def new_messages(self) -> str:
        """The game's messages to the player since the last call, without the echo of its own action."""
        from textarena.core import ObservationType

        _, messages = self.game.get_observation()
        return "\n\n".join(text.strip() for _, text, kind in messages
                           if kind != ObservationType.PLAYER_ACTION and text.strip())

    @property
    def state(self):
        return self.game.state


def opening_text(env_id: str, kwargs: Mapping[str, Any], seed: int, *, numbered: bool) -> str:
    """The user message that opens game ``env_id`` with ``seed``."""
    text = _Game(env_id, kwargs, seed).new_messages()
    return f"Game {seed}.\n\n{text}" if numbered else text


@dataclass(frozen=True)
class TextArenaSnapshot:
    """A mid-game state: the game deep-copied with its ``random`` state (restored from a further copy, so
    later steps never change it)."""

    game: _Game
    row: Mapping[str, Any]
    turns: int


class TextArenaEnv:
    """A TextArena single-player game (see the module docstring). Rows hold ``game`` (an env id),
    ``kwargs`` (constructor options), ``seed`` and ``numbered``; ``make_rows`` makes them."""

    def __init__(self, *, system_prompt: str | None = None, success_threshold: float = 1.0):
        if isinstance(success_threshold, bool) or not isinstance(success_threshold, (int, float)) \
                or not 0 < success_threshold <= 1:
            raise ValueError(f"`success_threshold` must be a number in (0, 1], got {success_threshold!r}")
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self.success_threshold = float(success_threshold)
        self._game: _Game | None = None
        self._row: Mapping[str, Any] = {}
        self._turns = 0

    @property
    def game(self) -> _Game:
        if self._game is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._game

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        missing = {"game", "seed"} - set(row)
        if missing:
            raise ValueError(f"textarena rows need the keys {sorted(missing)}; got {sorted(row)}")
        self._game = _Game(row["game"], row.get("kwargs") or {}, int(row["seed"]))
        self._row, self._turns = dict(row), 0
        text = self._game.new_messages()
        if row.get("numbered"):
            text = f"Game {row['seed']}.\n\n{text}"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]

    def step(self, action: str) -> StepResult:
        game = self.game
        if game.state.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        game.call(lambda: game.game.step(action))
        self._turns += 1
        state = game.state
        invalid = bool(state.error_count or state.game_info[0].get("invalid_move"))  # a retry, or the end
        text = game.new_messages()
        if state.done:
            reason = state.game_info[0].get("reason")
            text = "\n\n".join(t for t in (text, f"Game over: {reason}" if reason else "Game over.") if t)
        return StepResult(text or "(no message)", done=bool(state.done), invalid=invalid)

    def score(self) -> float:
        """TextArena's end-of-game reward for the player (0 while the game is not over)."""
        rewards = self.game.state.rewards if self.game.state.done else None
        return float(rewards[0]) if rewards else 0.0

    def verify(self) -> float:
        return 1.0 if self.game.state.done and self.score() >= self.success_threshold else 0.0

    def metrics(self) -> dict[str, float]:
        """``success`` (the reward), ``score`` (TextArena's raw reward) and ``finished`` (the game ended)."""
        return {"success": self.verify(), "score": self.score(), "finished": float(self.game.state.done)}

    def snapshot(self) -> TextArenaSnapshot:
        return TextArenaSnapshot(copy.deepcopy(self.game), self._row, self._turns)

    def restore(self, snapshot: TextArenaSnapshot) -> None:
        if not isinstance(snapshot, TextArenaSnapshot):
            raise ValueError(f"`snapshot` must be a TextArenaSnapshot, got {type(snapshot).__name__}")
        self._game, self._row, self._turns = copy.deepcopy(snapshot.game), snapshot.row, snapshot.turns


def check_game(env_id: str, kwargs: Mapping[str, Any] | None = None) -> None:
    """Raise a one-line ``ValueError`` unless ``env_id`` is a single-player game that builds and resets."""
    _Game(env_id, kwargs or {}, 0)


# ---------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------


def _opening_varies(env_id: str, kwargs: Mapping[str, Any], probes: int = 8) -> bool:
    return len({opening_text(env_id, kwargs, s, numbered=False) for s in range(probes)}) > 1


def make_rows(env_ids: str | Sequence[str], size: int, *, seed: int,
              game_kwargs: Mapping[str, Any] | None = None) -> list[dict]:
    """Up to ``size`` rows of the games ``env_ids`` (a list mixes them: each row draws its game, its
    ``level`` being the index in the list), each a seed whose opening no earlier row shows. A game with
    fewer distinct openings (FrozenLake-v0 has a few hundred maps) gives fewer rows: it stops after
    ``PATIENCE`` draws in a row without a new one. Each row has the stable ``id`` "<env id>/L<level>/<seed>"."""
    import numpy as np

    ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
    if not ids:
        raise ValueError("`env_id` must be a game id or a non-empty list of them")
    kwargs = dict(game_kwargs or {})
    numbered = {env_id: not _opening_varies(env_id, kwargs) for env_id in ids}
    rng = np.random.default_rng([seed, 49])
    rows, seen, exhausted = [], set(), set()
    for level in rng.integers(0, len(ids), size).tolist():
        env_id = ids[level]
        for _ in range(0 if level in exhausted else PATIENCE):
            game_seed = int(rng.integers(0, 2**31 - 1))
            opening = opening_text(env_id, kwargs, game_seed, numbered=numbered[env_id])
            if (env_id, opening) not in seen:
                seen.add((env_id, opening))
                rows.append({"id": f"{env_id}/L{level}/{game_seed}", "game": env_id, "level": level,
                             "seed": game_seed, "kwargs": kwargs, "numbered": numbered[env_id]})
                break
        else:
            exhausted.add(level)
    return rows


# ---------------------------------------------------------------------------------------------------
# Scripted experts
# ---------------------------------------------------------------------------------------------------


def _frozen_lake(game: _Game) -> list[str]:
    """The shortest path on the shown map (breadth-first search around the holes)."""
    grid, start, goal = (game.state.game_state[k] for k in ("grid", "player_pos", "goal_pos"))
    size = len(grid)
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    parent = {tuple(start): None}
    queue = deque([tuple(start)])
    while queue:
        cell = queue.popleft()
        if cell == tuple(goal):
            break
        for name, (dr, dc) in moves.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and grid[nxt[0]][nxt[1]] != "H" and nxt not in parent:
                parent[nxt] = (cell, name)
                queue.append(nxt)
    path, cell = [], tuple(goal)
    while parent.get(cell):
        cell, name = parent[cell]
        path.append(f"[{name}]")
    return path[::-1]


def _hanoi(game: _Game) -> list[str]:
    """The optimal 2^n - 1 moves from tower A to tower C."""
    def moves(n, a, b, c):
        return [] if n == 0 else moves(n - 1, a, c, b) + [f"[{a} {c}]"] + moves(n - 1, b, a, c)

    return moves(len(game.state.game_state["towers"]["A"]), "A", "B", "C")


def _guess_the_number(game: _Game) -> list[str]:
    """Binary search, played against the game's own hints."""
    low, high, actions = game.game.min_number, game.game.max_number, []
    game.new_messages()  # the opening, which mentions both hints
    while not game.state.done and low <= high:
        guess = (low + high) // 2
        actions.append(f"[{guess}]")
        game.call(lambda: game.game.step(actions[-1]))
        hint = game.new_messages()
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    return actions


EXPERT_GAMES = {"FrozenLakeEnv": _frozen_lake, "TowerOfHanoiEnv": _hanoi, "GuessTheNumberEnv": _guess_the_number}
"""Game classes with a scripted expert."""


def demonstration(row: Mapping[str, Any]) -> list[str]:
    """The actions of one episode of ``row`` by the game's scripted expert (``EXPERT_GAMES``). A game without
    one gets a format demonstration: the first bracketed move its opening shows (so the warmed tiny model
    answers in the game's format, not well)."""
    game = _Game(row["game"], row.get("kwargs") or {}, int(row["seed"]))
    expert = EXPERT_GAMES.get(type(game.game).__name__)
    if expert is not None:
        return expert(game)
    example = re.search(r"\[[^\[\]\n]{1,40}\]", game.new_messages())
    return [example.group() if example else "[move]"]
