"""Eager expansion: deciding continuations when a prefix forms, before its rollout's outcome is known.

TRACE's prefix utility (PAPER.md, "Prefix utility") reads the factual reward r of the bare rollout
through a prefix: flip(v, r, k) = 1 - q^k, q = r v + (1 - r)(1 - v). A step that waits for r is two
episodes deep: a continuation from turn t starts only once its rollout has ended. The functions here
take the decision with what is known when the prefix forms (ours):

==========================================  ==========================================================
``expected_flip_probability(v, k)``         E_r[1 - q^k] with r ~ Bern(v): 1 - v^(k+1) - (1 - v)^(k+1),
                                            the root utility ``mixed_probability(v, k + 1)`` of the
                                            k + 1 leaves under the prefix
``... (v, k, v_later=w)``                   the same once the factual branch has moved on to a later
                                            prediction w (r ~ Bern(w), V a martingale):
                                            1 - w v^k - (1 - w)(1 - v)^k; k = 1: v + w - 2 v w
``expected_flip_probability_gain``          its marginal gain w v^k (1 - v) + (1 - w)(1 - v)^k v
``threshold_spend``                         the online rule: per bare rollout, prefix by prefix, the
                                            units whose expected gain per price exceeds a threshold
``offline_level``                           the threshold at which that rule, replayed on a finished
                                            step's prefixes, spends a target: the next step's threshold
==========================================  ==========================================================

**The online rule and its regret.** Each bare rollout j gets an eager budget b_j (its tree's eager share
dealt evenly over the tree's rollouts, the remainder to the earliest). When its prefix at depth d forms,
with prediction v and price c (in rollouts of its prompt), the rule commits the units k = 0, 1, ... whose
gain g(k) / c exceeds the threshold tau, while the rollout's remaining budget pays for them. A decision
reads its own rollout's history and tau only, so it is independent of the order in which rollouts
reach their turn boundaries (the engine's timing). What a rollout leaves unspent joins its tree's
outcome-aware reserve (:mod:`trace_theory.expansion.eager`), so the step spends
exactly its budget, as the barrier does.

Regret against the barrier's offline optimum OPT (``allocate_prefixes`` on every prefix, r known):

* The eager counts plus the reserve's are a feasible allocation of the barrier's per-tree problem, so
  ``OPT - U >= 0`` on every batch (U: the realised sum of flip(v, r, k) of eager TRACE).
* In expectation over r ~ Bern(v) (the predictor calibrated), E[OPT - U] = (value of waiting) + (online
  loss): the value of waiting, E[OPT] - the best allocation that does not read r, is what knowing r is
  worth; it vanishes at v = 1/2 (q = 1/2 whatever r) and is largest at confident prefixes. The online loss
  is the gap between that non-anticipating optimum and the threshold rule.
* Per rollout the rule is a prefix greedy in arrival order with gains non-increasing along each prefix's
  units. When it leaves budget unspent it has taken every unit above tau: its value is then the
  optimum of the rollout's expected utility among allocations spending at most what it spent
  (``trace_theory._priced``'s guarantee, per rollout). When the budget binds, it has spent b_j on units
  worth more than tau each: it loses at most b_j (g_max - tau) against that rollout's optimum, g_max the
  largest gain per price the rollout saw, so a threshold near the step's own level keeps the loss small.
  ``offline_level`` sets tau from the previous step, and the simulator measures both parts
  (``simulations.experiments.eager_expansion``).

**Correlated prefixes.** Prefixes along one bare rollout share its outcome. The paper's objective is a
sum over anchors, and by linearity of expectation its expected value is the sum of the per-prefix
expectations however the outcomes are correlated: the rule above is exact for it. The event that the
rollout's outcome is contradicted at least once is not additive: with earlier commitments k_a at
predictions v_a along the rollout it has probability 1 - w prod_a v_a^k_a - (1 - w) prod_a (1 - v_a)^k_a
(w: the latest prediction), less than the sum. :func:`rollout_joint_gain` gives its marginal gain; the
simulator measures what using the additive gains instead costs in mixed prompts and contrast pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _checks
from ._bracketing import bisect_last

__all__ = ["expected_flip_probability", "expected_flip_probability_gain", "rollout_joint_gain", "EagerPlan",
           "rollout_budgets", "threshold_spend", "offline_level"]


def _later(v: np.ndarray, v_later) -> np.ndarray:
    return v if v_later is None else _checks.probabilities("v_later", v_later)


def expected_flip_probability(v, k, *, v_later=None):
    """Expected flip probability of ``k`` continuations from a prefix before its outcome is known.

    Parameters
    ----------
    v : array_like
        Predicted success probability at the prefix, in [0, 1].
    k : array_like of int
        Continuations from the prefix, ``k >= 0``.
    v_later : array_like, optional
        A later prediction w along the factual rollout (default: ``v`` itself, the decision at the prefix).

    Returns
    -------
    ndarray
        E_r[1 - q^k] = 1 - w v^k - (1 - w)(1 - v)^k with r ~ Bern(w), q = r v + (1 - r)(1 - v).

    Notes
    -----
    V is a martingale, so given the factual branch's later prediction w the factual reward is Bern(w),
    while each continuation from the prefix still succeeds with probability v. Averaging the paper's
    flip(v, r, k) over r gives the formula. At w = v it is 1 - v^(k+1) - (1 - v)^(k+1): the root mixed
    probability of the k + 1 leaves under the prefix (2 v (1 - v) for one continuation); at w = r it is
    the paper's flip(v, r, k); for k = 1 it is v + w - 2 v w.

    Examples
    --------
    >>> import numpy as np
    >>> from trace_theory import mixed_probability
    >>> v, k = np.array([0.1, 0.5, 0.8]), np.array([1, 2, 3])
    >>> bool(np.allclose(expected_flip_probability(v, k), mixed_probability(v, k + 1)))
    True
    >>> round(float(expected_flip_probability(0.3, 1, v_later=0.6)), 12)  # 0.3 + 0.6 - 2 * 0.18
    0.54
    """
    v = _checks.probabilities("v", v)
    k = _checks.counts("k", k)
    w = _later(v, v_later)
    v, w, k = np.broadcast_arrays(v, w, k)
    kf = k.astype(float)
    out = 1.0 - w * np.power(v, kf) - (1.0 - w) * np.power(1.0 - v, kf)
    return np.where(k >= 1, np.clip(out, 0.0, 1.0), 0.0)


def expected_flip_probability_gain(v, k, *, v_later=None):
    """Marginal value of the (k + 1)-th continuation before the outcome is known.

    Returns
    -------
    ndarray
        w v^k (1 - v) + (1 - w)(1 - v)^k v (w = ``v_later``, default ``v``): non-increasing in k, so the
        greedy over units is exact for a sum of such prefixes.

    Examples
    --------
    >>> import numpy as np
    >>> k = np.arange(5)
    >>> gains = expected_flip_probability_gain(0.7, k, v_later=0.4)
    >>> bool(np.allclose(gains, np.diff(expected_flip_probability(0.7, np.arange(6), v_later=0.4))))
    True
    """
    v = _checks.probabilities("v", v)
    k = _checks.counts("k", k)
    w = _later(v, v_later)
    v, w, k = np.broadcast_arrays(v, w, k)
    kf = k.astype(float)
    return w * np.power(v, kf) * (1.0 - v) + (1.0 - w) * np.power(1.0 - v, kf) * v


def rollout_joint_gain(v, k, *, stay_success=1.0, stay_failure=1.0, v_later=None):
    """Marginal gain in P(the rollout's outcome is contradicted at least once) of one more unit at v.

    ``stay_success`` = prod_a v_a^k_a and ``stay_failure`` = prod_a (1 - v_a)^k_a over the rollout's
    earlier commitments: the chances that none of them contradicts a success, or a failure. With r ~ Bern(v)
    the probability is 1 - v S1 v^k - (1 - v) S0 (1 - v)^k, and the gain of the (k + 1)-th unit is
    v S1 v^k (1 - v) + (1 - v) S0 (1 - v)^k v: :func:`expected_flip_probability_gain` when nothing was
    committed before (S1 = S0 = 1), smaller after. ``v_later``: r ~ Bern(w) with a later prediction w.

    >>> import numpy as np
    >>> bool(np.isclose(rollout_joint_gain(0.6, 0), expected_flip_probability_gain(0.6, 0)))
    True
    """
    v = _checks.probabilities("v", v)
    k = _checks.counts("k", k).astype(float)
    s1 = _checks.probabilities("stay_success", stay_success)
    s0 = _checks.probabilities("stay_failure", stay_failure)
    w = _later(v, v_later)
    return w * s1 * np.power(v, k) * (1.0 - v) + (1.0 - w) * s0 * np.power(1.0 - v, k) * v


@dataclass(frozen=True)
class EagerPlan:
    """Settings of eager expansion for one step.

    Attributes
    ----------
    reserve : float
        Share of each tree's continuation budget m_i N kept for the outcome-aware rule (spent once the
        tree's bare rollouts have ended); 1 - reserve is committed at turn boundaries. 1: streamed expansion.
        0: the step never waits for a tree; priced in tokens, what a rollout leaves that buys no whole
        continuation from its last prefix is then not spent (the step spends at most its budget, as
        token-priced allocation always does). The default, 0, is the simulator's choice for a step as deep
        as GRPO's (``simulations.experiments.eager_expansion``: a reserve of 0.5 keeps about all of lazy
        TRACE's contrast, but brings its second episode back).
    threshold : float or None
        tau, the expected gain per price (in rollouts of the prompt) a unit must exceed to be committed at
        a turn boundary; None: the prior of :func:`prior_level` from the roots' predictions (the first step).
    objective : str
        "additive" (the paper's sum over prefixes; exact by linearity) or "joint" (the chance that the
        rollout's outcome is contradicted at least once, :func:`rollout_joint_gain`).
    """

    reserve: float = 0.0
    threshold: float | None = None
    objective: str = "additive"
    lag: int = 1
    """Turns between a prefix forming and its decision: 0 (at once, w = v) or 1 (at the rollout's next
    boundary, with its prediction w there, or at its end with w = r): one turn later, never past one
    turn beyond the longest bare rollout, and with one more turn of the factual branch known. The
    simulator's ``eager_<reserve>`` arms run 1; the trainer's ``rollout.eager_lag`` defaults to 0 (a step
    as deep as GRPO's), since with a learned predictor the turn of waiting keeps no more contrast."""

    def __post_init__(self):
        if not (isinstance(self.reserve, (int, float)) and 0.0 <= self.reserve <= 1.0):
            raise ValueError(f"`reserve` must lie in [0, 1], got {self.reserve!r}")
        if self.threshold is not None and not (np.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"`threshold` must be a finite non-negative number or None, got {self.threshold!r}")
        if self.objective not in ("additive", "joint"):
            raise ValueError(f"`objective` must be 'additive' or 'joint', got {self.objective!r}")
        if self.lag not in (0, 1):
            raise ValueError(f"`lag` must be 0 or 1, got {self.lag!r}")

    def eager_budget(self, budget) -> np.ndarray:
        """Per tree, the part of ``budget`` committed at turn boundaries: floor((1 - reserve) B)."""
        budget = np.asarray(budget, dtype=np.int64)
        return np.floor((1.0 - self.reserve) * budget + 1e-9).astype(np.int64)


def rollout_budgets(budget, rollouts) -> list[np.ndarray]:
    """Each tree's eager ``budget`` dealt evenly over its ``rollouts`` bare rollouts, the remainder first.

    >>> [b.tolist() for b in rollout_budgets([5, 0], [2, 3])]
    [[3, 2], [0, 0, 0]]
    """
    budget = _checks.counts("budget", _checks.vector("budget", budget, dtype=None))
    rollouts = _checks.counts("rollouts", _checks.vector("rollouts", rollouts, dtype=None))
    out = []
    for b, m in zip(budget.tolist(), rollouts.tolist()):
        base, extra = divmod(b, m) if m else (0, 0)
        out.append((base + (np.arange(m) < extra)).astype(np.int64))
    return out


def threshold_spend(v, price, budget, threshold, *, max_per_anchor=None, objective="additive",
                    stay=(1.0, 1.0), v_later=None):
    """Continuations committed at prefixes by the online rule (see the module), and what they cost.

    Parameters
    ----------
    v : array_like
        Predicted success probability at each prefix.
    price : array_like
        Price of one continuation from it, in the unit of ``budget`` (1: rollout-priced).
    budget : array_like
        What each prefix's rollout has left of its eager budget.
    threshold : float
        tau: a unit is committed when its expected gain divided by ``price`` exceeds it.
    max_per_anchor : int, optional
        Cap on the continuations from one prefix.
    objective : {"additive", "joint"}
        Gains of :func:`expected_flip_probability_gain` or of :func:`rollout_joint_gain` (then ``stay`` is
        (S1, S0) of each rollout's earlier commitments).
    v_later : array_like, optional
        The factual branch's later prediction w at each prefix (r itself once the rollout has ended);
        default ``v``, the decision as the prefix forms.

    Returns
    -------
    (ndarray of int64, ndarray of float)
        k, the continuations to start now at each prefix, and k * price (scalars in, scalars out).

    Examples
    --------
    >>> k, spent = threshold_spend(0.5, 1.0, 3, 0.2)  # gains 0.5, 0.25, 0.125: two exceed 0.2
    >>> int(k), float(spent)
    (2, 2.0)
    >>> int(threshold_spend(0.5, 1.0, 1, 0.0)[0])  # the budget binds
    1
    """
    if objective == "additive" and all(map(_is_scalar, (v, price, budget, v_later))):
        return _scalar_spend(float(v), float(price), float(budget), threshold, max_per_anchor,
                             float(v) if v_later is None else float(v_later))
    k, spent, _ = _spend(v, price, budget, threshold, max_per_anchor, objective, stay, v_later)
    if np.ndim(v) == 0:
        return k[0], float(spent[0])
    return k, spent


def _is_scalar(x) -> bool:
    """Whether ``x`` is one number (or None): a Python or NumPy float or int is, without NumPy's dispatch."""
    return x is None or isinstance(x, (float, int)) or np.ndim(x) == 0


def _scalar_spend(v: float, price: float, budget: float, threshold: float, max_per_anchor, w: float):
    """:func:`threshold_spend` at one prefix with the additive objective, in plain floats (a turn
    boundary's decision; numpy's per-call overhead is most of the vector rule's cost at one prefix)."""
    cap = math.floor(budget / price * (1.0 + 1e-9) + 1e-9)
    if max_per_anchor is not None:
        cap = min(cap, int(max_per_anchor))
    k = 0
    while k < cap and (w * v**k * (1.0 - v) + (1.0 - w) * (1.0 - v) ** k * v) / price > threshold:
        k += 1  # gains fall along k: the units above the threshold are a prefix
    return np.int64(k), float(k * price)


def _spend(v, price, budget, threshold, max_per_anchor, objective, stay, v_later):
    """:func:`threshold_spend` on arrays, and the interval [a, b) of thresholds over which every comparison
    it made comes out the same (a: the largest gain per price at or below ``threshold``, b: the smallest
    above it), so that over it the rule takes the same decisions."""
    v = np.atleast_1d(np.asarray(v, dtype=float))
    w = v if v_later is None else np.broadcast_to(np.asarray(v_later, dtype=float), v.shape)
    price = np.broadcast_to(np.asarray(price, dtype=float), v.shape)
    budget = np.broadcast_to(np.asarray(budget, dtype=float), v.shape)
    cap = np.floor(budget / price * (1.0 + 1e-9) + 1e-9).astype(np.int64)
    if max_per_anchor is not None:
        cap = np.minimum(cap, int(max_per_anchor))
    cap = np.maximum(cap, 0)
    width = int(cap.max(initial=0))
    k = np.zeros(v.size, dtype=np.int64)
    stable = (-np.inf, np.inf)
    if width:
        units = np.arange(width)[None, :]
        if objective == "joint":
            s1 = np.broadcast_to(np.asarray(stay[0], float), v.shape)[:, None]
            s0 = np.broadcast_to(np.asarray(stay[1], float), v.shape)[:, None]
        else:
            s1 = s0 = 1.0
        vv, ww = v[:, None], w[:, None]
        with np.errstate(under="ignore"):
            gain = ww * s1 * vv**units * (1.0 - vv) + (1.0 - ww) * s0 * (1.0 - vv) ** units * vv
        per_price = gain / price[:, None]
        above = per_price > threshold
        # gains fall along k: the units above the threshold (and within the cap) are a prefix
        k = np.count_nonzero(above & (units < cap[:, None]), axis=1)
        stable = (float(np.max(per_price, where=~above, initial=-np.inf)),
                  float(np.min(per_price, where=above, initial=np.inf)))
    return k.astype(np.int64), k * price, stable


def replay_spend(v, price, rollout, budgets, threshold, *, max_per_anchor=None, objective="additive",
                 v_later=None):
    """The rule replayed on a finished step: the eager count of every prefix.

    ``rollout`` numbers each prefix's bare rollout (a rollout's prefixes consecutive, by depth) and
    ``budgets`` holds each rollout's eager budget; ``v_later`` the later prediction each decision saw.
    All rollouts advance together, one prefix position at a time, which is what the online rule does
    whatever the order they reach their boundaries in.
    """
    return _replay(v, price, rollout, budgets, threshold, max_per_anchor, objective, v_later)[0]


def _replay(v, price, rollout, budgets, threshold, max_per_anchor, objective, v_later):
    """:func:`replay_spend`, and the interval of thresholds over which it takes the same decisions (the
    intersection of :func:`_spend`'s: the same comparisons at one position leave the same budgets and
    stays to the next)."""
    v, price = np.asarray(v, float), np.asarray(price, float)
    w = v if v_later is None else np.asarray(v_later, float)
    rollout = np.asarray(rollout, np.int64)
    left = np.asarray(budgets, dtype=float).copy()
    s1, s0 = np.ones(left.size), np.ones(left.size)
    k = np.zeros(v.size, dtype=np.int64)
    low, high = -np.inf, np.inf
    if v.size == 0:
        return k, (low, high)
    first = np.r_[True, rollout[1:] != rollout[:-1]]
    position = np.arange(v.size) - np.maximum.accumulate(np.where(first, np.arange(v.size), 0))
    for p in range(int(position.max()) + 1):
        at = np.flatnonzero(position == p)
        j = rollout[at]
        k[at], spent, (a, b) = _spend(v[at], price[at], left[j], threshold, max_per_anchor, objective,
                                      (s1[j], s0[j]), w[at])
        low, high = max(low, a), min(high, b)
        left[j] -= spent
        with np.errstate(under="ignore"):
            s1[j] *= v[at] ** k[at]
            s0[j] *= (1.0 - v[at]) ** k[at]
    return k, (low, high)


def offline_level(v, price, rollout, budgets, target, *, max_per_anchor=None, objective="additive",
                  v_later=None):
    """The largest threshold at which :func:`replay_spend` on a finished step spends ``target`` or more.

    Bisection on the log scale (the spend never grows with the threshold); where even a zero threshold
    spends less than ``target`` (rollouts without prefixes, caps), the largest threshold that still spends
    what a zero threshold spends. This is the next step's tau: the level that would have spent the eager
    budget on the step just seen.

    >>> offline_level([0.5, 0.5], [1.0, 1.0], [0, 1], [2, 2], 2) > 0.25
    True
    """
    v, price = np.asarray(v, float), np.asarray(price, float)
    if v.size == 0 or target <= 0:
        return float(np.max(expected_flip_probability_gain(v, 0) / price, initial=0.0))

    seen: list[tuple[float, float, float]] = []  # (a, b, spend): thresholds in [a, b) spend the same

    def spend(t):
        for a, b, total in seen:  # a replay is the step's whole rule; the bisection revisits few intervals
            if a <= t < b:
                return total
        k, (a, b) = _replay(v, price, rollout, budgets, t, max_per_anchor, objective, v_later)
        seen.append((a, b, float(np.dot(k, price))))
        return seen[-1][2]

    target = min(target, spend(0.0))  # what no threshold can spend (rollouts without prefixes) is not aimed at
    if target <= 0:
        return 0.0
    lo, hi = -30.0, float(np.log(max(np.max(expected_flip_probability_gain(v, 0) / price), 1e-300)))
    if spend(np.exp(hi)) >= target - 1e-9:
        return float(np.exp(hi))
    return float(np.exp(bisect_last(lambda t: spend(np.exp(t)) >= target - 1e-9, lo, hi)))


def prior_level(v_root, m, budgets, *, price=None):
    """A first step's threshold from the roots alone: the level at which one prefix per bare rollout,
    predicted at its prompt's v (V is a martingale), would spend the eager budgets.

    >>> prior_level([0.5], [2], [[1, 1]]) > 0
    True
    """
    v_root = np.asarray(v_root, float)
    m = np.asarray(m, np.int64)
    v = np.repeat(v_root, m)
    rollout = np.arange(v.size)
    flat = np.concatenate([np.asarray(b, float) for b in budgets]) if len(budgets) else np.zeros(0)
    p = np.ones(v.size) if price is None else np.repeat(np.asarray(price, float), m)
    return offline_level(v, p, rollout, flat, float(flat.sum()))
