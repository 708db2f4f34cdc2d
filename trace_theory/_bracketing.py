"""The bracketing steps shared by the threshold searches of both allocators and of eager expansion.

The root solver (``_roots_closed_form._bracket``: one level, the total over all prompts) and the water
filling (``_water_fill._water_level``: one level per group) both look for a level at which a count that
falls in steps as the level rises crosses a target. Both narrow a bracket [lo, hi] by regula falsi with
the Illinois rule: step to where the line through the two ends crosses the goal, and halve the weight of
an end that stays put twice in a row, so that the bracket shrinks from both sides. The root solver's
scalar steps live here; the water filling applies the same rule in place on per-group vectors (in
(level, sqrt(count)), with open groups gathered as they close), where fresh arrays per step cost more
than the arithmetic. Their loops stay with their solvers. Eager expansion's level
(``eager.offline_level``) looks for the largest threshold at which a replayed rule still spends a
target; the spend is a step function of the threshold, so a plain bisection (:func:`bisect_last`) is what
it needs.
"""

from __future__ import annotations

import numpy as np


def secant_point(lo, hi, f_lo, f_hi, *, clip: float):
    """Where the line through (lo, f_lo) and (hi, f_hi) crosses 0, kept ``clip`` of the width off either end.

    ``f_lo >= 0 > f_hi`` are the counts at the ends minus the goal; works elementwise on arrays.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.clip(f_lo / (f_lo - f_hi), clip, 1 - clip)
    return lo + frac * (hi - lo)


def illinois(f_lo, f_hi, moved, side):
    """The Illinois rule after a step: (f_lo, f_hi, side) with the stale end's weight halved.

    ``moved`` is +1 where lo moved to the new point, -1 where hi did, 0 where the bracket is closed;
    ``side`` is the end that moved the step before. An end that stayed put twice in a row (the other
    end moved again) weighs half as much, which keeps the secant from creeping in from one side.
    """
    f_lo = np.where((moved == -1) & (side == -1), 0.5 * f_lo, f_lo)
    f_hi = np.where((moved == 1) & (side == 1), 0.5 * f_hi, f_hi)
    return f_lo, f_hi, np.where(moved != 0, moved, side)


def bisect_last(holds, lo: float, hi: float, *, steps: int = 40) -> float:
    """The largest x in [lo, hi] at which ``holds(x)`` is true, to within (hi - lo) / 2^steps, for a
    predicate true at ``lo`` and false at ``hi`` that changes once: bisection (the end that holds is kept).

    >>> round(bisect_last(lambda x: x <= 0.3, 0.0, 1.0), 6)
    0.3
    """
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo
