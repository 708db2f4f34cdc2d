"""Simulated rollouts laid out as a ``trace_theory.RolloutForest`` plus per-node payload arrays.

A world (:mod:`simulations.model`, :mod:`simulations.mdp`) simulates rollouts and returns them as a
:class:`Rollouts` block: turns in rollout-major order, each with its payload (at least ``v``, the node's
true success probability, which is the reward at a leaf). :class:`SimForest` turns blocks into forest
nodes, the way the trainer's rollout engine records real turns: bare rollouts below new roots with
``RolloutForest.from_parents`` (node ids: roots, then each rollout's turns in order), continuations
below existing prefixes with ``RolloutForest.append``. Payloads stay aligned with node ids, the way the
trainer keys token ids and environment snapshots by node id.

Both use the forest's trusted fast path (``validate=False``): the links come from the simulator's own
rollouts, so checking every invariant on every growth would only cost time (a fifth of a batch).
``tests/simulations`` validate the forests that ``sample_batch`` returns for every policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trace_theory import Origin, RolloutForest


@dataclass(frozen=True)
class Rollouts:
    """A block of simulated rollouts, one per anchor they were sampled from.

    Attributes
    ----------
    length : ndarray of int64, shape (n,)
        Turns of each rollout (at least 1).
    reward : ndarray of float, shape (n,)
        Terminal reward of each rollout.
    turns : dict of ndarray, each of shape (length.sum(),)
        Payload per turn, rollout by rollout; the last turn of each rollout is its leaf.
    """

    length: np.ndarray
    reward: np.ndarray
    turns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.length)

    @property
    def start(self) -> np.ndarray:
        """Position of each rollout's first turn in the flat turn arrays."""
        return np.cumsum(self.length) - self.length

    def select(self, keep: np.ndarray) -> Rollouts:
        """The rollouts where the boolean mask ``keep`` is set, in order."""
        turn_keep = np.repeat(keep, self.length)
        return Rollouts(
            self.length[keep], self.reward[keep], {k: a[turn_keep] for k, a in self.turns.items()}
        )

    @staticmethod
    def concatenate(blocks: list[Rollouts]) -> Rollouts:
        keys = blocks[0].turns.keys()
        return Rollouts(
            np.concatenate([b.length for b in blocks]),
            np.concatenate([b.reward for b in blocks]),
            {k: np.concatenate([b.turns[k] for b in blocks]) for k in keys},
        )


def _turn_links(rollouts: Rollouts, anchor: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(parent, reward) of the turn nodes of ``rollouts``, numbered from ``offset`` in block order.

    Rollout j starts below ``anchor[j]``; each later turn hangs below the previous one. Rewards are
    set on each rollout's last turn, NaN elsewhere.
    """
    n_turns = int(rollouts.length.sum())
    ids = offset + np.arange(n_turns)
    first = rollouts.start
    parent = ids - 1
    parent[first] = anchor
    reward = np.full(n_turns, np.nan)
    reward[first + rollouts.length - 1] = rollouts.reward
    return parent, reward


@dataclass(frozen=True)
class SimForest:
    """A :class:`~trace_theory.RolloutForest` with the simulator's payload per node.

    Attributes
    ----------
    forest : RolloutForest
        The trees; ``forest.prompt`` is the candidate index of each prompt.
    nodes : dict of ndarray
        Payload aligned with node ids: ``v`` (true success probability; the reward at a leaf) and
        whatever else the world records (``signal``, MDP ``state``, ...).
    """

    forest: RolloutForest
    nodes: dict[str, np.ndarray]

    @classmethod
    def plant(cls, prompts: dict[str, np.ndarray], m: np.ndarray, rollouts: Rollouts) -> SimForest:
        """Roots for the prompts with ``m > 0`` and their bare rollouts.

        ``rollouts`` holds ``m[i]`` rollouts of prompt i, prompt by prompt (the order of
        ``np.repeat(np.flatnonzero(m), m[m > 0])``). Prompt ids are the candidate indices.
        """
        active = np.flatnonzero(m > 0)
        if len(rollouts) != int(m.sum()):
            raise ValueError(
                f"`rollouts` holds {len(rollouts)} rollouts for group sizes summing to {int(m.sum())}"
            )
        root_anchor = np.repeat(np.arange(active.size), m[active])
        parent, reward = _turn_links(rollouts, root_anchor, offset=active.size)
        turn = np.arange(parent.size) - np.repeat(rollouts.start, rollouts.length)  # position in its rollout
        forest = RolloutForest.from_parents(
            np.concatenate([np.full(active.size, -1), parent]),
            np.concatenate([np.full(active.size, np.nan), reward]),
            prompt=active,
            origin=np.concatenate([np.full(active.size, Origin.ROOT), np.full(parent.size, Origin.BARE)]),
            validate=False,
            depth=np.concatenate([np.zeros(active.size, np.int64), turn + 1]),
        )
        nodes = {k: np.concatenate([prompts[k][active], rollouts.turns[k]]) for k in rollouts.turns}
        return cls(forest, nodes)

    def grow(self, anchors: np.ndarray, rollouts: Rollouts, *, origin: Origin) -> SimForest:
        """Append ``rollouts`` below existing nodes: rollout j starts at node ``anchors[j]``.

        ``origin`` is ``CONTINUATION`` for branches from prefixes and ``BARE`` for extra rollouts from
        roots (prefix budget that no anchor could take, spent on roots to keep budgets equal).
        """
        parent, reward = _turn_links(rollouts, anchors, offset=len(self.forest))
        forest = self.forest.append(parent, reward, origin=int(origin), validate=False)
        nodes = {k: np.concatenate([a, rollouts.turns[k]]) for k, a in self.nodes.items()}
        return SimForest(forest, nodes)

    def payload(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Payload of the nodes ``ids``."""
        return {k: a[ids] for k, a in self.nodes.items()}

    @property
    def rollouts(self) -> int:
        """Rollouts (leaves) in the forest: the budget spent, in the paper's unit."""
        return self.forest.n_leaves

    @property
    def turns(self) -> float:
        """Turns generated (the forest's total cost; 1 per turn in the simulator)."""
        return float(self.forest.cost.sum())
