"""Experiment 8: repeated expansion, R = 1, 2, 3 rounds of branching from prefixes (beyond the paper).

The paper expands once: continuations branch from the prefixes of the bare rollouts. The step driver
(``trace_theory.step``) can expand R times: round r branches from the prefixes of the continuations that
round r - 1 added, re-predicting them, with each prompt's continuation budget m_i N dealt evenly over the
rounds (``round_shares``). Later rounds branch deeper, closer to the outcome, where a continuation costs
fewer turns and its predicted value is sharper.

Each branching arm runs R = 1, 2, 3 with the learned predictor fitted online (first ``warmup`` batches
left out), in two views of equal budget: ``equal_rollouts`` (M (1 + N) rollouts for every R) and
``equal_turns`` (a second pass in which M is rescaled so that the arm's turns per batch match its own
R = 1 turns in the first pass). Reported: effective ratio, mixed prompts per batch, contrast pairs per
rollout, rollouts and turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import RolloutBudget, get_policy

from ..model import BernoulliTreeModel
from ..runner import Arm
from .base import Experiment, Outcome, Units, register, summarise, tidy_metrics, unit_rng
from .common import BatchShape, PAPER_GRPO_RATIO, calibrated, check_arms, online_batches

NAME = "expansion_rounds"
CLAIM = (
    "Branching again from the prefixes of the continuations (R = 2, 3 expansion rounds, beyond the "
    "paper's one) costs TRACE no effective ratio at equal rollouts, and at equal turns it buys more "
    "rollouts and more contrast pairs per rollout."
)
METRICS = ("effective_ratio", "mixed_prompts", "contrast_pairs_per_rollout", "rollouts", "turns")


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    """Base seed; every (view, arm, R, seed index) unit derives its own generator from it."""
    seeds: int = 6
    """Independent repetitions per arm and R."""
    batches: int = 6
    """Batches per repetition; the learned predictor is updated after each."""
    warmup: int = 2
    """Leading batches left out while the learned predictor is still fitting."""
    roots: int = 256
    """M: root rollouts per batch."""
    continuations: int = 4
    """N: continuations per root rollout, dealt over the R rounds."""
    group_size: int = 8
    """G of the uniform root rule (and of the calibration)."""
    pool_factor: float = 2.0
    """Candidate prompts per batch, as a multiple of the M (1 + N) / G prompts GRPO would use."""
    target_ratio: float = PAPER_GRPO_RATIO
    """GRPO's expected effective ratio after calibration."""
    rounds: tuple[int, ...] = (1, 2, 3)
    """Expansion round counts compared; the first is every arm's reference in the equal-turn view."""
    arms: tuple[str, ...] = ("trace", "random_prefix")
    """Branching policies, written ``policy`` or ``policy[predictor]``."""
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        self.check_batches("seeds", "batches", "roots", "continuations", "group_size")
        if not self.rounds or any(not isinstance(r, int) or r < 1 for r in self.rounds):
            raise ValueError(f"`rounds` must be positive integers, got {self.rounds!r}")
        self.check_pool_factor()
        check_arms(self.arms)
        flat = [a for a in self.arms if not get_policy(Arm.parse(a).policy).branches]
        if flat:
            raise ValueError(f"`arms` must branch from prefixes; {flat[0]!r} does not")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=2, batches=3, warmup=1, roots=64)


def run(config: Config, units: Units) -> Outcome:
    model = calibrated(config.model, config.target_ratio, config.group_size)

    def unit(key) -> pd.DataFrame:
        view, arm_text, rounds, roots, s = key
        arm = Arm.parse(arm_text)
        rng = unit_rng(config.seed, NAME, view, arm.label, rounds, s)
        rows = online_batches(model, arm, RolloutBudget(roots, config.continuations), pool=config.pool,
                              batches=config.batches, rng=rng, group_size=config.group_size,
                              expansion_rounds=rounds)
        return tidy_metrics(NAME, rows, METRICS, view=view, arm=arm.label, rounds=rounds, seed=s,
                            budget=roots * (1 + config.continuations))

    seeds, grid = range(config.seeds), [(a, r) for a in config.arms for r in config.rounds]
    by_rollouts = units.map(unit, [("equal_rollouts", a, r, config.roots, s) for a, r in grid for s in seeds],
                            desc=NAME)
    roots = _turn_matched_roots(by_rollouts, config)
    by_turns = units.map(unit, [("equal_turns", a, r, roots[a, r], s) for a, r in grid for s in seeds],
                         desc=NAME + "-turns")
    table = pd.concat([by_rollouts, by_turns], ignore_index=True)
    steady = table[table["batch"] >= config.warmup]
    summary = summarise(steady, ["view", "arm", "rounds", "metric"])
    headline: dict = {}
    for row in summary.itertuples():
        suffix = "" if row.view == "equal_rollouts" else "_at_equal_turns"
        entry = headline.setdefault(row.arm, {}).setdefault(f"R{row.rounds}", {})
        entry[row.metric + suffix] = round(float(row.value), 4)
        entry[row.metric + suffix + "_stderr"] = round(float(row.stderr), 4)
    result, held = _verdict(headline, config)
    details = {"roots_at_equal_turns": {f"{Arm.parse(a).label} R{r}": roots[a, r] for a, r in grid}}
    return Outcome(table, headline, result, held, details)


def _turn_matched_roots(by_rollouts: pd.DataFrame, config: Config) -> dict[tuple[str, int], int]:
    """M per (arm, R) so that its mean turns per batch match the arm's at the first R: M' = M T_ref / T."""
    turns = by_rollouts[by_rollouts["metric"] == "turns"].groupby(["arm", "rounds"])["value"].mean()
    out = {}
    for arm in config.arms:
        label = Arm.parse(arm).label
        for r in config.rounds:
            out[arm, r] = max(2, round(config.roots * turns[label, config.rounds[0]] / turns[label, r]))
    return out


def _verdict(headline: dict, config: Config) -> tuple[str, bool]:
    base, parts, held = f"R{config.rounds[0]}", [], True
    for arm, by_r in headline.items():
        ref = by_r[base]
        for r in config.rounds[1:]:
            at = by_r[f"R{r}"]
            d = at["effective_ratio"] - ref["effective_ratio"]
            se = float(np.hypot(at["effective_ratio_stderr"], ref["effective_ratio_stderr"]))
            parts.append(
                f"{arm} R={r}: effective ratio {at['effective_ratio']:.1%} vs "
                f"{ref['effective_ratio']:.1%} at R={config.rounds[0]} (equal rollouts); at equal turns {at['rollouts_at_equal_turns']:.0f} "
                f"rollouts vs {ref['rollouts_at_equal_turns']:.0f}, "
                f"{at['contrast_pairs_per_rollout_at_equal_turns']:.2f} contrast pairs per rollout vs "
                f"{ref['contrast_pairs_per_rollout_at_equal_turns']:.2f}"
            )
            if arm == "trace":
                held &= d > -2 * se
                held &= at["rollouts_at_equal_turns"] > ref["rollouts_at_equal_turns"]
                held &= (at["contrast_pairs_per_rollout_at_equal_turns"]
                         >= ref["contrast_pairs_per_rollout_at_equal_turns"])
    return "; ".join(parts) + ".", bool(held)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
