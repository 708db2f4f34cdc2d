"""``PredictorConfig``: the settings of every predictor kind, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

FITS = ("lazy_adam", "adam")


@dataclass(frozen=True)
class PredictorConfig:
    """Settings of the success predictor (``trace_train.predictors``), validated on construction."""

    n_buckets: int = 2**18
    """Hashed n-gram features (``ngram``)."""
    ngram: int = 2
    """Longest token n-gram hashed (1 = bag of tokens)."""
    learning_rate: float = 0.1
    """Adam step size (``ngram``)."""
    steps_per_update: int = 200
    """Adam steps (``ngram``) or at most this many L-BFGS iterations (``probe``) per call of ``update``."""
    l2: float = 1e-4
    """Ridge penalty on the weights (not the bias)."""
    prior_strength: float = 4.0
    """kappa0: pseudo-observations the model's prediction is worth in a prompt's posterior."""
    history_decay: float = 0.9
    """Each update multiplies a prompt's past counts by this (the policy changes; old outcomes fade)."""
    seed: int = 0
    """Unused: the fit is deterministic (kept so that saved configs still load)."""
    kind: str = "ngram"
    """Which predictor (``trace_train.predictors.PREDICTORS``): ``ngram``, ``running_mean`` or ``probe`` (the
    policy's own hidden states; one process only for now)."""
    fit: str = "lazy_adam"
    """``ngram``'s optimiser: ``lazy_adam`` (Adam on the features present in the batch only: the moments
    and weights of absent features are left as they are, as in lazy/sparse Adam) or ``adam`` (dense Adam
    over every bucket, each step; the fit before lazy Adam, ~30x slower at 2^18 buckets)."""
    probe_step: float = 1.0
    """``probe``: eta, the proximal step of each fit (``||theta - theta_previous||^2 / (2 eta)``): smaller
    keeps more of what earlier steps taught."""
    mean_decay: float = 0.9
    """``running_mean``: each update multiplies the (family, depth) sums of past targets by this; ``probe``:
    the same for its running moments of the hidden states."""

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
        from . import PREDICTORS

        PREDICTORS.check(self.kind)
        if self.fit not in FITS:
            raise ValueError(f"`fit` must be one of {', '.join(FITS)}, got {self.fit!r}")
        if not self.probe_step > 0:
            raise ValueError(f"`probe_step` must be positive, got {self.probe_step!r}")
        if not 0 < self.mean_decay <= 1:
            raise ValueError(f"`mean_decay` must lie in (0, 1], got {self.mean_decay!r}")
