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
from typing import Callable, Protocol

import numpy as np

from . import _checks
from .dynamic_sampling import DynamicSamplingState, mixed_groups
from .forest import RolloutForest
from .policies import AllocationPolicy, RolloutBudget, top_up_roots

__all__ = ["KINDS", "Kind", "Prediction", "Starts", "World", "StepRecord", "RootAllocator", "run_step",
           "round_shares", "in_rollout_order", "place_continuations"]

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

    def tuples(self) -> list[tuple[int, str, int]]:
        """``(node, kind name, count)`` per start, for worlds that grow start by start."""
        return [(int(n), KINDS[int(k)], int(c)) for n, k, c in zip(self.node, self.kind, self.count)]

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


RootAllocator = Callable[..., np.ndarray]
"""``root_allocator(policy, v, budget, *, rng, concentration) -> m``: replaces ``policy.allocate_roots``
(same keywords; the distributed trainer allocates over every rank's pool together)."""

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
    n_roots, per_root = planned.roots, planned.continuations_per_root
    prompts = np.arange(pool)
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
    active = np.flatnonzero(m > 0)
    forest = world.plant(active, m[active])
    counts = dict.fromkeys(KINDS, 0)
    counts["bare"] = int(m.sum())
    by_round: tuple[int, ...] = ()
    if policy.branches and per_root > 0 and active.size:
        forest, m, by_round = _expand(world, policy, forest, m, per_root, expansion_rounds, rng, record,
                                      counts, root_cost)
    return StepRecord(forest, m, counts=counts, continuations_by_round=by_round, rounds=1, planned=planned,
                      **record)


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
        extra = np.zeros(len(roots), dtype=np.int64)
        if last and carry.sum():
            extra = top_up_roots(m_tree, int(carry.sum())) - m_tree
            carry = np.zeros_like(carry)
        branch = np.flatnonzero(alloc.k)
        topped = np.flatnonzero(extra)
        kinds = np.repeat(np.array([Kind.TOP_UP, Kind.CONTINUATION], dtype=np.int8), [topped.size, branch.size])
        starts = Starts(np.concatenate([roots[topped], anchors[branch]]), kinds,
                        np.concatenate([extra[topped], alloc.k[branch]]).astype(np.int64))
        by_round.append(int(alloc.k.sum()))
        counts["top_up"] += int(extra.sum())
        counts["continuation"] += int(alloc.k.sum())
        m_tree = m_tree + extra
        before = len(forest)
        if len(starts):
            forest = world.grow(starts)
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
