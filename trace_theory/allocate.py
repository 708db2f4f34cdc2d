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

The DP only ever sees prompts whose utility sits close to lambda*.

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

from . import _checks

__all__ = ["allocate_roots", "allocate_prefixes", "root_utility", "PrefixAllocation", "check_root_budget", "water_fill"]

_TIE = 1e-12  # values closer than this are treated as equal


# ---------------------------------------------------------------------------------------------------
# Utility tables: F_i(m) for m = L .. L + K, per prompt
# ---------------------------------------------------------------------------------------------------


def _mixed_table(v: np.ndarray, L: int, K: int) -> np.ndarray:
    """F[i, j] = mixed(v_i, L + j) for j = 0..K.

    F(L) comes from the expm1 form (accurate for tiny v); the rest is F(L) plus running sums of the
    gains v^m (1 - v) + (1 - v)^m v, whose powers are running products (cheaper than ``np.power``).
    """
    from .contrast import mixed_probability

    n = len(v)
    table = np.empty((n, K + 1))
    table[:, 0] = mixed_probability(v, L)
    if K:
        w = 1.0 - v
        gains = np.cumprod(np.broadcast_to(v[:, None], (n, K)), axis=1)  # v^(j+1)
        gains *= (v ** (L - 1) * w)[:, None]  # v^m (1 - v), m = L + j
        other = np.cumprod(np.broadcast_to(w[:, None], (n, K)), axis=1)
        other *= (w ** (L - 1) * v)[:, None]  # (1 - v)^m v
        gains += other
        np.cumsum(gains, axis=1, out=table[:, 1:])
        table[:, 1:] += table[:, :1]
    return table


def _beta_mixed_table(v: np.ndarray, kappa: np.ndarray, L: int, K: int) -> np.ndarray:
    """F[i, j] = E[mixed(p, L + j)] for p ~ Beta(v_i kappa_i, (1 - v_i) kappa_i).

    E[p^m] = prod_{j<m} (a + j) / (a + b + j); the running product also covers v in {0, 1}
    (a point mass), where the Beta function form is undefined.
    """
    a, b = (v * kappa)[:, None], ((1.0 - v) * kappa)[:, None]
    j = np.arange(L + K)[None, :]
    ratio_a = (a + j) / (a + b + j)
    ratio_b = (b + j) / (a + b + j)
    ones = np.ones((len(v), 1))
    ea = np.cumprod(np.concatenate([ones, ratio_a], axis=1), axis=1)[:, L:]  # E[p^m], m = L..L+K
    eb = np.cumprod(np.concatenate([ones, ratio_b], axis=1), axis=1)[:, L:]
    m = L + np.arange(K + 1)
    table = 1.0 - ea - eb
    table[:, m < 2] = 0.0
    return np.maximum(table, 0.0)


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


def allocate_roots(v, budget, *, min_group=2, max_group=None, concentration=None):
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

    Returns
    -------
    ndarray of int64, shape (n,)
        m_i in {0} U [min_group, max_group], summing to ``budget``, maximising sum_i mixed(v_i, m_i).

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

    Examples
    --------
    Budget goes to prompts with mixed outcomes likely; certain successes and failures are filtered out:

    >>> allocate_roots([0.0, 0.5, 0.97, 1.0, 0.3], 12).tolist()
    [0, 5, 0, 0, 7]
    >>> allocate_roots([0.5, 0.5, 0.5], 5).tolist()  # 2 + 3 beats 5 on one prompt
    [3, 2, 0]
    """
    v = _checks.vector("v", v)
    v = _checks.probabilities("v", v)
    n = len(v)
    budget = _checks.count("budget", budget)
    min_group = _checks.count("min_group", min_group)
    if min_group < 1:
        raise ValueError(f"`min_group` must be at least 1, got {min_group}")
    if max_group is None:
        max_group = max(budget, min_group)
    else:
        max_group = _checks.count("max_group", max_group)
        if max_group < min_group:
            raise ValueError(f"`max_group` ({max_group}) must be at least `min_group` ({min_group})")
    kappa = None
    if concentration is not None:
        kappa = _checks.per_item("concentration", concentration, n, _checks.positive).astype(float)
    check_root_budget(n, budget, min_group, max_group)
    if budget == 0:
        return np.zeros(n, dtype=np.int64)
    return _solve_roots(v, kappa, budget, min_group, min(max_group, budget))


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


def _solve_threshold_problem(table, n: int, B: int, L: int, U: int, *, start: int | None = None) -> np.ndarray:
    """max sum F_i(m_i) s.t. sum m_i = B, m_i in {0} U [L, U], F_i concave on [L, U], F_i(0) = 0.

    ``table(K)`` returns F_i(L + j) for j = 0..K. We start with a short table (a few times the mean
    group, or ``start`` columns) and double it in the rare case that the answer could lie beyond its end.
    Its cost grows with the widest group; ``_solve_closed_form`` avoids that where F has a closed form.
    """
    K = min(U - L, start or 2 * -(-B // n) + 8)
    while True:
        solution = _solve_with_table(table(K), B, L, U)
        if solution is not None:
            return solution
        K = min(U - L, 2 * K)


def _solve_with_table(F: np.ndarray, B: int, L: int, U: int) -> np.ndarray | None:
    """Solve from F[i, j] = F_i(L + j), j = 0..K; None when the table is too short to be sure."""
    n, W = F.shape
    complete = L + W - 1 == U
    m_col = L + np.arange(W)
    gains = np.diff(F, axis=1)  # gains[:, j] = F(L + j + 1) - F(L + j)
    # Beyond the table a row gains at most its last tabulated gain; a zero gain stays zero for ever.
    last_gain = gains[:, -1] if W > 1 else np.zeros(n)

    lam = _relaxed_threshold(F, gains, L, B, complete)
    if lam is None:
        return None

    # Start from the exact maximiser x0 of phi_i(m) = F_i(m) - lam m over {0} U [L, L + K]: the smallest
    # count within _TIE of the maximum (0 unless the maximum is positive), so every loss is >= 0.
    phi = F - lam * m_col
    phi_best = np.maximum(phi.max(axis=1), 0.0)
    near_best = phi >= phi_best[:, None] - _TIE
    active = phi_best > _TIE
    x0 = np.where(active, L + np.argmax(near_best, axis=1), 0)
    if not complete and (active & near_best[:, -1] & (last_gain > lam + _TIE)).any():
        return None  # phi may keep rising past the table
    delta = B - int(x0.sum())
    if delta == 0:
        return x0.astype(np.int64)
    if delta > 0:
        filled = _zero_loss_fill(phi, near_best, active, x0, last_gain, lam, delta, L, U, complete)
        if filled is not None:
            return filled
    return _loss_bounded_dp(phi, phi_best, x0, last_gain, lam, delta, L, U, complete)


def _relaxed_threshold(F, gains, L: int, B: int, complete: bool) -> float | None:
    """lambda*: the B-th largest unit value of the concave-envelope relaxation (None: table too short)."""
    n, W = F.shape
    block = _envelope_block(F, L)
    if block is None:
        if not complete:
            return None  # the chord F(m) / m may still rise beyond the table
        block = W - 1 - np.argmax((F / (L + np.arange(W)))[:, ::-1], axis=1)
    rho = F[np.arange(n), block] / (L + block)
    # Unit values: each block repeated, then the tail gains (gains inside a block are not units).
    values = np.concatenate([np.repeat(rho, L + block), gains.ravel()])
    tails = values[rho.size and int((L + block).sum()):].reshape(gains.shape)
    inside = min(W - 1, int(block.max(initial=0)))
    np.copyto(tails[:, :inside], -np.inf, where=np.arange(inside)[None, :] < block[:, None])
    n_units = values.size - int((block.clip(max=W - 1)).sum())
    if n_units < B:
        return None
    values.partition(values.size - B)
    lam = float(values[values.size - B])
    if not complete and W > 1 and (gains[:, -1] > lam).any():
        return None  # untabulated units could outrank lambda*
    return lam


def _envelope_block(F: np.ndarray, L: int) -> np.ndarray | None:
    """Column of the maximum of the chord F(m) / m per row, or None if some row still rises at the end.

    The chord of a function concave on [L, U] with F(0) = 0 rises, then falls; we take its first descent.
    Rounding can make a flat chord wobble; any column near the top is good enough here because it only
    sets lambda*, and the repair that follows is exact for any lambda*.
    """
    n, W = F.shape
    head = min(W, 8)
    chord = F[:, :head] / (L + np.arange(head))
    falls = chord[:, 1:] < chord[:, :-1] * (1.0 - 1e-9)
    has_fall = falls.any(axis=1) if head > 1 else np.ones(n, bool)
    block = np.where(has_fall, np.argmax(falls, axis=1) if head > 1 else 0, head - 1)
    rest = np.flatnonzero(~has_fall)
    if rest.size and head < W:
        chord = F[rest] / (L + np.arange(W))
        falls = chord[:, 1:] < chord[:, :-1] * (1.0 - 1e-9)
        found = falls.any(axis=1)
        if (~found & (chord[:, -1] > chord[:, -2] * (1.0 + 1e-9))).any():
            return None
        block[rest] = np.where(found, np.argmax(falls, axis=1), W - 1)
    return block


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x) - x


def _zero_loss_fill(phi, near_best, active, x0, last_gain, lam, delta, L, U, complete):
    """Spend ``delta`` on counts that cost nothing (phi stays at its maximum); optimal when it succeeds.

    Free moves are (a) extra units for an active prompt while phi stays at its maximum, and
    (b) activating an inactive prompt at a count where phi is 0, its value when off. Both sets are
    intervals, because phi is concave on [L, U]. Ties go to lower prompt indices.
    """
    n, W = phi.shape
    # Rows whose table ends on a flat stretch at lam = 0 stay flat up to U (gains never rise again).
    endless = (not complete) & (lam <= _TIE) & (np.abs(last_gain) <= _TIE) & near_best[:, -1]
    top = np.where(endless, U, L + W - 1 - np.argmax(near_best[:, ::-1], axis=1))  # last free count
    free_units = np.where(active, top - x0, 0)
    jump = ~active & near_best.any(axis=1)
    lo = np.where(jump, L + np.argmax(near_best, axis=1), 0)
    return _spend_free(x0, free_units, jump, lo, np.where(jump, top, 0), delta)


def _spend_free(x0, free_units, jump, lo, hi, delta):
    """x0 plus ``delta`` units placed at no loss: activations of the ``jump`` prompts (at a count in
    [lo, hi]) in index order while free units alone fall short, then ``free_units`` in index order;
    None when that cannot add up to ``delta``."""
    m = x0.copy()
    need = delta - int(free_units.sum())
    if need > 0:  # free units alone do not suffice: activate free prompts in index order
        order = np.flatnonzero(jump)
        k = int(np.searchsorted(np.cumsum(hi[order]), need)) + 1
        if k > len(order):
            return None
        chosen = order[:k]
        if int(lo[chosen].sum()) > delta:
            return None
        room = hi[chosen] - lo[chosen]
        extra = need - int(lo[chosen].sum())
        m[chosen] = lo[chosen] + np.clip(extra - _exclusive_cumsum(room), 0, room)
    rest = delta - int((m - x0).sum())
    m += np.clip(rest - _exclusive_cumsum(free_units), 0, free_units)
    if int(m.sum()) != int(x0.sum()) + delta:
        return None
    return m.astype(np.int64)


def _loss_bounded_dp(phi, phi_best, x0, last_gain, lam, delta, L, U, complete):
    """Cheapest deviation from x0 that moves the total by ``delta``; exact (see the module docstring)."""
    n, W = phi.shape
    m_col = L + np.arange(W)
    loss = phi_best[:, None] - phi  # >= 0: the loss of giving prompt i the count L + j
    loss_off = phi_best  # the loss of giving it 0

    def options_within(eps):
        cheap = loss <= eps + _TIE
        cheap_off = loss_off <= eps + _TIE
        grows_past = (~complete) & cheap[:, -1] & (last_gain > 0)
        if grows_past.any():
            return None  # cheap counts may continue past the end of the table
        flat_past = (~complete) & cheap[:, -1] & (last_gain <= 0)  # beyond: loss rises by lam per unit
        options = []
        for i in np.flatnonzero(cheap.sum(axis=1) + cheap_off + flat_past > 1).tolist():
            opts = [(int(m_col[j]), float(loss[i, j])) for j in np.flatnonzero(cheap[i])]
            if cheap_off[i]:
                opts.append((0, float(loss_off[i])))
            if flat_past[i]:
                # Zero gains beyond the table: count c costs loss_last + lam (c - last); keep the
                # counts within eps, and never more than the whole deviation could need.
                last = L + W - 1
                reach = U if lam <= _TIE else min(U, last + int((eps - loss[i, -1]) / lam))
                reach = min(reach, int(x0[i]) + abs(delta) + int(x0.sum()))
                opts += [(c, float(loss[i, -1] + lam * (c - last))) for c in range(last + 1, reach + 1)]
            options.append((i, _deviations(opts, int(x0[i]))))
        return options

    positive = loss[loss > _TIE]
    eps = float(positive.min()) if positive.size else _TIE
    worst = float(loss.max(initial=0.0)) + float(loss_off.max(initial=0.0)) + 1.0
    return _cheapest_deviation(options_within, eps, worst, x0, delta)


def _deviations(opts, x0_i):
    """(count, loss) options of one prompt as (count - x0_i, loss >= 0), cheapest and smallest first."""
    return sorted(((c - x0_i, max(cost, 0.0)) for c, cost in opts), key=lambda o: (o[1], abs(o[0]), o[0]))


def _cheapest_deviation(options_within, eps, worst, x0, delta):
    """Enlarge eps until the cheapest combination of counts each within loss eps costs at most eps.

    ``options_within(eps)`` lists (prompt, deviations) for the prompts with more than one count of loss
    <= eps (None: unknown, give up); ``worst`` bounds every loss (no solution beyond it is a bug).
    """
    while True:
        options = options_within(eps)
        if options is None:
            return None
        best = _min_loss_combination(options, delta)
        if best is not None and best[0] <= eps + _TIE:
            m = x0.copy()
            for i, d in best[1].items():
                m[i] = x0[i] + d
            return m.astype(np.int64)
        if best is not None:
            eps = best[0]  # every better allocation uses only counts within this loss: one more pass
        elif eps > worst:
            raise AssertionError("no feasible allocation found; check_root_budget should have caught this")
        else:
            eps = 4.0 * eps


# ---------------------------------------------------------------------------------------------------
# Root allocation without a table: the same three steps on the closed form
# ---------------------------------------------------------------------------------------------------

_LOG_TINY = float(np.log(np.nextafter(0.0, 1.0)))  # log of the smallest positive double, about -744.4
_PAD = 1e-11  # log-scale margin: covers the rounding of log gains and of T inv + beta (~1e-16 * 1500 |inv|)
_ROOT_SLACK = 1.0  # stop narrowing the threshold's bracket once it holds <= _ROOT_SLACK n + 16 extra units


class _UnitCounter(NamedTuple):
    """Units per prompt whose D-based value is >= e^T: 0 if log_rho < T, else
    m^ + min(max(floor(T inv + beta), 0), room) (``_MixedRows.counter`` folds the margins into beta and
    log_rho)."""

    inv: np.ndarray
    beta: np.ndarray
    log_rho: np.ndarray
    m_hat: int
    room: int

    def __call__(self, T: float) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            k = np.floor(T * self.inv + self.beta)
        np.maximum(k, 0.0, out=k)
        np.minimum(k, self.room, out=k)
        k += self.m_hat
        return np.where(self.log_rho >= T, k, 0.0)

    def subset(self, keep: np.ndarray) -> "_UnitCounter":
        return _UnitCounter(self.inv[keep], self.beta[keep], self.log_rho[keep], self.m_hat, self.room)


class _MixedRows:
    """mixed(v_i, m) = F_i(m) for every prompt, its gains and its relaxation's units, from two logs.

    F(m) = 1 - v^m - (1 - v)^m = -expm1(m log1p(-v)) - exp(m log v) and the gain
    g(m) = F(m + 1) - F(m) = exp(m log v + log1p(-v)) + exp(m log1p(-v) + log v), decreasing for m >= 1.
    The relaxation's units of prompt i (``_relaxed_threshold``): unit j = 1 .. m^ is worth
    rho = F(m^) / m^ with m^ = min(U, max(L, 3)) (the chord F(m) / m is v (1 - v) at m = 2 and 3 and falls
    after), unit j > m^ is worth g(j - 1). Writing s = max(v, 1 - v) and r = min(v, 1 - v) / s,

        log g(m) = D(m) + log1p(r^(m - 1)),   D(m) = log(v (1 - v)) + (m - 1) log s,

    and 0 <= log1p(r^(m - 1)) <= c = log1p(r^(m^ - 1)) for m >= m^, so counting the units above a level
    with D alone gives a lower bound, and with D shifted by c an upper bound; the two differ by at most
    c / -log s <= 2 units per prompt (-log s >= 1 - s = r s and r^(m^ - 1) <= r^2).
    """

    def __init__(self, v: np.ndarray, L: int, U: int):
        self.n, self.L, self.U = len(v), L, U
        with np.errstate(divide="ignore"):
            self.lv, self.l1v = np.log(v), np.log1p(-v)
        self.m_hat = m_hat = min(U, max(L, 3))
        with np.errstate(divide="ignore", invalid="ignore"):
            lab = self.lv + self.l1v  # log v (1 - v)
            if m_hat in (2, 3):  # F(2) / 2 = F(3) / 3 = v (1 - v)
                self.rho, self.log_rho = v * (1.0 - v), lab
            else:
                self.rho = self.F(slice(None), float(m_hat)) / m_hat
                self.log_rho = np.log(self.rho)
            ls = np.minimum(np.maximum(self.lv, self.l1v), -1e-300)  # s within rounding of 1: flat gains
            lr = -np.abs(self.lv - self.l1v)  # log r
            self.inv = 1.0 / ls
            # units >= e^T among the gains: #{m in [m^, U - 1] : D(m) >= T} = floor(T inv + beta), clipped
            self.beta = 2.0 - m_hat - lab * self.inv
            self.c = np.log1p(np.exp((m_hat - 1) * lr)) if m_hat > 1 else np.full(self.n, np.log(2.0))

    def F(self, rows, m):
        """F_i(m) for the prompts ``rows`` and counts m >= 1 (float or int arrays that broadcast)."""
        with np.errstate(invalid="ignore", over="ignore"):
            out = m * self.l1v[rows]
            np.expm1(out, out=out)
            out += np.exp(m * self.lv[rows])
        np.negative(out, out=out)
        np.maximum(out, 0.0, out=out)
        return out if self.L >= 2 else np.where(m >= 2, out, 0.0)

    def gain(self, rows, m):
        """g_i(m) = F_i(m + 1) - F_i(m) for m >= 1."""
        lv, l1v = self.lv[rows], self.l1v[rows]
        with np.errstate(invalid="ignore"):
            return np.exp(m * lv + l1v) + np.exp(m * l1v + lv)

    def counter(self, *, upper: bool) -> "_UnitCounter":
        """Per prompt, at least (``upper``) or at most its number of units >= e^T, as a function of T."""
        if upper:  # units whose D is >= T - c - pad
            return _UnitCounter(self.inv, self.beta - (self.c + _PAD) * self.inv, self.log_rho + self.c + _PAD, self.m_hat, self.U - self.m_hat)
        return _UnitCounter(self.inv, self.beta + _PAD * self.inv, self.log_rho - _PAD, self.m_hat, self.U - self.m_hat)

    def unit_value(self, rows, j):
        """The value of unit j (1-based) of the prompts ``rows``."""
        return np.where(j <= self.m_hat, self.rho[rows], self.gain(rows, np.maximum(j - 1, 1)))


def _bracket(count: _UnitCounter, B: int, lo: float, hi: float, r_lo, r_hi, slack: float, *, want_at_least: bool):
    """Log levels lo < hi with ``count(lo).sum() >= B > count(hi).sum()``, narrowed until the one asked
    for is near B: with ``want_at_least`` until count(lo) <= B + slack, otherwise until count(hi) >=
    B - slack (or until the bracket is ~1e-12 wide: a jump of the count at one level).

    Secant steps on the total with the Illinois rule, and a bisection after two moves of the same end.
    ``r_lo``, ``r_hi`` are the per-row counts at the ends. Rows whose count is the same at both ends keep
    it inside the bracket; once they are the majority they are summed once and dropped from the passes.
    """
    fixed = 0.0
    c_lo, c_hi = float(r_lo.sum()), float(r_hi.sum())
    goal = B + 0.5 * slack if want_at_least else B - 0.5 * slack
    f_lo, f_hi, side, streak = c_lo - goal, c_hi - goal, 0, 0
    for _ in range(200):
        done = c_lo - B <= slack if want_at_least else B - c_hi <= slack
        if done or hi - lo <= 1e-12 * (1.0 + abs(lo)):
            break
        moves = r_lo != r_hi
        if 2 * int(moves.sum()) < moves.size:
            fixed += float(r_lo[~moves].sum())
            count, r_lo, r_hi = count.subset(moves), r_lo[moves], r_hi[moves]
        frac = 0.5 if streak >= 2 else min(max(f_lo / (f_lo - f_hi), 0.01), 0.99)
        mid = lo + frac * (hi - lo)
        r_mid = count(mid)
        c = fixed + float(r_mid.sum())
        if c >= B:
            lo, r_lo, c_lo, f_lo = mid, r_mid, c, c - goal
            if side == 1:
                f_hi *= 0.5
            streak, side = (streak + 1 if side == 1 else 1), 1
        else:
            hi, r_hi, c_hi, f_hi = mid, r_mid, c, c - goal
            if side == -1:
                f_lo *= 0.5
            streak, side = (streak + 1 if side == -1 else 1), -1
    return lo, hi, c_lo, c_hi


def _closed_form_threshold(v: np.ndarray, B: int, L: int, U: int, rows: _MixedRows | None = None):
    """lambda*, the B-th largest unit value of the relaxation, found without listing all units.

    The D-based counts (``_MixedRows``) bound each prompt's number of units above a level within a
    couple of units. Two Illinois searches on them find log levels T2 <= T1 with at least B units
    >= e^T2 and fewer than B units >= e^T1; the units in between are listed with their exact values,
    at most the B - (units surely >= e^T1) that can still matter per prompt, and partitioned. Returns
    (lambda*, per prompt the number of its units >= lambda*). When fewer than B units are positive,
    lambda* is 0 (then, or within rounding of it, any level serves the exact repair).
    """
    rows = rows or _MixedRows(v, L, U)
    n = rows.n
    lower, upper = rows.counter(upper=False), rows.counter(upper=True)
    top = float(rows.log_rho.max(initial=_LOG_TINY)) + 1.0  # no units at or above e^top
    # Step down from the top by doubling steps until B units are surely above, then narrow.
    hi, r_hi, step = top, np.zeros(n), 1.0
    while True:
        lo = max(top - step, _LOG_TINY)
        r_lo = lower(lo)
        if r_lo.sum() >= B:
            break
        if lo == _LOG_TINY:  # fewer than B units are surely positive
            return 0.0, upper(_LOG_TINY).astype(np.int64)
        hi, r_hi, step = lo, r_lo, 2.0 * step
    slack = _ROOT_SLACK * n + 16
    t2, hi2, _, _ = _bracket(lower, B, lo, hi, r_lo, r_hi, slack, want_at_least=True)
    # Fewer than B units lie surely above hi2, so fewer than B lie above hi2 + max c + margin at all.
    t1_hi = min(top, hi2 + float(rows.c.max(initial=0.0)) + 2 * _PAD)
    up_t2 = upper(t2)
    _, t1, _, _ = _bracket(upper, B, t2, t1_hi, up_t2, upper(t1_hi), slack, want_at_least=False)
    above = lower(t1).astype(np.int64)  # units surely >= e^T1 > lambda*
    need = B - int(above.sum())
    listed = np.minimum(up_t2.astype(np.int64) - above, need)
    owner = np.repeat(np.arange(n), listed)
    j = above[owner] + 1 + np.arange(owner.size) - np.repeat(np.cumsum(listed) - listed, listed)
    values = rows.unit_value(owner, j)
    assert 0 < need <= values.size, "the bracket of the root threshold does not hold it"
    lam = float(np.partition(values, values.size - need)[values.size - need])
    return lam, above + np.bincount(owner, values >= lam, n).astype(np.int64)


def _last_true(pred, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, the largest m in [lo, hi] with pred(m) true, for pred true at lo and true-then-false."""
    lo, hi = lo.copy(), hi.copy()
    while (lo < hi).any():
        mid = (lo + hi + 1) // 2
        ok = pred(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
    return lo


def _first_true(pred, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, the smallest m in [lo, hi] with pred(m) true, for pred true at hi and false-then-true."""
    lo, hi = lo.copy(), hi.copy()
    while (lo < hi).any():
        mid = (lo + hi) // 2
        ok = pred(mid)
        lo, hi = np.where(ok, lo, mid + 1), np.where(ok, mid, hi)
    return hi


def _reach(phi, rows, start, floor, step: int, limit: int) -> np.ndarray:
    """Per row, the count farthest from ``start`` towards ``limit`` (step -1 or +1) with phi >= floor.

    phi is concave and >= floor at ``start``, so the counts that pass form an interval; we probe the
    next two counts (the usual case ends there) and bisect towards ``limit`` for the rows that pass both.
    """
    end = start.copy()
    live = np.flatnonzero(start != limit)
    for _ in range(2):
        cand = end[live] + step
        ok = phi(rows[live], cand) >= floor[live]
        live = live[ok]
        end[live] = cand[ok]
        live = live[end[live] != limit]
        if not live.size:
            return end
    r, f = rows[live], floor[live]
    edge = np.full(live.size, limit)
    if step < 0:
        end[live] = _first_true(lambda m: phi(r, m) >= f, edge, end[live])
    else:
        end[live] = _last_true(lambda m: phi(r, m) >= f, end[live], edge)
    return end


def _solve_closed_form(v: np.ndarray, B: int, L: int, U: int) -> np.ndarray:
    """``_solve_with_table`` for F = mixed(v, m) without a table: O(n) work per pass, a few dozen passes.

    phi_i(m) = F_i(m) - lambda* m is concave on [L, U], so every set the table solver reads off a row
    (the counts within a loss of the best) is an interval around phi's peak. The threshold search
    leaves each prompt's unit count at lambda*, which is its peak up to rounding; a local search
    confirms the peak and probes the interval's ends next to it, bisecting only where an interval is
    long (flat rows). Only the counts the dynamic programme must weigh are evaluated beyond that.
    """
    n = len(v)
    rows = _MixedRows(v, L, U)
    lam, units = _closed_form_threshold(v, B, L, U, rows)
    phi = lambda r, m: rows.F(r, m) - lam * m
    every = np.arange(n)

    # The peak of phi: the unit count at lambda*, moved while a neighbour is higher (rounding). The
    # values next to the peak are kept: they settle most rows' zero-loss intervals below.
    top = np.clip(np.where(units > 0, units, rows.m_hat), L, U)

    def around(r, t):
        """phi at t - 1, t, t + 1 for the prompts r (-inf outside [L, U])."""
        m = t[:, None] + np.arange(-1, 2)[None, :]
        out = phi(r[:, None], np.clip(m, L, U))
        out[(m < L) | (m > U)] = -np.inf
        return out.T

    p_down, phi_top, p_up = around(every, top)
    live = every
    for _ in range(8):
        move = np.where(p_up[live] > phi_top[live], 1, np.where(p_down[live] > phi_top[live], -1, 0))
        moving = move != 0
        if not moving.any():
            break
        live = live[moving]
        top[live] += move[moving]
        p_down[live], phi_top[live], p_up[live] = around(live, top[live])
    else:  # far from the unit count (lambda* within rounding of 0): bisect on the gains, then look around
        t = 1 + _last_true(lambda m, r=live: (m < L) | (rows.gain(r, m) > lam), np.full(live.size, L - 1), np.full(live.size, U - 1))
        near = np.clip(t[:, None] + np.arange(-1, 2)[None, :], L, U)
        top[live] = near[np.arange(live.size), np.argmax(phi(live[:, None], near), axis=1)]
        p_down[live], phi_top[live], p_up[live] = around(live, top[live])
    phi_best = np.maximum(phi_top, 0.0)
    active = phi_best > _TIE

    def within(loss):
        """Ends [a, b] of the counts with phi >= phi_best - loss (a > b when there are none)."""
        floor = phi_best - loss
        has = phi_top >= floor
        a, b = np.where(has, top, U + 1), np.where(has, top, U)
        r = np.flatnonzero(has & (p_down >= floor))
        a[r] = _reach(phi, r, top[r] - 1, floor[r], -1, L)
        r = np.flatnonzero(has & (p_up >= floor))
        b[r] = _reach(phi, r, top[r] + 1, floor[r], +1, U)
        return a, b

    first, last = within(_TIE)
    x0 = np.where(active, first, 0)
    delta = B - int(x0.sum())
    if delta == 0:
        return x0.astype(np.int64)
    if delta > 0:
        jump = ~active & (first <= last)
        filled = _spend_free(x0, np.where(active, last - x0, 0), jump, np.where(jump, first, 0), np.where(jump, last, 0), delta)
        if filled is not None:
            return filled

    def options_within(eps):
        a, b = within(eps + _TIE)
        cheap_off = phi_best <= eps + _TIE
        options = []
        reach = abs(delta) + int(x0.sum())  # no feasible deviation is larger
        for i in np.flatnonzero(np.maximum(b - a + 1, 0) + cheap_off > 1).tolist():
            counts = np.arange(a[i], min(b[i], x0[i] + reach) + 1)
            losses = phi_best[i] - phi(np.full(counts.size, i), counts)
            opts = list(zip(counts.tolist(), losses.tolist())) + ([(0, float(phi_best[i]))] if cheap_off[i] else [])
            options.append((i, _deviations(opts, int(x0[i]))))
        return options

    # The smallest positive loss sits next to the zero-loss interval (or at the peak when it is empty).
    below = np.where((first <= last) & (first > L), phi_best - phi(every, np.maximum(first - 1, L)), np.inf)
    above = np.where((first <= last) & (last < U), phi_best - phi(every, np.minimum(last + 1, U)), np.inf)
    alone = np.where(first > last, phi_best - phi_top, np.inf)
    eps = float(np.min(np.concatenate([below, above, alone]), initial=np.inf))
    eps = eps if np.isfinite(eps) else _TIE
    worst = float((phi_best - np.minimum(phi(every, np.full(n, L)), phi(every, np.full(n, U)))).max(initial=0.0))
    return _cheapest_deviation(options_within, eps, worst + float(phi_best.max(initial=0.0)) + 1.0, x0, delta)


def _min_loss_combination(options, delta):
    """Min-loss choice of one option per item with deviations summing to ``delta`` (a small DP)."""
    if not options:
        return None if delta else (0.0, {})
    lo_suffix = np.cumsum([min(d for d, _ in opts) for _, opts in options][::-1])[::-1].tolist() + [0]
    hi_suffix = np.cumsum([max(d for d, _ in opts) for _, opts in options][::-1])[::-1].tolist() + [0]
    states = {0: 0.0}
    back = []
    for k, (_, opts) in enumerate(options):
        nxt: dict[int, float] = {}
        choice: dict[int, tuple[int, int]] = {}
        lo_rest, hi_rest = lo_suffix[k + 1], hi_suffix[k + 1]
        for s, acc in states.items():
            for d, c in opts:
                t = s + d
                if not (delta - hi_rest <= t <= delta - lo_rest):
                    continue
                total = acc + c
                if t not in nxt or total < nxt[t] - _TIE:
                    nxt[t] = total
                    choice[t] = (s, d)
        states = nxt
        back.append(choice)
        if not states:
            return None
    if delta not in states:
        return None
    picks, s = {}, delta
    for k in range(len(options) - 1, -1, -1):
        s_prev, d = back[k][s]
        if d:
            picks[options[k][0]] = d
        s = s_prev
    return states[delta], picks


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


def allocate_prefixes(v, r, prompt, budget, *, max_per_anchor=None):
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

    Returns
    -------
    PrefixAllocation
        ``k`` maximising sum_a flip(v_a, r_a, k_a) subject to sum of k over each prompt's anchors =
        budget minus ``unspent``; ``unspent`` is non-zero only for prompts without anchors or whose
        anchors are all capped.

    Notes
    -----
    PAPER.md, "Local prefix expansion". flip is concave in k from k = 0 (gain q^k (1 - q) with
    q = r v + (1 - r)(1 - v)), so taking the largest marginal gains is exact. Per prompt we find the
    water level t = log lambda by vectorised bisection across all prompts at once, with the count
    below a level in closed form, #{k : q^k (1 - q) > lambda} = ceil(log(lambda / (1 - q)) / log q);
    the last units are the ties at the level, which go to lower anchor indices first.

    Examples
    --------
    A failed rollout through a promising prefix is the best place to branch:

    >>> out = allocate_prefixes([0.9, 0.9, 0.5], [0, 1, 1], [0, 0, 0], [3])
    >>> out.k.tolist(), out.unspent.tolist()
    ([1, 0, 2], [0])
    """
    v = _checks.probabilities("v", _checks.vector("v", v))
    r = _checks.probabilities("r", _checks.vector("r", r))
    prompt = _checks.counts("prompt", _checks.vector("prompt", prompt, dtype=None))
    budget = _checks.counts("budget", _checks.vector("budget", budget, dtype=None))
    _checks.same_length(v=v, r=r, prompt=prompt)
    n_prompts = len(budget)
    if prompt.size and prompt.max() >= n_prompts:
        raise ValueError(f"`prompt` ids must lie in [0, {n_prompts - 1}] (one budget per prompt), got {int(prompt.max())}")
    cap = np.inf if max_per_anchor is None else float(_checks.count("max_per_anchor", max_per_anchor))
    q = r * v + (1.0 - r) * (1.0 - v)
    return water_fill(q, prompt, budget, room=cap)


_FLOOR = -800.0  # a log-gain below every positive double: units under it count as worthless
_MAX_STEPS = 60  # bracket steps per call (the Illinois rule converges superlinearly)
_SLACK = 1.0  # stop narrowing once a bracket holds <= 1 + _SLACK * target units: sorting them is cheaper


class _Units(NamedTuple):
    """The units of water filling, per anchor: log gain k / inv + a for k = 0, 1, ... (at most room).

    Regular anchors (0 < q < 1) have a = log of the first gain and 1 / inv = log q < 0; a certain
    anchor (q = 0, nothing placed yet) has one unit worth 1 (log gain 0).
    """

    n_groups: int
    g: np.ndarray
    a: np.ndarray
    inv: np.ndarray
    room: np.ndarray
    g_cer: np.ndarray
    room_cer: np.ndarray

    def above(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Units with log gain > t[group], per regular and per certain anchor."""
        reg = np.ceil((t[self.g] - self.a) * self.inv)
        np.maximum(reg, 0.0, out=reg)
        np.minimum(reg, self.room, out=reg)
        return reg, np.where(t[self.g_cer] < 0.0, self.room_cer, 0.0)

    def per_group(self, reg: np.ndarray, cer: np.ndarray) -> np.ndarray:
        counts = np.bincount(self.g, reg, self.n_groups)
        return counts + np.bincount(self.g_cer, cer, self.n_groups) if self.g_cer.size else counts

    def count(self, t: np.ndarray) -> np.ndarray:
        return self.per_group(*self.above(t))

    def of(self, groups: np.ndarray, level: np.ndarray) -> "_Units":
        """The anchors of the groups where the mask ``groups`` is set whose first unit lies above
        ``level[group]`` (the others add nothing above it: their counts there are 0)."""
        r = groups[self.g] & (self.a > level[self.g])
        c = groups[self.g_cer] & (level[self.g_cer] < 0.0)
        room = self.room[r] if np.ndim(self.room) else self.room
        return _Units(self.n_groups, self.g[r], self.a[r], self.inv[r], room, self.g_cer[c], self.room_cer[c])


def _group_max(values: np.ndarray, group: np.ndarray, n_groups: int, is_sorted: bool) -> np.ndarray:
    """max of ``values`` per group (the floor for empty groups); one pass when ``group`` is sorted."""
    out = np.full(n_groups, _FLOOR)
    if not len(group):
        return out
    if is_sorted:
        starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
        out[group[starts]] = np.maximum(np.maximum.reduceat(values, starts), _FLOOR)
    else:
        np.maximum.at(out, group, values)
    return out


def _water_level(units: _Units, target, top, bottom) -> tuple[np.ndarray, np.ndarray]:
    """Per group, log levels lo <= hi with count_above(lo) >= target > count_above(hi), close enough.

    ``units.count(t)`` counts the units whose log gain exceeds t[group]; it falls as t rises, in steps.
    ``top`` (no unit above it) and ``bottom`` (a guess with enough units above it, checked here; the
    floor where it fails) start the bracket. Between breakpoints the count is linear in t (each
    anchor's units are evenly spaced in log gain), so we step to where the line through the two ends
    crosses target - 1/2, halving the weight of an end that stayed put twice (the Illinois rule). A
    group is done when its bracket holds at most 1 + ``_SLACK`` * target units, or is ~1e-9 wide
    (ties at the level); the caller then sorts the bracket exactly, so the allocation does not depend
    on where the bracket ends. Groups without ``target`` units above the floor get lo = hi = floor.
    (Bisection from the floor took 40 passes over all anchors; this takes a handful.) Passes count only
    anchors whose first unit lies above lo, and only those of open groups once these are under half.
    """
    count_above = units.count
    lo, hi = bottom.copy(), top.copy()
    c_lo, c_hi = count_above(lo), np.zeros(len(target))
    low = c_lo < target  # the guess was too high: start from the floor
    if low.any():
        lo[low] = _FLOOR
        c_lo = np.where(low, count_above(lo), c_lo)
    short = c_lo < target
    hi[short] = lo[short] = _FLOOR
    units = units.of(~short & (target > 0), lo)  # every level we try lies above lo
    count_above, live = units.count, int((~short & (target > 0)).sum())
    goal = target - 0.5
    f_lo, f_hi = c_lo - goal, c_hi - goal
    slack = _SLACK * target + 1.0
    side = np.zeros(len(target), np.int8)  # the end that moved last: +1 lo, -1 hi
    open_ = ~short & (target > 0) & (c_lo - c_hi > slack) & (hi - lo > 1e-9)
    for _ in range(_MAX_STEPS):
        n_open = int(open_.sum())
        if n_open == 0:
            break
        if 2 * n_open < live:
            units, live = units.of(open_, lo), n_open
            count_above = units.count
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.clip(f_lo / (f_lo - f_hi), 1e-6, 1 - 1e-6)
        mid = lo + frac * (hi - lo)
        count = count_above(mid)
        moved = np.where(open_, np.where(count >= target, 1, -1), 0).astype(np.int8)
        up, down = moved == 1, moved == -1
        lo, c_lo, f_lo = np.where(up, mid, lo), np.where(up, count, c_lo), np.where(up, count - goal, f_lo)
        hi, c_hi, f_hi = np.where(down, mid, hi), np.where(down, count, c_hi), np.where(down, count - goal, f_hi)
        f_lo = np.where(down & (side == -1), 0.5 * f_lo, f_lo)  # Illinois: the stale end weighs less
        f_hi = np.where(up & (side == 1), 0.5 * f_hi, f_hi)
        side = np.where(moved != 0, moved, side)
        open_ &= (c_lo - c_hi > slack) & (hi - lo > 1e-9)
    # Secant steps can land exactly on a unit's log gain, where the count's rounding is fuzzy; widen
    # the bracket a little so that such units are sorted with their exact gains (the counts stay valid).
    pad = np.where(short, 0.0, 1e-11 * (1.0 + np.abs(lo)))
    return lo - pad, np.minimum(hi + pad, top)


def _order_in_groups(key: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """``np.lexsort((key, group))``: by group, then key, ties in index order.

    When ``group`` is sorted already and the groups are short, each group becomes one row of a padded
    matrix sorted row by row (several times faster than a two-key lexsort of the same items).
    """
    if group.size > 1 and (group[1:] >= group[:-1]).all():
        counts = np.bincount(group, minlength=n_groups)
        width = int(counts.max())
        if n_groups * width <= 8 * group.size + 65536:  # padding at most ~8x the items
            first = np.cumsum(counts) - counts
            rows = np.full((n_groups, width), np.inf)  # padding sorts last; ties keep position order
            rows[group, np.arange(group.size) - first[group]] = key
            order = np.argsort(rows, axis=1, kind="stable")
            return (first[:, None] + order)[np.arange(width)[None, :] < counts[:, None]]
    return np.lexsort((key, group))


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
    n_groups, n = len(budget), len(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        lq, l1q = np.log(q), np.log1p(-q)
        if start is not None:  # gains continue from q^start (1 - q)
            start = np.asarray(start, dtype=float)
            l1q = np.nan_to_num(np.where(start > 0, l1q + start * lq, l1q), nan=-np.inf)
        inv = 1.0 / lq
    if room.ndim:
        room_total = np.bincount(group, weights=np.minimum(room, 1e18), minlength=n_groups)
    else:
        room_total = np.bincount(group, minlength=n_groups) * min(float(room), 1e18)
    target = np.minimum(budget, room_total).astype(np.int64)
    is_regular = (q > 0) & (q < 1)
    every = bool(is_regular.all())
    regular = slice(None) if every else np.flatnonzero(is_regular)
    certain = np.flatnonzero((q == 0) & (start == 0 if start is not None else True))  # one unit worth 1
    pick = (lambda x: x) if every else (lambda x: x[regular])  # noqa: E731
    units = _Units(
        n_groups, pick(group), pick(l1q), pick(inv), pick(room) if room.ndim else room,
        group[certain], np.minimum(room[certain] if room.ndim else np.full(certain.size, room), 1.0),
    )
    g_reg, a_reg, inv_reg, room_reg, g_cer = units.g, units.a, units.inv, units.room, units.g_cer
    units_above, per_group = units.above, units.per_group

    # The level lies below the best first gain of the group, and above the level at which its best
    # anchor alone would supply the whole target (checked: rooms can make that guess too high).
    sorted_groups = bool((g_reg[1:] >= g_reg[:-1]).all())
    top = _group_max(a_reg, g_reg, n_groups, sorted_groups)
    top[g_cer] = 0.0
    t_reg = target[g_reg]
    alone = a_reg + (t_reg - 1) / inv_reg
    if room.ndim or room < np.inf:
        alone = np.where(room_reg >= t_reg, alone, _FLOOR)
    bottom = _group_max(alone, g_reg, n_groups, sorted_groups)
    if n_groups == 1:  # one pooled group (the leftover pass): the target-th best first gain bounds it too
        firsts = a_reg[room_reg >= 1] if np.ndim(room_reg) else a_reg[: a_reg.size * (room_reg >= 1)]
        if 0 < target[0] <= firsts.size:
            bottom = np.maximum(bottom, np.partition(firsts, firsts.size - target[0])[firsts.size - target[0]])
    bottom = np.clip(bottom - 1e-9 * (1.0 + np.abs(bottom)), _FLOOR, top)
    lo, hi = _water_level(units, target, top, bottom)

    reg_hi, cer_hi = units_above(hi)
    if every:
        k = reg_hi
    else:
        k = np.zeros(n)
        k[regular] = reg_hi
    k[certain] = cer_hi
    missing = target - per_group(reg_hi, cer_hi)

    # Units between the levels: enumerate them with their exact log gains, best first within each group,
    # ties to lower anchor ids, and take what each group still misses.
    reg_lo, cer_lo = units_above(lo)
    if every:
        extra = (reg_lo - reg_hi).astype(np.int64)
    else:
        extra = np.zeros(n, dtype=np.int64)
        extra[regular] = (reg_lo - reg_hi).astype(np.int64)
    extra[certain] = (cer_lo - cer_hi).astype(np.int64)
    # Gains fall with k, so an anchor can give its group at most `missing` of these units; for q within
    # rounding of 1 the bracket would otherwise hold ~1e15 near-equal units.
    extra = np.minimum(extra, np.maximum(missing[group], 0).astype(np.int64))
    anchor = np.repeat(np.arange(n), extra)
    kk = k[anchor] + (np.arange(anchor.size) - np.repeat(np.cumsum(extra) - extra, extra))
    with np.errstate(invalid="ignore"):
        log_gain = kk * lq[anchor] + l1q[anchor]  # kk counts from start
    if certain.size:
        log_gain[q[anchor] == 0.0] = 0.0
    g_anchor = group[anchor]
    order = _order_in_groups(-log_gain, g_anchor, n_groups)  # equal gains stay in anchor order
    g_sorted = g_anchor[order]
    per = np.bincount(g_anchor, minlength=n_groups)
    rank = np.arange(order.size) - (np.cumsum(per) - per)[g_sorted]
    chosen = anchor[order[rank < missing[g_sorted]]]
    k += np.bincount(chosen, minlength=n)
    missing = missing - np.bincount(group[chosen], minlength=n_groups)

    # Groups that ran out of worthwhile units (lo stuck at the floor) fill up with worthless ones,
    # in anchor order, up to the cap.
    if (missing > 0).any():
        spare = np.minimum(room - k, missing[group].astype(float))
        order = np.argsort(group, kind="stable")
        rs = spare[order]
        before = np.cumsum(rs) - rs
        before -= before[np.searchsorted(group[order], group[order])]
        k[order] += np.clip(missing[group[order]] - before, 0.0, rs)
    k = np.rint(k).astype(np.int64)
    spent = np.bincount(group, weights=k, minlength=n_groups).astype(np.int64)
    return PrefixAllocation(k=k, unspent=budget - spent)
