"""Contrast utilities: how likely a budget spent at an anchor is to produce mixed outcomes.

With 0/1 outcome rewards a group-relative optimizer learns only from groups that mix successes and
failures. The functions here give, for an anchor (a prompt or an intermediate turn prefix) whose success
probability is ``v``, the chance that a budget spent there yields such a contrast (PAPER.md, "Theory"):

==============================  ==============================================================
``contrast_potential(v)``       v (1 - v): expected quadratic variation of V from the anchor on
``mixed_probability(v, m)``     1 - v^m - (1 - v)^m: m i.i.d. rollouts are not all equal
``flip_probability(v, r, k)``   1 - q^k, q = r v + (1 - r)(1 - v): at least one of k continuations
                                ends differently from the factual reward r
==============================  ==============================================================

``*_gain`` gives the marginal value of one more rollout (the quantity a greedy allocator compares), and
``beta_*`` the expectation when ``v`` is uncertain with a Beta(a, b) posterior, computed in closed form
through Beta functions (E[v^m] = B(a + m, b) / B(a, b)) on the log scale, so it is stable for large m.

Every function broadcasts its arguments against each other, as NumPy ufuncs do.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln

from . import _checks

__all__ = [
    "contrast_potential",
    "mixed_probability",
    "mixed_probability_gain",
    "flip_probability",
    "flip_probability_gain",
    "beta_contrast_potential",
    "beta_mixed_probability",
    "beta_mixed_probability_gain",
    "beta_flip_probability",
    "beta_flip_probability_gain",
]


def _power(base: np.ndarray, n: np.ndarray) -> np.ndarray:
    """base ** n for base in [0, 1] and integer n >= 0, with 0 ** 0 = 1."""
    return np.power(base, n.astype(float))


def _stay_probability(v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """q = r v + (1 - r)(1 - v): the chance that one continuation repeats the factual reward r."""
    return r * v + (1.0 - r) * (1.0 - v)


# ---------------------------------------------------------------------------------------------------
# Plug-in utilities
# ---------------------------------------------------------------------------------------------------


def contrast_potential(v):
    """Contrast potential ``v (1 - v)`` of an anchor with success probability ``v``.

    Parameters
    ----------
    v : array_like
        Success probabilities in [0, 1].

    Returns
    -------
    ndarray
        ``v * (1 - v)``, in [0, 1/4].

    Notes
    -----
    V_t = P(R = 1 | H_t) is a martingale ending at R in {0, 1}, so its increments are orthogonal and the
    expected quadratic variation from t to the end is E[(R - V_t)^2 | H_t] = V_t (1 - V_t)
    (PAPER.md, "Contrast potential").

    Examples
    --------
    Two rollouts are mixed exactly when they differ, which happens with probability 2 v (1 - v):

    >>> import numpy as np
    >>> v = np.linspace(0, 1, 11)
    >>> bool(np.allclose(mixed_probability(v, 2), 2 * contrast_potential(v)))
    True
    """
    v = _checks.probabilities("v", v)
    return v * (1.0 - v)


def mixed_probability(v, m):
    """Probability that ``m`` i.i.d. rollouts from an anchor with success probability ``v`` are mixed.

    Parameters
    ----------
    v : array_like
        Success probabilities in [0, 1].
    m : array_like of int
        Group sizes, ``m >= 0``.

    Returns
    -------
    ndarray
        ``1 - v^m - (1 - v)^m`` for ``m >= 1`` and 0 for ``m = 0``.

    Notes
    -----
    A group is mixed unless all m rewards are 1 (probability v^m) or all are 0 ((1 - v)^m)
    (PAPER.md, "Mixed-outcome probability"). It is zero for m <= 1 and, for m >= 2, increases with
    v (1 - v). Computed as ``-expm1(m log1p(-v)) - v^m`` to keep precision when ``v`` is tiny.

    Examples
    --------
    >>> import numpy as np
    >>> v = np.array([0.1, 0.5, 0.9])
    >>> bool(np.allclose(mixed_probability(v, 3), 3 * v * (1 - v)))
    True
    >>> mixed_probability(0.5, [0, 1, 2]).tolist()
    [0.0, 0.0, 0.5]
    """
    v = _checks.probabilities("v", v)
    m = _checks.counts("m", m)
    v, m = np.broadcast_arrays(v, m)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = -np.expm1(m * np.log1p(-v)) - _power(v, m)  # 1 - (1 - v)^m - v^m
    return np.where(m >= 2, np.clip(out, 0.0, 1.0), 0.0)


def mixed_probability_gain(v, m):
    """Marginal value of the (m + 1)-th rollout: ``mixed(v, m + 1) - mixed(v, m)``.

    Parameters
    ----------
    v : array_like
        Success probabilities in [0, 1].
    m : array_like of int
        Current group sizes, ``m >= 0``.

    Returns
    -------
    ndarray
        ``v^m (1 - v) + (1 - v)^m v`` for ``m >= 1`` and 0 for ``m = 0``.

    Notes
    -----
    The gain is zero at m = 0 (one rollout cannot be mixed), jumps to 2 v (1 - v) at m = 1 and then
    decreases in m: the utility is concave after the first step only. This non-concave start is why root
    allocation needs more than a greedy pass (see ``allocate_roots``).

    Examples
    --------
    >>> import numpy as np
    >>> v, m = 0.3, np.arange(6)
    >>> bool(np.allclose(mixed_probability_gain(v, m), np.diff(mixed_probability(v, np.arange(7)))))
    True
    """
    v = _checks.probabilities("v", v)
    m = _checks.counts("m", m)
    v, m = np.broadcast_arrays(v, m)
    gain = _power(v, m) * (1.0 - v) + _power(1.0 - v, m) * v
    return np.where(m >= 1, gain, 0.0)


def flip_probability(v, r, k):
    """Probability that one of ``k`` continuations from a prefix ends differently from its factual reward.

    Parameters
    ----------
    v : array_like
        Predicted success probability of the prefix, in [0, 1].
    r : array_like
        Reward of the factual rollout through the prefix, in [0, 1] (0 or 1 for outcome rewards).
    k : array_like of int
        Number of extra continuations, ``k >= 0``.

    Returns
    -------
    ndarray
        ``1 - q^k`` with ``q = r v + (1 - r)(1 - v)``, the chance that one continuation repeats r.

    Notes
    -----
    PAPER.md, "Prefix utility": the descendant set of the prefix becomes mixed as soon as one
    continuation disagrees with the factual outcome. Concave in k from the start (gain q^k (1 - q)).

    Examples
    --------
    A prefix that failed (r = 0) but looks likely to succeed (v = 0.9) is worth branching from:

    >>> round(float(flip_probability(0.9, 0, 1)), 12)
    0.9
    >>> import numpy as np
    >>> bool(np.allclose(flip_probability(0.3, [0, 1], 2), [1 - 0.7**2, 1 - 0.3**2]))
    True
    """
    v = _checks.probabilities("v", v)
    r = _checks.probabilities("r", r)
    k = _checks.counts("k", k)
    v, r, k = np.broadcast_arrays(v, r, k)
    q = _stay_probability(v, r)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.expm1(k * np.log(q))
    return np.where(k >= 1, out, 0.0)


def flip_probability_gain(v, r, k):
    """Marginal value of the (k + 1)-th continuation: ``q^k (1 - q)``, ``q = r v + (1 - r)(1 - v)``.

    Parameters
    ----------
    v, r : array_like
        Predicted success probability of the prefix and factual reward, both in [0, 1].
    k : array_like of int
        Current number of continuations, ``k >= 0``.

    Returns
    -------
    ndarray
        ``flip(v, r, k + 1) - flip(v, r, k)``; non-increasing in k, so a greedy allocation is exact.

    Examples
    --------
    >>> import numpy as np
    >>> k = np.arange(5)
    >>> bool(np.allclose(flip_probability_gain(0.6, 1, k), np.diff(flip_probability(0.6, 1, np.arange(6)))))
    True
    """
    v = _checks.probabilities("v", v)
    r = _checks.probabilities("r", r)
    k = _checks.counts("k", k)
    v, r, k = np.broadcast_arrays(v, r, k)
    q = _stay_probability(v, r)
    return _power(q, k) * (1.0 - q)


# ---------------------------------------------------------------------------------------------------
# Expected utilities under a Beta(a, b) posterior on v
# ---------------------------------------------------------------------------------------------------


def _beta_moment(a: np.ndarray, b: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """E[v^i (1 - v)^j] under Beta(a, b) = B(a + i, b + j) / B(a, b), on the log scale."""
    return np.exp(betaln(a + i, b + j) - betaln(a, b))


def _beta_args(a, b):
    return _checks.positive("a", a), _checks.positive("b", b)


def beta_contrast_potential(a, b):
    """Expected contrast potential E[v (1 - v)] when v ~ Beta(a, b).

    Parameters
    ----------
    a, b : array_like
        Positive Beta parameters (for example 1 + successes and 1 + failures seen so far).

    Returns
    -------
    ndarray
        ``a b / ((a + b)(a + b + 1))``.

    Examples
    --------
    The posterior expectation is smaller than the plug-in value at the mean, by the posterior variance:

    >>> import numpy as np
    >>> a, b = 2.0, 3.0
    >>> mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    >>> bool(np.isclose(beta_contrast_potential(a, b), mean * (1 - mean) - var))
    True
    """
    a, b = _beta_args(a, b)
    return a * b / ((a + b) * (a + b + 1.0))


def beta_mixed_probability(a, b, m):
    """Expected mixed-group probability E[1 - v^m - (1 - v)^m] when v ~ Beta(a, b).

    Parameters
    ----------
    a, b : array_like
        Positive Beta parameters.
    m : array_like of int
        Group sizes, ``m >= 0``.

    Returns
    -------
    ndarray
        ``1 - B(a + m, b) / B(a, b) - B(a, b + m) / B(a, b)`` for ``m >= 2``, else 0.

    Notes
    -----
    PAPER.md, "Known weak spots": the plug-in utility treats an untested prompt and one measured at
    p = 0.5 alike; the posterior expectation does not. Ratios of Beta functions are computed with
    ``scipy.special.betaln``, so m in the millions is fine.

    Examples
    --------
    Under the uniform prior Beta(1, 1), E[v^m] = 1 / (m + 1):

    >>> import numpy as np
    >>> m = np.arange(2, 7)
    >>> bool(np.allclose(beta_mixed_probability(1, 1, m), 1 - 2 / (m + 1)))
    True
    """
    a, b = _beta_args(a, b)
    m = _checks.counts("m", m)
    a, b, m = np.broadcast_arrays(a, b, m)
    zero = np.zeros_like(m)
    out = 1.0 - _beta_moment(a, b, m, zero) - _beta_moment(a, b, zero, m)
    return np.where(m >= 2, np.clip(out, 0.0, 1.0), 0.0)


def beta_mixed_probability_gain(a, b, m):
    """Expected marginal value of the (m + 1)-th rollout when v ~ Beta(a, b).

    Returns
    -------
    ndarray
        ``B(a + m, b + 1) / B(a, b) + B(a + 1, b + m) / B(a, b)`` for ``m >= 1``, else 0; this is
        E[v^m (1 - v) + (1 - v)^m v].

    Examples
    --------
    >>> import numpy as np
    >>> m = np.arange(6)
    >>> gains = beta_mixed_probability_gain(2.0, 5.0, m)
    >>> bool(np.allclose(gains, np.diff(beta_mixed_probability(2.0, 5.0, np.arange(7)))))
    True
    """
    a, b = _beta_args(a, b)
    m = _checks.counts("m", m)
    a, b, m = np.broadcast_arrays(a, b, m)
    one = np.ones_like(m)
    gain = _beta_moment(a, b, m, one) + _beta_moment(a, b, one, m)
    return np.where(m >= 1, gain, 0.0)


def _beta_binary_reward(r) -> np.ndarray:
    r = np.asarray(r, dtype=float)
    bad = ~((r == 0.0) | (r == 1.0))
    if bad.any():
        raise ValueError(f"`r` must be 0 or 1 for the Beta-posterior utility, got {_checks._first_bad(r, bad)!r}")
    return r


def beta_flip_probability(a, b, r, k):
    """Expected flip probability E[1 - q^k] when v ~ Beta(a, b) and r is the factual 0/1 reward.

    Returns
    -------
    ndarray
        ``1 - B(a + k, b) / B(a, b)`` when r = 1 (q = v) and ``1 - B(a, b + k) / B(a, b)`` when r = 0.

    Examples
    --------
    >>> import numpy as np
    >>> k = np.arange(4)
    >>> bool(np.allclose(beta_flip_probability(1, 1, 1, k), 1 - 1 / (k + 1)))
    True
    """
    a, b = _beta_args(a, b)
    r = _beta_binary_reward(r)
    k = _checks.counts("k", k)
    a, b, r, k = np.broadcast_arrays(a, b, r, k)
    zero = np.zeros_like(k)
    stay = np.where(r == 1.0, _beta_moment(a, b, k, zero), _beta_moment(a, b, zero, k))
    return np.where(k >= 1, np.clip(1.0 - stay, 0.0, 1.0), 0.0)


def beta_flip_probability_gain(a, b, r, k):
    """Expected marginal value of the (k + 1)-th continuation, E[q^k (1 - q)], when v ~ Beta(a, b).

    Examples
    --------
    >>> import numpy as np
    >>> k = np.arange(5)
    >>> gains = beta_flip_probability_gain(3.0, 2.0, 0, k)
    >>> bool(np.allclose(gains, np.diff(beta_flip_probability(3.0, 2.0, 0, np.arange(6)))))
    True
    """
    a, b = _beta_args(a, b)
    r = _beta_binary_reward(r)
    k = _checks.counts("k", k)
    a, b, r, k = np.broadcast_arrays(a, b, r, k)
    one = np.ones_like(k)
    return np.where(r == 1.0, _beta_moment(a, b, k, one), _beta_moment(a, b, one, k))
