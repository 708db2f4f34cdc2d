"""An enumerable tree MDP with a tabular softmax policy, so that policy learning is exact.

Each task (prompt) is a complete A-ary tree of depth H: a state is the sequence of actions taken so far,
every episode takes exactly H turns, and the leaf reached pays R ~ Bernoulli(p_leaf). The leaf success
probabilities are logit-normal along the tree,

    logit p_leaf = offset_task + sum over the path's edges of e_edge,   e_edge ~ N(0, action_scale^2),

so early actions shift the odds of a whole subtree (``action_scale`` says how much a decision matters)
and ``offset_task`` = logit of a pass rate drawn from :class:`~simulations.model.PassRates` sets how
hard the task is. The policy is a softmax over a table of logits theta[task, state, action], starting
uniform.

Everything the learning curves need is exact: V(s) = sum_a pi(a | s) V(s a) is computed bottom-up over
all states, so the policy's true success probability J = mean over tasks of V(root) is computed, not
estimated. The policy-gradient step uses the shared advantage estimators on the forests that each
allocator builds:

    theta[task, s] += lr / L * sum over turns y from s of n_y A(y) (onehot(a_y) - pi(. | s)),

with n_y the rollouts through turn y: a tree trains like the set of its root-to-leaf paths, each turn
weighted by the rollouts that share it. The divisor L is the loss normalisation (``NORMALISATIONS``):

* ``leaves`` (default): all rollouts trained on. All-success and all-failure groups have zero advantage
  but count in L, so a batch with more mixed groups takes a larger step (a step-size confound);
* ``mixed_leaves``: only the rollouts of prompts whose leaves are mixed (what DAPO-style filtering
  trains on; every batch takes a step of the same scale whatever its share of mixed prompts);
* ``tokens``: the turns generated and trained (each turn once, as the trainer trains each token once),
  divided by the horizon H, so that a flat batch takes the same step as under ``leaves`` and one
  learning-rate grid serves all three; a tree, whose continuations share their prefix turns, takes a
  larger one. With the
``grpo`` estimator (A(y) = mean over y's leaves of the flat GRPO advantage) this is exactly flat GRPO
on those paths; a flat forest has n_y = 1 everywhere.

State ids: the states at depth h are numbered i = 0 .. A^h - 1 (the actions as base-A digits) and have
global id (A^h - 1) / (A - 1) + i; the children of (h, i) are (h + 1, i A + a).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.special import expit, logit, softmax

from trace_theory import compute_advantages

from .model import PassRates
from .rollout import Rollouts, SimForest

_SIGNAL_CLIP = 1e-6
NORMALISATIONS = ("leaves", "mixed_leaves", "tokens")
"""Divisors of the policy-gradient step (see the module docstring)."""


@dataclass(frozen=True)
class TreeMDP:
    """Sizes and knobs of a family of tree MDPs (one task per prompt)."""

    n_tasks: int = 64
    n_actions: int = 3
    horizon: int = 4
    action_scale: float = 1.5
    """Standard deviation of each edge's effect on the logit of the leaf success probabilities."""
    pass_rates: PassRates = field(default_factory=PassRates)
    """Distribution of the pass rates whose logits are the task offsets."""
    feature_noise: float = 1.0
    """Standard deviation of the noise on logit V(s) in a state's ``signal`` (fixed per state)."""

    def __post_init__(self):
        for name, low in (("n_tasks", 1), ("n_actions", 2), ("horizon", 1)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= low):
                raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
        if self.n_actions**self.horizon > 1_000_000:
            raise ValueError(
                f"n_actions ** horizon = {self.n_actions**self.horizon} leaves per task is too many to "
                "enumerate; "
                "lower `n_actions` or `horizon`"
            )
        if not (np.isfinite(self.action_scale) and self.action_scale >= 0):
            raise ValueError(f"`action_scale` must be finite and non-negative, got {self.action_scale!r}")
        if not (np.isfinite(self.feature_noise) and self.feature_noise >= 0):
            raise ValueError(f"`feature_noise` must be finite and non-negative, got {self.feature_noise!r}")

    @property
    def offsets(self) -> np.ndarray:
        """Global id of the first state at each depth 0 .. H (and the total number of states last)."""
        a = self.n_actions
        return np.array([(a**h - 1) // (a - 1) for h in range(self.horizon + 2)], dtype=np.int64)

    @property
    def n_internal(self) -> int:
        """States where the policy acts (depth < H)."""
        return int(self.offsets[self.horizon])

    def build(self, rng: np.random.Generator) -> Tasks:
        """Draw the tasks: leaf success probabilities and the per-state signal noise."""
        a, h = self.n_actions, self.horizon
        offset = logit(np.clip(self.pass_rates.sample(self.n_tasks, rng), 1e-4, 1 - 1e-4))
        leaf_logit = offset[:, None]
        for _ in range(h):  # each level multiplies the leaves by A and adds that level's edge effects
            edges = self.action_scale * rng.standard_normal((self.n_tasks, leaf_logit.shape[1] * a))
            leaf_logit = np.repeat(leaf_logit, a, axis=1) + edges
        noise = self.feature_noise * rng.standard_normal((self.n_tasks, int(self.offsets[-1])))
        return Tasks(self, expit(leaf_logit), noise)


@dataclass(frozen=True, eq=False)
class Tasks:
    """A drawn family of tasks: ``p_leaf`` (n_tasks, A^H) and the signal noise per (task, state)."""

    mdp: TreeMDP
    p_leaf: np.ndarray
    signal_noise: np.ndarray

    def initial_logits(self) -> np.ndarray:
        """theta = 0: the uniform policy, shape (n_tasks, internal states, A)."""
        return np.zeros((self.mdp.n_tasks, self.mdp.n_internal, self.mdp.n_actions))

    def values(self, theta: np.ndarray) -> np.ndarray:
        """Exact V(s) under softmax(theta) for every task and state (leaves: p_leaf): (tasks, states)."""
        mdp = self.mdp
        pi = softmax(theta, axis=-1)
        off = mdp.offsets
        v = np.empty((mdp.n_tasks, int(off[-1])))
        v[:, off[mdp.horizon] :] = self.p_leaf
        for h in range(mdp.horizon - 1, -1, -1):
            below = v[:, off[h + 1] : off[h + 2]].reshape(mdp.n_tasks, -1, mdp.n_actions)
            v[:, off[h] : off[h + 1]] = (pi[:, off[h] : off[h + 1]] * below).sum(axis=-1)
        return v

    def success(self, theta: np.ndarray) -> np.ndarray:
        """J per task: the policy's exact success probability V(root)."""
        return self.values(theta)[:, 0]

    def optimum(self) -> np.ndarray:
        """The best achievable success probability per task: max over leaves of p_leaf."""
        return self.p_leaf.max(axis=1)


@dataclass(frozen=True, eq=False)
class MDPWorld:
    """The tasks under one policy: the world protocol of :mod:`simulations.runner`.

    Payload per node: ``task``, ``state`` (global id), ``action`` (-1 at roots), ``v`` (exact V under the
    current policy; the reward at a leaf), ``signal`` (logit V + the state's fixed noise) and ``mu`` (the
    probability the sampling policy gave the turn's action: the behaviour policy of
    :func:`policy_gradient_step`'s importance ratio; 1 at roots).
    """

    tasks: Tasks
    theta: np.ndarray

    @cached_property
    def pi(self) -> np.ndarray:
        return softmax(self.theta, axis=-1)

    @cached_property
    def v(self) -> np.ndarray:
        return self.tasks.values(self.theta)

    def _payload(self, task, state, action, mu=None) -> dict[str, np.ndarray]:
        v = self.v[task, state]
        z = logit(np.clip(v, _SIGNAL_CLIP, 1 - _SIGNAL_CLIP)) + self.tasks.signal_noise[task, state]
        mu = np.ones(len(task)) if mu is None else mu
        return {"task": task, "state": state, "action": action, "v": v, "signal": z, "mu": mu}

    def expected_turns(self, depth) -> np.ndarray:
        """Turns of a rollout sampled from a node at ``depth``: H - d (every episode runs to the horizon)."""
        return self.tasks.mdp.horizon - np.asarray(depth, dtype=float)

    def sample_prompts(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``n`` distinct tasks in random order (the candidate pool)."""
        n_tasks = self.tasks.mdp.n_tasks
        if n > n_tasks:
            raise ValueError(f"a pool of {n} prompts needs at least as many tasks, got `n_tasks` = {n_tasks}")
        task = rng.permutation(n_tasks)[:n]
        return self._payload(task, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))

    def rollouts(
        self, anchors: dict[str, np.ndarray], depth: np.ndarray, rng: np.random.Generator
    ) -> Rollouts:
        """Play the policy from each anchor state to the horizon; the leaf pays Bernoulli(p_leaf)."""
        mdp = self.tasks.mdp
        off = mdp.offsets
        task, state = np.asarray(anchors["task"]), np.asarray(anchors["state"]).copy()
        depth = np.asarray(depth, dtype=np.int64)
        n, width = len(task), mdp.horizon - int(depth.min(initial=mdp.horizon))
        length = mdp.horizon - depth
        states = np.zeros((n, max(width, 0)), dtype=np.int64)
        actions = np.zeros_like(states)
        probs = np.ones(states.shape)
        for t in range(width):
            go = np.flatnonzero(depth + t < mdp.horizon)
            h = depth[go] + t
            pi = self.pi[task[go], state[go]]
            a = np.minimum((rng.random(go.size)[:, None] > np.cumsum(pi, axis=-1)).sum(axis=-1), mdp.n_actions - 1)
            probs[go, t] = pi[np.arange(go.size), a]
            state[go] = off[h + 1] + (state[go] - off[h]) * mdp.n_actions + a
            states[go, t], actions[go, t] = state[go], a
        taken = np.arange(max(width, 0)) < length[:, None]
        turn_task = np.repeat(task, length)
        turns = self._payload(turn_task, states[taken], actions[taken], probs[taken])
        leaf = np.cumsum(length) - 1
        reward = (rng.random(n) < self.tasks.p_leaf[task, state - off[mdp.horizon]]).astype(float)
        turns["v"][leaf] = reward
        return Rollouts(length=length, reward=reward, turns=turns)


def normaliser(forest, normalisation: str, horizon: int) -> float:
    """The divisor L of the step for one of ``NORMALISATIONS`` (0 when there is nothing to train on)."""
    if normalisation == "leaves":
        return float(forest.n_leaves)
    if normalisation == "mixed_leaves":
        return float(forest.leaf_count[forest.roots][forest.mixed[forest.roots]].sum())
    if normalisation == "tokens":
        return float(forest.cost.sum()) / horizon
    raise ValueError(f"unknown `normalisation` {normalisation!r}; known: {', '.join(NORMALISATIONS)}")


MAX_RATIO = 2.0
"""Truncation of the per-turn importance ratio pi / mu in :func:`policy_gradient_step`."""


def policy_gradient_step(
    world: MDPWorld, trained: SimForest, *, estimator: str, lr: float, normalisation: str = "leaves"
) -> np.ndarray:
    """New logits after one policy-gradient step on ``trained`` with a registered advantage estimator.

    theta[task, s] += lr / L * sum_y n_y rho_y A(y) (onehot(a_y) - pi(. | s)) over the turns y taken from
    state s, n_y = rollouts through y, L from ``normalisation`` (see the module docstring), and
    rho_y = min(pi(a_y | s) / mu_y, ``MAX_RATIO``) the per-turn importance ratio against the policy that
    sampled the turn (the payload's ``mu``; 1 for turns sampled by the current policy, so on-policy
    batches are unchanged; below 1 or above it for turns one update old, as pipelined expansion trains
    them). A forest with nothing to train on (L = 0) leaves theta as is.
    """
    forest = trained.forest
    theta = world.theta.copy()
    divisor = normaliser(forest, normalisation, world.tasks.mdp.horizon)
    if forest.n_leaves == 0 or divisor == 0:
        return theta
    adv = compute_advantages(forest, estimator)
    y = np.flatnonzero(forest.parent != -1)
    x = forest.parent[y]
    task, state, action = trained.nodes["task"][y], trained.nodes["state"][x], trained.nodes["action"][y]
    weighted = adv[y] * forest.leaf_count[y]
    if "mu" in trained.nodes:  # the importance ratio of turns sampled by an older policy (pipelined)
        rho = world.pi[task, state, action] / trained.nodes["mu"][y]
        weighted = weighted * np.minimum(rho, MAX_RATIO)
    grad = -weighted[:, None] * world.pi[task, state]
    grad[np.arange(y.size), action] += weighted
    flat = theta.reshape(-1, theta.shape[-1])
    np.add.at(flat, task * theta.shape[1] + state, lr / divisor * grad)
    return theta
