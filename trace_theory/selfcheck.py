"""A two-second self-check of the theory core: its identities, measured by Monte Carlo.

Run ``python -m trace_theory.selfcheck`` (or ``trace-selfcheck``). Each line states an identity from
PAPER.md, the value the formula gives, the value a simulation measures, and whether they agree within
four standard errors. Exit status 1 if any check fails.
"""

from __future__ import annotations

import sys

import numpy as np

from .advantages import compute_advantages
from .allocate import allocate_roots, root_utility
from .contrast import contrast_potential, flip_probability, mixed_probability
from .forest import RolloutForest
from .metrics import effective_ratio
from .policies import get_policy


def _check(name: str, formula: float, measured: float, stderr: float) -> bool:
    ok = abs(formula - measured) <= 4 * stderr + 1e-12
    print(f"{'ok  ' if ok else 'FAIL'} {name:<58} formula {formula:8.5f}  measured {measured:8.5f}  (se {stderr:.5f})")
    return ok


def main(seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    n = 200_000
    results = []

    v = 0.3
    groups = rng.random((n, 8)) < v
    mixed = groups.any(axis=1) & ~groups.all(axis=1)
    results.append(_check("mixed(v=0.3, m=8) = 1 - v^m - (1-v)^m", float(mixed_probability(v, 8)),
                          mixed.mean(), mixed.std() / np.sqrt(n)))

    r, k = 0, 3
    flips = (rng.random((n, k)) < v).any(axis=1)  # a continuation succeeds where the factual failed
    results.append(_check("flip(v=0.3, r=0, k=3) = 1 - (1-v)^k", float(flip_probability(v, r, k)),
                          flips.mean(), flips.std() / np.sqrt(n)))

    # Quadratic variation of a two-step martingale V0 -> V1 -> R equals V0 (1 - V0).
    v0, spread = 0.4, 0.25
    up = rng.random(n) < 0.5
    v1 = np.where(up, v0 + spread, v0 - spread)
    reward = (rng.random(n) < v1).astype(float)
    qv = (v1 - v0) ** 2 + (reward - v1) ** 2
    results.append(_check("E[quadratic variation of V from V0 = 0.4] = V0 (1 - V0)",
                          float(contrast_potential(v0)), qv.mean(), qv.std() / np.sqrt(n)))

    # Active root allocation beats uniform in expected mixed groups (Proposition 3).
    pass_rates = rng.beta(0.4, 0.4, 256)
    budget = 256 * 8
    active = root_utility(pass_rates, allocate_roots(pass_rates, budget))
    uniform = root_utility(pass_rates, get_policy("grpo").allocate_roots(pass_rates, budget))
    ok = active >= uniform
    print(f"{'ok  ' if ok else 'FAIL'} {'active roots beat uniform (expected mixed groups)':<58} "
          f"active {active:8.2f}  uniform {uniform:8.2f}")
    results.append(ok)

    # The measured effective ratio of uniform groups matches the mean mixed probability.
    m = 8
    rewards = rng.random((256, m)) < pass_rates[:, None]
    forest = RolloutForest.from_nested([list(row.astype(float)) for row in rewards])
    expected = float(mixed_probability(pass_rates, m).mean())
    se = float(np.sqrt(expected * (1 - expected) / 256))
    results.append(_check("effective ratio of 256 groups of 8 = mean mixed(v, 8)", expected,
                          effective_ratio(forest), se))
    adv = compute_advantages(forest, "grpo")
    ok = bool(np.allclose(np.bincount(forest.tree_index, weights=adv * forest.is_leaf), 0.0, atol=1e-9))
    print(f"{'ok  ' if ok else 'FAIL'} {'GRPO advantages sum to zero within every group':<58}")
    results.append(ok)

    passed = sum(bool(x) for x in results)
    print(f"{passed}/{len(results)} checks passed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
