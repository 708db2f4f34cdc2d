"""Run an experiment into ``OUT/NAME/``: resolved config, tidy table and summary, resumable.

``OUT/NAME/`` holds

* ``config.json``: the resolved config (every field, defaults included);
* ``results.csv``: the tidy table, one row per observation;
* ``summary.json``: claim, measured result, whether the claim held, the headline numbers (keyed by
  policy where policies are compared), details and the runtime.

A folder with ``summary.json`` is finished: rerunning skips it. A folder with only ``config.json`` is
an interrupted run: its finished units (``units/``) are reused and the rest is run. A folder written
with another config is never mixed with this one: that is an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

from .experiments import get_experiment
from .experiments.base import Units


def resolve_config(name: str, *, quick: bool = False, seed: int = 0):
    """The config an experiment runs with: defaults (or ``quick()``) with the given seed."""
    experiment = get_experiment(name)
    config = experiment.config.quick() if quick else experiment.config()
    return dataclasses.replace(config, seed=seed)


def config_json(config) -> dict:
    """A config as plain JSON data (tuples become lists, nested dataclasses dicts)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _plain(data):
    """JSON-ready data: NaN becomes null (strict JSON has no NaN), NumPy scalars Python ones."""
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if hasattr(data, "item"):
        data = data.item()
    if isinstance(data, float) and math.isnan(data):
        return None
    return data


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(_plain(data), indent=2, allow_nan=False) + "\n")
    partial.replace(path)


def run_experiment(
    name: str, *, out: Path, quick: bool = False, seed: int = 0, progress: bool = True, workers: int = 1
) -> tuple[Path, bool]:
    """Run experiment ``name`` into ``out / name`` unless it is finished there.

    Returns
    -------
    (folder, ran) : (Path, bool)
        The results folder, and False when a finished run was found and skipped.

    Raises
    ------
    ValueError
        If the folder holds a run made with a different config.
    """
    experiment = get_experiment(name)
    config = resolve_config(name, quick=quick, seed=seed)
    resolved = config_json(config)
    folder = Path(out) / name
    config_path = folder / "config.json"
    if config_path.exists():
        if json.loads(config_path.read_text()) != resolved:
            raise ValueError(f"{folder} holds a run with a different config; pass another --out or remove it")
        if (folder / "summary.json").exists():
            return folder, False
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(config_path, resolved)

    start = time.perf_counter()
    outcome = experiment.run(config, Units(folder / "units", progress=progress, workers=workers))
    runtime = time.perf_counter() - start

    partial = folder / "results.partial"
    outcome.table.to_csv(partial, index=False)
    partial.replace(folder / "results.csv")
    _write_json(
        folder / "summary.json",
        {
            "experiment": name,
            "claim": experiment.claim,
            "result": outcome.result,
            "held": outcome.held,
            "headline": outcome.headline,
            "details": outcome.details,
            "quick": quick,
            "seed": seed,
            "runtime_s": round(runtime, 2),
        },
    )
    shutil.rmtree(folder / "units", ignore_errors=True)
    return folder, True
