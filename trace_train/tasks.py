"""Tasks for the trainer: an environment (``trace_train.envs.ENVIRONMENTS``) plus training and held-out rows.

``task.name`` picks the environment; ``task.env`` holds its options (see ``trace_train/envs/registry.py``);
``task.train`` / ``task.eval`` say where the rows come from. The same loaders serve ``trace-eval``.

==============  ===================================================================================
name            rows
==============  ===================================================================================
guess_number    generated: ``task.rows`` = {low, high, max_guesses} (or ``highs``: a list of ranges to
                mix difficulties); ``train_size`` and ``eval_size``
math_python     ``train`` / ``eval``: a Hugging Face data set id or a local JSONL/Parquet file with a
                problem and an answer (DeepScaleR, AIME, AMC, MATH-500 layouts; ``trace_train.data.math``)
search_qa       ``train`` / ``eval``: HotpotQA / 2WikiMultiHopQA-style questions (``trace_train.data.qa``)
                or "demo" (the bundled demo set); ``task.env.corpus`` or ``task.env.retriever_url``
bfcl            BFCL v4 multi-turn, the stored 80/20 split ("train" / "test"); ``task.rows.subsets``
==============  ===================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .envs import ENVIRONMENTS, EnvFactory, make_env_factory

__all__ = ["TaskConfig", "Task", "build_task", "load_rows"]

_GUESS_ROWS = {"low": 1, "high": 16, "max_guesses": 5}
_ROW_OPTIONS = {"guess_number": {*_GUESS_ROWS, "highs"}, "bfcl": {"subsets"}, "math_python": set(), "search_qa": set()}


@dataclass(frozen=True)
class TaskConfig:
    name: str = "guess_number"
    """An environment registered in ``trace_train.envs.ENVIRONMENTS`` (see the module table)."""
    env: dict = field(default_factory=dict)
    """Options of the environment (``trace_train/envs/registry.py`` lists them per environment)."""
    train: str | None = None
    """Training rows: a Hugging Face data set id, a local JSONL/Parquet file, "demo" (search_qa) or a
    BFCL split; generated for guess_number."""
    eval: str | None = None
    """Held-out rows, in the same forms."""
    split: str = "train"
    """Split of the training data set on the Hub (local files have one)."""
    eval_split: str = "train"
    """Split of the held-out data set on the Hub (AIME, AMC and MATH-500 copies often ship only "train"/"test")."""
    subset: str | None = None
    """Configuration of the training data set on the Hub (e.g. FlashRAG's "hotpotqa")."""
    eval_subset: str | None = None
    """Configuration of the held-out data set on the Hub (e.g. FlashRAG's "2wikimultihopqa")."""
    train_size: int = 4096
    """At most this many training rows (generated for guess_number)."""
    eval_size: int = 64
    """At most this many held-out rows."""
    rows: dict = field(default_factory=dict)
    """How rows are made: guess_number {low, high, max_guesses, highs}; bfcl {subsets: [...]}."""

    def __post_init__(self):
        ENVIRONMENTS.check(self.name)
        if self.train_size < 1 or self.eval_size < 1:
            raise ValueError("`train_size` and `eval_size` must be at least 1")
        unknown = sorted(set(self.rows) - _ROW_OPTIONS.get(self.name, set()))
        if unknown:
            raise ValueError(f"task {self.name!r} has no row option {unknown[0]!r}; "
                             f"row options: {sorted(_ROW_OPTIONS.get(self.name, set())) or 'none'}")
        if self.name in ("math_python", "search_qa") and self.train is None:
            raise ValueError(f"task {self.name!r} needs `task.train` (a data set id or a local file)")
        if self.name == "guess_number" and (self.train or self.eval):
            raise ValueError("guess_number generates its rows: leave `task.train` and `task.eval` unset")

    @property
    def binary_rewards(self) -> bool:
        return self.env.get("reward", "exact_match") != "token_f1"


@dataclass(frozen=True)
class Task:
    make_env: EnvFactory
    """Fresh environments for the engine; also carries the tool schemas for the chat template."""
    train_rows: list
    eval_rows: list
    binary_rewards: bool = True


def load_rows(cfg: TaskConfig, which: str, *, seed: int) -> list[dict]:
    """The ``which`` ("train" or "eval") rows of a task."""
    source, size = (cfg.train, cfg.train_size) if which == "train" else (cfg.eval, cfg.eval_size)
    if cfg.name == "guess_number":
        return _guess_rows(cfg, size, seed if which == "train" else seed + 1_000_003)
    if cfg.name == "bfcl":
        from .envs.bfcl import SUBSETS, bfcl_rows

        split = source or ("train" if which == "train" else "test")
        return bfcl_rows(tuple(cfg.rows.get("subsets", SUBSETS)), split=split)[:size]
    if source is None:  # held-out rows default to the training file's first rows, the training rows skip them
        return []
    split, subset = (cfg.split, cfg.subset) if which == "train" else (cfg.eval_split, cfg.eval_subset)
    loaders: dict[str, Callable[[], list]] = {"math_python": lambda: _math(source, split, subset, size),
                                               "search_qa": lambda: _qa(source, split, subset, size)}
    return loaders[cfg.name]()


def _guess_rows(cfg: TaskConfig, size: int, seed: int) -> list[dict]:
    """Generated games. ``highs`` (a list) mixes difficulties: each row draws its range [low, high] from
    it, so that, as in real data sets, some prompts are almost always solved and some almost never."""
    import numpy as np

    from .envs.guess_number import make_rows

    options = {**_GUESS_ROWS, **cfg.rows}
    highs = options.pop("highs", None)
    if highs is None:
        return make_rows(size, seed=seed, **options)
    choice = np.random.default_rng([seed, 7]).integers(0, len(highs), size)
    rows = {h: iter(make_rows(int((choice == i).sum()), seed=seed + i, **{**options, "high": int(h)}))
            for i, h in enumerate(highs)}
    return [next(rows[highs[i]]) for i in choice]


def _math(source: str, split: str, subset: str | None, size: int) -> list[dict]:
    from .data.math import load_math_problems
    from .envs.math_python import math_rows

    return math_rows(load_math_problems(source, split=split, subset=subset, limit=size))


def _qa(source: str, split: str, subset: str | None, size: int) -> list[dict]:
    from .data.qa import demo_paths, load_qa_examples
    from .envs.search_qa import qa_rows

    path = demo_paths()[1] if source == "demo" else source
    return qa_rows(load_qa_examples(path, split=split, subset=subset, limit=size))


def build_task(cfg: TaskConfig, *, seed: int) -> Task:
    """The environment factory and the rows of a task."""
    env_options: dict[str, Any] = dict(cfg.env)
    if cfg.name == "search_qa" and "corpus" not in env_options and "retriever_url" not in env_options:
        from .data.qa import demo_paths

        env_options["corpus"] = str(demo_paths()[0])  # the bundled demo corpus
    factory = make_env_factory(cfg.name, env_options)
    train = load_rows(cfg, "train", seed=seed)
    held_out = load_rows(cfg, "eval", seed=seed)
    if not held_out:  # no separate held-out source: keep the first eval_size rows aside
        held_out, train = train[:cfg.eval_size], train[cfg.eval_size:]
    if not train:
        raise ValueError(f"task {cfg.name!r} has no training rows left (train_size {cfg.train_size}, "
                         f"eval_size {cfg.eval_size})")
    return Task(factory, train, held_out, factory.binary_rewards)
