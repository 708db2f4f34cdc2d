"""Experiment 7: bias and variance of the recursive targets and advantages against exact values.

In the Bernoulli world the true V of every node is known, so each value method of
``trace_theory.VALUE_METHODS`` can be compared with it node by node: error = target - V. We report, per
branching rule and node group (roots; all prefixes; the prefixes that were branched from), over all
nodes of the group and per bin of the true V,

* ``bias``: mean error, and ``weighted_bias``: sum of weight * error / sum of weight with the method's
  own weights (the estimating equation a weighted least-squares predictor fit solves);
* ``variance`` and ``rmse`` of the error.

TRACE (oracle or learned predictor) branches more where the factual outcome looks surprising, so the
number of leaves under a prefix depends on outcomes along its own rollout; ``uniform_tree`` and
``random_prefix`` branch independently of outcomes and serve as controls. The claims are about all
prefixes, by bin of their true V, and about the weighted bias, which is what a fit with the method's
weights inherits: the set of branched prefixes is itself selected on outcomes (reported, not tested).

With one level of branching the leaf-count-weighted leaf mean would still be unbiased (it equals
``own_branches`` then); the bias comes from continuations of deeper prefixes on y's own rollout, whose
number depends on that rollout's outcome and whose values are correlated with it.

For the advantages of ``trace_theory.ADVANTAGES`` (which live on different scales) we report, on turns
that continue a branched prefix x, the correlation with the exact local advantage V(y) - V(x) and the
share of turns whose sign agrees with it; for ``local``, whose scale is V's, also its bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import (
    ADVANTAGES,
    VALUE_METHODS,
    compute_advantages,
    get_policy,
    node_targets,
)

from ..model import BernoulliTreeModel
from ..predictors import make_predictor
from ..runner import Arm, sample_batch
from .base import Experiment, Outcome, Units, register, summarise, tidy, unit_rng
from .common import BatchShape, PAPER_GRPO_RATIO, calibrated, check_arms

NAME = "target_bias"
CLAIM = (
    "When branching depends on the factual outcome (TRACE), a predictor fitted to the paper's leaf-weighted "
    "targets with their leaf-count weights solves a biased estimating equation at prefixes, while it is "
    "unbiased "
    "under outcome-independent branching; the factual and own_branches targets are unbiased under every rule."
)
ARMS = ("trace[oracle]", "trace", "uniform_tree", "random_prefix")


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    seeds: int = 24
    """Independent repetitions (units); each samples ``batches`` batches."""
    batches: int = 4
    warmup: int = 2
    """Batches per repetition that only train the learned predictor (not measured)."""
    roots: int = 512
    continuations: int = 2
    group_size: int = 8
    pool_factor: float = 2.0
    arms: tuple[str, ...] = ARMS
    bins: int = 5
    """Equal-width bins of the true V in which biases are also measured."""
    z_limit: float = 4.0
    target_ratio: float = PAPER_GRPO_RATIO
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)

    def __post_init__(self):
        self.check_batches("seeds", "batches", "roots", "group_size", "bins")
        if self.seeds < 2:
            raise ValueError(f"`seeds` must be at least 2 to give standard errors, got {self.seeds}")
        if not (isinstance(self.continuations, int) and self.continuations >= 1):
            raise ValueError(
                "`continuations` must be at least 1 (this experiment is about branching), "
                f"got {self.continuations!r}"
            )
        self.check_pool_factor()
        check_arms(self.arms)
        flat = [a for a in self.arms if not get_policy(Arm.parse(a).policy).branches]
        if flat:
            raise ValueError(f"`arms` must branch from prefixes; {flat[0]!r} does not")
        if not self.z_limit > 0:
            raise ValueError(f"`z_limit` must be positive, got {self.z_limit!r}")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=3, batches=2, warmup=1, roots=64, arms=("trace[oracle]", "uniform_tree"))


def _node_groups(forest) -> dict[str, np.ndarray]:
    """Roots, every prefix (non-root internal node), and the prefixes that were branched from.

    Being branched from is selected on the factual outcome, so within ``branched_prefix`` even the
    factual reward is a biased estimate of V; unbiasedness is a statement about ``prefix``.
    """
    internal = ~forest.is_leaf
    root = forest.parent == -1
    prefix = internal & ~root
    return {
        "root": np.flatnonzero(root),
        "prefix": np.flatnonzero(prefix),
        "branched_prefix": np.flatnonzero(prefix & (forest.n_children > 1)),
    }


def _target_rows(sim, bins: int) -> list[dict]:
    """Error statistics of every value method, per node group, over all nodes and per bin of the true V."""
    forest, v = sim.forest, sim.nodes["v"]
    edges = np.linspace(0.0, 1.0, bins + 1)
    targets = {method: node_targets(forest, method) for method in VALUE_METHODS}
    rows = []
    for group, nodes in _node_groups(forest).items():
        which = np.clip(np.digitize(v[nodes], edges) - 1, 0, bins - 1)
        subsets = [("all", np.nan, np.nan, nodes)]
        subsets += [("v_bin", edges[b], edges[b + 1], nodes[which == b]) for b in range(bins)]
        for scope, low, high, sub in subsets:
            if sub.size < 2:
                continue
            for method, (target, weight) in targets.items():
                error, w = target[sub] - v[sub], weight[sub]
                base = {
                    "quantity": "target",
                    "method": method,
                    "nodes": group,
                    "scope": scope,
                    "v_low": low,
                    "v_high": high,
                    "n": int(sub.size),
                }
                rows += [
                    {**base, "metric": "bias", "value": float(error.mean())},
                    {**base, "metric": "weighted_bias", "value": float((w * error).sum() / w.sum())},
                    {**base, "metric": "variance", "value": float(error.var(ddof=1))},
                    {**base, "metric": "rmse", "value": float(np.sqrt((error**2).mean()))},
                ]
    return rows


def _advantage_rows(sim) -> list[dict]:
    forest, v = sim.forest, sim.nodes["v"]
    y = np.flatnonzero(forest.parent != -1)
    x = forest.parent[y]
    keep = (forest.parent[x] != -1) & (forest.n_children[x] > 1)
    y, x = y[keep], x[keep]
    exact = v[y] - v[x]
    rows = []
    for name in ADVANTAGES:
        adv = compute_advantages(forest, name)[y]
        base = {
            "quantity": "advantage",
            "method": name,
            "nodes": "branched_turn",
            "scope": "all",
            "n": int(y.size),
        }
        nonzero = exact != 0
        rows += [
            {**base, "metric": "correlation", "value": float(np.corrcoef(adv, exact)[0, 1])},
            {
                **base,
                "metric": "sign_agreement",
                "value": float((np.sign(adv[nonzero]) == np.sign(exact[nonzero])).mean()),
            },
        ]
        if name == "local":
            rows.append({**base, "metric": "bias", "value": float((adv - exact).mean())})
    return rows


def run(config: Config, units: Units) -> Outcome:
    model = calibrated(config.model, config.target_ratio, config.group_size)

    def unit(key) -> pd.DataFrame:
        arm_text, s = key
        arm = Arm.parse(arm_text)
        rng = unit_rng(config.seed, NAME, arm.label, s)
        policy = get_policy(arm.policy, group_size=config.group_size)
        predictor = make_predictor(arm.predictor)
        rows = []
        for b in range(config.batches):
            batch = sample_batch(model, policy, config.budget, predictor, pool=config.pool, rng=rng)
            predictor = predictor.update(batch.sampled)
            if b >= config.warmup:
                found = _target_rows(batch.sampled, config.bins) + _advantage_rows(batch.sampled)
                rows += [{"batch": b, **r} for r in found]
        return tidy(NAME, [{"arm": arm.label, "seed": s, "budget": config.budget.total, **r} for r in rows])

    table = units.map(unit, [(a, s) for a in config.arms for s in range(config.seeds)], desc=NAME)
    summary = summarise(table, ["arm", "quantity", "method", "nodes", "scope", "v_low", "metric"])
    return _outcome(table, summary, config)


def _outcome(table: pd.DataFrame, summary: pd.DataFrame, config: Config) -> Outcome:
    prefixes = summary[summary["nodes"].isin(["prefix", "branched_turn"])]

    def stat(arm: str, method: str, metric: str, *, binned: bool = False) -> pd.DataFrame:
        """Rows of one statistic over all prefixes (advantages: branched turns), or per V bin."""
        scope = "v_bin" if binned else "all"
        return prefixes[
            (prefixes["arm"] == arm)
            & (prefixes["method"] == method)
            & (prefixes["metric"] == metric)
            & (prefixes["scope"] == scope)
        ]

    def worst_z(arm: str, method: str, metric: str) -> float:
        rows = stat(arm, method, metric, binned=True)
        z = (rows["value"].abs() / rows["stderr"]).replace([np.inf], np.nan).dropna()
        return float(z.max()) if len(z) else 0.0

    arms = [Arm.parse(a) for a in config.arms]
    headline: dict[str, dict] = {}
    for arm in arms:
        entry = headline.setdefault(arm.label, {})
        for method in VALUE_METHODS:
            for metric in ("bias", "weighted_bias"):
                overall = stat(arm.label, method, metric)
                entry[f"{method}_{metric}"] = round(float(overall["value"].iloc[0]), 5)
                entry[f"{method}_{metric}_max_bin_z"] = round(worst_z(arm.label, method, metric), 2)
            per_bin = stat(arm.label, method, "weighted_bias", binned=True)
            entry[f"{method}_weighted_bias_by_v_bin"] = {
                f"{r.v_low:.1f}-{r.v_low + 1 / config.bins:.1f}": round(float(r.value), 4)
                for r in per_bin.itertuples()
            }
        for name in ADVANTAGES:
            entry[f"advantage_{name}_correlation"] = round(
                float(stat(arm.label, name, "correlation")["value"].iloc[0]), 4
            )

    dependent = [a.label for a in arms if get_policy(a.policy).branches_on_outcomes]
    independent = [a.label for a in arms if a.label not in dependent]
    limit = config.z_limit
    checks = {
        "leaf_weighted biased in some V bin under outcome-dependent branching": all(
            worst_z(a, "leaf_weighted", "weighted_bias") > limit for a in dependent
        ),
        "leaf_weighted unbiased in every V bin under outcome-independent branching": all(
            worst_z(a, "leaf_weighted", "weighted_bias") < limit for a in independent
        ),
        "factual unbiased in every V bin": all(
            worst_z(a.label, "factual", "weighted_bias") < limit for a in arms
        ),
        "own_branches unbiased in every V bin": all(
            worst_z(a.label, "own_branches", "weighted_bias") < limit for a in arms
        ),
    }
    shown = "; ".join(
        f"{a.label}: "
        + ", ".join(
            f"{k} {v:+.3f}" for k, v in headline[a.label]["leaf_weighted_weighted_bias_by_v_bin"].items()
        )
        for a in arms
    )
    result = (
        f"Weighted bias (the estimating equation of a fit with the method's weights) of the leaf-weighted "
        f"target over prefixes, by bin of true V: {shown}. "
        + "; ".join(f"{k}: {v}" for k, v in checks.items())
        + "."
    )
    return Outcome(table, headline, result, all(checks.values()), {"checks": checks})


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
