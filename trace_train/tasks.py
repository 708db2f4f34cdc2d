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

import hashlib
import json
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
    dropped: int = 0
    """Training rows left out because their prompt occurs in the held-out set (:func:`hold_out_prompts`)."""
    generated: bool = False
    """Whether the rows were generated, split by prompt (:func:`generated_rows`)."""
    demonstration: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
    """The environment's scripted expert (``TaskSpec.demonstration``), if it has one."""

    def describe(self, name: str) -> str:
        """One start-up line: rows that train, rows held out and where those come from."""
        if not self.eval_rows:
            return f"task {name}: {len(self.train_rows)} training rows, none held out (held-out evaluation off)"
        where = ("generated; a quarter of the distinct prompts, chosen by a hash of the prompt, is held out"
                 if self.generated else
                 "taken out of the training rows" if self.held_out_from_train else "a separate held-out set")
        dropped = (f"; {self.dropped} training rows whose prompt is held out were dropped" if self.dropped
                   else "")
        return (f"task {name}: {len(self.train_rows)} training rows, {len(self.eval_rows)} held out ({where}; "
                f"no held-out prompt occurs in training{dropped})")


HELD_OUT_SHARE = 64 / 256
"""Share of a generating task's prompts that are held out: a prompt is held out when the first byte of a
BLAKE2b hash of it is below 64 (:func:`is_held_out_prompt`), whatever row or seed shows it."""


def is_held_out_prompt(key: str) -> bool:
    """Whether the prompt ``key`` (:func:`prompt_keys`) belongs to the held-out side of a generating task."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()[0] < 256 * HELD_OUT_SHARE


def generated_rows(make: Callable[[int], list], size: int, keys_of: Callable[[list], list[str]], *,
                   held_out: bool, what: str) -> list:
    """``size`` rows of a generating task on one side of the prompt split: those of ``make(n)`` whose prompt
    is held out (``held_out``) or is not, drawing 4x more rows each try (at most 4 tries).

    Splitting the prompts, not the rows, keeps every held-out prompt out of training even when the task has
    few distinct prompts (a game whose hidden target is not in its prompt)."""
    n, rows = size, []
    for _ in range(4):
        drawn = make(max(n, size))
        rows = [row for row, key in zip(drawn, keys_of(drawn)) if is_held_out_prompt(key) == held_out]
        if len(rows) >= size or len(drawn) < max(n, size):  # enough, or the generator has no more
            break
        n *= 4
    if not rows:
        side = "held out" if held_out else "left for training"
        raise ValueError(f"{what}: none of its generated prompts is {side} (a quarter of the distinct prompts is held "
                         f"out, by a hash of the prompt), so held-out rows would repeat training prompts; give the "
                         f"rows more distinct prompts (for guess_number: a larger task.rows.shift), or set "
                         f"eval.every=0")
    return rows[:size]


def load_rows(cfg: TaskConfig, which: str, *, seed: int, keys_of: Callable[[list], list[str]] | None = None) -> list[dict]:
    """The ``which`` ("train" or "eval") rows of a task, as its spec makes or loads them. Generated rows
    are drawn from their side of the prompt split (:func:`generated_rows`) when ``keys_of`` is given."""
    spec = find_environment(cfg.name).spec
    train = which == "train"
    source = (cfg.train if train else cfg.eval) or spec.default_sources[0 if train else 1]
    if source is None and spec.data != "generated":
        return []  # held-out rows default to the training set's first rows, which training then skips
    split, subset = (cfg.split, cfg.subset) if train else (cfg.eval_split, cfg.eval_subset)
    size, seed = (cfg.train_size, seed) if train else (cfg.eval_size, seed + _HELD_OUT_SEED)
    if source is not None and spec.data == "generated":  # stored rows instead of generated ones
        return read_rows(source, split=split, subset=subset, size=size, seed=seed)
    from_env = {name: cfg.env[name] for name in spec.env_row_options if name in cfg.env}
    make = lambda n: spec.rows(source, split=split, subset=subset, size=n, seed=seed,  # noqa: E731
                               **{**spec.row_options, **cfg.rows, **from_env})
    if source is None and keys_of is not None:
        return generated_rows(make, size, keys_of, held_out=not train, what=f"task {cfg.name!r}")
    return make(size)


def prompt_keys(make_env: Callable[[], Any], rows: Sequence[Mapping[str, Any]],
                key: Callable[[Mapping[str, Any]], Any] | None = None) -> list[str]:
    """What each row shows the model: ``key(row)`` where the task spec gives one, else the opening messages
    of a fresh environment reset on the row (one environment, reset row after row), as JSON."""
    if key is not None:
        return [json.dumps(key(row), sort_keys=True, default=str) for row in rows]
    env = make_env() if rows else None
    return [json.dumps(env.reset(row), sort_keys=True, default=str) for row in rows]


def hold_out_prompts(train: list, held_out: list, keys_of: Callable[[list], list[str]]) -> tuple[list, int]:
    """The training rows whose prompt does not occur in ``held_out``, and how many were dropped: held-out
    success then measures prompts the policy never trained on (a hidden target or seed alone does not
    make a new prompt)."""
    if not held_out:
        return train, 0
    seen = set(keys_of(held_out))
    kept = [row for row, key in zip(train, keys_of(train)) if key not in seen]
    return kept, len(train) - len(kept)


def build_task(cfg: TaskConfig, *, seed: int, hold_out: bool = True) -> Task:
    """The environment factory and the rows of a task. Without a held-out source, ``hold_out`` keeps the
    first min(eval_size, len(train) // 4) training rows aside (at least a quarter of the rows train); with
    ``hold_out=False`` none are taken and ``eval_rows`` is empty."""
    source = find_environment(cfg.name)
    options = source.spec.env_defaults(cfg.env) if source.spec.env_defaults else dict(cfg.env)
    factory = build_factory(source, options)
    keys_of = lambda rows: prompt_keys(factory, rows, source.spec.prompt_key)  # noqa: E731
    train = load_rows(cfg, "train", seed=seed, keys_of=keys_of if hold_out else None)
    held_out = load_rows(cfg, "eval", seed=seed, keys_of=keys_of) if hold_out else []
    from_train = not held_out and source.spec.data != "generated"
    if from_train:  # no separate held-out source: keep a share of the training rows aside, or none
        n = min(cfg.eval_size, len(train) // 4) if hold_out else 0
        held_out, train = train[:n], train[n:]
    if not train:
        raise ValueError(f"task {cfg.name!r} has no training rows (train_size {cfg.train_size})")
    before = len(train)
    train, dropped = hold_out_prompts(train, held_out, keys_of)
    if not train:
        raise ValueError(f"task {cfg.name!r}: all {before} training rows show a prompt that is also held out, so "
                         f"nothing would train on an unseen prompt; make the rows' prompts distinct (for "
                         f"guess_number: task.rows.shift), give a separate task.eval, or set eval.every=0")
    return Task(factory, train, held_out, factory.binary_rewards, held_out_from_train=from_train and bool(held_out),
                demonstration=source.spec.demonstration, dropped=dropped,
                generated=source.spec.data == "generated" and cfg.train is None and cfg.eval is None)
