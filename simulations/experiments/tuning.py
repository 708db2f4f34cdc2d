"""Best against best: pick each policy's learning rate on tuning seeds, compare on separate report seeds.

A comparison at one shared learning rate favours whichever policy that rate happens to suit (with the
step normalised by all leaves, a batch with more mixed groups takes a larger step). Here every policy is
run over a grid of rates on *tuning* seeds; its best rate (highest mean score there) is then run on the
*report* seeds, which never informed the choice, and policies are compared paired by seed (within a seed
every policy trains on the same tasks).

``scores`` tables have columns ``arm, lr, seed, view, value``: one final score per run, ``view`` naming
how budgets are matched (``equal_rollouts``, ``equal_turns``, ...).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .base import mean_and_stderr


def best_rates(scores: pd.DataFrame, seeds) -> dict[str, dict[str, float]]:
    """{view: {arm: lr with the highest mean score over ``seeds``}} (ties: the smaller rate)."""
    tuning = scores[scores["seed"].isin(list(seeds))]
    means = tuning.groupby(["view", "arm", "lr"])["value"].mean().reset_index()
    means = means.sort_values(["view", "arm", "value", "lr"], ascending=[True, True, False, True])
    best = means.groupby(["view", "arm"], sort=False).head(1)
    out: dict[str, dict[str, float]] = {}
    for row in best.itertuples():
        out.setdefault(row.view, {})[row.arm] = float(row.lr)
    return out


def at_rates(scores: pd.DataFrame, rates: dict[str, float], view: str, seeds) -> pd.DataFrame:
    """Per-seed scores (index seed, one column per arm) of each arm at its rate in ``rates``."""
    chosen = scores[(scores["view"] == view) & scores["seed"].isin(list(seeds))]
    chosen = chosen[chosen["lr"] == chosen["arm"].map(rates)]
    return chosen.pivot_table(index="seed", columns="arm", values="value")


def comparison(scores: pd.DataFrame, rates: dict[str, float], view: str, seeds, reference: str) -> dict:
    """Each arm's mean score at its rate, and ``reference`` minus each other arm, paired by seed.

    Returns ``{"score": {arm: {"mean", "stderr", "lr"}}, "gap": {arm: {"mean", "stderr"}}}``; the gap's
    standard error is that of the per-seed differences.
    """
    wide = at_rates(scores, rates, view, seeds)
    out: dict[str, dict] = {"score": {}, "gap": {}}
    for arm in wide.columns:
        mean, se = mean_and_stderr(wide[arm].dropna())
        out["score"][arm] = {"mean": round(mean, 4), "stderr": round(se, 4), "lr": rates[arm]}
        if arm != reference and reference in wide:
            mean, se = mean_and_stderr((wide[reference] - wide[arm]).dropna())
            out["gap"][arm] = {"mean": round(mean, 4), "stderr": round(se, 4)}
    return out


def beats(gap: dict | None, *, z: float = 2.0) -> bool:
    """Whether a paired gap is positive by more than ``z`` standard errors."""
    return bool(gap) and np.isfinite(gap["stderr"]) and gap["mean"] > z * gap["stderr"]


def on_grid_edge(rates: dict[str, float], grid) -> list[str]:
    """Arms whose best rate is the smallest or largest of the grid (the optimum may lie outside it)."""
    return sorted(arm for arm, lr in rates.items() if lr in (min(grid), max(grid)))
