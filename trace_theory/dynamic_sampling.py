"""Helpers for DAPO-style dynamic sampling: oversample prompts, keep only groups with mixed outcomes.

DAPO (Yu et al., 2025) fills a training batch with groups whose rewards are not all equal by generating
rounds of G rollouts for fresh prompts and discarding uniform groups, until ``target`` groups are kept.
It needs rounds of generation, which the step driver runs (:func:`trace_theory.step.run_step`, for the
simulator and the trainer alike, with the target of ``AllocationPolicy.dynamic_target``); this module
holds the decisions:

>>> state = DynamicSamplingState(target=4, group_size=2, budget=24)
>>> state.next_round()  # first round: exactly what is missing
4
>>> state = state.update(prompt=[0, 0, 1, 1, 2, 2, 3, 3], reward=[1, 0, 1, 1, 0, 0, 0, 1])
>>> state.kept, state.spent, state.next_round()  # 2 of 4 kept: oversample the 2 missing by 1 / 0.5
(2, 8, 4)

Every rollout generated counts against the budget, kept or not: that is the price DAPO pays for full
batches, and what equal-budget comparisons must charge it.

Pilot-Commit (Kim et al., 2026) reads outcomes in one round instead: a pilot of p rollouts for each of
n prompts (a share of the budget, :func:`pilot_prompts`), then the prompts whose pilot success rate lies
in a band grow to G rollouts, and what is left of the budget tops up their groups (:func:`commit_counts`):

>>> n = pilot_prompts(budget=24, pilot=2, pool=10)
>>> n
6
>>> commit, top_up = commit_counts([0, 1, 2, 1, 0, 2], pilot=2, group_size=4, budget=24)
>>> commit.tolist(), top_up.tolist()  # mixed pilots: prompts 1 and 3
([0, 2, 0, 2, 0, 0], [0, 4, 0, 4, 0, 0])

The pilots cost 12 rollouts, the two commits 2 x 2, and the 8 left over go to the committed groups: the
step spends its 24 rollouts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import _checks

__all__ = ["group_outcomes", "mixed_groups", "DynamicSamplingState", "pilot_prompts", "in_band", "commit_counts"]


def group_outcomes(prompt, reward):
    """Per distinct prompt id: (ids, group sizes, number of successes). Rewards must be 0/1.

    >>> ids, n, s = group_outcomes([3, 3, 5], [1, 0, 1])
    >>> ids.tolist(), n.tolist(), s.tolist()
    ([3, 5], [2, 1], [1, 1])
    """
    prompt = _checks.counts("prompt", _checks.vector("prompt", prompt, dtype=None))
    reward = _checks.vector("reward", reward)
    _checks.same_length(prompt=prompt, reward=reward)
    bad = ~((reward == 0) | (reward == 1))
    if bad.any():
        raise ValueError(f"`reward` must be 0 or 1, got {float(reward[bad][0])!r}")
    ids, inverse = np.unique(prompt, return_inverse=True)
    n = np.bincount(inverse, minlength=len(ids))
    s = np.bincount(inverse, weights=reward, minlength=len(ids)).astype(np.int64)
    return ids, n, s


def mixed_groups(prompt, reward):
    """Per distinct prompt id: (ids, mask of groups holding both a success and a failure).

    >>> ids, keep = mixed_groups([0, 0, 1, 1], [1, 0, 1, 1])
    >>> ids[keep].tolist()
    [0]
    """
    ids, n, s = group_outcomes(prompt, reward)
    return ids, (s > 0) & (s < n)


@dataclass(frozen=True)
class DynamicSamplingState:
    """Progress of one batch: groups kept, rollouts spent, and how many prompts to draw next.

    Parameters
    ----------
    target : int
        Groups with mixed outcomes the batch should hold.
    group_size : int
        Rollouts per drawn prompt (G).
    budget : int
        Rollouts the batch may spend in all rounds together.
    oversample : float, default 1.0
        Extra factor on the number of prompts drawn in a round, on top of dividing by the keep rate
        observed so far.
    min_keep_rate : float, default 0.05
        Floor on the estimated keep rate, so that a bad first round does not ask for the whole budget.
    """

    target: int
    group_size: int
    budget: int
    oversample: float = 1.0
    min_keep_rate: float = 0.05
    kept: int = 0
    drawn: int = 0
    spent: int = 0

    def __post_init__(self):
        if _checks.count("target", self.target) < 1:
            raise ValueError(f"`target` must be at least 1, got {self.target}")
        if _checks.count("group_size", self.group_size) < 2:
            raise ValueError(f"`group_size` must be at least 2 (a group of one is never mixed), got {self.group_size}")
        _checks.count("budget", self.budget)
        if not self.oversample >= 1.0:
            raise ValueError(f"`oversample` must be at least 1, got {self.oversample!r}")
        if not 0.0 < self.min_keep_rate <= 1.0:
            raise ValueError(f"`min_keep_rate` must lie in (0, 1], got {self.min_keep_rate!r}")

    @property
    def done(self) -> bool:
        """The batch is full, or the budget cannot pay for another group."""
        return self.kept >= self.target or self.budget - self.spent < self.group_size

    def next_round(self) -> int:
        """Prompts to draw next: the missing groups divided by the keep rate so far, within budget."""
        if self.done:
            return 0
        missing = self.target - self.kept
        rate = 1.0 if self.drawn == 0 else max(self.kept / self.drawn, self.min_keep_rate)
        want = int(np.ceil(missing * self.oversample / rate))
        return max(1, min(want, (self.budget - self.spent) // self.group_size))

    def update(self, prompt, reward) -> "DynamicSamplingState":
        """Account for one round's rollouts (all of them are spent; mixed groups are kept)."""
        ids, keep = mixed_groups(prompt, reward)
        spent = self.spent + len(np.asarray(prompt))
        return dataclasses.replace(self, kept=self.kept + int(keep.sum()), drawn=self.drawn + len(ids), spent=spent)


def pilot_prompts(budget: int, pilot: int, pool: int, share: float = 0.5) -> int:
    """Prompts a Pilot-Commit step pilots: n = min(pool, floor(share B / p)), the pilot's ``share`` of the
    budget B in pilots of p (at least one prompt where B >= p; none below).

    >>> pilot_prompts(192, 2, pool=200), pilot_prompts(192, 2, pool=30), pilot_prompts(1, 2, pool=30)
    (48, 30, 0)
    """
    budget, pool = _checks.count("budget", budget), _checks.count("pool", pool)
    if _checks.count("pilot", pilot) < 1:
        raise ValueError(f"`pilot` must be at least 1, got {pilot}")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"`share` must lie in (0, 1], got {share!r}")
    if budget < pilot:
        return 0
    return min(pool, max(int(np.floor(share * budget / pilot + 1e-9)), 1))


def in_band(successes, pilot: int, band=(0.0, 1.0)) -> np.ndarray:
    """Mask of pilots whose success rate s / p lies strictly inside ``band`` = (lo, hi).

    >>> in_band([0, 1, 2], 2).tolist()  # the default band: mixed pilots
    [False, True, False]
    """
    s = _checks.counts("successes", _checks.vector("successes", successes, dtype=None))
    if _checks.count("pilot", pilot) < 1 or (s > pilot).any():
        raise ValueError(f"`pilot` must be at least 1 and at least every success count, got {pilot}")
    lo, hi = band
    rate = s / pilot
    return (rate > lo) & (rate < hi)


def commit_counts(successes, *, pilot: int, group_size: int, budget: int, band=(0.0, 1.0)):
    """(commits, top-ups): rollouts added to each piloted prompt's group after its pilot of p rollouts.

    Commits: the prompts :func:`in_band` get G - p rollouts each (their pilot stays in the group), in pool
    order while the budget pays for them. Top-ups: what is left of ``budget`` (which counts the n p
    pilots) goes round-robin to the committed groups (:func:`~trace_theory.policies.top_up_roots`), or to
    every piloted group if none was committed. Together they spend ``budget`` - n p exactly.
    """
    s = _checks.counts("successes", _checks.vector("successes", successes, dtype=None))
    budget = _checks.count("budget", budget)
    if _checks.count("group_size", group_size) <= pilot:
        raise ValueError(f"`group_size` ({group_size}) must exceed `pilot` ({pilot})")
    left = budget - s.size * pilot
    if left < 0:
        raise ValueError(f"`budget` ({budget}) cannot pay for {s.size} pilots of {pilot}")
    band_mask = in_band(s, pilot, band)
    each = group_size - pilot
    commit = np.where(band_mask & (np.cumsum(band_mask) * each <= left), each, 0).astype(np.int64)
    rest = left - int(commit.sum())
    top_up = np.zeros(s.size, dtype=np.int64)
    if rest and s.size:  # round-robin in pool order, as ``policies.top_up_roots`` tops up roots
        gets = np.flatnonzero(commit) if commit.any() else np.arange(s.size)
        base, extra = divmod(rest, gets.size)
        top_up[gets] = base
        top_up[gets[:extra]] += 1
    return commit, top_up
