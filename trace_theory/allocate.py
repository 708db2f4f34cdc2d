"""Exact budget allocation over roots (prompts) and prefixes (intermediate turns).

Stage 1 (``allocate_roots``) chooses integer group sizes m_i, each 0 or in [min_group, max_group],
summing to the budget M and maximising sum_i mixed(v_i, m_i). Stage 2 (``allocate_prefixes``) chooses
continuation counts k_a >= 0 per non-terminal prefix, summing to each prompt's budget m_i N and
maximising sum_a flip(v_a, r_a, k_a) (PAPER.md, "The algorithm").

How the root problem is solved exactly
--------------------------------------
Write F_i(m) for the utility of giving prompt i a group of m. F_i is concave on [L, U] (L = min_group,
U = max_group) but the feasible set {0} U [L, U] is not an interval and F_i(1) = 0: a greedy pass over
marginal gains is not exact. We solve it in three steps:

1. **Lagrangian relaxation.** Replace each F_i by its concave envelope: a block of m^_i units each worth
   rho_i = max_m F_i(m) / m, then the remaining marginal gains. The relaxation is a concave problem whose
   optimum takes every unit worth more than lambda*, the budget-th largest unit value. Call that
   allocation x0; it spends Delta = budget - sum(x0) >= 0 less than the budget.
2. **Zero-loss repair.** For any feasible m, sum F_i(m_i) = lambda* budget + sum_i phi_i(x0_i) -
   sum_i loss_i(m_i), where phi_i(m) = F_i(m) - lambda* m and loss_i(m) = phi_i(x0_i) - phi_i(m) >= 0.
   The units worth exactly lambda* are free: if Delta can be spent on them (whole activation blocks
   included), the result is optimal, because no allocation has negative loss.
3. **Loss-bounded dynamic programme.** Otherwise, we search for the cheapest way to move the total by
   Delta. Every allocation whose total loss is at most eps uses, at each prompt, only counts whose own
   loss is at most eps; a DP over the (few) prompts with such alternative counts finds the best of them.
   Starting from a small eps and enlarging it, the first eps for which the DP finds a solution of total
   loss <= eps certifies that solution as optimal.

The DP only ever sees prompts whose utility sits close to lambda*. The steps live in private modules:
``_roots_table`` (on a table of F), ``_roots_closed_form`` (on the closed form, below) and
``_roots_repair`` (steps 2 and 3, shared).

Without a table
---------------
A table of F_i(L + j) costs n times the widest group, and prompts with v near 0 or 1 have slowly
decaying gains, so its width approaches the budget (1,000 prompts, budget 10^5: 3.4 s; at 10^6 it needs
tens of GB). Even a narrow table is read a dozen times, several times the cost of one partition of its
entries. For the plain objective F has a closed form, and ``allocate_roots`` tabulates nothing:

* lambda*: each prompt's number of units above a level is known in closed form to within two units
  (``_MixedRows``). Secant steps on the total bracket lambda* between two levels; the units in between
  (about two per prompt) are listed with their exact values and partitioned.
* The peak of phi_i is that unit count, checked against its two neighbours; the intervals the repair
  reads off a row are found by probing outwards from the peak (bisecting only on long flat stretches);
  the DP evaluates only the counts it weighs.

Cost: O(n) per pass and a few dozen passes, independent of the budget (``python -m
trace_theory.benchmark`` times it against the partition floor). It returns the allocation of the table
wherever distinct answers differ in value by more than rounding (tested on thousands of random pools
against the table, which ``_solve_roots(..., method="table")`` still builds). The Beta posterior keeps
the doubling table: its moments are running products without an accurate closed form, so its cost
grows with the largest group. Equal-value optima are broken towards lower prompt indices
(``ties favour earlier prompts``); permuting the prompts can change which optimum is returned, never its
value. Values are compared with an absolute tolerance of 1e-12, so "exact" means exact up to
floating-point rounding of the utilities.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _checks, _priced, _water_fill
from ._roots_closed_form import _solve_closed_form
from ._roots_table import _beta_mixed_table, _mixed_table, _solve_threshold_problem, _solve_with_table

__all__ = ["allocate_roots", "allocate_prefixes", "root_utility", "PrefixAllocation", "check_root_budget", "water_fill"]


def root_utility(v, m, *, concentration=None):
    """The objective of ``allocate_roots`` for one allocation: sum_i mixed(v_i, m_i) (or its Beta mean).

    Parameters
    ----------
    v : array_like
        Predicted success probabilities.
    m : array_like of int
        Group sizes.
    concentration : array_like, optional
        Beta posterior strength kappa; the posterior is Beta(v kappa, (1 - v) kappa).

    Returns
    -------
    float
        The total expected number of mixed groups.
    """
    v = _checks.probabilities("v", np.atleast_1d(v))
    m = _checks.counts("m", np.atleast_1d(m))
    v, m = np.broadcast_arrays(v, m)
    if concentration is None:
        from .contrast import mixed_probability

        return float(mixed_probability(v, m).sum())
    kappa = _checks.positive("concentration", concentration)
    if kappa.ndim and kappa.shape != v.shape:
        raise ValueError(f"`concentration` must be a scalar or have the shape of `v` {v.shape}, got shape {kappa.shape}")
    kappa = np.broadcast_to(kappa, v.shape)
    total = 0.0
    for vi, ki, mi in zip(v.ravel(), kappa.ravel(), m.ravel()):
        total += float(_beta_mixed_table(np.array([vi]), np.array([ki]), 0, int(mi))[0, -1])
    return total


# ---------------------------------------------------------------------------------------------------
# Root allocation
# ---------------------------------------------------------------------------------------------------


def check_root_budget(n: int, budget: int, min_group: int, max_group: int) -> None:
    """Raise ValueError unless ``budget`` splits into groups of ``min_group..max_group`` over n prompts."""
    if budget == 0:
        return
    s_min = -(-budget // max_group)  # fewest groups that can hold the budget
    s_max = min(n, budget // min_group)  # most groups the budget can fill
    if s_min > s_max:
        raise ValueError(
            f"`budget` {budget} cannot be split over {n} prompts into groups of size 0 or "
            f"{min_group}..{max_group}; change the budget, `min_group` or `max_group`"
        )


def allocate_roots(v, budget, *, min_group=2, max_group=None, concentration=None, cost=None):
    """Exactly optimal integer group sizes for the prompts of a candidate pool.

    Parameters
    ----------
    v : array_like, shape (n,)
        Predicted success probability of each prompt, in [0, 1].
    budget : int
        Total number of root rollouts M; the result sums to exactly this.
    min_group : int, default 2
        Smallest non-zero group (a prompt gets 0 or at least this many rollouts). 2 is the smallest group
        that can be mixed.
    max_group : int, optional
        Largest group per prompt (default: no cap beyond the budget).
    concentration : array_like, optional
        Strength kappa > 0 of a Beta posterior on each prompt's pass rate, Beta(v kappa, (1 - v) kappa)
        (kappa = a + b, for example 2 + the number of rewards seen). When given, the objective is the
        posterior expectation of the mixed probability (``beta_mixed_probability``), which discounts
        predictions backed by little evidence.
    cost : array_like, shape (n,), optional
        Price c_i > 0 of one rollout of each prompt (expected tokens), in the unit of ``budget``: the
        allocation is then priced in tokens, sum_i c_i m_i <= ``budget`` (see Notes). None (default):
        every rollout costs 1, the rollout-priced problem.

    Returns
    -------
    ndarray of int64, shape (n,)
        m_i in {0} U [min_group, max_group], summing to ``budget``, maximising sum_i mixed(v_i, m_i).
        Priced in tokens: sum_i c_i m_i <= ``budget`` instead.

    Raises
    ------
    ValueError
        If an argument is malformed or the budget cannot be split (for example ``budget=1`` with
        ``min_group=2``, or ``max_group`` too small for the budget).

    Notes
    -----
    PAPER.md, "Global root allocation"; the method is described in the module docstring. Prompts whose
    prediction is 0 or 1 have zero utility and receive rollouts only when the budget cannot be placed
    elsewhere (for example because of ``max_group``).

    Priced in tokens (``cost``), the problem is max sum_i mixed(v_i, m_i) s.t. sum_i c_i m_i <= budget.
    With equal prices c it is TRACE's rollout-priced allocation of floor(budget / c) rollouts, solved
    exactly as above; like it, it spends them all (where ``min_group`` makes a smaller spend worth more,
    e.g. one prompt capped at 3 of 4 rollouts, the count problem still places all 4). With unequal prices it is a knapsack, solved by the ratio greedy on the concave envelope
    (``trace_theory._priced``): a block of m^_i = argmax_m mixed(v_i, m) / m rollouts first, then single
    rollouts, in decreasing utility per token. The result is optimal among allocations spending at most
    what it spends, and falls short of the optimum at the full budget by less than the utility of the
    first block or rollout that did not fit (< 1 mixed group). Not defined with ``concentration``.

    Examples
    --------
    Budget goes to prompts with mixed outcomes likely; certain successes and failures are filtered out:

    >>> allocate_roots([0.0, 0.5, 0.97, 1.0, 0.3], 12).tolist()
    [0, 5, 0, 0, 7]
    >>> allocate_roots([0.5, 0.5, 0.5], 5).tolist()  # 2 + 3 beats 5 on one prompt
    [3, 2, 0]
    >>> allocate_roots([0.5, 0.5, 0.5], 5, cost=[2.0, 1.0, 1.0]).tolist()  # the dear prompt is left out
    [0, 3, 2]
    """
    v = _checks.vector("v", v)
    v = _checks.probabilities("v", v)
    n = len(v)
    budget = _checks.count("budget", budget)
    min_group = _checks.count("min_group", min_group)
    if min_group < 1:
        raise ValueError(f"`min_group` must be at least 1, got {min_group}")
    capped = max_group is not None
    if not capped:
        max_group = max(budget, min_group)
    else:
        max_group = _checks.count("max_group", max_group)
        if max_group < min_group:
            raise ValueError(f"`max_group` ({max_group}) must be at least `min_group` ({min_group})")
    kappa = None
    if concentration is not None:
        kappa = _checks.per_item("concentration", concentration, n, _checks.positive).astype(float)
    price = None
    if cost is not None:
        price = _checks.per_item("cost", cost, n, _checks.positive).astype(float)
        if kappa is not None:
            raise ValueError("`cost` (token pricing) is not defined with `concentration`; pass one of them")
    return _allocate_roots(v, budget, min_group, max_group if capped else None, kappa, price)


def _allocate_roots(v: np.ndarray, budget: int, min_group: int, max_group: int | None, kappa: np.ndarray | None,
                    price: np.ndarray | None) -> np.ndarray:
    """:func:`allocate_roots` on checked inputs (``v`` probabilities, ``budget`` and ``min_group`` >= 1
    counts, ``max_group`` None or >= ``min_group``, ``kappa`` and ``price`` positive, not both): the
    solver, which trusts its caller; the budget's split is checked here, where it is known."""
    n = len(v)
    capped = max_group is not None
    if not capped:
        max_group = max(budget, min_group)
    if price is not None:
        units = _priced.units_within(budget, price).astype(np.int64)
        hi = max_group if capped else max(int(units.max(initial=0)), min_group)
        if n and np.all(price == price[0]) and _splittable(n, int(units[0]), min_group, hi):
            return _allocate_roots(v, int(units[0]), min_group, hi, None, None)
        return _priced.priced_roots(v, price, budget, min_group, hi)
    check_root_budget(n, budget, min_group, max_group)
    if budget == 0:
        return np.zeros(n, dtype=np.int64)
    return _solve_roots(v, kappa, budget, min_group, min(max_group, budget))


def _splittable(n: int, budget: int, min_group: int, max_group: int) -> bool:
    try:
        check_root_budget(n, budget, min_group, max_group)
    except ValueError:
        return False
    return True


_SMALL_TABLE = 8192  # table entries below which one table beats the closed form's fixed cost (~0.5 ms)


def _solve_roots(v, kappa, B: int, L: int, U: int, *, method: str = "auto") -> np.ndarray:
    """Dispatch: the closed form for mixed(v, m), the doubling table for a Beta posterior.

    ``method="table"`` forces the doubling table for the plain objective too (the reference the tests
    hold the closed form to, and the benchmark's "table" column), ``"closed_form"`` the closed form;
    ``"auto"`` builds one table when it is small (n (K + 1) <= ``_SMALL_TABLE`` entries for K = 2 ceil(B /
    n) + 8 columns: a few hundred prompts), where a dozen NumPy calls cost less than the closed form's
    few hundred, and uses the closed form otherwise or when that table turns out too short.
    """
    n = len(v)
    if kappa is not None:
        return _solve_threshold_problem(lambda K: _beta_mixed_table(v, kappa, L, K), n, B, L, U)
    if method == "table":
        return _solve_threshold_problem(lambda K: _mixed_table(v, L, K), n, B, L, U)
    K = min(U - L, 2 * -(-B // n) + 8)
    if method == "auto" and n * (K + 1) <= _SMALL_TABLE:
        solution = _solve_with_table(_mixed_table(v, L, K), B, L, U)
        if solution is not None:
            return solution
    return _solve_closed_form(v, B, L, U)


# ---------------------------------------------------------------------------------------------------
# Prefix allocation
# ---------------------------------------------------------------------------------------------------


class PrefixAllocation(NamedTuple):
    """Continuation counts per anchor, and the part of each prompt's budget that could not be placed.

    Attributes
    ----------
    k : ndarray of int64, shape (n_anchors,)
        Continuations to sample from each anchor.
    unspent : ndarray of int64, shape (n_prompts,)
        Budget of each prompt left over: all of it when the prompt has no anchors (every rollout ended
        after one turn), or what exceeds the anchors' caps. The caller decides where it goes (for
        equal-budget comparisons it must be spent elsewhere, for example as extra root rollouts).
    """

    k: np.ndarray
    unspent: np.ndarray


def allocate_prefixes(v, r, prompt, budget, *, max_per_anchor=None, start=None, cost=None):
    """Exactly optimal continuation counts per prefix, within each prompt's budget.

    Parameters
    ----------
    v : array_like, shape (n_anchors,)
        Predicted success probability at each anchor (a non-terminal prefix of a bare rollout).
    r : array_like, shape (n_anchors,)
        Reward of the factual rollout through each anchor.
    prompt : array_like of int, shape (n_anchors,)
        Prompt id of each anchor, in [0, len(budget)).
    budget : array_like of int, shape (n_prompts,)
        Continuation budget of each prompt (m_i N in the paper).
    max_per_anchor : int, optional
        Cap on continuations per anchor.
    start : array_like of int, shape (n_anchors,), optional
        Continuations already placed at each anchor (a pass that continues an earlier one, as the
        policies' pooling pass does): the gains continue from q^start (1 - q), and ``max_per_anchor``
        caps start + k.
    cost : array_like, shape (n_anchors,), optional
        Price c_a > 0 of one continuation from each anchor (expected tokens of its remaining turns), in
        the unit of ``budget`` (for example, rollouts of the anchor's prompt: a continuation from depth
        d of a T-turn rollout costs about (T - d) / T). None (default): every continuation costs 1.

    Returns
    -------
    PrefixAllocation
        ``k`` maximising sum_a flip(v_a, r_a, k_a) subject to sum of k over each prompt's anchors =
        budget minus ``unspent``; ``unspent`` is non-zero only for prompts without anchors or whose
        anchors are all capped. Priced in tokens: sum of c_a k_a over each prompt's anchors <= budget,
        and ``unspent`` = floor(budget - spend), the whole rollouts' worth left.

    Notes
    -----
    PAPER.md, "Local prefix expansion". flip is concave in k from k = 0 (gain q^k (1 - q) with
    q = r v + (1 - r)(1 - v)), so taking the largest marginal gains is exact. Per prompt we find the
    water level t = log lambda by vectorised bisection across all prompts at once, with the count
    below a level in closed form, #{k : q^k (1 - q) > lambda} = ceil(log(lambda / (1 - q)) / log q);
    the last units are the ties at the level, which go to lower anchor indices first.

    Priced in tokens (``cost``): max sum_a flip(v_a, r_a, k_a) s.t. sum_a c_a k_a <= B per prompt, a
    knapsack with concave items. Units are taken in decreasing gain per token q^k (1 - q) / c_a (ties:
    lower anchor) while the spend fits, stopping at the first unit that does not. This is optimal among
    allocations spending at most what it spends, and short of the optimum at the full budget by less
    than the gain of the first unit that did not fit (< 1 flip); with equal prices it is exact
    (``trace_theory._priced``).

    Examples
    --------
    A failed rollout through a promising prefix is the best place to branch:

    >>> out = allocate_prefixes([0.9, 0.9, 0.5], [0, 1, 1], [0, 0, 0], [3])
    >>> out.k.tolist(), out.unspent.tolist()
    ([1, 0, 2], [0])

    Priced in tokens, a continuation from a deeper anchor (a third of a rollout) is worth buying thrice:

    >>> allocate_prefixes([0.5, 0.5], [1, 1], [0, 0], [2], cost=[1.0, 1 / 3]).k.tolist()
    [1, 3]
    """
    v, r, prompt, budget = _prefix_inputs(v, r, prompt, budget)
    cap = np.inf if max_per_anchor is None else float(_checks.count("max_per_anchor", max_per_anchor))
    q = np.subtract(1.0, r)  # q = r v + (1 - r)(1 - v), with two temporaries
    q *= np.subtract(1.0, v)
    q += r * v
    if start is not None:
        start = _checks.counts("start", _checks.vector("start", start, dtype=None))
        _checks.same_length(v=v, start=start)
        if (start > cap).any():
            raise ValueError(f"`start` must not exceed `max_per_anchor` ({max_per_anchor}), got {int(start.max())}")
    if cost is not None:
        price = _checks.positive("cost", _checks.vector("cost", cost))
        _checks.same_length(v=v, cost=price)
    if not budget.any():  # nothing to place (eager expansion with no reserve, at a tree's end)
        return PrefixAllocation(k=np.zeros(len(v), dtype=np.int64), unspent=np.zeros(len(budget), dtype=np.int64))
    if cost is not None:
        start = np.zeros(len(v), dtype=np.int64) if start is None else start
        k, unspent = _priced.priced_prefixes(q, price, prompt, budget, cap - start, start)
        return PrefixAllocation(k=k, unspent=unspent)
    if start is None:
        return water_fill(q, prompt, budget, room=cap)
    return water_fill(q, prompt, budget, room=cap - start, start=start)


def _prefix_inputs(v, r, prompt, budget):
    """The inputs of a prefix allocation, checked: (v, r, prompt, budget) as arrays (also the policies')."""
    v = _checks.probabilities("v", _checks.vector("v", v))
    r = _checks.probabilities("r", _checks.vector("r", r))
    prompt = _checks.counts("prompt", _checks.vector("prompt", prompt, dtype=None))
    budget = _checks.counts("budget", _checks.vector("budget", budget, dtype=None))
    _checks.same_length(v=v, r=r, prompt=prompt)
    n_prompts = len(budget)
    if prompt.size and prompt.max() >= n_prompts:
        raise ValueError(f"`prompt` ids must lie in [0, {n_prompts - 1}] (one budget per prompt), got {int(prompt.max())}")
    return v, r, prompt, budget


def water_fill(q, group, budget, *, room, start=None) -> PrefixAllocation:
    """Per group, take the ``budget`` largest gains q^k (1 - q), k = start, start + 1, ... (at most ``room``).

    The engine of :func:`allocate_prefixes`, exposed so that a second pass can continue from counts
    already placed (``start``) with the room left under a cap (``room``: per anchor, or one number for
    all). Gains are compared on the log scale, log gain = k log q + log(1 - q), so nothing underflows;
    ties go to lower anchor ids.
    """
    q = np.asarray(q, dtype=float)
    group = np.asarray(group, dtype=np.int64)
    budget = np.asarray(budget, dtype=np.int64)
    room = np.asarray(room, dtype=float)  # a scalar: the same room for every anchor
    if room.ndim and room.size and np.isposinf(room).all():
        room = np.asarray(np.inf)  # no cap anywhere: the scalar path skips a clip per counting pass
    if start is not None and not np.any(start):
        start = None  # gains from q^0 (1 - q): the same units, without continuing each anchor's sequence
    k, placed = _water_fill.fill(q, group, budget, room, start)
    return PrefixAllocation(k=k, unspent=budget - placed)
