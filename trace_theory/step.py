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
   used up.

**Splitting the continuation budget over rounds.** Prompt i's budget B_i = m_i N is dealt out evenly,
the remainder to the earliest rounds: round r (1-based) gets floor(B_i / R) + [r <= B_i mod R]. Shares
never grow from one round to the next, so a prompt keeps branching as long as it has a share. Within a
round, budget that a prompt cannot place (no anchors, all capped) goes to the other prompts' anchors
(``allocate_prefixes``); budget no anchor of the round can take rolls over to the next round, and what
is left after the last round (or once a round has no anchors at all) tops up the roots. Every policy
therefore spends exactly M (1 + N) rollouts for every R; R = 1 is the paper's algorithm.

**Streamed and eager expansion** (one round, a non-randomised prefix rule). Streamed
(:class:`StreamingWorld`): each tree's own pass runs as soon as its bare rollouts have ended, the pooled
pass and the top-ups once every tree has; the decisions are the barrier's. Eager (:class:`EagerWorld`,
``run_step(eager=EagerPlan(...))``, :mod:`trace_theory.eager`): continuations are committed at the bare
rollouts' turn boundaries by the expected utility before the outcome is known, each rollout spending its
own even share of its tree's budget (so the decisions do not depend on the order rollouts report in),
what a rollout leaves goes to its last prefix when it ends, and the plan's reserve is placed by the
policy's own pass once the tree has ended, from the committed counts; then as streamed. A reserve of 1
is streamed expansion exactly; a reserve of 0 never waits for a tree. Pipelined expansion
(:mod:`trace_theory.pipelined`) keeps the barrier's decisions and grows them in the next step's wave.

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

import enum
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

import numpy as np

from . import _checks
from .dynamic_sampling import DynamicSamplingState, mixed_groups
from .forest import Origin, RolloutForest
from .allocate import PrefixAllocation
from .eager import EagerPlan, offline_level, prior_level, rollout_budgets, threshold_spend
from .policies import AllocationPolicy, RolloutBudget, RootAllocator, top_up_roots

__all__ = ["KINDS", "Kind", "Prediction", "Start", "Starts", "World", "StreamingWorld", "EagerWorld", "TreeExpander",
           "PrefixCommitter", "Branch", "StepRecord",
           "RootAllocator", "run_step",
           "round_shares", "in_rollout_order", "place_continuations", "plan_roots"]

KINDS = ("bare", "top_up", "continuation")
"""Kinds of rollouts a world grows: bare (from a new root), top-up (extra bare rollouts from an existing
root, spending prefix budget no anchor could take) and continuation (from a prefix)."""


class Kind(enum.IntEnum):
    """Index of a kind in :data:`KINDS`."""

    BARE = 0
    TOP_UP = 1
    CONTINUATION = 2


@dataclass(frozen=True)
class Prediction:
    """Predicted success probability ``v`` per node, and the Beta ``concentration`` kappa where asked.

    ``cost``, optional: the expected tokens of one rollout from each node (a fresh rollout at a prompt,
    a continuation of its remaining turns at an anchor), read only by a policy priced in tokens
    (``price="tokens"``). None: the world does not know its costs, and every policy is rollout-priced.
    """

    v: np.ndarray
    concentration: np.ndarray | None = None
    cost: np.ndarray | None = None


class Start(NamedTuple):
    """One entry of :class:`Starts`, named: ``count`` rollouts of kind ``kind`` (a name of :data:`KINDS`)
    from node ``node``. Unpacks as ``(node, kind, count)``."""

    node: int
    kind: str
    count: int


@dataclass(frozen=True)
class Starts:
    """Rollouts to grow: ``count[j]`` rollouts of kind ``KINDS[kind[j]]`` starting at node ``node[j]``.

    The driver lists top-ups before continuations; a world may grow them all at once.
    """

    node: np.ndarray
    kind: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return len(self.node)

    def tuples(self) -> list[Start]:
        """A :class:`Start` ``(node, kind name, count)`` per start, for worlds that grow start by start."""
        return [Start(int(n), KINDS[int(k)], int(c)) for n, k, c in zip(self.node, self.kind, self.count)]

    def of(self, kind: Kind) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, counts) of the starts of one kind, in order."""
        at = self.kind == kind
        return self.node[at], self.count[at]


class World(Protocol):
    """What the driver asks a world: predictions and rollouts. Prompt ids are candidate indices."""

    def predict_prompts(self, prompts: np.ndarray, *, concentration: bool) -> Prediction:
        """Predictions at the opening of the candidate prompts ``prompts``."""

    def predict_nodes(self, nodes: np.ndarray, *, concentration: bool) -> Prediction:
        """Predictions at existing nodes of the forest."""

    def plant(self, prompts: np.ndarray, counts: np.ndarray) -> RolloutForest:
        """A root for each prompt (ids larger than any planted before) with ``counts[j]`` bare rollouts;
        returns the whole forest (roots in prompt order)."""

    def grow(self, starts: Starts) -> RolloutForest:
        """Grow the rollouts of ``starts`` below existing nodes; returns the whole forest, new nodes with
        ids after the old ones."""


class StreamingWorld(World, Protocol):
    """A world that can start a tree's expansion while other trees' bare rollouts still generate."""

    def plant_streamed(self, prompts: np.ndarray, counts: np.ndarray, expand: "TreeExpander",
                       rest: Callable[[], tuple[np.ndarray, list[np.ndarray]]]) -> RolloutForest:
        """:meth:`World.plant`, and more: once every bare rollout of tree j (the j-th planted prompt) has
        ended, call ``k = expand(j, reward, predict)`` and start ``k[a]`` continuations from each of the
        tree's anchors at once, beside the rollouts still running. Once every tree has been expanded,
        call ``top_ups, more = rest()`` and start ``top_ups[j]`` bare rollouts at root j and ``more[j][a]``
        continuations at anchor a of tree j, also at once.

        The tree's anchors are the non-terminal prefixes of its bare rollouts, rollout by rollout in
        planting order and by depth within a rollout (the order of :func:`in_rollout_order`);
        ``reward`` is the factual reward of each anchor (its rollout's) and ``predict(concentration=...)``
        returns the world's :class:`Prediction` at the anchors. Call ``expand`` once per planted tree,
        in any order, then ``rest`` once. Returns the whole forest once every rollout has ended.
        """


class EagerWorld(StreamingWorld, Protocol):
    """A world that can start continuations at the turn boundary where their prefix forms."""

    def plant_eager(self, prompts: np.ndarray, counts: np.ndarray, commit: "PrefixCommitter",
                    expand: "TreeExpander", rest: Callable[[], tuple[np.ndarray, list[np.ndarray]]]) -> RolloutForest:
        """:meth:`StreamingWorld.plant_streamed`, and more: each time bare rollout j (in planting order
        within its tree) of tree i reaches a turn boundary that is not its last, call
        ``k = commit(i, j, depth, predict)`` (``depth`` the prefix's turns, 1, 2, ... for each rollout in
        turn; ``predict(concentration=...)`` the :class:`Prediction` at that one prefix) and start, for
        each :class:`Branch` returned, ``count`` continuations from that rollout's prefix at ``depth``
        (this one, or one turn back) at once. Once every bare rollout of tree i has ended (after its
        commits), call ``expand`` as the streaming world does; its ``predict`` may serve the predictions
        the commits were given. Calls for one rollout come in depth order; across rollouts and trees, in
        any order: the decisions do not depend on it.

        ``commit`` carries ``commit.ended(i, j, length, reward) -> (Branch, ...)``: call it when bare
        rollout j of tree i ends after ``length`` turns with ``reward`` (after its commits, before its
        tree's ``expand``) and start the branches at once: continuations from its prefix at depth
        ``length - 1``, or bare top-ups at the root (depth 0) when ``length`` is 1.
        """


TreeExpander = Callable[..., np.ndarray]
"""``expand(tree, reward, predict) -> k``: the driver's decision for one tree (:class:`StreamingWorld`)."""

class Branch(NamedTuple):
    """Continuations to start now from one prefix of a running (or just ended) bare rollout."""

    depth: int
    """The prefix's depth along the rollout (0: its root; then the ``count`` rollouts are bare top-ups)."""
    count: int
    """How many rollouts to start there."""


PrefixCommitter = Callable[..., tuple]
"""``commit(tree, rollout, depth, predict) -> (Branch, ...)``, with ``commit.ended(tree, rollout, length,
reward) -> (Branch, ...)``: the driver's decisions at turn boundaries (:class:`EagerWorld`)."""

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
        Rounds of generation at the roots: 1, or DAPO's number of rounds (0 if none was affordable).
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
    eager_lag: int = 0
    """Eager: turns between a prefix forming and its decision (``EagerPlan.lag``): column 0 of
    ``node_phase`` started at the prefix's depth plus this."""
    """Eager: continuation budget committed at turn boundaries (in rollouts of each prompt)."""

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


def round_shares(budget, rounds: int) -> np.ndarray:
    """Per-prompt continuation budget dealt over ``rounds`` rounds, shape (rounds, n_prompts).

    Round r (1-based) gets floor(B / R) + [r <= B mod R]: even, the remainder to the earliest rounds.

    >>> round_shares([5, 1, 0], 2).tolist()
    [[3, 1, 0], [2, 0, 0]]
    """
    budget = _checks.counts("budget", _checks.vector("budget", budget, dtype=None))
    if _checks.count("rounds", rounds) < 1:
        raise ValueError(f"`rounds` must be at least 1, got {rounds}")
    base, extra = np.divmod(budget, rounds)
    r = np.arange(1, rounds + 1)[:, None]
    return (base[None, :] + (r <= extra[None, :])).astype(np.int64)


def run_step(
    world: World,
    policy: AllocationPolicy,
    budget: RolloutBudget,
    *,
    pool: int,
    rng: np.random.Generator,
    expansion_rounds: int = 1,
    root_allocator: RootAllocator | None = None,
    streamed: bool = False,
    eager: EagerPlan | None = None,
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
    streamed : bool, default False
        Start each tree's expansion as soon as its own bare rollouts have ended (see the module), where
        the world can (:class:`StreamingWorld`), the policy's prefix rule is not randomised
        (``policy.streams_prefixes``) and ``expansion_rounds`` is 1; otherwise the step runs with the
        barrier. The decisions are the same either way; the record says which ran.
    eager : EagerPlan, optional
        Commit continuations at turn boundaries (:mod:`trace_theory.eager`): 1 - ``eager.reserve`` of each
        tree's budget by the expected utility as prefixes form, the reserve by the policy's own rule once
        the tree's bare rollouts have ended, then what is left as streamed expansion spends it. Runs where
        streamed expansion would and the world is an :class:`EagerWorld`; otherwise as ``streamed``.
        ``eager.reserve = 1`` is streamed expansion exactly.

    Returns
    -------
    StepRecord
    """
    pool = _checks.count("pool", pool)
    if _checks.count("expansion_rounds", expansion_rounds) < 1:
        raise ValueError(f"`expansion_rounds` must be at least 1, got {expansion_rounds}")
    planned = RolloutBudget(*policy.split(budget))
    if policy.dynamic_sampling:
        return _dynamic_sampling(world, policy, planned, pool)
    per_root = planned.continuations_per_root
    m, v, root_cost, record = plan_roots(world, policy, planned, pool=pool, rng=rng, root_allocator=root_allocator)
    active = np.flatnonzero(m > 0)
    counts = dict.fromkeys(KINDS, 0)
    counts["bare"] = int(m.sum())
    by_round: tuple[int, ...] = ()
    expands = policy.branches and per_root > 0 and active.size > 0
    can_stream = expands and expansion_rounds == 1 and policy.streams_prefixes
    eagerly = eager is not None and can_stream and hasattr(world, "plant_eager")
    streams = (streamed or eager is not None) and can_stream and hasattr(world, "plant_streamed")
    if eagerly:
        root_v = v[active] if policy.predicts_roots else None
        forest, m, by_round = _expand_streamed(world, policy, active, m, per_root, record, counts, root_cost,
                                               eager=eager, root_v=root_v)
    elif streams:
        forest, m, by_round = _expand_streamed(world, policy, active, m, per_root, record, counts, root_cost)
    else:
        forest = world.plant(active, m[active])
        if expands:
            forest, m, by_round = _expand(world, policy, forest, m, per_root, expansion_rounds, rng, record,
                                          counts, root_cost)
    expansion = "eager" if eagerly else "streamed" if streams else "barrier"
    return StepRecord(forest, m, counts=counts, continuations_by_round=by_round, rounds=1, planned=planned,
                      streamed=bool(streams or eagerly), expansion=expansion, **record)


def plan_roots(world: World, policy: AllocationPolicy, planned: RolloutBudget, *, pool: int,
               rng: np.random.Generator, root_allocator: RootAllocator | None = None):
    """Stage 1 of a step: predict the candidate pool (if the root rule reads predictions) and allocate the
    ``planned.roots`` root rollouts. Returns (group size per candidate m, predictions v (1/2 where none was
    asked), the world's root costs or None, the record's prompt fields)."""
    n_roots, prompts = planned.roots, np.arange(pool)
    record: dict = {}
    root_cost, priced = None, {}
    if policy.predicts_roots:
        guess = _checked(world.predict_prompts(prompts, concentration=policy.posterior), pool, policy)
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


def _checked(guess: Prediction, n: int, policy: AllocationPolicy) -> Prediction:
    """A world's prediction, checked: n probabilities (and n concentrations for a posterior policy)."""
    v = np.asarray(guess.v, dtype=float)
    if v.shape != (n,) or not np.all((v >= 0) & (v <= 1)):
        raise ValueError(f"the predictor must return {n} probabilities in [0, 1], got {v!r}")
    kappa = guess.concentration
    if policy.posterior:
        kappa = np.asarray(kappa, dtype=float)
        if kappa.shape != (n,) or not np.all(kappa > 0):
            raise ValueError(f"policy {policy.name!r} needs {n} positive concentrations, got {kappa!r}")
    cost = getattr(guess, "cost", None)
    if policy.priced_in_tokens and cost is not None:
        cost = np.asarray(cost, dtype=float)
        if cost.shape != (n,) or not np.all(np.isfinite(cost) & (cost > 0)):
            raise ValueError(f"the world must return {n} positive finite costs, got {cost!r}")
    return Prediction(v, kappa if policy.posterior else None, cost if policy.priced_in_tokens else None)


def _expand(world, policy, forest, m, per_root, rounds, rng, record, counts, root_cost=None):
    """Stage 2 over ``rounds`` expansion rounds (see the module); returns (forest, groups, per round)."""
    roots = forest.roots
    tree_cost = None if root_cost is None else root_cost[forest.prompt[roots]]  # tokens of a rollout, per tree
    m_tree = m[forest.prompt[roots]]  # group sizes in tree order
    shares = round_shares(per_root * m_tree, rounds)
    carry = np.zeros(len(roots), dtype=np.int64)
    anchors = in_rollout_order(forest, forest.prefix_anchors())
    asked_ids, asked_v, asked_kappa, asked_round, by_round = [], [], [], [], []
    for r in range(rounds):
        last = r == rounds - 1 or anchors.size == 0  # with nothing to branch from, the rest tops up roots
        budget = (shares[r:].sum(0) if last else shares[r]) + carry
        if policy.predicts_prefixes and anchors.size:
            asked = world.predict_nodes(anchors, concentration=policy.posterior)
            guess = _checked(asked, anchors.size, policy)
            v = guess.v
            asked_ids.append(anchors), asked_v.append(v), asked_round.append(np.full(anchors.size, r + 1))
            asked_kappa.append(guess.concentration)
            price = None
            if guess.cost is not None and tree_cost is not None:  # a continuation in rollouts of its prompt
                price = guess.cost / tree_cost[forest.tree_index[anchors]]
        else:
            v, price = np.full(anchors.size, 0.5), None
        alloc = place_continuations(policy, forest, anchors, v, budget, rng=rng, cost=price)
        carry = alloc.unspent
        by_round.append(int(alloc.k.sum()))
        before = len(forest)
        forest, m_tree = _grow_round(world, forest, anchors, alloc, m_tree, counts, last=last)
        if last:
            break
        new = np.arange(before, len(forest))
        anchors = in_rollout_order(forest, new[~forest.is_leaf[new]])
    if asked_ids:
        record.update(node_ids=np.concatenate(asked_ids), node_v=np.concatenate(asked_v),
                      node_round=np.concatenate(asked_round))
        if policy.posterior:
            record["node_concentration"] = np.concatenate(asked_kappa)
    groups = np.zeros_like(m)
    groups[forest.prompt[roots]] = m_tree
    return forest, groups, tuple(by_round)


class _StreamedExpansion:
    """The streamed expansion's decisions (:class:`StreamingWorld`): the first pass of
    ``policy.allocate_prefixes`` (:meth:`~trace_theory.policies.AllocationPolicy.place_own_budgets`) on
    one tree's anchors within its own budget m_i N as soon as the world reports the tree ended
    (:meth:`expand`); once every tree has, the pooled pass over all anchors and the top-ups (:meth:`rest`)."""

    def __init__(self, policy: AllocationPolicy, m_tree: np.ndarray, per_root: int, tree_cost: np.ndarray | None):
        self.policy, self.m_tree, self.budget, self.tree_cost = policy, m_tree, per_root * m_tree, tree_cost
        self.decided: dict[int, tuple] = {}
        """tree -> (factual rewards, v, concentration, price, k, unspent)."""
        self.result: tuple | None = None
        """After :meth:`rest`: (v, concentration, price, first pass, whole allocation, top-ups)."""

    def expand(self, tree: int, reward, predict: Callable[..., Prediction]) -> np.ndarray:
        policy, tree = self.policy, int(tree)
        if not 0 <= tree < len(self.budget) or tree in self.decided:
            raise ValueError(f"the world must expand each of its {len(self.budget)} trees once, got tree {tree}")
        reward = np.asarray(reward, dtype=float).reshape(-1)
        n = reward.size
        v, kappa, price = self._predictions(tree, n, predict)
        start, at_end, budget = self._committed(tree, n)
        first = policy.place_own_budgets(v, reward, np.zeros(n, dtype=np.int64), np.array([budget]),
                                         cost=price, start=start)
        self.decided[tree] = (reward, v, kappa, price, start + first.k, int(first.unspent[0]), start, at_end)
        return first.k.copy()

    def _predictions(self, tree: int, n: int, predict):
        """(v, concentration, price) at the tree's ``n`` anchors."""
        policy, v, kappa, price = self.policy, np.full(n, 0.5), None, None
        if policy.predicts_prefixes and n:
            guess = _checked(predict(concentration=policy.posterior), n, policy)
            v, kappa = guess.v, guess.concentration
            if guess.cost is not None and self.tree_cost is not None:
                price = guess.cost / self.tree_cost[tree]
        return v, kappa, price

    def _committed(self, tree: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Continuations already committed at the tree's anchors (all; those at their rollout's end), and the
        budget left for its own pass."""
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), int(self.budget[tree])

    def rest(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """What some trees could not place, pooled over every anchor, and the top-ups: (top-ups per tree,
        more continuations per anchor of each tree)."""
        n_trees = len(self.budget)
        missing = sorted(set(range(n_trees)) - set(self.decided))
        if missing or self.result is not None:
            raise ValueError(f"the world must call rest() once, after expanding every tree (trees {missing} "
                             f"of its {n_trees} were not)" if missing else "the world must call rest() once")
        parts = [self.decided[t] for t in range(n_trees)]
        reward = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        kappa = np.concatenate([p[2] for p in parts if p[0].size]) if self.policy.posterior and v.size else None
        priced = [p[3] is not None for p in parts if p[0].size]
        price = np.concatenate([p[3] for p in parts if p[0].size]) if priced and all(priced) else None
        first = PrefixAllocation(np.concatenate([p[4] for p in parts]).astype(np.int64),
                                 np.array([p[5] for p in parts], dtype=np.int64))
        alloc = self.policy.place_leftover(v, reward, first, cost=price) if v.size else first
        top_ups = np.zeros(n_trees, dtype=np.int64)
        if alloc.unspent.sum():
            top_ups = top_up_roots(self.m_tree, int(alloc.unspent.sum())) - self.m_tree
        early = np.concatenate([p[6] for p in parts]).astype(np.int64)
        at_end = np.concatenate([p[7] for p in parts]).astype(np.int64)
        self.phase = np.stack([early - at_end, at_end, first.k - early, alloc.k - first.k], axis=1)
        self.result = (v, kappa, first, alloc, top_ups)
        bounds = np.cumsum([0] + [p[0].size for p in parts])
        more = alloc.k - first.k
        return top_ups.copy(), [more[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:])]

    def check(self, forest: RolloutForest, anchors: np.ndarray) -> None:
        """That the world reported the anchors of ``forest`` (per tree, in order, with their rewards)."""
        if self.result is None:
            self.rest()  # raises: some tree was not expanded, or rest() was not called
        per_tree = np.bincount(forest.tree_index[anchors], minlength=len(self.budget))
        factual = forest.reward[forest.factual_leaf[anchors]]
        reported = [self.decided[t][0] for t in range(len(self.budget))]
        if [r.size for r in reported] != per_tree.tolist() or not np.array_equal(np.concatenate(reported), factual):
            raise ValueError("the world's anchors per tree (rollout order, factual rewards) differ from its forest's")


class _EagerExpansion(_StreamedExpansion):
    """Eager expansion's decisions (:class:`EagerWorld`, :mod:`trace_theory.eager`): at each turn boundary of
    a bare rollout (:meth:`commit`), the units of expected gain per price above the plan's threshold that
    the rollout's eager budget pays for; once the tree has ended (:meth:`expand`), the tree's reserve and
    whatever its rollouts left by the policy's outcome-aware rule, from the counts committed; then
    :meth:`rest` as streamed."""

    def __init__(self, policy, m_tree, per_root, tree_cost, plan: EagerPlan, root_v=None):
        super().__init__(policy, m_tree, per_root, tree_cost)
        self.plan = plan
        self.eager_budget = plan.eager_budget(self.budget)
        self.left = [b.astype(float) for b in rollout_budgets(self.eager_budget, m_tree)]
        self.asks = bool(self.eager_budget.sum())  # reserve 1: no decision at a boundary, streamed exactly
        threshold = plan.threshold
        if threshold is None and self.asks:
            v0 = np.full(len(m_tree), 0.5) if root_v is None else np.asarray(root_v, dtype=float)
            threshold = prior_level(v0, m_tree, [b.copy() for b in self.left])
        self.threshold = threshold
        self.commits: dict[int, dict[tuple[int, int], tuple]] = {}
        """tree -> {(rollout, depth): (v, concentration, price, k)}."""
        self.stay: dict[tuple[int, int], tuple[float, float]] = {}
        self.finished: set[tuple[int, int]] = set()
        self.rewards: dict[tuple[int, int], float] = {}
        self.early_top_ups = np.zeros(len(m_tree), dtype=np.int64)

    def commit(self, tree: int, rollout: int, depth: int, predict: Callable[..., Prediction]) -> tuple[Branch, ...]:
        """Bare rollout ``rollout`` of ``tree`` reached a turn boundary at ``depth``, not its last: the
        continuations to start now (at this prefix, or with ``lag`` 1 at the one before, now that the
        factual branch's next prediction is known)."""
        tree, rollout, depth = int(tree), int(rollout), int(depth)
        if not 0 <= tree < len(self.budget) or not 0 <= rollout < int(self.m_tree[tree]) or tree in self.decided:
            raise ValueError(f"the world committed at tree {tree}, rollout {rollout}: not a running bare rollout")
        seen = self.commits.setdefault(tree, {})
        if depth != 1 + sum(1 for (j, _) in seen if j == rollout) or (tree, rollout) in self.finished:
            raise ValueError(f"the world must commit at each rollout's prefixes in depth order; tree {tree}, "
                             f"rollout {rollout} reported depth {depth}")
        if not self.asks:
            seen[rollout, depth] = None
            return ()
        v, kappa, price = _StreamedExpansion._predictions(self, tree, 1, predict)
        seen[rollout, depth] = [float(v[0]), None if kappa is None else float(kappa[0]),
                                None if price is None else float(price[0]), 0, 0]
        if self.plan.lag == 0:
            return self._decide(tree, rollout, depth, float(v[0]))
        return self._decide(tree, rollout, depth - 1, float(v[0])) if depth > 1 else ()

    def _decide(self, tree: int, rollout: int, depth: int, later: float) -> tuple[Branch, ...]:
        """The threshold rule at the rollout's prefix at ``depth``, the factual branch now at ``later``."""
        row = self.commits[tree][rollout, depth]
        unit = 1.0 if row[2] is None else row[2]
        s1, s0 = self.stay.get((tree, rollout), (1.0, 1.0))
        k, spent = threshold_spend(row[0], unit, self.left[tree][rollout], self.threshold, v_later=later,
                                   max_per_anchor=self.policy.max_per_anchor, objective=self.plan.objective,
                                   stay=(s1, s0))
        self.left[tree][rollout] -= spent
        self.stay[tree, rollout] = (s1 * row[0] ** k, s0 * (1.0 - row[0]) ** k)
        row[3] += int(k)
        return (Branch(depth, int(k)),) if k else ()

    def ended(self, tree: int, rollout: int, length: int, reward: float) -> tuple[Branch, ...]:
        """Bare rollout ``rollout`` of ``tree`` ended after ``length`` turns with ``reward``: with ``lag`` 1 the
        rule at its last prefix (r known: the paper's flip), then what it left of its eager budget, all as
        continuations from that last prefix (depth length - 1; at the root when length = 1: top-ups),
        started at once. From there a continuation ends at most one turn after the longest bare rollout
        could, so the step stays one episode deep."""
        tree, rollout, length = int(tree), int(rollout), int(length)
        seen = self.commits.get(tree, {})
        if tree in self.decided or length != 1 + sum(1 for (j, _) in seen if j == rollout) or (
                (tree, rollout) in self.finished):
            raise ValueError(f"the world must report each bare rollout's end once, after its {length - 1} "
                             f"prefixes; tree {tree}, rollout {rollout}")
        self.finished.add((tree, rollout))
        self.rewards[tree, rollout] = float(reward)
        if not self.asks:
            return ()
        out = []
        if self.plan.lag == 1 and length > 1:
            out += self._decide(tree, rollout, length - 1, float(reward))
        left = self.left[tree][rollout]
        if length == 1:
            k = int(np.floor(left + 1e-9))  # a top-up is one rollout of the prompt
            self.early_top_ups[tree] += k
            self.left[tree][rollout] -= k
            return (Branch(0, k),) if k else ()
        row = seen[rollout, length - 1]
        unit = 1.0 if row[2] is None else row[2]
        k = int(np.floor(left / unit * (1.0 + 1e-9) + 1e-9))
        if self.policy.max_per_anchor is not None:
            k = min(k, self.policy.max_per_anchor - row[3])
        row[4] += k
        self.left[tree][rollout] -= k * unit
        return tuple(out) + ((Branch(length - 1, k),) if k else ())

    def _ordered(self, tree: int, n: int) -> list:
        seen = self.commits.get(tree, {})
        if len(seen) != n:
            raise ValueError(f"the world committed at {len(seen)} prefixes of tree {tree} but expands {n} anchors")
        return [seen[key] for key in sorted(seen)]

    def _predictions(self, tree, n, predict):
        """At the tree's end: the predictions its commits were given, in anchor order (asked once per prefix)."""
        if not (self.asks and self.policy.predicts_prefixes and n):
            return super()._predictions(tree, n, predict)
        rows = self._ordered(tree, n)
        v = np.array([r[0] for r in rows])
        kappa = np.array([r[1] for r in rows]) if self.policy.posterior else None
        price = np.array([r[2] for r in rows]) if rows[0][2] is not None else None
        return v, kappa, price

    def _committed(self, tree, n):
        if not self.asks:
            return super()._committed(tree, n)
        rows = self._ordered(tree, n)
        at_end = np.array([r[4] for r in rows], dtype=np.int64)
        k = np.array([r[3] for r in rows], dtype=np.int64) + at_end
        price = np.array([1.0 if r[2] is None else r[2] for r in rows])
        spent = float(np.dot(k, price)) + float(self.early_top_ups[tree])
        if self.plan.reserve == 0:  # never wait: what buys no whole continuation at a rollout's end is not spent
            return k, at_end, 0
        return k, at_end, int(np.floor(self.budget[tree] - spent + 1e-9))

    def level(self) -> tuple[float, float]:
        """(offline level of this step's prefixes at the eager budget, budget committed by the rule)."""
        v, later, price, rollout, budgets, spent = [], [], [], [], [], 0.0
        n_rollouts = 0
        for tree in range(len(self.budget)):
            b = rollout_budgets(self.eager_budget[tree:tree + 1], self.m_tree[tree:tree + 1])[0]
            rows = sorted((key, row) for key, row in self.commits.get(tree, {}).items() if row is not None)
            for i, ((j, d), row) in enumerate(rows):
                v.append(row[0]), price.append(1.0 if row[2] is None else row[2]), rollout.append(n_rollouts + j)
                nxt = rows[i + 1] if i + 1 < len(rows) else None
                if self.plan.lag == 0:
                    later.append(row[0])
                elif nxt is not None and nxt[0][0] == j:
                    later.append(nxt[1][0])
                else:
                    later.append(self.rewards.get((tree, j), row[0]))
                spent += row[3] * price[-1]  # what the rule committed (not what rollouts left at their end)
            budgets.append(b)
            n_rollouts += b.size
        if not v:
            return (self.threshold if self.threshold is not None else 0.0), spent
        flat = np.concatenate(budgets).astype(float)
        level = offline_level(np.array(v), np.array(price), np.array(rollout), flat, float(self.eager_budget.sum()),
                              max_per_anchor=self.policy.max_per_anchor, objective=self.plan.objective,
                              v_later=np.array(later))
        return level, spent


class _Committer:
    """``commit(tree, rollout, depth, predict)`` with ``.ended(tree, rollout, length, reward)``: what an
    :class:`EagerWorld` calls (:data:`PrefixCommitter`)."""

    def __init__(self, decide: _EagerExpansion):
        self.ended = decide.ended
        self._commit = decide.commit

    def __call__(self, tree, rollout, depth, predict) -> tuple[Branch, ...]:
        return self._commit(tree, rollout, depth, predict)


def _expand_streamed(world, policy, active, m, per_root, record, counts, root_cost=None, eager=None, root_v=None):
    """Stage 2 with one round, streamed: each tree's own budget is placed (and grown) as soon as its bare
    rollouts end; once every tree has, what some trees could not place goes to every anchor and tops up
    the roots, as in :func:`_expand` (the same allocation: ``allocate_prefixes`` = own pass + leftover).
    With an :class:`EagerPlan`, continuations are first committed at turn boundaries (:class:`_EagerExpansion`)."""
    m_tree = m[active]  # trees are planted in prompt order
    tree_cost = None if root_cost is None else root_cost[active]
    if eager is None:
        decide = _StreamedExpansion(policy, m_tree, per_root, tree_cost)
        forest = world.plant_streamed(active, m_tree, decide.expand, decide.rest)
    else:
        decide = _EagerExpansion(policy, m_tree, per_root, tree_cost, eager, root_v)
        forest = world.plant_eager(active, m_tree, _Committer(decide), decide.expand, decide.rest)
        level, spent = decide.level()
        record.update(eager_threshold=decide.threshold, eager_level=level, eager_spent=spent, eager_lag=eager.lag)
    anchors = in_rollout_order(forest, _planted_anchors(forest, m_tree))
    decide.check(forest, anchors)
    v, kappa, first, alloc, top_ups = decide.result
    record.update(node_phase=decide.phase, phase_ids=anchors)
    if policy.predicts_prefixes and anchors.size:
        record.update(node_ids=anchors, node_v=v, node_round=np.ones(anchors.size, dtype=np.int64))
        if policy.posterior:
            record["node_concentration"] = kappa
    counts["continuation"] += int(alloc.k.sum())
    early = getattr(decide, "early_top_ups", np.zeros_like(top_ups))
    record["early_top_ups"] = early.copy()
    counts["top_up"] += int(top_ups.sum() + early.sum())
    groups = np.zeros_like(m)
    groups[forest.prompt[forest.roots]] = m_tree + top_ups + early
    return forest, groups, (int(alloc.k.sum()),)


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


def _grow_round(world, forest, anchors, alloc, m_tree, counts, *, last):
    """Grow one round's top-ups (after the last round, of what is unspent) and continuations
    (``alloc.k``); returns (forest, group sizes with top-ups)."""
    roots = forest.roots
    extra = np.zeros(len(roots), dtype=np.int64)
    if last and alloc.unspent.sum():
        extra = top_up_roots(m_tree, int(alloc.unspent.sum())) - m_tree
    k = alloc.k
    branch, topped = np.flatnonzero(k), np.flatnonzero(extra)
    kinds = np.repeat(np.array([Kind.TOP_UP, Kind.CONTINUATION], dtype=np.int8), [topped.size, branch.size])
    starts = Starts(np.concatenate([roots[topped], anchors[branch]]), kinds,
                    np.concatenate([extra[topped], k[branch]]).astype(np.int64))
    counts["top_up"] += int(extra.sum())
    counts["continuation"] += int(k.sum())
    if len(starts):
        forest = world.grow(starts)
    return forest, m_tree + extra


def place_continuations(policy: AllocationPolicy, forest: RolloutForest, anchors, v, budget, *, rng=None,
                        cost=None):
    """Continuations per anchor by ``policy``'s prefix rule: one expansion round's decision on ``forest``.

    ``v`` is the prediction at each anchor, ``budget`` the continuation budget of each tree (in
    ``forest.roots`` order); the factual reward of an anchor is that of its own rollout's leaf
    (``forest.factual_leaf``). ``cost``: price of a continuation per anchor, in rollouts of its prompt
    (read by a policy priced in tokens). Returns ``policy.allocate_prefixes``' :class:`PrefixAllocation`.
    """
    anchors = np.asarray(anchors, dtype=np.int64)
    factual = forest.reward[forest.factual_leaf[anchors]]
    return policy.allocate_prefixes(v, factual, forest.tree_index[anchors], budget, rng=rng, cost=cost)


def in_rollout_order(forest: RolloutForest, nodes: np.ndarray) -> np.ndarray:
    """``nodes`` sorted by (tree, first turn of their rollout, depth), whatever a world's node numbering.

    The simulator numbers nodes rollout by rollout, the engine turn by turn across rollouts; the uniform
    prefix rule (anchor order) and the ties of the active one (lower anchor first) must see the same
    order in both. Nodes already in that order (the simulator's, in id order) come back unsorted.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    tree = forest.tree_index[nodes]
    if _ascending(nodes) and _ascending(tree) and _numbered_by_rollout(forest):
        return nodes.copy()  # ids in order within each tree are (first turn, depth) in order
    start, depth = forest.rollout_start[nodes], forest.depth[nodes]
    t0, t1, s0, s1 = tree[:-1], tree[1:], start[:-1], start[1:]
    if ((t0 < t1) | ((t0 == t1) & ((s0 < s1) | ((s0 == s1) & (depth[:-1] <= depth[1:]))))).all():
        return nodes.copy()
    return nodes[np.lexsort((depth, start, tree))]


def _ascending(a: np.ndarray) -> bool:
    return bool((a[1:] >= a[:-1]).all())


def _numbered_by_rollout(forest: RolloutForest) -> bool:
    """Whether every rollout's turns carry consecutive ids (the simulator's numbering): then id order is
    (first turn, depth) order within a tree, and nothing needs climbing to the first turns."""
    parent = forest.parent
    return bool((forest.starts_rollout | (parent == -1) | (parent == np.arange(len(parent)) - 1)).all())


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
