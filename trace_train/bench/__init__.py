"""Benchmark scripts: each is ``python -m trace_train.bench.<name>`` and prints or writes its measured table.

Timings live here, never in pass/fail tests. Each script's latest numbers and conditions are in
``docs/results.md``; the evidence files they quote are under ``benchmarks/<question>/``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..backends import BACKENDS

BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS.names())
"""Every registered back end (``trace_train.backends.BACKENDS``): what a benchmark runs by default."""


def backend_choices() -> list[str]:
    """The ``--backend`` choices: a registered back end, or ``both`` (every registered one)."""
    return [*BACKENDS.names(), "both"]


def chosen_backends(choice: str) -> tuple[str, ...]:
    """``--backend``'s value as the back ends to run."""
    return tuple(BACKENDS.names()) if choice == "both" else (choice,)


def check_backends(backends) -> None:
    """``backends`` must be a non-empty subset of the registered back ends."""
    known = tuple(BACKENDS.names())
    if set(backends) - set(known) or not backends:
        raise ValueError(f"`backends` must be a non-empty subset of {known}, got {backends!r}")


def write_results(results: dict[str, Any], out: str) -> None:
    """Write a benchmark's ``results`` to the JSON file ``out`` (NumPy scalars as floats) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1, default=float)
    print(f"results written to {out}")


def check_fields(cfg: Any, *, counts: tuple[str, ...] = ()) -> None:
    """The checks every benchmark config shares: ``backends`` a non-empty subset of the registered back
    ends, and each field named in ``counts`` at least 1. A ValueError names the field."""
    check_backends(cfg.backends)
    for name in counts:
        if getattr(cfg, name) < 1:
            raise ValueError(f"`{name}` must be at least 1, got {getattr(cfg, name)}")
