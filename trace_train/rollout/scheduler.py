"""Growing rollouts: generation and environment calls scheduled so that neither waits for a whole turn.

:meth:`Scheduler.grow` generates ``k`` rollouts from each start node ``(node, kind, k)`` of a batch under
construction (a :class:`~.batch.BatchBuilder`; the engine's grow primitive), adds their turns and rewards
to it and returns a :class:`GrowReport` of what else the call spent (continuation prefix tokens, end
reasons, environment time, the first environment failure, the sampling seeds it used). A
:class:`Scheduler` is built from what it needs, not from the engine: the back end, the environment
factory, the chat format, the sampling settings and a :class:`ScheduleConfig`. Each rollout is a *walker*
that alternates two kinds of work:

* **generation** of its next turn, through the back end's request stream (:mod:`..backends.base`): on
  vLLM a request joins the running batch as soon as it is submitted (continuous batching); other back
  ends generate whatever is queued as one batch per poll, after waiting up to ``BATCH_WINDOW_S`` for
  the rest of a wave of environment answers. When environments have answered faster than one engine
  step so far (a running mean), the loop waits up to one step for the turns it just handed out, so that
  fast tools rejoin the batch together instead of one step apart;
* **environment calls** for that turn (``make_env`` and ``restore`` before its first turn, then
  ``step``, ``snapshot`` and, when the rollout ends, ``verify``), run on a pool of worker threads
  (:mod:`.env_calls`: a deadline per call, stuck workers replaced).

::

    main thread (one loop)                          env worker threads (RolloutConfig.env_workers)
    ──────────────────────────────────────────      ────────────────────────────────────────────────
    submit first turns (one request per start) ──┐
    ┌─> poll the stream: finished turns ─────────┼─> [restore] step snapshot [verify]   walker 3
    │   collect answered walkers  <──────────────┼── [restore] step snapshot [verify]   walker 7
    │   submit their next turns at once ─────────┘    ...                               (concurrently)
    └── until every walker has ended; then commit all turns to the forest in a fixed order

With ``schedule="lockstep"`` (the engine's earlier behaviour, kept for comparison) every turn of all live
walkers is one ``generate`` call, and the environments of that turn are stepped one after another in the
main thread before the next call starts.

**What is reproducible.** With a fixed seed a batch does not depend on the order in which generations or
environment calls complete: the sample of walker ``i`` (walkers numbered in start order) at its ``t``-th
turn of this call is drawn with seed ``s + t W + i`` (``W`` walkers, ``s`` the call's ``seed``), each
rollout's turns are recorded in its own list, and the turns are committed to the forest only at the
end, turn-major then walker order (the node ids the lockstep schedule gives). The two schedules
therefore produce the same batch whenever the back end's sampled tokens do not depend on batch
composition: exactly on vLLM up to floating-point batch effects, and on transformers up to those of
left padding (rare flips of near-tied samples; log-probabilities agree to about 1e-6).

**Failures end one rollout, never the batch.** An environment call that raises ends its rollout with
end reason ``env_error``, one that runs past ``RolloutConfig.env_timeout_s`` with ``env_timeout``; both
score 0 and are counted in the report's ``end_reasons``; the first failure's message and traceback is the
report's ``env_error_sample``. A pool row whose ``make_env``, ``reset`` or first ``snapshot`` raised opens
with a placeholder prompt (:class:`OpeningFailed`) and each of its rollouts ends with ``env_error`` at
its first environment call. So does an observation that cannot be formatted
or tokenised (not text, or a template that will not frame it) and a reward that is not a finite number:
what an environment returns is data, checked in the main thread but charged to its own rollout. Its text
enters once through :func:`~trace_train.chat.clean_text` (lone surrogates replaced), so what is stored is
what was tokenised. So does a ``step`` that returns no ``StepResult`` (None), and a message that cannot
be printed is shown as such. Every call runs on an :class:`~.env_calls.EnvCallPool` with a deadline, the
lockstep schedule's too (one call at a time, waited for): a timed-out call cannot be interrupted (it is a
thread), so its worker is abandoned (a daemon thread: it holds neither the batch nor the process's exit)
and replaced at once, so calls queued behind it start; its environment is discarded. Environments
should still bound their own tool calls (the sandbox does): an abandoned call keeps its thread and
whatever it holds until it returns. ``RolloutConfig.raise_env_errors`` turns failures into exceptions,
for debugging.

**Sizing the pool.** An environment that declares ``concurrency_safe`` runs on ``env_workers`` threads,
others on one. Calls that wait (a subprocess, a network round trip, a sleep) release the GIL, so up to
one worker per rollout in flight is useful; calls that compute in Python hold it, and more workers than
cores only add switching. A rule of thumb: ``env_workers`` ~ rollouts x (environment time per turn) /
(environment + generation time per turn), at most the rollouts of a call.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from trace_theory.step import Branch as PrefixBranch  # (depth, count): an eager decision

from ..backends.base import Completion, GenerationBackend, GenerationRequest, Sampling, request_stream
from .batch import BatchBuilder, NodePayload
from ..chat import ChatFormat, clean_text
from ..configs import SCHEDULES, ScheduleConfig  # they live with the configs that validate them
from ..envs.base import EndReason, Environment, Message, is_concurrency_safe
from .env_calls import (CallClock, EnvCallPool, EnvFailure, EnvTimeout, OpeningFailed, describe_error,
                        format_failure, reward_value, walker_turn, walker_verify)

__all__ = ["SCHEDULES", "Timeline", "EnvFailure", "OpeningFailed", "ScheduleConfig", "GrowReport", "Scheduler",
           "Prefix", "Branch"]

BATCH_WINDOW_S = 0.02
"""With a back end that generates in batches, how long to wait after the first environment answer for
the others of the same wave before generating (one larger batch instead of many small ones)."""


# ---------------------------------------------------------------------------------------------------
# Where the time goes
# ---------------------------------------------------------------------------------------------------


class Timeline:
    """Intervals of generation (main thread) and of environment calls (worker threads) of grow calls."""

    def __init__(self):
        self.generation: list[tuple[float, float]] = []
        self.in_flight: list[int] = []
        """Samples the generator held during each generation interval (its occupancy)."""
        self.env: list[tuple[float, float]] = []
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


def _union(intervals):
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        i, j = (i + 1, j) if xs[i][1] < ys[j][1] else (i, j + 1)
    return out


def _measure(intervals) -> float:
    return sum(b - a for a, b in intervals)


# ---------------------------------------------------------------------------------------------------
# What the scheduler is given and what it reports
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowReport:
    """What :meth:`Scheduler.grow` spent besides the turns it added; reports of several calls add up."""

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


# ---------------------------------------------------------------------------------------------------
# Walkers and their environment calls
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Turn:
    """One recorded turn of a walker, committed to the forest at the end."""

    completion: Completion
    text: str
    messages: tuple[Message, ...]
    observation: str = ""
    observation_ids: tuple[int, ...] = ()
    snapshot: Any = None
    end: EndReason | None = None
    reward: float | None = None


@dataclass
class _Walker:
    """A rollout in progress: its start node, its environment, its exact context and recorded turns."""

    index: int
    start: int
    start_depth: int
    context: list[int]
    env: Environment | None = None
    turns: list[_Turn] = field(default_factory=list)
    env_seconds: float = 0.0
    """Time its environment calls took (the rollout's own environment time)."""
    snapshot: Any = None
    """The environment state it starts from (its start node's snapshot)."""
    seeds: Callable[[int], int] | None = None
    """Sampling seed of its t-th turn; None: the grow call's ``seed + t W + index``."""
    anchor: tuple[int, int] | None = None
    """A streamed continuation: (walker, turn) it branches from, a node only once committed."""
    boundaries: list[int] = field(default_factory=list)
    """Length of ``context`` after each turn that went on (its prefixes' token ids)."""

    @property
    def depth(self) -> int:
        return self.start_depth + len(self.turns)

    @property
    def ended(self) -> bool:
        return bool(self.turns) and self.turns[-1].reward is not None


@dataclass(frozen=True)
class _seeds:
    """Seeds of a streamed rollout, the ``j``-th of start ``start`` in pass ``pass_`` (0: as its start
    ended, 1: continuations from ``rest``, 2: top-ups from ``rest``): turn t samples with a seed drawn
    from (grow seed, start, j, t, pass), so they do not depend on the order starts end in."""

    seed: int
    start: int
    j: int
    pass_: int = 0

    def __call__(self, t: int) -> int:
        return int(np.random.SeedSequence([self.seed, self.start, self.j, t, self.pass_]).generate_state(1)[0])


# ---------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prefix:
    """A turn boundary of an ended rollout that is not its end (an anchor), before it is a node."""

    walker: int
    turn: int
    depth: int
    reward: float
    """The rollout's reward (the anchor's factual outcome)."""
    messages: tuple[Message, ...]
    """The conversation up to the boundary (opening messages included)."""
    token_ids: tuple[int, ...]
    """The exact context up to the boundary."""


Branch = Callable[[int, list[Prefix]], Sequence[int]]
"""``branch(s, prefixes) -> k``: called once the walkers of start ``s`` have all ended, with their
prefixes (walker by walker, by depth); ``k[a]`` continuations start from ``prefixes[a]`` at once."""

class Extra(NamedTuple):
    """Rollouts ``rest`` adds after the last start ended: ``count`` from prefix ``prefix`` of start ``start``
    (the index in what ``branch`` saw), or with ``prefix`` None from the start's own node (top-ups)."""

    start: int
    prefix: int | None
    count: int


Boundary = Callable[..., Sequence[PrefixBranch]]
"""``boundary(s, j, depth, prefix) -> [Branch(depth, count), ...]`` (eager expansion): walker ``j`` of start
``s`` went on past a turn boundary at ``depth`` (``prefix``: that :class:`Prefix`, its reward unknown,
NaN); ``count`` rollouts start at once from that walker's prefix at each ``depth`` returned (0: at the
start's node, top-ups). ``Branch`` is ``trace_theory.step.Branch``."""

Finished = Callable[..., Sequence[PrefixBranch]]
"""``finished(s, j, length, reward) -> [Branch(depth, count), ...]`` (eager expansion): walker ``j`` of start
``s`` ended after ``length`` turns; the rollouts to start at once, as for :data:`Boundary`."""

Rest = Callable[[], Sequence[Extra]]
"""``rest() -> [Extra(start, prefix, count), ...]``: called once ``branch`` has been called for every start:
more continuations from a prefix of a start, or top-ups at its node (:class:`Extra`)."""


class Scheduler:
    """Grows rollouts into a :class:`~.batch.BatchBuilder` (see the module docstring).

    Parameters
    ----------
    backend : GenerationBackend
        Where tokens come from.
    make_env : callable
        Returns a fresh environment; one is made per rollout and restored from its start node's snapshot.
    chat : ChatFormat
        Action text and observation token ids of each turn.
    sampling : Sampling
        Sampling settings of every turn (a request's ``max_new_tokens`` also respects the context room).
    config : ScheduleConfig
    """

    def __init__(self, backend: GenerationBackend, make_env: Callable[[], Environment], chat: ChatFormat,
                 sampling: Sampling, config: ScheduleConfig):
        if not isinstance(config, ScheduleConfig):
            raise ValueError(f"`config` must be a ScheduleConfig, got {type(config).__name__}")
        self.backend, self.make_env, self.chat, self.sampling, self.config = \
            backend, make_env, chat, sampling, config

    def grow(self, builder: BatchBuilder, starts: Sequence[tuple[int, str, int]], *, seed: int,
             branch: Branch | None = None, rest: Rest | None = None, boundary: Boundary | None = None,
             finished: Finished | None = None) -> GrowReport:
        """Generate ``k`` rollouts of kind ``kind`` from each ``(node, kind, k)`` of ``builder``, add their
        turns and rewards to it, and report the rest; walker ``i``'s ``t``-th turn samples with seed
        ``seed + t W + i`` (``W`` walkers).

        ``branch`` (streamed expansion): once every walker of start ``s`` has ended, ``branch(s, prefixes)``
        says how many continuations to start from each of their :class:`Prefix` es, and they start at
        once, beside the walkers still running; after the last start, ``rest()`` adds what it returns.
        The j-th such rollout of start ``s`` samples its t-th turn with a seed drawn from (seed, s, j, t,
        pass), whatever order the starts end in; they are committed after every walker of ``starts``,
        pass by pass and start by start, so node ids do not depend on timing either.

        ``boundary`` and ``finished`` (eager expansion) are told each walker's turn boundaries and its end
        as they happen, before ``branch`` hears of its start, and the rollouts they return start at once;
        their seeds come from (seed, start, walker, depth, count so far), whatever the timing.
        """
        return _Grower(self, builder, list(starts), seed, branch, rest, boundary, finished).run()


class _Grower:
    """One :meth:`Scheduler.grow` call: its walkers, their environment calls, and its report."""

    def __init__(self, scheduler: Scheduler, builder: BatchBuilder, starts: list[tuple[int, str, int]],
                 seed: int, branch: Branch | None = None, rest: Rest | None = None,
                 boundary: Boundary | None = None, finished: Finished | None = None):
        self.scheduler, self.builder, self.starts, self.seed = scheduler, builder, starts, seed
        self.cfg, self.chat = scheduler.config, scheduler.chat
        self.lockstep = self.cfg.schedule == "lockstep"
        self.walkers: list[_Walker] = []
        self.first: dict[int, list[_Walker]] = {}  # start index -> its walkers
        for s, (node, _, k) in enumerate(starts):
            context, depth = builder.context_ids(node), len(builder.path(node)) - 1
            snapshot = builder.nodes[node].snapshot
            group = [_Walker(len(self.walkers) + j, node, depth, context, snapshot=snapshot) for j in range(k)]
            self.first[s] = group
            self.walkers += group
        self.planted, self.planted_starts = len(self.walkers), len(starts)
        """Walkers and starts of ``starts``; streamed ones come after them."""
        self.branch, self.rest = branch, rest
        self.boundary, self.finished = boundary, finished
        self.place = {w.index: (s, j) for s, group in self.first.items() for j, w in enumerate(group)}
        """Planted walker -> (start, its number there), for the eager hooks."""
        self.told: dict[int, int] = {}
        """Planted walker -> turn boundaries reported to ``boundary`` (and -1 once its end was)."""
        self.eager_started: dict[tuple[int, int, int], int] = {}
        """(start, walker number, depth) -> rollouts started there by the eager hooks (their seeds)."""
        self.waiting = set(self.first) if branch is not None else set()
        """Starts whose walkers have not all ended yet (streamed expansion)."""
        self.prefixes: dict[int, list[Prefix]] = {}
        """Prefixes of each ended start, as ``branch`` saw them."""
        self.timeline = Timeline()
        self.in_flight = 0
        """Samples submitted to the stream and not yet returned."""
        self.prefix_tokens = self.prefix_cached = 0
        self.env_error_sample: str | None = None
        self.env_turn_seconds: float | None = None
        """Running mean of the environment's time per turn (all calls of one turn)."""

    # ---- seeds and requests -----------------------------------------------------------------------

    def _request(self, w: _Walker, n: int = 1) -> GenerationRequest:
        """Walker ``w``'s next turn, seed ``s + t W + i`` (``n`` samples: ``n`` consecutive walkers)."""
        room = self.cfg.limits.max_context_tokens - len(w.context)
        t = len(w.turns)
        seed = self.seed + t * self.planted + w.index if w.seeds is None else w.seeds(t)
        return GenerationRequest(tuple(w.context), n=n, seed=seed,
                                 max_new_tokens=min(self.cfg.limits.max_turn_tokens, room))

    # ---- main loop --------------------------------------------------------------------------------

    def run(self) -> GrowReport:
        if not self.walkers:
            return GrowReport()
        stream = request_stream(self.scheduler.backend, batched=self.lockstep)
        self.pool = pool = self._pool()
        self.running: dict[Future, tuple[CallClock, Callable]] = {}
        sampling = self.scheduler.sampling
        try:
            for s, group in self.first.items():
                stream.submit(("start", s), self._request(group[0], len(group)), sampling)
                self.in_flight += len(group)
            while stream.pending or self.running:
                if stream.pending:
                    start = time.perf_counter()
                    finished = stream.poll()
                    end = time.perf_counter()
                    self.timeline.generation.append((start, end))
                    self.timeline.in_flight.append(self.in_flight)
                    launched = [f for key, done in finished for f in self._generated(pool, key, done)]
                    if stream.continuous and launched and self._env_faster_than(end - start):
                        wait(launched, timeout=end - start)  # let fast answers join the very next step
                ready = self._collect(continuous=stream.continuous, generating=stream.pending)
                for w in sorted(ready, key=lambda w: w.index):
                    stream.submit(w.index, self._request(w), sampling)
                    self.in_flight += 1
                if self.boundary is not None:
                    self._tell_eager(stream, sampling)
                if self.waiting:
                    self._branch_ended(stream, sampling)
                    if not self.waiting and self.rest is not None:
                        self._add_rest(stream, sampling)
        finally:
            pool.shutdown()  # never waits: a stuck call's worker is a daemon thread, abandoned
            stream.close()  # nothing left in the engine if the loop raised
        return self._commit()

    def _branch_ended(self, stream, sampling) -> None:
        """Streamed expansion: ask ``branch`` about every start whose walkers have all ended, and start
        the continuations it places (their first turns join the stream at once)."""
        for s in sorted(s for s in self.waiting if all(w.ended for w in self.first[s])):
            self.waiting.discard(s)
            prefixes = self._prefixes(self.first[s])
            k = [int(c) for c in self.branch(s, prefixes)]
            if len(k) != len(prefixes) or min(k, default=0) < 0:
                raise ValueError(f"`branch` must return {len(prefixes)} non-negative counts, got {k}")
            self.prefixes[s] = prefixes
            self._start_branches(stream, sampling, s, [(a, c) for a, c in enumerate(k) if c], pass_=0)

    def _tell_eager(self, stream, sampling) -> None:
        """Eager expansion: report every planted walker's new turn boundaries, then its end, and start what
        the hooks return (walker order; each walker's own events in order, which is all that decides)."""
        for w in self.walkers[:self.planted]:
            told = self.told.get(w.index, 0)
            if told < 0:
                continue
            s, j = self.place[w.index]
            for t in range(told, len(w.boundaries)):
                depth = w.start_depth + t + 1
                self.told[w.index] = t + 1
                self._start_eager(stream, sampling, s, j, w, self.boundary(s, j, depth, self._prefix(w, t, math.nan)))
            if w.ended and len(w.boundaries) == len(w.turns) - 1:
                self.told[w.index] = -1
                self._start_eager(stream, sampling, s, j, w,
                                  self.finished(s, j, w.start_depth + len(w.turns), float(w.turns[-1].reward)))

    def _prefix(self, w: _Walker, t: int, reward: float) -> Prefix:
        """Walker ``w``'s turn boundary after its turn ``t`` as a :class:`Prefix`."""
        messages = tuple(self.builder.messages(w.start))
        for turn in w.turns[:t + 1]:
            messages = messages + turn.messages
        return Prefix(w.index, t, w.start_depth + t + 1, reward, messages, tuple(w.context[:w.boundaries[t]]))

    def _start_eager(self, stream, sampling, s: int, j: int, w: _Walker, branches) -> None:
        """Start ``k`` rollouts from walker ``w``'s prefix at each ``(depth, k)`` (depth 0: its start node)."""
        for branch in branches:
            depth, count = int(branch.depth), int(branch.count)
            t = depth - w.start_depth - 1
            if count < 0 or not (depth == 0 or 0 <= t < len(w.boundaries)):
                raise ValueError(f"the eager hooks returned ({depth}, {count}) for walker {j} of start {s}: "
                                 "no such prefix or count")
            if not count:
                continue
            if depth == 0:
                node = self.starts[s][0]
                context = self.builder.context_ids(node)
                snapshot, anchor, kind, depth = self.builder.nodes[node].snapshot, None, "top_up", w.start_depth
            else:
                node, context = -1, w.context[:w.boundaries[t]]
                snapshot, anchor, kind = w.turns[t].snapshot, (w.index, t), "continuation"
            done = self.eager_started.get((s, j, depth), 0)
            self.eager_started[s, j, depth] = done + count
            group = [_Walker(len(self.walkers) + i, node, depth, list(context), snapshot=snapshot,
                             seeds=_seeds(self.seed, s, (j * 4096 + depth) * 65536 + done + i, 3), anchor=anchor)
                     for i in range(count)]
            self._launch(stream, sampling, group, node, kind)

    def _add_rest(self, stream, sampling) -> None:
        """Streamed expansion, after the last start ended: the rollouts ``rest`` adds (top-ups, a = -1)."""
        by_start: dict[int, list[tuple[int, int]]] = {}
        for extra in self.rest():
            s, a, k = extra.start, -1 if extra.prefix is None else extra.prefix, extra.count
            if not 0 <= s < self.planted_starts or not -1 <= a < len(self.prefixes[s]) or k < 0:
                raise ValueError(f"`rest` returned {extra}: no such start, prefix or count")
            if k:
                by_start.setdefault(s, []).append((a, k))
        for s, starts in sorted(by_start.items()):
            self._start_branches(stream, sampling, s, [(a, k) for a, k in starts if a >= 0], pass_=1)
            self._start_branches(stream, sampling, s, [(a, k) for a, k in starts if a < 0], pass_=2)

    def _start_branches(self, stream, sampling, s: int, counts: list[tuple[int, int]], pass_: int) -> None:
        """Start ``k`` walkers from prefix ``a`` of start ``s`` (its node with a = -1) per (a, k), now."""
        j = 0
        for a, count in counts:
            if a < 0:
                node = self.starts[s][0]
                context, depth = self.builder.context_ids(node), len(self.builder.path(node)) - 1
                snapshot, anchor, kind = self.builder.nodes[node].snapshot, None, "top_up"
            else:
                prefix = self.prefixes[s][a]
                node, context, depth = -1, list(prefix.token_ids), prefix.depth
                snapshot = self.walkers[prefix.walker].turns[prefix.turn].snapshot
                anchor, kind = (prefix.walker, prefix.turn), "continuation"
            group = [_Walker(len(self.walkers) + i, node, depth, list(context), snapshot=snapshot,
                             seeds=_seeds(self.seed, s, j + i, pass_), anchor=anchor) for i in range(count)]
            j += count
            self._launch(stream, sampling, group, node, kind)

    def _launch(self, stream, sampling, group: list[_Walker], node: int, kind: str) -> None:
        """Register ``group`` (walkers sharing one context) as a new start and request its first turns."""
        self.walkers += group
        key = len(self.starts)
        self.starts.append((node, kind, len(group)))
        self.first[key] = group
        stream.submit(("start", key), self._request(group[0], len(group)), sampling)
        self.in_flight += len(group)

    def _prefixes(self, walkers: list[_Walker]) -> list[Prefix]:
        """The anchors of ended walkers: every turn but the last, walker by walker, by depth."""
        out = []
        for w in walkers:
            opening = tuple(self.builder.messages(w.start))
            messages = opening
            for t, turn in enumerate(w.turns[:-1]):
                messages = messages + turn.messages
                out.append(Prefix(w.index, t, w.start_depth + t + 1, float(w.turns[-1].reward), messages,
                                  tuple(w.context[:w.boundaries[t]])))
        return out

    def _pool(self) -> EnvCallPool:
        """Workers with a deadline per call (:mod:`.env_calls`); lockstep: one call at a time, waited for."""
        if self.lockstep:
            return EnvCallPool(1, self.cfg.env_timeout_s, serial=True)
        workers = self.cfg.env_workers if is_concurrency_safe(self.scheduler.make_env) else 1
        return EnvCallPool(workers, self.cfg.env_timeout_s)

    def _env_faster_than(self, seconds: float) -> bool:
        """Whether environment turns have taken less than ``seconds`` (running mean; True before any)."""
        return self.env_turn_seconds is None or self.env_turn_seconds < seconds

    def _generated(self, pool, key, completions: list[Completion]) -> list[Future]:
        """Record the turns just generated and hand each to its environment; returns the calls' futures."""
        if isinstance(key, tuple):  # a start's first turn: k samples for its k walkers
            walkers = self.first[key[1]]
            node, kind, k = self.starts[key[1]]
            if kind == "continuation":
                self.prefix_tokens += k * len(walkers[0].context)
                self.prefix_cached += sum(c.cached_prompt_tokens for c in completions)
        else:
            walkers = [self.walkers[key]]
        self.in_flight -= len(walkers)
        limits, launched = self.cfg.limits, []
        for w, c in zip(walkers, completions):
            text = self.chat.action_text(tuple(c.token_ids))
            turn = _Turn(c, text, ({"role": "assistant", "content": text},))
            w.turns.append(turn)
            cut = c.finish_reason == "length"  # the action never reaches the environment
            if cut:
                room = limits.max_context_tokens - len(w.context)
                turn.end = EndReason.CONTEXT if room <= limits.max_turn_tokens else EndReason.TURN_TOKENS
            calls = CallClock(w, self.timeline.add_env)
            future = pool.submit(calls, walker_turn, self.scheduler.make_env, w.snapshot,
                                 None if cut else text, cut or w.depth >= limits.max_turns)
            self.running[future] = (calls, walker_turn)
            launched.append(future)
        return launched

    def _collect(self, *, continuous: bool, generating: bool) -> list[_Walker]:
        """Walkers whose environment answered: wait for the first answer unless generation is under way."""
        if not self.running:
            return []
        if not generating:
            deadline = self.pool.next_deadline()
            wait(self.running, timeout=None if deadline is None else deadline + 0.01, return_when=FIRST_COMPLETED)
            if not continuous:  # gather the rest of this wave into one batch
                wait(self.running, timeout=BATCH_WINDOW_S)
        self.pool.expire()  # calls past their deadline: their futures fail with EnvTimeout
        ready = []
        for future in [f for f in self.running if f.done()]:
            calls, kind = self.running.pop(future)
            mean = self.env_turn_seconds
            self.env_turn_seconds = calls.seconds if mean is None else 0.9 * mean + 0.1 * calls.seconds
            if self._answered(calls.walker, kind, future):
                ready.append(calls.walker)
        return ready

    def _answered(self, w: _Walker, kind: Callable, future: Future) -> bool:
        """Apply a finished environment call; True when the walker goes on to its next turn."""
        error = future.exception()
        if isinstance(error, EnvTimeout):  # the pool abandoned its worker (module env_calls)
            self._fail(w, EndReason.ENV_TIMEOUT, describe_error(error).partition(": ")[2] or "timed out")
            return False
        if error is not None:
            self._fail(w, EndReason.ENV_ERROR, describe_error(error), error)
            return False
        turn = w.turns[-1]
        if kind is walker_verify:
            try:
                turn.reward = reward_value(future.result())
            except ValueError as error:
                self._fail(w, EndReason.ENV_ERROR, describe_error(error), error)
            return False
        result, turn.snapshot, reward = future.result()
        try:  # what the environment returned is data: any fault in it ends this rollout only
            if result is not None:
                # cleaned, frame tags escaped: what is stored is what is tokenised (idempotent there)
                observation = self.chat.escape_frame_tags(clean_text(result.observation), {"role": result.role})
                message = {"role": result.role, "content": observation}
                turn.observation, turn.messages = observation, turn.messages + (message,)
                if result.done:
                    turn.end = EndReason.DONE
                elif w.depth >= self.cfg.limits.max_turns:
                    turn.end = EndReason.MAX_TURNS
            if turn.end is not None:
                turn.reward = reward_value(reward)
                return False
            action_ids = tuple(turn.completion.token_ids)
            obs_ids = tuple(self.chat.observation_ids(action_ids, turn.messages[-1]))
        except Exception as error:  # noqa: BLE001 - formatting or tokenising this observation failed
            self._fail(w, EndReason.ENV_ERROR, f"observation: {describe_error(error)}", error)
            return False
        if len(w.context) + len(action_ids) + len(obs_ids) >= self.cfg.limits.max_context_tokens:
            turn.end = EndReason.CONTEXT
            calls = CallClock(w, self.timeline.add_env)
            self.running[self.pool.submit(calls, walker_verify)] = (calls, walker_verify)
            return False
        turn.observation_ids = obs_ids
        w.context = w.context + list(action_ids) + list(obs_ids)
        w.boundaries.append(len(w.context))
        return True

    def _fail(self, w: _Walker, reason: EndReason, message: str, error: BaseException | None = None) -> None:
        if self.cfg.raise_env_errors:
            raise EnvFailure(f"environment of rollout {w.index} (from node {w.start}): {message}") from error
        if self.env_error_sample is None:  # the first failure of the call, for the trainer's report
            trace = format_failure(error)
            self.env_error_sample = f"{reason.value} in rollout {w.index} (from node {w.start}): {message}\n{trace}"
        turn = w.turns[-1]
        turn.end, turn.reward, turn.snapshot, turn.observation_ids = reason, 0.0, None, ()
        turn.messages = turn.messages[:1]
        turn.observation = f"[{reason.value}: {message}]"
        w.env = None

    # ---- result -----------------------------------------------------------------------------------

    def _commit(self) -> GrowReport:
        """Add every recorded turn to the batch: turn-major, then walker order (the lockstep node ids)."""
        builder, end_reasons = self.builder, {}
        node_of: dict[tuple[int, int], int] = {}  # (walker, turn) -> node id
        streamed = sorted(self.walkers[self.planted:], key=lambda w: (w.seeds.pass_, w.seeds.start, w.seeds.j))
        for walkers in (self.walkers[:self.planted], streamed):  # a streamed walker's anchor comes first
            if not walkers:
                continue
            for t in range(max(len(w.turns) for w in walkers)):
                for w in walkers:
                    if t >= len(w.turns):
                        continue
                    parent = (w.start if w.anchor is None else node_of[w.anchor]) if t == 0 else node_of[w.index, t - 1]
                    turn, c = w.turns[t], w.turns[t].completion
                    node = builder.add_turn(parent, NodePayload(
                        tuple(c.token_ids), tuple(c.logprobs), turn.text, turn.observation_ids, turn.observation,
                        turn.messages, turn.snapshot, c.finish_reason, turn.end))
                    node_of[w.index, t] = node
                    if turn.end is not None:
                        builder.finish(node, turn.reward)
                        end_reasons[turn.end.value] = end_reasons.get(turn.end.value, 0) + 1
        return GrowReport(self.planted * self.cfg.limits.max_turns,
                          self.prefix_tokens, self.prefix_cached, end_reasons,
                          tuple(w.env_seconds for w in self.walkers), self.env_error_sample, self.timeline)
