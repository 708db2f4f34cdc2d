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
import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trace_theory import POLICIES, AllocationPolicy, EagerPlan, Origin, Prediction, RolloutBudget, get_policy, run_step
from trace_theory.expansion import EXPANSIONS, Eager, Expansion, PlantEvents, Wave, get_expansion
from trace_theory.pipelined import Pending, run_pipelined_step
from trace_theory.step import Kind, Starts, StepRecord, in_rollout_order

from .predictors import PREDICTORS, Predictor
from .rollout import Rollouts, SimForest

_ARM = re.compile(
    r"^(?P<policy>[A-Za-z0-9_]+)(\{(?P<settings>[^{}]*)\})?(\[(?P<predictor>[A-Za-z0-9_]+)\])?$"
)


@dataclass(frozen=True)
class Arm:
    """A registered policy, its settings and the predictor that guides it.

    Written ``policy``, ``policy[predictor]`` or with policy settings ``policy{key=value,...}[predictor]``
    (``dapo{dapo_target=16}``, ``trace{max_per_anchor=2}[oracle]``,
    ``pilot_commit{pilot=4,pilot_band=(0.2, 0.8)}``). The predictor defaults to
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
    """``key=value`` pairs separated by commas; values are Python literals (``16``, ``None``, ``0.5``,
    ``(0.2, 0.8)``)."""
    out = []
    parts = re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", text)  # commas before a key: a tuple's own stay in its value
    for item in filter(None, (part.strip() for part in parts)):
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
    planted: int = 0
    """Nodes of the forest once the bare rollouts were planted (later ids: top-ups and continuations)."""

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
    expansion: str | Expansion = "barrier",
    eager: EagerPlan | None = None,
    order_seed: int | None = None,
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
    expansion : str or trace_theory.Expansion, default "barrier"
        When continuations start (a name of ``trace_theory.EXPANSIONS`` that runs within one step, or a
        built mode). The simulated rollouts are drawn as the barrier draws them, so the modes differ only in
        the driver's decisions and in when each continuation starts (:func:`critical_path`).
    eager : trace_theory.EagerPlan, optional
        With ``expansion="eager"``: its reserve share, threshold, objective and lag (default
        ``EagerPlan()``).
    order_seed : int, optional
        Shuffle the order in which rollouts report their turn boundaries and trees their ends (as the
        engine's timing would); None: in time order. The batch does not depend on it.

    Returns
    -------
    Batch
    """
    if isinstance(expansion, str):
        EXPANSIONS.check(expansion)
    if eager is not None and expansion != "eager":
        raise ValueError(f"`eager` (an EagerPlan) is read only with `expansion='eager'`, got {expansion!r}")
    mode = Eager(eager) if eager is not None else get_expansion(expansion)
    if mode.defers:
        raise ValueError(f"expansion {mode.name!r} spans two steps: use sample_pipelined")
    n_roots, _ = policy.split(budget)
    need = -(-n_roots // policy.group_size)
    if pool < need:
        raise ValueError(
            f"`pool` ({pool}) must hold at least the {need} prompts that {policy.name!r} may use"
        )
    sim_world = BernoulliWorld(world, world.sample_prompts(pool, rng), predictor, rng, order_seed=order_seed,
                               priced=policy.priced_in_tokens)
    record = run_step(sim_world, policy, budget, pool=pool, rng=rng, expansion_rounds=expansion_rounds,
                      expansion=mode)
    return sim_world.batch(record)


class BernoulliWorld:
    """The simulator's answers to the step driver (``trace_theory.step.World``) for one batch.

    Node ids are those of :class:`SimForest`; ``plant`` called again (DAPO's rounds) re-plants every
    prompt planted so far, so that roots always come first, in prompt order.
    """

    def __init__(self, world: World, prompts: dict[str, np.ndarray], predictor: Predictor, rng,
                 order_seed: int | None = None, priced: bool = True):
        self.world, self.prompts, self.predictor, self.rng = world, prompts, predictor, rng
        self.order_seed = order_seed
        self.priced = priced
        """Whether predictions carry their cost (read only by a policy priced in tokens; the step driver drops
        it for the others, so computing it for them only costs time)."""
        self.m = np.zeros(len(prompts["v"]), dtype=np.int64)
        self.blocks: list[Rollouts] = []
        self.planted = 0
        self.sim: SimForest | None = None
        self.completed: "BernoulliWorld | None" = None
        """After a pipelined wave: the pending step's world, its continuations grown (:meth:`_wave`)."""

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
        turns = getattr(self.world, "expected_turns", None) if self.priced else None
        return guess if turns is None else dataclasses.replace(guess, cost=turns(depth))

    def plant(self, prompts, counts, events: PlantEvents | Wave | None = None):
        """``World.plant``: the bare rollouts; with a streaming mode's events, each tree's decisions as it
        ends (:meth:`_streamed`); with a pipelined :class:`~trace_theory.expansion.Wave`, the pending step's
        continuations in the same wave (:meth:`_wave`)."""
        if isinstance(events, Wave):
            return self._wave(prompts, counts, events)
        if events is not None:
            return self._streamed(prompts, counts, events)
        return self._bare(prompts, counts)

    def _bare(self, prompts, counts):
        planted = np.flatnonzero(self.m)
        if prompts.size and planted.size and prompts.min() <= planted.max():
            raise ValueError("prompts must be planted in increasing order, each once")
        m = np.zeros_like(self.m)
        m[prompts] = counts
        self.blocks.append(_bare(self.world, self.prompts, m, self.rng))
        self.m += m
        self.sim = SimForest.plant(self.prompts, self.m, Rollouts.concatenate(self.blocks))
        self.planted = len(self.sim.forest)
        return self.sim.forest

    def grow(self, starts: Starts):
        for kind, origin in ((Kind.TOP_UP, Origin.BARE), (Kind.CONTINUATION, Origin.CONTINUATION)):
            nodes, counts = starts.of(kind)
            at = np.repeat(nodes, counts)
            if at.size:
                rollouts = self.world.rollouts(self.sim.payload(at), self.sim.forest.depth[at], self.rng)
                self.sim = self.sim.grow(at, rollouts, origin=origin)
        return self.sim.forest

    def _streamed(self, prompts, counts, events: PlantEvents):
        """A streaming mode's plant on simulated rollouts.

        The bare rollouts are drawn at once (they do not depend on branching), and so are the predictions
        at their prefixes, in rollout order, exactly as the barrier asks for them: then barrier, streamed
        and eager see the same rollouts and predictions. The driver is then told, in time order (turn
        boundary at depth d at time d, a tree's end at its longest bare rollout's length; ties, or with
        ``order_seed`` everything consistent with each rollout's own order, shuffled), what the engine would
        tell it; all continuations and top-ups are then grown in one call, as the barrier grows them.
        """
        forest = self._bare(prompts, counts)
        anchors = in_rollout_order(forest, forest.prefix_anchors())
        guess = self.predict_nodes(anchors, concentration=True) if anchors.size else None
        tree = forest.tree_index[anchors]
        start = forest.rollout_start[anchors]
        rollout_of = _rollout_in_tree(forest)[forest.rollout_start]
        rollout = rollout_of[anchors]
        depth = forest.depth[anchors]
        order_rng = None if self.order_seed is None else np.random.default_rng(self.order_seed)

        def at(ids):
            return lambda concentration=False: _slice(guess, ids)

        k = np.zeros(anchors.size, dtype=np.int64)
        leaves = np.flatnonzero(forest.is_leaf)
        early = np.zeros(len(forest.roots), dtype=np.int64)
        if events.boundaries:
            # turn boundaries (prefix at depth d: time d) and rollout ends (leaf at depth L: time L), each
            # rollout's in its own order; the end after the boundaries of the same time
            position = np.full(len(forest), -1, dtype=np.int64)
            position[anchors] = np.arange(anchors.size)
            chain = 1_000_000 * forest.tree_index + _rollout_in_tree(forest)[forest.rollout_start]
            happened = np.concatenate([anchors, leaves])
            time = np.concatenate([2 * depth, 2 * forest.depth[leaves] + 1])
            where = {(int(tree[a]), int(rollout[a]), int(depth[a])): a for a in range(anchors.size)}
            for e in _event_order(time, chain[happened], order_rng):
                node = int(happened[e])
                t, j = int(forest.tree_index[node]), int(rollout_of[node])
                if e < anchors.size:
                    branches = events.turn_boundary(t, j, int(depth[e]), at(np.array([e])))
                else:
                    branches = events.rollout_ended(t, j, int(forest.depth[node]), float(forest.reward[node]))
                for branch in branches:
                    if branch.depth == 0:
                        early[t] += branch.count
                    else:
                        k[where[t, j, branch.depth]] += branch.count
        ends = np.zeros(len(forest.roots), dtype=np.int64)
        np.maximum.at(ends, forest.tree_index[leaves], forest.depth[leaves])
        for t in _event_order(ends, np.arange(ends.size), order_rng):
            mine = np.flatnonzero(tree == t)
            reward = forest.reward[forest.factual_leaf[anchors[mine]]]
            k[mine] += events.tree_ended(int(t), reward, at(mine))
        top_ups, more = events.rest()
        top_ups = top_ups + early
        k += np.concatenate(more) if len(more) else 0
        roots = forest.roots
        topped, branch = np.flatnonzero(top_ups), np.flatnonzero(k)
        kinds = np.repeat(np.array([Kind.TOP_UP, Kind.CONTINUATION], dtype=np.int8), [topped.size, branch.size])
        starts = Starts(np.concatenate([roots[topped], anchors[branch]]), kinds,
                        np.concatenate([top_ups[topped], k[branch]]).astype(np.int64))
        return self.grow(starts) if len(starts) else forest

    def _wave(self, prompts, counts, wave: Wave):
        """A pipelined wave: this step's bare rollouts and, in the same wave, the pending step's
        continuations and top-ups, drawn from this world (the policy of this step: in the tree MDP, one
        update newer than their prefixes) below the pending step's forest."""
        forest = self._bare(prompts, counts) if len(prompts) else None
        pending = wave.pending
        if pending is not None:
            carried = copy.copy(pending.carried)  # the previous step's world, grown by this step's policy
            carried.world, carried.rng = self.world, self.rng
            carried.grow(pending.starts)
            self.completed = carried
            wave.grown = carried.sim.forest
        return forest

    def carry(self) -> "BernoulliWorld":
        """What a pending step keeps of this world: the world itself (its rollouts and payloads)."""
        return self

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
        return Batch(sim, trained, record.rounds, predicted, actual, depth, record, self.planted)


@dataclass(frozen=True)
class PipelinedBatch:
    """One pipelined step in the simulator (:func:`sample_pipelined`)."""

    trained: Batch | None
    """The previous step's trees, whole (what this step's update trains); None on the first step."""
    pending: Pending | None
    """This step's trees, decided, to be completed by the next wave."""
    wave_critical_path: int
    """Turns on the longest chain of this step's one generation wave: this step's bare rollouts and the
    previous step's continuations and top-ups, all started together (:func:`wave_critical_path`)."""


def sample_pipelined(world: World, policy: AllocationPolicy, budget: RolloutBudget, predictor: Predictor, *,
                     pool: int, rng: np.random.Generator, pending: Pending | None, plant: bool = True) -> PipelinedBatch:
    """One step of pipelined expansion (``trace_theory.pipelined``) in the simulated world.

    The wave plants a fresh pool's roots (as :func:`sample_batch`) and grows ``pending``'s continuations
    from ``world`` (the current policy); the previous step comes back whole as a :class:`Batch`, this
    step's continuations are decided by the barrier's rule on its bare rollouts and come back as the new
    pending. ``plant=False`` only grows ``pending`` (the last step). A policy that does not pipeline
    returns its whole batch at once, pending None.
    """
    prompts = world.sample_prompts(pool, rng) if plant else {"v": np.zeros(0)}
    sim_world = BernoulliWorld(world, prompts, predictor, rng)
    step = run_pipelined_step(sim_world, policy, budget, pool=pool if plant else 0, rng=rng, pending=pending,
                              plant=plant)
    trained = None
    if step.trained is not None:
        trained = (sim_world.completed if pending is not None else sim_world).batch(step.trained)
    n_old = 0 if pending is None else len(pending.record.forest)
    grown = None if trained is None or pending is None else trained.sampled.forest
    path = wave_critical_path(step.wave, grown, n_old)
    if pending is None and step.pending is None and trained is not None:  # an ordinary step
        path = critical_path(trained)
    return PipelinedBatch(trained, step.pending, path)


def wave_critical_path(planted, grown, n_old: int) -> int:
    """Turns on the longest chain of one pipelined wave: every rollout starts at 0, this step's bare
    rollouts (the leaves of ``planted``) run their length, the previous step's continuations and top-ups
    (nodes ``n_old`` on of ``grown``) run their own turns, not their prefixes'."""
    longest = 0
    if planted is not None and len(planted):
        longest = int(planted.depth[planted.leaves].max(initial=0))
    if grown is not None and len(grown) > n_old:
        leaves = grown.leaves[grown.leaves >= n_old]
        anchor = grown.parent[grown.rollout_start[leaves]]
        longest = max(longest, int((grown.depth[leaves] - grown.depth[anchor]).max(initial=0)))
    return longest


def critical_path(batch: Batch) -> int:
    """Turns on the longest chain of the batch's step: the wall-clock proxy of one generation phase.

    Turn t of a rollout ends at time t after its start, and every rollout runs as soon as it may (as a
    batched generator runs all of them together). A bare rollout starts at 0. A continuation starts where
    the step driver placed it (``StepRecord.node_phase``): at its prefix's turn boundary (eager: at time
    d, the prefix's depth), once its tree's bare rollouts have ended (streamed own pass, the reserve), or
    once every bare rollout has (the barrier, what trees could not place, top-ups). The result is the
    latest end; GRPO's is its longest rollout.
    """
    record, forest = batch.record, batch.sampled.forest
    leaves = np.flatnonzero(forest.is_leaf)
    start = forest.rollout_start[leaves]
    bare = start < batch.planted
    planted_end = np.zeros(len(forest.roots), dtype=np.int64)
    np.maximum.at(planted_end, forest.tree_index[leaves[bare]], forest.depth[leaves[bare]])
    everyone = int(planted_end.max(initial=0))
    if bare.all():
        return everyone
    anchor = forest.parent[start]
    length = forest.depth[leaves] - forest.depth[anchor]
    begin = np.full(leaves.size, everyone, dtype=np.int64)  # barrier, top-ups and pooled leftovers
    phase = record.node_phase
    if record is not None and record.expansion != "barrier" and phase is not None and record.phase_ids.size:
        cont = np.flatnonzero(~bare & (forest.origin[start] == Origin.CONTINUATION))
        order = cont[np.lexsort((start[cont], anchor[cont]))]  # by anchor, then in growth order
        a = anchor[order]
        nth = np.arange(order.size) - np.searchsorted(a, a)
        row = np.full(len(forest), -1, dtype=np.int64)
        row[record.phase_ids] = np.arange(record.phase_ids.size)
        counts = np.cumsum(phase[row[a]], axis=1)
        eager, at_end = nth < counts[:, 0], (nth >= counts[:, 0]) & (nth < counts[:, 1])
        own = (nth >= counts[:, 1]) & (nth < counts[:, 2])
        begin[order[eager]] = forest.depth[a[eager]] + record.eager_lag  # decided as the prefix formed, or a turn on
        begin[order[at_end]] = forest.depth[a[at_end]] + 1  # the rollout ended one turn below its last prefix
        begin[order[own]] = planted_end[forest.tree_index[a[own]]]
        if record.early_top_ups is not None and record.early_top_ups.any():
            top = np.flatnonzero(~bare & (forest.origin[start] == Origin.BARE))
            top = top[np.lexsort((start[top], forest.tree_index[leaves[top]]))]
            tree = forest.tree_index[leaves[top]]
            nth = np.arange(top.size) - np.searchsorted(tree, tree)
            begin[top[nth < record.early_top_ups[tree]]] = 1  # a one-turn rollout's budget, at its end
    end = np.where(bare, forest.depth[leaves], begin + length)
    return int(end.max(initial=0))


def _slice(guess: Prediction | None, ids: np.ndarray) -> Prediction:
    """The prediction at positions ``ids`` of a batch of predictions."""
    kappa = None if guess.concentration is None else guess.concentration[ids]
    cost = None if guess.cost is None else guess.cost[ids]
    return Prediction(guess.v[ids], kappa, cost)


def _rollout_in_tree(forest) -> np.ndarray:
    """Per node id, the planting number within its tree of the bare rollout it starts (-1 elsewhere)."""
    first = np.flatnonzero(forest.starts_rollout & (forest.origin == Origin.BARE))
    tree = forest.tree_index[first]
    order = np.lexsort((first, tree))
    out = np.full(len(forest), -1, dtype=np.int64)
    out[first[order]] = np.arange(first.size) - np.searchsorted(tree[order], tree[order])
    return out


def _event_order(time: np.ndarray, chain: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Positions in the order a world reports them: by ``time``, ties in position order; with ``rng``, a
    random order that keeps each ``chain``'s events in time order (the only order a world guarantees)."""
    if rng is None:
        return np.lexsort((np.arange(time.size), time))
    order = rng.permutation(time.size)
    by_chain = np.lexsort((time, chain))  # each chain's events by time
    chain_sorted = chain[by_chain]
    nth = np.zeros(time.size, dtype=np.int64)
    seen: dict = {}
    for i, c in enumerate(chain[order].tolist()):
        nth[i] = seen.get(c, 0)
        seen[c] = nth[i] + 1
    # the i-th event of a chain in the random order is that chain's i-th event in time
    return by_chain[np.searchsorted(chain_sorted, chain[order]) + nth]


def _bare(world: World, prompts: dict[str, np.ndarray], m: np.ndarray, rng) -> Rollouts:
    """``m[i]`` rollouts from prompt i, prompt by prompt."""
    which = np.repeat(np.arange(len(m)), m)
    return world.rollouts({k: a[which] for k, a in prompts.items()}, np.zeros(which.size, np.int64), rng)
