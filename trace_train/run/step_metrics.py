"""One training step's metrics: the logged scalars (the names of ``metrics.jsonl``); the printed line is
``run.console.metrics_line``."""

from __future__ import annotations

import numpy as np

from trace_theory import contrast_yield
from trace_theory.metrics import calibration_by_depth

from ..rollout.batch import RolloutBatch
from .all_fail import all_fail_share
from .distributed import DistInfo, merge_metrics
from .turns import length_cut_counts

__all__ = ["step_metrics"]


def step_metrics(batch: RolloutBatch, update: dict, predictor_metrics: dict, rollout_s: float, train_s: float,
                 info: DistInfo) -> dict:
    """The step's logged scalars (``docs/training.md``, "Metrics"), merged over ranks: counts summed,
    the rest weighted by each rank's rollouts; ``update`` holds whatever the policy update returned."""
    f, report = batch.forest, batch.report
    turns, cut = length_cut_counts(batch)
    scalars = {  # contrast yield first: unlike the effective ratio, filtering prompts out cannot raise it
        **contrast_yield(f, rollouts=report.rollouts, tokens=report.generated_tokens),
        "reward_mean": float(f.reward[f.leaves].mean()) if f.n_leaves else float("nan"),
        "effective_ratio": batch.metrics()["effective_ratio"],
        "all_fail_group_share": all_fail_share(f),  # prompts whose every rollout failed (run/all_fail.py)
        "mixed_anchor_ratio": batch.metrics()["mixed_anchor_ratio"],
        "prompts": float(f.n_prompts),
        "rollouts": float(report.rollouts),
        "continuations": float(report.continuations),
        "generated_tokens": float(report.generated_tokens),
        "wave_tokens": float(report.wave_tokens),
        "stale_token_share": report.stale_token_share,
        "prompt_tokens": float(report.prompt_tokens),
        "prefix_cache_hit_rate": report.cached_prompt_tokens / max(report.prompt_tokens, 1),
        "continuation_prefix_hit_rate": report.continuation_prefix_hit_rate,
        "rollout_seconds": rollout_s,
        "train_seconds": train_s,
        "generation_seconds": report.generation_seconds,
        "env_seconds": report.env_seconds,
        "generator_idle_share": report.generator_idle_share,
        "samples_in_flight": report.samples_in_flight,
        "generation_polls": float(report.generation_polls),
        "streamed_expansion": float(report.streamed),
        **{f"{k}_seconds": v for k, v in report.phase_seconds.items()},  # + allocation, forest building, envs' resets:
        "allocation_seconds": max(report.seconds - sum(report.phase_seconds.values()), 0.0),  # what the phases leave
        "env_failures": float(report.end_reasons.get("env_error", 0) + report.end_reasons.get("env_timeout", 0)),
        "turns": float(turns),
        "length_cut_turns": float(cut),
        **{k: float(v) for k, v in update.items()},
    }
    scalars.update(placement_metrics(report))
    by_depth = batch.metrics()["rollouts_by_anchor_depth"]
    scalars.update({f"rollouts_at_depth_{d}": float(n) for d, n in enumerate(by_depth)})
    scalars.update(_calibration_metrics(batch))
    counts = ("prompts", "rollouts", "continuations", "generated_tokens", "wave_tokens", "prompt_tokens",
              "train_forward_tokens", "train_unique_tokens", "env_failures", "turns", "length_cut_turns",
              *PLACEMENTS, *(k for k in scalars if k.startswith("rollouts_at_depth_")))
    merged = merge_metrics(scalars, report.rollouts, info, sums=counts)
    merged["length_cut_share"] = merged["length_cut_turns"] / max(merged["turns"], 1.0)  # of every rank's turns
    # one predictor for the job, fitted on every rank's targets: its metrics are already global
    return {**merged, **{k: float(v) for k, v in predictor_metrics.items()}}


PLACEMENTS = ("continuations_at_boundaries", "continuations_at_rollout_ends", "continuations_at_tree_ends",
              "continuations_at_step_end", "top_ups_at_rollout_ends")
"""When streamed and eager expansion placed the step's continuations (``RolloutReport.continuations_by_phase``),
and the top-ups started at one-turn rollouts' ends. What starts at a rollout's end (the second and the last)
is what can take a step one generation wave past GRPO's (``generation_polls``)."""


def placement_metrics(report) -> dict:
    """:data:`PLACEMENTS` of a streamed or eager call; nothing for the other expansions (they place every
    continuation once the bare rollouts have ended)."""
    if not report.continuations_by_phase:
        return {}
    return {**dict(zip(PLACEMENTS, map(float, report.continuations_by_phase))),
            "top_ups_at_rollout_ends": float(report.top_ups_at_rollout_ends)}


def _calibration_metrics(batch: RolloutBatch) -> dict:
    """The allocator's predictions against what happened, per turn depth (``trace_theory``'s
    ``calibration_by_depth``): ``predictor_brier_depth_D``, ``predictor_ece_depth_D`` and
    ``predictor_miscalibrated`` (1 when a depth with 20 or more predictions has ECE above 0.15)."""
    predictions = np.asarray(batch.predictions, dtype=float)
    if predictions.shape != (len(batch.forest),) or not np.isfinite(predictions).any():
        return {}
    out = calibration_by_depth(batch.forest, predictions)
    metrics = {"predictor_miscalibrated": float(out.pop("miscalibrated"))}
    for d, cell in out.items():
        metrics[f"predictor_brier_depth_{d}"] = float(cell["brier"])
        metrics[f"predictor_ece_depth_{d}"] = float(cell["ece"])
    return metrics
