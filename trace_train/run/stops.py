"""The checks that stop a run after a step's checkpoint: too many environment failures, too many turns cut by
length. Each returns the one-line stop message (None: go on); ``trace_train.train`` raises the error."""

from __future__ import annotations

from ..configs import TrainConfig
from .console import say
from .distributed import DistInfo
from .files import subdir, write_file

__all__ = ["EnvFailureError", "LengthCutError", "check_env_failures", "check_length_cuts"]


class EnvFailureError(RuntimeError):
    """Too many rollouts of a step ended in an environment failure; the run stopped after a checkpoint."""


class LengthCutError(RuntimeError):
    """Too many turns of a step were cut by length (``max_length_cut_share``); the run stopped after a checkpoint."""


def check_env_failures(cfg: TrainConfig, info: DistInfo, step: int, batch, metrics: dict) -> str | None:
    """Warn above ``env_failure_warn_share``; above ``max_env_failure_share`` return the stop message.
    The first failure's traceback of this rank goes to ``run_dir/env_errors/step_N.txt``."""
    share = metrics.get("env_failures", 0.0) / max(metrics.get("rollouts", 0.0), 1.0)
    if share <= cfg.env_failure_warn_share or not info.is_main:
        return None if share <= cfg.max_env_failure_share else "env failures on another rank"
    sample = batch.report.env_error_sample
    where = "(the failures ran on other ranks)"
    first = ""
    if sample:
        path = subdir(cfg.run_dir, "env_errors") / f"step_{step:08d}.txt"  # a planted file or link: one line
        write_file(path, sample)
        lines = [ln for ln in sample.strip().splitlines() if ln.strip()]
        first, where = lines[-1].strip() if len(lines) > 1 else lines[0], f"traceback in {path}"
    text = (f"step {step}: {int(metrics['env_failures'])} of {int(metrics['rollouts'])} rollouts ({share:.0%}) ended "
            f"in an environment failure: {first}; {where}")
    if share > cfg.max_env_failure_share:
        return text + f" (more than max_env_failure_share={cfg.max_env_failure_share})"
    say(f"trace-train: warning: {text}")
    return None


def check_length_cuts(cfg: TrainConfig, step: int, metrics: dict) -> str | None:
    """The stop message of a step where more than ``max_length_cut_share`` of the turns (every rank's:
    ``length_cut_share`` is merged, so every rank decides alike) were cut by length; None otherwise."""
    share = metrics.get("length_cut_share", 0.0)
    if share <= cfg.max_length_cut_share:
        return None
    limits = cfg.rollout.limits
    return (f"step {step}: {int(metrics['length_cut_turns'])} of {int(metrics['turns'])} turns ({share:.0%}) were cut "
            f"by length (rollout.limits.max_turn_tokens={limits.max_turn_tokens}, max_context_tokens="
            f"{limits.max_context_tokens}; more than max_length_cut_share={cfg.max_length_cut_share}): a cut turn "
            "never reaches the environment and earns 0; a thinking model needs "
            "rollout.chat_template_kwargs.enable_thinking=false or longer turns")
