"""Contrast utilities: closed forms against their definitions, exact enumeration and integration."""

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import integrate, stats

from trace_theory import (
    beta_contrast_potential,
    beta_flip_probability,
    beta_flip_probability_gain,
    beta_mixed_probability,
    beta_mixed_probability_gain,
    contrast_potential,
    flip_probability,
    flip_probability_gain,
    mixed_probability,
    mixed_probability_gain,
)

from .strategies import probability

beta_param = st.floats(0.05, 50.0, allow_nan=False)


def enumerate_mixed(v: float, m: int) -> float:
    """P(m i.i.d. Bernoulli(v) outcomes are not all equal), by listing all 2^m outcomes."""
    total = 0.0
    for outcome in itertools.product([0, 1], repeat=m):
        p = np.prod([v if o else 1 - v for o in outcome])
        total += p * (0 < sum(outcome) < m)
    return total


def enumerate_flip(v: float, r: int, k: int) -> float:
    """P(some of k continuations differs from the factual reward r), by listing all outcomes."""
    total = 0.0
    for outcome in itertools.product([0, 1], repeat=k):
        p = np.prod([v if o else 1 - v for o in outcome])
        total += p * any(o != r for o in outcome)
    return total


@given(probability, st.integers(0, 8))
@example(0.0, 0)
@example(1.0, 5)
@example(0.5, 1)
def test_mixed_probability_matches_enumeration(v, m):
    assert mixed_probability(v, m) == pytest.approx(enumerate_mixed(v, m), abs=1e-12)


@given(probability, st.sampled_from([0, 1]), st.integers(0, 7))
@example(0.0, 1, 3)
@example(1.0, 1, 3)
@example(0.3, 0, 0)
def test_flip_probability_matches_enumeration(v, r, k):
    assert flip_probability(v, r, k) == pytest.approx(enumerate_flip(v, r, k), abs=1e-12)


@given(probability, st.integers(0, 50))
def test_gains_are_differences(v, m):
    assert mixed_probability_gain(v, m) == pytest.approx(mixed_probability(v, m + 1) - mixed_probability(v, m), abs=1e-12)
    for r in (0, 1):
        assert flip_probability_gain(v, r, m) == pytest.approx(
            flip_probability(v, r, m + 1) - flip_probability(v, r, m), abs=1e-12
        )


@given(probability)
def test_mixed_is_concave_after_the_first_step(v):
    gains = mixed_probability_gain(v, np.arange(0, 40))
    assert gains[0] == 0.0
    assert np.all(np.diff(gains[1:]) <= 1e-15)
    assert np.all(np.diff(flip_probability_gain(v, 1, np.arange(40))) <= 1e-15)


def test_small_group_identities():
    v = np.linspace(0, 1, 21)
    assert np.allclose(mixed_probability(v, 2), 2 * contrast_potential(v))
    assert np.allclose(mixed_probability(v, 3), 3 * contrast_potential(v))
    assert np.all(mixed_probability(v, [[0], [1]]) == 0)


def test_contrast_potential_is_expected_quadratic_variation():
    """Exact two-turn martingale: V0 -> V1 in {lo, hi} -> R ~ Bernoulli(V1).

    E[(V1 - V0)^2 + (R - V1)^2] must equal V0 (1 - V0) (PAPER.md, "Contrast potential").
    """
    for v0, lo, hi in [(0.5, 0.2, 0.9), (0.3, 0.0, 0.6), (0.7, 0.4, 1.0)]:
        p_hi = (v0 - lo) / (hi - lo)  # E[V1] = V0
        qv = 0.0
        for v1, p1 in [(lo, 1 - p_hi), (hi, p_hi)]:
            for r, pr in [(0, 1 - v1), (1, v1)]:
                qv += p1 * pr * ((v1 - v0) ** 2 + (r - v1) ** 2)
        assert qv == pytest.approx(contrast_potential(v0), abs=1e-12)


def test_broadcasting():
    v = np.array([0.1, 0.5])[:, None]
    m = np.arange(4)[None, :]
    assert mixed_probability(v, m).shape == (2, 4)
    assert flip_probability(v, np.array([0, 1]), m[..., None][:, :2, :1].reshape(1, 2)).shape == (2, 2)
    assert beta_mixed_probability(np.ones((3, 1)), 2.0, np.arange(5)).shape == (3, 5)


def test_large_counts_are_stable():
    v = np.array([1e-12, 0.5, 1 - 1e-9])
    assert np.all(np.isfinite(mixed_probability(v, 10**6)))
    assert mixed_probability(1e-12, 2) == pytest.approx(2e-12, rel=1e-6)  # no catastrophic cancellation
    out = beta_mixed_probability(2.0, 3.0, np.array([10**3, 10**6, 10**9]))
    assert np.all(np.isfinite(out)) and np.all(np.diff(out) >= 0) and out[-1] == pytest.approx(1.0, abs=1e-6)
    assert np.isfinite(beta_flip_probability(0.5, 0.5, 1, 10**8))


@given(beta_param, beta_param, st.integers(0, 12))
def test_beta_mixed_matches_numerical_integration(a, b, m):
    dist = stats.beta(a, b)
    expected, _ = integrate.quad(lambda p: float(mixed_probability(p, m)) * dist.pdf(p), 0, 1, limit=200)
    assert beta_mixed_probability(a, b, m) == pytest.approx(expected, abs=2e-6)


@given(beta_param, beta_param, st.sampled_from([0, 1]), st.integers(0, 10))
def test_beta_flip_matches_numerical_integration(a, b, r, k):
    dist = stats.beta(a, b)
    expected, _ = integrate.quad(lambda p: float(flip_probability(p, r, k)) * dist.pdf(p), 0, 1, limit=200)
    assert beta_flip_probability(a, b, r, k) == pytest.approx(expected, abs=2e-6)


@given(beta_param, beta_param, st.integers(0, 30))
def test_beta_gains_are_differences(a, b, m):
    assert beta_mixed_probability_gain(a, b, m) == pytest.approx(
        beta_mixed_probability(a, b, m + 1) - beta_mixed_probability(a, b, m), abs=1e-10
    )
    for r in (0, 1):
        assert beta_flip_probability_gain(a, b, r, m) == pytest.approx(
            beta_flip_probability(a, b, r, m + 1) - beta_flip_probability(a, b, r, m), abs=1e-10
        )


def test_beta_posterior_discounts_uncertain_predictions():
    """An untested prompt (uniform prior) is worth less than one measured at exactly 0.5."""
    measured = mixed_probability(0.5, 8)
    untested = beta_mixed_probability(1.0, 1.0, 8)
    assert untested == pytest.approx(1 - 2 / 9)
    assert untested < measured
    # With growing evidence the posterior utility converges to the plug-in one.
    strong = beta_mixed_probability(5e5, 5e5, 8)
    assert strong == pytest.approx(measured, abs=1e-5)
    assert beta_contrast_potential(1.0, 1.0) == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: contrast_potential(1.5), r"`v` must lie in \[0, 1\], got 1.5"),
        (lambda: mixed_probability(np.nan, 2), r"`v` must lie in \[0, 1\], got nan"),
        (lambda: mixed_probability(0.5, -3), r"`m` must be non-negative integers, got -3"),
        (lambda: mixed_probability(0.5, 2.5), r"`m` must be non-negative integers, got 2.5"),
        (lambda: mixed_probability(0.5, True), r"`m` must be non-negative integers, got booleans"),
        (lambda: flip_probability(0.5, 2, 1), r"`r` must lie in \[0, 1\], got 2.0"),
        (lambda: flip_probability(0.5, 1, -1), r"`k` must be non-negative integers, got -1"),
        (lambda: beta_mixed_probability(0.0, 1.0, 2), r"`a` must be finite and positive, got 0.0"),
        (lambda: beta_mixed_probability(1.0, np.inf, 2), r"`b` must be finite and positive, got inf"),
        (lambda: beta_flip_probability(1.0, 1.0, 0.5, 2), r"`r` must be 0 or 1 for the Beta-posterior utility, got 0.5"),
    ],
)
def test_errors_name_the_parameter_and_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_inputs_are_not_mutated():
    v = np.array([0.2, 0.8])
    m = np.array([2, 3])
    mixed_probability(v, m)
    flip_probability(v, np.array([0.0, 1.0]), m)
    assert v.tolist() == [0.2, 0.8] and m.tolist() == [2, 3]
