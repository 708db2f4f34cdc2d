"""Steps 2 and 3 of the exact root solvers, shared by the table (``_roots_table``) and the closed form
(``_roots_closed_form``): spend the relaxation's shortfall at zero loss, else search for the cheapest
deviation with a loss-bounded dynamic programme (``trace_theory.allocate``'s module docstring).
"""

from __future__ import annotations

import numpy as np

_TIE = 1e-12  # values closer than this are treated as equal


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x) - x


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
