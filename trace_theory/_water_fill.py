"""Water filling for prefix allocation: per group, the ``budget`` largest gains q^k (1 - q).

The engine behind ``trace_theory.allocate.water_fill`` (and so ``allocate_prefixes``): per group, a
log level bracketed by secant steps with the Illinois rule (``_water_level``), the units above it
counted in closed form, and the units inside the bracket sorted exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._bracketing import illinois, secant_point

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
        mid = secant_point(lo, hi, f_lo, f_hi, clip=1e-6)
        count = count_above(mid)
        moved = np.where(open_, np.where(count >= target, 1, -1), 0).astype(np.int8)
        up, down = moved == 1, moved == -1
        lo, c_lo, f_lo = np.where(up, mid, lo), np.where(up, count, c_lo), np.where(up, count - goal, f_lo)
        hi, c_hi, f_hi = np.where(down, mid, hi), np.where(down, count, c_hi), np.where(down, count - goal, f_hi)
        f_lo, f_hi, side = illinois(f_lo, f_hi, moved, side)  # the stale end weighs less
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


def fill(q: np.ndarray, group: np.ndarray, budget: np.ndarray, room: np.ndarray, start) -> np.ndarray:
    """Counts k per anchor for ``trace_theory.allocate.water_fill`` (its docstring states the problem).

    ``q`` float, ``group`` and ``budget`` int64 arrays, ``room`` a float array or 0-d (the same room for
    every anchor), ``start`` None or counts already placed.
    """
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
    return np.rint(k).astype(np.int64)
