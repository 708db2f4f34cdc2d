"""Experiment 4: the paper's ablation and budget-shape study.

**Ablation** (PAPER.md: uniform root + uniform prefix 42.8% effective ratio, active + active 52.3%): the
four combinations of uniform or active roots with uniform or active prefixes, ``uniform_tree``,
``active_root_uniform_prefix``, ``prefix_only`` and ``trace``, at one budget shape.

**Budget shape** (PAPER.md: (M, N) = (512, 2) 42.4%, (512, 6) 47.8%, (1024, 2) 52.3%, "root coverage
beats depth"): TRACE over a grid of M root rollouts and N continuations per root rollout, the paper's
three shapes included. All shapes draw from candidate pools of the same size, so a larger M means more
coverage of the same pool.

Both use the learned predictor, fitted online; the first ``warmup`` batches are left out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import RolloutBudget

from ..model import BernoulliTreeModel
from ..runner import Arm
from .base import Experiment, Outcome, Units, by_arm, register, summarise, tidy, unit_rng
from .common import YIELD_METRICS, PAPER_GRPO_RATIO, calibrated, check_arms, online_batches

NAME = "ablation"
CLAIM = (
    "Active root allocation and active prefix expansion each raise the effective ratio on their own and "
    "most together; at equal pool, more roots beat more continuations per root ((1024, 2) beats (512, 6))."
)
ABLATION_ARMS = ("uniform_tree", "active_root_uniform_prefix", "prefix_only", "trace")
METRICS = (*YIELD_METRICS, "effective_ratio", "mixed_prompts", "mixed_anchor_ratio")


@dataclass(frozen=True)
class Config:
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
    """Candidate prompts per batch, the same for every shape."""
    group_size: int = 8
    target_ratio: float = PAPER_GRPO_RATIO
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        for name in ("seeds", "batches", "pool", "group_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not (isinstance(self.warmup, int) and 0 <= self.warmup < self.batches):
            raise ValueError(f"`warmup` must be an integer in [0, batches), got {self.warmup!r}")
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
        if not 0.0 < self.target_ratio < 1.0:
            raise ValueError(f"`target_ratio` must lie in (0, 1), got {self.target_ratio!r}")

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
        )


def _shape_label(m: int, n: int) -> str:
    return f"M={m},N={n}"


def run(config: Config, units: Units) -> Outcome:
    model = calibrated(config.model, config.target_ratio, config.group_size)

    def unit(key) -> pd.DataFrame:
        study, arm_text, m, n, s = key
        arm = Arm.parse(arm_text)
        rng = unit_rng(config.seed, NAME, study, arm.label, m, n, s)
        budget = RolloutBudget(m, n)
        rows = online_batches(
            model,
            arm,
            budget,
            pool=config.pool,
            batches=config.batches,
            rng=rng,
            group_size=config.group_size,
        )
        return tidy(
            NAME,
            [
                {
                    "study": study,
                    "arm": arm.label,
                    "seed": s,
                    "budget": budget.total,
                    "roots": m,
                    "continuations": n,
                    "batch": r["batch"],
                    "metric": k,
                    "value": r[k],
                }
                for r in rows
                for k in METRICS
            ],
        )

    m0, n0 = config.ablation_shape
    keys = [("ablation", a, m0, n0, s) for a in config.ablation_arms for s in range(config.seeds)]
    keys += [
        ("shape", "trace", m, n, s)
        for m in config.roots
        for n in config.continuations
        for s in range(config.seeds)
    ]
    table = units.map(unit, keys, desc=NAME)
    steady = table[table["batch"] >= config.warmup]
    ablation = by_arm(summarise(steady[steady["study"] == "ablation"], ["arm", "metric"]), METRICS)
    shape_summary = summarise(steady[steady["study"] == "shape"], ["roots", "continuations", "metric"])
    shapes: dict[str, dict[str, float]] = {}
    for r in shape_summary[shape_summary["metric"].isin(["effective_ratio", "mixed_prompts"])].itertuples():
        entry = shapes.setdefault(_shape_label(int(r.roots), int(r.continuations)), {})
        entry[r.metric], entry[f"{r.metric}_stderr"] = round(float(r.value), 4), round(float(r.stderr), 4)
    result, held = _verdict(ablation, shapes)
    return Outcome(
        table,
        ablation,
        result,
        held,
        {"budget_shapes": shapes, "ablation_shape": list(config.ablation_shape)},
    )


def _beats(a: dict, b: dict) -> bool:
    """a's effective ratio exceeds b's by more than two standard errors of the difference."""
    gap = a["effective_ratio"] - b["effective_ratio"]
    return bool(gap > 2 * np.hypot(a["effective_ratio_stderr"], b["effective_ratio_stderr"]))


def _verdict(ablation: dict, shapes: dict) -> tuple[str, bool]:
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
            f"effective ratio uniform+uniform {uu['effective_ratio']:.1%}, "
            f"active root {au['effective_ratio']:.1%}, "
            f"active prefix {ua['effective_ratio']:.1%}, active+active {aa['effective_ratio']:.1%} "
            f"(paper: 42.8% -> 52.3%); significant gains: " + ", ".join(f"{k} {v}" for k, v in each.items())
        )
    wide, deep = shapes.get(_shape_label(1024, 2)), shapes.get(_shape_label(512, 6))
    if wide and deep:
        coverage = _beats(wide, deep)
        held &= coverage
        narrow = shapes.get(_shape_label(512, 2))
        listed = f"(512, 2) {narrow['effective_ratio']:.1%}, " if narrow else ""
        parts.append(
            f"budget shapes {listed}(512, 6) {deep['effective_ratio']:.1%}, "
            f"(1024, 2) {wide['effective_ratio']:.1%} (paper: 42.4%, 47.8%, 52.3%); "
            f"(1024, 2) beats (512, 6) in effective ratio: {coverage}; mixed prompts "
            f"per batch (512, 6) {deep['mixed_prompts']:.0f}, (1024, 2) {wide['mixed_prompts']:.0f}"
        )
    best = max(shapes, key=lambda k: shapes[k]["effective_ratio"])
    parts.append(f"best shape in the grid: {best} at {shapes[best]['effective_ratio']:.1%}")
    return "; ".join(parts) + ".", bool(held)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
