"""Experiment 4: the paper's ablation and budget-shape study.

**Ablation** (PAPER.md: uniform root + uniform prefix 42.8% effective ratio, active + active 52.3%): the
four combinations of uniform or active roots with uniform or active prefixes, ``uniform_tree``,
``active_root_uniform_prefix``, ``prefix_only`` and ``trace``, at one budget shape.

**Budget shape** (PAPER.md: (M, N) = (512, 2) 42.4%, (512, 6) 47.8%, (1024, 2) 52.3%, "root coverage
beats depth"): TRACE over a grid of M root rollouts and N continuations per root rollout, the paper's
three shapes included, under three definitions of the candidate pool (``pool_modes``):

* ``prompt_set``: the same number of candidate prompts, ``prompt_set`` (128), whatever the shape: a
  step's prompt batch is fixed and M sets the rollouts per prompt (M / 128 = 4 or 8 for the paper's
  shapes, GRPO's group size 8 at M = 1024). This is the usual RL set-up and our reading of the paper's;
* ``scaled``: a pool that grows with M, ``pool`` * M / max(``roots``) prompts (as many per root
  rollout at every M);
* ``fixed``: ``pool`` (768) candidates for every shape, so a smaller M is more selective about the
  same pool and its effective ratio's denominator shrinks.

Reported first: mixed prompts per 1,000 rollouts (filtering cannot inflate it), then the effective ratio.
Both studies use the learned predictor, fitted online; the first ``warmup`` batches are left out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import RolloutBudget

from ..model import BernoulliTreeModel
from ..runner import Arm
from .base import Experiment, Outcome, Units, by_arm, register, summarise, tidy_metrics, unit_rng
from .common import PAPER_GRPO_RATIO, YIELD_METRICS, BatchChecks, calibrated, check_arms, online_batches

NAME = "ablation"
CLAIM = (
    "Active root allocation and active prefix expansion each raise the effective ratio on their own and "
    "most together; with a fixed batch of prompts (the paper's set-up), more roots beat more continuations "
    "per root ((1024, 2) beats (512, 6))."
)
ABLATION_ARMS = ("uniform_tree", "active_root_uniform_prefix", "prefix_only", "trace")
POOL_MODES = ("prompt_set", "scaled", "fixed")
PAPER_MODE = "prompt_set"
"""The pool mode that matches the paper's set-up (a fixed batch of prompts per step)."""
SHAPE_METRICS = ("mixed_prompts_per_1k_rollouts", "mixed_prompts_per_1k_turns", "effective_ratio", "mixed_prompts")
METRICS = (*YIELD_METRICS, "effective_ratio", "mixed_prompts", "mixed_anchor_ratio")


@dataclass(frozen=True)
class Config(BatchChecks):
    seed: int = 0
    seeds: int = 6
    batches: int = 8
    warmup: int = 3
    ablation_shape: tuple[int, int] = (1024, 2)
    """(M, N) of the ablation."""
    ablation_arms: tuple[str, ...] = ABLATION_ARMS
    roots: tuple[int, ...] = (256, 512, 1024)
    """M values of the budget-shape grid."""
    continuations: tuple[int, ...] = (0, 1, 2, 4, 6)
    """N values of the budget-shape grid."""
    pool: int = 768
    """Candidate prompts per batch of the ablation and of the ``fixed`` pool mode (``scaled`` at the largest M)."""
    prompt_set: int = 128
    """Candidate prompts per batch of the ``prompt_set`` pool mode."""
    pool_modes: tuple[str, ...] = POOL_MODES
    """How the candidate pool is sized for each shape (see the module docstring)."""
    group_size: int = 8
    target_ratio: float = PAPER_GRPO_RATIO
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        self.check_batches("seeds", "batches", "pool", "prompt_set", "group_size")
        shapes = [tuple(self.ablation_shape)] + list(itertools.product(self.roots, self.continuations))
        if not self.roots or not self.continuations:
            raise ValueError("`roots` and `continuations` must each list at least one value")
        for m, n in shapes:
            RolloutBudget(m, n)  # validates
            if m < 2:
                raise ValueError(f"every shape needs M >= 2 root rollouts, got {m}")
            if m > self.pool * self.group_size:
                raise ValueError(
                    f"M = {m} needs `pool` >= {-(-m // self.group_size)} for uniform roots, got {self.pool}"
                )
        check_arms(self.ablation_arms)
        if not self.pool_modes or any(m not in POOL_MODES for m in self.pool_modes):
            raise ValueError(f"`pool_modes` must name some of {', '.join(POOL_MODES)}, got {self.pool_modes!r}")
        self.check_target_ratio()

    @classmethod
    def quick(cls) -> Config:
        return cls(
            seeds=2,
            batches=3,
            warmup=1,
            ablation_shape=(128, 2),
            roots=(64, 128),
            continuations=(2, 6),
            pool=96,
            prompt_set=16,
        )

    def shape_pool(self, mode: str, m: int) -> int:
        """Candidate prompts per batch for a shape with M = ``m`` under pool mode ``mode``."""
        if mode == "prompt_set":
            return self.prompt_set
        if mode == "scaled":
            return max(1, round(self.pool * m / max(self.roots)))
        return self.pool


def _shape_label(m: int, n: int) -> str:
    return f"M={m},N={n}"


def run(config: Config, units: Units) -> Outcome:
    model = calibrated(config.model, config.target_ratio, config.group_size)

    def unit(key) -> pd.DataFrame:
        study, mode, arm_text, m, n, s = key
        arm = Arm.parse(arm_text)
        rng = unit_rng(config.seed, NAME, study, mode, arm.label, m, n, s)
        budget = RolloutBudget(m, n)
        pool = config.pool if study == "ablation" else config.shape_pool(mode, m)
        rows = online_batches(
            model, arm, budget, pool=pool, batches=config.batches, rng=rng, group_size=config.group_size
        )
        return tidy_metrics(
            NAME,
            rows,
            METRICS,
            study=study,
            pool_mode=mode,
            pool=pool,
            arm=arm.label,
            seed=s,
            budget=budget.total,
            roots=m,
            continuations=n,
        )

    m0, n0 = config.ablation_shape
    keys = [("ablation", "fixed", a, m0, n0, s) for a in config.ablation_arms for s in range(config.seeds)]
    keys += [
        ("shape", mode, "trace", m, n, s)
        for mode in config.pool_modes
        for m in config.roots
        for n in config.continuations
        for s in range(config.seeds)
    ]
    table = units.map(unit, keys, desc=NAME)
    steady = table[table["batch"] >= config.warmup]
    ablation = by_arm(summarise(steady[steady["study"] == "ablation"], ["arm", "metric"]), METRICS)
    summary = summarise(steady[steady["study"] == "shape"], ["pool_mode", "roots", "continuations", "metric"])
    by_pool: dict[str, dict[str, dict[str, float]]] = {}
    for r in summary[summary["metric"].isin(SHAPE_METRICS)].itertuples():
        entry = by_pool.setdefault(r.pool_mode, {}).setdefault(_shape_label(int(r.roots), int(r.continuations)), {})
        entry[r.metric], entry[f"{r.metric}_stderr"] = round(float(r.value), 4), round(float(r.stderr), 4)
    paper_mode = PAPER_MODE if PAPER_MODE in by_pool else next(iter(by_pool))
    result, held = _verdict(ablation, by_pool, paper_mode)
    details = {
        "budget_shapes": by_pool[paper_mode],
        "budget_shapes_pool_mode": paper_mode,
        "budget_shapes_by_pool": by_pool,
        "pools": {mode: {f"M={m}": config.shape_pool(mode, m) for m in config.roots} for mode in config.pool_modes},
        "ablation_shape": list(config.ablation_shape),
    }
    return Outcome(table, ablation, result, held, details)


def _beats(a: dict, b: dict) -> bool:
    """a's effective ratio exceeds b's by more than two standard errors of the difference."""
    gap = a["effective_ratio"] - b["effective_ratio"]
    return bool(gap > 2 * np.hypot(a["effective_ratio_stderr"], b["effective_ratio_stderr"]))


def _verdict(ablation: dict, by_pool: dict, paper_mode: str) -> tuple[str, bool]:
    parts, held = [], True
    needed = set(ABLATION_ARMS)
    if needed <= ablation.keys():
        uu, au, ua, aa = (ablation[a] for a in ABLATION_ARMS)
        each = {
            "active roots (uniform prefixes)": _beats(au, uu),
            "active roots (active prefixes)": _beats(aa, ua),
            "active prefixes (uniform roots)": _beats(ua, uu),
            "active prefixes (active roots)": _beats(aa, au),
        }
        held &= all(each.values())
        parts.append(
            f"mixed prompts per 1,000 rollouts uniform+uniform {uu['mixed_prompts_per_1k_rollouts']:.0f}, "
            f"active+active {aa['mixed_prompts_per_1k_rollouts']:.0f}; effective ratio uniform+uniform "
            f"{uu['effective_ratio']:.1%}, active root {au['effective_ratio']:.1%}, "
            f"active prefix {ua['effective_ratio']:.1%}, active+active {aa['effective_ratio']:.1%} "
            f"(paper: 42.8% -> 52.3%); significant gains: " + ", ".join(f"{k} {v}" for k, v in each.items())
        )
    for mode, shapes in by_pool.items():
        wide, deep = shapes.get(_shape_label(1024, 2)), shapes.get(_shape_label(512, 6))
        if not (wide and deep):
            continue
        coverage = _beats(wide, deep)
        if mode == paper_mode:
            held &= coverage
        narrow = shapes.get(_shape_label(512, 2))
        listed = f"(512, 2) {narrow['effective_ratio']:.1%}, " if narrow else ""
        parts.append(
            f"pool {mode.replace('_', ' ')}{' (the paper’s set-up)' if mode == paper_mode else ''}: "
            f"{listed}(512, 6) {deep['effective_ratio']:.1%}, (1024, 2) {wide['effective_ratio']:.1%} "
            f"(paper: 42.4%, 47.8%, 52.3%), (1024, 2) beats (512, 6): {coverage}; mixed prompts per 1,000 "
            f"rollouts (512, 6) {deep['mixed_prompts_per_1k_rollouts']:.0f}, (1024, 2) "
            f"{wide['mixed_prompts_per_1k_rollouts']:.0f}"
        )
    shapes = by_pool[paper_mode]
    best = max(shapes, key=lambda k: shapes[k]["effective_ratio"])
    parts.append(f"best shape ({paper_mode.replace('_', ' ')}): {best} at {shapes[best]['effective_ratio']:.1%}")
    return "; ".join(parts) + ".", bool(held)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
