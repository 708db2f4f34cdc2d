"""One batch of rollouts for any registered allocation policy, at equal budget.

``sample_batch`` is the simulator's rollout engine. The step itself (which prompts, how many rollouts,
which prefixes, DAPO's rounds) is ``trace_theory.step.run_step``, the very driver the trainer's engine
runs; this module only answers its questions with the simulated world (:class:`BernoulliWorld`):

* predict candidate prompts or nodes: the predictor on their payload (true ``v``, ``signal``) and depth;
* plant roots with bare rollouts, grow top-ups and continuations: ``World.rollouts`` from the payload
  of the start node, laid out by :class:`~simulations.rollout.SimForest`.

Every policy spends ``budget.total`` rollouts (leaves), except DAPO, which spends less when its batch
fills first (``AllocationPolicy.dynamic_target``), the remainder cannot pay for a group or the pool runs
dry; DAPO trains on its mixed groups only. Turns are counted for equal-token views.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trace_theory import POLICIES, AllocationPolicy, Origin, Prediction, RolloutBudget, get_policy, run_step
from trace_theory.step import Kind, Starts, StepRecord

from .predictors import PREDICTORS, Predictor
from .rollout import Rollouts, SimForest

_ARM = re.compile(
    r"^(?P<policy>[A-Za-z0-9_]+)(\{(?P<settings>[^{}]*)\})?(\[(?P<predictor>[A-Za-z0-9_]+)\])?$"
)


@dataclass(frozen=True)
class Arm:
    """A registered policy, its settings and the predictor that guides it.

    Written ``policy``, ``policy[predictor]`` or with policy settings ``policy{key=value,...}[predictor]``
    (``dapo{dapo_target=16}``, ``trace{max_per_anchor=2}[oracle]``). The predictor defaults to
    ``learned``, as in the paper; ``trace[oracle]`` is TRACE's upper bound.
    """

    policy: str
    predictor: str = "learned"
    settings: tuple[tuple[str, object], ...] = ()
    """Fields of the ``trace_theory.AllocationPolicy`` changed for this arm, as (name, value) pairs."""

    def __post_init__(self):
        POLICIES.check(self.policy)
        if self.predictor not in PREDICTORS:
            raise ValueError(
                f"unknown predictor {self.predictor!r} in arm {self.label!r}; known: {', '.join(PREDICTORS)}"
            )
        try:
            self.allocation_policy()
        except TypeError as error:  # an unknown field name
            raise ValueError(f"arm {self.label!r}: {error}") from None

    @classmethod
    def parse(cls, text: str) -> Arm:
        match = _ARM.match(str(text))
        if match is None:
            raise ValueError(
                "an arm is written 'policy', 'policy[predictor]' or 'policy{key=value}[predictor]', "
                f"got {text!r}"
            )
        return cls(match["policy"], match["predictor"] or "learned", _settings(match["settings"] or "", text))

    @property
    def label(self) -> str:
        text = self.policy
        if self.settings:
            text += "{" + ",".join(f"{k}={v!r}" for k, v in self.settings) + "}"
        return text if self.predictor == "learned" else f"{text}[{self.predictor}]"

    def allocation_policy(self, **defaults) -> AllocationPolicy:
        """``get_policy(policy, **defaults)`` with this arm's settings on top (``group_size=8``, ...)."""
        return get_policy(self.policy, **{**defaults, **dict(self.settings)})


def _settings(text: str, arm: str) -> tuple[tuple[str, object], ...]:
    """``key=value`` pairs separated by commas; values are Python literals (``16``, ``None``, ``0.5``)."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            value = None
            sep = ""
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"arm {arm!r}: setting {key.strip()!r} must be a finite number, got {value}")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"arm {arm!r}: a setting is written key=literal, got {item!r}")
        out.append((key.strip(), value))
    return tuple(out)


_EMPTY = np.zeros(0)


class World(Protocol):
    """What the runner needs from a simulated environment (see :mod:`simulations.model`)."""

    def sample_prompts(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]: ...

    def rollouts(
        self, anchors: dict[str, np.ndarray], depth: np.ndarray, rng: np.random.Generator
    ) -> Rollouts: ...

    def expected_turns(self, depth) -> np.ndarray:
        """Expected turns of a rollout from a node at ``depth`` (the cost a token-priced policy reads)."""
        ...


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
    record : trace_theory.StepRecord or None
        What the step driver recorded (rollouts by kind, continuations per expansion round, ...).
    """

    sampled: SimForest
    trained: SimForest
    rounds: int = 1
    predicted: np.ndarray = field(default_factory=lambda: _EMPTY)
    actual: np.ndarray = field(default_factory=lambda: _EMPTY)
    depth: np.ndarray = field(default_factory=lambda: _EMPTY)
    record: StepRecord | None = None

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
    expansion_rounds: int = 1,
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
    expansion_rounds : int, default 1
        R: rounds of prefix expansion for branching policies (``trace_theory.step``).

    Returns
    -------
    Batch
    """
    n_roots, _ = policy.split(budget)
    need = -(-n_roots // policy.group_size)
    if pool < need:
        raise ValueError(
            f"`pool` ({pool}) must hold at least the {need} prompts that {policy.name!r} may use"
        )
    sim_world = BernoulliWorld(world, world.sample_prompts(pool, rng), predictor, rng)
    record = run_step(sim_world, policy, budget, pool=pool, rng=rng, expansion_rounds=expansion_rounds)
    return sim_world.batch(record)


class BernoulliWorld:
    """The simulator's answers to the step driver (``trace_theory.step.World``) for one batch.

    Node ids are those of :class:`SimForest`; ``plant`` called again (DAPO's rounds) re-plants every
    prompt planted so far, so that roots always come first, in prompt order.
    """

    def __init__(self, world: World, prompts: dict[str, np.ndarray], predictor: Predictor, rng):
        self.world, self.prompts, self.predictor, self.rng = world, prompts, predictor, rng
        self.m = np.zeros(len(prompts["v"]), dtype=np.int64)
        self.blocks: list[Rollouts] = []
        self.sim: SimForest | None = None

    def predict_prompts(self, prompts, *, concentration: bool) -> Prediction:
        payload = {k: a[prompts] for k, a in self.prompts.items()}
        return self._priced(self.predictor.predict(payload, np.zeros(len(prompts), dtype=np.int64), self.rng),
                            np.zeros(len(prompts)))

    def predict_nodes(self, nodes, *, concentration: bool) -> Prediction:
        depth = self.sim.forest.depth[nodes]
        return self._priced(self.predictor.predict(self.sim.payload(nodes), depth, self.rng), depth)

    def _priced(self, guess: Prediction, depth: np.ndarray) -> Prediction:
        """The prediction with its cost: the world's expected turns of a rollout from that depth (1 token
        per turn; a continuation re-reads its prefix for free, as with a prefix cache). Read only by a
        policy priced in tokens. A world without ``expected_turns`` leaves the cost unknown."""
        turns = getattr(self.world, "expected_turns", None)
        return guess if turns is None else dataclasses.replace(guess, cost=turns(depth))

    def plant(self, prompts, counts):
        planted = np.flatnonzero(self.m)
        if prompts.size and planted.size and prompts.min() <= planted.max():
            raise ValueError("prompts must be planted in increasing order, each once")
        m = np.zeros_like(self.m)
        m[prompts] = counts
        self.blocks.append(_bare(self.world, self.prompts, m, self.rng))
        self.m += m
        self.sim = SimForest.plant(self.prompts, self.m, Rollouts.concatenate(self.blocks))
        return self.sim.forest

    def grow(self, starts: Starts):
        for kind, origin in ((Kind.TOP_UP, Origin.BARE), (Kind.CONTINUATION, Origin.CONTINUATION)):
            nodes, counts = starts.of(kind)
            at = np.repeat(nodes, counts)
            if at.size:
                rollouts = self.world.rollouts(self.sim.payload(at), self.sim.forest.depth[at], self.rng)
                self.sim = self.sim.grow(at, rollouts, origin=origin)
        return self.sim.forest

    def batch(self, record: StepRecord) -> Batch:
        """The :class:`Batch` of a finished step: what was sampled, trained on and predicted."""
        sim, forest = self.sim, self.sim.forest
        predicted = np.concatenate([record.prompt_v, record.node_v])
        actual = np.concatenate([self.prompts["v"][record.prompt_ids], sim.nodes["v"][record.node_ids]])
        depth = np.concatenate([np.zeros(record.prompt_ids.size, np.int64), forest.depth[record.node_ids]])
        trained = sim
        if record.kept is not None:  # DAPO trains on its mixed groups only
            keep = np.zeros(len(self.m), dtype=bool)
            keep[record.kept] = True
            m_kept = np.where(keep, self.m, 0)
            rollouts = Rollouts.concatenate(self.blocks)
            trained = SimForest.plant(self.prompts, m_kept, rollouts.select(np.repeat(keep, self.m)))
        return Batch(sim, trained, record.rounds, predicted, actual, depth, record)


def _bare(world: World, prompts: dict[str, np.ndarray], m: np.ndarray, rng) -> Rollouts:
    """``m[i]`` rollouts from prompt i, prompt by prompt."""
    which = np.repeat(np.arange(len(m)), m)
    return world.rollouts({k: a[which] for k, a in prompts.items()}, np.zeros(which.size, np.int64), rng)
