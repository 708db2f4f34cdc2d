"""Pieces shared by the Bernoulli-world experiments: calibration, online batches, per-batch metrics."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from trace_theory import (
    RolloutBudget,
    brier_score,
    budget_by_depth,
    contrast_yield,
    effective_ratio,
    expected_calibration_error,
    mixed_anchor_ratio,
)

from ..model import BernoulliTreeModel
from ..predictors import make_predictor
from ..runner import Arm, Batch, sample_batch

PAPER_GRPO_RATIO = 0.268
"""Effective ratio of GRPO (8 rollouts per prompt), math, Qwen3-8B (PAPER.md, "Results")."""
PAPER_TRACE_RATIO = 0.606
"""Effective ratio of TRACE in the same setting."""
V_BINS = 10
"""Equal-width bins of an anchor's true V for the ``rollout_share_v_*`` metrics."""


class BatchChecks:
    """Checks shared by the configs of the batch experiments, called from their ``__post_init__``.

    Every such config has ``seed``, ``seeds``, ``batches``, ``warmup`` and ``group_size`` fields (most also
    ``roots``, ``continuations``, ``pool_factor``, ``target_ratio`` and ``model``); each declares them itself,
    with its own defaults and in an order the results' ``config.json`` keeps, and states the checks here.
    """

    def check_batches(self, *positive: str) -> None:
        """The fields ``positive`` are positive integers and ``warmup`` lies in [0, batches)."""
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not (isinstance(self.warmup, int) and 0 <= self.warmup < self.batches):
            raise ValueError(f"`warmup` must be an integer in [0, batches), got {self.warmup!r}")

    def check_pool_factor(self) -> None:
        if not self.pool_factor >= 1.0:
            raise ValueError(f"`pool_factor` must be at least 1, got {self.pool_factor!r}")

    def check_target_ratio(self) -> None:
        if not 0.0 < self.target_ratio < 1.0:
            raise ValueError(f"`target_ratio` must lie in (0, 1), got {self.target_ratio!r}")


class BatchShape(BatchChecks):
    """Derived sizes shared by the experiment configs that have ``roots``, ``continuations`` and, for
    candidate pools, ``pool_factor`` and ``group_size`` fields."""

    @property
    def budget(self) -> RolloutBudget:
        """M root rollouts and N continuations per root: M (1 + N) rollouts for every policy."""
        return RolloutBudget(self.roots, self.continuations)

    @property
    def pool(self) -> int:
        """Candidate prompts per batch: ``pool_factor`` times the prompts GRPO's groups of G need."""
        return math.ceil(self.pool_factor * self.budget.total / self.group_size)


def calibrated(model: BernoulliTreeModel, target: float, group_size: int) -> BernoulliTreeModel:
    """``model`` with pass rates rescaled so that GRPO with ``group_size`` rollouts mixes ``target`` of its
    prompts in expectation (exact, through ``trace_theory.beta_mixed_probability``)."""
    return dataclasses.replace(model, pass_rates=model.pass_rates.calibrated(target, group_size))


def check_arms(arms: tuple[str, ...]) -> None:
    """Parse every arm (raising on a bad one) and reject duplicates."""
    labels = [Arm.parse(a).label for a in arms]
    if not labels:
        raise ValueError("`arms` must name at least one policy")
    if len(set(labels)) != len(labels):
        raise ValueError(f"`arms` has duplicates: {list(arms)}")


YIELD_METRICS = (
    "mixed_prompts_per_1k_rollouts",
    "mixed_prompts_per_1k_turns",
    "contrast_pairs_per_1k_rollouts",
    "contrast_pairs_per_1k_turns",
)
"""What a batch bought per unit spent (``trace_theory.contrast_yield``; a turn is the simulator's token):
filtering prompts out cannot inflate these, unlike the effective ratio. Reported first everywhere."""


def yield_metrics(forest, *, rollouts: float, turns: float) -> dict[str, float]:
    """``trace_theory.contrast_yield`` with the simulator's names (a token is a turn)."""
    out = contrast_yield(forest, rollouts=rollouts, tokens=turns)
    return {k.replace("_tokens", "_turns"): v for k, v in out.items()}


def batch_metrics(batch: Batch) -> dict[str, float]:
    """What a batch is worth, with ``trace_theory.metrics``; equal-rollout and equal-turn views."""
    forest = batch.sampled.forest
    ratio = effective_ratio(forest)
    mixed = ratio * forest.n_prompts
    by_depth = budget_by_depth(forest)
    metrics = {
        **(yields := yield_metrics(forest, rollouts=batch.rollouts, turns=batch.turns)),
        "effective_ratio": ratio,
        "mixed_prompts": mixed,
        "mixed_anchor_ratio": mixed_anchor_ratio(forest),
        "contrast_pairs_per_rollout": yields["contrast_pairs_per_1k_rollouts"] / 1000.0,
        "prompts": forest.n_prompts,
        "rollouts": batch.rollouts,
        "turns": batch.turns,
        "continuation_share": float(by_depth[1:].sum() / by_depth.sum()),
        "rounds": batch.rounds,
    }
    metrics.update(_where_the_budget_goes(batch, by_depth))
    if batch.predicted.size:
        metrics["predictor_brier"] = brier_score(batch.predicted, batch.actual)
        metrics["predictor_ece"] = expected_calibration_error(batch.predicted, batch.actual)
        for where, at in (("roots", batch.depth == 0), ("prefixes", batch.depth > 0)):
            if at.any():
                metrics[f"predictor_brier_{where}"] = brier_score(batch.predicted[at], batch.actual[at])
    return metrics


def _where_the_budget_goes(batch: Batch, by_depth: np.ndarray) -> dict[str, float]:
    """Shares of the batch's rollouts by the depth of the anchor they were sampled from
    (``rollout_share_depth_D``) and by that anchor's true V (``rollout_share_v_LO_HI``, ``V_BINS`` bins)."""
    forest = batch.sampled.forest
    shares = {f"rollout_share_depth_{d}": float(n / by_depth.sum()) for d, n in enumerate(by_depth)}
    leaves = np.flatnonzero(forest.is_leaf)
    anchor_v = batch.sampled.nodes["v"][forest.rollout_anchor[leaves]]
    counts = np.bincount(np.clip((anchor_v * V_BINS).astype(np.int64), 0, V_BINS - 1), minlength=V_BINS)
    for b, n in enumerate(counts):
        shares[f"rollout_share_v_{b / V_BINS:.1f}_{(b + 1) / V_BINS:.1f}"] = float(n / leaves.size)
    return shares


def online_batches(
    model: BernoulliTreeModel,
    arm: Arm,
    budget: RolloutBudget,
    *,
    pool: int,
    batches: int,
    rng: np.random.Generator,
    group_size: int = 8,
    predictor_options: dict[str, dict] | None = None,
    expansion_rounds: int = 1,
) -> list[dict[str, float]]:
    """``batches`` batches of one arm; the predictor learns online from every batch it sees.

    ``predictor_options`` maps a predictor name to its options (``{"noisy": {"noise": 2.0}}``);
    ``expansion_rounds`` is R of ``trace_theory.step`` (branching policies).
    Returns one metrics dict per batch (see :func:`batch_metrics`), with its index as ``batch``.
    """
    policy = arm.allocation_policy(group_size=group_size)
    predictor = make_predictor(arm.predictor, **(predictor_options or {}).get(arm.predictor, {}))
    rows = []
    for b in range(batches):
        batch = sample_batch(
            model, policy, budget, predictor, pool=pool, rng=rng, expansion_rounds=expansion_rounds
        )
        predictor = predictor.update(batch.sampled)
        rows.append({"batch": b, **batch_metrics(batch)})
    return rows
