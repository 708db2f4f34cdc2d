"""``probe``: logistic regression on the policy's own last-layer hidden state at the end of the history.

Features: h(history), the policy's last-layer hidden state (after its final norm) at the history's last
token (the prompt's end for a root, a turn boundary for a prefix), standardised by decayed running
moments, plus a one-hot of min(depth, 16):

    x = [(h - mu) / sigma, onehot(depth)],   p = sigmoid(x . w + b)

The states come from an *encoder* the trainer attaches (:meth:`HiddenStateProbe.attach`:
``trace_train.predictors.hidden_states.PolicyStates``, a no-grad forward of the policy that reads every
prefix of a sequence from one forward of its longest extension). States are cached per token sequence
from the moment they are computed until the end of the next ``update``, so a step's fit sees the states
of the policy that generated the step, even though the fit runs on a worker thread while the policy
updates; the trainer calls :meth:`prepare` in its main thread for the histories the fit will read.

Each ``update`` first decays the running moments (``mean_decay``) and adds the batch's, then takes one
proximal step from the previous weights theta' = (w', b'):

    theta = argmin  sum_i w_i CE(y_i, sigmoid(x_i . w + b)) + l2 ||w||^2 + ||theta - theta'||^2 / (2 eta)

(weights w_i normalised to sum 1, eta = ``probe_step``), with at most ``steps_per_update`` L-BFGS
iterations from theta': a convex problem, so the fit is a deterministic function of the data and the
previous state. The proximal term is the probe's memory: without it each step's fit would forget every
earlier batch (measured by ``bench.predictor``: anchors Brier 0.150 without, 0.144 with eta = 1). Model
state: w, b and the moments.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from .base import EPS, MAX_DEPTH, PREDICTORS, HistoryLike, PosteriorPredictor

Encoder = Callable[[list[Sequence[int]]], np.ndarray]
"""token sequences -> (n, hidden) array: the state at each sequence's last token."""


def state_key(token_ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


@PREDICTORS.register("probe")
class HiddenStateProbe(PosteriorPredictor):
    """V~(history) from the policy's hidden state at the history's end (module docstring)."""

    kind = "probe"
    needs_states = True

    def __init__(self, config=None):
        super().__init__(config)
        self.weights: np.ndarray | None = None  # (hidden + MAX_DEPTH + 1,), sized at the first fit
        self.bias = 0.0
        self.moments: np.ndarray | None = None  # (3, hidden): decayed sums of 1, h, h^2
        self._encoder: Encoder | None = None
        self._cache: dict[bytes, np.ndarray] = {}
        self._encode_seconds = 0.0

    # The states ------------------------------------------------------------------------------------

    def attach(self, encoder: Encoder | None) -> None:
        """Use ``encoder`` for histories whose state is not cached (None detaches it)."""
        self._encoder = encoder
        self._cache.clear()

    def prepare(self, histories: Sequence[HistoryLike]) -> None:
        """Compute and cache the states of ``histories`` now (the trainer's main thread, before the update)."""
        self._states(list(histories))

    def _states(self, histories: list[HistoryLike]) -> np.ndarray:
        keys = [state_key(h.token_ids) for h in histories]
        missing = {k: h.token_ids for k, h in zip(keys, histories) if k not in self._cache}
        if missing:
            if self._encoder is None:
                raise RuntimeError("predictor.kind=probe reads the policy's hidden states, but no encoder is "
                                   "attached (the trainer attaches the policy's; in code: probe.attach(encoder))")
            t0 = time.perf_counter()
            states = np.asarray(self._encoder([list(ids) for ids in missing.values()]), dtype=np.float64)
            self._encode_seconds += time.perf_counter() - t0
            if states.ndim != 2 or states.shape[0] != len(missing) or not np.isfinite(states).all():
                raise ValueError(f"the encoder must return finite states of shape ({len(missing)}, hidden), "
                                 f"got shape {states.shape}")
            self._cache.update(zip(missing, states))
        if not histories:
            return np.zeros((0, 0 if self.moments is None else self.moments.shape[1]))
        return np.stack([self._cache[k] for k in keys])

    # The model -------------------------------------------------------------------------------------

    def _encode(self, histories: Sequence[HistoryLike]) -> tuple[np.ndarray, np.ndarray]:
        histories = list(histories)
        depth = np.minimum([int(h.depth) for h in histories], MAX_DEPTH).astype(int) if histories else np.zeros(0, int)
        return self._states(histories), depth

    def _design(self, H: np.ndarray, depth: np.ndarray) -> np.ndarray:
        count, total, squares = self.moments
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean**2, 0.0)) + 1e-6
        onehot = np.zeros((len(depth), MAX_DEPTH + 1))
        onehot[np.arange(len(depth)), depth] = 1.0
        return np.hstack([(H - mean) / std, onehot])

    def _probability(self, encoded) -> np.ndarray:
        H, depth = encoded
        if self.weights is None:  # nothing fitted yet: the uninformed 1/2
            return np.full(len(depth), 0.5)
        return np.clip(expit(self._design(H, depth) @ self.weights + self.bias), EPS, 1 - EPS)

    def _fit(self, encoded, y: np.ndarray, w: np.ndarray) -> None:
        H, depth = encoded
        decay = self.config.mean_decay
        batch = np.stack([np.full(H.shape[1], float(len(H))), H.sum(0), (H * H).sum(0)])
        if self.moments is None or self.moments.shape[1] != H.shape[1]:
            if self.moments is not None:
                raise ValueError(f"the encoder's states changed width: {self.moments.shape[1]} -> {H.shape[1]}")
            self.moments = batch
            self.weights = np.zeros(H.shape[1] + MAX_DEPTH + 1)
        else:
            self.moments = decay * self.moments + batch
        X = self._design(H, depth)
        l2, pull = self.config.l2, 1.0 / self.config.probe_step
        previous = np.append(self.weights, self.bias)

        def loss(theta):
            z = X @ theta[:-1] + theta[-1]
            # weighted cross-entropy with soft targets: -[y log s(z) + (1 - y) log s(-z)]
            value = -(w * (y * log_expit(z) + (1 - y) * log_expit(-z))).sum() + l2 * theta[:-1] @ theta[:-1]
            residual = w * (expit(z) - y)
            grad = np.append(X.T @ residual + 2 * l2 * theta[:-1], residual.sum())
            moved = theta - previous  # the proximal term: what earlier steps taught is kept, not refitted away
            return value + 0.5 * pull * moved @ moved, grad + pull * moved

        result = minimize(loss, previous, jac=True, method="L-BFGS-B",
                          options={"maxiter": self.config.steps_per_update})
        self.weights, self.bias = result.x[:-1].copy(), float(result.x[-1])

    def update(self, histories, targets, weights=None) -> dict[str, float]:
        """The base fit (before/after calibration), plus the seconds spent computing states since the last
        update; the cached states belong to the policy before its update, so they are dropped after."""
        try:
            metrics = super().update(histories, targets, weights)
        finally:
            self._cache.clear()
        metrics["predictor_state_seconds"] = self._encode_seconds
        self._encode_seconds = 0.0
        return metrics

    def _model_state(self) -> dict[str, Any]:
        return {"weights": np.zeros(0) if self.weights is None else self.weights.copy(), "bias": self.bias,
                "moments": np.zeros((3, 0)) if self.moments is None else self.moments.copy()}

    def _load_model_state(self, state: Mapping[str, Any]) -> None:
        weights = np.array(state["weights"], dtype=float)
        moments = np.array(state["moments"], dtype=float)
        self.weights = weights if weights.size else None
        self.moments = moments if moments.size else None
        self.bias = float(state["bias"])
