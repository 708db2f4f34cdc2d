"""What a world and the step driver say to each other: the world's data (predictions, starts of rollouts)
and the one event interface through which an expansion mode hears a planted step's rollouts.

A world (``trace_theory.step.World``) plants roots with ``plant(prompts, counts, events=None)``. Without
events it grows the bare rollouts and returns (the barrier). With a mode's :class:`PlantEvents` it tells
the mode, as they happen, about

==============================  ===============================================================  ==========
event                           the mode returns, and the world starts at once                   when
==============================  ===============================================================  ==========
``turn_boundary(i, j, d, p)``   :class:`Branch` es: continuations from bare rollout j of tree i  a boundary
                                at a prefix depth (this one, or one turn back)                   (if asked)
``rollout_ended(i, j, L, r)``   :class:`Branch` es from its prefixes (depth 0: root top-ups)     its end
                                                                                                 (if asked)
``tree_ended(i, r, p)``         k: continuations per anchor of tree i (its prefixes, in          every bare
                                :func:`in_rollout_order`, ``r`` their factual rewards)           rollout of
                                                                                                 i ended
``rest()``                      (top-ups per tree, more continuations per anchor of each tree)   every tree
                                                                                                 ended
==============================  ===============================================================  ==========

``p`` (``predict(concentration=...)``) returns the world's :class:`Prediction` at the prefixes concerned.
The first two are reported only where ``events.boundaries`` is true; the calls for one rollout come in
depth order, across rollouts and trees in any order (a mode's decisions may not depend on it). The world
returns its whole forest once every rollout has ended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np

from ..forest import RolloutForest

__all__ = ["KINDS", "Kind", "Prediction", "Start", "Starts", "Branch", "PlantEvents", "checked_prediction",
           "in_rollout_order"]

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
    """One entry of :class:`Starts`, named: ``count`` rollouts of kind ``kind`` from node ``node``. Unpacks
    as ``(node, kind, count)``; :meth:`of` reads a plain tuple whose kind is a :class:`Kind` or its name."""

    node: int
    kind: Kind
    count: int

    @classmethod
    def of(cls, entry) -> "Start":
        """``entry`` (a ``Start`` or ``(node, kind, count)``, kind a :class:`Kind` or a name of :data:`KINDS`)."""
        node, kind, count = entry
        return cls(int(node), Kind(KINDS.index(kind)) if isinstance(kind, str) else Kind(kind), int(count))


@dataclass(frozen=True)
class Starts:
    """Rollouts to grow: ``count[j]`` rollouts of kind ``Kind(kind[j])`` starting at node ``node[j]``.

    The driver lists top-ups before continuations; a world may grow them all at once.
    """

    node: np.ndarray
    kind: np.ndarray
    count: np.ndarray

    @classmethod
    def of_kind(cls, nodes, kind: Kind, counts) -> "Starts":
        """``counts[j]`` rollouts of one ``kind`` from each of ``nodes``."""
        nodes = np.asarray(nodes, dtype=np.int64)
        return cls(nodes, np.full(nodes.size, kind, dtype=np.int8), np.asarray(counts, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.node)

    def tuples(self) -> list[Start]:
        """A :class:`Start` ``(node, kind, count)`` per start, for worlds that grow start by start."""
        return [Start(int(n), Kind(int(k)), int(c)) for n, k, c in zip(self.node, self.kind, self.count)]

    def of(self, kind: Kind) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, counts) of the starts of one kind, in order."""
        at = self.kind == kind
        return self.node[at], self.count[at]

    def __add__(self, other: "Starts") -> "Starts":
        return Starts(np.concatenate([self.node, other.node]), np.concatenate([self.kind, other.kind]),
                      np.concatenate([self.count, other.count]))


class Branch(NamedTuple):
    """Rollouts to start now from one prefix of a running (or just ended) bare rollout."""

    depth: int
    """The prefix's depth along the rollout (0: its root; then the ``count`` rollouts are bare top-ups)."""
    count: int
    """How many rollouts to start there."""


Predict = Callable[..., Prediction]
"""``predict(concentration=...)``: the world's prediction at the prefixes an event concerns."""


class PlantEvents(Protocol):
    """What a world tells a streaming expansion mode about the rollouts it plants (see the module)."""

    boundaries: bool
    """Whether the mode hears turn boundaries and rollout ends (else only tree ends and the rest)."""

    def turn_boundary(self, tree: int, rollout: int, depth: int, predict: Predict) -> tuple[Branch, ...]:
        """Bare rollout ``rollout`` (planting order within its tree) of ``tree`` reached a turn boundary
        at ``depth`` (1, 2, ...) that is not its last."""

    def rollout_ended(self, tree: int, rollout: int, length: int, reward: float) -> tuple[Branch, ...]:
        """Bare rollout ``rollout`` of ``tree`` ended after ``length`` turns with ``reward`` (after its
        boundaries, before its tree's end)."""

    def tree_ended(self, tree: int, reward: np.ndarray, predict: Predict) -> np.ndarray:
        """Every bare rollout of ``tree`` ended: continuations per anchor of the tree."""

    def rest(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Every tree ended: (top-ups per tree, more continuations per anchor of each tree)."""


def _probabilities(v: np.ndarray) -> bool:
    """Whether every entry of 1-D ``v`` lies in [0, 1] (NaN does not): in Python for a few entries (a turn
    boundary asks about one), with NumPy's reductions for many."""
    if v.size <= 8:
        return all(0.0 <= x <= 1.0 for x in v.tolist())
    return bool(v.min() >= 0.0 and v.max() <= 1.0)


def checked_prediction(guess: Prediction, n: int, policy) -> Prediction:
    """A world's prediction, checked: n probabilities (and n concentrations for a posterior policy, n
    positive costs for a policy priced in tokens); what the policy does not read is dropped."""
    v = np.asarray(guess.v, dtype=float)
    if v.shape != (n,) or not _probabilities(v):
        raise ValueError(f"the predictor must return {n} probabilities in [0, 1], got {v!r}")
    kappa = guess.concentration
    if policy.posterior:
        kappa = np.asarray(kappa, dtype=float)
        if kappa.shape != (n,) or not np.all(kappa > 0):
            raise ValueError(f"policy {policy.name!r} needs {n} positive concentrations, got {kappa!r}")
    cost = guess.cost
    if policy.priced_in_tokens and cost is not None:
        cost = np.asarray(cost, dtype=float)
        if cost.shape != (n,) or not np.all(np.isfinite(cost) & (cost > 0)):
            raise ValueError(f"the world must return {n} positive finite costs, got {cost!r}")
    return Prediction(v, kappa if policy.posterior else None, cost if policy.priced_in_tokens else None)


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
