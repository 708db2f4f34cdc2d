"""``ngram``: logistic regression on signed hashed token n-grams of the exact context plus a depth one-hot.

Features: every token n-gram (n <= ``ngram``) of the history's token ids is hashed to one of
``n_buckets`` signed buckets, the bucket vector L2-normalised; a one-hot of min(depth, 16) is appended.
The model p = sigmoid(x . w + b) is fitted online by weighted mean squared error (the Brier score, a
proper scoring rule, so fitted probabilities are calibrated), ``steps_per_update`` Adam steps per update,
warm-started from the previous step's weights and moments.

``fit: lazy_adam`` (the default) runs Adam on the K features present in the batch only (their weights,
moments and the bias): a step costs O(nnz + K), not O(n_buckets), and the weights of absent features
stay as they are (their gradient would be the ridge term alone). ``fit: adam`` is the dense update over
every bucket (the fit before lazy Adam). Both are deterministic functions of the data and the state.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from .fit_process import feature_matrix, gram_counts, merged_counts, normalised_row, shared_process
from .base import EPS, MAX_DEPTH, PREDICTORS, HistoryLike, PosteriorPredictor, prompt_key

KEPT_OPENINGS = 256
"""Openings whose gram counts the ``ngram`` predictor keeps (about 40 bytes per prompt token each; a step's pool
is tens of prompts)."""


@PREDICTORS.register("ngram")
class HashedSuccessPredictor(PosteriorPredictor):
    """V~(history): hashed n-gram logistic regression plus per-prompt Beta posteriors (module docstring).

    Call it on a list of histories to get probabilities; ``concentration(histories)`` gives the
    posterior strength; ``update(histories, targets, weights)`` fits the model;
    ``observe(histories, successes, failures)`` updates the prompts' posteriors.
    """

    kind = "ngram"

    def __init__(self, config=None):
        super().__init__(config)
        self._dim = self.config.n_buckets + MAX_DEPTH + 1
        self.weights = np.zeros(self._dim)
        self.bias = 0.0
        self._adam_m = np.zeros(self._dim + 1)  # the last entry is the bias's
        self._adam_v = np.zeros(self._dim + 1)
        self._adam_t = 0
        self._openings: dict[str, tuple[tuple[int, ...], np.ndarray, np.ndarray]] = {}
        """Prompt key -> an opening's token ids and gram counts (:meth:`_row`), the latest
        :data:`KEPT_OPENINGS`."""

    def _row(self, h: HistoryLike) -> tuple[np.ndarray, np.ndarray]:
        """One history's feature columns (ascending: its n-gram buckets, then its depth) and values.

        The grams of an opening (a depth-0 history) are kept (:attr:`_openings`, by prompt): a later
        history of the same prompt hashes only the grams that end after the opening, and its counts are the
        opening's plus theirs, the same numbers as hashing it whole (a turn boundary's history is mostly
        its prompt)."""
        cfg, ids = self.config, h.token_ids
        known = self._openings.get(prompt_key(h)) if h.depth else None
        if known is not None and len(known[0]) < len(ids) and tuple(ids[:len(known[0])]) == known[0]:
            tail = max(len(known[0]) - cfg.ngram + 1, 0)  # the tokens of the grams that end after the opening
            more = gram_counts(np.fromiter(ids[tail:], dtype=np.uint64, count=len(ids) - tail),
                               n_buckets=cfg.n_buckets, ngram=cfg.ngram, start=len(known[0]) - tail)
            counts = merged_counts(known[1], known[2], *more)
        else:
            counts = gram_counts(np.fromiter(ids, dtype=np.uint64, count=len(ids)), n_buckets=cfg.n_buckets,
                                 ngram=cfg.ngram)
            if not h.depth:
                self._openings[prompt_key(h)] = (tuple(ids), *counts)
                if len(self._openings) > KEPT_OPENINGS:
                    self._openings.pop(next(iter(self._openings)), None)  # the oldest; safe if another thread did
        return normalised_row(*counts, h.depth, n_buckets=cfg.n_buckets, max_depth=MAX_DEPTH)

    def features(self, histories: Sequence[HistoryLike]) -> sp.csr_matrix:
        """Sparse features: signed hashed n-grams (L2-normalised), a depth one-hot and nothing else."""
        return feature_matrix(**self._encoding(list(histories)))

    def _encoding(self, histories: list[HistoryLike]) -> dict:
        """The histories as :func:`.fit_process.feature_matrix` takes them: one array of tokens cut by lengths."""
        lengths = np.fromiter((len(h.token_ids) for h in histories), dtype=np.int64, count=len(histories))
        tokens = np.fromiter(itertools.chain.from_iterable(h.token_ids for h in histories), dtype=np.uint64,
                             count=int(lengths.sum()))
        depths = np.fromiter((h.depth for h in histories), dtype=np.int64, count=len(histories))
        return dict(tokens=tokens, lengths=lengths, depths=depths, n_buckets=self.config.n_buckets,
                    ngram=self.config.ngram, max_depth=MAX_DEPTH)

    def model_probability(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """p(history), row by row without a sparse matrix (a turn boundary asks about one history): each
        row's dot product summed term by term in column order, as the sparse product sums it, so the value
        is the same to the last bit."""
        histories = list(histories)
        z = np.empty(len(histories))
        for i, h in enumerate(histories):
            cols, vals = self._row(h)
            z[i] = np.cumsum(vals * self.weights[cols])[-1]
        return np.clip(expit(z + self.bias), EPS, 1 - EPS)

    _encode = features

    def _probability(self, X: sp.csr_matrix) -> np.ndarray:
        return np.clip(expit(X @ self.weights + self.bias), EPS, 1 - EPS)

    def _scored_fit(self, histories, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``steps_per_update`` Adam steps on weighted MSE over the batch's features (lazy) or every feature
        (``fit: adam``) and the bias, all of it in the fit process (:mod:`.fit_process`: hashing, Adam and
        both calibrations off the trainer's GIL; the same numbers as inline)."""
        cfg = self.config
        encoding = self._encoding(histories)

        def state(cols: np.ndarray) -> tuple:
            idx = np.append(cols, self._dim)  # moment entries: the columns, then the bias
            return np.append(self.weights[cols], self.bias), self._adam_m[idx], self._adam_v[idx], self._adam_t

        cols, before, theta, m, v, t, after = shared_process().fit(
            encoding, state, y, w, dense=cfg.fit == "adam", eps=EPS, steps=cfg.steps_per_update,
            learning_rate=cfg.learning_rate, l2=cfg.l2)
        idx = np.append(cols, self._dim)
        self.weights[cols], self.bias = theta[:-1], float(theta[-1])
        self._adam_m[idx], self._adam_v[idx], self._adam_t = m, v, t
        return before, after

    def _model_state(self) -> dict[str, Any]:
        return {"weights": self.weights.copy(), "bias": self.bias, "adam_m": self._adam_m.copy(),
                "adam_v": self._adam_v.copy(), "adam_t": self._adam_t}

    def _load_model_state(self, state: Mapping[str, Any]) -> None:
        self.weights = np.array(state["weights"], dtype=float)
        self.bias = float(state["bias"])
        self._adam_m = np.array(state["adam_m"], dtype=float)
        self._adam_v = np.array(state["adam_v"], dtype=float)
        self._adam_t = int(state["adam_t"])
