"""``predictor.kind=prompt_mean``: the uniform-prior control, (s + 1) / (n + 2) per prompt at every node."""

import numpy as np
import pytest

from trace_train.configs import PredictorConfig
from trace_train.predictors import PromptMeanPredictor, build_predictor, predictor_from_state_dict

from .test_predictor import make


def _prompt_mean(**config):
    return build_predictor(PredictorConfig(kind="prompt_mean", **config))


def test_roots_get_the_uniform_prior_posterior_mean_of_their_own_outcomes():
    pred = _prompt_mean(history_decay=1.0, prior_strength=7.0)  # the uniform prior ignores prior_strength
    a, b, new = make([1], prompt="a"), make([1], prompt="b"), make([1], prompt="never seen")
    pred.observe([a, b], [3, 0], [1, 5])
    assert pred([a, b, new]).tolist() == pytest.approx([(3 + 1) / (4 + 2), (0 + 1) / (5 + 2), 0.5])
    assert pred.concentration([a, b, new]).tolist() == [6.0, 7.0, 2.0]
    pred.observe([a], [1], [1])  # counts add up: 4 of 6
    assert pred([a])[0] == pytest.approx(5 / 8)


def test_decayed_counts_as_every_kind_keeps_them():
    pred = _prompt_mean(history_decay=0.5)
    a = make([1], prompt="a")
    pred.observe([a], [2], [0])
    pred.observe([a], [0], [2])  # the first observation halves: s = 1, f = 2
    assert pred([a])[0] == pytest.approx((1 + 1) / (3 + 2))


def test_every_prefix_gets_its_prompts_mean_whatever_its_transcript():
    pred = _prompt_mean(history_decay=1.0)
    root = make([1], prompt="a")
    pred.observe([root], [1], [3])
    deep = [make([5, 6, 7], depth=1, prompt="a"), make([9] * 40, depth=3, prompt="a")]
    other = make([5, 6, 7], depth=2, prompt="b")
    assert pred(deep + [other]).tolist() == pytest.approx([2 / 6, 2 / 6, 0.5])  # no root prediction needed first
    assert pred.concentration(deep).tolist() == [2.0, 2.0]


def test_nothing_is_learned_from_the_transcript_or_shared_across_prompts():
    pred = _prompt_mean()
    hists = [make([i, i + 1], depth=d, prompt=str(i)) for i in range(6) for d in (0, 1)]
    before = pred(hists)
    metrics = pred.update(hists, np.linspace(0, 1, len(hists)))
    assert np.array_equal(pred(hists), before) and metrics["predictor_examples"] == len(hists)
    pred.observe([hists[0]], [5], [0])
    after = pred(hists)
    assert after[0] == after[1] == pytest.approx(6 / 7) and np.array_equal(after[2:], before[2:])


def test_a_checkpoint_round_trips_exactly():
    pred = _prompt_mean(history_decay=0.8)
    hists = [make([i], depth=i % 2, prompt=str(i // 2)) for i in range(8)]
    pred.observe(hists[::2], [1, 0, 2, 3], [1, 2, 0, 1])
    clone = predictor_from_state_dict(pred.state_dict())
    assert isinstance(clone, PromptMeanPredictor) and clone.config == pred.config
    assert np.array_equal(clone(hists), pred(hists))
    assert np.array_equal(clone.concentration(hists), pred.concentration(hists))
    pred.observe(hists[:2], [1, 1], [0, 0])
    clone.observe(hists[:2], [1, 1], [0, 0])
    assert np.array_equal(clone(hists), pred(hists)) and clone.digest() == pred.digest()
