"""Experiment 1: the contrast identities hold in the simulator, bin by bin, within Monte Carlo error.

Three checks, each binned by the anchor's true value v:

* ``quadratic_variation``: the sum of squared increments of V from a node to the end of its rollout
  (the last increment is R - V) has mean ``contrast_potential(v)`` = v (1 - v). One node per rollout,
  chosen uniformly among its root and prefixes, so that observations are independent.
* ``mixed``: a group of m fresh continuations from a prefix is mixed with probability
  ``mixed_probability(v, m)`` (counted with ``mixed_groups``).
* ``flip``: at least one of k continuations ends differently from the factual reward r with
  probability ``flip_probability(v, r, k)``.

Each bin gives z = (observed - theory) / standard error; the claim holds when every |z| < ``z_limit``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import contrast_potential, flip_probability, mixed_groups, mixed_probability

from ..model import BernoulliTreeModel
from ..rollout import SimForest
from .base import Experiment, Outcome, Units, register, tidy, unit_rng

NAME = "contrast_identities"
CLAIM = (
    "The quadratic variation of V along simulated suffixes has mean V_t (1 - V_t), and the observed shares "
    "of mixed groups and of flipped outcomes equal mixed_probability and flip_probability, per V bin, "
    "within Monte Carlo error."
)


@dataclass(frozen=True)
class Config:
    seed: int = 0
    prompts: int = 200_000
    """Prompts per check and informativeness, one bare rollout each; their prefixes are the anchors of
    the mixed and flip checks."""
    informativeness: tuple[float, ...] = (0.1, 0.3, 1.0)
    """Turn informativeness values s of the model to check (each replaces ``model.informativeness``)."""
    group_sizes: tuple[int, ...] = (2, 4, 8)
    """Continuations per anchor (m for ``mixed``, k for ``flip``)."""
    bins: int = 10
    """Equal-width bins of the anchor's true v."""
    min_count: int = 30
    """Bins with fewer observations are not tested."""
    z_limit: float = 4.0
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        for name in ("prompts", "bins", "min_count"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not self.group_sizes or not all(isinstance(m, int) and m >= 1 for m in self.group_sizes):
            raise ValueError(f"`group_sizes` must be positive integers, got {self.group_sizes!r}")
        for s in self.informativeness:
            dataclasses.replace(self.model, informativeness=s)  # validates s
        if not self.informativeness:
            raise ValueError("`informativeness` must list at least one value")
        if not self.z_limit > 0:
            raise ValueError(f"`z_limit` must be positive, got {self.z_limit!r}")
        if self.model.max_turns < 2:
            raise ValueError("the model needs `max_turns` >= 2 so that rollouts have prefixes to branch from")

    @classmethod
    def quick(cls) -> Config:
        return cls(prompts=4_000, informativeness=(0.3,), group_sizes=(2, 4), bins=5)


def _bin_rows(
    check: str, size: int, v: np.ndarray, observed: np.ndarray, theory: np.ndarray, config: Config
) -> list[dict]:
    """Per v bin: the observed mean, the theory mean, the standard error and z."""
    edges = np.linspace(0.0, 1.0, config.bins + 1)
    which = np.clip(np.digitize(v, edges) - 1, 0, config.bins - 1)
    rows = []
    for b in range(config.bins):
        sel = which == b
        n = int(sel.sum())
        if n < config.min_count:
            continue
        obs, th = observed[sel].mean(), theory[sel].mean()
        se = observed[sel].std(ddof=1) / np.sqrt(n)
        z = (obs - th) / se if se > 0 else 0.0
        base = {"check": check, "group_size": size, "v_low": edges[b], "v_high": edges[b + 1], "n": n}
        rows += [
            {**base, "metric": "observed", "value": obs, "stderr": se},
            {**base, "metric": "theory", "value": th},
            {**base, "metric": "z", "value": z},
        ]
    return rows


def _quadratic_variation(model: BernoulliTreeModel, config: Config, rng) -> list[dict]:
    v0 = model.pass_rates.sample(config.prompts, rng)
    rollouts = model.rollouts({"v": v0}, np.zeros(config.prompts, np.int64), rng)
    start, length = rollouts.start, rollouts.length
    # Path values per rollout: V_0 then the turn values (the last one is R); increments between them.
    path_v = np.insert(rollouts.turns["v"], start, v0)
    path_start = start + np.arange(len(start))
    increments = np.diff(path_v)
    increments[path_start[1:] - 1] = 0.0  # no increment across two rollouts
    sq = np.append(increments**2, 0.0)
    tail = np.cumsum(sq[::-1])[::-1]  # sum of squared increments from each position to the end
    pick = path_start + (rng.random(len(start)) * length).astype(np.int64)  # root or a prefix
    end = path_start + length  # the leaf's position
    qv = tail[pick] - tail[end]
    v = path_v[pick]
    return _bin_rows("quadratic_variation", 0, v, qv, contrast_potential(v), config)


def _continuations(model: BernoulliTreeModel, config: Config, rng) -> list[dict]:
    v0 = model.pass_rates.sample(config.prompts, rng)
    prompts = {"v": v0, "signal": np.zeros(config.prompts)}
    m = np.ones(config.prompts, dtype=np.int64)
    sim = SimForest.plant(prompts, m, model.rollouts(prompts, np.zeros(config.prompts, np.int64), rng))
    forest = sim.forest
    anchors = forest.prefix_anchors()
    v = sim.nodes["v"][anchors]
    factual = forest.reward[forest.factual_leaf[anchors]]
    rows = []
    for size in config.group_sizes:
        source = np.repeat(anchors, size)
        rollouts = model.rollouts(sim.payload(source), forest.depth[source], rng)
        _, mixed = mixed_groups(source, rollouts.reward)  # one entry per anchor, in id order
        differs = (
            np.bincount(
                np.searchsorted(anchors, source),
                weights=rollouts.reward != np.repeat(factual, size),
                minlength=anchors.size,
            )
            > 0
        )
        rows += _bin_rows("mixed", size, v, mixed.astype(float), mixed_probability(v, size), config)
        rows += _bin_rows("flip", size, v, differs.astype(float), flip_probability(v, factual, size), config)
    return rows


def run(config: Config, units: Units) -> Outcome:
    def unit(key) -> pd.DataFrame:
        check, s = key
        rng = unit_rng(config.seed, NAME, check, str(s))
        model = dataclasses.replace(config.model, informativeness=s)
        rows = (
            _quadratic_variation(model, config, rng)
            if check == "quadratic_variation"
            else _continuations(model, config, rng)
        )
        return tidy(NAME, [{"seed": config.seed, "informativeness": s, **r} for r in rows])

    keys = [(check, s) for s in config.informativeness for check in ("quadratic_variation", "continuations")]
    table = units.map(unit, keys, desc=NAME)
    z = table[table["metric"] == "z"]
    worst = z.groupby("check")["value"].apply(lambda s: float(s.abs().max()))
    headline = {
        check: {"max_abs_z": round(value, 3), "bins": int((z["check"] == check).sum())}
        for check, value in worst.items()
    }
    held = bool((worst < config.z_limit).all())
    listed = ", ".join(f"{c} {w:.2f}" for c, w in worst.items())
    result = (
        f"Largest |z| over {len(z)} tested bins: {listed} (limit {config.z_limit}); "
        f"the identities {'hold' if held else 'do NOT hold'} within Monte Carlo error."
    )
    return Outcome(table, headline, result, held)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
