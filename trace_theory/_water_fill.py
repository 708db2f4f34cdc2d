"""Water filling for prefix allocation: per group, the ``budget`` largest gains q^k (1 - q).

The engine behind ``trace_theory.allocate.water_fill`` (and so ``allocate_prefixes``). On the log scale
anchor a's units are a_a + k log q_a (a_a = log(1 - q_a), k = 0, 1, ...), and the number of them above a
level t is n_a(t) = max(0, ceil((t - a_a) / log q_a)) in closed form. Per group we look for a log level
t with sum_a n_a(t) = target (``_water_level``): secant steps with the Illinois rule in (t, sqrt(count))
from the bracket [level at which the group's best anchor alone supplies the target, 0], each step one
pass over the anchors of the groups still open (renumbered and gathered as groups close).

* Where such a level is found, n_a(t) is the answer once each anchor's last unit counted lies above t
  and its next one does not, in exact log gains k log q + log(1 - q) (``_miscounted``; a group that
  fails goes to the next case).
* Elsewhere (ties at the level, or a group still open after ``_EXACT_STEPS`` steps) every unit above
  the upper end is taken, and each group takes the units it still misses from those between the ends:
  all that reach its missing-th largest exact log gain (``_kth_largest_in_groups``: one row sort of a
  padded matrix when groups are sorted), ties at that gain to lower anchor ids.
* Groups with fewer worthwhile units than their target fill up with worthless ones in anchor order.

The passes over anchors write into buffers allocated once per call: on large inputs a fresh temporary
per operation (the kernel zeroing its pages) cost more than the arithmetic. The per-group updates of the
bracket use ``np.where`` (about twice as fast as ``np.copyto`` with ``where=`` at 10^4 groups).
"""

from __future__ import annotations

import numpy as np

from ._numerics import log_one_minus

_FLOOR = -800.0  # a log-gain below every positive double: units under it count as worthless
_MAX_STEPS = 60  # bracket steps per call (the Illinois rule converges superlinearly)
_EXACT_STEPS = 6  # steps that look for a level with exactly the target units above it, ...
_SLACK = (3.0, 16.0)  # ... after which a group stops once its bracket holds <= 3 target + 16 units
_GATHER = 0.5  # gather the open groups' anchors once fewer than this share of the groups are open
_GUESS = 4.0  # without a cap, the count at bottom is taken as _GUESS * target + 1 instead of counted


class _Units:
    """The units of water filling, per anchor: log gain k / inv + a for k = 0, 1, ... (at most room).

    Regular anchors (0 < q < 1) have a = log of the first gain and 1 / inv = log q < 0 and group ``g``; a
    certain anchor (q = 0, nothing placed yet) has one unit worth 1 (log gain 0) and group ``g_cer``.
    ``work`` is a scratch buffer as long as ``g``, shared with the subsets made by :meth:`of`; ``sizes``
    the regular anchors per group where ``g`` is sorted (None where it is not).
    """

    __slots__ = ("n_groups", "g", "a", "inv", "room", "g_cer", "room_cer", "work", "sizes")

    def __init__(self, n_groups, g, a, inv, room, g_cer, room_cer, work=None, sizes=None):
        self.n_groups, self.g, self.a, self.inv, self.room = n_groups, g, a, inv, room
        self.g_cer, self.room_cer, self.sizes = g_cer, room_cer, sizes
        self.work = np.empty(len(g)) if work is None else work[: len(g)]

    def above(self, t: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Units with log gain > t[group], per regular anchor (written to ``out``) and per certain one."""
        reg = np.take(t, self.g, out=out, mode="clip")
        np.subtract(reg, self.a, out=reg)
        np.multiply(reg, self.inv, out=reg)
        np.ceil(reg, out=reg)
        np.maximum(reg, 0.0, out=reg)
        if np.ndim(self.room) or self.room < np.inf:  # no cap: nothing to clip
            np.minimum(reg, self.room, out=reg)
        return reg, np.where(t[self.g_cer] < 0.0, self.room_cer, 0.0)

    def per_group(self, reg: np.ndarray, cer: np.ndarray) -> np.ndarray:
        counts = np.bincount(self.g, reg, self.n_groups)
        return counts + np.bincount(self.g_cer, cer, self.n_groups) if self.g_cer.size else counts

    def count(self, t: np.ndarray) -> np.ndarray:
        return self.per_group(*self.above(t, self.work))

    def of(self, groups: np.ndarray, level: np.ndarray) -> "_Units":
        """The anchors of ``groups`` (ids, increasing), with group ``groups[i]`` renumbered i: where ``g``
        is sorted, each group's run of anchors; else those whose first unit lies above ``level[group]``
        (the others add nothing above it)."""
        new_id = np.full(self.n_groups, -1, dtype=np.int64)
        new_id[groups] = np.arange(len(groups))
        cid = new_id[self.g_cer]
        c = (cid >= 0) & (level[self.g_cer] < 0.0)
        if self.sizes is not None:
            sizes = self.sizes[groups]
            runs = np.cumsum(sizes)
            runs -= sizes  # where each kept group starts among the kept anchors
            idx = np.repeat((np.cumsum(self.sizes) - self.sizes)[groups] - runs, sizes)
            idx += np.arange(idx.size)
            room = self.room.take(idx) if np.ndim(self.room) else self.room
            return _Units(len(groups), np.repeat(np.arange(len(groups)), sizes), self.a.take(idx),
                          self.inv.take(idx), room, cid[c], self.room_cer[c], self.work, sizes)
        gid = np.take(new_id, self.g, mode="clip")
        r = np.take(level, self.g, out=self.work, mode="clip") < self.a
        r &= gid >= 0
        room = self.room[r] if np.ndim(self.room) else self.room
        return _Units(len(groups), gid[r], self.a[r], self.inv[r], room, cid[c], self.room_cer[c], self.work)


def _group_max(values: np.ndarray, group: np.ndarray, n_groups: int, starts) -> np.ndarray:
    """max of ``values`` per group (the floor for empty groups); ``starts``: where each non-empty group
    begins when ``group`` is sorted (one pass), else None."""
    out = np.full(n_groups, _FLOOR)
    if not len(group):
        return out
    if starts is not None:
        out[group[starts]] = np.maximum(np.maximum.reduceat(values, starts), _FLOOR)
    else:
        np.maximum.at(out, group, values)
    return out


def _water_level(units: _Units, target, top, bottom):
    """Per group, log levels lo <= hi with count_above(lo) >= target > count_above(hi), ``exact``: where
    count_above(lo) = target, and ``level``: that lo where exact, else hi.

    ``units.count(t)`` counts the units whose log gain exceeds t[group]; it falls as t rises, in steps.
    ``top`` (no unit above it) and ``bottom`` (a level with enough units above it where no cap applies;
    checked otherwise, the floor where it fails) start the bracket. Near the top the count grows about
    quadratically as the level falls (anchors join one by one, each adding units linearly), so we step
    to where the line through the two ends in (t, sqrt(count)) crosses sqrt(target - 1/2), halving the
    weight of an end that stayed put twice (the Illinois rule). A group is done when count(lo) =
    target, when its bracket is ~1e-9 wide (ties at the level), or, after ``_EXACT_STEPS`` steps, once
    its bracket holds at most 3 target + 16 units (``_SLACK``; the caller sorts those). Groups without
    ``target`` units above the floor get lo = hi = floor. Every group of the current set steps (a closed
    bracket stays valid); the set shrinks to the open groups, renumbered, with their anchors (each
    group's run where groups are sorted, else those whose first unit lies above lo), whenever fewer
    than ``_GATHER`` of them are open. lo and hi come back widened by 1e-11 (relative): a step can land
    on a unit's log gain, where the count's rounding is fuzzy, and the caller sorts such units with
    their exact gains.
    """
    lo, hi = bottom.copy(), top.copy()
    if not np.ndim(units.room) and units.room == np.inf and (bottom > _FLOOR).all():
        # No cap: the best anchor alone has the target units above bottom. Its count is only guessed
        # (the search needs its size, not its value), which saves a pass over every anchor.
        c_lo = np.where(target > 0, _GUESS * target + 1.0, 0.0)
        lo[target == 0] = top[target == 0]  # nothing above the best first gain
    else:
        c_lo = units.count(lo)
    low = c_lo < target  # the guess was too high: start from the floor
    if low.any():
        lo[low] = _FLOOR
        c_lo = np.where(low, units.count(lo), c_lo)
    short = c_lo < target
    hi[short] = lo[short] = _FLOOR
    slack = _SLACK[0] * target + _SLACK[1]
    ids = np.arange(target.size)
    l_, h_, c_l, c_h, t_, s_ = lo.copy(), hi.copy(), c_lo, np.zeros(ids.size), target, slack
    goal = np.sqrt(np.maximum(t_ - 0.5, 0.0))
    f_l, f_h = np.sqrt(c_l) - goal, -goal
    last_up, last_down = np.zeros(ids.size, bool), np.zeros(ids.size, bool)
    open_ = ~short & (c_l != t_) & (h_ - l_ > 1e-9)
    for step in range(_MAX_STEPS):
        n_open = int(np.count_nonzero(open_))
        if n_open == 0:
            break
        if n_open < _GATHER * ids.size:  # gather the open groups
            lo[ids], hi[ids], c_lo[ids] = l_, h_, c_l
            keep = np.flatnonzero(open_)
            units = units.of(keep, l_)
            ids, l_, h_, c_l, c_h, t_, s_, goal, f_l, f_h, last_up, last_down = (
                x[keep] for x in (ids, l_, h_, c_l, c_h, t_, s_, goal, f_l, f_h, last_up, last_down))
        # Every group steps (a closed one keeps a valid bracket, and stays closed).
        mid = np.subtract(f_l, f_h)  # > 0 wherever the target is (target 0: lo = hi = top)
        np.divide(f_l, mid, out=mid, where=mid > 0)
        np.clip(mid, 1e-6, 1.0 - 1e-6, out=mid)
        mid *= np.subtract(h_, l_)
        mid += l_
        count = units.count(mid)
        up = count >= t_
        down = ~up
        l_, c_l = np.where(up, mid, l_), np.where(up, count, c_l)
        h_, c_h = np.where(down, mid, h_), np.where(down, count, c_h)
        np.sqrt(count, out=count)
        count -= goal
        f_l, f_h = np.where(up, count, f_l), np.where(down, count, f_h)
        # The Illinois rule: an end that stayed put twice in a row weighs half as much.
        f_h = np.where(up & last_up, 0.5 * f_h, f_h)
        f_l = np.where(down & last_down, 0.5 * f_l, f_l)
        last_up, last_down = up, down
        open_ = c_l != t_
        open_ &= np.subtract(h_, l_) > 1e-9
        if step + 1 >= _EXACT_STEPS:
            open_ &= np.subtract(c_l, c_h) > s_
    lo[ids], hi[ids], c_lo[ids] = l_, h_, c_l
    exact = c_lo == target
    pad = np.where(short, 0.0, 1e-11 * (1.0 + np.abs(lo)))
    level = np.where(exact, lo, hi)
    return lo - pad, np.minimum(hi + pad, top), level, exact


def _miscounted(k: np.ndarray, level: np.ndarray, units: _Units, lq: np.ndarray) -> np.ndarray:
    """Per regular anchor, whether its closed-form count ``k`` of units above level[group] disagrees with
    the exact log gains k log q + log(1 - q): its last unit counted is not above the level, or its next
    one (within its room) is."""
    t = np.take(level, units.g, out=units.work, mode="clip")
    gain = np.multiply(k, lq)
    gain += units.a
    wrong = gain > t
    if np.ndim(units.room) or units.room < np.inf:
        wrong &= k < units.room
    np.subtract(k, 1.0, out=gain)
    gain *= lq
    gain += units.a
    wrong |= (gain <= t) & (k > 0)
    return wrong


def _kth_largest_in_groups(key: np.ndarray, group: np.ndarray, kth: np.ndarray, is_sorted: bool) -> np.ndarray:
    """Per group g, the kth[g]-th largest of ``key`` over its items: +inf where kth[g] <= 0, -inf where
    the group has fewer than kth[g] items.

    When ``group`` is sorted and the groups are short, each group becomes one row of a padded matrix
    sorted row by row (several times faster than a two-key sort of the same items).
    """
    n_groups = len(kth)
    per = np.bincount(group, minlength=n_groups)
    out = np.where(kth <= 0, np.inf, -np.inf)
    first = np.cumsum(per) - per
    inside = np.flatnonzero((kth >= 1) & (kth <= per))
    width = int(per[inside].max()) if inside.size else 0
    if is_sorted and inside.size * width <= 8 * group.size + 65536:  # padding at most ~8x the items
        rows = np.full((inside.size, width), -np.inf)  # one row per group that has its kth item
        row = np.full(n_groups, -1)
        row[inside] = np.arange(inside.size)
        mine = row[group] >= 0
        at = np.flatnonzero(mine)
        rows[row[group[at]], at - first[group[at]]] = key[at]
        rows.sort(axis=1)
        out[inside] = rows[np.arange(inside.size), width - kth[inside]]
    elif group.size:
        ranked = key[np.lexsort((key, group))]  # by group, then key ascending
        out[inside] = ranked[(first + per - kth)[inside]]
    return out


def _take_best(log_gain, anchor, g_anchor, missing, n, is_sorted) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the ``missing`` items of largest ``log_gain`` (ties to the earlier item, items listed by
    anchor, then k): (units taken per anchor, per group)."""
    threshold = _kth_largest_in_groups(log_gain, g_anchor, missing, is_sorted)
    take = log_gain >= threshold[g_anchor]
    taken = np.bincount(g_anchor[take], minlength=len(missing))
    excess = taken - np.maximum(missing, 0)
    if (excess > 0).any():  # ties at the threshold: drop the last of them in item order
        tied = np.flatnonzero(take & (log_gain == threshold[g_anchor]) & (excess[g_anchor] > 0))
        g_tied = g_anchor[tied]
        order = np.argsort(g_tied, kind="stable")
        per = np.bincount(g_tied, minlength=len(missing))
        from_end = (np.cumsum(per)[g_tied[order]] - 1) - np.arange(order.size)  # 0 for a group's last tie
        take[tied[order[from_end < excess[g_tied[order]]]]] = False
        taken = np.minimum(taken, np.maximum(missing, 0))
    return np.bincount(anchor[take], minlength=n), taken


def _pooled_candidates(first: np.ndarray, room, budget: int) -> np.ndarray | None:
    """The anchors that can take any of one group's ``budget`` best units, given each anchor's first log
    gain ``first``: those whose first gain is at least the ``budget``-th largest first gain T among anchors
    with room. Each of those ``budget`` anchors has a unit worth at least T, and an anchor's later units are
    worth less than its first, so no unit of another anchor (worth < T) is taken; ties at T stay in.
    None where this leaves at least half the anchors, or where T is worthless (<= the floor: the
    worthless fill-up runs over every anchor in order).
    """
    usable = first if not np.ndim(room) and room >= 1 else np.where(room >= 1, first, -np.inf)
    usable = np.nan_to_num(usable, nan=-np.inf, neginf=-np.inf, posinf=np.inf)
    if np.count_nonzero(usable > _FLOOR) < budget:
        return None
    level = np.partition(usable, usable.size - budget)[usable.size - budget]
    few = np.flatnonzero(usable >= level)
    return few if level > _FLOOR and 2 * few.size <= first.size else None


def fill(q: np.ndarray, group: np.ndarray, budget: np.ndarray, room: np.ndarray, start) -> tuple[np.ndarray, np.ndarray]:
    """(counts k per anchor, units placed per group) for ``trace_theory.allocate.water_fill`` (its
    docstring states the problem).

    ``q`` float, ``group`` and ``budget`` int64 arrays, ``room`` a float array or 0-d (the same room for
    every anchor), ``start`` None or counts already placed.
    """
    n_groups, n = len(budget), len(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        lq = np.log(q)
        l1q = log_one_minus(q)
        if start is not None:  # gains continue from q^start (1 - q)
            start = np.asarray(start, dtype=float)
            l1q = np.nan_to_num(np.where(start > 0, l1q + start * lq, l1q), nan=-np.inf)
        inv = np.divide(1.0, lq)
    if n_groups == 1 and 0 < budget[0] and 4 * budget[0] < n:
        few = _pooled_candidates(l1q, room, int(budget[0]))
        if few is not None:  # the pooled pass: a small budget over every anchor
            k = np.zeros(n, dtype=np.int64)
            k[few], placed = fill(q[few], group[few], budget, room[few] if room.ndim else room,
                                  None if start is None else start[few])
            return k, placed
    anchors = np.bincount(group, minlength=n_groups)
    if room.ndim:
        room_total = np.bincount(group, weights=np.minimum(room, 1e18), minlength=n_groups)
    else:
        room_total = anchors * min(float(room), 1e18)
    target = np.minimum(budget, room_total).astype(np.int64)
    every = not n or bool(q.min() > 0.0 and q.max() < 1.0)  # every anchor regular: 0 < q < 1
    regular = slice(None) if every else np.flatnonzero((q > 0) & (q < 1))
    certain = np.empty(0, np.int64) if every else np.flatnonzero(  # one unit worth 1
        (q == 0) & (start == 0 if start is not None else True))
    pick = (lambda x: x) if every else (lambda x: x[regular])  # noqa: E731
    units = _Units(
        n_groups, pick(group), pick(l1q), pick(inv), pick(room) if room.ndim else room,
        group[certain], np.minimum(room[certain] if room.ndim else np.full(certain.size, room), 1.0),
    )
    g_reg, a_reg, inv_reg, room_reg, g_cer, work = units.g, units.a, units.inv, units.room, units.g_cer, units.work
    groups_sorted = bool((group[1:] >= group[:-1]).all())
    starts = None
    if groups_sorted or (g_reg[1:] >= g_reg[:-1]).all():  # each group's regular anchors form one run
        units.sizes = anchors if every else np.bincount(g_reg, minlength=n_groups)
        starts = (np.cumsum(units.sizes) - units.sizes)[units.sizes > 0]

    # The level lies below the best first gain of the group, and above the level at which its best
    # anchor alone would supply the whole target (checked: rooms can make that guess too high).
    top = np.zeros(n_groups)  # log gain 0: no unit lies above it (the best first gains are a pass away)
    alone = np.take(target.astype(float), g_reg, out=work, mode="clip")
    alone -= 1.0
    np.divide(alone, inv_reg, out=alone)
    alone += a_reg
    if room.ndim or room < np.inf:
        alone[room_reg < target[g_reg]] = _FLOOR
    bottom = _group_max(alone, g_reg, n_groups, starts)
    if n_groups == 1:  # one pooled group (the leftover pass): the target-th best first gain bounds it too
        firsts = a_reg[room_reg >= 1] if np.ndim(room_reg) else a_reg[: a_reg.size * (room_reg >= 1)]
        if 0 < target[0] <= firsts.size:
            bottom = np.maximum(bottom, np.partition(firsts, firsts.size - target[0])[firsts.size - target[0]])
    bottom = np.clip(bottom - 1e-9 * (1.0 + np.abs(bottom)), _FLOOR, top)
    lo, hi, level, exact = _water_level(units, target, top, bottom)

    # Where exactly the target units lie above lo, they are the answer if the closed-form count matched
    # the exact log gains there (checked per anchor). Elsewhere every unit above hi is taken, and of the
    # units between the levels each group takes what it still misses.
    reg_hi, cer_hi = units.above(level, np.empty(len(g_reg)))
    if exact.any():
        wrong = _miscounted(reg_hi, level, units, pick(lq))
        wrong &= exact[g_reg]
        if wrong.any():
            exact[g_reg[wrong]] = False
            level = np.where(exact, level, hi)
            reg_hi, cer_hi = units.above(level, reg_hi)
    if every:  # the units between the levels, of the groups without an exact level only
        k = reg_hi
        rest = np.flatnonzero(~exact[group])
        g_rest = group[rest]
        missing = np.where(exact, 0, target - np.bincount(g_rest, k[rest], n_groups).astype(np.int64))
        extra = lo[g_rest]
        extra -= l1q[rest]
        extra *= inv[rest]
        np.ceil(extra, out=extra)
        np.maximum(extra, 0.0, out=extra)
        if room.ndim or room < np.inf:
            np.minimum(extra, room[rest] if room.ndim else room, out=extra)
        extra -= k[rest]
    else:
        k = np.zeros(n)
        k[regular] = reg_hi
        k[certain] = cer_hi
        missing = target - units.per_group(reg_hi, cer_hi).astype(np.int64)
        reg_lo, cer_lo = units.above(lo, work)
        rest, g_rest, extra = np.arange(n), group, np.zeros(n)
        extra[regular] = reg_lo - reg_hi
        extra[certain] = cer_lo - cer_hi
    # Gains fall with k, so an anchor can give its group at most `missing` of these units; for q within
    # rounding of 1 the bracket would otherwise hold ~1e15 near-equal units.
    np.minimum(extra, np.maximum(missing, 0)[g_rest], out=extra)
    extra = extra.astype(np.int64)
    anchor = np.repeat(rest, extra)
    kk = k[anchor] + (np.arange(anchor.size) - np.repeat(np.cumsum(extra) - extra, extra))
    with np.errstate(invalid="ignore"):
        log_gain = kk * lq[anchor] + l1q[anchor]  # kk counts from start
    if certain.size:
        log_gain[q[anchor] == 0.0] = 0.0
    more, taken = _take_best(log_gain, anchor, group[anchor], missing, n, groups_sorted)
    k += more
    missing = missing - taken

    # Groups that ran out of worthwhile units (lo stuck at the floor) fill up with worthless ones,
    # in anchor order, up to the cap.
    if (missing > 0).any():
        spare = np.minimum(room - k, missing[group].astype(float))
        order = np.argsort(group, kind="stable")
        rs = spare[order]
        before = np.cumsum(rs) - rs
        before -= before[np.searchsorted(group[order], group[order])]
        worthless = np.clip(missing[group[order]] - before, 0.0, rs)
        k[order] += worthless
        missing = missing - np.bincount(group[order], worthless, n_groups).astype(np.int64)
    return k.astype(np.int64), target - missing  # k holds whole numbers
