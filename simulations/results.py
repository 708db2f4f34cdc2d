"""Run an experiment into ``OUT/NAME/``: resolved config, tidy table and summary, resumable.

``OUT/NAME/`` holds

* ``config.json``: the resolved config (every field, defaults included);
* ``results.csv``: the tidy table, one row per observation;
* ``summary.json``: claim, measured result, whether the claim held, the headline numbers (keyed by
  policy where policies are compared), details and the runtime.

A folder with a readable ``summary.json`` is finished: rerunning skips it. A folder with only
``config.json`` (or a ``summary.json`` that cannot be read, which is then rewritten) is an interrupted
run: its finished units (``units/``) are reused and the rest is run. A folder written with another
config is never mixed with this one: that is an error, and so is a ``config.json`` that cannot be read
(the message names the file and the line).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import shlex
import shutil
import time
from pathlib import Path

from trace_theory.benchmark import provenance

from .experiments import get_experiment
from .experiments.base import Units


def resolve_config(name: str, *, quick: bool = False, seed: int = 0, overrides: dict | None = None):
    """The config an experiment runs with: defaults (or ``quick()``) with the given seed and ``overrides``
    (field name -> value; lists become tuples), validated by the config itself."""
    experiment = get_experiment(name)
    config = experiment.config.quick() if quick else experiment.config()
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {"seed": seed}
    for key, value in (overrides or {}).items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ValueError(f"experiment {name!r} has no config field {key!r}; fields: {known}")
        changes[key] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(config, **changes)


def parse_override(text: str) -> tuple[str, object]:
    """``key=value`` with a Python literal value (``arms=("grpo", "dapo{dapo_target=16}")``, ``seeds=3``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise ValueError(f"--set takes key=value, got {text!r}")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        raise ValueError(f"--set {text[:80]!r}: the value must be a Python literal (quote strings)") from None
    return key.strip(), check_literal(value, f"--set {key.strip()}")


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


_SUMMARY_KEYS = ("experiment", "claim", "result", "held", "headline")


MAX_DEPTH = 32
"""The deepest nesting a results JSON file may have (what is written here nests at most 5 levels)."""


def _refuse_constant(constant: str):
    raise ValueError(f"holds {constant}, which trace-sim never writes (a missing number is null)")


def _read_json_file(path: Path) -> dict:
    """A JSON object from ``path`` as this module writes them; a ValueError naming the file (and line)
    when it is not one: invalid JSON, NaN or Infinity (written as null here), nesting deeper than
    :data:`MAX_DEPTH`."""
    try:
        data = json.loads(path.read_text(), parse_constant=_refuse_constant)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as error:  # the constants above, an integer with too many digits
        raise ValueError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    return data


def _depth(value) -> int:
    """Nesting depth of JSON data (lists and dicts), with an explicit stack."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_literal(value, where: str):
    """``value`` (a parsed Python literal) if every number in it is finite, else a ValueError naming
    ``where``: ``1e999`` is a float that passes ``x > 0``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where}: numbers must be finite, got {item}")
        if isinstance(item, complex):
            raise ValueError(f"{where}: complex numbers are not config values")
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return value


def is_finished(folder: Path) -> bool:
    """Whether ``folder`` holds a complete run: a readable ``summary.json`` with every key and a table."""
    try:
        summary = _read_json_file(folder / "summary.json")
    except (OSError, ValueError):
        return False
    return all(key in summary for key in _SUMMARY_KEYS) and (folder / "results.csv").is_file()


def _record(name: str, *, quick: bool, seed: int, overrides: dict | None) -> dict:
    """What a copy of the summary under ``benchmarks/`` must record: the commit, the load, the machine, and
    the ``trace-sim`` command that reruns this experiment with this config."""
    argv = ["run", name, *(["--quick"] if quick else []), "--seed", str(seed)]
    for key, value in (overrides or {}).items():
        argv += ["--set", f"{key}={value!r}"]
    record = provenance("simulations.cli", argv)
    record["command"] = shlex.join(["trace-sim", *argv])
    return record


def run_experiment(
    name: str, *, out: Path, quick: bool = False, seed: int = 0, progress: bool = True,
    overrides: dict | None = None, workers: int = 1,
) -> tuple[Path, bool]:
    """Run experiment ``name`` into ``out / name`` unless it is finished there (config fields changed by
    ``overrides``, see :func:`resolve_config`).

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
    config = resolve_config(name, quick=quick, seed=seed, overrides=overrides)
    resolved = config_json(config)
    folder = Path(out) / name
    config_path = folder / "config.json"
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a results folder; pass another --out")
    if config_path.exists():
        if _read_json_file(config_path) != resolved:
            raise ValueError(f"{folder} holds a run with a different config; pass another --out or remove it")
        if is_finished(folder):
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
            **_record(name, quick=quick, seed=seed, overrides=overrides),
        },
    )
    shutil.rmtree(folder / "units", ignore_errors=True)
    return folder, True
