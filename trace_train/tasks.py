"""Tasks for the trainer: an environment plus training and held-out rows, for any environment.

``task.name`` finds the environment (a registered name, an import path ``package.module:attribute`` or
a ``trace_rl.environments`` entry point; see ``trace_train.envs.spec``), ``task.env`` holds its options,
and ``task.train`` / ``task.eval`` say where the rows come from. How rows are made or loaded, which row
options (``task.rows``) they take and whether rewards are binary is the environment's
:class:`~.envs.spec.TaskSpec`, declared next to it; this module has no per-environment branches.

==============  ===================================================================================
name            rows
==============  ===================================================================================
guess_number    generated: ``task.rows`` = {low, high, max_guesses} (or ``highs``: a list of ranges to
                mix difficulties); ``train_size`` and ``eval_size``; or stored rows in ``train`` / ``eval``
math_python     ``train`` / ``eval``: a Hugging Face data set id or a local JSONL/Parquet file with a
                problem and an answer (DeepScaleR, AIME, AMC, MATH-500 layouts; ``trace_train.data.math``)
search_qa       ``train`` / ``eval``: HotpotQA / 2WikiMultiHopQA-style questions (``trace_train.data.qa``)
                or "demo" (the bundled demo set); ``task.env.corpus`` or ``task.env.retriever_url``
bfcl            BFCL v4 multi-turn, the stored 80/20 split ("train" / "test"); ``task.rows.subsets``
any other       ``train`` / ``eval``: a local JSONL/Parquet file or a Hugging Face data set id, each row
                passed unchanged to the environment's ``reset`` (the row schema: ``envs/spec.py``)
==============  ===================================================================================

Without ``task.eval``, loaded rows are split only when held-out evaluation is on (``hold_out``): the first
``min(eval_size, len(rows) // 4)`` rows are held out and never trained on; with evaluation off every row
trains. :meth:`Task.describe` is the start-up line saying how many rows train and how many are held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .configs import TaskConfig
from .envs import EnvFactory
from .envs.spec import build_factory, find_environment, read_rows

__all__ = ["TaskConfig", "Task", "build_task", "load_rows"]

_HELD_OUT_SEED = 1_000_003


@dataclass(frozen=True)
class Task:
    make_env: EnvFactory
    """Fresh environments for the engine; also carries the tool schemas for the chat template."""
    train_rows: list
    eval_rows: list
    binary_rewards: bool = True
    held_out_from_train: bool = False
    """Whether ``eval_rows`` were taken out of the training rows (no separate held-out source)."""
    demonstration: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
    """The environment's scripted expert (``TaskSpec.demonstration``), if it has one."""

    def describe(self, name: str) -> str:
        """One start-up line: rows that train, rows held out and where those come from."""
        if not self.eval_rows:
            return f"task {name}: {len(self.train_rows)} training rows, none held out (held-out evaluation off)"
        where = "taken out of the training rows" if self.held_out_from_train else "a separate held-out set"
        return f"task {name}: {len(self.train_rows)} training rows, {len(self.eval_rows)} held out ({where})"


def load_rows(cfg: TaskConfig, which: str, *, seed: int) -> list[dict]:
    """The ``which`` ("train" or "eval") rows of a task, as its spec makes or loads them."""
    spec = find_environment(cfg.name).spec
    train = which == "train"
    source = (cfg.train if train else cfg.eval) or spec.default_sources[0 if train else 1]
    if source is None and spec.data != "generated":
        return []  # held-out rows default to the training set's first rows, which training then skips
    split, subset = (cfg.split, cfg.subset) if train else (cfg.eval_split, cfg.eval_subset)
    size, seed = (cfg.train_size, seed) if train else (cfg.eval_size, seed + _HELD_OUT_SEED)
    if source is not None and spec.data == "generated":  # stored rows instead of generated ones
        return read_rows(source, split=split, subset=subset, size=size, seed=seed)
    return spec.rows(source, split=split, subset=subset, size=size, seed=seed, **{**spec.row_options, **cfg.rows})


def build_task(cfg: TaskConfig, *, seed: int, hold_out: bool = True) -> Task:
    """The environment factory and the rows of a task. Without a held-out source, ``hold_out`` keeps the
    first min(eval_size, len(train) // 4) training rows aside (at least a quarter of the rows train); with
    ``hold_out=False`` none are taken and ``eval_rows`` is empty."""
    source = find_environment(cfg.name)
    options = source.spec.env_defaults(cfg.env) if source.spec.env_defaults else dict(cfg.env)
    factory = build_factory(source, options)
    train = load_rows(cfg, "train", seed=seed)
    held_out = load_rows(cfg, "eval", seed=seed)
    from_train = not held_out
    if from_train:  # no separate held-out source: keep a share of the training rows aside, or none
        n = min(cfg.eval_size, len(train) // 4) if hold_out else 0
        held_out, train = train[:n], train[n:]
    if not train:
        raise ValueError(f"task {cfg.name!r} has no training rows (train_size {cfg.train_size})")
    return Task(factory, train, held_out, factory.binary_rewards, held_out_from_train=from_train and bool(held_out),
                demonstration=source.spec.demonstration)
