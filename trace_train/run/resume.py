"""A run's identity: the resume fingerprint, and the check that a run directory holds this run.

A checkpoint stores :func:`resume_fingerprint` of the config that wrote it; a run resumes only from a
checkpoint with its own. A run directory's ``config.yaml`` is compared field by field
(:func:`check_config`) before anything is written, so another run's config and metrics are never
overwritten; ours is written (:func:`write_config`) only once the task's data and environment loaded. A
directory a failed start left (``run.lock`` and a ``config.yaml``, but no checkpoint and no metrics row) is
taken over, with one line saying so. What may differ between the two, and the fields that came and went, is in
:mod:`.config_history`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
from pathlib import Path

import yaml

from trace_theory.policies import POLICIES

from ..config_loader import config_to_dict, drop_removed
from ..configs import TrainConfig
from .config_history import (ADDED_IN_FINGERPRINT, ADDED_SINKS, BRANCHING_ONLY,
                             DEFAULT_CHANGED_IN_FINGERPRINT, DEFAULT_CHANGED_IN_TRAJECTORY, EAGER_ONLY,
                             NOT_IN_FINGERPRINT, REMOVED_IN_FINGERPRINT)
from .files import write_file
from .step_state import RESUME_OVERRIDES, describe_overrides

__all__ = ["resume_fingerprint", "check_or_write_config", "check_config", "write_config", "differing_fields",
           "never_stepped"]


def resume_fingerprint(cfg: TrainConfig) -> str:
    """A hash of everything that determines the run's trajectory (not its length, cadence or sinks).
    Fields added after checkpoints existed (``ADDED_SINKS``, and ``ADDED_IN_FINGERPRINT`` at their
    defaults) are left out, and removed ones (``REMOVED_IN_FINGERPRINT``) put back at their old default,
    so older runs still resume."""
    default = TrainConfig()
    plain = dataclasses.replace(cfg, **{k: getattr(default, k) for k in NOT_IN_FINGERPRINT})
    data = _unread_at_old_values(config_to_dict(plain))
    data = {k: v for k, v in data.items() if k not in ADDED_SINKS}
    for section, fields in REMOVED_IN_FINGERPRINT.items():
        data[section] = {**data[section], **fields}
    for section, fields in ADDED_IN_FINGERPRINT.items():
        data[section] = {k: v for k, v in data[section].items() if not (k in fields and v == fields[k])}
    for section, fields in DEFAULT_CHANGED_IN_FINGERPRINT.items():
        data[section] = {k: fields[k][1] if k in fields and v == fields[k][0] else v for k, v in data[section].items()}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def check_or_write_config(cfg: TrainConfig, run_dir: Path, *, write: bool = True) -> None:
    """:func:`check_config`, then :func:`write_config` (where ``write``: rank 0)."""
    check_config(cfg, run_dir, announce=write)
    if write:
        write_config(cfg, run_dir)


def check_config(cfg: TrainConfig, run_dir: Path, *, announce: bool = True, started_before: bool = False) -> None:
    """Refuse a run directory that holds another run's ``config.yaml``.

    Another run is one whose resume fingerprint differs (only steps, ``optim.lr``, ``optim.grad_clip``,
    checkpointing and logging may change: ``run.step_state.RESUME_OVERRIDES``, each change printed where
    ``announce``), whether or not it wrote a checkpoint: its config and metrics are never overwritten. The
    exception is a start that failed before its first step: ``started_before`` (the directory held a
    ``run.lock`` before this run locked it: a ``config.yaml`` alone, written by hand or by another tool, is
    not taken for one) and :func:`never_stepped`. Its directory is taken over with one line (where
    ``announce``), and the ``tiny_model/`` it may have built for its config removed.
    """
    stored = run_dir / "config.yaml"
    if not stored.exists():
        return
    before = _unread_at_old_values(_stored_config(stored))
    now = _unread_at_old_values(config_to_dict(cfg))
    if not _expansion(before) == _expansion(now) == "eager":  # eager-only fields: no second difference
        before, now = _eager_fields_unread(before), _eager_fields_unread(now)
    differs = differing_fields(before, now)
    if differs and started_before and never_stepped(run_dir):
        if announce:
            print(f"trace-train: taking over {run_dir}: the run that wrote its config.yaml (differing in "
                  f"{', '.join(differs)}) stopped before its first step (no checkpoint, no metrics)", file=sys.stderr)
            _remove_tiny_model(run_dir)
        return
    if differs:
        raise ValueError(f"{run_dir} holds another run (its config.yaml differs in {', '.join(differs)}); "
                         "use another run_dir (only steps, optim.lr, optim.grad_clip, checkpointing and "
                         f"logging may change){_changed_defaults(differs, before, now)}")
    for change in describe_overrides(_stored_config(stored), config_to_dict(cfg)) if announce else ():
        print(f"trace-train: resuming with {change}", file=sys.stderr)


def write_config(cfg: TrainConfig, run_dir: Path) -> None:
    """Write the resolved config as ``run_dir/config.yaml`` (replaces a link, never follows one)."""
    write_file(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def never_stepped(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds no checkpoint and no metrics row (a link in their place counts as holding one)."""
    if (run_dir / "checkpoints").is_symlink():
        return False
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return False
    metrics = run_dir / "metrics.jsonl"
    try:
        return metrics.is_symlink() is False and (not metrics.exists() or not metrics.read_bytes().strip())
    except OSError:
        return False


def _remove_tiny_model(run_dir: Path) -> None:
    path = run_dir / "tiny_model"
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _unread_at_old_values(data: dict) -> dict:
    """``data`` (a config as a dict) with the fields its run never reads at their old values: the ones only a
    branching policy reads (:data:`BRANCHING_ONLY`) where its policy is a registered one that does not branch,
    and the ones only eager expansion reads (:data:`EAGER_ONLY`) unless it runs eager expansion."""
    rollout = data.get("rollout")
    if not isinstance(rollout, dict):
        return data
    name = rollout.get("policy")
    if isinstance(name, str) and name in POLICIES and not POLICIES[name].branches:
        data = {**data, "rollout": {**rollout, **BRANCHING_ONLY["rollout"]}}
    return data if _expansion(data) == "eager" else _eager_fields_unread(data)


def _expansion(data: dict):
    rollout = data.get("rollout")
    return rollout.get("expansion") if isinstance(rollout, dict) else None


def _eager_fields_unread(data: dict) -> dict:
    """``data`` with the fields only eager expansion reads at their old values (:data:`EAGER_ONLY`)."""
    rollout = data.get("rollout")
    return {**data, "rollout": {**rollout, **EAGER_ONLY["rollout"]}} if isinstance(rollout, dict) else data


def _changed_defaults(differs: list[str], before: dict, now: dict) -> str:
    """The refusal's hint where a differing field is one whose default changed (:data:`DEFAULT_CHANGED_IN_TRAJECTORY`)
    and the stored run had the old one while this one has the new."""
    hints = []
    for section, fields in DEFAULT_CHANGED_IN_TRAJECTORY.items():
        for key, (new, old, when) in fields.items():
            name = f"{section}.{key}"
            if name in differs and before.get(section, {}).get(key) == old and now.get(section, {}).get(key) == new:
                hints.append(f"; {name}'s default changed from {old!r} to {new!r} in {when}: add {name}={old} "
                             "to resume this run")
    return "".join(hints)


def _stored_config(path: Path) -> dict:
    """A stored ``config.yaml`` as plain data over the defaults (:func:`_older_defaults`): nothing in it is
    resolved or imported (a planted ``task.name: file.py:attr`` is compared as a string, never run)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path.parent} holds a config.yaml that cannot be read ({type(err).__name__}); "
                         "use another run_dir") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.parent} holds a config.yaml that is not a mapping; use another run_dir")
    return _merged(_older_defaults(), drop_removed(data, TrainConfig.REMOVED))


def _older_defaults() -> dict:
    """The defaults a stored config is read over: today's, except that a field added after checkpoints
    existed (:data:`ADDED_IN_FINGERPRINT`) and missing from a stored config takes the value every run of
    before had, not today's default (a run started before ``rollout.expansion`` existed grew streamed, and
    must not be read as a run of today's eager default)."""
    defaults = config_to_dict(TrainConfig())
    for section, fields in ADDED_IN_FINGERPRINT.items():
        defaults[section] = {**defaults[section], **fields}
    return defaults


def _merged(defaults: dict, data: dict) -> dict:
    out = dict(defaults)
    for key, value in data.items():
        sub = defaults.get(key)
        is_section = isinstance(sub, dict) and isinstance(value, dict) and key not in ("env", "rows")
        out[key] = _merged(sub, value) if is_section else value
    return out


def differing_fields(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two nested config dicts differ (ignoring run length and sinks)."""
    out = []
    for key in sorted(set(a) | set(b)):
        name = prefix + key
        if (not prefix and key in NOT_IN_FINGERPRINT) or name in RESUME_OVERRIDES:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += differing_fields(x, y, name + ".")
        elif x != y:
            out.append(name)
    return out
