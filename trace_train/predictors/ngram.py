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

from .fit_process import batch_gram_counts, feature_matrix, merged_counts, rows_from_counts, shared_process
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
        """Prompt key -> an opening's token ids and gram counts (:meth:`model_probability`), the latest
        :data:`KEPT_OPENINGS`."""

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
        """p(history) of a batch (a round of turn boundaries), every history's grams hashed at once.

        The grams of an opening (a depth-0 history) are kept (:attr:`_openings`, by prompt): a later history
        that extends it hashes only the grams that end after the opening, merged with the opening's counts
        (sums of whole numbers: exactly the counts of hashing it whole; a turn boundary's history is mostly
        its prompt). The rows are then those of :meth:`features` and p is the sparse product's, bit for bit,
        however the histories are grouped (no sparse matrix is built: a round may be one history)."""
        histories = list(histories)
        return self._keyed_probability(histories, [prompt_key(h) for h in histories])

    def _keyed_probability(self, histories: list[HistoryLike], prompts: list[str]) -> np.ndarray:
        """:meth:`model_probability` with the histories' prompt keys given (each opening hashed once a call)."""
        cfg, n_buckets = self.config, self.config.n_buckets
        pieces, starts, known_rows = [], [], []  # what each row hashes, where its new grams end; (row, opening)
        for r, h in enumerate(histories):
            ids = h.token_ids
            known = self._openings.get(prompts[r]) if h.depth else None
            if known is not None and len(known[0]) < len(ids) and tuple(ids[:len(known[0])]) == known[0]:
                tail = max(len(known[0]) - cfg.ngram + 1, 0)  # the tokens of the grams that end after the opening
                pieces.append(ids[tail:])
                starts.append(len(known[0]) - tail)
                known_rows.append((r, known))
            else:
                pieces.append(ids)
                starts.append(0)
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        tokens = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.uint64, count=int(lengths.sum()))
        keys, counts = batch_gram_counts(tokens, lengths, n_buckets=n_buckets, ngram=cfg.ngram,
                                         starts=np.asarray(starts, dtype=np.int64))
        if known_rows:  # rows ascending, buckets ascending within: the keys are ascending, as merging needs
            keys, counts = merged_counts(np.concatenate([r * n_buckets + k[1] for r, k in known_rows]),
                                         np.concatenate([k[2] for _, k in known_rows]), keys, counts)
        for r, h in enumerate(histories):
            if not h.depth:
                lo, hi = np.searchsorted(keys, [r * n_buckets, (r + 1) * n_buckets])
                self._openings[prompts[r]] = (tuple(h.token_ids), keys[lo:hi] - r * n_buckets, counts[lo:hi].copy())
                if len(self._openings) > KEPT_OPENINGS:
                    self._openings.pop(next(iter(self._openings)), None)  # the oldest; safe if another thread did
        depths = np.fromiter((h.depth for h in histories), dtype=np.int64, count=len(histories))
        data, cols, indptr = rows_from_counts(keys, counts, depths, n_buckets=n_buckets, max_depth=MAX_DEPTH)
        terms = data * self.weights[cols]
        z = np.empty(len(histories))  # each row's terms summed one by one in column order, as the sparse product does
        for r, (lo, hi) in enumerate(zip(indptr[:-1].tolist(), indptr[1:].tolist())):
            z[r] = np.cumsum(terms[lo:hi])[-1]
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
