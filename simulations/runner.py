"""One batch of rollouts for any registered allocation policy, at equal budget.

``sample_batch`` is the simulator's rollout engine. It runs the two TRACE stages with whatever
``trace_theory`` policy it is given, so that every comparison is a comparison of the very functions the
trainer calls:

1. draw a candidate pool of prompts; predict their success probability;
2. ``policy.split(budget)``, then ``policy.allocate_roots`` -> group sizes; sample bare rollouts;
3. for branching policies: predict at every non-terminal prefix of the bare rollouts
   (``RolloutForest.prefix_anchors``), ``policy.allocate_prefixes`` with per-prompt budgets m_i N;
   prefix budget that no anchor can take goes to extra root rollouts (``top_up_roots``); sample the
   continuations;
4. DAPO (``policy.dynamic_sampling``): rounds of G rollouts for fresh prompts from the pool, driven by
   ``DynamicSamplingState``, until the batch holds budget // G mixed groups, the budget cannot pay for
   another group, or the pool runs out. Every rollout generated is charged; only mixed groups are
   trained on. With a batch target of budget // G groups the first round already asks for the whole
   budget, so at equal budget DAPO samples what GRPO samples and differs in what it trains on.

Every policy spends ``budget.total`` rollouts (leaves), except DAPO, which spends less only when its
batch fills first, the remainder cannot pay for a group or the pool runs dry. Turns are counted for
equal-token views.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trace_theory import (
    POLICIES,
    AllocationPolicy,
    DynamicSamplingState,
    Origin,
    RolloutBudget,
    mixed_groups,
    top_up_roots,
)

from .predictors import PREDICTORS, Prediction, Predictor
from .rollout import Rollouts, SimForest

_ARM = re.compile(r"^(?P<policy>[A-Za-z0-9_]+)(\[(?P<predictor>[A-Za-z0-9_]+)\])?$")


@dataclass(frozen=True)
class Arm:
    """A registered policy and the predictor that guides it, written ``policy`` or ``policy[predictor]``.

    The predictor defaults to ``learned``, as in the paper; ``trace[oracle]`` is TRACE's upper bound.
    """

    policy: str
    predictor: str = "learned"

    def __post_init__(self):
        POLICIES.check(self.policy)
        if self.predictor not in PREDICTORS:
            raise ValueError(
                f"unknown predictor {self.predictor!r} in arm {self.label!r}; known: {', '.join(PREDICTORS)}"
            )

    @classmethod
    def parse(cls, text: str) -> Arm:
        match = _ARM.match(str(text))
        if match is None:
            raise ValueError(f"an arm is written 'policy' or 'policy[predictor]', got {text!r}")
        return cls(match["policy"], match["predictor"] or "learned")

    @property
    def label(self) -> str:
        return self.policy if self.predictor == "learned" else f"{self.policy}[{self.predictor}]"


_EMPTY = np.zeros(0)


class World(Protocol):
    """What the runner needs from a simulated environment (see :mod:`simulations.model`)."""

    def sample_prompts(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]: ...

    def rollouts(
        self, anchors: dict[str, np.ndarray], depth: np.ndarray, rng: np.random.Generator
    ) -> Rollouts: ...


@dataclass(frozen=True)
class Batch:
    """The rollouts of one batch.

    Attributes
    ----------
    sampled : SimForest
        Every rollout generated (what the budget paid for, and what the predictor learns from).
    trained : SimForest
        What the policy update sees: ``sampled``, or for DAPO its mixed groups only.
    rounds : int
        Rounds of generation (1, or DAPO's number of rounds).
    predicted, actual, depth : ndarray
        Every prediction the allocator used (candidate prompts, then prefixes), the true success
        probability there and the anchor's depth; empty for policies that use no predictor.
    """

    sampled: SimForest
    trained: SimForest
    rounds: int = 1
    predicted: np.ndarray = field(default_factory=lambda: _EMPTY)
    actual: np.ndarray = field(default_factory=lambda: _EMPTY)
    depth: np.ndarray = field(default_factory=lambda: _EMPTY)

    @property
    def rollouts(self) -> int:
        return self.sampled.rollouts

    @property
    def turns(self) -> float:
        return self.sampled.turns


def sample_batch(
    world: World,
    policy: AllocationPolicy,
    budget: RolloutBudget,
    predictor: Predictor,
    *,
    pool: int,
    rng: np.random.Generator,
) -> Batch:
    """Sample one batch with ``policy`` from a fresh pool of ``pool`` candidate prompts.

    Parameters
    ----------
    world : World
        The simulated environment.
    policy : trace_theory.AllocationPolicy
        Any registered policy (``trace_theory.get_policy(name)``).
    budget : trace_theory.RolloutBudget
        M roots and N continuations per root; every policy spends ``budget.total`` rollouts.
    predictor : Predictor
        Supplies v (and the Beta concentration for ``trace_beta``) at roots and prefixes.
    pool : int
        Candidate prompts drawn for the batch; at least the roots' share of groups of G
        (``budget.total / G`` for a flat policy, ``budget.roots / G`` for a tree policy).
    rng : numpy.random.Generator

    Returns
    -------
    Batch
    """
    n_roots, n_continuations = policy.split(budget)
    need = -(-n_roots // policy.group_size)
    if pool < need:
        raise ValueError(
            f"`pool` ({pool}) must hold at least the {need} prompts that {policy.name!r} may use"
        )
    prompts = world.sample_prompts(pool, rng)
    if policy.dynamic_sampling:
        return _dynamic_sampling(world, policy, budget, prompts, rng)
    asked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def ask(nodes: dict[str, np.ndarray], depth: np.ndarray) -> Prediction:
        guess = predictor.predict(nodes, depth, rng)
        asked.append((guess.v, nodes["v"], depth))
        return guess

    if policy.root_rule == "uniform":  # pool order: no prediction needed
        guess = Prediction(np.full(pool, 0.5), np.ones(pool))
    else:
        guess = ask(prompts, np.zeros(pool, dtype=np.int64))
    m = policy.allocate_roots(guess.v, n_roots, rng=rng, concentration=guess.concentration)
    sim = SimForest.plant(prompts, m, _bare(world, prompts, m, rng))
    if policy.branches:
        sim = _expand(sim, world, policy, n_continuations, ask, rng)
    predicted, actual, depth = (np.concatenate(part) for part in zip(*asked)) if asked else (_EMPTY,) * 3
    return Batch(sim, sim, 1, predicted, actual, depth)


def _bare(world: World, prompts: dict[str, np.ndarray], m: np.ndarray, rng) -> Rollouts:
    """``m[i]`` rollouts from prompt i, prompt by prompt."""
    which = np.repeat(np.arange(len(m)), m)
    return world.rollouts({k: a[which] for k, a in prompts.items()}, np.zeros(which.size, np.int64), rng)


def _expand(
    sim: SimForest, world: World, policy: AllocationPolicy, n_continuations: int, ask, rng
) -> SimForest:
    """Stage 2: continuations from the prefixes of the bare rollouts, m_i N per prompt."""
    forest = sim.forest
    anchors = forest.prefix_anchors()
    budgets = n_continuations * forest.leaf_count[forest.roots]
    if policy.prefix_rule == "active":
        v = ask(sim.payload(anchors), forest.depth[anchors]).v
    else:  # uniform or random spreading: no prediction needed
        v = np.full(anchors.size, 0.5)
    factual = forest.reward[forest.factual_leaf[anchors]]
    alloc = policy.allocate_prefixes(v, factual, forest.tree_index[anchors], budgets, rng=rng)
    unspent = int(alloc.unspent.sum())
    if unspent:
        m = forest.leaf_count[forest.roots]
        extra = np.repeat(forest.roots, top_up_roots(m, unspent) - m)
        sim = sim.grow(
            extra, world.rollouts(sim.payload(extra), forest.depth[extra], rng), origin=Origin.BARE
        )
    branch = np.repeat(anchors, alloc.k)
    if branch.size:
        sim = sim.grow(
            branch, world.rollouts(sim.payload(branch), forest.depth[branch], rng), origin=Origin.CONTINUATION
        )
    return sim


def _dynamic_sampling(world, policy, budget, prompts, rng) -> Batch:
    """DAPO: rounds of G rollouts for fresh prompts until budget // G groups mix or budget or pool run out."""
    g = policy.group_size
    state = DynamicSamplingState(target=max(budget.total // g, 1), group_size=g, budget=budget.total)
    pool = len(prompts["v"])
    drawn, rounds, blocks, kept = 0, 0, [], []
    while not state.done and drawn < pool:
        n = min(state.next_round(), pool - drawn)
        m = np.zeros(pool, dtype=np.int64)
        m[drawn : drawn + n] = g
        block = _bare(world, prompts, m, rng)
        prompt = np.repeat(np.arange(drawn, drawn + n), g)
        _, mixed = mixed_groups(prompt, block.reward)
        blocks.append(block)
        kept.append(np.repeat(mixed, g))
        state = state.update(prompt, block.reward)
        drawn, rounds = drawn + n, rounds + 1
    if not blocks:  # the budget cannot pay for a single group
        blocks, kept = [_bare(world, prompts, np.zeros(pool, dtype=np.int64), rng)], [np.zeros(0, dtype=bool)]
    m = np.where(np.arange(pool) < drawn, g, 0)
    sampled_rollouts = Rollouts.concatenate(blocks)
    keep = np.concatenate(kept)
    sampled = SimForest.plant(prompts, m, sampled_rollouts)
    m_kept = np.zeros(pool, dtype=np.int64)
    m_kept[np.repeat(np.arange(drawn), g)[keep]] = g
    return Batch(sampled, SimForest.plant(prompts, m_kept, sampled_rollouts.select(keep)), rounds)
