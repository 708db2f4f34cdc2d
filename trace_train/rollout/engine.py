"""The tree rollout engine: TRACE's two stages on real agents, for any registered allocation policy.

One call of :meth:`RolloutEngine.rollout` turns a candidate pool of data set rows into a batch of rollout
trees. The algorithm (which prompts get how many rollouts, which prefixes get continuations, top-ups,
repeated expansion rounds, DAPO's rounds) is ``trace_theory.step.run_step``, the very driver the
simulator runs; this module is the world that answers its questions:

* **predict** candidate prompts (their opening history) or nodes (the history up to a turn boundary)
  with the caller's predictor;
* **plant** roots and **grow** rollouts (bare, top-up, continuation) from nodes: generation batched
  across all of them turn by turn, environments restored from the start node's snapshot, and the exact
  token ids of every prefix extended, never re-tokenised. Turns are scheduled by :mod:`.scheduler`:
  each rollout's next turn is requested as soon as its environment has answered, and environments of
  different rollouts run concurrently.

With ``rollout.expansion=pipelined`` the driver is ``trace_theory.pipelined.run_pipelined_step``: a call's
one generation wave also grows the previous call's continuations (:meth:`_Run._wave`,
:mod:`.pipeline`), the call returns the previous call's trees whole (None on the first), and the engine
keeps its own as :attr:`RolloutEngine.pending` until the next call or :meth:`RolloutEngine.drain`.

The batch under construction has one owner, a :class:`~.batch.BatchBuilder` (forest, payloads, paths):
the engine plants roots in it, the scheduler grows rollouts into it and reports what else it spent.

The distributed trainer's allocation over every rank's pool is the driver's ``root_allocator`` hook; a
hook that also has ``dynamic_share(policy, budget) -> (policy, budget)`` gives a dynamic-sampling policy
(DAPO, which never allocates roots) this process's part of the job's budget.

The result is a :class:`~.batch.RolloutBatch`: a ``RolloutForest`` (node costs are the tokens generated
for each turn) and one :class:`~.batch.NodePayload` per node with the exact token ids, loss masks,
log-probabilities, text and environment snapshot, plus a :class:`~.batch.RolloutReport` of the budget
actually spent, in rollouts and in tokens, and of the prompt tokens the back end computed or served from
its prefix cache.

Every random choice comes from one ``numpy.random.Generator`` seeded by the call's ``seed``, and every
turn of every rollout gets its own sampling seed, so a call is reproducible on a given back end, in
whatever order generations and environment calls complete.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_theory import (
    Origin,
    Prediction,
    RolloutBudget,
    RolloutForest,
    run_step,
)
from trace_theory.expansion import Kind, PlantEvents, Start, Starts, Wave
from trace_theory.pipelined import Pending, pipelines, run_pipelined_step
from trace_theory.step import RootAllocator, StepRecord

from ..backends.base import GenerationBackend, Sampling
from .batch import BatchBuilder, History, NodePayload, Predictor, RolloutBatch, RolloutReport, Trajectory
from ..chat import ChatFormat
from ..envs.base import Environment, Message
from .env_calls import (CallClock, EnvCallPool, EnvCallsStuck, EnvFailure, OpeningFailed, describe_error,
                        open_row)
from .pipeline import Carried, split_wave, stale_token_share, wave_builder
from .scheduler import Extra, GrowReport, Scheduler
from ..configs import RolloutConfig  # the engine's config lives with every other config (importable here too)

__all__ = ["History", "Predictor", "NodePayload", "Trajectory", "RolloutReport", "RolloutBatch",
           "RolloutConfig", "RolloutEngine"]


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------


class RolloutEngine:
    """Grows rollout forests with a generation back end and an environment (see the module docstring).

    Parameters
    ----------
    backend : GenerationBackend
        Where tokens come from.
    make_env : callable
        Returns a fresh :class:`~..envs.base.Environment`; one is made per rollout.
    config : RolloutConfig
    chat : ChatFormat, optional
        Token-level chat formatting; defaults to the back end tokenizer's template.
    root_allocator : callable, optional
        A ``trace_theory.RootAllocator``: ``root_allocator(policy, v, budget, *, rng, concentration, cost=None)
        -> m`` replaces ``policy.allocate_roots(v, budget, rng=rng, concentration=concentration, cost=cost)``. The distributed
        trainer passes one that allocates the budget over the candidate pools of all ranks together
        (``trace_train.run.distributed.GlobalRootAllocator``).
    """

    def __init__(self, backend: GenerationBackend, make_env: Callable[[], Environment], config: RolloutConfig,
                 *, chat: ChatFormat | None = None, root_allocator: RootAllocator | None = None):
        if not isinstance(config, RolloutConfig):
            raise ValueError(f"`config` must be a RolloutConfig, got {type(config).__name__}")
        self.backend = backend
        self.make_env = make_env
        self.config = config
        self.chat = chat or ChatFormat(backend.tokenizer)
        self.root_allocator = root_allocator
        self.policy = config.allocation_policy
        """The config's ``AllocationPolicy``, resolved once."""
        self.sampling = Sampling(temperature=config.temperature, top_p=config.top_p,
                                 max_new_tokens=config.limits.max_turn_tokens,
                                 stop_token_ids=self.chat.stop_token_ids)
        self.scheduler = Scheduler(backend, make_env, self.chat, self.sampling, config.schedule_config)
        self.tokens_per_rollout: float | None = None
        """Generated tokens per bare rollout, averaged over calls (weight 1/2 on the latest), for ``plan``."""
        self.continuation_cost_ratio: float = 0.5
        """Tokens of a continuation relative to a bare rollout, averaged the same way from a prior of 0.5."""
        self.turns_per_rollout: float | None = None
        """Turns per bare rollout, averaged the same way: what a token-priced policy's costs are read from."""
        self.eager_threshold: float | None = None
        """``rollout.expansion=eager``: the threshold the next call's turn-boundary decisions use, the level
        of the previous call (``StepRecord.eager_level``); None before the first (a prior from the roots)."""
        self.pending: Pending | None = None
        """``rollout.expansion=pipelined``: the last call's trees, their continuations decided and not yet
        grown (``trace_theory.pipelined.Pending``, its ``carried`` a :class:`~.pipeline.Carried`); the next
        call's wave grows them and returns them whole. None before the first call and after :meth:`drain`."""

    # -----------------------------------------------------------------------------------------------

    def plan(self) -> RolloutBudget:
        """The budget of the next call, unsplit: ``run_step`` applies the policy's split (the report's
        ``planned`` is the split budget, from the step record).

        With a rollout budget this is ``RolloutBudget(M, N)``. With ``token_budget`` T,
        a flat policy gets M = T / L roots and a branching one M = T / (L (1 + N c)), where L is the
        average of tokens per bare rollout over earlier calls (initially half of ``max_turns *
        max_turn_tokens``) and c that of a continuation's tokens relative to a bare rollout's: equal
        tokens in expectation, with what was actually spent in the report.
        """
        cfg, policy = self.config, self.policy
        if cfg.token_budget is None:
            return cfg.budget  # checked when the config was built
        tokens = self.tokens_per_rollout or 0.5 * cfg.limits.max_turns * cfg.limits.max_turn_tokens
        n = cfg.continuations_per_root if policy.branches else 0
        ratio = 1.0 if policy.priced_in_tokens else self.continuation_cost_ratio  # priced: m N rollouts' tokens
        roots = int(cfg.token_budget // (tokens * (1.0 + n * ratio)))
        if roots < policy.min_group:
            raise ValueError(f"`token_budget` {cfg.token_budget} pays for {roots} rollouts of about "
                             f"{tokens:.0f} tokens; policy {cfg.policy!r} needs at least {policy.min_group}")
        return RolloutBudget(roots, n)

    @property
    def pipelined(self) -> bool:
        """Whether calls defer their continuations to the next call (``rollout.expansion=pipelined`` with a
        policy that branches: ``trace_theory.pipelined.pipelines``)."""
        cfg = self.config
        budget = RolloutBudget(cfg.roots, cfg.continuations_per_root)
        return cfg.expansion_mode().defers and pipelines(self.policy, budget, cfg.expansion_rounds)

    def rollout(self, pool: Sequence[Mapping[str, Any]], *, predictor: Predictor | None = None,
                seed: int | None = None) -> RolloutBatch | None:
        """Allocate the budget over ``pool`` and generate the rollout trees (see the module docstring).

        Pipelined (:attr:`pipelined`): the wave also grows the previous call's continuations, and the
        call returns the previous call's trees, whole, its report describing this call's wave; None on the
        first call (the pipeline fills). :meth:`drain` finishes the last call's trees."""
        cfg = self.config
        pool = list(pool)
        if not pool:
            raise ValueError("`pool` must hold at least one data set row")
        if predictor is None and self.policy.needs_predictor:
            raise ValueError(f"policy {cfg.policy!r} allocates by predicted success: pass `predictor`")
        if self.policy.posterior and not hasattr(predictor, "concentration"):
            raise ValueError(f"policy {cfg.policy!r} needs a predictor with a "
                             "`concentration(histories)` method")
        run = _Run(self, pool, predictor, np.random.default_rng(cfg.seed if seed is None else seed))
        batch = run.execute(self.plan())
        fresh = self.pending.record.forest if self.pending is not None else None if batch is None else batch.forest
        self._learn_costs(batch, fresh)
        return batch

    def drain(self, *, seed: int | None = None) -> RolloutBatch | None:
        """Pipelined: grow :attr:`pending`'s continuations alone (a wave that plants nothing) and return its
        trees, whole; None when nothing is pending."""
        if self.pending is None:
            return None
        run = _Run(self, [], None, np.random.default_rng(self.config.seed if seed is None else seed))
        batch = run.execute(self.plan(), plant=False)
        self._learn_costs(batch, None)
        return batch

    def expected_tokens(self, depth) -> np.ndarray:
        """Expected tokens of a rollout from a turn boundary at ``depth`` (0: a fresh rollout), from the
        running estimates: L max(T - d, 1) / T, L tokens and T turns per bare rollout."""
        cfg = self.config
        tokens = self.tokens_per_rollout or 0.5 * cfg.limits.max_turns * cfg.limits.max_turn_tokens
        turns = max(self.turns_per_rollout or 0.5 * cfg.limits.max_turns, 1.0)
        return tokens * np.maximum(turns - np.asarray(depth, dtype=float), 1.0) / turns

    def _learn_costs(self, batch: RolloutBatch | None, fresh: RolloutForest | None) -> None:
        """Update the running token estimates used by :meth:`plan` (halving the weight of the past): tokens
        and turns per planted bare rollout from ``fresh``'s (the bare rollouts this call planted: the
        batch's, or under pipelined expansion the new pending's), the continuation cost ratio from
        ``batch``: what a unit of the continuation budget cost, a continuation or a top-up (a fresh rollout
        of its tree's prompt, which eager expansion starts when a one-turn rollout ends), over a planted
        bare rollout's tokens."""
        if fresh is not None:
            top_ups = batch.report.top_up_rollouts if batch is not None and fresh is batch.forest else 0
            bare, _ = _planted_and_top_ups(fresh, top_ups)
            if bare.size:
                mean = float(np.mean([_rollout_tokens(fresh, s) for s in bare]))
                previous = mean if self.tokens_per_rollout is None else self.tokens_per_rollout
                self.tokens_per_rollout = 0.5 * (previous + mean)
                turns = float(np.mean([_rollout_tokens(fresh, s, per_turn=True) for s in bare]))
                self.turns_per_rollout = turns if self.turns_per_rollout is None else 0.5 * (self.turns_per_rollout + turns)
        if batch is None:
            return
        f = batch.forest
        planted, top_ups = _planted_and_top_ups(f, batch.report.top_up_rollouts)
        bare = [_rollout_tokens(f, s) for s in planted]
        continuations = np.flatnonzero(f.starts_rollout & (f.origin == Origin.CONTINUATION))
        branch = [_rollout_tokens(f, s) for s in np.concatenate([continuations, top_ups])]
        mean = float(np.mean(bare)) if bare else 0.0
        if branch and mean > 0:
            ratio = float(np.mean(branch)) / mean
            self.continuation_cost_ratio = 0.5 * (self.continuation_cost_ratio + ratio)


def _bare_starts(f: RolloutForest) -> np.ndarray:
    return np.flatnonzero(f.starts_rollout & (f.origin == Origin.BARE))


def _planted_and_top_ups(f: RolloutForest, top_ups: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts of ``f``'s bare rollouts, split into the planted ones and the last ``top_ups``: a top-up
    grows after every planted bare rollout of its step has its nodes (the scheduler adds the planted
    walkers' turns first), so its first node's id is larger than theirs."""
    starts = _bare_starts(f)
    cut = len(starts) - int(top_ups)
    return starts[:cut], starts[cut:]


def _row(prediction: Prediction, i: int) -> Prediction:
    """Row ``i`` of a batch's :class:`Prediction`, as a prediction of one node."""
    return _rows(prediction, i, i + 1)


def _rows(prediction: Prediction, lo: int, hi: int) -> Prediction:
    """Rows [lo, hi) of a batch's :class:`Prediction`, as a prediction of those nodes."""
    def pick(a):
        return None if a is None else a[lo:hi]
    return Prediction(pick(prediction.v), pick(prediction.concentration), pick(prediction.cost))


def _extras(top_ups, more) -> list[Extra]:
    """The driver's ``rest()`` (top-ups per tree, more continuations per anchor of each tree) as the
    scheduler's records."""
    return [Extra(s, None, int(k)) for s, k in enumerate(top_ups) if k] + \
        [Extra(s, a, int(k)) for s, ks in enumerate(more) for a, k in enumerate(ks) if k]


def _rollout_tokens(forest: RolloutForest, start: int, *, per_turn: bool = False) -> float:
    """Tokens of the rollout that begins at ``start``: its turns along first children (turns with ``per_turn``)."""
    total, node = 0.0, int(start)
    while node != -1:
        total += 1.0 if per_turn else float(forest.cost[node])
        node = int(forest.first_child[node])
    return total


class _Run:
    """One ``rollout`` call as the step driver's world (``trace_theory.step.World``): it answers predict
    and plant with the pool's openings and the predictor, grows through the engine's scheduler into its
    :class:`~.batch.BatchBuilder`, and accounts for the call."""

    def __init__(self, engine: RolloutEngine, pool, predictor, rng: np.random.Generator):
        self.engine, self.cfg, self.chat = engine, engine.config, engine.chat
        self.pool, self.predictor, self.rng = pool, predictor, rng
        self.builder = BatchBuilder(binary_rewards=engine.config.binary_rewards)
        self.next_seed = int(rng.integers(0, 2**30))
        self.grown = GrowReport()
        """What the scheduler's calls spent so far (summed)."""
        self.stats_before = engine.backend.stats.copy()
        self.start = time.perf_counter()
        self.phase_seconds = dict.fromkeys(("predict", "bare_generation", "expansion_generation"), 0.0)
        self._openings: dict[int, tuple[list[Message], list[int], Any]] = {}
        self._opening_pool: EnvCallPool | None = None
        self.done: BatchBuilder | None = None
        """Pipelined: the previous call's trees, completed by this call's wave (:meth:`_wave`)."""
        self.n_old, self.wave_tokens = 0, None
        """Pipelined: nodes the completed trees had before the wave; tokens the wave generated."""

    # ---- openings and predictions -----------------------------------------------------------------

    def _opening(self, prompt: int):
        """Opening messages, prompt ids and initial snapshot of a pool row (computed once).

        When ``make_env``, ``reset``, the prompt's formatting or ``snapshot`` raises (or one of the three runs
        past ``env_timeout_s``: they run on a worker with a deadline), the row opens with a
        placeholder prompt and an :class:`~.scheduler.OpeningFailed` snapshot: every rollout from it ends
        at its first environment call with ``env_error`` and reward 0, like a failed ``step``."""
        if prompt not in self._openings:
            try:  # make_env, reset, snapshot on a worker, under env_timeout_s like every environment call
                messages, snapshot = self._opener().run(CallClock(), open_row, self.engine.make_env, self.pool[prompt])
                ids = self.chat.prompt_ids(messages)
            except EnvCallsStuck:  # not this row's fault: the process's calls are stuck, the run stops
                raise
            except Exception as error:  # noqa: BLE001 - an environment fault ends this row's rollouts only
                if self.cfg.raise_env_errors:
                    raise EnvFailure(f"environment of pool row {prompt}: reset: {describe_error(error)}") from error
                failed = OpeningFailed(f"pool row {prompt}: {describe_error(error)}", error)
                messages = [{"role": "user", "content": failed.PROMPT}]
                self._openings[prompt] = (messages, self.chat.prompt_ids(messages), failed)
                return self._openings[prompt]
            if len(ids) >= self.cfg.limits.max_context_tokens:
                raise ValueError(f"prompt {prompt} has {len(ids)} tokens; `max_context_tokens` is "
                                 f"{self.cfg.limits.max_context_tokens}")
            self._openings[prompt] = (messages, ids, snapshot)
        return self._openings[prompt]

    def _opener(self) -> EnvCallPool:
        """The one worker that opens pool rows (made at the first opening, shut down with the call)."""
        if self._opening_pool is None:
            self._opening_pool = EnvCallPool(1, self.cfg.env_timeout_s, name="trace-env-open")
        return self._opening_pool

    def _opening_history(self, prompt: int) -> History:
        """The history of a pool row's opening (before it has a root)."""
        messages, ids, _ = self._opening(prompt)
        return History(prompt, self.pool[prompt], 0, tuple(messages), tuple(ids))

    def _predict(self, histories: list[History], concentration: bool) -> Prediction:
        if not histories:
            return Prediction(np.zeros(0), np.zeros(0) if concentration else None)
        t0 = time.perf_counter()
        v = np.asarray(self.predictor(histories), dtype=float)
        kappa = np.asarray(self.predictor.concentration(histories), dtype=float) if concentration else None
        self.phase_seconds["predict"] += time.perf_counter() - t0
        cost = None
        if self.engine.policy.priced_in_tokens:  # read only by a token-priced policy (trace_tokens)
            cost = self.engine.expected_tokens([h.depth for h in histories])
        return Prediction(v, kappa, cost)

    # ---- the driver's questions (trace_theory.step.World) -----------------------------------------

    def predict_prompts(self, prompts: np.ndarray, *, concentration: bool) -> Prediction:
        return self._predict([self._opening_history(int(i)) for i in prompts], concentration)

    def predict_nodes(self, nodes: np.ndarray, *, concentration: bool) -> Prediction:
        return self._predict([self.builder.history(int(n)) for n in nodes], concentration)

    def plant(self, prompts: np.ndarray, counts: np.ndarray, events: PlantEvents | Wave | None = None) -> RolloutForest:
        """Roots for ``prompts`` with ``counts`` bare rollouts (``trace_theory.step.World.plant``), grown by the
        scheduler. With a streaming mode's ``events``: the scheduler reports each tree's prefixes as its
        bare rollouts end (and, where ``events.boundaries``, each bare rollout's turn boundaries and end as
        they happen), the mode answers with what to start, and those rollouts join the generation stream
        at once, beside the others; after the last tree, ``events.rest()`` adds the pooled leftovers and
        top-ups the same way. A pipelined :class:`~trace_theory.expansion.Wave` is :meth:`_wave`."""
        if isinstance(events, Wave):
            return self._wave(prompts, counts, events)
        prompts = prompts.tolist()
        roots = [self.builder.add_root(p, self.pool[p], *self._opening(p)) for p in prompts]
        t0, predicted = time.perf_counter(), self.phase_seconds["predict"]
        if roots:
            hooks = {} if events is None else self._hooks(prompts, events)
            self._grow(Starts.of_kind(roots, Kind.BARE, counts).tuples(), **hooks)
        self._spent("bare_generation", t0, predicted)
        return self.builder.build()

    def _spent(self, phase: str, t0: float, predicted: float) -> None:
        """Add the time since ``t0`` to ``phase``, less the predictions made meanwhile (``predicted``: the
        ``predict`` phase at ``t0``): a streaming mode's turn boundaries and tree ends are predicted inside
        the grow call, and count once, as ``predict``."""
        self.phase_seconds[phase] += time.perf_counter() - t0 - (self.phase_seconds["predict"] - predicted)

    def _hooks(self, prompts: list[int], events: PlantEvents) -> dict:
        """The scheduler's hooks (:meth:`.scheduler.Scheduler.grow`) that tell ``events`` what happens."""

        def history(s: int, p) -> History:
            return History(prompts[s], self.pool[prompts[s]], p.depth, p.messages, p.token_ids)

        ended: dict[int, tuple[Callable[[bool], Prediction], int, int]] = {}  # start -> (its poll's batch, rows)

        def ending(items):  # the trees that ended in one poll: predicted together, when the mode first asks
            histories, spans, asked = [], {}, {}
            for s, prefixes in items:
                spans[s] = (len(histories), len(histories) + len(prefixes))
                histories += [history(s, p) for p in prefixes]

            def predict(concentration: bool) -> Prediction:
                if concentration not in asked:
                    asked[concentration] = self._predict(histories, concentration)
                return asked[concentration]
            ended.clear()
            ended.update({s: (predict, lo, hi) for s, (lo, hi) in spans.items()})

        def branch(s: int, prefixes):
            reward = np.array([p.reward for p in prefixes], dtype=float)
            if s in ended:
                predict, lo, hi = ended.pop(s)
                return events.tree_ended(s, reward, lambda concentration: _rows(predict(concentration), lo, hi))
            histories = [history(s, p) for p in prefixes]
            return events.tree_ended(s, reward, lambda concentration: self._predict(histories, concentration))

        def more():
            return _extras(*events.rest())

        hooks = dict(branch=branch, rest=more, ending=ending)
        if not events.boundaries:
            return hooks
        round_: dict[int, tuple[Callable[[bool], Prediction], int]] = {}  # id(prefix) -> (its round, row)

        def ahead(items):  # one round's boundaries: predicted together, when the mode first asks
            histories, asked = [history(s, p) for s, p in items], {}

            def predict(concentration: bool) -> Prediction:
                if concentration not in asked:
                    asked[concentration] = self._predict(histories, concentration)
                return asked[concentration]
            round_.clear()
            round_.update({id(p): (predict, i) for i, (_, p) in enumerate(items)})

        def boundary(s: int, j: int, depth: int, prefix):
            if id(prefix) in round_:
                predict, i = round_.pop(id(prefix))
                return events.turn_boundary(s, j, depth, lambda concentration: _row(predict(concentration), i))
            one = [history(s, prefix)]
            return events.turn_boundary(s, j, depth, lambda concentration: self._predict(one, concentration))

        return dict(hooks, boundary=boundary, finished=events.rollout_ended, ahead=ahead)

    def _wave(self, prompts: np.ndarray, counts: np.ndarray, wave: Wave) -> RolloutForest:
        """One pipelined wave (:mod:`.pipeline`): this call's roots with their bare rollouts and the wave's
        pending continuations and top-ups, in one grow call. Afterwards :attr:`builder` holds this call's
        trees alone, :attr:`done` the pending's, whole (``wave.grown`` their forest)."""
        pending = wave.pending
        carried = None if pending is None else pending.carried
        if pending is not None and not isinstance(carried, Carried):
            raise ValueError(f"the pending step must carry the engine's trees, got {type(carried).__name__}")
        binary = self.cfg.binary_rewards
        builder, n_old, shift = wave_builder(carried, binary_rewards=binary)
        roots = [builder.add_root(p + shift, self.pool[p], *self._opening(p)) for p in prompts.tolist()]
        starts = Starts.of_kind(roots, Kind.BARE, counts)
        if pending is not None:
            starts = pending.starts + starts
        t0, predicted = time.perf_counter(), self.phase_seconds["predict"]
        if len(starts):
            report = self.engine.scheduler.grow(builder, starts.tuples(), seed=self.next_seed)
            self.next_seed += report.seeds
            self.grown = self.grown + report
        self._spent("bare_generation" if roots else "expansion_generation", t0, predicted)
        grown = builder.build()
        old_tokens = 0.0 if carried is None else float(carried.forest.cost.sum())
        self.wave_tokens = int(round(float(grown.cost.sum()) - old_tokens))
        done, self.builder = split_wave(builder, grown, n_old, shift, binary_rewards=binary)
        self.done, self.n_old, self.planted = done, n_old, self.builder.build()
        wave.grown = None if done is None else done.build()
        return self.planted

    def carry(self) -> Carried:
        """This call's trees as the next wave grows them (``Pending.carried``)."""
        return Carried(self.planted, tuple(self.builder.nodes), dict(self.builder.rows))

    def grow(self, starts: Starts) -> RolloutForest:
        t0, predicted = time.perf_counter(), self.phase_seconds["predict"]
        if len(starts):
            self._grow(starts.tuples())
        self._spent("expansion_generation", t0, predicted)
        return self.builder.build()

    def _grow(self, starts: list[Start], **hooks) -> None:
        """Generate ``k`` rollouts from each ``(node, kind, k)`` (:meth:`.scheduler.Scheduler.grow`)."""
        report = self.engine.scheduler.grow(self.builder, starts, seed=self.next_seed, **hooks)
        self.next_seed += report.seeds
        self.grown = self.grown + report

    # ---- the call and its result ------------------------------------------------------------------

    def execute(self, budget: RolloutBudget, *, plant: bool = True) -> RolloutBatch | None:
        mode = self.cfg.expansion_mode(eager_threshold=self.engine.eager_threshold)
        if mode.defers:
            return self._execute_pipelined(budget, plant)
        policy = self.engine.policy
        share = getattr(self.engine.root_allocator, "dynamic_share", None)
        if policy.reads_root_outcomes and share is not None:  # DAPO, Pilot-Commit under torchrun: this rank's part
            policy, budget = share(policy, budget)
        try:
            record = run_step(self, policy, budget, pool=len(self.pool), rng=self.rng,
                              expansion_rounds=self.cfg.expansion_rounds,
                              root_allocator=self.engine.root_allocator, expansion=mode)
        finally:
            if self._opening_pool is not None:
                self._opening_pool.shutdown()
        if record.eager_level is not None:  # the next step's threshold (trace_theory.eager.offline_level)
            self.engine.eager_threshold = record.eager_level
        return self._finish(record)

    def _execute_pipelined(self, budget: RolloutBudget, plant: bool) -> RolloutBatch | None:
        """``trace_theory.pipelined.run_pipelined_step`` with this world; the engine keeps the new pending."""
        policy, share = self.engine.policy, getattr(self.engine.root_allocator, "dynamic_share", None)
        if policy.reads_root_outcomes and share is not None:  # DAPO, Pilot-Commit (no pipelining) under torchrun
            policy, budget = share(policy, budget)
        try:
            step = run_pipelined_step(self, policy, budget, pool=len(self.pool), rng=self.rng,
                                      pending=self.engine.pending, root_allocator=self.engine.root_allocator,
                                      plant=plant)
        finally:
            if self._opening_pool is not None:
                self._opening_pool.shutdown()
        self.engine.pending = step.pending
        if step.trained is None:
            return None
        if self.done is not None:  # the previous call's trees, completed by this wave
            self.builder = self.done
        return self._finish(step.trained)

    def _finish(self, record: StepRecord) -> RolloutBatch:
        seconds = time.perf_counter() - self.start
        forest, grown = record.forest, self.grown
        end_reasons = grown.end_reasons
        if self.done is not None:  # pipelined: the batch's own rollouts' ends (the wave also ended others)
            end_reasons = {}
            for leaf in forest.leaves.tolist():
                reason = self.builder.nodes[leaf].end_reason
                end_reasons[reason.value] = end_reasons.get(reason.value, 0) + 1
        stats = self.engine.backend.stats.since(self.stats_before)
        counts = record.counts
        report = RolloutReport(
            policy=self.cfg.policy, planned=record.planned, rollouts=forest.n_leaves,
            bare_rollouts=counts["bare"] + counts["top_up"], continuations=counts["continuation"],
            top_up_rollouts=counts["top_up"], generated_tokens=int(forest.cost.sum()),
            prompt_tokens=stats.prompt_tokens, cached_prompt_tokens=stats.cached_prompt_tokens,
            continuation_prefix_tokens=grown.continuation_prefix_tokens,
            continuation_prefix_cached=grown.continuation_prefix_cached,
            rounds=record.rounds, end_reasons=dict(sorted(end_reasons.items())),
            seconds=seconds, **grown.timeline.report(seconds), continuations_by_round=record.continuations_by_round,
            continuations_by_phase=() if record.node_phase is None else tuple(
                int(n) for n in np.asarray(record.node_phase).reshape(-1, 4).sum(axis=0)),
            top_ups_at_rollout_ends=0 if record.early_top_ups is None else int(np.sum(record.early_top_ups)),
            max_rollout_env_seconds=max(grown.rollout_env_seconds, default=0.0),
            env_error_sample=grown.env_error_sample, phase_seconds=dict(self.phase_seconds),
            streamed=record.streamed, expansion=record.expansion,
            wave_tokens=int(forest.cost.sum()) if self.wave_tokens is None else self.wave_tokens,
            stale_token_share=stale_token_share(forest, self.n_old) if self.done is not None else 0.0,
            occupancy=tuple((round(a - self.start, 4), n) for (a, _), n in zip(grown.timeline.generation,
                                                                              grown.timeline.in_flight)),
        )
        return self.builder.batch(forest, record.node_predictions(), report, kept=record.kept)
