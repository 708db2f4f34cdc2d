"""Experiment 5: learning curves in the tree MDP, at equal rollouts and at equal turns.

Every arm trains a tabular softmax policy from uniform on the same tasks (per seed), spending M (1 + N)
rollouts per step, for ``steps`` steps. After each step we record the policy's exact success
probability J (mean over tasks of V(root), computed by enumeration) against the rollouts and turns spent
so far: the equal-rollout and the equal-token views. Flat arms use the ``default_estimator`` (on a
flat forest every estimator of ``trace_theory.ADVANTAGES`` that normalises like GRPO reduces to it);
``estimator_arm`` is also run with every estimator in ``estimators``.

Labels: ``arm`` for the default estimator, ``arm+estimator`` otherwise (``trace+local``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import ADVANTAGES, effective_ratio

from ..mdp import MDPWorld, TreeMDP, policy_gradient_step
from ..model import PassRates
from ..predictors import make_predictor
from ..runner import Arm, sample_batch
from .base import Experiment, Outcome, Units, mean_and_stderr, register, tidy, unit_rng
from .common import BatchShape, PAPER_GRPO_RATIO, check_arms

NAME = "learning_curves"
CLAIM = (
    "In an enumerable tree MDP, a policy trained on TRACE's trees reaches a higher true success probability "
    "than one trained on GRPO's groups, both at equal rollouts and at equal turns."
)
ARMS = (
    "grpo",
    "dapo",
    "pcl",
    "root_only",
    "random_prefix",
    "prefix_only",
    "trace",
    "trace_beta",
    "trace[oracle]",
)


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    seeds: int = 16
    steps: int = 60
    lr: float = 20.0
    """Policy-gradient step size (the same for every arm and estimator)."""
    roots: int = 32
    continuations: int = 2
    group_size: int = 8
    arms: tuple[str, ...] = ARMS
    default_estimator: str = "trace"
    estimator_arm: str = "trace"
    estimators: tuple[str, ...] = ("grpo", "local", "treerl", "treepo", "trace")
    predictor_decay: float = 0.8
    """Discount of the learned predictor's past statistics per step (the policy it predicts changes)."""
    mdp: TreeMDP = field(
        default_factory=lambda: TreeMDP(pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8))
    )

    def __post_init__(self):
        for name in ("seeds", "steps", "roots", "group_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not (isinstance(self.continuations, int) and self.continuations >= 0):
            raise ValueError(f"`continuations` must be a non-negative integer, got {self.continuations!r}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"`lr` must be finite and positive, got {self.lr!r}")
        if not 0.0 < self.predictor_decay <= 1.0:
            raise ValueError(f"`predictor_decay` must lie in (0, 1], got {self.predictor_decay!r}")
        check_arms(self.arms)
        Arm.parse(self.estimator_arm)
        for name in (self.default_estimator, *self.estimators):
            ADVANTAGES.check(name)
        need = -(-self.budget.total // self.group_size)
        if need > self.mdp.n_tasks:
            raise ValueError(
                f"flat arms draw up to {need} tasks per step; raise `mdp.n_tasks` (got {self.mdp.n_tasks})"
            )

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(arm, estimator) pairs: every arm with the default estimator, then the estimator study."""
        pairs = [(a, self.default_estimator) for a in self.arms]
        pairs += [(self.estimator_arm, e) for e in self.estimators if (self.estimator_arm, e) not in pairs]
        return pairs

    def label(self, arm: str, estimator: str) -> str:
        text = Arm.parse(arm).label
        return text if estimator == self.default_estimator else f"{text}+{estimator}"

    @classmethod
    def quick(cls) -> Config:
        return cls(
            seeds=2,
            steps=6,
            roots=16,
            estimators=("grpo", "trace"),
            mdp=TreeMDP(n_tasks=16, horizon=3, pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8)),
        )


def _curve(config: Config, arm: Arm, estimator: str, s: int) -> list[dict]:
    tasks = config.mdp.build(unit_rng(config.seed, NAME, "tasks", s))  # the same tasks for every arm
    rng = unit_rng(config.seed, NAME, arm.label, estimator, s)
    policy = arm.allocation_policy(group_size=config.group_size)
    options = {"decay": config.predictor_decay} if arm.predictor == "learned" else {}
    predictor = make_predictor(arm.predictor, **options)
    theta = tasks.initial_logits()
    rollouts = turns = 0.0
    rows = [{"step": 0, "rollouts": 0.0, "turns": 0.0, "success": float(tasks.success(theta).mean())}]
    for step in range(1, config.steps + 1):
        world = MDPWorld(tasks, theta)
        batch = sample_batch(world, policy, config.budget, predictor, pool=config.mdp.n_tasks, rng=rng)
        predictor = predictor.update(batch.sampled)
        theta = policy_gradient_step(world, batch.trained, estimator=estimator, lr=config.lr)
        rollouts, turns = rollouts + batch.rollouts, turns + batch.turns
        rows.append(
            {
                "step": step,
                "rollouts": rollouts,
                "turns": turns,
                "success": float(tasks.success(theta).mean()),
                "effective_ratio": effective_ratio(batch.sampled.forest),
            }
        )
    return rows


def run(config: Config, units: Units) -> Outcome:
    def unit(key) -> pd.DataFrame:
        arm_text, estimator, s = key
        arm = Arm.parse(arm_text)
        label = config.label(arm_text, estimator)
        rows = _curve(config, arm, estimator, s)
        return tidy(
            NAME,
            [
                {
                    "arm": label,
                    "policy": arm.policy,
                    "predictor": arm.predictor,
                    "estimator": estimator,
                    "seed": s,
                    "budget": config.budget.total,
                    "step": r["step"],
                    "metric": k,
                    "value": r[k],
                }
                for r in rows
                for k in ("success", "rollouts", "turns", "effective_ratio")
                if k in r
            ],
        )

    keys = [(a, e, s) for a, e in config.runs for s in range(config.seeds)]
    table = units.map(unit, keys, desc=NAME)
    headline, details = _headline(table, config)
    result, held = _verdict(headline, details)
    return Outcome(table, headline, result, held, details)


def _success_at_turns(curves: pd.DataFrame, budget_turns: float) -> pd.Series:
    """Per (arm, seed): success interpolated at ``budget_turns`` turns spent (the equal-token view)."""
    wide = curves.pivot_table(index=["arm", "seed", "step"], columns="metric", values="value")
    return wide.groupby(level=["arm", "seed"]).apply(
        lambda g: float(np.interp(budget_turns, g["turns"], g["success"]))
    )


def _headline(table: pd.DataFrame, config: Config) -> tuple[dict, dict]:
    final = table[(table["step"] == config.steps)]
    by = final.pivot_table(index=["arm", "seed"], columns="metric", values="value")
    equal_turns = float(by["turns"].groupby(level="arm").mean().min())
    at_turns = _success_at_turns(table, equal_turns)
    initial = float(table[(table["step"] == 0) & (table["metric"] == "success")]["value"].mean())
    headline = {}
    for arm in dict.fromkeys(table["arm"]):
        mean, se = mean_and_stderr(by.loc[arm, "success"])
        at, at_se = mean_and_stderr(at_turns.loc[arm])
        headline[arm] = {
            "final_success": round(mean, 4),
            "final_success_stderr": round(se, 4),
            "success_at_equal_turns": round(at, 4),
            "success_at_equal_turns_stderr": round(at_se, 4),
            "turns": round(float(by.loc[arm, "turns"].mean()), 1),
        }
    details = {
        "initial_success": round(initial, 4),
        "equal_turns": round(equal_turns, 1),
        "paired": _paired(by["success"], at_turns),
    }
    return headline, details


def _paired(final: pd.Series, at_turns: pd.Series) -> dict:
    """TRACE minus GRPO, paired by seed (same tasks), at equal rollouts and at equal turns."""
    if not {"trace", "grpo"} <= set(final.index.get_level_values("arm")):
        return {}
    out = {}
    for view, series in (("equal_rollouts", final), ("equal_turns", at_turns)):
        diff = series.loc["trace"] - series.loc["grpo"]
        mean, se = mean_and_stderr(diff.to_numpy())
        out[view] = {"trace_minus_grpo": round(mean, 4), "stderr": round(se, 4)}
    return out


def _verdict(headline: dict, details: dict) -> tuple[str, bool]:
    best = max(headline, key=lambda a: headline[a]["final_success"])
    text = (
        f"From J = {details['initial_success']:.3f} (uniform policy), best final success: {best} at "
        f"{headline[best]['final_success']:.3f}"
    )
    paired = details["paired"]
    if not paired:
        return text + ".", False
    eq_r, eq_t = paired["equal_rollouts"], paired["equal_turns"]
    held = bool(
        eq_r["trace_minus_grpo"] > 2 * eq_r["stderr"] and eq_t["trace_minus_grpo"] > 2 * eq_t["stderr"]
    )
    text += (
        f"; TRACE {headline['trace']['final_success']:.3f} vs GRPO "
        f"{headline['grpo']['final_success']:.3f} at equal "
        f"rollouts (paired difference {eq_r['trace_minus_grpo']:+.3f} ± {eq_r['stderr']:.3f}), and "
        f"{eq_t['trace_minus_grpo']:+.3f} ± {eq_t['stderr']:.3f} at equal turns "
        f"({details['equal_turns']:.0f} turns)."
    )
    return text, held


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
