"""Allocation priced in tokens: the ratio greedy against a short loop and against exhaustive search.

The guarantee tested (``trace_theory._priced``): the greedy is optimal among allocations that spend at
most what it spent, and short of the optimum at the full budget by less than the value of the first
unit (or root block) that did not fit. With equal prices it is the rollout-priced allocation.
"""

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trace_theory import allocate_prefixes, allocate_roots, flip_probability, mixed_probability, root_utility

from .strategies import priced_probabilities, probability_arrays

TOL = 1e-9


def fits(spend, budget):
    return spend <= budget * (1 + TOL) + TOL


# ---------------------------------------------------------------------------------------------------
# Prefixes
# ---------------------------------------------------------------------------------------------------


def greedy_prefixes(q, price, budget, cap):
    """The obvious greedy: next unit of best gain per price (ties: lower anchor) until one does not fit.

    Units that could never fit (count times price above the budget) are not candidates. Returns the
    counts and the gain of the first unit that did not fit (0 if every candidate was taken).
    """
    k, spent = np.zeros(len(q), dtype=int), 0.0
    while True:
        best, best_ratio = None, -1.0
        for a in range(len(q)):
            if k[a] >= cap or not fits((k[a] + 1) * price[a], budget):
                continue
            ratio = q[a] ** k[a] * (1 - q[a]) / price[a]
            if ratio > best_ratio:
                best, best_ratio = a, ratio
        if best is None:
            return k, 0.0
        if not fits(spent + price[best], budget):
            return k, q[best] ** k[best] * (1 - q[best])
        spent += price[best]
        k[best] += 1


def best_prefix_value(v, r, price, capacity, cap):
    ranges = [range(min(cap, int(np.floor(capacity / p * (1 + TOL) + TOL))) + 1) for p in price]
    return max(
        flip_probability(v, r, np.array(k)).sum()
        for k in itertools.product(*ranges)
        if fits(float(np.dot(k, price)), capacity)
    )


@given(priced_probabilities(1, 3), st.lists(st.sampled_from([0.0, 1.0]), min_size=3, max_size=3),
       st.integers(0, 4), st.integers(1, 6))
@example((np.array([0.9, 0.5]), np.array([3.0, 1.0])), [1.0, 1.0, 1.0], 4, 6)  # a unit that can never fit
def test_priced_prefixes_are_the_greedy_and_exact_at_their_spend(vp, r, budget, cap):
    v, price = vp
    r = np.array(r[: len(v)])
    out = allocate_prefixes(v, r, np.zeros(len(v), dtype=int), [budget], max_per_anchor=cap, cost=price)
    q = r * v + (1 - r) * (1 - v)
    k, rejected = greedy_prefixes(q, price, budget, cap)
    assert out.k.tolist() == k.tolist()  # fast equals obvious
    spend = float(np.dot(out.k, price))
    assert fits(spend, budget)
    assert out.unspent[0] == int(np.floor(budget - spend + 1e-9 * (1 + budget)))
    value = flip_probability(v, r, out.k).sum()
    assert value >= best_prefix_value(v, r, price, spend, cap) - 1e-12  # optimal at its own spend
    assert best_prefix_value(v, r, price, budget, cap) - value <= rejected + 1e-12  # within one unit


@given(probability_arrays(1, 6), st.data())
def test_equal_prices_give_the_rollout_priced_prefixes(v, data):
    n = len(v)
    r = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    prompt = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    budget = np.array(data.draw(st.lists(st.integers(0, 8), min_size=3, max_size=3)))
    plain = allocate_prefixes(v, r, prompt, budget)
    priced = allocate_prefixes(v, r, prompt, budget, cost=np.ones(n))
    assert priced.unspent.tolist() == plain.unspent.tolist()
    # the same value; exact ties may be broken differently (log-scale against linear gains)
    assert flip_probability(v, r, priced.k).sum() == pytest.approx(flip_probability(v, r, plain.k).sum(), abs=1e-12)


def test_cheap_deep_prefixes_get_more_continuations():
    # Equal predictions; the second anchor is deeper, so a continuation from it costs a third.
    out = allocate_prefixes([0.5, 0.5], [1, 1], [0, 0], [2], cost=[1.0, 1 / 3])
    assert out.k.tolist() == [1, 3] and out.unspent.tolist() == [0]
    assert allocate_prefixes([0.5, 0.5], [1, 1], [0, 0], [2]).k.tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------------
# Roots
# ---------------------------------------------------------------------------------------------------


def greedy_roots(v, price, budget, lo, hi):
    """The obvious greedy on the concave envelope: per prompt a block of m^ rollouts, then singles."""
    items = []  # (ratio, prompt, order, count, value)
    for i in range(len(v)):
        top = min(hi, int(np.floor(budget / price[i] * (1 + TOL) + TOL)))
        if top < lo:
            continue
        f = {m: float(mixed_probability(v[i], m)) for m in range(lo, top + 1)}
        best = max(f[m] / m for m in range(lo, top + 1))  # the smallest maximiser, ties up to rounding
        hat = min(m for m in range(lo, top + 1) if f[m] / m >= best * (1 - 1e-12))
        items.append([f[hat] / (hat * price[i]), i, 0, hat, f[hat]])
        for j, m in enumerate(range(hat + 1, top + 1)):
            items.append([(f[m] - f[m - 1]) / price[i], i, j + 1, 1, f[m] - f[m - 1]])
    for it in items:  # ratios never increase along a prompt's items (rounding aside)
        prev = [x for x in items if x[1] == it[1] and x[2] < it[2]]
        if prev:
            it[0] = min(it[0], min(x[0] for x in prev))
    items.sort(key=lambda x: (-x[0], x[1], x[2]))
    m, spent = np.zeros(len(v), dtype=int), 0.0
    for _, i, _, count, value in items:
        if not fits(spent + count * price[i], budget):
            return m, value
        spent += count * price[i]
        m[i] += count
    return m, 0.0


def best_root_value(v, price, capacity, lo, hi):
    ranges = [[0, *range(lo, min(hi, int(np.floor(capacity / p * (1 + TOL) + TOL))) + 1)] for p in price]
    return max(
        float(mixed_probability(v, np.array(m)).sum())
        for m in itertools.product(*ranges)
        if fits(float(np.dot(m, price)), capacity)
    )


@given(priced_probabilities(1, 3), st.integers(0, 8), st.integers(1, 3), st.integers(3, 8))
@example((np.array([0.5, 0.02]), np.array([1.0, 0.25])), 6, 2, 8)  # a large block for a rare success
@example((np.array([0.0, 0.5, 0.6369616873214543]), np.array([0.25, 0.25, 1.5])), 5, 1, 3)  # F(2)/2 = F(3)/3 = v(1-v)
@example((np.array([0.0, 0.5]), np.array([1.5, 1.5])), 6, 2, 3)  # equal prices spend all 4 rollouts, as TRACE
def test_priced_roots_are_the_greedy_and_exact_at_their_spend(vp, budget, lo, hi):
    v, price = vp
    m = allocate_roots(v, budget, min_group=lo, max_group=hi, cost=price)
    assert np.all((m == 0) | ((m >= lo) & (m <= hi)))
    spend = float(np.dot(m, price))
    assert fits(spend, budget)
    value = float(mixed_probability(v, m).sum())
    if not np.all(price == price[0]):  # equal prices take the exact rollout-priced path (below)
        expected, rejected = greedy_roots(v, price, budget, lo, hi)
        assert m.tolist() == expected.tolist()  # fast equals obvious
        assert value >= best_root_value(v, price, spend, lo, hi) - 1e-12  # optimal at its own spend
        assert best_root_value(v, price, budget, lo, hi) - value <= rejected + 1e-12  # within one item
    else:  # equal prices: TRACE's rollout-priced allocation of floor(budget / c) rollouts, spent in full
        units = int(np.floor(budget / price[0] * (1 + TOL) + TOL))
        try:
            plain = allocate_roots(v, units, min_group=lo, max_group=hi)
        except ValueError:  # no whole groups take exactly that many rollouts: the priced greedy ran instead
            return
        assert m.tolist() == plain.tolist()


@given(probability_arrays(1, 8), st.integers(0, 30), st.sampled_from([0.5, 1.0, 2.0]))
def test_equal_root_prices_are_the_rollout_priced_allocation(v, budget, c):
    try:
        plain = allocate_roots(v, int(budget // c))
    except ValueError:
        return
    assert allocate_roots(v, budget, cost=np.full(len(v), c)).tolist() == plain.tolist()


def test_pricing_errors():
    with pytest.raises(ValueError, match="`cost` must be finite and positive, got 0.0"):
        allocate_roots([0.5, 0.5], 4, cost=[1.0, 0.0])
    with pytest.raises(ValueError, match="not defined with `concentration`"):
        allocate_roots([0.5, 0.5], 4, cost=[1.0, 1.0], concentration=[2.0, 2.0])
    with pytest.raises(ValueError, match="`cost` must be finite and positive"):
        allocate_prefixes([0.5], [1], [0], [2], cost=[-1.0])
    assert root_utility([0.5], [2]) == 0.5
