"""Bernoulli rollout trees: prompts with known pass rates whose success probability moves turn by turn.

A prompt's pass rate V_0 is drawn from a Beta mixture (:class:`PassRates`). Every turn of a rollout
either continues the episode, moving V along a martingale by *Beta splitting*,

    V_{t+1} | V_t ~ Beta(V_t c, (1 - V_t) c),   c = 1 / s - 1,

so that E[V_{t+1} | V_t] = V_t and Var(V_{t+1} | V_t) = s V_t (1 - V_t), or ends it: the final turn
reveals the reward R ~ Bernoulli(V_t), and the leaf's value is R itself (the martingale ends at R).
``informativeness`` s in (0, 1] is the share of the remaining contrast potential V (1 - V) that one
turn resolves, so E[V_t (1 - V_t) | V_0] = (1 - s)^t V_0 (1 - V_0).

A turn is the last one with probability ``stop_prob`` (early termination), and always at depth
``max_turns``. Branching from a prefix samples a fresh continuation from that prefix's V, which is what
makes every identity in PAPER.md checkable to Monte Carlo precision here.

Every node also carries the ``signal`` a predictor may look at: logit(V) plus Gaussian noise of standard
deviation ``feature_noise``, drawn once per node (a history shows what it shows). Only the learned
predictor reads it; the oracle reads V itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.special import logit

from trace_theory import beta_mixed_probability

from .rollout import Rollouts

_SIGNAL_CLIP = 1e-6  # logit(V) is taken of V clipped to [1e-6, 1 - 1e-6]


@dataclass(frozen=True)
class PassRates:
    """A mixture of Beta distributions over prompt pass rates V_0.

    Component j has weight ``weights[j]``, mean ``means[j]`` and concentration ``concentrations[j]``:
    Beta(mean * concentration, (1 - mean) * concentration). Small concentrations push mass to 0 and 1,
    as in real RL data sets where most prompts are always or never solved.
    """

    weights: tuple[float, ...] = (0.4, 0.2, 0.4)
    """Mixture weights (normalised on use)."""
    means: tuple[float, ...] = (0.1, 0.5, 0.9)
    """Component means, in (0, 1): hard, medium and easy prompts."""
    concentrations: tuple[float, ...] = (1.0, 1.0, 1.0)
    """Component concentrations a + b, > 0."""

    def __post_init__(self):
        n = len(self.weights)
        if n == 0 or len(self.means) != n or len(self.concentrations) != n:
            raise ValueError(
                f"`weights`, `means` and `concentrations` must be non-empty and of equal length, got "
                f"{len(self.weights)}, {len(self.means)} and {len(self.concentrations)}"
            )
        if not all(w >= 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError(f"`weights` must be non-negative with a positive sum, got {self.weights}")
        if not all(0 < m < 1 for m in self.means):
            raise ValueError(f"`means` must lie in (0, 1), got {self.means}")
        if not all(np.isfinite(c) and c > 0 for c in self.concentrations):
            raise ValueError(f"`concentrations` must be finite and positive, got {self.concentrations}")

    def _beta_parameters(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = np.asarray(self.weights, float)
        mean, conc = np.asarray(self.means), np.asarray(self.concentrations)
        return w / w.sum(), mean * conc, (1.0 - mean) * conc

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` pass rates V_0."""
        w, a, b = self._beta_parameters()
        component = rng.choice(len(w), size=n, p=w)
        return _beta(a[component], b[component], rng)

    def mixed_share(self, m: int) -> float:
        """E[mixed(V_0, m)]: the expected effective ratio of GRPO with ``m`` rollouts per prompt.

        Exact: ``trace_theory.beta_mixed_probability`` per component (E[v^m] = B(a + m, b) / B(a, b)).
        """
        w, a, b = self._beta_parameters()
        return float(np.dot(w, beta_mixed_probability(a, b, m)))

    def calibrated(self, target: float, m: int) -> PassRates:
        """The same mixture with all concentrations scaled by one factor so that ``mixed_share(m) = target``.

        The mixed share grows with the scale (from 0 as every component collapses onto 0 and 1, to the
        mixed share of the component means), so the factor is the root of a monotone function.
        """
        if not 0.0 < target < 1.0:
            raise ValueError(f"`target` must lie in (0, 1), got {target!r}")

        def scaled(log_scale: float) -> PassRates:
            return PassRates(
                self.weights, self.means, tuple(c * np.exp(log_scale) for c in self.concentrations)
            )

        def gap(log_scale: float) -> float:
            return scaled(log_scale).mixed_share(m) - target

        lo, hi = -20.0, 20.0
        if gap(lo) > 0 or gap(hi) < 0:
            reach = (scaled(lo).mixed_share(m), scaled(hi).mixed_share(m))
            raise ValueError(
                f"`target` {target} is outside the mixed shares this mixture can reach, "
                f"({reach[0]:.4f}, {reach[1]:.4f}); change its means"
            )
        return scaled(brentq(gap, lo, hi, xtol=1e-12))


def _beta(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Beta(a, b) draws as X / (X + Y) of Gamma draws; if both underflow, a Bernoulli(a / (a + b)) draw.

    Twice as fast as ``Generator.beta`` for the small shapes that splitting produces, and it keeps the
    mean exactly when both shapes are so small that the Beta is a coin flip.
    """
    x, y = rng.standard_gamma(a), rng.standard_gamma(b)
    total = x + y
    out = np.divide(x, total, out=np.empty_like(x), where=total > 0)
    both = np.flatnonzero(total == 0)
    if both.size:
        out[both] = rng.random(both.size) * (a[both] + b[both]) < a[both]
    return out


@dataclass(frozen=True)
class BernoulliTreeModel:
    """The Bernoulli rollout-tree world (see the module docstring for the dynamics)."""

    pass_rates: PassRates = field(default_factory=PassRates)
    """Distribution of the prompts' pass rates V_0."""
    informativeness: float = 0.3
    """s in (0, 1]: Var(V_{t+1} | V_t) = s V_t (1 - V_t); s = 1 resolves V to 0 or 1 in one turn."""
    max_turns: int = 6
    """Depth at which every rollout ends."""
    stop_prob: float = 0.2
    """Probability that a turn is the last one (before ``max_turns``); 0 gives fixed-length rollouts."""
    feature_noise: float = 1.0
    """Standard deviation of the noise on logit(V) in a node's ``signal`` (what a learned predictor sees)."""

    def __post_init__(self):
        if not 0.0 < self.informativeness <= 1.0:
            raise ValueError(f"`informativeness` must lie in (0, 1], got {self.informativeness!r}")
        if not (isinstance(self.max_turns, int) and self.max_turns >= 1):
            raise ValueError(f"`max_turns` must be a positive integer, got {self.max_turns!r}")
        if not 0.0 <= self.stop_prob <= 1.0:
            raise ValueError(f"`stop_prob` must lie in [0, 1], got {self.stop_prob!r}")
        if not (np.isfinite(self.feature_noise) and self.feature_noise >= 0):
            raise ValueError(f"`feature_noise` must be finite and non-negative, got {self.feature_noise!r}")

    # ---------------------------------------------------------------------------------------------

    def expected_turns(self, depth) -> np.ndarray:
        """Expected turns of a rollout sampled from a prefix at ``depth``: (1 - (1 - p)^(T - d)) / p."""
        remaining = self.max_turns - np.asarray(depth, dtype=float)
        if self.stop_prob == 0.0:
            return remaining
        return -np.expm1(remaining * np.log1p(-self.stop_prob)) / self.stop_prob

    def split(self, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One non-final turn: V' ~ Beta(V c, (1 - V) c), c = 1 / s - 1 (V' ~ Bernoulli(V) when s = 1)."""
        if self.informativeness == 1.0:
            return (rng.random(v.shape) < v).astype(float)
        c = 1.0 / self.informativeness - 1.0
        return _beta(v * c, (1.0 - v) * c, rng)

    def signal(self, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What a predictor sees of a node: logit(V) + feature_noise * N(0, 1)."""
        v = np.clip(v, _SIGNAL_CLIP, 1.0 - _SIGNAL_CLIP)
        return logit(v) + self.feature_noise * rng.standard_normal(v.shape)

    # ---------------------------------------------------------------------------------------------
    # The world protocol used by simulations.runner
    # ---------------------------------------------------------------------------------------------

    def sample_prompts(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Payload of ``n`` fresh prompts: their pass rate ``v`` and ``signal``."""
        v = self.pass_rates.sample(n, rng)
        return {"v": v, "signal": self.signal(v, rng)}

    def rollouts(
        self, anchors: dict[str, np.ndarray], depth: np.ndarray, rng: np.random.Generator
    ) -> Rollouts:
        """One rollout from each anchor (a prompt or a non-terminal prefix), all simulated together.

        Parameters
        ----------
        anchors : dict of ndarray
            Payload of the anchors; ``anchors["v"]`` is their success probability.
        depth : ndarray of int
            Depth of each anchor, below ``max_turns``.
        rng : numpy.random.Generator

        Returns
        -------
        Rollouts
            Turns in rollout-major order with payload ``v`` (R at the final turn) and ``signal``.
        """
        v = np.asarray(anchors["v"], dtype=float)
        depth = np.asarray(depth, dtype=np.int64)
        if depth.size and (depth.min() < 0 or depth.max() >= self.max_turns):
            raise ValueError(f"anchor depths must lie in [0, {self.max_turns - 1}], got {int(depth.max())}")
        n = v.size
        width = self.max_turns - int(depth.min(initial=self.max_turns - 1))
        values = np.empty((n, width))
        length = np.zeros(n, dtype=np.int64)
        idx, current, left = np.arange(n), v.copy(), self.max_turns - depth  # the rollouts still going
        for t in range(width):
            if not idx.size:
                break
            final = (left <= t + 1) | (rng.random(idx.size) < self.stop_prob)
            going = ~final
            nxt = np.empty(idx.size)
            nxt[final] = (rng.random(int(final.sum())) < current[final]).astype(float)
            nxt[going] = self.split(current[going], rng)
            values[idx, t] = nxt
            length[idx[final]] = t + 1
            idx, current, left = idx[going], nxt[going], left[going]
        turns = values[np.arange(width) < length[:, None]]  # row-major: rollout by rollout
        reward = values[np.arange(n), length - 1]
        return Rollouts(length=length, reward=reward, turns={"v": turns, "signal": self.signal(turns, rng)})
