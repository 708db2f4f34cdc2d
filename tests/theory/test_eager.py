"""Eager expansion's utility: the expectation identity by enumeration and in the martingale world."""

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trace_theory import flip_probability, mixed_probability
from trace_theory.eager import (
    EagerPlan,
    expected_flip_probability,
    expected_flip_probability_gain,
    offline_level,
    replay_spend,
    rollout_budgets,
    rollout_joint_gain,
    threshold_spend,
)

from .strategies import probability


def enumerate_expected_flip(v: float, w: float, k: int) -> float:
    """E_r[P(some of k continuations from v differs from r)], r ~ Bern(w), by listing every outcome."""
    total = 0.0
    for r, pr in ((1, w), (0, 1.0 - w)):
        for outcome in itertools.product([0, 1], repeat=k):
            p = np.prod([v if o else 1 - v for o in outcome])
            total += pr * p * any(o != r for o in outcome)
    return total


@given(probability, probability, st.integers(0, 7))
@example(0.5, 0.5, 1)
@example(0.0, 1.0, 3)
@example(1.0, 1.0, 2)
def test_expected_flip_matches_enumeration(v, w, k):
    assert expected_flip_probability(v, k, v_later=w) == pytest.approx(enumerate_expected_flip(v, w, k), abs=1e-12)


@given(probability, st.integers(0, 9))
def test_before_the_outcome_the_prefix_is_a_root_of_k_plus_one_leaves(v, k):
    """E_r[1 - q^k] with r ~ Bern(v) is 1 - v^(k+1) - (1 - v)^(k+1) = mixed(v, k + 1)."""
    expected = 1.0 - v ** (k + 1) - (1.0 - v) ** (k + 1)
    assert expected_flip_probability(v, k) == pytest.approx(expected, abs=1e-12)
    assert expected_flip_probability(v, k) == pytest.approx(float(mixed_probability(v, k + 1)), abs=1e-12)
    r_weighted = v * flip_probability(v, 1, k) + (1 - v) * flip_probability(v, 0, k)
    assert expected_flip_probability(v, k) == pytest.approx(float(r_weighted), abs=1e-12)


@given(probability, probability)
def test_one_continuation_flips_with_v_plus_w_minus_2vw(v, w):
    assert expected_flip_probability(v, 1, v_later=w) == pytest.approx(v + w - 2 * v * w, abs=1e-12)
    assert expected_flip_probability(v, 1) == pytest.approx(2 * v * (1 - v), abs=1e-12)


@given(probability, st.sampled_from([0, 1]), st.integers(0, 6))
def test_at_the_outcome_the_paper_rule_returns(v, r, k):
    assert expected_flip_probability(v, k, v_later=r) == pytest.approx(float(flip_probability(v, r, k)), abs=1e-12)


@given(probability, probability)
def test_gains_are_the_differences_and_fall(v, w):
    k = np.arange(8)
    values = expected_flip_probability(v, np.arange(9), v_later=w)
    gains = expected_flip_probability_gain(v, k, v_later=w)
    assert np.allclose(gains, np.diff(values), atol=1e-12)
    assert (np.diff(gains) <= 1e-12).all()


def test_value_of_waiting_is_zero_at_one_half_and_grows_with_confidence():
    """E_r[max_k-allocation with r] - allocation without r, for one continuation: the flip of the better
    branch minus 2 v (1 - v); zero at v = 1/2, larger at confident prefixes."""
    v = np.array([0.5, 0.7, 0.9])
    # one prefix, one unit, choose whether to spend it here or on a sure alternative worth c:
    # with r the unit goes here when flip(v, r, 1) > c; without r when 2 v (1 - v) > c.
    c = 0.3
    with_r = v * np.maximum(flip_probability(v, 1, 1), c) + (1 - v) * np.maximum(flip_probability(v, 0, 1), c)
    without = np.maximum(expected_flip_probability(v, 1), c)
    waiting = with_r - without
    assert waiting[0] == pytest.approx(0.0, abs=1e-12)
    assert waiting[1] > 0 and waiting[2] > 0


@pytest.mark.parametrize("k", [1, 2, 4])
def test_monte_carlo_in_the_martingale_world(k):
    """Simulator's Beta-splitting world: from a prefix at v the factual branch moves to w, then ends with r;
    k continuations restart from v. The share with a continuation that ends unlike r matches the formula
    given w, and, averaged over w, 1 - v^(k+1) - (1 - v)^(k+1)."""
    from simulations.model import BernoulliTreeModel

    rng = np.random.default_rng(35)
    model = BernoulliTreeModel(informativeness=0.3, max_turns=6, stop_prob=0.2)
    n = 40_000
    v = rng.uniform(0.02, 0.98, n)
    w = model.split(v, rng)  # the factual rollout's next turn
    r = model.rollouts({"v": w}, np.ones(n, dtype=np.int64), rng).reward
    cont = model.rollouts({"v": np.repeat(v, k)}, np.zeros(n * k, dtype=np.int64), rng).reward.reshape(n, k)
    flipped = (cont != r[:, None]).any(axis=1).astype(float)
    se = flipped.std(ddof=1) / np.sqrt(n)
    given_w = flipped - expected_flip_probability(v, k, v_later=w)
    assert abs(given_w.mean()) < 4 * given_w.std(ddof=1) / np.sqrt(n)
    assert abs(flipped.mean() - expected_flip_probability(v, k).mean()) < 4 * se


def test_joint_gain_is_the_additive_gain_discounted_by_earlier_commitments():
    v, k = 0.6, np.arange(4)
    assert np.allclose(rollout_joint_gain(v, k), expected_flip_probability_gain(v, k))
    assert (rollout_joint_gain(v, k, stay_success=0.5, stay_failure=0.2) < expected_flip_probability_gain(v, k)).all()
    # two commitments along one rollout, exactly: P(contradicted at least once) = 1 - w v1 v2 - (1 - w)(1 - v1)(1 - v2)
    v1, v2 = 0.3, 0.8
    joint = expected_flip_probability_gain(v1, 0, v_later=v2) + rollout_joint_gain(
        v2, 0, stay_success=v1, stay_failure=1 - v1)
    assert joint == pytest.approx(1 - v2 * v1 * v2 - (1 - v2) * (1 - v1) * (1 - v2), abs=1e-12)


def test_threshold_rule_vectorised_equals_one_prefix_at_a_time():
    rng = np.random.default_rng(1)
    v, price, left = rng.uniform(0, 1, 50), rng.uniform(0.2, 1, 50), rng.integers(0, 5, 50).astype(float)
    k, spent = threshold_spend(v, price, left, 0.05, max_per_anchor=3)
    for i in range(50):
        ki, si = threshold_spend(float(v[i]), float(price[i]), float(left[i]), 0.05, max_per_anchor=3)
        assert ki == k[i] and si == pytest.approx(spent[i])
        gains = expected_flip_probability_gain(v[i], np.arange(ki))
        assert (gains / price[i] > 0.05).all() and spent[i] <= left[i] + 1e-9


def test_replay_never_overspends_a_rollout_and_the_level_hits_the_target():
    rng = np.random.default_rng(2)
    rollout = np.repeat(np.arange(30), rng.integers(1, 5, 30))
    v = rng.uniform(0, 1, rollout.size)
    budgets = rng.integers(0, 4, 30)
    for tau in (0.0, 0.1, 0.3):
        k = replay_spend(v, np.ones(v.size), rollout, budgets, tau)
        assert (np.bincount(rollout, weights=k, minlength=30) <= budgets).all()
    target = 0.6 * budgets.sum()
    tau = offline_level(v, np.ones(v.size), rollout, budgets, target)
    assert replay_spend(v, np.ones(v.size), rollout, budgets, tau).sum() >= target
    assert replay_spend(v, np.ones(v.size), rollout, budgets, tau * 1.01 + 1e-9).sum() < target


def plain_bisection_level(v, price, rollout, budgets, target, **kw):
    """offline_level's search written out with a replay at every step (no reuse): the reference."""
    def spend(t):
        return float(np.dot(replay_spend(v, price, rollout, budgets, t, **kw), price))

    target = min(target, spend(0.0))
    if target <= 0:
        return 0.0
    lo, hi = -30.0, float(np.log(max(np.max(expected_flip_probability_gain(v, 0) / price), 1e-300)))
    if spend(np.exp(hi)) >= target - 1e-9:
        return float(np.exp(hi))
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if spend(np.exp(mid)) >= target - 1e-9 else (lo, mid)
    return float(np.exp(lo))


@pytest.mark.parametrize("objective", ["additive", "joint"])
def test_the_level_reuses_replays_only_where_they_decide_alike(objective):
    """offline_level replays the rule once per interval of thresholds that take the same decisions: its
    level is the plain bisection's to the last bit, and a threshold anywhere in a replay's interval spends
    what that replay spent."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        rollout = np.repeat(np.arange(12), rng.integers(0, 6, 12))
        v, later = rng.uniform(0, 1, rollout.size), rng.uniform(0, 1, rollout.size)
        price = rng.uniform(0.3, 2.0, rollout.size) if trial % 2 else np.ones(rollout.size)
        budgets = rng.integers(0, 4, 12).astype(float)
        kw = dict(max_per_anchor=None if trial % 3 else 2, objective=objective, v_later=later)
        target = float(rng.uniform(0, budgets.sum() + 1))
        assert offline_level(v, price, rollout, budgets, target, **kw) == \
            plain_bisection_level(v, price, rollout, budgets, target, **kw)


def test_a_turn_boundary_decision_equals_the_vector_rule():
    """One prefix (floats in: the engine's turn boundaries) decides as the same prefix inside a vector."""
    rng = np.random.default_rng(3)
    for v, w, price, left in zip(*rng.uniform(0, 1, (2, 200)), rng.uniform(0.2, 2, 200), rng.integers(0, 6, 200)):
        for tau in (0.0, 0.05, 0.2):
            k, spent = threshold_spend(v, price, float(left), tau, v_later=w, max_per_anchor=3)
            kv, sv = threshold_spend(np.array([v, 0.5]), np.array([price, 1.0]), np.array([left, 1.0]), tau,
                                     v_later=np.array([w, 0.5]), max_per_anchor=3)
            assert (k, spent) == (kv[0], sv[0]) and isinstance(k, np.integer) and isinstance(spent, float)


def test_rollout_budgets_and_plan_checks():
    assert [b.tolist() for b in rollout_budgets([7, 2], [3, 4])] == [[3, 2, 2], [1, 1, 0, 0]]
    assert EagerPlan(reserve=0.25).eager_budget([8, 3]).tolist() == [6, 2]
    with pytest.raises(ValueError, match="`reserve` must lie in"):
        EagerPlan(reserve=1.5)
    with pytest.raises(ValueError, match="`objective`"):
        EagerPlan(objective="sum")


def test_calibration_by_depth_against_a_loop():
    from trace_theory import RolloutForest
    from trace_theory.metrics import CALIBRATION_WARNING_ECE, calibration_by_depth

    f = RolloutForest.from_nested([[[1, 0], [0, [1, 1]]], [0, 0]])
    rng = np.random.default_rng(0)
    pred = rng.uniform(0, 1, len(f))
    pred[f.is_leaf] = np.nan
    out = calibration_by_depth(f, pred, min_count=1)
    for d in range(int(f.depth.max())):
        nodes = [n for n in range(len(f)) if f.depth[n] == d and not f.is_leaf[n]]
        if not nodes:
            continue
        outcome = []
        for n in nodes:
            if f.parent[n] == -1:
                kids = [c for c in range(len(f)) if f.parent[c] == n]
                outcome.append(np.mean([f.reward[f.factual_leaf[c]] for c in kids]))
            else:
                outcome.append(f.reward[f.factual_leaf[n]])
        assert out[d]["n"] == len(nodes)
        assert out[d]["brier"] == pytest.approx(np.mean((pred[nodes] - np.array(outcome)) ** 2))
    assert out["miscalibrated"] == float(any(out[d]["ece"] > CALIBRATION_WARNING_ECE for d in out if d != "miscalibrated"))
    with pytest.raises(ValueError, match="one value per node"):
        calibration_by_depth(f, pred[:-1])


@pytest.mark.parametrize("seed", range(5))
def test_a_rollout_that_leaves_budget_took_exactly_the_units_above_the_threshold(seed):
    """The regret statement's first half: where a rollout's budget did not bind, the rule took every unit
    of expected gain per price above tau and none below, so it is the optimum of that rollout's expected
    utility among allocations spending at most what it spent (the prefix greedy's guarantee)."""
    rng = np.random.default_rng(seed)
    rollout = np.repeat(np.arange(40), rng.integers(1, 6, 40))
    v, price = rng.uniform(0, 1, rollout.size), rng.uniform(0.2, 1.0, rollout.size)
    budgets = rng.integers(0, 8, 40).astype(float)
    tau = 0.08
    k = replay_spend(v, price, rollout, budgets, tau)
    spent = np.bincount(rollout, weights=k * price, minlength=40)
    for j in np.flatnonzero(spent < budgets - 1.0):  # room for one more unit of any price left
        at = np.flatnonzero(rollout == j)
        for a in at:
            gains = expected_flip_probability_gain(v[a], np.arange(k[a] + 1)) / price[a]
            assert (gains[:k[a]] > tau).all() and gains[k[a]] <= tau
