"""The online predictor benchmark's pieces: its AUC is the Mann-Whitney probability; kinds parse."""

import numpy as np
import pytest

from trace_train.bench.predictor import auc, parse_kind
from trace_train.predictors import HashedSuccessPredictor, RunningMeanPredictor


def test_auc_is_the_probability_a_success_outranks_a_failure_ties_half():
    rng = np.random.default_rng(0)
    pred = rng.integers(0, 5, 200) / 4.0  # many ties
    label = rng.random(200) < 0.3 + 0.4 * pred
    pos, neg = pred[label], pred[~label]
    brute = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :]))
    assert auc(pred, label) == pytest.approx(brute, abs=1e-12)
    assert auc([0.1, 0.9], [0, 1]) == 1.0 and np.isnan(auc([0.5], [1]))


def test_kinds_parse_with_overrides():
    dense = parse_kind("ngram_adam200")
    assert isinstance(dense, HashedSuccessPredictor) and dense.config.fit == "adam"
    assert parse_kind("ngram:n_buckets=1024,steps_per_update=50").config.n_buckets == 1024
    assert isinstance(parse_kind("running_mean"), RunningMeanPredictor)
