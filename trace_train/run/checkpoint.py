"""Checkpoints that let an interrupted run continue exactly as an uninterrupted one would.

A checkpoint is a directory ``<run_dir>/checkpoints/step_<N>/`` holding

- ``policy.pt``: the policy's ``state_dict`` (tensors only);
- ``optimizer.pt``: the optimiser's ``state_dict``;
- ``extra.pt``: any other picklable state the trainer registers (the predictor's arrays, the reference
  model's identity, the data sampler's position);
- ``rng.pt``: Python's, NumPy's global and torch's (CPU and every CUDA device) random states, and the
  states of any ``numpy.random.Generator`` the trainer passes;
- ``trainer_state.json``: the step and a fingerprint of the config it was written under;
- ``pending.pkl`` (``rollout.expansion=pipelined`` only): each rank's pending step, the trees whose
  continuations the next step grows, environment snapshots included (:mod:`.plain_pickle`: read back as
  plain data only).

Writes are atomic: everything goes to a temporary sibling directory that is renamed into place, and only
then is ``latest`` (a one-line text file) replaced, so a crash at any moment leaves the previous
checkpoint intact and ``latest`` pointing at a complete one. Older checkpoints beyond ``keep`` are
removed after a successful write. ``trainer_state.json`` also records each file's size.

Reading is defensive: :func:`load_latest_checkpoint` tries the checkpoint ``latest`` names, then the
older ones, newest first, and skips (with a warning naming the file) any whose files are missing,
truncated or cannot be unpickled, e.g. after a disk filled up or a file was damaged. Every error names
the file it failed on.

Loading never runs code a file contains: every ``.pt`` file is read with ``torch.load(weights_only=True)``,
which rebuilds only tensors and plain containers, plus an allow-list of the NumPy pieces a NumPy array
needs (``_SAFE_GLOBALS``: an array, its dtype and the function that allocates an empty one). A file that
asks for anything else (a planted pickle whose ``__reduce__`` would call ``os.system``) is refused with
a :class:`CheckpointError` naming the file and the global it asked for, before anything of it runs.

Partial checkpoints (the temporary ``.step_*`` directories and ``.latest.*`` files of a write that was
killed) are never read, and :func:`clean_partial_checkpoints` removes them; the trainer calls it at
start-up while it holds the run directory's lock (``trace_train.run.files.RunLock``), so it can never remove
a live run's write. A full disk (``ENOSPC``, ``EDQUOT``) during a write raises
``trace_train.run.files.OutOfSpaceError`` naming the file and the free space, and leaves the previous
checkpoint and ``latest`` untouched.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from ..tools import bounded_json
from . import plain_pickle
from .files import UnsafePathError, reporting_full_disk, subdir

__all__ = ["Checkpoint", "CheckpointError", "save_checkpoint", "load_checkpoint", "load_latest_checkpoint",
           "latest_checkpoint", "capture_rng", "restore_rng", "clean_partial_checkpoints", "written_by_processes",
           "check_world_size"]

_FILES = ("policy.pt", "optimizer.pt", "extra.pt", "rng.pt", "pending.pkl")


def _safe_globals() -> list:
    """What ``weights_only`` loading may rebuild besides tensors and containers: NumPy arrays (the
    predictor's weights, NumPy's random state). Each only allocates data; none runs user code."""
    from numpy._core.multiarray import _reconstruct, scalar

    dtypes = {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGSUV"}
    return [_reconstruct, scalar, np.ndarray, np.dtype, bytes, *sorted(dtypes, key=lambda t: t.__name__)]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    step: int
    path: Path
    policy: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    extra: dict[str, Any]
    rng: dict[str, Any]
    config_fingerprint: str | None
    trajectory_fingerprint: str | None = None
    """The config's fingerprint without the settings a resume may change (``run.step_state``); None in
    checkpoints written before it was recorded."""
    pending: Any = None
    """``pending.pkl``: pipelined expansion's pending step of each rank (a list), None without the file."""


def written_by_processes(checkpoint: Checkpoint) -> int:
    """How many processes wrote ``checkpoint``: a job's checkpoint holds one entry per rank under
    ``extra["ranks"]`` (each rank's random states), a single process's has none."""
    ranks = checkpoint.extra.get("ranks")
    return len(ranks) if isinstance(ranks, (list, tuple)) else 1


def check_world_size(checkpoint: Checkpoint, world_size: int) -> None:
    """Refuse, in one line, to resume ``checkpoint`` with another number of processes.

    The layouts differ (a single process saves the optimiser by parameter index, a torchrun job by
    parameter name, plus one random state and data shard per rank), and a run resumed on another number
    of ranks would draw other pools than the one it continues, so it could not continue exactly.
    """
    written = written_by_processes(checkpoint)
    if written != world_size:
        def launch(n):
            return "without torchrun" if n == 1 else f"with torchrun --nproc_per_node {n}"

        raise CheckpointError(
            f"{checkpoint.path} was written by {written} process{'es' if written > 1 else ''} and this run has "
            f"{world_size}: resume it {launch(written)}, or pass another run_dir to start a new run")


def capture_rng(generators: Mapping[str, np.random.Generator] = {}) -> dict[str, Any]:
    """Every random state a run depends on, as picklable objects."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.bit_generator.state for name, g in generators.items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any], generators: Mapping[str, np.random.Generator] = {}) -> None:
    """Put back what :func:`capture_rng` captured (named generators are restored in place)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    missing = set(generators) - set(state["generators"])
    if missing:
        raise ValueError(f"the checkpoint has no state for generators {sorted(missing)}")
    for name, g in generators.items():
        g.bit_generator.state = state["generators"][name]


def _write_atomically(path: Path, text: str) -> None:
    with reporting_full_disk(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def clean_partial_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Remove what interrupted writes left in ``run_dir/checkpoints`` (``.step_*`` directories,
    ``.latest.*`` files); returns what was removed. Call only while holding the run's lock."""
    root = Path(run_dir) / "checkpoints"
    removed = sorted([*root.glob(".step_*"), *root.glob(".latest.*")])
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return removed


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    policy: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    generators: Mapping[str, np.random.Generator] = {},
    config_fingerprint: str | None = None,
    keep: int = 2,
    rng_state: Mapping[str, Any] | None = None,
    trajectory_fingerprint: str | None = None,
    pending: Any = None,
) -> Path:
    """Write checkpoint ``step`` atomically and return its directory; keep the newest ``keep`` ones.

    ``rng_state`` (from :func:`capture_rng`) is stored instead of the random states of now (a state
    captured before a step that failed). ``pending`` (not None): written to ``pending.pkl``
    (:mod:`.plain_pickle`)."""
    if not (isinstance(step, int) and step >= 0):
        raise ValueError(f"`step` must be a non-negative integer, got {step!r}")
    if not (isinstance(keep, int) and keep >= 1):
        raise ValueError(f"`keep` must be a positive integer, got {keep!r}")
    final = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    with reporting_full_disk(final, "writing checkpoint"):
        root = subdir(run_dir, "checkpoints")  # a link or a file there: one line
        clean_partial_checkpoints(run_dir)  # what a killed write left (the caller holds the run's lock)
        if final.is_symlink() or (final.exists() and not final.is_dir()):
            raise UnsafePathError(f"{final} is a symbolic link or a file, not a checkpoint; refusing to replace "
                                  "it (remove it)")
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".step_{step:08d}."))
    try:
        def save(obj, name):
            with reporting_full_disk(final / name, "writing checkpoint"):
                _torch_save(obj, tmp / name)

        save({k: v.detach().cpu() for k, v in policy.items()}, "policy.pt")
        if optimizer is not None:
            save(dict(optimizer), "optimizer.pt")
        save(dict(extra or {}), "extra.pt")
        save(dict(rng_state) if rng_state is not None else capture_rng(generators), "rng.pt")
        if pending is not None:
            data = plain_pickle.dumps(pending, "the pending step of rollout.expansion=pipelined")
            with reporting_full_disk(final / "pending.pkl", "writing checkpoint"), open(tmp / "pending.pkl", "xb") as f:
                f.write(data)
        sizes = {name: (tmp / name).stat().st_size for name in _FILES if (tmp / name).exists()}
        meta = {"step": step, "config_fingerprint": config_fingerprint, "file_bytes": sizes}
        if trajectory_fingerprint is not None:
            meta["trajectory_fingerprint"] = trajectory_fingerprint
        with reporting_full_disk(final / "trainer_state.json", "writing checkpoint"):
            (tmp / "trainer_state.json").write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomically(root / "latest", final.name + "\n")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _torch_save(obj, file: Path) -> None:
    """``torch.save`` into a new file (exclusive, never through a link) whose write errors stay
    ``OSError`` s: torch turns a failed write into ``RuntimeError: [enforce fail at inline_container.cc]``,
    which would hide a full disk."""
    with open(file, "xb") as f:
        try:
            torch.save(obj, f)
            f.flush()
        except RuntimeError as err:
            cause = err.__context__
            while cause is not None and not isinstance(cause, OSError):
                cause = cause.__context__
            if cause is not None:
                raise cause from None
            raise


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The directory ``latest`` points at, or None when the run has no checkpoint yet."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    if not (path / "trainer_state.json").exists():
        raise ValueError(f"checkpoint {path} named by {pointer} is incomplete or missing")
    return path


def load_checkpoint(path: str | os.PathLike, *, generators: Mapping[str, np.random.Generator] = {},
                    restore_random_state: bool = True) -> Checkpoint:
    """Read a checkpoint directory; by default also restore every random state (see :func:`restore_rng`).

    Raises :class:`CheckpointError` naming the file when one is missing, truncated (smaller or larger
    than ``trainer_state.json`` recorded) or cannot be loaded. Random states are restored only after
    every file has been read.
    """
    path = Path(path)
    state_file = path / "trainer_state.json"
    if not state_file.exists():
        raise CheckpointError(f"{path} is not a checkpoint (no trainer_state.json)")
    try:
        meta = bounded_json.loads(state_file.read_bytes())
        _check_meta(meta)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{state_file}: cannot be read ({type(err).__name__}: {err})") from None
    step = meta["step"]
    for name, size in (meta.get("file_bytes") or {}).items():
        file = path / name
        actual = file.stat().st_size if file.exists() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual} bytes"
            raise CheckpointError(f"{file}: {found}, but {size} bytes were written (truncated or damaged)")
    rng = _load(path / "rng.pt")
    optimizer = _load(path / "optimizer.pt", mmap=True) if (path / "optimizer.pt").exists() else None
    checkpoint = Checkpoint(
        step=step,
        path=path,
        policy=_load(path / "policy.pt", mmap=True),
        optimizer=optimizer,
        extra=_load(path / "extra.pt"),
        rng=rng,
        config_fingerprint=meta.get("config_fingerprint"),
        trajectory_fingerprint=meta.get("trajectory_fingerprint"),
        pending=_load_pending(path / "pending.pkl") if (path / "pending.pkl").exists() else None,
    )
    if restore_random_state:
        try:
            restore_rng(rng, generators)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
            raise CheckpointError(f"{path / 'rng.pt'}: not the random states a checkpoint holds "
                                  f"({type(err).__name__}: {_first_line(err)})") from None
    return checkpoint


def _check_meta(meta) -> None:
    """``trainer_state.json`` as written: a step (a non-negative integer), fingerprints (strings or
    null) and file sizes (names of ``_FILES`` to non-negative integers); a ValueError naming the field."""
    def integer(value):
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63

    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    if not integer(meta.get("step")):
        raise ValueError(f"`step` must be a non-negative integer, got {str(meta.get('step'))[:40]}")
    for key in ("config_fingerprint", "trajectory_fingerprint"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ValueError(f"`{key}` must be a string")
    sizes = meta.get("file_bytes")
    if sizes is not None and not (isinstance(sizes, dict) and all(k in _FILES and integer(v) for k, v in sizes.items())):
        raise ValueError("`file_bytes` must map checkpoint file names to sizes in bytes")


def _load(file: Path, *, mmap: bool = False):
    """``torch.load(weights_only=True)`` (plus ``_safe_globals``) with errors that name the file.

    ``mmap``: the tensors stay in the file, mapped, and are read when touched. The policy and the optimizer
    state are loaded so: the ranks of a node share the file's pages (one copy in host memory, not one per
    rank: about 65 GB of AdamW state for an 8B policy), and under FSDP each rank takes one full tensor at
    a time to its device and keeps its shard (``set_optimizer_state_dict``'s full-state path), so no rank
    ever holds the whole state. A truncated file is refused before this, by its recorded size
    (:func:`load_checkpoint`)."""
    if not file.exists():
        raise CheckpointError(f"{file}: missing")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(file, weights_only=True, map_location="cpu", mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        if found:
            raise CheckpointError(f"{file}: refused: it asks for {found.group(1)}, which a checkpoint never holds; "
                                  "loading it could run code (not written by trace-train, or planted)") from None
        reason = re.search(r"(?:WeightsUnpickler error|Trying to load): (.*)", str(err))
        raise CheckpointError(f"{file}: cannot be loaded (UnpicklingError: "
                              f"{reason.group(1) if reason else _first_line(err)})") from None
    except Exception as err:  # torch raises many types here (pickle, zip, EOF, runtime)
        raise CheckpointError(f"{file}: cannot be loaded ({type(err).__name__}: {_first_line(err)})") from None


def _load_pending(file: Path):
    """``pending.pkl`` as plain data (:mod:`.plain_pickle`), with errors that name the file."""
    try:
        return plain_pickle.load(file)
    except plain_pickle.PickleRefused as err:
        raise CheckpointError(f"{file}: refused: it asks for {err}, which a checkpoint never holds; loading it "
                              "could run code (not written by trace-train, or planted)") from None
    except Exception as err:  # a damaged file: pickle raises many types
        raise CheckpointError(f"{file}: cannot be loaded ({type(err).__name__}: {_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else ""


def load_latest_checkpoint(run_dir: str | os.PathLike, *, generators: Mapping[str, np.random.Generator] = {},
                           restore_random_state: bool = True) -> Checkpoint | None:
    """The newest intact checkpoint of ``run_dir``, or None when the run has none.

    Tries the one ``latest`` names first, then every other ``step_*`` directory, newest first; each one
    that cannot be read is skipped with a warning naming the bad file. Raises :class:`CheckpointError`
    when checkpoints exist but none is intact.
    """
    root = Path(run_dir) / "checkpoints"
    if root.is_symlink():
        raise UnsafePathError(f"{root} is a symbolic link; refusing to read or write checkpoints through it (remove it)")
    ours = re.compile(r"step_\d{8}")  # written by save_checkpoint: a folder, never a link
    candidates = sorted((p for p in root.glob("step_*") if ours.fullmatch(p.name) and p.is_dir() and not p.is_symlink()),
                        reverse=True)
    pointer = root / "latest"
    if pointer.is_file() and not pointer.is_symlink():
        named = root / pointer.read_text(errors="replace").strip()[:64]
        if named in candidates:
            candidates = [named] + [p for p in candidates if p != named]
    problems = []
    for path in candidates:
        try:
            return load_checkpoint(path, generators=generators, restore_random_state=restore_random_state)
        except CheckpointError as err:
            problems.append(str(err))
            warnings.warn(f"skipping checkpoint {path.name}: {err}; trying an older one", stacklevel=2)
    if problems:
        raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(problems))
    return None
