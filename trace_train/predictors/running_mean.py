"""``running_mean``: a decayed running mean of the targets per (task family, depth): the floor to beat.

p(history) = (S_fd + kappa0 g) / (W_fd + kappa0), where f = ``family_of(history)`` (e.g. a guess game's
range), d = min(depth, 16), S_fd and W_fd the decayed sums of weight x target and of weight over the
(f, d) nodes fitted so far, and g = (S + 1/2) / (W + 1) the decayed global mean (shrunk to 1/2). Each
update multiplies every sum by ``mean_decay`` first. Weights are ``node_targets``' normalised to sum to
the batch's node count, so one node counts as one observation. The per-prompt posterior of the base
class sits on top, so a prompt seen often still gets its own pass rate. Cost: one pass over the batch.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .base import EPS, MAX_DEPTH, PREDICTORS, HistoryLike, PosteriorPredictor, family_of


@PREDICTORS.register("running_mean")
class RunningMeanPredictor(PosteriorPredictor):
    """Per-(family, depth) running means under per-prompt Beta posteriors (module docstring)."""

    kind = "running_mean"

    def __init__(self, config=None):
        super().__init__(config)
        self.sums: dict[str, np.ndarray] = {}  # "family|depth" -> [sum of w * y, sum of w], decayed
        self.total = np.zeros(2)

    @staticmethod
    def _key(h: HistoryLike) -> str:
        return f"{family_of(h)}|{min(int(h.depth), MAX_DEPTH)}"

    def _encode(self, histories: Sequence[HistoryLike]) -> list[str]:
        return [self._key(h) for h in histories]

    def _probability(self, keys: list[str]) -> np.ndarray:
        k0 = self.config.prior_strength
        g = (self.total[0] + 0.5) / (self.total[1] + 1.0)
        sums = np.array([self.sums.get(k, np.zeros(2)) for k in keys]).reshape(-1, 2)
        return np.clip((sums[:, 0] + k0 * g) / (sums[:, 1] + k0), EPS, 1 - EPS)

    def _fit(self, keys: list[str], y: np.ndarray, w: np.ndarray) -> None:
        decay = self.config.mean_decay
        w = w * len(y)
        for key in self.sums:
            self.sums[key] = self.sums[key] * decay
        self.total = self.total * decay + np.array([w @ y, w.sum()])
        for key, yi, wi in zip(keys, y.tolist(), w.tolist()):
            self.sums[key] = self.sums.get(key, np.zeros(2)) + np.array([wi * yi, wi])

    def _model_state(self) -> dict[str, Any]:
        keys = sorted(self.sums)
        return {"mean_keys": keys, "means": np.array([self.sums[k] for k in keys]).reshape(-1, 2),
                "total": self.total.copy()}

    def _load_model_state(self, state: Mapping[str, Any]) -> None:
        self.sums = {k: np.array(s, dtype=float) for k, s in zip(state["mean_keys"], state["means"])}
        self.total = np.array(state["total"], dtype=float)
