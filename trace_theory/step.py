"""One TRACE step for any registered policy, run against a world that predicts and grows rollouts.

The two-stage algorithm lives here once; the simulator's Bernoulli world and the trainer's LLM +
environment world only answer the driver's questions (the :class:`World` protocol):

1. predict the candidate pool (if the root rule reads predictions) -> ``policy.allocate_roots`` (or the
   caller's ``root_allocator``, e.g. one over every rank's pool) -> group sizes m;
2. plant a root per selected prompt and grow its m_i bare rollouts;
3. for a branching policy, R >= 1 expansion rounds: the anchors are the non-terminal prefixes of the
   rollouts the previous round added (round 1: the bare rollouts); predict them (if the prefix rule
   reads predictions) -> ``policy.allocate_prefixes`` within each prompt's share of m_i N for the round;
   after the last round, budget that no anchor could take tops up the roots (:func:`top_up_roots`);
   grow top-ups and continuations together;
4. for a dynamic-sampling policy (DAPO) instead: rounds of G bare rollouts for fresh prompts in pool
   order, as :class:`~trace_theory.dynamic_sampling.DynamicSamplingState` decides, until
   ``policy.dynamic_target(budget)`` groups mixed, the budget cannot pay for a group, or the pool is
   used up;
5. for a Pilot-Commit policy instead: a pilot of p bare rollouts for each of the first n prompts (the
   pilot's share of the budget, :func:`~trace_theory.dynamic_sampling.pilot_prompts`), then the prompts whose pilot lies in the band
   grow to G, and the budget left tops them up (:func:`~trace_theory.dynamic_sampling.commit_counts`),
   all grown from their roots in one call (kind "top_up"; the commits count as bare rollouts).

The rounds, and how the continuation budget is split over them so that every policy spends exactly
M (1 + N) rollouts for every R, are :mod:`trace_theory.expansion.barrier`'s.

**When continuations start** is the expansion mode's (``expansion=``, a name of the registry
:data:`~trace_theory.expansion.EXPANSIONS` or a built :class:`~trace_theory.expansion.Expansion`): the
barrier grows the rounds above after every bare rollout; a streaming mode (streamed, eager) hands the world
its :class:`~trace_theory.expansion.PlantEvents` at ``plant`` and decides as rollouts and trees end
(one round, a prefix rule that is not randomised; otherwise the barrier runs and the record says so);
pipelined (:mod:`trace_theory.pipelined`) keeps the barrier's decisions and grows them in the next wave.

What happened is recorded once, in a :class:`StepRecord`: every prediction (candidate prompts, then
anchors with their round), the rollouts grown by kind, the rounds, and DAPO's kept groups.

**Priced in tokens.** For a policy with ``price="tokens"`` whose world returns ``Prediction.cost``,
the driver hands the rules prices in the budget's unit: a root rollout of prompt i costs
c_i / mean(c) (the root budget M is M rollouts of the pool's average cost), a continuation from anchor
a of tree i costs c_a / c_i (its prompt's share m_i N is m_i N rollouts of that prompt). Equal root
costs leave the roots rollout-priced (the same allocation), and ``root_allocator`` is handed ``cost``
only when they differ. Both stages then spend at most their budget in tokens
(:func:`~trace_theory.allocate.allocate_roots`, :func:`~trace_theory.allocate.allocate_prefixes` with
``cost``); whole rollouts' worth left over top up the roots as usual. The step is then no longer
M (1 + N) rollouts but at most that many rollouts' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from . import _checks
from .dynamic_sampling import DynamicSamplingState, commit_counts, group_outcomes, mixed_groups, pilot_prompts
from .forest import Origin, RolloutForest
from .expansion import EXPANSIONS, Expansion, PlantEvents, get_expansion
from .expansion.barrier import expand_rounds, place_continuations, round_shares
from .expansion.events import (KINDS, Branch, Kind, Prediction, Start, Starts, checked_prediction,
                               in_rollout_order)
from .policies import AllocationPolicy, RolloutBudget, RootAllocator

__all__ = ["KINDS", "Kind", "Prediction", "Start", "Starts", "World", "Branch", "StepRecord", "RootAllocator",
           "run_step", "round_shares", "in_rollout_order", "place_continuations", "plan_roots", "EXPANSIONS"]


class World(Protocol):
    """What the driver asks a world: predictions and rollouts. Prompt ids are candidate indices."""

    def predict_prompts(self, prompts: np.ndarray, *, concentration: bool) -> Prediction:
        """Predictions at the opening of the candidate prompts ``prompts``."""

    def predict_nodes(self, nodes: np.ndarray, *, concentration: bool) -> Prediction:
        """Predictions at existing nodes of the forest."""

    def plant(self, prompts: np.ndarray, counts: np.ndarray, events: PlantEvents | None = None) -> RolloutForest:
        """A root for each prompt (ids larger than any planted before) with ``counts[j]`` bare rollouts;
        returns the whole forest (roots in prompt order) once every rollout it started has ended.

        With ``events`` (a streaming expansion mode's, :mod:`trace_theory.expansion.events`): tell it each
        bare rollout's turn boundaries and end (where ``events.boundaries``), each tree's end and, after the
        last, ``rest()``, and start the rollouts each answer asks for at once, beside those still running.
        Tree j is the j-th planted prompt; its anchors are the non-terminal prefixes of its bare rollouts in
        :func:`in_rollout_order`. A pipelined wave's events are a :class:`~trace_theory.expansion.Wave`."""

    def grow(self, starts: Starts) -> RolloutForest:
        """Grow the rollouts of ``starts`` below existing nodes; returns the whole forest, new nodes with
        ids after the old ones."""


_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_F = np.zeros(0)


@dataclass(frozen=True)
class StepRecord:
    """What one step did, recorded by the driver for both worlds.

    Attributes
    ----------
    forest : RolloutForest
        Every rollout grown.
    groups : ndarray of int64, shape (pool,)
        Bare rollouts per candidate prompt, top-ups included.
    prompt_ids, prompt_v : ndarray
        Candidate prompts predicted and their predictions (empty unless the root rule reads them).
    node_ids, node_v, node_round : ndarray
        Anchors predicted, their predictions and expansion round (1..R), in the order asked.
    prompt_concentration, node_concentration : ndarray or None
        Beta concentrations, for posterior policies.
    counts : dict
        Rollouts grown by kind (keys: :data:`KINDS`).
    continuations_by_round : tuple of int
        Continuations placed in each expansion round.
    rounds : int
        Rounds of generation at the roots: 1, DAPO's number of rounds, or Pilot-Commit's 2 (pilot, commit)
        (0 if none was affordable).
    kept : ndarray of int64 or None
        DAPO: candidate prompts whose group mixed (what the update trains on); None for other policies.
    planned : RolloutBudget or None
        The budget after the policy's split (``policy.split``): the M roots and N continuations per root
        the step spent; the driver is the one place that splits.
    """

    forest: RolloutForest
    groups: np.ndarray
    prompt_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    prompt_v: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    prompt_concentration: np.ndarray | None = None
    node_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    node_v: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    node_concentration: np.ndarray | None = None
    node_round: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    counts: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    continuations_by_round: tuple[int, ...] = ()
    rounds: int = 1
    kept: np.ndarray | None = None
    committed: np.ndarray | None = None
    """Pilot-Commit: candidate prompts whose pilot lay in the band (grown to G and topped up); None for other
    policies."""
    planned: RolloutBudget | None = None
    streamed: bool = False
    """Whether each tree's expansion started as soon as its own bare rollouts ended (see the module)."""
    expansion: str = "barrier"
    """What ran: "barrier", "streamed" or "eager" (continuations committed at turn boundaries)."""
    phase_ids: np.ndarray | None = None
    """Streamed and eager: the anchors of ``node_phase`` (``node_ids`` too where the prefix rule predicts)."""
    node_phase: np.ndarray | None = None
    """Streamed and eager: continuations per anchor (aligned with ``phase_ids``) by when they were placed,
    shape (n, 4): at the prefix's turn boundary (eager), at its rollout's end (eager: what the rollout left,
    at its last prefix), once its tree ended (own budget and reserve), once every tree had ended (what
    some trees could not place)."""
    early_top_ups: np.ndarray | None = None
    """Streamed and eager: per tree, top-ups started when a one-turn bare rollout ended (eager: what it
    left of its eager budget), before the top-ups of the step's end (``counts["top_up"]`` holds both)."""
    eager_threshold: float | None = None
    """Eager: the threshold tau the step's turn-boundary decisions used."""
    eager_level: float | None = None
    """Eager: the threshold at which the rule, replayed on this step's prefixes, spends the eager budget
    (:func:`~trace_theory.eager.offline_level`): the next step's tau."""
    eager_spent: float = 0.0
    """Eager: continuation budget committed at turn boundaries (in rollouts of each prompt)."""
    eager_lag: int = 0
    """Eager: turns between a prefix forming and its decision (``EagerPlan.lag``): column 0 of
    ``node_phase`` started at the prefix's depth plus this."""

    @property
    def rollouts(self) -> int:
        return int(sum(self.counts.values()))

    def node_predictions(self) -> np.ndarray:
        """Prediction per node of the forest (roots: their prompt's), NaN where none was made."""
        out = np.full(len(self.forest), np.nan)
        roots = self.forest.roots
        at = np.full(len(self.groups), np.nan)
        at[self.prompt_ids] = self.prompt_v
        out[roots] = at[self.forest.prompt[roots]]
        out[self.node_ids] = self.node_v  # a node predicted in several rounds keeps its latest prediction
        return out


def run_step(
    world: World,
    policy: AllocationPolicy,
    budget: RolloutBudget,
    *,
    pool: int,
    rng: np.random.Generator,
    expansion_rounds: int = 1,
    root_allocator: RootAllocator | None = None,
    expansion: str | Expansion = "barrier",
) -> StepRecord:
    """Run one step of ``policy`` with ``budget`` over ``pool`` candidate prompts (see the module).

    Parameters
    ----------
    world : World
        Predicts and grows rollouts; prompt ids are candidate indices 0 .. pool - 1.
    policy : AllocationPolicy
        Any registered policy (``get_policy(name, ...)``).
    budget : RolloutBudget
        M roots and N continuations per root, unsplit: ``policy.split`` (here, and only here) decides
        what the policy spends where; the record's ``planned`` holds the result.
    pool : int
        Candidate prompts.
    rng : numpy.random.Generator
        For randomised rules (and passed to ``root_allocator``).
    expansion_rounds : int, default 1
        R: rounds of prefix expansion for a branching policy (the paper: 1).
    root_allocator : callable, optional
        ``root_allocator(policy, v, budget, *, rng, concentration) -> m`` instead of
        ``policy.allocate_roots(v, budget, rng=rng, concentration=concentration)``.
        A distributed one allocates ``budget`` over every rank's pool and returns this rank's slice, which
        may sum to less (or more) than ``budget``; everything after the roots is local to the rank.
    expansion : str or Expansion, default "barrier"
        When continuations start (:data:`~trace_theory.expansion.EXPANSIONS`; ``get_expansion("eager",
        reserve=...)`` for settings). A streaming mode runs where the policy branches with one round and a
        prefix rule that is not randomised (``policy.streams_prefixes``), else the barrier; the record's
        ``expansion`` says which ran. A mode that ``defers`` (pipelined) is driven by
        :func:`~trace_theory.pipelined.run_pipelined_step`; here it runs as the barrier.

    Returns
    -------
    StepRecord
    """
    pool = _checks.count("pool", pool)
    if _checks.count("expansion_rounds", expansion_rounds) < 1:
        raise ValueError(f"`expansion_rounds` must be at least 1, got {expansion_rounds}")
    mode = get_expansion(expansion)
    planned = RolloutBudget(*policy.split(budget))
    if policy.dynamic_sampling:
        return _dynamic_sampling(world, policy, planned, pool)
    if policy.pilot_commits:
        return _pilot_commit(world, policy, planned, pool)
    per_root = planned.continuations_per_root
    m, v, root_cost, record = plan_roots(world, policy, planned, pool=pool, rng=rng, root_allocator=root_allocator)
    active = np.flatnonzero(m > 0)
    counts = dict.fromkeys(KINDS, 0)
    counts["bare"] = int(m.sum())
    by_round: tuple[int, ...] = ()
    expands = policy.branches and per_root > 0 and active.size > 0
    streams = mode.streams and expands and expansion_rounds == 1 and policy.streams_prefixes
    if streams:
        root_v = v[active] if policy.predicts_roots else None
        forest, m, by_round = _expand_streamed(world, mode, policy, active, m, per_root, record, counts, root_cost,
                                               root_v)
    else:
        forest = world.plant(active, m[active])
        if expands:
            forest, m, by_round = expand_rounds(world, policy, forest, m, per_root, expansion_rounds, rng, record,
                                                counts, root_cost)
    return StepRecord(forest, m, counts=counts, continuations_by_round=by_round, rounds=1, planned=planned,
                      streamed=bool(streams), expansion=mode.name if streams else "barrier", **record)


def _expand_streamed(world, mode, policy, active, m, per_root, record, counts, root_cost, root_v):
    """Plant with ``mode``'s events (one round): the world starts what they decide as rollouts and trees end;
    then the record's anchors, predictions, counts and group sizes from what the mode settled."""
    m_tree = m[active]  # trees are planted in prompt order
    tree_cost = None if root_cost is None else root_cost[active]
    events = mode.events(policy, m_tree, per_root, tree_cost, root_v)
    forest = world.plant(active, m_tree, events)
    anchors = in_rollout_order(forest, _planted_anchors(forest, m_tree))
    settled = mode.settle(events, forest, anchors)
    record.update(settled.fields)
    if policy.predicts_prefixes and anchors.size:
        record.update(node_ids=anchors, node_v=settled.v, node_round=np.ones(anchors.size, dtype=np.int64))
        if policy.posterior:
            record["node_concentration"] = settled.concentration
    counts["continuation"] += settled.continuations
    counts["top_up"] += int(settled.top_ups.sum())
    groups = np.zeros_like(m)
    groups[forest.prompt[forest.roots]] = m_tree + settled.top_ups
    return forest, groups, (settled.continuations,)


def plan_roots(world: World, policy: AllocationPolicy, planned: RolloutBudget, *, pool: int,
               rng: np.random.Generator, root_allocator: RootAllocator | None = None):
    """Stage 1 of a step: predict the candidate pool (if the root rule reads predictions) and allocate the
    ``planned.roots`` root rollouts. Returns (group size per candidate m, predictions v (1/2 where none was
    asked), the world's root costs or None, the record's prompt fields)."""
    n_roots, prompts = planned.roots, np.arange(pool)
    record: dict = {}
    root_cost, priced = None, {}
    if policy.predicts_roots:
        guess = checked_prediction(world.predict_prompts(prompts, concentration=policy.posterior), pool, policy)
        v, kappa, root_cost = guess.v, guess.concentration, guess.cost
        record.update(prompt_ids=prompts, prompt_v=v, prompt_concentration=kappa)
        if root_cost is not None and pool and not np.all(root_cost == root_cost[0]):
            priced = {"cost": root_cost / root_cost.mean()}  # equal prices: the rollout-priced roots
    else:  # the rule ignores values: none are asked for
        v, kappa = np.full(pool, 0.5), None
    allocate = root_allocator or _allocate_roots_locally
    m = np.asarray(allocate(policy, v, n_roots, rng=rng, concentration=kappa, **priced), dtype=np.int64)
    if m.shape != (pool,) or (m < 0).any():  # a distributed allocator returns this rank's share of the budget
        raise ValueError(f"the root allocator must return {pool} non-negative counts, got {m!r}")
    return m, v, root_cost, record


def _allocate_roots_locally(policy, v, budget, *, rng, concentration, cost=None):
    """The default root allocator: this process's pool is the whole candidate pool."""
    return policy.allocate_roots(v, budget, rng=rng, concentration=concentration, cost=cost)


def _planted_anchors(forest: RolloutForest, m_tree: np.ndarray) -> np.ndarray:
    """The anchors of the first ``m_tree[i]`` bare rollouts of each tree (a world adds top-ups later)."""
    parent = forest.parent
    kids = np.flatnonzero((parent >= 0) & (forest.origin[np.maximum(parent, 0)] == Origin.ROOT))
    tree = forest.tree_index[kids]
    order = np.argsort(tree, kind="stable")  # by tree, then by id: the order rollouts were added
    rank = np.empty(kids.size, dtype=np.int64)
    rank[order] = np.arange(kids.size) - np.searchsorted(tree[order], tree[order])
    planted = np.zeros(len(forest), dtype=bool)
    planted[kids[rank < m_tree[tree]]] = True
    anchors = forest.prefix_anchors()
    return anchors[planted[forest.rollout_start[anchors]]]


def _dynamic_sampling(world: World, policy: AllocationPolicy, planned: RolloutBudget, pool: int) -> StepRecord:
    """DAPO: rounds of G rollouts for fresh prompts (pool order) until the target, the budget or the pool."""
    g, budget = policy.group_size, planned.total
    state = DynamicSamplingState(target=policy.dynamic_target(budget), group_size=g, budget=budget)
    drawn, rounds, kept, forest = 0, 0, [], None
    while not state.done and drawn < pool:
        prompts = np.arange(drawn, min(pool, drawn + state.next_round()))
        forest = world.plant(prompts, np.full(prompts.size, g))
        leaves = forest.leaves
        new = leaves[forest.prompt[leaves] >= drawn]
        ids, mixed = mixed_groups(forest.prompt[new], forest.reward[new])
        kept.append(ids[mixed])
        state = state.update(forest.prompt[new], forest.reward[new])
        drawn, rounds = drawn + prompts.size, rounds + 1
    if forest is None:  # the budget cannot pay for a single group
        forest = world.plant(_EMPTY_I, _EMPTY_I)
    groups = np.where(np.arange(pool) < drawn, g, 0).astype(np.int64)
    counts = dict.fromkeys(KINDS, 0)
    counts["bare"] = int(groups.sum())
    kept_ids = np.concatenate(kept) if kept else _EMPTY_I
    return StepRecord(forest, groups, counts=counts, rounds=rounds, kept=kept_ids.astype(np.int64),
                      planned=planned)


def _pilot_commit(world: World, policy: AllocationPolicy, planned: RolloutBudget, pool: int) -> StepRecord:
    """Pilot-Commit: p rollouts for each of n prompts, then the commits and top-ups from their roots."""
    p, budget = policy.pilot, planned.total
    n = pilot_prompts(budget, p, pool, policy.pilot_share)
    prompts = np.arange(n)
    forest = world.plant(prompts, np.full(n, p, dtype=np.int64))
    counts = dict.fromkeys(KINDS, 0)
    counts["bare"] = n * p
    groups = np.zeros(pool, dtype=np.int64)
    groups[:n] = p
    committed = _EMPTY_I
    if n:
        leaves = forest.leaves
        ids, _, s = group_outcomes(forest.prompt[leaves], forest.reward[leaves])
        at = np.zeros(n, dtype=np.int64)
        at[ids] = s  # planted prompts are 0 .. n - 1
        commits, top_ups = commit_counts(at, pilot=p, group_size=policy.group_size, budget=budget,
                                         band=policy.pilot_band)
        extra = commits + top_ups
        committed = np.flatnonzero(commits).astype(np.int64)
        counts["bare"] += int(commits.sum())
        counts["top_up"] = int(top_ups.sum())
        groups[:n] += extra
        roots = forest.roots
        root_of = np.empty(n, dtype=np.int64)
        root_of[forest.prompt[roots]] = roots
        grown = np.flatnonzero(extra)
        if grown.size:
            forest = world.grow(Starts.of_kind(root_of[grown], Kind.TOP_UP, extra[grown]))
    return StepRecord(forest, groups, counts=counts, rounds=2 if n else 0, committed=committed, planned=planned)

