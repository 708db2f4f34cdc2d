"""Read a results folder written by ``trace-sim`` and check it, naming the file when something is wrong.

``RESULTS/NAME/`` holds ``config.json``, a tidy ``results.csv`` (columns ``experiment, arm, seed, budget,
metric, value, stderr`` and the experiment's own keys) and ``summary.json`` (``claim``, ``result``,
``held``, ``headline``, ``details``, ``runtime_s``). This module only reads them: figures never run an
experiment. Every problem becomes a :class:`ResultsError` whose message is one line starting with the
path of the file at fault.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ("experiment", "arm", "seed", "budget", "metric", "value", "stderr")
"""Leading columns of every tidy table."""
NUMERIC = ("seed", "value", "stderr")
SUMMARY_KEYS = {"claim": str, "result": str, "held": bool, "headline": dict, "details": dict}
MAX_DEPTH = 32
"""The deepest nesting a results JSON file may have (trace-sim writes at most 5 levels)."""
CONFIG_NUMBERS = ("seeds", "warmup", "batches", "roots", "continuations", "pool", "lr", "steps", "z_limit",
                  "group_size", "tuning_seeds")
"""Config fields that figures compute with: each must be a finite number where a figure reads it."""


class ResultsError(Exception):
    """A results file is missing, unreadable or lacks what a figure needs; the message names the file."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)


class Results:
    """A results folder: ``Results("results").table("effective_ratio", metrics=["effective_ratio"])``.

    Files are read once and cached; every accessor validates what it returns.
    """

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._json: dict[Path, dict] = {}
        self._tables: dict[str, pd.DataFrame] = {}

    def path(self, experiment: str, file: str) -> Path:
        return self.root / experiment / file

    def _missing(self, path: Path, experiment: str) -> ResultsError:
        return ResultsError(path, f"missing; run `trace-sim run {experiment} --out {self.root}` first")

    def _read_json(self, experiment: str, file: str) -> dict:
        path = self.path(experiment, file)
        if path not in self._json:
            if not path.is_file():
                raise self._missing(path, experiment)
            try:
                data = strict_json(path.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as error:
                raise ResultsError(path, f"not readable JSON ({_first_line(error)})") from None
            if not isinstance(data, dict):
                raise ResultsError(path, f"expected a JSON object, found {type(data).__name__}")
            self._json[path] = data
        return self._json[path]

    def summary(self, experiment: str) -> dict:
        """``summary.json``, checked for the keys the report reads."""
        data = self._read_json(experiment, "summary.json")
        path = self.path(experiment, "summary.json")
        for key, kind in SUMMARY_KEYS.items():
            if not isinstance(data.get(key), kind):
                raise ResultsError(
                    path, f"`{key}` must be a JSON {kind.__name__}, found {data.get(key)!r:.40}"
                )
        runtime = data.get("runtime_s")
        if isinstance(runtime, bool) or not isinstance(runtime, (int, float)) or runtime < 0:
            raise ResultsError(path, f"`runtime_s` must be a non-negative number, found {runtime!r:.40}")
        return data

    def config(self, experiment: str, *keys: str) -> dict:
        """``config.json``; each of ``keys`` must be present."""
        data = self._read_json(experiment, "config.json")
        for key in keys:
            if key not in data:
                raise ResultsError(self.path(experiment, "config.json"), f"no `{key}` field")
            value = data[key]
            if key in CONFIG_NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ResultsError(self.path(experiment, "config.json"),
                                   f"`{key}` must be a number, found {value!r:.40}")
        return data

    def table(self, experiment: str, *, metrics=(), columns=()) -> pd.DataFrame:
        """``results.csv`` with the shared columns, ``columns`` and at least one row of each of ``metrics``."""
        path = self.path(experiment, "results.csv")
        if experiment not in self._tables:
            if not path.is_file():
                raise self._missing(path, experiment)
            try:
                table = pd.read_csv(path, low_memory=False)
            except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as error:
                raise ResultsError(path, f"not a readable CSV table ({_first_line(error)})") from None
            _check_shared_columns(path, table)
            self._tables[experiment] = table
        table = self._tables[experiment]
        for column in columns:
            if column not in table:
                raise ResultsError(path, f"no column `{column}`")
        present = set(table["metric"])
        for metric in metrics:
            if metric not in present:
                raise ResultsError(
                    path,
                    f"no rows of metric `{metric}` (written by an older simulator? rerun the experiment)",
                )
        asked = table[table["metric"].isin(metrics)] if metrics else table
        if len(asked) and "value" in asked and pd.to_numeric(asked["value"], errors="coerce").isna().all():
            raise ResultsError(path, "every `value` a figure reads from it is missing (NaN): nothing to draw "
                                     "(rerun the experiment)")
        return table

    def after_warmup(self, experiment: str, *, metrics=(), columns=()) -> pd.DataFrame:
        """The rows of batches past the experiment's ``warmup`` (what its headline averages)."""
        warmup = self.config(experiment, "warmup")["warmup"]
        table = self.table(experiment, metrics=metrics, columns=("batch", *columns))
        return table[table["batch"] >= warmup]


def _check_shared_columns(path: Path, table: pd.DataFrame) -> None:
    for column in COLUMNS:
        if column not in table:
            raise ResultsError(path, f"not a trace-sim results table (no column `{column}`)")
    if table.empty:
        raise ResultsError(path, "no rows")
    for column in NUMERIC:
        if not (pd.api.types.is_numeric_dtype(table[column]) or table[column].isna().all()):
            raise ResultsError(path, f"column `{column}` is not numeric")
        infinite = np.isinf(table[column].to_numpy(dtype=float))
        if infinite.any():  # trace-sim never writes inf; a NaN (an empty cell) is a missing value
            row = int(np.flatnonzero(infinite)[0]) + 2
            raise ResultsError(path, f"line {row}: column `{column}` holds an infinite value")



def strict_json(text: str):
    """``json.loads(text)`` as trace-sim writes JSON: a ValueError for NaN or Infinity (it writes null),
    for nesting deeper than :data:`MAX_DEPTH` and for what ``json.loads`` itself refuses."""
    def refuse(constant):
        raise ValueError(f"holds {constant}, which trace-sim never writes (a missing number is null)")

    try:
        data = json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    deepest, stack = 0, [(data, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    if deepest > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return data


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def seed_summary(table: pd.DataFrame, by: list[str], *, over: str = "seed") -> pd.DataFrame:
    """Mean, standard error and count over ``over`` (seeds) of per-seed means, for each group of ``by``.

    Rows within a seed (batches) are averaged first, so the standard error is between seeds.
    """
    per = table.groupby(by + [over], sort=False, dropna=False)["value"].mean().reset_index()
    grouped = per.groupby(by, sort=False, dropna=False)["value"]
    out = grouped.agg(value="mean", n="count").reset_index()
    out["stderr"] = grouped.std(ddof=1).to_numpy() / np.sqrt(out["n"].to_numpy())
    return out
