"""Experiment 9 (beyond the paper): where tree expansion pays, best against best.

TRACE spends part of its budget on continuations from prefixes; root-only allocation spends it all on
fresh rollouts of the prompts it selects, and PCL filters prompts near p = 1/2. Which wins depends on
the world, so we vary, one at a time around the default tree MDP of ``learning_curves``:

* **turn informativeness**: ``action_scale``, how much one decision moves the logit of success (a prefix
  of an informative episode has a value far from its prompt's, which is what a continuation exploits);
* **horizon**: turns per episode (more prefixes to branch from; a continuation saves more turns);
* **difficulty spread**: the pass rates calibrated so that GRPO with 8 rollouts mixes ``spreads`` of its
  prompts (low: most prompts always or never solved, so selecting prompts matters more);
* **relative cost of a continuation** (read off every run, no extra training): a continuation from depth
  d costs its H - d new turns plus ``kappa`` d (re-reading the prefix: 0 with a perfect prefix cache, 1
  when a continuation costs as much as a fresh rollout).

In each world every arm's learning rate is tuned on ``tuning_seeds`` seeds (grid ``lrs``, per view) and
the arms are compared at their best rates on ``seeds`` other seeds, paired by seed (:mod:`.tuning`), at
equal rollouts and at equal tokens for each ``kappa``. TRACE "pays" in a world when it beats both
root-only and PCL there by more than two standard errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trace_theory import RolloutBudget

from ..mdp import NORMALISATIONS, TreeMDP
from ..model import PassRates
from ..runner import Arm
from . import tuning
from .base import Experiment, Outcome, Units, register, tidy_metrics, unit_rng
from .common import PAPER_GRPO_RATIO, check_arms
from .learning_curves import train_curve

NAME = "regime_map"
CLAIM = (
    "Tree expansion pays somewhere: in some worlds (turn informativeness, horizon, difficulty spread, "
    "continuation cost) TRACE beats both root-only allocation and PCL with every arm at its own best "
    "learning rate, at equal rollouts and at equal tokens."
)
AXES = ("informativeness", "horizon", "spread")
COMPARED = ("root_only", "pcl", "grpo")


@dataclass(frozen=True)
class Config:
    seed: int = 0
    seeds: int = 6
    """Report seeds per world."""
    tuning_seeds: int = 2
    steps: int = 40
    roots: int = 32
    continuations: int = 2
    group_size: int = 8
    n_tasks: int = 64
    arms: tuple[str, ...] = ("grpo", "pcl", "root_only", "trace")
    lrs: tuple[float, ...] = (10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
    normalisation: str = "leaves"
    action_scales: tuple[float, ...] = (0.5, 1.5, 3.0)
    """Turn informativeness: standard deviation of one action's effect on the logit of success."""
    horizons: tuple[int, ...] = (2, 4, 6)
    spreads: tuple[float, ...] = (0.15, PAPER_GRPO_RATIO, 0.5)
    """GRPO's calibrated effective ratio with 8 rollouts: lower means a wider spread of difficulty."""
    kappas: tuple[float, ...] = (0.0, 0.5, 1.0)
    """Relative cost of re-reading a continuation's prefix (0: prefix cache; 1: as a fresh rollout)."""
    default: tuple[float, int, float] = (1.5, 4, PAPER_GRPO_RATIO)
    """(action scale, horizon, spread) of the default world, the centre of the one-at-a-time design."""
    record_every: int = 4

    def __post_init__(self):
        for name in ("seeds", "tuning_seeds", "steps", "roots", "group_size", "n_tasks", "record_every"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        RolloutBudget(self.roots, self.continuations)
        check_arms(self.arms)
        if not {"trace", *COMPARED} <= {Arm.parse(a).label for a in self.arms}:
            raise ValueError(f"`arms` must include trace, {', '.join(COMPARED)}; got {self.arms!r}")
        if not (self.lrs and all(x > 0 for x in self.lrs)):
            raise ValueError(f"`lrs` must be positive, got {self.lrs!r}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(
                f"`normalisation` must be one of {', '.join(NORMALISATIONS)}, got {self.normalisation!r}"
            )
        if not (all(0 <= k <= 1 for k in self.kappas) and 0.0 in self.kappas):
            raise ValueError(f"`kappas` must lie in [0, 1] and include 0, got {self.kappas!r}")
        a, h, s = self.default
        if a not in self.action_scales or h not in self.horizons or s not in self.spreads:
            raise ValueError(f"`default` {self.default!r} must lie on the axes' grids")
        if -(-self.roots * (1 + self.continuations) // self.group_size) > self.n_tasks:
            raise ValueError(f"raise `n_tasks` (got {self.n_tasks}) for the flat arms' groups")
        _ = self.worlds  # builds every world: an unreachable spread or a bad horizon raises here

    @classmethod
    def quick(cls) -> Config:
        return cls(
            seeds=2,
            tuning_seeds=1,
            steps=5,
            roots=16,
            n_tasks=16,
            lrs=(20.0, 40.0),
            action_scales=(1.5, 3.0),
            horizons=(3, 4),
            spreads=(PAPER_GRPO_RATIO, 0.5),
            record_every=2,
        )

    @property
    def worlds(self) -> dict[str, TreeMDP]:
        """``axis=value`` -> the tree MDP (one at a time around ``default``; the default world is ``default``)."""
        a0, h0, s0 = self.default

        def mdp(a, h, s) -> TreeMDP:
            return TreeMDP(
                n_tasks=self.n_tasks,
                horizon=h,
                action_scale=a,
                pass_rates=PassRates().calibrated(s, self.group_size),
            )

        out = {"default": mdp(a0, h0, s0)}
        out.update({f"informativeness={a:g}": mdp(a, h0, s0) for a in self.action_scales if a != a0})
        out.update({f"horizon={h}": mdp(a0, h, s0) for h in self.horizons if h != h0})
        out.update({f"spread={s:g}": mdp(a0, h0, s) for s in self.spreads if s != s0})
        return out


def run(config: Config, units: Units) -> Outcome:
    worlds = config.worlds
    budget = RolloutBudget(config.roots, config.continuations)

    def unit(key) -> pd.DataFrame:
        world, arm_text, lr, s = key
        arm = Arm.parse(arm_text)
        rows = train_curve(
            worlds[world].build(unit_rng(config.seed, NAME, world, "tasks", s)),
            arm,
            "trace",
            budget=budget,
            steps=config.steps,
            lr=lr,
            normalisation=config.normalisation,
            rng=unit_rng(config.seed, NAME, world, arm.label, s),
            group_size=config.group_size,
            record_every=config.record_every,
        )
        return tidy_metrics(
            NAME,
            rows,
            ("success", "rollouts", "turns", "prefix_turns"),
            world=world,
            arm=arm.label,
            lr=lr,
            seed=s,
            budget=budget.total,
            index="step",
        )

    tune = range(config.seeds, config.seeds + config.tuning_seeds)
    keys = [(w, a, lr, s) for w in worlds for a in config.arms for lr in config.lrs for s in tune]
    tuned = units.map(unit, keys, desc=NAME + "-tuning")
    rates = {w: tuning.best_rates(_scores(tuned[tuned["world"] == w], config.kappas), tune) for w in worlds}
    report = [
        (w, a, lr, s)
        for w in worlds
        for a in config.arms
        for lr in sorted(set(rates[w][v][Arm.parse(a).label] for v in rates[w]))
        for s in range(config.seeds)
    ]
    reported = units.map(unit, report, desc=NAME + "-report")
    table = pd.concat([tuned.assign(stage="tuning"), reported.assign(stage="report")], ignore_index=True)
    headline = {}
    for w in worlds:
        scores = _scores(reported[reported["world"] == w], config.kappas)
        headline[w] = {
            view: tuning.comparison(scores, rates[w][view], view, range(config.seeds), "trace")
            for view in rates[w]
        }
    details = {
        "pays": {w: _pays(h) for w, h in headline.items()},
        "on_grid_edge": {
            w: sorted({a for v in rates[w] for a in tuning.on_grid_edge(rates[w][v], config.lrs)})
            for w in worlds
        },
        "axes": {
            "informativeness": list(config.action_scales),
            "horizon": list(config.horizons),
            "spread": list(config.spreads),
            "kappa": list(config.kappas),
        },
        "default": list(config.default),
    }
    result, held = _verdict(headline, details)
    return Outcome(table, headline, result, held, details)


def _view(kappa: float) -> str:
    return f"equal_tokens_kappa={kappa:g}"


def _scores(table: pd.DataFrame, kappas) -> pd.DataFrame:
    """Final J (equal rollouts) and J at the equal token cost of each kappa, per run (arm, lr, seed).

    Token cost after a step = turns + kappa * prefix_turns; the equal-cost point is the smallest mean
    final cost over arms (so every arm's curve reaches it).
    """
    wide = table.pivot_table(index=["arm", "lr", "seed", "step"], columns="metric", values="value")
    final = wide.groupby(level=["arm", "lr", "seed"]).tail(1)
    rows = []
    for kappa in kappas:
        cost = final["turns"] + kappa * final["prefix_turns"]
        target = float(cost.groupby(level="arm").mean().min())
        for (arm, lr, seed), g in wide.groupby(level=["arm", "lr", "seed"], sort=False):
            spent = (g["turns"] + kappa * g["prefix_turns"]).to_numpy()
            value = float(np.interp(target, spent, g["success"].to_numpy()))
            rows.append({"arm": arm, "lr": lr, "seed": seed, "view": _view(kappa), "value": value})
    for (arm, lr, seed), g in final.groupby(level=["arm", "lr", "seed"], sort=False):
        rows.append(
            {
                "arm": arm,
                "lr": lr,
                "seed": seed,
                "view": "equal_rollouts",
                "value": float(g["success"].iloc[0]),
            }
        )
    return pd.DataFrame(rows)


def _pays(world: dict) -> dict[str, bool]:
    """Per view: TRACE beats root-only and PCL by more than two standard errors (best against best)."""
    return {
        view: all(tuning.beats(entry["gap"].get(arm)) for arm in ("root_only", "pcl"))
        for view, entry in world.items()
    }


def _verdict(headline: dict, details: dict) -> tuple[str, bool]:
    pays = details["pays"]
    both = [w for w, p in pays.items() if p.get("equal_rollouts") and p.get(_view(0.0))]
    parts = []
    for w, entry in headline.items():
        gaps = ", ".join(
            f"{arm.replace('_', '-')} {entry[v]['gap'][arm]['mean']:+.3f} ± {entry[v]['gap'][arm]['stderr']:.3f}"
            for v in ("equal_rollouts",)
            for arm in ("root_only", "pcl")
            if arm in entry[v]["gap"]
        )
        parts.append(f"{w}: TRACE minus {gaps}")
    text = (
        "Best against best, TRACE minus each arm at equal rollouts: "
        + "; ".join(parts)
        + ". "
        + (
            f"TRACE beats root-only and PCL at equal rollouts and equal tokens (prefix cache) in: {', '.join(both)}."
            if both
            else "TRACE beats both root-only and PCL at equal rollouts and equal tokens in no world tried."
        )
    )
    single = [f"{w} ({v.replace('_', ' ')})" for w, p in pays.items() for v, ok in p.items() if ok]
    if single:
        text += f" In one view alone it beats both in: {', '.join(single)}."
    return text, bool(both)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
