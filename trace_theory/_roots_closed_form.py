"""The root solver for the plain objective mixed(v, m) without a table: O(n) per pass, a few dozen passes.

The same three steps as the table solver (``trace_theory.allocate``'s module docstring), on the closed
form of F_i: the threshold lambda* is bracketed by secant steps on bounds of the unit counts
(``_MixedRows``), the repair reads the intervals it needs by probing around phi's peak.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._bracketing import illinois, secant_point
from ._numerics import log_one_minus
from ._roots_repair import _TIE, _cheapest_deviation, _deviations, _spend_free

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
            self.lv, self.l1v = np.log(v), log_one_minus(v)
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
        mid = lo + 0.5 * (hi - lo) if streak >= 2 else float(secant_point(lo, hi, f_lo, f_hi, clip=0.01))
        r_mid = count(mid)
        c = fixed + float(r_mid.sum())
        if c >= B:
            lo, r_lo, c_lo, f_lo, moved = mid, r_mid, c, c - goal, 1
        else:
            hi, r_hi, c_hi, f_hi, moved = mid, r_mid, c, c - goal, -1
        streak = streak + 1 if side == moved else 1
        f_lo, f_hi, side = illinois(f_lo, f_hi, moved, side)
        f_lo, f_hi, side = float(f_lo), float(f_hi), int(side)
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
