"""reasoning-gym's procedural tasks as an environment: ``task.name=reasoning_gym task.env.dataset=<name>``.

reasoning-gym (Apache-2.0, ``pip install reasoning-gym``) generates questions of 100+ kinds (countdown,
basic_arithmetic, chain_sum, maze, sokoban, ...) with a scorer per data set and, for most of them, a
*curriculum*: discrete difficulty levels per attribute. A row here is one generated question:

``{"id", "dataset", "level", "question", "answer", "entry"}``

where ``entry`` is reasoning-gym's own item (question, answer, metadata), which its scorer reads.

An episode: the system prompt asks for the final answer in ``<answer>...</answer>`` (a turn without the
tag is read whole, reasoning dropped); the question is the user message. ``attempts`` (default 1) is the
number of answers the agent may give: after a wrong one it hears its score and tries again, which makes
the task multi-turn (a prefix is a failed attempt and its feedback). The reward is binary:

    success = score >= threshold,   score = reasoning-gym's ``score_answer(answer, entry)`` in [0, 1]

(``threshold`` defaults to 1.0: full score). Scores are graded (a wrong answer in the right format can
score 0.05), so the raw score of the best attempt is kept: :meth:`ReasoningGymEnv.metrics` reports
``success`` and ``score``, and ``trace-eval`` records both per rollout.

Levels: ``levels=[0, 1, 2]`` mixes rows of those global curriculum levels (each attribute at that level,
capped at its last one; reasoning-gym's ``set_global_level``); ``config`` sets the data set's own
options instead (for data sets without a curriculum, or to pin an option). Training and held-out rows
are generated from different seeds, and the trainer drops training rows whose prompt occurs in the
held-out set (``trace_train.tasks``), so held-out questions never occur in training.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from .base import Message, StepResult
from .tooling import visible_text

__all__ = ["ReasoningGymEnv", "RGState", "reasoning_gym_rows", "check_dataset", "SYSTEM_PROMPT"]

SYSTEM_PROMPT = ("Solve the task. Give your final answer inside <answer> and </answer>, with nothing "
                 "else in the tags.")


def _datasets() -> dict:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ValueError("task.name=reasoning_gym needs the reasoning-gym package: "
                         "pip install -e '.[testbeds]' (make setup installs it)") from None
    return DATASETS


def check_dataset(name: Any) -> str:
    """``name`` if reasoning-gym has a data set of that name; a ValueError listing close names otherwise."""
    datasets = _datasets()
    if not isinstance(name, str) or name not in datasets:
        import difflib

        close = difflib.get_close_matches(str(name), sorted(datasets), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"reasoning_gym: `dataset` must name one of reasoning-gym's {len(datasets)} data sets, "
                         f"got {name!r}{hint}")
    return name


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists and other non-JSON values as strings (rows must be JSON)."""
    return json.loads(json.dumps(value, default=str))


def _configs(dataset: str, levels: Sequence[int] | None, config: Mapping[str, Any], *, seed: int, size: int):
    """``(level, config)`` per requested level: the curriculum's configuration at that global level, with
    ``config`` on top; without ``levels``, the data set's default configuration with ``config``."""
    from reasoning_gym.factory import CURRICULA, DATASETS

    dataset_cls, config_cls = DATASETS[dataset]
    if levels is None:
        try:
            return [(None, config_cls(**{**config, "seed": seed, "size": size}))]
        except TypeError as error:
            raise ValueError(f"reasoning_gym: bad `config` for {dataset!r}: {error}") from None
    if dataset not in CURRICULA:
        raise ValueError(f"reasoning_gym: {dataset!r} has no curriculum, so `levels` cannot apply; "
                         f"set its options with task.env.config instead")
    if not levels or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in levels):
        raise ValueError(f"reasoning_gym: `levels` must be a non-empty list of levels >= 0, got {list(levels)!r}")
    curriculum = CURRICULA[dataset]()
    top = max(len(attribute.levels) for attribute in curriculum.attributes.values()) - 1
    if max(levels) > top:
        raise ValueError(f"reasoning_gym: {dataset!r}'s curriculum has levels 0..{top}, got {max(levels)}")
    out = []
    for level in levels:
        curriculum = CURRICULA[dataset]()
        curriculum.set_global_level(level)
        try:
            out.append((level, curriculum.generate_configuration({**config, "seed": seed, "size": size})))
        except TypeError as error:
            raise ValueError(f"reasoning_gym: bad `config` for {dataset!r}: {error}") from None
    return out


def reasoning_gym_rows(source: None, *, split: str, subset: str | None, size: int, seed: int,
                       dataset: str | None = None, levels: Sequence[int] | None = (0,),
                       config: Mapping[str, Any] | None = None) -> list[dict]:
    """``size`` generated questions of ``dataset``, levels drawn evenly at random (seeded) from ``levels``.

    Each level's questions come from reasoning-gym's generator seeded with ``(seed, level)``; a row's ``id``
    (``dataset/L<level>/<seed>/<index>``) is stable across calls with the same arguments.
    """
    import numpy as np

    if dataset is None:
        raise ValueError("reasoning_gym: set the data set, e.g. task.env.dataset=countdown")
    check_dataset(dataset)
    if levels is not None:
        levels = list(levels)
    level_list = [None] if levels is None else levels
    pick = np.random.default_rng([seed, 17]).integers(0, len(level_list), size)
    counts = np.bincount(pick, minlength=len(level_list))
    from reasoning_gym.factory import DATASETS

    by_level = {}
    for i, (level, cfg) in enumerate(_configs(dataset, levels, dict(config or {}), seed=seed, size=1)):
        n = int(counts[i])
        cfg = replace(cfg, seed=int(np.random.default_rng([seed, i]).integers(2**31)), size=max(n, 1))
        try:
            generator = DATASETS[dataset][0](config=cfg)
        except (AssertionError, ValueError) as error:
            raise ValueError(f"reasoning_gym: {dataset!r} rejected its configuration {cfg}: {error}") from None
        rows = []
        for j in range(n):
            entry = _plain(generator[j])
            rows.append({"id": f"{dataset}/L{level if level is not None else '-'}/{seed}/{j}", "dataset": dataset,
                         "level": level, "question": entry["question"], "answer": str(entry["answer"]),
                         "entry": entry})
        by_level[i] = iter(rows)
    return [next(by_level[int(i)]) for i in pick]


def demonstration(row: Mapping[str, Any]) -> list[str]:
    """The scripted expert: the data set's reference answer, in the answer tags."""
    return [f"<answer>{row['answer']}</answer>"]


@dataclass(frozen=True)
class RGState:
    """The whole state of an episode (a snapshot is this value)."""

    row_id: str
    attempts_left: int
    best_score: float = 0.0
    answers: tuple[str, ...] = ()
    done: bool = False


def _answer_of(action: str) -> str:
    from reasoning_gym.utils import extract_answer

    text = visible_text(action)
    tagged = extract_answer(text)
    return (tagged if tagged is not None else text).strip()


class ReasoningGymEnv:
    """One reasoning-gym question per episode (see the module docstring for rows, reward and options)."""

    concurrency_safe = True
    """Instances hold immutable state values; scorers are pure functions."""

    def __init__(self, dataset: str, *, threshold: float = 1.0, attempts: int = 1, system_prompt: str | None = None):
        check_dataset(dataset)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"reasoning_gym: `threshold` must be a score in (0, 1], got {threshold!r}")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"reasoning_gym: `attempts` must be a positive integer, got {attempts!r}")
        from reasoning_gym.factory import get_score_answer_fn

        self.dataset, self.threshold, self.attempts = dataset, float(threshold), attempts
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self._score_fn = get_score_answer_fn(dataset)
        self._entry: dict | None = None
        self._state: RGState | None = None

    @property
    def state(self) -> RGState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._state

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        missing = {"id", "question", "entry"} - set(row)
        if missing:
            raise ValueError(f"reasoning_gym rows need the keys {sorted(missing)}; got {sorted(row)}")
        if row.get("dataset", self.dataset) != self.dataset:
            raise ValueError(f"row {row['id']!r} is of data set {row['dataset']!r}, the environment scores "
                             f"{self.dataset!r}")
        self._entry = dict(row["entry"])
        self._state = RGState(str(row["id"]), self.attempts)
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": str(row["question"])}]

    def score(self, answer: str) -> float:
        """reasoning-gym's score of ``answer`` for this episode's question, in [0, 1] (0 if the scorer fails)."""
        try:
            value = float(self._score_fn(answer, self._entry))
        except Exception:  # noqa: BLE001 - a scorer that cannot read an answer gives it nothing
            return 0.0
        return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0

    def step(self, action: str) -> StepResult:
        s = self.state
        if s.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        answer = _answer_of(action)
        value = self.score(answer) if answer else 0.0
        solved = value >= self.threshold
        left = s.attempts_left - 1
        self._state = s = replace(s, attempts_left=left, best_score=max(s.best_score, value),
                                  answers=s.answers + (answer,), done=solved or left == 0)
        if solved:
            return StepResult("Correct.", done=True)
        if not answer:
            feedback = "No answer found: put the final answer inside <answer> and </answer>."
        else:
            feedback = f"Not correct (score {value:.2f} of 1)."
        if s.done:
            return StepResult(f"{feedback} No attempts left.", done=True, invalid=not answer)
        tries = "1 attempt left." if left == 1 else f"{left} attempts left."
        return StepResult(f"{feedback} {tries} Try again.", invalid=not answer)

    def verify(self) -> float:
        return float(self.state.best_score >= self.threshold)

    def metrics(self) -> dict[str, float]:
        """``success`` (the binary reward) and ``score`` (the best raw score of the episode's answers)."""
        return {"success": self.verify(), "score": self.state.best_score}

    def snapshot(self) -> tuple[dict | None, RGState]:
        return (self._entry, self.state)

    def restore(self, snapshot: tuple[dict | None, RGState]) -> None:
        self._entry, self._state = snapshot
