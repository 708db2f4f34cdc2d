"""Where a grow call's time goes, and what it reports besides its turns.

A :class:`Timeline` holds the intervals of generation (the scheduler's main thread) and of environment
calls (its worker threads); :meth:`Timeline.report` measures their union and overlap. A
:class:`GrowReport` is what one :meth:`~.scheduler.Scheduler.grow` call spent besides the turns it added;
reports (and their timelines) of several calls add up.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["Timeline", "GrowReport"]

Interval = tuple[float, float]
"""``(start, end)`` in ``time.perf_counter`` seconds."""


class Timeline:
    """Intervals of generation (main thread) and of environment calls (worker threads) of grow calls."""

    def __init__(self):
        self.generation: list[Interval] = []
        self.in_flight: list[int] = []
        """Samples the generator held during each generation interval (its occupancy)."""
        self.env: list[Interval] = []
        self._lock = threading.Lock()

    def add_env(self, start: float, end: float) -> None:
        with self._lock:
            self.env.append((start, end))

    def __add__(self, other: "Timeline") -> "Timeline":
        """Both timelines' intervals (this one's first)."""
        joined = Timeline()
        for t in (self, other):
            with t._lock:
                joined.generation += t.generation
                joined.in_flight += t.in_flight
                joined.env += t.env
        return joined

    def report(self, wall: float) -> dict[str, float]:
        """``generation_seconds``, ``env_seconds`` (time at least one environment call ran),
        ``overlap_seconds`` (both at once), ``env_call_seconds`` (sum over calls) and
        ``generator_idle_share`` = 1 - generation_seconds / wall, ``generation_polls`` (generation steps)
        and ``samples_in_flight`` (samples held, averaged over the generating time)."""
        with self._lock:
            env = list(self.env)
        gen, busy = _union(self.generation), _union(env)
        overlap = _measure(_intersect(gen, busy))
        generation = _measure(gen)
        held = sum((b - a) * n for (a, b), n in zip(self.generation, self.in_flight))
        spent = sum(b - a for (a, b), _ in zip(self.generation, self.in_flight))
        return {
            "generation_polls": len(self.generation),
            "samples_in_flight": held / spent if spent > 0 else 0.0,
            "generation_seconds": generation,
            "env_seconds": _measure(busy),
            "overlap_seconds": overlap,
            "env_call_seconds": sum(b - a for a, b in env),
            "generator_idle_share": max(0.0, 1.0 - generation / wall) if wall > 0 else 0.0,
        }


def _union(intervals) -> list[Interval]:
    """Disjoint sorted intervals covering the same time as ``intervals`` (touching ones merged)."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _intersect(xs, ys) -> list[Interval]:
    """The time covered by both of two disjoint sorted interval lists (as :func:`_union` returns them)."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        i, j = (i + 1, j) if xs[i][1] < ys[j][1] else (i, j + 1)
    return out


def _measure(intervals) -> float:
    return sum(b - a for a, b in intervals)


@dataclass(frozen=True)
class GrowReport:
    """What :meth:`~.scheduler.Scheduler.grow` spent besides the turns it added; reports of several calls
    add up."""

    seeds: int = 0
    """Sampling seeds the call used (walkers x ``max_turns``); the next call starts after them."""
    continuation_prefix_tokens: int = 0
    """Prompt tokens of every continuation's first turn (the prefix it shares with its rollout)."""
    continuation_prefix_cached: int = 0
    """Of those, served from the back end's prefix cache."""
    end_reasons: dict[str, int] = field(default_factory=dict)
    """Rollouts ended, by end reason."""
    rollout_env_seconds: tuple[float, ...] = ()
    """Time each rollout (walker) spent in its environment."""
    env_error_sample: str | None = None
    """The first environment failure (end reason, rollout, message, traceback); None without one."""
    timeline: Timeline = field(default_factory=Timeline)
    """Intervals of generation and of environment calls."""

    def __add__(self, other: "GrowReport") -> "GrowReport":
        reasons = dict(self.end_reasons)
        for reason, n in other.end_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
        return GrowReport(
            self.seeds + other.seeds, self.continuation_prefix_tokens + other.continuation_prefix_tokens,
            self.continuation_prefix_cached + other.continuation_prefix_cached, reasons,
            self.rollout_env_seconds + other.rollout_env_seconds,
            self.env_error_sample if self.env_error_sample is not None else other.env_error_sample,
            self.timeline + other.timeline)
