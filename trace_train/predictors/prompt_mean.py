"""``prompt_mean``: each prompt's own pass rate under a uniform prior, nothing learned from the transcript.

V~(history) = (s + 1) / (n + 2), the mean of the Beta(1 + s, 1 + f) posterior of the history's prompt
(``prompt_key``): s successes and f failures of the rollouts observed at that prompt (n = s + f, decayed
by ``history_decay`` per observation, as every kind's prompt counts are), a uniform Beta(1, 1) prior
before them. Every prefix of a prompt gets its prompt's value, whatever its transcript says; an unseen
prompt gets 1/2. Nothing is fitted (``update`` only scores the targets) and nothing is shared across
prompts: the control HORA's finding asks for (a uniform prior as good as learned predictors). The
concentration is n + 2 at roots (the posterior's strength) and 2 at prefixes; ``prior_strength`` is
not read. Compare ``running_mean``, which shares a mean per (task family, depth) across prompts.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .base import EPS, PREDICTORS, HistoryLike, PosteriorPredictor, prompt_key

UNIFORM = 2.0
"""Pseudo-observations of the uniform prior Beta(1, 1): one success and one failure."""


@PREDICTORS.register("prompt_mean")
class PromptMeanPredictor(PosteriorPredictor):
    """Per-prompt posterior mean (s + 1) / (n + 2) at every node of the prompt (module docstring)."""

    kind = "prompt_mean"

    def _encode(self, histories: Sequence[HistoryLike]) -> list[str]:
        return [prompt_key(h) for h in histories]

    def _probability(self, keys: list[str]) -> np.ndarray:
        mean, _ = self._posterior(keys, np.full(len(keys), 0.5))
        return np.clip(mean, EPS, 1 - EPS)

    def _posterior(self, keys: list[str], p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(1 + s, 1 + f) per prompt: the uniform prior, whatever ``p`` and ``prior_strength`` say."""
        counts = np.array([self.counts.get(k, np.zeros(2)) for k in keys]).reshape(-1, 2)
        a, b = UNIFORM / 2 + counts[:, 0], UNIFORM / 2 + counts[:, 1]
        return a / (a + b), a + b

    def concentration(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        histories = list(histories)
        _, kappa = self._posterior(self._encode(histories), np.full(len(histories), 0.5))
        return np.where([h.depth == 0 for h in histories], kappa, UNIFORM)

    def _fit(self, keys: list[str], y: np.ndarray, w: np.ndarray) -> None:
        """Nothing is learned from the targets: the prompts' counts come from ``observe``."""

    def _model_state(self) -> dict[str, Any]:
        return {}

    def _load_model_state(self, state: Mapping[str, Any]) -> None:
        pass
