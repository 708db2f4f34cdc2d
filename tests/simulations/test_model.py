"""The Bernoulli rollout-tree world: pass rates, Beta splitting, early termination, signals."""

import numpy as np
import pytest
from scipy.special import logit

from simulations.model import BernoulliTreeModel, PassRates
from trace_theory import beta_mixed_probability, mixed_probability


def test_calibration_hits_the_target_exactly():
    rates = PassRates().calibrated(0.268, 8)
    assert rates.mixed_share(8) == pytest.approx(0.268, abs=1e-9)
    assert rates.means == PassRates().means and rates.weights == PassRates().weights
    ratio = np.array(rates.concentrations) / np.array(PassRates().concentrations)
    assert np.allclose(ratio, ratio[0])  # one common factor


def test_mixed_share_is_the_mixture_of_beta_expectations():
    rates = PassRates(weights=(1.0, 3.0), means=(0.2, 0.7), concentrations=(2.0, 5.0))
    expected = 0.25 * beta_mixed_probability(0.4, 1.6, 4) + 0.75 * beta_mixed_probability(3.5, 1.5, 4)
    assert rates.mixed_share(4) == pytest.approx(float(expected), rel=1e-12)


def test_sampled_pass_rates_match_the_mixed_share():
    rates = PassRates().calibrated(0.268, 8)
    v = rates.sample(200_000, np.random.default_rng(0))
    observed = mixed_probability(v, 8)
    se = observed.std() / np.sqrt(v.size)
    assert abs(observed.mean() - 0.268) < 4 * se


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": (1.0,), "means": (0.5, 0.5), "concentrations": (1.0, 1.0)}, "equal length"),
        ({"weights": (-1.0, 2.0), "means": (0.5, 0.5), "concentrations": (1.0, 1.0)}, "`weights`"),
        ({"weights": (1.0,), "means": (1.0,), "concentrations": (1.0,)}, "`means` must lie in \\(0, 1\\)"),
        ({"weights": (1.0,), "means": (0.5,), "concentrations": (0.0,)}, "`concentrations`"),
    ],
)
def test_pass_rates_reject_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PassRates(**kwargs)


def test_calibration_rejects_unreachable_targets():
    with pytest.raises(ValueError, match="`target` must lie in"):
        PassRates().calibrated(1.0, 8)
    with pytest.raises(ValueError, match="outside the mixed shares this mixture can reach"):
        PassRates(weights=(1.0,), means=(0.02,), concentrations=(1.0,)).calibrated(0.9, 8)


@pytest.mark.parametrize("s", [0.1, 0.5])
def test_beta_splitting_is_a_martingale_with_the_stated_variance(s):
    model = BernoulliTreeModel(informativeness=s)
    v = np.repeat([0.05, 0.3, 0.5, 0.9], 50_000)
    nxt = model.split(v, np.random.default_rng(1)).reshape(4, -1)
    v0 = v.reshape(4, -1)[:, 0]
    se = nxt.std(axis=1) / np.sqrt(nxt.shape[1])
    assert np.all(np.abs(nxt.mean(axis=1) - v0) < 4 * se)
    # Var(V') = s v (1 - v); the sample variance of n draws has relative sd ~ sqrt(2 / n) (plus kurtosis).
    assert np.allclose(nxt.var(axis=1), s * v0 * (1 - v0), rtol=0.05)


def test_full_informativeness_resolves_in_one_turn():
    model = BernoulliTreeModel(informativeness=1.0)
    nxt = model.split(np.full(1000, 0.4), np.random.default_rng(2))
    assert set(np.unique(nxt)) <= {0.0, 1.0}


def test_rollout_lengths_follow_the_termination_hazard():
    model = BernoulliTreeModel(max_turns=5, stop_prob=0.3)
    n = 100_000
    depth = np.random.default_rng(3).integers(0, 5, n)
    out = model.rollouts({"v": np.full(n, 0.5)}, depth, np.random.default_rng(4))
    assert out.length.min() >= 1 and np.all(depth + out.length <= 5)
    for d in range(5):
        lengths = out.length[depth == d]
        se = lengths.std() / np.sqrt(lengths.size)
        assert abs(lengths.mean() - model.expected_turns(d)) < 4 * se + 1e-12
    assert np.allclose(model.expected_turns(np.array([4, 0])), [1.0, (1 - 0.7**5) / 0.3], rtol=1e-12)


def test_fixed_length_rollouts_without_early_termination():
    model = BernoulliTreeModel(max_turns=4, stop_prob=0.0)
    out = model.rollouts({"v": np.full(10, 0.5)}, np.array([0] * 5 + [2] * 5), np.random.default_rng(5))
    assert out.length.tolist() == [4] * 5 + [2] * 5
    assert np.array_equal(model.expected_turns([0, 2]), [4.0, 2.0])


def test_rollouts_end_in_their_reward_and_are_bernoulli_of_the_anchor_value():
    model = BernoulliTreeModel()
    n = 200_000
    v0 = np.random.default_rng(6).random(n)
    out = model.rollouts({"v": v0}, np.zeros(n, np.int64), np.random.default_rng(7))
    leaves = np.cumsum(out.length) - 1
    assert np.array_equal(out.turns["v"][leaves], out.reward)
    assert set(np.unique(out.reward)) == {0.0, 1.0}
    residual = out.reward - v0
    assert abs(residual.mean()) < 4 * residual.std() / np.sqrt(n)
    internal = np.setdiff1d(np.arange(out.length.sum()), leaves)
    assert np.all((out.turns["v"][internal] >= 0) & (out.turns["v"][internal] <= 1))


def test_signal_is_logit_v_plus_noise_of_the_stated_size():
    model = BernoulliTreeModel(feature_noise=0.7)
    v = np.full(100_000, 0.2)
    noise = model.signal(v, np.random.default_rng(8)) - logit(0.2)
    assert abs(noise.mean()) < 4 * 0.7 / np.sqrt(v.size)
    assert noise.std() == pytest.approx(0.7, rel=0.02)


def test_same_generator_state_gives_the_same_rollouts():
    model = BernoulliTreeModel()
    a = model.rollouts({"v": np.full(50, 0.5)}, np.zeros(50, np.int64), np.random.default_rng(9))
    b = model.rollouts({"v": np.full(50, 0.5)}, np.zeros(50, np.int64), np.random.default_rng(9))
    assert np.array_equal(a.length, b.length) and np.array_equal(a.turns["signal"], b.turns["signal"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"informativeness": 0.0}, "`informativeness` must lie in \\(0, 1\\]"),
        ({"max_turns": 0}, "`max_turns` must be a positive integer"),
        ({"stop_prob": 1.5}, "`stop_prob` must lie in \\[0, 1\\]"),
        ({"feature_noise": -1.0}, "`feature_noise`"),
    ],
)
def test_model_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BernoulliTreeModel(**kwargs)


def test_rollouts_reject_anchors_at_the_horizon():
    with pytest.raises(ValueError, match="anchor depths must lie in \\[0, 5\\]"):
        BernoulliTreeModel().rollouts({"v": np.array([0.5])}, np.array([6]), np.random.default_rng(0))
