"""``ForestBuilder``: grow a rollout forest one node at a time (exported as ``trace_theory.ForestBuilder``)."""

from __future__ import annotations

import numpy as np

from . import _checks
from ._origin import Origin
from .forest import RolloutForest


class ForestBuilder:
    """Grow a forest one node at a time, then freeze it with :meth:`build`.

    The rollout engine uses it to record turns as they are generated: roots first, then turns, then the
    reward of each finished rollout.

    Examples
    --------
    >>> b = ForestBuilder()
    >>> root = b.add_root(prompt=7)
    >>> t1 = b.add_turn(root, cost=12)
    >>> t2 = b.add_turn(t1, cost=30)
    >>> b.finish(t2, 1.0)
    >>> branch = b.add_turn(t1, origin=Origin.CONTINUATION, cost=25)
    >>> b.finish(branch, 0.0)
    >>> f = b.build()
    >>> f.prompt.tolist(), f.leaf_count[root].item()
    ([7, 7, 7, 7], 2)
    """

    def __init__(self, *, binary_rewards: bool = True):
        self.binary_rewards = binary_rewards
        self._parent: list[int] = []
        self._prompt: list[int] = []
        self._origin: list[int] = []
        self._cost: list[float] = []
        self._reward: dict[int, float] = {}
        self._has_children: set[int] = set()

    def __len__(self) -> int:
        return len(self._parent)

    def add_root(self, prompt: int, *, cost: float = 0.0) -> int:
        prompt = _checks.count("prompt", prompt)
        self._parent.append(-1)
        self._prompt.append(prompt)
        self._origin.append(int(Origin.ROOT))
        self._cost.append(float(cost))
        return len(self._parent) - 1

    def add_turn(self, parent: int, *, origin: Origin | None = None, cost: float = 1.0) -> int:
        """Add one turn below ``parent``. By default a root's or bare node's first child is BARE."""
        parent = _checks.count("parent", parent)
        if parent >= len(self._parent):
            raise ValueError(f"`parent` must be an existing node id in [0, {len(self._parent) - 1}], got {parent}")
        if parent in self._reward:
            raise ValueError(f"node {parent} is a finished leaf (it has a reward) and cannot get children")
        if origin is None:
            po = self._origin[parent]
            first = parent not in self._has_children
            origin = Origin.BARE if po == Origin.ROOT or (po == Origin.BARE and first) else Origin.CONTINUATION
        self._has_children.add(parent)
        self._parent.append(parent)
        self._prompt.append(self._prompt[parent])
        self._origin.append(int(origin))
        self._cost.append(float(cost))
        return len(self._parent) - 1

    def finish(self, node: int, reward: float) -> None:
        """Record the terminal reward of a leaf."""
        node = _checks.count("node", node)
        if node >= len(self._parent) or self._parent[node] == -1:
            raise ValueError(f"`node` must be an existing non-root node, got {node}")
        if node in self._has_children:
            raise ValueError(f"node {node} has children; only leaves carry rewards")
        if node in self._reward:
            raise ValueError(f"node {node} already has reward {self._reward[node]!r}")
        self._reward[node] = float(reward)

    def build(self) -> RolloutForest:
        n = len(self._parent)
        reward = np.full(n, np.nan)
        if self._reward:
            idx = np.fromiter(self._reward.keys(), dtype=np.int64)
            reward[idx] = np.fromiter(self._reward.values(), dtype=float)
        parent = np.asarray(self._parent, dtype=np.int64)
        roots = parent == -1
        return RolloutForest.from_parents(
            parent,
            reward,
            prompt=np.asarray(self._prompt, dtype=np.int64)[roots],
            origin=np.asarray(self._origin, dtype=np.int8),
            cost=np.asarray(self._cost),
            binary_rewards=self.binary_rewards,
        )
