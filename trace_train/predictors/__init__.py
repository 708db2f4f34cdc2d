"""Success predictors V~(history), interchangeable by ``predictor.kind`` (PAPER.md, "Predictor").

Every kind is a :class:`~trace_train.predictors.base.PosteriorPredictor`: a *model* p(history) fitted
online each step on the recursive targets of ``trace_theory.node_targets``, under a per-prompt Beta
posterior (kappa0 = ``prior_strength`` pseudo-observations of p plus the prompt's decayed outcomes), so
that every kind answers ``predict(histories) -> v`` (``__call__``), ``concentration(histories)`` (the
Beta strength the ``trace_beta`` policy reads), ``update``, ``observe`` and an exact
``state_dict``/:func:`predictor_from_state_dict` round trip. Fits are deterministic functions of the
data, so ranks given the same data hold the same predictor.

==============  ===========================================================================================
``ngram``       logistic model on signed hashed token n-grams + a depth one-hot (:mod:`.ngram`)
``running_mean``  decayed running mean of the targets per (task family, depth): the floor to beat (:mod:`.running_mean`)
``probe``       logistic model on the policy's own last-layer hidden state at the history's end (:mod:`.probe`)
``prompt_mean``  each prompt's (s + 1) / (n + 2) at all its nodes: a uniform prior, nothing learned (:mod:`.prompt_mean`)
==============  ===========================================================================================
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from ..configs import PREDICTOR_KINDS, PredictorConfig
from .base import PREDICTORS, HistoryLike, PosteriorPredictor, family_of, prompt_key
from .ngram import HashedSuccessPredictor
from .probe import HiddenStateProbe
from .prompt_mean import PromptMeanPredictor
from .running_mean import RunningMeanPredictor

for _module in PREDICTOR_KINDS.values():  # each kind's module registers it; a new kind is one module + its name
    importlib.import_module(f"{__name__}.{_module}")
if sorted(PREDICTORS) != sorted(PREDICTOR_KINDS):  # the one check of the configs' names against the registry
    raise ImportError(f"predictor kinds registered {sorted(PREDICTORS)} differ from configs.PREDICTOR_KINDS "
                      f"{sorted(PREDICTOR_KINDS)}")

__all__ = ["PREDICTORS", "PredictorConfig", "PosteriorPredictor", "HashedSuccessPredictor", "RunningMeanPredictor",
           "HiddenStateProbe", "PromptMeanPredictor", "HistoryLike", "build_predictor", "predictor_from_state_dict", "prompt_key", "family_of"]


def build_predictor(config: PredictorConfig = PredictorConfig()) -> PosteriorPredictor:
    """A fresh predictor of ``config.kind``."""
    return PREDICTORS[config.kind](config)


def predictor_from_state_dict(state: Mapping[str, Any]) -> PosteriorPredictor:
    """The predictor a ``state_dict`` came from (a state without ``kind``, saved before kinds, is ``ngram``)."""
    return PREDICTORS[state["config"].get("kind", "ngram")].from_state_dict(state)
