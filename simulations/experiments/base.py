"""What an experiment is: a claim, a config dataclass and a function returning a tidy table.

An experiment module defines a frozen ``Config`` dataclass (validated in ``__post_init__``, with a
``seed`` field and a ``quick()`` classmethod giving a few-second size) and ``run(config, units)``,
which returns an :class:`Outcome`. Work is split into *units* (for example one seed of one policy) run
through :class:`Units`, which saves each finished unit, so that an interrupted run continues where it
stopped. Each unit draws its randomness from :func:`unit_rng`, so results do not depend on the order in
which units run or on how often a run was resumed.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

COLUMNS = ("experiment", "arm", "seed", "budget", "metric", "value", "stderr")
"""Leading columns of every tidy table; experiments add their own (depth, step, noise, ...)."""


@dataclass(frozen=True)
class Outcome:
    """What an experiment found.

    Attributes
    ----------
    table : pandas.DataFrame
        Tidy: one row per observation (see ``COLUMNS``).
    headline : dict
        The headline numbers, keyed by policy (arm) name where policies are compared.
    result : str
        The measured result in one or two sentences, with numbers.
    held : bool
        Whether the claim held.
    details : dict
        Other facts worth keeping next to the headline (calibrated parameters, crossing points, ...).
    """

    table: pd.DataFrame
    headline: dict
    result: str
    held: bool
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str
    config: type
    run: Callable[[Any, Units], Outcome]


EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    if experiment.name in EXPERIMENTS:
        raise ValueError(f"experiment {experiment.name!r} is already registered")
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def unit_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A generator for one unit of work, determined by the run's seed and the unit's keys alone."""
    words = [int(seed)] + [k if isinstance(k, int) else zlib.crc32(str(k).encode()) for k in keys]
    return np.random.default_rng(words)


class Units:
    """Run units of work once: each finished unit's table is saved under ``folder`` and reloaded on a rerun.

    With ``folder=None`` nothing is saved (for tests and interactive use). With ``workers`` > 1 (and a
    folder) the missing units run in that many forked processes; every unit draws its randomness from its
    own keys (:func:`unit_rng`), so the tables are the same whatever the number of workers.
    """

    def __init__(self, folder: Path | None = None, *, progress: bool = True, workers: int = 1):
        if not (isinstance(workers, int) and workers >= 1):
            raise ValueError(f"`workers` must be a positive integer, got {workers!r}")
        self.folder = folder
        self.progress = progress
        self.workers = workers

    def map(self, fn: Callable[[Any], pd.DataFrame], keys: Iterable, *, desc: str) -> pd.DataFrame:
        """Concatenated ``fn(key)`` over ``keys``, in order; saved units are read back instead of rerun."""
        keys = list(keys)
        if self.folder is None:
            bar = tqdm(keys, desc=desc, disable=None if self.progress else True, leave=False)
            return pd.concat([fn(key) for key in bar], ignore_index=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        paths = [self.folder / f"{desc}-{i:04d}-{_slug(key)}.csv" for i, key in enumerate(keys)]
        todo = [(fn, key, path) for key, path in zip(keys, paths) if not path.exists()]
        bar = tqdm(total=len(todo), desc=desc, disable=None if self.progress else True, leave=False)
        if self.workers > 1 and len(todo) > 1:
            _PENDING[:] = todo  # before the fork: the workers inherit it (closures need no pickling)
            workers = min(self.workers, len(todo))
            with _fork_pool(workers) as pool:
                for _ in pool.imap_unordered(_run_unit, range(len(todo))):
                    bar.update()
            _PENDING.clear()
        else:
            for task in todo:
                _save_unit(*task)
                bar.update()
        bar.close()
        return pd.concat([_read_unit(path) for path in paths], ignore_index=True)


def _fork_pool(workers: int):
    """``workers`` forked processes that end on the SIGTERM of ``Pool.terminate`` whatever handler the parent
    had installed. SIGTERM is blocked across the fork, so one that reaches a worker before its initializer
    (:func:`_default_sigterm`) ran stays pending until the default action is back, instead of running the
    inherited handler: such a worker was seen waiting on the pool's queue for good, and ``Units.map``
    with it (a full test run held at 33%, and again at 45% on a loaded machine)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return multiprocessing.get_context("fork").Pool(workers, initializer=_default_sigterm)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _default_sigterm() -> None:
    """A forked worker's start: SIGTERM's default action, then SIGTERM unblocked (:func:`_fork_pool`)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


_PENDING: list = []
"""The pending units of the running ``Units.map``, as (fn, key, path), for forked workers."""


def _run_unit(index: int) -> None:
    _save_unit(*_PENDING[index])


def _save_unit(fn: Callable[[Any], pd.DataFrame], key, path: Path) -> None:
    partial = path.with_suffix(f".{os.getpid()}.partial")
    fn(key).to_csv(partial, index=False)
    partial.replace(path)  # atomic: a unit is either finished on disk or absent


def _read_unit(path: Path) -> pd.DataFrame:
    """A saved unit's table; a ValueError naming the file when it cannot be read."""
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path}: cannot read this finished unit ({first}); delete it and rerun "
                         "to compute it again") from None


def _slug(key) -> str:
    text = "_".join(map(str, key)) if isinstance(key, tuple) else str(key)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:80]


def tidy_metrics(experiment: str, rows: list[dict], metrics, *, index: str = "batch", **keys) -> pd.DataFrame:
    """:func:`tidy` of one observation per (row, metric): ``keys``, the row's ``index`` (its batch or step),
    ``metric`` and ``value``; a metric a row lacks is left out."""
    return tidy(experiment, [{**keys, index: r[index], "metric": k, "value": r[k]}
                             for r in rows for k in metrics if k in r])


def tidy(experiment: str, rows: list[dict]) -> pd.DataFrame:
    """A tidy table from row dicts, with the shared columns first (missing ones filled with NaN)."""
    table = pd.DataFrame(rows)
    table.insert(0, "experiment", experiment)
    for column in COLUMNS:
        if column not in table:
            table[column] = np.nan
    extra = [c for c in table.columns if c not in COLUMNS]
    return table[list(COLUMNS) + extra]


def mean_and_stderr(values) -> tuple[float, float]:
    """Mean and standard error (ddof = 1; NaN stderr for a single value)."""
    values = np.asarray(values, dtype=float)
    se = values.std(ddof=1) / np.sqrt(values.size) if values.size > 1 else float("nan")
    return float(values.mean()), float(se)


def summarise(table: pd.DataFrame, by: list[str], *, over: str = "seed") -> pd.DataFrame:
    """Mean and standard error of ``value`` over ``over`` (seeds) for each group of ``by`` (NaN keys kept)."""
    per = table.groupby(by + [over], sort=False, dropna=False)["value"].mean().reset_index()
    grouped = per.groupby(by, sort=False, dropna=False)["value"]
    out = grouped.agg(value="mean", n="count").reset_index()
    out["stderr"] = grouped.std(ddof=1).to_numpy() / np.sqrt(out["n"].to_numpy())
    return out


def by_arm(summary: pd.DataFrame, metrics: Iterable[str], *, digits: int = 4) -> dict[str, dict[str, float]]:
    """{arm: {metric: mean, metric + "_stderr": stderr}} from a :func:`summarise` table by arm and metric."""
    out: dict[str, dict[str, float]] = {}
    wanted = list(metrics)
    for row in summary[summary["metric"].isin(wanted)].itertuples():
        entry = out.setdefault(row.arm, {})
        entry[row.metric] = round(float(row.value), digits)
        entry[f"{row.metric}_stderr"] = round(float(row.stderr), digits)
    return out
