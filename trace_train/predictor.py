"""The success predictor V~(history) (PAPER.md, "Predictor"): kept for its imports; the kinds live in
``trace_train.predictors`` (``predictor.kind``: ``ngram``, ``running_mean``)."""

from .predictors import (PREDICTORS, HashedSuccessPredictor, HistoryLike, PosteriorPredictor, PredictorConfig,
                         RunningMeanPredictor, build_predictor, family_of, predictor_from_state_dict, prompt_key)

__all__ = ["PREDICTORS", "PredictorConfig", "HashedSuccessPredictor", "RunningMeanPredictor", "PosteriorPredictor",
           "HistoryLike", "build_predictor", "predictor_from_state_dict", "prompt_key", "family_of"]
