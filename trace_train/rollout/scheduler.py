"""Growing rollouts: generation and environment calls scheduled so that neither waits for a whole turn.

:meth:`Scheduler.grow` generates ``k`` rollouts from each start ``(node, kind, k)`` (a
``trace_theory.step.Start`` or a plain tuple) of a batch under construction (a
:class:`~.batch.BatchBuilder`; the engine's grow primitive), adds their turns and rewards to it and
returns a :class:`GrowReport` of what else the call spent (continuation prefix tokens, end reasons,
environment time, the first environment failure, the sampling seeds it used). A
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
  (:mod:`.env_turns` on the pool of :mod:`.env_calls`: a deadline per call, stuck workers replaced).

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

**Failures end one rollout, never the batch**, and the pool's size follows the environment's
``concurrency_safe``: see :mod:`.env_turns`, which runs every environment call of a walker's turn on an
:class:`~.env_calls.EnvCallPool` and applies its answer. Where the time goes is a :class:`Timeline`, in
the :class:`GrowReport` a call returns (both in :mod:`.timeline`); a rollout in progress is a
:class:`~.walkers.Walker`.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from trace_theory.expansion import Branch as PrefixBranch  # (depth, count): an eager decision
from trace_theory.expansion import Kind, Start  # (node, kind, count): a start of a grow call

from ..backends.base import Completion, GenerationBackend, GenerationRequest, Sampling, request_stream
from .batch import BatchBuilder, NodePayload
from ..chat import ChatFormat
from ..configs import SCHEDULES, ScheduleConfig  # they live with the configs that validate them
from ..envs.base import EndReason, Environment, Message
from .env_calls import EnvFailure, OpeningFailed  # noqa: F401 - importable from here, as they always were
from .env_turns import EnvTurns
from .timeline import GrowReport, Timeline
from .walkers import Anchor, Turn, Walker

__all__ = ["SCHEDULES", "Timeline", "EnvFailure", "OpeningFailed", "ScheduleConfig", "GrowReport", "Scheduler",
           "Prefix", "Branch", "Pass"]

BATCH_WINDOW_S = 0.02
"""With a back end that generates in batches, how long to wait after the first environment answer for
the others of the same wave before generating (one larger batch instead of many small ones)."""


# ---------------------------------------------------------------------------------------------------
# What the hooks are told and what they return
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
    """``count`` rollouts from start ``start``: from its prefix ``prefix`` (the index in what ``branch``
    saw), or with ``prefix`` None from the start's own node (top-ups, :attr:`is_top_up`). What ``rest``
    returns after the last start ended, and how the scheduler starts the continuations ``branch`` places."""

    start: int
    prefix: int | None
    count: int

    @property
    def is_top_up(self) -> bool:
        """Whether these rollouts start at the start's own node rather than at one of its prefixes."""
        return self.prefix is None


Boundary = Callable[..., Sequence[PrefixBranch]]
"""``boundary(s, j, depth, prefix) -> [Branch(depth, count), ...]`` (eager expansion): walker ``j`` of start
``s`` went on past a turn boundary at ``depth`` (``prefix``: that :class:`Prefix`, its reward unknown,
NaN); ``count`` rollouts start at once from that walker's prefix at each ``depth`` returned (0: at the
start's node, top-ups). ``Branch`` is ``trace_theory.step.Branch``."""

Finished = Callable[..., Sequence[PrefixBranch]]
"""``finished(s, j, length, reward) -> [Branch(depth, count), ...]`` (eager expansion): walker ``j`` of start
``s`` ended after ``length`` turns; the rollouts to start at once, as for :data:`Boundary`."""

Ahead = Callable[[list[tuple[int, Prefix]]], None]
"""``ahead([(s, prefix), ...])`` (eager expansion): the boundaries ``boundary`` is about to hear of, one
round's, in the order it will (so that a world can predict them in one batch); it decides nothing."""

Ending = Callable[[list[tuple[int, list[Prefix]]]], None]
"""``ending([(s, prefixes), ...])`` (streamed expansion): the starts whose walkers all ended in one poll, with
the prefixes ``branch`` is about to hear of, in the order it will (so that a world can predict them in one
batch, as :data:`Ahead` does a round's boundaries); it decides nothing."""

Rest = Callable[[], Sequence[Extra]]
"""``rest() -> [Extra(start, prefix, count), ...]``: called once ``branch`` has been called for every start:
more continuations from a prefix of a start, or top-ups at its node (:class:`Extra`)."""


class Pass(enum.IntEnum):
    """When a rollout of a grow call was started by a hook; part of its seeds (:class:`_seeds`), so the
    values are fixed."""

    TREE_ENDED = 0
    """``branch``: its start's walkers had all ended."""
    REST_CONTINUATION = 1
    """``rest``: a continuation after the last start ended."""
    REST_TOP_UP = 2
    """``rest``: a top-up after the last start ended."""
    EAGER = 3
    """``boundary`` or ``finished``: at a walker's turn boundary or end."""


class _FirstTurns(NamedTuple):
    """The request stream's key of start ``start``'s first turns (one request, a sample per walker); a
    walker's later turns are keyed by its index."""

    start: int


class _Place(NamedTuple):
    """Where a planted walker stands: the ``j``-th walker of start ``start``."""

    start: int
    j: int


@dataclass(frozen=True)
class _seeds:
    """Seeds of a streamed rollout, the ``j``-th of start ``start`` in pass ``pass_`` (a :class:`Pass`):
    turn t samples with the
    32-bit BLAKE2b hash of (grow seed, start, j, t, pass), so they do not depend on the order starts end in
    (0.4 us a turn; numpy's ``SeedSequence``, used before round 15, took 7)."""

    seed: int
    start: int
    j: int
    pass_: Pass = Pass.TREE_ENDED

    def __call__(self, t: int) -> int:
        key = _SEED_KEY.pack(self.seed, self.start, self.j, t, self.pass_)
        return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


_SEED_KEY = struct.Struct("<5q")


# ---------------------------------------------------------------------------------------------------
# The scheduler
# ---------------------------------------------------------------------------------------------------


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

    def grow(self, builder: BatchBuilder, starts: Sequence[Start | tuple[int, str, int]], *, seed: int,
             branch: Branch | None = None, rest: Rest | None = None, boundary: Boundary | None = None,
             finished: Finished | None = None, ahead: Ahead | None = None,
             ending: Ending | None = None) -> GrowReport:
        """Generate ``k`` rollouts of kind ``kind`` from each ``(node, kind, k)`` of ``builder`` (a
        ``trace_theory.step.Start`` or a plain tuple), add their turns and rewards to it, and report the
        rest; walker ``i``'s ``t``-th turn samples with seed ``seed + t W + i`` (``W`` walkers).

        ``branch`` (streamed expansion): once every walker of start ``s`` has ended, ``branch(s, prefixes)``
        says how many continuations to start from each of their :class:`Prefix` es, and they start at
        once, beside the walkers still running; after the last start, ``rest()`` adds what it returns.
        The j-th such rollout of start ``s`` samples its t-th turn with a seed drawn from (seed, s, j, t,
        pass), whatever order the starts end in; they are committed after every walker of ``starts``,
        pass by pass and start by start, so node ids do not depend on timing either.

        ``boundary`` and ``finished`` (eager expansion) are told each walker's turn boundaries and its end
        as they happen, before ``branch`` hears of its start, and the rollouts they return start at once;
        their seeds come from (seed, start, walker, depth, count so far), whatever the timing. ``ahead``
        (optional) hears of each round's boundaries first, all together (:data:`Ahead`); ``ending`` (optional)
        of the starts that ended in one poll, before ``branch`` hears of each (:data:`Ending`).
        """
        return _Grower(self, builder, [Start.of(s) for s in starts], seed, branch, rest, boundary, finished,
                       ahead, ending).run()


class _Grower:
    """One :meth:`Scheduler.grow` call: its walkers, their generation, and its report (the environment
    calls are its :class:`~.env_turns.EnvTurns`)."""

    def __init__(self, scheduler: Scheduler, builder: BatchBuilder, starts: list[Start], seed: int,
                 branch: Branch | None = None, rest: Rest | None = None,
                 boundary: Boundary | None = None, finished: Finished | None = None, ahead: Ahead | None = None,
                 ending: Ending | None = None):
        self.scheduler, self.builder, self.starts, self.seed = scheduler, builder, starts, seed
        self.cfg, self.chat = scheduler.config, scheduler.chat
        self.lockstep = self.cfg.schedule == "lockstep"
        self.walkers: list[Walker] = []
        self.first: dict[int, list[Walker]] = {}  # start index -> its walkers
        for s, start in enumerate(starts):
            context, depth = builder.context_ids(start.node), len(builder.path(start.node)) - 1
            snapshot = builder.nodes[start.node].snapshot
            group = [Walker(len(self.walkers) + j, start.node, depth, context, snapshot=snapshot)
                     for j in range(start.count)]
            self.first[s] = group
            self.walkers += group
        self.planted, self.planted_starts = len(self.walkers), len(starts)
        """Walkers and starts of ``starts``; streamed ones come after them."""
        self.branch, self.rest = branch, rest
        self.boundary, self.finished, self.ahead, self.ending = boundary, finished, ahead, ending
        self.place = {w.index: _Place(s, j) for s, group in self.first.items() for j, w in enumerate(group)}
        """Planted walker -> where it stands, for the eager hooks."""
        self.told: dict[int, int] = {}
        """Planted walker -> turn boundaries reported to ``boundary``."""
        self.untold = list(self.walkers) if boundary is not None else []
        """Planted walkers whose end was not reported yet, in walker order."""
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
        self.openings: dict[int, tuple] = {}
        """Start node -> its conversation so far (the messages every prefix of its walkers begins with)."""

    # ---- seeds and requests -----------------------------------------------------------------------

    def _request(self, w: Walker, n: int = 1) -> GenerationRequest:
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
        self.env = EnvTurns(self.scheduler.make_env, self.chat, self.cfg, self.timeline, lockstep=self.lockstep)
        sampling = self.scheduler.sampling
        try:
            for s, group in self.first.items():
                stream.submit(_FirstTurns(s), self._request(group[0], len(group)), sampling)
                self.in_flight += len(group)
            while stream.pending or self.env.running:
                if stream.pending:
                    start = time.perf_counter()
                    finished = stream.poll()
                    end = time.perf_counter()
                    self.timeline.generation.append((start, end))
                    self.timeline.in_flight.append(self.in_flight)
                    launched = [f for key, done in finished for f in self._generated(key, done)]
                    if stream.continuous and launched and self.env.faster_than(end - start):
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
            self.env.shutdown()  # never waits: a stuck call's worker is a daemon thread, abandoned
            stream.close()  # nothing left in the engine if the loop raised
        return self._commit()

    def _branch_ended(self, stream, sampling) -> None:
        """Streamed expansion: ask ``branch`` about every start whose walkers have all ended, and start
        the continuations it places (their first turns join the stream at once); ``ending`` first hears of
        every start that ended now, so that their predictions can be one batch."""
        ended = sorted(s for s in self.waiting if all(w.ended for w in self.first[s]))
        prefixes_of = {s: self._prefixes(self.first[s]) for s in ended}
        if self.ending is not None and len(ended) > 1:
            self.ending([(s, prefixes_of[s]) for s in ended])
        for s in ended:
            self.waiting.discard(s)
            prefixes = prefixes_of[s]
            k = [int(c) for c in self.branch(s, prefixes)]
            if len(k) != len(prefixes) or min(k, default=0) < 0:
                raise ValueError(f"`branch` must return {len(prefixes)} non-negative counts, got {k}")
            self.prefixes[s] = prefixes
            self._start_branches(stream, sampling, [Extra(s, a, c) for a, c in enumerate(k) if c],
                                 pass_=Pass.TREE_ENDED)

    def _tell_eager(self, stream, sampling) -> None:
        """Eager expansion: report every planted walker's new turn boundaries, then its end, and start what
        the hooks return (walker order; each walker's own events in order, which is all that decides).
        ``ahead`` first sees every boundary of the round, so that its predictions can be one batch."""
        events = []  # (walker, start, number, boundary's depth and Prefix; or None: its end)
        for w in self.untold:
            told = self.told.get(w.index, 0)
            s, j = self.place[w.index]
            for t in range(told, len(w.boundaries)):
                events.append((w, s, j, (w.start_depth + t + 1, self._prefix(w, t, math.nan))))
            self.told[w.index] = len(w.boundaries)
            if w.ended and len(w.boundaries) == len(w.turns) - 1:
                events.append((w, s, j, None))
        if self.ahead is not None and any(e[3] is not None for e in events):
            self.ahead([(s, e[1]) for _, s, _, e in events if e is not None])
        for w, s, j, event in events:
            if event is not None:
                branches = self.boundary(s, j, *event)
            else:
                self.untold.remove(w)
                branches = self.finished(s, j, w.start_depth + len(w.turns), float(w.turns[-1].reward))
            self._start_eager(stream, sampling, s, j, w, branches)

    def _prefix(self, w: Walker, t: int, reward: float) -> Prefix:
        """Walker ``w``'s turn boundary after its turn ``t`` as a :class:`Prefix`."""
        messages = self._opening(w)
        for turn in w.turns[:t + 1]:
            messages = messages + turn.messages
        return Prefix(w.index, t, w.start_depth + t + 1, reward, messages, tuple(w.context[:w.boundaries[t]]))

    def _opening(self, w: Walker) -> tuple:
        """The conversation at walker ``w``'s start node (built once per node of the batch)."""
        if w.start < 0:  # a continuation's walker: its start is no node yet
            return tuple(self.builder.messages(w.start))
        messages = self.openings.get(w.start)
        if messages is None:
            messages = self.openings[w.start] = tuple(self.builder.messages(w.start))
        return messages

    def _start_eager(self, stream, sampling, s: int, j: int, w: Walker, branches) -> None:
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
                node = self.starts[s].node
                context = self.builder.context_ids(node)
                snapshot, anchor, kind, depth = self.builder.nodes[node].snapshot, None, Kind.TOP_UP, w.start_depth
            else:
                node, context = -1, w.context[:w.boundaries[t]]
                snapshot, anchor, kind = w.turns[t].snapshot, Anchor(w.index, t), Kind.CONTINUATION
            done = self.eager_started.get((s, j, depth), 0)
            self.eager_started[s, j, depth] = done + count
            group = [Walker(len(self.walkers) + i, node, depth, list(context), snapshot=snapshot,
                            seeds=_seeds(self.seed, s, (j * 4096 + depth) * 65536 + done + i, Pass.EAGER),
                            anchor=anchor)
                     for i in range(count)]
            self._launch(stream, sampling, group, node, kind)

    def _add_rest(self, stream, sampling) -> None:
        """Streamed expansion, after the last start ended: the rollouts ``rest`` adds, continuations first."""
        by_start: dict[int, list[Extra]] = {}
        for returned in self.rest():
            extra = Extra(returned.start, returned.prefix, returned.count)
            s, k = extra.start, extra.count
            top_up = extra.is_top_up or extra.prefix == -1  # a prefix of -1 has always meant a top-up too
            if not 0 <= s < self.planted_starts or not (top_up or 0 <= extra.prefix < len(self.prefixes[s])) or k < 0:
                raise ValueError(f"`rest` returned {returned}: no such start, prefix or count")
            if k:
                by_start.setdefault(s, []).append(extra._replace(prefix=None) if top_up else extra)
        for s, extras in sorted(by_start.items()):
            self._start_branches(stream, sampling, [e for e in extras if not e.is_top_up], pass_=Pass.REST_CONTINUATION)
            self._start_branches(stream, sampling, [e for e in extras if e.is_top_up], pass_=Pass.REST_TOP_UP)

    def _start_branches(self, stream, sampling, extras: list[Extra], pass_: Pass) -> None:
        """Start each of ``extras`` (all of one start) now: ``count`` walkers from that prefix of the start,
        or from its node for top-ups; the j-th of them seeded by (seed, start, j, ``pass_``)."""
        j = 0
        for extra in extras:
            s, count = extra.start, extra.count
            if extra.is_top_up:
                node = self.starts[s].node
                context, depth = self.builder.context_ids(node), len(self.builder.path(node)) - 1
                snapshot, anchor, kind = self.builder.nodes[node].snapshot, None, Kind.TOP_UP
            else:
                prefix = self.prefixes[s][extra.prefix]
                node, context, depth = -1, list(prefix.token_ids), prefix.depth
                snapshot = self.walkers[prefix.walker].turns[prefix.turn].snapshot
                anchor, kind = Anchor(prefix.walker, prefix.turn), Kind.CONTINUATION
            group = [Walker(len(self.walkers) + i, node, depth, list(context), snapshot=snapshot,
                            seeds=_seeds(self.seed, s, j + i, pass_), anchor=anchor) for i in range(count)]
            j += count
            self._launch(stream, sampling, group, node, kind)

    def _launch(self, stream, sampling, group: list[Walker], node: int, kind: Kind) -> None:
        """Register ``group`` (walkers sharing one context) as a new start and request its first turns."""
        self.walkers += group
        key = len(self.starts)
        self.starts.append(Start(node, kind, len(group)))
        self.first[key] = group
        stream.submit(_FirstTurns(key), self._request(group[0], len(group)), sampling)
        self.in_flight += len(group)

    def _prefixes(self, walkers: list[Walker]) -> list[Prefix]:
        """The anchors of ended walkers: every turn but the last, walker by walker, by depth."""
        out = []
        for w in walkers:
            messages = self._opening(w)
            for t, turn in enumerate(w.turns[:-1]):
                messages = messages + turn.messages
                out.append(Prefix(w.index, t, w.start_depth + t + 1, float(w.turns[-1].reward), messages,
                                  tuple(w.context[:w.boundaries[t]])))
        return out

    def _generated(self, key: _FirstTurns | int, completions: list[Completion]) -> list[Future]:
        """Record the turns just generated and hand each to its environment; returns the calls' futures."""
        if isinstance(key, _FirstTurns):  # a start's first turn: k samples for its k walkers
            walkers, start = self.first[key.start], self.starts[key.start]
            if start.kind == Kind.CONTINUATION:
                self.prefix_tokens += start.count * len(walkers[0].context)
                self.prefix_cached += sum(c.cached_prompt_tokens for c in completions)
        else:
            walkers = [self.walkers[key]]
        self.in_flight -= len(walkers)
        limits, launched = self.cfg.limits, []
        for w, c in zip(walkers, completions):
            text = self.chat.action_text(tuple(c.token_ids))
            turn = Turn(c, text, ({"role": "assistant", "content": text},))
            w.turns.append(turn)
            cut = c.finish_reason == "length"  # the action never reaches the environment
            if cut:
                room = limits.max_context_tokens - len(w.context)
                turn.end = EndReason.CONTEXT if room <= limits.max_turn_tokens else EndReason.TURN_TOKENS
            launched.append(self.env.step(w, None if cut else text, cut or w.depth >= limits.max_turns))
        return launched

    def _collect(self, *, continuous: bool, generating: bool) -> list[Walker]:
        """Walkers whose environment answered: wait for the first answer unless generation is under way
        (and, on a back end that generates in batches, up to ``BATCH_WINDOW_S`` for the rest of its wave)."""
        if not self.env.running:
            return []
        if not generating:
            self.env.wait(None if continuous else BATCH_WINDOW_S)
        return self.env.answered()

    # ---- result -----------------------------------------------------------------------------------

    def _commit(self) -> GrowReport:
        """Add every recorded turn to the batch: turn-major, then walker order (the lockstep node ids)."""
        builder, end_reasons = self.builder, {}
        node_of: dict[Anchor, int] = {}  # a walker's turn -> its node id
        streamed = sorted(self.walkers[self.planted:], key=lambda w: (w.seeds.pass_, w.seeds.start, w.seeds.j))
        for walkers in (self.walkers[:self.planted], streamed):  # a streamed walker's anchor comes first
            if not walkers:
                continue
            for t in range(max(len(w.turns) for w in walkers)):
                for w in walkers:
                    if t >= len(w.turns):
                        continue
                    if t > 0:
                        parent = node_of[Anchor(w.index, t - 1)]
                    else:
                        parent = w.start if w.anchor is None else node_of[w.anchor]
                    turn, c = w.turns[t], w.turns[t].completion
                    node = builder.add_turn(parent, NodePayload(
                        tuple(c.token_ids), tuple(c.logprobs), turn.text, turn.observation_ids, turn.observation,
                        turn.messages, turn.snapshot, c.finish_reason, turn.end))
                    node_of[Anchor(w.index, t)] = node
                    if turn.end is not None:
                        builder.finish(node, turn.reward)
                        end_reasons[turn.end.value] = end_reasons.get(turn.end.value, 0) + 1
        return GrowReport(self.planted * self.cfg.limits.max_turns,
                          self.prefix_tokens, self.prefix_cached, end_reasons,
                          tuple(w.env_seconds for w in self.walkers), self.env.error_sample, self.timeline)
