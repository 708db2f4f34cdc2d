"""Experiment 6: predictor quality against allocation quality.

TRACE runs with a noisy oracle, logit v = temperature * logit V + noise * N(0, 1), over a grid of noise
levels and temperatures (temperature > 1: over-confident, < 1: under-confident). For each setting we
record the predictor's Brier score and expected calibration error against the true V at the anchors it
was asked about (``brier_score``, ``expected_calibration_error``) and what the allocation achieved.
References: GRPO (no predictor), TRACE with the learned predictor and TRACE with the oracle. The learned
predictor is placed on the noise axis: the noise at which the noisy oracle's effective ratio equals the
learned predictor's (linear interpolation; only defined inside the swept range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from trace_theory import RolloutBudget

from ..model import BernoulliTreeModel
from ..runner import Arm
from .base import Experiment, Outcome, Units, by_arm, register, summarise, tidy_metrics, unit_rng
from .common import YIELD_METRICS, BatchShape, PAPER_GRPO_RATIO, calibrated, check_arms, online_batches

NAME = "predictor_quality"
CLAIM = (
    "Allocation quality tracks predictor quality: TRACE's effective ratio falls as the predictor's noise "
    "grows, from the oracle's towards GRPO's, and stays above GRPO's until the predictions carry little "
    "information."
)
METRICS = (
    *YIELD_METRICS,
    "effective_ratio",
    "mixed_prompts",
    "predictor_brier",
    "predictor_brier_roots",
    "predictor_brier_prefixes",
    "predictor_ece",
)


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    seeds: int = 6
    batches: int = 6
    warmup: int = 3
    """Leading batches left out (the learned reference is still fitting)."""
    roots: int = 512
    continuations: int = 2
    group_size: int = 8
    pool_factor: float = 2.0
    noises: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    temperatures: tuple[float, ...] = (0.5, 1.0, 2.0)
    """Temperatures of the noisy oracle; 1.0 must be among them (the noise sweep is read there)."""
    references: tuple[str, ...] = ("grpo", "trace", "trace[oracle]")
    target_ratio: float = PAPER_GRPO_RATIO
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        self.check_batches("seeds", "batches", "roots", "group_size")
        RolloutBudget(self.roots, self.continuations)
        self.check_pool_factor()
        if len(self.noises) < 2 or sorted(set(self.noises)) != list(self.noises) or self.noises[0] < 0:
            raise ValueError(
                f"`noises` must be at least two increasing non-negative values, got {self.noises!r}"
            )
        if 1.0 not in self.temperatures or not all(t > 0 for t in self.temperatures):
            raise ValueError(f"`temperatures` must be positive and include 1.0, got {self.temperatures!r}")
        check_arms(self.references)
        self.check_target_ratio()

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=2, batches=3, warmup=1, roots=64, noises=(0.0, 1.0, 8.0), temperatures=(1.0,))


def run(config: Config, units: Units) -> Outcome:
    model = calibrated(config.model, config.target_ratio, config.group_size)

    def unit(key) -> pd.DataFrame:
        arm_text, noise, temperature, s = key
        arm = Arm.parse(arm_text)
        rng = unit_rng(config.seed, NAME, arm.label, str(noise), str(temperature), s)
        options = {"noisy": {"noise": noise, "temperature": temperature}}
        rows = online_batches(
            model,
            arm,
            config.budget,
            pool=config.pool,
            batches=config.batches,
            rng=rng,
            group_size=config.group_size,
            predictor_options=options,
        )
        return tidy_metrics(
            NAME,
            rows,
            METRICS,
            arm=arm.label,
            seed=s,
            budget=config.budget.total,
            noise=noise,
            temperature=temperature,
        )

    keys = [
        ("trace[noisy]", n, t, s)
        for t in config.temperatures
        for n in config.noises
        for s in range(config.seeds)
    ]
    keys += [(a, math.nan, math.nan, s) for a in config.references for s in range(config.seeds)]
    table = units.map(unit, keys, desc=NAME)
    steady = table[table["batch"] >= config.warmup]
    sweep = summarise(steady[steady["arm"] == "trace[noisy]"], ["noise", "temperature", "metric"])
    references = by_arm(summarise(steady[steady["arm"] != "trace[noisy]"], ["arm", "metric"]), METRICS)
    return _outcome(table, sweep, references, config)


def _outcome(table, sweep: pd.DataFrame, references: dict, config: Config) -> Outcome:
    wide = sweep.pivot_table(index=["temperature", "noise"], columns="metric", values=["value", "stderr"])
    ratio, ratio_se = wide[("value", "effective_ratio")], wide[("stderr", "effective_ratio")]
    curve, curve_se = ratio.loc[1.0], ratio_se.loc[1.0]
    steps = np.diff(curve.to_numpy())
    tolerance = 2 * np.hypot(curve_se.to_numpy()[1:], curve_se.to_numpy()[:-1])
    monotone = bool((steps <= tolerance).all())
    brier = wide[("value", "predictor_brier")]
    mixed = wide[("value", "mixed_prompts")]
    rho = float(spearmanr(brier, ratio).statistic)
    rho_mixed = float(spearmanr(brier, mixed).statistic)
    headline = dict(references)
    for (t, n), value in ratio.items():
        headline[f"trace[noisy] noise={n:g} temperature={t:g}"] = {
            "effective_ratio": round(float(value), 4),
            "effective_ratio_stderr": round(float(ratio_se.loc[(t, n)]), 4),
            "mixed_prompts": round(float(wide.loc[(t, n), ("value", "mixed_prompts")]), 2),
            "predictor_brier": round(float(wide.loc[(t, n), ("value", "predictor_brier")]), 5),
            "predictor_brier_roots": round(float(wide.loc[(t, n), ("value", "predictor_brier_roots")]), 5),
            "predictor_brier_prefixes": round(
                float(wide.loc[(t, n), ("value", "predictor_brier_prefixes")]), 5
            ),
            "predictor_ece": round(float(wide.loc[(t, n), ("value", "predictor_ece")]), 5),
        }
    details = {
        "spearman_brier_vs_ratio": round(rho, 3),
        "spearman_brier_vs_mixed_prompts": round(rho_mixed, 3),
        "monotone_in_noise": monotone,
    }
    sweep_text = (
        f"at temperature 1 the effective ratio goes from {curve.iloc[0]:.1%} (noise {curve.index[0]:g}) to "
        f"{curve.iloc[-1]:.1%} (noise {curve.index[-1]:g}), monotone within 2 standard errors: {monotone}; "
        f"Spearman correlation of the Brier score with the effective ratio {rho:.2f}, with the number of "
        f"mixed prompts {rho_mixed:.2f}, over all settings"
    )
    quietest = min(config.noises)
    parts = [sweep_text] + [
        f"at noise {quietest:g} and temperature {t:g}: ratio {ratio.loc[(t, quietest)]:.1%}, "
        f"{mixed.loc[(t, quietest)]:.0f} mixed prompts"
        for t in config.temperatures
    ]
    held = monotone and rho < 0
    if "grpo" in references:
        grpo = references["grpo"]["effective_ratio"]
        above = curve[curve > grpo]
        details["grpo_effective_ratio"] = grpo
        parts.append(
            f"GRPO {grpo:.1%}; TRACE stays above it up to noise {above.index.max():g}"
            if len(above)
            else f"GRPO {grpo:.1%} is never beaten"
        )
        held &= bool(curve.iloc[0] > grpo)
    if "trace" in references:
        learned = references["trace"]["effective_ratio"]
        equivalent = _equivalent_noise(curve, learned)
        details["learned_equivalent_noise"] = equivalent
        parts.append(
            f"the learned predictor ({learned:.1%}) is worth a noisy oracle with noise "
            + (f"{equivalent:.2f}" if equivalent is not None else "outside the swept range")
        )
    return Outcome(table, headline, "; ".join(parts) + ".", bool(held), details)


def _equivalent_noise(curve: pd.Series, target: float) -> float | None:
    """Noise at which the (decreasing) curve crosses ``target``, by linear interpolation; None outside."""
    noise, value = curve.index.to_numpy(float), curve.to_numpy()
    for i in range(len(value) - 1):
        hi, lo = value[i], value[i + 1]
        if min(hi, lo) <= target <= max(hi, lo) and hi != lo:
            return round(float(noise[i] + (hi - target) / (hi - lo) * (noise[i + 1] - noise[i])), 3)
    return None


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
