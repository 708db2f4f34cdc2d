"""Benchmark scripts: each is ``python -m trace_train.bench.<name>`` and prints or writes its measured table.

Timings live here, never in pass/fail tests. See the README's "What we measured" for each script's
conditions and latest numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any


def write_results(results: dict[str, Any], out: str) -> None:
    """Write a benchmark's ``results`` to the JSON file ``out`` (NumPy scalars as floats) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1, default=float)
    print(f"results written to {out}")


def check_fields(cfg: Any, *, counts: tuple[str, ...] = ()) -> None:
    """The checks every benchmark config shares: ``backends`` a non-empty subset of ("hf", "vllm"), and
    each field named in ``counts`` at least 1. A ValueError names the field."""
    if set(cfg.backends) - {"vllm", "hf"} or not cfg.backends:
        raise ValueError(f"`backends` must be a non-empty subset of ('hf', 'vllm'), got {cfg.backends!r}")
    for name in counts:
        if getattr(cfg, name) < 1:
            raise ValueError(f"`{name}` must be at least 1, got {getattr(cfg, name)}")
