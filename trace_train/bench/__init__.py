"""Benchmark scripts: each is ``python -m trace_train.bench.<name>`` and prints or writes its measured table.

Timings live here, never in pass/fail tests. Each script's latest numbers and conditions are in
``docs/results.md``; the evidence files they quote are under ``benchmarks/<question>/``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from trace_theory.benchmark import provenance

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


def origin(module: str, argv=None) -> dict[str, Any]:
    """What an evidence file records about its run (``trace_theory.benchmark.provenance``: commit, dirty,
    command, load average, machine), with the torch version in ``machine``."""
    record = provenance(module, argv)
    torch = sys.modules.get("torch")
    if torch is not None:
        record["machine"]["torch"] = torch.__version__
    return record


def write_results(results: dict[str, Any], out: str, *, module: str | None = None, argv=None) -> None:
    """Write a benchmark's ``results`` to the JSON file ``out`` (NumPy scalars as floats) and say where,
    after :func:`origin`'s record of the run (``module``: the script's; default, the running
    ``__main__``'s)."""
    module = module or getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or "?"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({**origin(module, argv), **results}, fh, indent=1, default=float)
    print(f"results written to {out}")


def check_fields(cfg: Any, *, counts: tuple[str, ...] = ()) -> None:
    """The checks every benchmark config shares: ``backends`` a non-empty subset of the registered back
    ends, and each field named in ``counts`` at least 1. A ValueError names the field."""
    check_backends(cfg.backends)
    for name in counts:
        if getattr(cfg, name) < 1:
            raise ValueError(f"`{name}` must be at least 1, got {getattr(cfg, name)}")
