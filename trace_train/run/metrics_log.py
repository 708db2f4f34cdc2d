"""Training metrics: ``metrics.jsonl`` always, TensorBoard when installed, Weights & Biases on request.

One JSON object per line, ``{"step": N, "time": seconds since the run started, <name>: value, ...}``,
flushed after every line so that a crash loses nothing already logged. On resume from step N, lines of
later steps (written after that checkpoint, before the crash) are dropped first, so the file reads as if
the run had never stopped. A damaged line (not a JSON object with a step) is skipped with a warning
naming the file and line, so it never blocks a resume; a torn last line (a crash mid-write) is dropped
quietly. A full disk while writing raises ``trace_train.run.files.OutOfSpaceError`` naming the file. The
names are documented in the README's metric glossary.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from ..tools import bounded_json
from .files import open_no_follow, reporting_full_disk, write_file

__all__ = ["MetricsLogger", "read_metrics"]


def _plain(value: Any) -> Any:
    """A JSON-friendly scalar (NumPy and torch scalars become floats; non-finite values stay visible)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan" / "inf": JSON has no literal for them
    return value


class MetricsLogger:
    """Append metrics per step to ``<run_dir>/metrics.jsonl`` (and TensorBoard / W&B)."""

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None, tensorboard: bool = True,
                 wandb_project: str | None = None, run_name: str | None = None, config: Mapping | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [row for row in read_metrics(self.path) if row["step"] <= resume_step]
            write_file(self.path, "".join(json.dumps(row) + "\n" for row in kept))  # replaces, never follows
        elif resume_step is None and (self.path.exists() or self.path.is_symlink()):
            self.path.unlink()  # a fresh run starts a fresh file
        self._start = time.monotonic()
        fd = open_no_follow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # a planted link: one line
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: metrics.jsonl is the record
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=resume_step)
        self._wandb = None
        if wandb_project:
            import wandb  # an explicit request: fail loudly if it is not installed

            self._wandb = wandb.init(project=wandb_project, name=run_name, config=dict(config or {}),
                                     resume="allow" if resume_step is not None else None)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": int(step), "time": round(time.monotonic() - self._start, 3)}
        row.update({k: _plain(v) for k, v in metrics.items()})
        with reporting_full_disk(self.path):
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        if self._tb is not None:
            for name, value in row.items():
                if name != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log(dict(row), step=int(step))

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl``: a torn last line (a crash mid-write) is ignored; any other line
    that is not a JSON object with an integer ``step`` (too deep, too many digits included) is skipped with a
    warning naming file and line."""
    rows = []
    lines = Path(path).read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        try:  # bounded: a line nested 100 000 deep or a 5 000-digit number is a damaged line, not a traceback
            row = bounded_json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
        elif i < len(lines) - 1 or row is not None:
            warnings.warn(f"{path}: line {i + 1} is damaged (not a JSON object with a step); skipped", stacklevel=2)
    return rows
