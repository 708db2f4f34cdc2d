"""Metrics against brute-force loops over leaves and pairs."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_theory import (
    RolloutForest,
    brier_score,
    budget_by_depth,
    contrast_pairs,
    contrast_yield,
    effective_ratio,
    expected_calibration_error,
    mixed_anchor_ratio,
    mixed_prompts,
)

from .strategies import forests, probability_arrays


def is_mixed(f, i):
    r = f.reward[f.leaves_under(i)]
    return r.min() != r.max()


def lowest_common_ancestor(f, a, b):
    up = set(f.path_to_root(a).tolist())
    return next(n for n in f.path_to_root(b).tolist() if n in up)


@given(forests())
def test_metrics_match_loops(f):
    assert effective_ratio(f) == pytest.approx(np.mean([is_mixed(f, r) for r in f.roots]))
    anchors = [i for i in range(len(f)) if f.parent[i] == -1 or len(f.children(i)) > 1]
    assert mixed_anchor_ratio(f) == pytest.approx(np.mean([is_mixed(f, i) for i in anchors]))
    per_node = np.zeros(len(f), dtype=np.int64)
    total = 0
    for a, b in itertools.combinations(f.leaves.tolist(), 2):
        if f.prompt[a] == f.prompt[b] and f.reward[a] != f.reward[b]:
            total += 1
            per_node[lowest_common_ancestor(f, a, b)] += 1
    assert contrast_pairs(f) == total
    assert contrast_pairs(f, per_node=True).tolist() == per_node.tolist()
    rollouts = np.zeros(int(f.depth.max()) + 1, dtype=np.int64)
    cost = np.zeros(int(f.depth.max()) + 1)
    for i in range(len(f)):
        if f.parent[i] == -1:
            continue
        d = f.depth[f.rollout_anchor[i]]
        cost[d] += f.cost[i]
        rollouts[d] += f.is_leaf[i]
    assert budget_by_depth(f).tolist() == rollouts[: len(budget_by_depth(f))].tolist()
    assert np.allclose(budget_by_depth(f, unit="cost"), cost[: len(budget_by_depth(f, unit="cost"))])
    assert budget_by_depth(f).sum() == f.n_leaves


def test_effective_ratio_example_and_empty():
    f = RolloutForest.from_nested([[1, 1], [0, 1], [[0, 1], 0], [0, 0]])
    assert effective_ratio(f) == 0.5
    assert np.isnan(effective_ratio(RolloutForest.from_parents([], [])))


@given(probability_arrays(min_size=1, max_size=30), st.integers(1, 12), st.data())
def test_calibration_metrics_match_loops(pred, n_bins, data):
    outcome = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=len(pred), max_size=len(pred))))
    assert brier_score(pred, outcome) == pytest.approx(sum((p - o) ** 2 for p, o in zip(pred, outcome)) / len(pred))
    ece = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        idx = [i for i, p in enumerate(pred) if lo <= p < hi or (b == n_bins - 1 and p == 1.0)]
        if idx:
            ece += len(idx) / len(pred) * abs(np.mean(pred[idx]) - np.mean(outcome[idx]))
    assert expected_calibration_error(pred, outcome, n_bins=n_bins) == pytest.approx(ece, abs=1e-12)


def test_a_calibrated_predictor_has_small_ece():
    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    outcome = (rng.random(p.size) < p).astype(float)
    # Per bin the gap is a mean of ~20,000 Bernoulli draws: standard error <= 0.5 / sqrt(20,000).
    assert expected_calibration_error(p, outcome) < 4 * 0.5 / np.sqrt(20_000)
    assert expected_calibration_error(np.clip(p + 0.2, 0, 1), outcome) > 0.1


def test_metric_errors():
    f = RolloutForest.from_parents([-1, 0], [np.nan, 0.5], binary_rewards=False)
    with pytest.raises(ValueError, match=r"contrast pairs are defined for binary rewards"):
        contrast_pairs(f)
    with pytest.raises(ValueError, match=r"`unit` must be 'rollouts' or 'cost', got 'tokens'"):
        budget_by_depth(f, unit="tokens")
    with pytest.raises(ValueError, match=r"arrays must have the same length: `pred` has 2, `outcome` has 1"):
        brier_score([0.1, 0.2], [1])
    with pytest.raises(ValueError, match=r"`pred` and `outcome` must not be empty"):
        brier_score([], [])
    with pytest.raises(ValueError, match=r"`n_bins` must be at least 1, got 0"):
        expected_calibration_error([0.5], [1], n_bins=0)
    with pytest.raises(ValueError, match=r"`forest` must be a RolloutForest, got dict"):
        effective_ratio({})


@given(forests())
def test_contrast_yield_matches_counts_over_spending(f):
    mixed = sum(is_mixed(f, r) for r in f.roots)
    assert mixed_prompts(f) == mixed
    pairs = sum(
        1
        for a, b in itertools.combinations(f.leaves.tolist(), 2)
        if f.prompt[a] == f.prompt[b] and f.reward[a] != f.reward[b]
    )
    out = contrast_yield(f)
    tokens = sum(f.cost[i] for i in range(len(f)))
    assert out["mixed_prompts_per_1k_rollouts"] == pytest.approx(1000 * mixed / f.n_leaves)
    assert out["contrast_pairs_per_1k_rollouts"] == pytest.approx(1000 * pairs / f.n_leaves)
    if tokens > 0:
        assert out["mixed_prompts_per_1k_tokens"] == pytest.approx(1000 * mixed / tokens)
        assert out["contrast_pairs_per_1k_tokens"] == pytest.approx(1000 * pairs / tokens)


def test_contrast_yield_is_not_inflated_by_filtering_while_the_ratio_is():
    # Two policies spend 8 rollouts each and find the same mixed prompt; one also spends 4 rollouts on a
    # prompt that stays all-failure, the other drops it and spends those 4 on the mixed prompt.
    keep = RolloutForest.from_nested([[1, 0, 1, 0], [0, 0, 0, 0]])
    drop = RolloutForest.from_nested([[1, 0, 1, 0, 1, 0, 1, 0]])
    assert effective_ratio(drop) == 2 * effective_ratio(keep)
    assert contrast_yield(drop)["mixed_prompts_per_1k_rollouts"] == contrast_yield(keep)[
        "mixed_prompts_per_1k_rollouts"
    ] == 125.0


def test_contrast_yield_uses_what_was_spent_and_rejects_bad_spending():
    f = RolloutForest.from_nested([[1, 0]])
    assert contrast_yield(f, rollouts=10, tokens=40) == {
        "mixed_prompts_per_1k_rollouts": 100.0,
        "mixed_prompts_per_1k_tokens": 25.0,
        "contrast_pairs_per_1k_rollouts": 100.0,
        "contrast_pairs_per_1k_tokens": 25.0,
    }
    assert np.isnan(contrast_yield(f, rollouts=0)["mixed_prompts_per_1k_rollouts"])
    with pytest.raises(ValueError, match="`tokens` must be a finite non-negative number, got -1"):
        contrast_yield(f, tokens=-1)
