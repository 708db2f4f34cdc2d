"""The "key, then lock" world: a two-turn tree MDP built for TRACE's prefix stage.

Each task (prompt) names K keys, one of them right. Turn 1 picks a key; turn 2 is a binary choice, one
side right. The episode succeeds only with the right key *and* the right choice, deterministically:

    p_leaf(key, choice) = 1[key = key*] 1[choice = choice*].

Under the uniform policy (theta = 0 on the allowed actions) the exact values are

    V(root) = 1 / (2 K),   V(right-key prefix) = 1 / 2,   V(wrong-key prefix) = 0,

so a prompt with many keys is nearly always failed from the root while its right-key prefix is a coin
flip: a rare early event that turns the rest into the most informative kind of group. K is mixed across
prompts (``keys``, assigned in turn), so difficulty ranges from a coin flip (K = 1) to 1/(2 max K).

The world is a :class:`~simulations.mdp.TreeMDP` with ``A = max K`` actions (at least 2) and horizon 2,
so :class:`~simulations.mdp.MDPWorld` and :func:`~simulations.mdp.policy_gradient_step` run it as is.
Actions a task does not have are masked by a logit of ``-inf`` (probability 0; the step never moves
them). The allowed actions are the *last* ones of each state (keys ``A - K .. A - 1``, choices
``A - 2, A - 1``), so that the sampler's rounding can only fall on an allowed action.

The predictor sees the key outcome: a state's ``signal`` is logit V(s) plus fixed noise, and V at a
wrong-key prefix is 0 (logit clipped far below any right-key prefix's), as a transcript saying "the door
stays shut" tells a value model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .mdp import Tasks, TreeMDP

HORIZON = 2


@dataclass(frozen=True)
class KeyLockMDP:
    """Sizes of a key-then-lock family: ``n_tasks`` prompts whose key counts cycle through ``keys``."""

    n_tasks: int = 64
    keys: tuple[int, ...] = (1, 2, 4, 8)
    """Key counts K, assigned to tasks in turn (task i has ``keys[i % len(keys)]`` keys)."""
    feature_noise: float = 1.0
    """Standard deviation of the noise on logit V(s) in a state's ``signal`` (fixed per state)."""

    def __post_init__(self):
        if not (isinstance(self.n_tasks, int) and self.n_tasks >= 1):
            raise ValueError(f"`n_tasks` must be a positive integer, got {self.n_tasks!r}")
        keys = tuple(self.keys)
        if not keys or not all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64 for k in keys):
            raise ValueError(f"`keys` must be key counts between 1 and 64, got {self.keys!r}")
        if not (np.isfinite(self.feature_noise) and self.feature_noise >= 0):
            raise ValueError(f"`feature_noise` must be finite and non-negative, got {self.feature_noise!r}")

    @cached_property
    def tree(self) -> TreeMDP:
        """The enumerable tree the world lives in: ``max(keys)`` actions (at least 2), horizon 2."""
        return TreeMDP(
            n_tasks=self.n_tasks, n_actions=max(2, *self.keys), horizon=HORIZON, feature_noise=self.feature_noise
        )

    def key_counts(self) -> np.ndarray:
        """K per task."""
        return np.array([self.keys[i % len(self.keys)] for i in range(self.n_tasks)], dtype=np.int64)

    def build(self, rng: np.random.Generator) -> KeyLockTasks:
        """Draw each task's right key (uniform among its K) and right choice (uniform of 2)."""
        tree, k = self.tree, self.key_counts()
        a = tree.n_actions
        key = a - k + rng.integers(0, k)  # the allowed keys are the last K actions
        choice = a - 2 + rng.integers(0, 2, size=self.n_tasks)
        p_leaf = np.zeros((self.n_tasks, a * a))
        p_leaf[np.arange(self.n_tasks), key * a + choice] = 1.0
        noise = self.feature_noise * rng.standard_normal((self.n_tasks, int(tree.offsets[-1])))
        return KeyLockTasks(tree, p_leaf, noise, k, key, choice)


@dataclass(frozen=True, eq=False)
class KeyLockTasks(Tasks):
    """Drawn key-lock tasks: ``keys`` (K), ``right_key`` and ``right_choice`` per task (action indices)."""

    keys: np.ndarray
    right_key: np.ndarray
    right_choice: np.ndarray

    def initial_logits(self) -> np.ndarray:
        """The uniform policy over each state's allowed actions; ``-inf`` on the others."""
        theta = super().initial_logits()
        a = self.mdp.n_actions
        masked_keys = np.arange(a)[None, :] < (a - self.keys)[:, None]
        theta[:, 0][masked_keys] = -np.inf
        theta[:, 1:, : a - 2] = -np.inf  # turn 2: a binary choice
        return theta

    def optimum(self) -> np.ndarray:
        """1 for every task: the right key, then the right choice."""
        return np.ones(self.mdp.n_tasks)

    def prefix_values(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per task: V at the right-key prefix, and the largest V at a wrong-key prefix (0 by construction)."""
        v = self.values(theta)
        first = int(self.mdp.offsets[1])
        right = v[np.arange(self.mdp.n_tasks), first + self.right_key]
        wrong = v[:, first : first + self.mdp.n_actions].copy()
        wrong[np.arange(self.mdp.n_tasks), self.right_key] = 0.0
        return right, wrong.max(axis=1)
