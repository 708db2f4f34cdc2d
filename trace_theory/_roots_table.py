"""The root solver on a table of utilities F_i(L + j): the reference, and the solver for a Beta posterior.

The three steps of ``trace_theory.allocate``'s module docstring, read off the table: the relaxation's
threshold lambda* from a partition of the units, the zero-loss repair, and the loss-bounded dynamic
programme. The table starts a few mean groups wide and doubles when the answer could lie beyond it.
"""

from __future__ import annotations

import numpy as np

from ._roots_repair import _TIE, _cheapest_deviation, _deviations, _spend_free


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
