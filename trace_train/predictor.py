"""The success predictor: V~(history), shared by root and prefix allocation (PAPER.md, "Predictor").

A history (a prompt, or a prompt plus the turns taken so far) is mapped to P(success) by

1. **a learned model**: logistic regression on hashed token n-grams of the exact context (feature
   hashing with signed buckets, L2-normalised) plus a one-hot of the depth, fitted online each step
   by weighted mean squared error (the Brier score, a proper scoring rule, so fitted probabilities are
   calibrated) on the recursive targets of ``trace_theory.node_targets``;
2. **a per-prompt Beta posterior** for prompts seen before: the model's prediction p counts as
   ``prior_strength`` pseudo-observations, the prompt's own (decayed) successes s and failures f are
   added: Beta(kappa0 p + s, kappa0 (1 - p) + f). A prompt never seen gets the model's prediction with
   strength kappa0; a prompt seen often gets its measured pass rate. ``concentration`` returns
   kappa0 + s + f, which the ``trace_beta`` policy uses.

Prefix predictions inherit their prompt's correction: logit V~(prefix) = logit p(prefix) +
[logit(posterior mean) - logit p(prompt)], with the bracket from the prompt's latest root prediction
(0 for prompts without one). The predictor only serves the allocator; the policy never sees it.

It is cheap (sparse NumPy), runs on CPU next to the trainer, and its whole state is a few arrays that
:meth:`state_dict` returns for checkpoints.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, logit

from trace_theory import brier_score, expected_calibration_error

__all__ = ["PredictorConfig", "HashedSuccessPredictor"]

_MAX_DEPTH_FEATURE = 16
_EPS = 1e-4  # predictions are kept in [eps, 1 - eps]


class HistoryLike(Protocol):
    """What the predictor reads from a history (``trace_train.engine.History`` has these)."""

    depth: int
    messages: Sequence[Mapping[str, str]]
    token_ids: Sequence[int]


@dataclass(frozen=True)
class PredictorConfig:
    """Settings of :class:`HashedSuccessPredictor`, validated on construction."""

    n_buckets: int = 2**18
    """Hashed n-gram features."""
    ngram: int = 2
    """Longest token n-gram hashed (1 = bag of tokens)."""
    learning_rate: float = 0.1
    """Adam step size."""
    steps_per_update: int = 200
    """Adam steps per call of :meth:`HashedSuccessPredictor.update`."""
    l2: float = 1e-4
    """Ridge penalty on the weights (not the bias)."""
    prior_strength: float = 4.0
    """kappa0: pseudo-observations the model's prediction is worth in a prompt's posterior."""
    history_decay: float = 0.9
    """Each update multiplies a prompt's past counts by this (the policy changes; old outcomes fade)."""
    seed: int = 0
    """Unused: the fit is deterministic (kept so that saved configs still load)."""

    def __post_init__(self):
        if not (isinstance(self.n_buckets, int) and self.n_buckets >= 16):
            raise ValueError(f"`n_buckets` must be an integer >= 16, got {self.n_buckets!r}")
        if not (isinstance(self.ngram, int) and 1 <= self.ngram <= 4):
            raise ValueError(f"`ngram` must be 1, 2, 3 or 4, got {self.ngram!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be positive, got {self.learning_rate!r}")
        if not (isinstance(self.steps_per_update, int) and self.steps_per_update >= 1):
            raise ValueError(f"`steps_per_update` must be a positive integer, got {self.steps_per_update!r}")
        if not self.l2 >= 0:
            raise ValueError(f"`l2` must be >= 0, got {self.l2!r}")
        if not self.prior_strength > 0:
            raise ValueError(f"`prior_strength` must be positive, got {self.prior_strength!r}")
        if not 0 < self.history_decay <= 1:
            raise ValueError(f"`history_decay` must lie in (0, 1], got {self.history_decay!r}")


def prompt_key(history: HistoryLike) -> str:
    """A stable id of a history's prompt: a hash of the messages before the first assistant turn."""
    opening = []
    for message in history.messages:
        if message.get("role") == "assistant":
            break
        opening.append(f"{message.get('role')}\x00{message.get('content')}")
    return hashlib.blake2b("\x01".join(opening).encode(), digest_size=12).hexdigest()


class HashedSuccessPredictor:
    """V~(history): hashed n-gram logistic regression plus per-prompt Beta posteriors (module docstring).

    Call it on a list of histories to get probabilities; ``concentration(histories)`` gives the
    posterior strength; ``update(histories, targets, weights)`` fits the model;
    ``observe(histories, successes, failures)`` updates the prompts' posteriors.
    """

    def __init__(self, config: PredictorConfig = PredictorConfig()):
        self.config = config
        self._dim = config.n_buckets + _MAX_DEPTH_FEATURE + 1
        self.weights = np.zeros(self._dim)
        self.bias = 0.0
        self._adam_m = np.zeros(self._dim + 1)
        self._adam_v = np.zeros(self._dim + 1)
        self._adam_t = 0
        self.counts: dict[str, np.ndarray] = {}  # prompt key -> [successes, failures], decayed
        self._offsets: dict[str, float] = {}  # prompt key -> posterior logit correction

    # -----------------------------------------------------------------------------------------------
    # Features and the model
    # -----------------------------------------------------------------------------------------------

    def features(self, histories: Sequence[HistoryLike]) -> sp.csr_matrix:
        """Sparse features: signed hashed n-grams (L2-normalised), a depth one-hot and nothing else."""
        rows, cols, vals = [], [], []
        nb = self.config.n_buckets
        for i, h in enumerate(histories):
            ids = np.asarray(h.token_ids, dtype=np.uint64)
            grams = [ids]
            for n in range(2, self.config.ngram + 1):
                if len(ids) >= n:
                    mixed = ids[: len(ids) - n + 1].copy()
                    for j in range(1, n):
                        mixed = mixed * np.uint64(0x9E3779B97F4A7C15) + ids[j: len(ids) - n + 1 + j]
                    grams.append(mixed + np.uint64(n))
            hashed = np.concatenate(grams) * np.uint64(0xBF58476D1CE4E5B9)
            hashed ^= hashed >> np.uint64(31)
            bucket = (hashed % np.uint64(nb)).astype(np.int64)
            sign = np.where((hashed >> np.uint64(63)) == 1, -1.0, 1.0)
            uniq, inverse = np.unique(bucket, return_inverse=True)
            value = np.bincount(inverse, weights=sign, minlength=len(uniq))
            norm = np.linalg.norm(value)
            if norm > 0:
                value = value / norm
            rows.append(np.full(len(uniq) + 1, i))
            cols.append(np.concatenate([uniq, [nb + min(int(h.depth), _MAX_DEPTH_FEATURE)]]))
            vals.append(np.concatenate([value, [1.0]]))
        if not rows:
            return sp.csr_matrix((0, self._dim))
        return sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(histories), self._dim)
        )

    def model_probability(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """p(history) from the learned model alone, without prompt posteriors."""
        return np.clip(expit(self.features(histories) @ self.weights + self.bias), _EPS, 1 - _EPS)

    # -----------------------------------------------------------------------------------------------
    # Predictions
    # -----------------------------------------------------------------------------------------------

    def _posterior(self, keys: list[str], p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k0 = self.config.prior_strength
        counts = np.array([self.counts.get(k, np.zeros(2)) for k in keys]).reshape(-1, 2)
        a = k0 * p + counts[:, 0]
        b = k0 * (1.0 - p) + counts[:, 1]
        return a / (a + b), a + b

    def __call__(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """Predicted success probability of each history (roots: posterior mean; prefixes: corrected)."""
        histories = list(histories)
        p = self.model_probability(histories)
        keys = [prompt_key(h) for h in histories]
        out = p.copy()
        roots = np.array([h.depth == 0 for h in histories], dtype=bool)
        if roots.any():
            idx = np.flatnonzero(roots)
            mean, _ = self._posterior([keys[i] for i in idx], p[idx])
            out[idx] = np.clip(mean, _EPS, 1 - _EPS)
            for i, m in zip(idx.tolist(), out[idx].tolist()):
                self._offsets[keys[i]] = float(logit(m) - logit(p[i]))
        prefixes = np.flatnonzero(~roots)
        if prefixes.size:
            shift = np.array([self._offsets.get(keys[i], 0.0) for i in prefixes])
            out[prefixes] = np.clip(expit(logit(p[prefixes]) + shift), _EPS, 1 - _EPS)
        return out

    def concentration(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """Strength kappa of each history's Beta posterior: kappa0 plus the prompt's counts for roots."""
        histories = list(histories)
        p = self.model_probability(histories)
        _, kappa = self._posterior([prompt_key(h) for h in histories], p)
        return np.where([h.depth == 0 for h in histories], kappa, self.config.prior_strength)

    # -----------------------------------------------------------------------------------------------
    # Learning
    # -----------------------------------------------------------------------------------------------

    def observe(self, histories: Sequence[HistoryLike], successes, failures) -> None:
        """Add outcomes of rollouts sampled at these prompts (decaying what was there before)."""
        successes = np.asarray(successes, dtype=float)
        failures = np.asarray(failures, dtype=float)
        if successes.shape != (len(histories),) or failures.shape != (len(histories),):
            raise ValueError("`successes` and `failures` must have one entry per history")
        if (successes < 0).any() or (failures < 0).any():
            raise ValueError("`successes` and `failures` must be non-negative")
        decay = self.config.history_decay
        for key in self.counts:
            self.counts[key] = self.counts[key] * decay
        for h, s, f in zip(histories, successes, failures):
            key = prompt_key(h)
            self.counts[key] = self.counts.get(key, np.zeros(2)) + np.array([s, f])

    def update(self, histories: Sequence[HistoryLike], targets, weights=None) -> dict[str, float]:
        """Fit the model to (history, target) pairs by weighted MSE; returns calibration before the fit.

        ``targets`` are value estimates in [0, 1] (``trace_theory.node_targets``), ``weights`` their
        sample weights. The returned Brier score and ECE are measured *before* fitting, on data the
        model has not seen: an honest online estimate of its calibration.
        """
        histories = list(histories)
        y = np.asarray(targets, dtype=float)
        w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
        if y.shape != (len(histories),) or w.shape != y.shape:
            raise ValueError("`targets` and `weights` must have one entry per history")
        if len(histories) == 0:
            return {"predictor_examples": 0.0}
        if not ((y >= 0) & (y <= 1)).all():
            raise ValueError("`targets` must lie in [0, 1]")
        if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
            raise ValueError("`weights` must be finite, non-negative and not all zero")
        X = self.features(histories)
        before = np.clip(expit(X @ self.weights + self.bias), _EPS, 1 - _EPS)
        metrics = {
            "predictor_examples": float(len(y)),
            "predictor_brier": brier_score(before, y),
            "predictor_ece": expected_calibration_error(before, y),
        }
        w = w / w.sum()
        cfg = self.config
        beta1, beta2 = 0.9, 0.999
        for _ in range(cfg.steps_per_update):
            p = expit(X @ self.weights + self.bias)
            residual = w * 2.0 * (p - y) * p * (1.0 - p)  # d/dz of w (sigmoid(z) - y)^2
            grad = np.empty(self._dim + 1)
            grad[:-1] = X.T @ residual + 2.0 * cfg.l2 * self.weights
            grad[-1] = residual.sum()
            self._adam_t += 1
            self._adam_m = beta1 * self._adam_m + (1 - beta1) * grad
            self._adam_v = beta2 * self._adam_v + (1 - beta2) * grad * grad
            m_hat = self._adam_m / (1 - beta1**self._adam_t)
            v_hat = self._adam_v / (1 - beta2**self._adam_t)
            step = cfg.learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8)
            self.weights -= step[:-1]
            self.bias -= step[-1]
        after = np.clip(expit(X @ self.weights + self.bias), _EPS, 1 - _EPS)
        metrics["predictor_brier_after"] = brier_score(after, y)
        return metrics

    # -----------------------------------------------------------------------------------------------
    # Checkpoints
    # -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: config, weights, optimiser moments and prompt posteriors."""
        keys = sorted(self.counts)
        return {
            "config": asdict(self.config),
            "weights": self.weights.copy(),
            "bias": self.bias,
            "adam_m": self._adam_m.copy(),
            "adam_v": self._adam_v.copy(),
            "adam_t": self._adam_t,
            "count_keys": keys,
            "counts": np.array([self.counts[k] for k in keys]).reshape(-1, 2),
            "offset_keys": sorted(self._offsets),
            "offsets": np.array([self._offsets[k] for k in sorted(self._offsets)]),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "HashedSuccessPredictor":
        self = cls(PredictorConfig(**state["config"]))
        self.weights = np.array(state["weights"], dtype=float)
        self.bias = float(state["bias"])
        self._adam_m = np.array(state["adam_m"], dtype=float)
        self._adam_v = np.array(state["adam_v"], dtype=float)
        self._adam_t = int(state["adam_t"])
        self.counts = {k: np.array(c, dtype=float) for k, c in zip(state["count_keys"], state["counts"])}
        self._offsets = {k: float(o) for k, o in zip(state["offset_keys"], state["offsets"])}
        return self
