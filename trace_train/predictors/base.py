"""What every predictor kind shares: the per-prompt Beta posterior over a fitted model p(history).

A kind supplies the model: :meth:`PosteriorPredictor.model_probability` (p per history),
:meth:`~PosteriorPredictor._fit` (one online fit on weighted targets) and its arrays for checkpoints.
On top of it, for prompts seen before, the model's p counts as ``prior_strength`` = kappa0
pseudo-observations and the prompt's own decayed successes s and failures f are added:
Beta(kappa0 p + s, kappa0 (1 - p) + f). Roots get the posterior mean; ``concentration`` returns
kappa0 + s + f (kappa0 for prefixes), which the ``trace_beta`` policy uses. Prefix predictions inherit
their prompt's correction: logit V~(prefix) = logit p(prefix) + [logit(posterior mean) - logit p(prompt)],
the bracket from the prompt's latest root prediction (0 for prompts without one).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from scipy.special import expit, logit

from trace_theory import brier_score, expected_calibration_error
from trace_theory._registry import Registry

from ..configs import PredictorConfig

PREDICTORS: Registry[type] = Registry("predictor kind")
"""Predictor kinds by name; each kind's module registers its class (``configs.PREDICTOR_KINDS`` names them)."""

EPS = 1e-4  # predictions are kept in [eps, 1 - eps]
MAX_DEPTH = 16  # depths beyond this share one feature / one running mean
INSTANCE_KEYS = frozenset({"target", "answer", "answers", "solution", "question", "problem", "prompt", "text",
                           "id", "messages", "context", "query", "input", "output"})
"""Row fields that identify one instance, not its family (``family_of``)."""


class HistoryLike(Protocol):
    """What the predictor reads from a history (``trace_train.rollout.engine.History`` has these, and ``row``)."""

    depth: int
    messages: Sequence[Mapping[str, str]]
    token_ids: Sequence[int]


def prompt_key(history: HistoryLike) -> str:
    """A stable id of a history's prompt: a hash of the messages before the first assistant turn."""
    opening = []
    for message in history.messages:
        if message.get("role") == "assistant":
            break
        opening.append(f"{message.get('role')}\x00{message.get('content')}")
    return hashlib.blake2b("\x01".join(opening).encode(), digest_size=12).hexdigest()


def family_of(history: HistoryLike) -> str:
    """The task family of a history's row: its ``family`` field if it has one, else its short scalar fields
    that do not identify the instance (not in ``INSTANCE_KEYS``; e.g. a guess game's range and guesses);
    "" (one family) for a history without a row or a row with no such fields."""
    row = getattr(history, "row", None)
    if not isinstance(row, Mapping):
        return ""
    if "family" in row:
        return str(row["family"])
    parts = [f"{k}={v}" for k, v in sorted(row.items(), key=lambda kv: str(kv[0]))
             if str(k) not in INSTANCE_KEYS and isinstance(v, (int, float, bool, str)) and len(str(v)) <= 64]
    return ",".join(parts)


def state_digest(state: dict) -> str:
    """A hash of a predictor's learned state (:meth:`PosteriorPredictor.state_dict`: its model's arrays, the
    prompts' counts), without the per-step cache of root corrections that each rank fills for its own prompts."""
    h = hashlib.blake2b(digest_size=16)
    for key, value in sorted(state.items()):
        if key not in ("offset_keys", "offsets"):
            h.update(key.encode())
            h.update(np.ascontiguousarray(value).tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
    return h.hexdigest()


class PosteriorPredictor:
    """A fitted model p(history) under per-prompt Beta posteriors (module docstring)."""

    kind = ""
    needs_states = False
    """Whether the kind reads the policy's hidden states: the trainer then :meth:`attach` es the policy's
    forward and calls :meth:`prepare` on the fit's histories before the policy updates (one process only)."""

    def __init__(self, config: PredictorConfig | None = None):
        self.config = PredictorConfig(kind=self.kind) if config is None else config
        if self.config.kind != self.kind:
            raise ValueError(f"a {type(self).__name__} needs `kind: {self.kind}`, got {self.config.kind!r}")
        self.counts: dict[str, np.ndarray] = {}  # prompt key -> [successes, failures], decayed
        self._offsets: dict[str, float] = {}  # prompt key -> posterior logit correction

    # The model: supplied by each kind ---------------------------------------------------------------

    def _encode(self, histories: Sequence[HistoryLike]) -> Any:
        """The model's input for these histories (features, keys), computed once per call or fit."""
        raise NotImplementedError

    def _probability(self, encoded: Any) -> np.ndarray:
        """p of encoded histories, in [EPS, 1 - EPS]."""
        raise NotImplementedError

    def _fit(self, encoded: Any, y: np.ndarray, w: np.ndarray) -> None:
        """One online fit on targets ``y`` with weights ``w`` (normalised to sum 1)."""
        raise NotImplementedError

    def model_probability(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """p(history) from the model alone, without prompt posteriors, in [EPS, 1 - EPS]."""
        return self._probability(self._encode(list(histories)))

    def _keyed_probability(self, histories: list[HistoryLike], keys: list[str]) -> np.ndarray:
        """:meth:`model_probability` of histories whose :func:`prompt_key` s the caller has (a kind that reads
        them takes them from here rather than hashing each history's opening again)."""
        return self.model_probability(histories)

    def _model_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_model_state(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    # Predictions -----------------------------------------------------------------------------------

    def _posterior(self, keys: list[str], p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k0 = self.config.prior_strength
        counts = np.array([self.counts.get(k, np.zeros(2)) for k in keys]).reshape(-1, 2)
        a = k0 * p + counts[:, 0]
        b = k0 * (1.0 - p) + counts[:, 1]
        return a / (a + b), a + b

    def __call__(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """Predicted success probability of each history (roots: posterior mean; prefixes: corrected)."""
        histories = list(histories)
        keys = [prompt_key(h) for h in histories]
        p = self._keyed_probability(histories, keys)
        out = p.copy()
        roots = np.array([h.depth == 0 for h in histories], dtype=bool)
        if roots.any():
            idx = np.flatnonzero(roots)
            mean, _ = self._posterior([keys[i] for i in idx], p[idx])
            out[idx] = np.clip(mean, EPS, 1 - EPS)
            for i, m in zip(idx.tolist(), out[idx].tolist()):
                self._offsets[keys[i]] = float(logit(m) - logit(p[i]))
        prefixes = np.flatnonzero(~roots)
        if prefixes.size:
            shift = np.array([self._offsets.get(keys[i], 0.0) for i in prefixes])
            out[prefixes] = np.clip(expit(logit(p[prefixes]) + shift), EPS, 1 - EPS)
        return out

    predict = __call__

    def concentration(self, histories: Sequence[HistoryLike]) -> np.ndarray:
        """Strength kappa of each history's Beta posterior: kappa0 plus the prompt's counts for roots."""
        histories = list(histories)
        keys = [prompt_key(h) for h in histories]
        _, kappa = self._posterior(keys, self._keyed_probability(histories, keys))
        return np.where([h.depth == 0 for h in histories], kappa, self.config.prior_strength)

    # Learning --------------------------------------------------------------------------------------

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
        """Fit the model to (history, target) pairs; returns its calibration before and after the fit.

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
        before, after = self._scored_fit(histories, y, w / w.sum())
        return {
            "predictor_examples": float(len(y)),
            "predictor_brier": brier_score(before, y),
            "predictor_ece": expected_calibration_error(before, y),
            "predictor_brier_after": brier_score(after, y),
        }

    def _scored_fit(self, histories: list[HistoryLike], y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_fit` on the histories' encoding; returns p of the histories before and after it."""
        encoded = self._encode(histories)
        before = self._probability(encoded)
        self._fit(encoded, y, w)
        return before, self._probability(encoded)

    # Capabilities (see ``needs_states``) -------------------------------------------------------------

    def attach(self, encoder: Any) -> None:
        """Use ``encoder`` (the policy's states) for histories; kinds that read none ignore it."""

    def prepare(self, histories: Sequence[HistoryLike]) -> None:
        """Compute what the next fit needs from the policy before it updates; nothing for most kinds."""

    # Checkpoints -----------------------------------------------------------------------------------

    def digest(self) -> str:
        """A hash of the learned state (the model's arrays, the prompts' counts), without the per-step cache
        of root corrections, which each rank fills for its own prompts before reading it."""
        return state_digest(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: config, the model's arrays, prompt posteriors."""
        keys, offsets = sorted(self.counts), sorted(self._offsets)
        return {
            "config": asdict(self.config),
            **self._model_state(),
            "count_keys": keys,
            "counts": np.array([self.counts[k] for k in keys]).reshape(-1, 2),
            "offset_keys": offsets,
            "offsets": np.array([self._offsets[k] for k in offsets]),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]):
        config = {"kind": cls.kind, **state["config"]}
        config.pop("seed", None)  # a removed, unused field that states saved before its removal still hold
        self = cls(PredictorConfig(**config))
        self._load_model_state(state)
        self.counts = {k: np.array(c, dtype=float) for k, c in zip(state["count_keys"], state["counts"])}
        self._offsets = {k: float(o) for k, o in zip(state["offset_keys"], state["offsets"])}
        return self
