"""Success-probability predictors behind one interface: oracle, noisy oracle and a learned one.

A predictor answers ``predict(nodes, depth, rng) -> Prediction`` for anchors (prompts or prefixes),
given their payload (the true ``v`` and the observed ``signal``) and depth, and learns from a sampled
forest with ``update(sim) -> predictor`` (a new object; the oracles return themselves). A prediction is
a success probability ``v`` and a Beta ``concentration`` kappa: the predictor's belief about the true
value is Beta(v kappa, (1 - v) kappa), which ``trace_beta`` uses and every other policy ignores.

================  ==================================================================================
``oracle``        the true V, clipped to [1e-6, 1 - 1e-6] (kappa = 1e4, a point mass for every practical
                  purpose): the upper bound
``noisy``         logit v = tau logit V + bias + noise * N(0, 1): a calibration and noise knob
``learned``       ridge regression of the recursive targets (``trace_theory.node_targets``) on a
                  basis of the node's signal and depth, fitted online (PAPER.md, "Predictor update")
``running_mean``  the running success rate of all rollouts seen, the same at every node (no features)
``prompt_mean``   each prompt's own running pass rate under a uniform prior, at every node of the prompt
================  ==================================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from scipy.special import expit, logit

from trace_theory import VALUE_METHODS, Prediction, node_targets, root_outcomes

from .rollout import SimForest

_V_CLIP = 1e-6
_KAPPA_RANGE = (0.1, 1e4)


class Predictor(Protocol):
    def predict(
        self, nodes: dict[str, np.ndarray], depth: np.ndarray, rng: np.random.Generator
    ) -> Prediction: ...

    def update(self, sim: SimForest) -> Predictor: ...


def _kappa(v: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Beta concentration with mean v and the given variance: v (1 - v) / variance - 1, clipped."""
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = v * (1.0 - v) / variance - 1.0
    return np.clip(np.nan_to_num(kappa, nan=_KAPPA_RANGE[1], posinf=_KAPPA_RANGE[1]), *_KAPPA_RANGE)


@dataclass(frozen=True)
class OraclePredictor:
    """The true success probability: TRACE's upper bound.

    It is clipped to [1e-6, 1 - 1e-6]: ``trace_theory.allocate.water_fill`` enumerates about
    2e-9 / |log q| units per anchor between its final bisection levels, so a prefix with
    q = 1 - 1e-15 would cost it millions of entries; the clip changes no utility by more than 1e-6.
    """

    def predict(self, nodes, depth, rng) -> Prediction:
        v = np.clip(np.asarray(nodes["v"], dtype=float), _V_CLIP, 1.0 - _V_CLIP)
        return Prediction(v, np.full(v.shape, _KAPPA_RANGE[1]))

    def update(self, sim: SimForest) -> OraclePredictor:
        return self


@dataclass(frozen=True)
class NoisyOracle:
    """The true V distorted on the logit scale: logit v = temperature * logit V + bias + noise * N(0, 1).

    ``temperature`` > 1 is over-confident, < 1 under-confident; the noise is drawn per call. The
    concentration is the delta-method posterior strength, Var(V | v) ~ (v (1 - v) noise / temperature)^2.
    """

    noise: float = 0.5
    temperature: float = 1.0
    bias: float = 0.0

    def __post_init__(self):
        if not (np.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"`noise` must be finite and non-negative, got {self.noise!r}")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"`temperature` must be finite and positive, got {self.temperature!r}")
        if not np.isfinite(self.bias):
            raise ValueError(f"`bias` must be finite, got {self.bias!r}")

    def predict(self, nodes, depth, rng) -> Prediction:
        v = np.clip(np.asarray(nodes["v"], dtype=float), _V_CLIP, 1.0 - _V_CLIP)
        z = self.temperature * logit(v) + self.bias + self.noise * rng.standard_normal(v.shape)
        pred = np.clip(expit(z), _V_CLIP, 1.0 - _V_CLIP)  # clipped like the oracle, for the same reason
        spread = pred * (1.0 - pred) * self.noise / self.temperature
        return Prediction(pred, _kappa(pred, spread**2))

    def update(self, sim: SimForest) -> NoisyOracle:
        return self


@dataclass(frozen=True)
class LearnedPredictor:
    """Online ridge regression of recursive node targets on a basis of (signal, depth).

    The basis is piecewise linear in the signal (hat functions on ``knots`` points spread over
    [-signal_range, signal_range]), each also multiplied by the depth. The mean model fits
    y - 1/2 by weighted least squares with a ridge penalty, y and the weights from
    ``trace_theory.node_targets(forest, target)`` on every non-leaf node (roots and prefixes, what the
    predictor serves), so an untrained predictor says 1/2. Sufficient statistics are kept and
    discounted by ``decay`` per update, which lets the fit follow a policy that is learning.

    The uncertainty model regresses, for every root with m >= 2 bare rollouts and s successes, the
    unbiased estimate s (s - 1) / (m (m - 1)) - 2 v s / m + v^2 of (V - v)^2 (v: the current
    prediction) on the same basis, shrunk towards 1/12 (the variance of a uniform V); the
    concentration follows as v (1 - v) / variance - 1.
    """

    target: str = "leaf_weighted"
    """Value method of ``trace_theory.VALUE_METHODS`` giving the regression targets."""
    knots: int = 9
    signal_range: float = 6.0
    ridge: float = 1.0
    decay: float = 1.0
    """Factor on past statistics per update (1: stationary world, < 1: forget a changing policy)."""
    clip: float = 1e-3
    """Predictions are clipped to [clip, 1 - clip]."""
    stats: tuple[np.ndarray, ...] = field(default=(), repr=False, compare=False)
    """(gram, moment, var_gram, var_moment); empty before the first update."""

    def __post_init__(self):
        VALUE_METHODS.check(self.target)
        if not (isinstance(self.knots, int) and self.knots >= 2):
            raise ValueError(f"`knots` must be an integer >= 2, got {self.knots!r}")
        for name in ("signal_range", "ridge"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"`{name}` must be finite and positive, got {value!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"`decay` must lie in (0, 1], got {self.decay!r}")
        if not 0.0 < self.clip < 0.5:
            raise ValueError(f"`clip` must lie in (0, 0.5), got {self.clip!r}")

    # ---------------------------------------------------------------------------------------------

    def features(self, signal: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """Hat functions of the clipped signal, then the same times depth: shape (n, 2 * knots)."""
        grid = np.linspace(-self.signal_range, self.signal_range, self.knots)
        z = np.clip(np.asarray(signal, dtype=float), grid[0], grid[-1])
        hats = np.maximum(0.0, 1.0 - np.abs(z[:, None] - grid[None, :]) / (grid[1] - grid[0]))
        return np.concatenate([hats, hats * np.asarray(depth, dtype=float)[:, None]], axis=1)

    def _solve(self, gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
        return np.linalg.solve(gram + self.ridge * np.eye(len(gram)), moment)

    def _mean(self, phi: np.ndarray) -> np.ndarray:
        if not self.stats:
            return np.full(len(phi), 0.5)
        return np.clip(0.5 + phi @ self._solve(*self.stats[:2]), self.clip, 1.0 - self.clip)

    def _variance(self, phi: np.ndarray) -> np.ndarray:
        if not self.stats:
            return np.full(len(phi), 1.0 / 12.0)
        return np.clip(1.0 / 12.0 + phi @ self._solve(*self.stats[2:]), 1e-6, None)

    def predict(self, nodes, depth, rng) -> Prediction:
        phi = self.features(nodes["signal"], depth)
        v = self._mean(phi)
        return Prediction(v, _kappa(v, self._variance(phi)))

    def update(self, sim: SimForest) -> LearnedPredictor:
        forest = sim.forest
        target, weight = node_targets(forest, self.target)
        fit = np.flatnonzero(~forest.is_leaf)
        phi = self.features(sim.nodes["signal"][fit], forest.depth[fit])
        w = weight[fit]
        gram, moment = _weighted_gram(phi, w), (target[fit] - 0.5) * w @ phi

        roots, m, s = root_outcomes(forest)
        phi_r = self.features(sim.nodes["signal"][roots], forest.depth[roots])
        v = self._mean(phi_r)
        pair = m >= 2
        squared_error = s * (s - 1.0) / np.maximum(m * (m - 1.0), 1.0) - 2.0 * v * s / m + v * v
        phi_r = phi_r[pair]
        var_gram, var_moment = (
            _weighted_gram(phi_r, np.ones(len(phi_r))),
            (squared_error[pair] - 1.0 / 12.0) @ phi_r,
        )

        new = (gram, moment, var_gram, var_moment)
        if self.stats:
            new = tuple(self.decay * old + add for old, add in zip(self.stats, new))
        return dataclasses.replace(self, stats=new)


@dataclass(frozen=True)
class RunningMeanPredictor:
    """The running success rate of every rollout seen, the same at every node: a predictor with no
    features, what a value head knows before it learns anything about the history.

    v = (1 + successes) / (2 + rollouts), past counts discounted by ``decay`` per update; the
    concentration is 2 + rollouts (a Beta posterior on one shared pass rate).
    """

    decay: float = 0.8
    successes: float = 0.0
    rollouts: float = 0.0

    def __post_init__(self):
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"`decay` must lie in (0, 1], got {self.decay!r}")

    def predict(self, nodes, depth, rng) -> Prediction:
        n = len(np.asarray(depth))
        v = (1.0 + self.successes) / (2.0 + self.rollouts)
        return Prediction(np.full(n, v), np.full(n, min(2.0 + self.rollouts, _KAPPA_RANGE[1])))

    def update(self, sim: SimForest) -> RunningMeanPredictor:
        reward = sim.forest.reward[sim.forest.leaves]
        return dataclasses.replace(self, successes=self.decay * self.successes + float(reward.sum()),
                                   rollouts=self.decay * self.rollouts + float(reward.size))


@dataclass(frozen=True)
class PromptMeanPredictor:
    """Each prompt's own pass rate under a uniform prior, at every node of the prompt: the uniform-prior
    control (nothing learned from the history, nothing shared across prompts).

    v = (1 + s_i) / (2 + n_i) for every node of prompt i, where s_i and n_i count the successes and the
    rollouts sampled at its root so far (``trace_theory.root_outcomes``), discounted by ``decay`` per update;
    the concentration is 2 + n_i. A prompt is a task of the tree MDP (payload ``task``); the Bernoulli
    world draws fresh prompts every step, so there every prompt is new and v = 1/2.
    """

    decay: float = 0.8
    counts: dict = field(default_factory=dict, repr=False, compare=False)
    """task -> (successes, rollouts), discounted."""

    def __post_init__(self):
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"`decay` must lie in (0, 1], got {self.decay!r}")

    def predict(self, nodes, depth, rng) -> Prediction:
        n = len(np.asarray(depth))
        task = nodes.get("task")
        seen = np.array([self.counts.get(int(t), (0.0, 0.0)) for t in task]).reshape(-1, 2) if task is not None \
            else np.zeros((n, 2))
        return Prediction((1.0 + seen[:, 0]) / (2.0 + seen[:, 1]),
                          np.minimum(2.0 + seen[:, 1], _KAPPA_RANGE[1]))

    def update(self, sim: SimForest) -> PromptMeanPredictor:
        if "task" not in sim.nodes:
            return self
        roots, m, s = root_outcomes(sim.forest)
        counts = {t: (self.decay * a, self.decay * b) for t, (a, b) in self.counts.items()}
        for t, si, mi in zip(sim.nodes["task"][roots].tolist(), s.tolist(), m.tolist()):
            a, b = counts.get(int(t), (0.0, 0.0))
            counts[int(t)] = (a + si, b + mi)
        return dataclasses.replace(self, counts=counts)


def _weighted_gram(phi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_n w_n phi_n phi_n^T. ``einsum`` keeps this thin product off multi-threaded BLAS, whose thread
    start-up costs ten times the product itself on a two-core machine."""
    return np.einsum("ni,nj->ij", phi * w[:, None], phi)


PREDICTORS = {"oracle": OraclePredictor, "noisy": NoisyOracle, "learned": LearnedPredictor,
              "running_mean": RunningMeanPredictor, "prompt_mean": PromptMeanPredictor}


def make_predictor(name: str, **options) -> Predictor:
    """The predictor registered as ``name``, built with ``options`` (its dataclass fields)."""
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(PREDICTORS)}")
    return PREDICTORS[name](**options)
