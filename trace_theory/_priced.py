"""Allocation priced in tokens: the ratio greedy over units (or blocks) of known price.

Both stages become knapsacks: maximise sum_i F_i(x_i) subject to sum_i c_i x_i <= T, with c_i > 0 the
price of one unit of item i (a rollout of prompt i, a continuation from anchor a). Each item's units
are listed with their value and price, in an order along which value per price never increases, and
the **prefix greedy** takes them in decreasing value per price (ties: lower item, then earlier unit)
for as long as the running spend fits, stopping at the first unit that does not.

Guarantee (the knapsack greedy for concave items): let W <= T be what the greedy spent. Its units are
a prefix of the ratio order, so they are exactly what the fractional (LP) relaxation takes at capacity
W, and the greedy's value equals LP(W) >= OPT(W): **the greedy is optimal among allocations spending at
most W**. At the full budget, LP(T) <= LP(W) + (T - W) rho_next < LP(W) + value of the first unit that
did not fit, so **OPT(T) - greedy < the value of the first rejected unit** (at most 1 here: a mixed or
flip probability). With all prices equal, W is the largest multiple of the price within T and the
greedy is exact. Roots need a block: F(1) = 0, so a prompt's first m^ rollouts (m^ = the smallest
argmax of F(m) / m over the allowed group sizes, ties up to rounding) are one indivisible unit of value F(m^) (its concave envelope's linear
piece); envelope and F agree at 0 and at every m >= m^, the only counts the greedy produces, so the
argument above holds unchanged.

Cost: one sort of the units, sum over items of min(cap, budget / c) of them (a prefix budget of m_i N
is a few dozen units per anchor). Roots are listed prompt by prompt, O(sum_i min(U, M / c_i)); the
driver takes this path only when root prices differ (the simulator's and the engine's do not).
"""

from __future__ import annotations

import numpy as np

from .contrast import mixed_probability

_TOL = 1e-9  # relative slack on the spend, so that prices summing to the budget up to rounding fit
_TIE = 1e-12  # values per rollout this close count as equal (3v(1-v) / 3 = 2v(1-v) / 2 exactly, not in floats)


def units_within(budget, price):
    """How many units of ``price`` fit in ``budget``: floor(budget / price), up to rounding."""
    return np.floor(np.asarray(budget) / price * (1.0 + _TOL) + _TOL)


def prefix_greedy(ratio, price, group, budget):
    """Per group, take units in decreasing ``ratio`` (ties: input order) while the spend fits ``budget``.

    Units of one item must be listed in their order of use with non-increasing ratio. Returns the mask
    of units taken and the spend per group. Prices are positive, so the spend only grows along the
    order and "while it fits" is a prefix of the order: the greedy stops at the first unit that does
    not fit.
    """
    n = len(ratio)
    order = np.lexsort((np.arange(n), -ratio, group))
    g = group[order]
    spend = np.cumsum(price[order])
    first = np.searchsorted(g, g)  # start of each unit's group in the sorted order
    before = np.where(first > 0, spend[first - 1], 0.0)
    within = spend - before
    fits = within <= budget[g] * (1.0 + _TOL) + _TOL
    take = np.zeros(n, dtype=bool)
    take[order] = fits
    spent = np.bincount(group[take], weights=price[take], minlength=len(budget))
    return take, spent


def priced_prefixes(q, price, group, budget, room, start):
    """Continuations per anchor by value per price, gains q^k (1 - q) from k = ``start`` (at most ``room``).

    Returns (k, unspent): unspent is the whole rollouts of each group's budget left, floor(B - spent).
    """
    n_units = np.minimum(room, units_within(budget[group], price))
    n_units = np.maximum(n_units, 0).astype(np.int64)
    anchor = np.repeat(np.arange(len(q)), n_units)
    k = np.arange(n_units.sum()) - np.repeat(np.cumsum(n_units) - n_units, n_units) + start[anchor]
    with np.errstate(under="ignore"):
        gain = q[anchor] ** k * (1.0 - q[anchor])  # 0 ** 0 = 1: an anchor with q = 0 flips for sure once
    ratio = _non_increasing(gain / price[anchor], anchor)
    take, spent = prefix_greedy(ratio, price[anchor], group[anchor], budget.astype(float))
    counts = np.bincount(anchor[take], minlength=len(q)).astype(np.int64)
    unspent = np.floor(budget - spent + _TOL * (1.0 + budget)).astype(np.int64)
    return counts, np.maximum(unspent, 0)


def priced_roots(v, price, budget, min_group, max_group):
    """Group sizes by value per price: a block of m^ rollouts first, then single rollouts (module notes)."""
    n = len(v)
    top = np.minimum(max_group, units_within(budget, price)).astype(np.int64)
    items_v, items_price, items_count, items_prompt = [], [], [], []
    for i in np.flatnonzero(top >= min_group):
        m = np.arange(min_group, top[i] + 1)
        f = mixed_probability(np.full(m.size, v[i]), m)
        per_rollout = f / m  # the block: the smallest m with the largest value per rollout, where ties
        hat = int(np.flatnonzero(per_rollout >= per_rollout.max() * (1.0 - _TIE))[0])  # are equal up to rounding
        gains = np.diff(f[hat:])
        items_v.append(np.concatenate([[f[hat]], gains]))
        items_count.append(np.concatenate([[m[hat]], np.ones(gains.size, dtype=np.int64)]))
        items_price.append(price[i] * items_count[-1])
        items_prompt.append(np.full(gains.size + 1, i))
    if not items_v:
        return np.zeros(n, dtype=np.int64)
    value, cost = np.concatenate(items_v), np.concatenate(items_price)
    count, prompt = np.concatenate(items_count), np.concatenate(items_prompt)
    ratio = _non_increasing(value / cost, prompt)
    take, _ = prefix_greedy(ratio, cost, np.zeros(prompt.size, dtype=np.int64), np.array([float(budget)]))
    return np.bincount(prompt[take], weights=count[take], minlength=n).astype(np.int64)


def _non_increasing(ratio, item):
    """Ratios made non-increasing along each item's units (rounding can break the order by an ulp)."""
    if ratio.size == 0:
        return ratio
    same = item[1:] == item[:-1]
    if not (same & (ratio[1:] > ratio[:-1])).any():
        return ratio
    out = ratio.copy()
    starts = np.flatnonzero(np.r_[True, item[1:] != item[:-1]])
    for s, e in zip(starts, np.r_[starts[1:], item.size]):
        out[s:e] = np.minimum.accumulate(out[s:e])
    return out
