"""The success predictor: it learns, it is calibrated, prompt posteriors behave, checkpoints are exact."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from trace_train.predictor import HashedSuccessPredictor, PredictorConfig, prompt_key


@dataclass(frozen=True)
class Hist:
    """The three fields the predictor reads (trace_train.engine.History carries them too)."""

    token_ids: tuple
    depth: int = 0
    messages: tuple = field(default=())


def make(tokens, depth=0, prompt="p"):
    return Hist(tuple(tokens), depth, ({"role": "user", "content": prompt},))


def test_learns_which_histories_succeed_and_is_calibrated():
    rng = np.random.default_rng(0)
    # Histories containing token 7 succeed with probability 0.85, others with 0.15.
    hists, probs = [], []
    for i in range(600):
        toks = rng.integers(10, 200, size=12).tolist()
        good = i % 2 == 0
        if good:
            toks[rng.integers(0, 12)] = 7
        hists.append(make(toks, depth=1, prompt=str(i)))
        probs.append(0.85 if good else 0.15)
    probs = np.array(probs)
    outcomes = (rng.random(len(probs)) < probs).astype(float)
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=4096))
    first = pred.update(hists[:400], outcomes[:400])
    assert first["predictor_brier"] == pytest.approx(0.25, abs=1e-6)  # untrained: 0.5 everywhere
    for _ in range(3):  # a few online steps on the same stream
        pred.update(hists[:400], outcomes[:400])
    p = pred(hists[400:])
    # On held-out histories the predictions separate the two kinds ...
    assert p[probs[400:] == 0.85].mean() > 0.7 and p[probs[400:] == 0.15].mean() < 0.3
    # ... and are calibrated: the mean prediction per kind is within 4 standard errors of the truth
    # (the truth is known; 100 held-out histories per kind).
    for truth in (0.85, 0.15):
        assert abs(p[probs[400:] == truth].mean() - truth) < 4 * np.sqrt(truth * (1 - truth) / 100) + 0.05


def test_prompt_posterior_moves_roots_and_their_prefixes():
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=64, prior_strength=4.0, history_decay=1.0))
    root = make([1, 2, 3], prompt="hard question")
    other = make([1, 2, 3], prompt="another question")
    assert pred([root])[0] == pytest.approx(0.5)
    pred.observe([root], successes=[0], failures=[12])
    v = pred([root, other])
    assert v[0] == pytest.approx(2 / 16)  # Beta(4 * 0.5 + 0, 4 * 0.5 + 12)
    assert v[1] == pytest.approx(0.5)  # a prompt never seen keeps the model's prediction
    assert pred.concentration([root, other]).tolist() == [16.0, 4.0]
    # A prefix of the hard prompt inherits the prompt's correction on the logit scale.
    prefix = Hist((1, 2, 3, 9), 1, ({"role": "user", "content": "hard question"}, {"role": "assistant", "content": "x"}))
    assert pred([prefix])[0] == pytest.approx(2 / 16, abs=1e-6)
    assert prompt_key(prefix) == prompt_key(root) != prompt_key(other)


def test_history_decay():
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=64, history_decay=0.5))
    h = make([5], prompt="q")
    pred.observe([h], [4], [0])
    pred.observe([h], [0], [4])
    assert pred.counts[prompt_key(h)].tolist() == [2.0, 4.0]


def test_state_dict_round_trip_is_exact():
    rng = np.random.default_rng(1)
    hists = [make(rng.integers(0, 50, 6).tolist(), depth=int(d), prompt=str(d)) for d in rng.integers(0, 3, 40)]
    y = rng.random(40)
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=256, steps_per_update=5))
    pred.update(hists, y)
    pred.observe(hists[:5], [1, 0, 2, 0, 1], [0, 1, 0, 3, 1])
    pred(hists)
    clone = HashedSuccessPredictor.from_state_dict(pred.state_dict())
    assert np.array_equal(clone(hists), pred(hists))
    pred.update(hists, y)
    clone.update(hists, y)
    assert np.array_equal(clone.weights, pred.weights)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_buckets=8), r"`n_buckets` must be an integer >= 16, got 8"),
        (dict(ngram=0), r"`ngram` must be 1, 2, 3 or 4, got 0"),
        (dict(learning_rate=0), r"`learning_rate` must be positive, got 0"),
        (dict(steps_per_update=0), r"`steps_per_update` must be a positive integer, got 0"),
        (dict(l2=-1.0), r"`l2` must be >= 0, got -1.0"),
        (dict(prior_strength=0.0), r"`prior_strength` must be positive, got 0.0"),
        (dict(history_decay=1.5), r"`history_decay` must lie in \(0, 1\], got 1.5"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PredictorConfig(**kwargs)


def test_update_and_observe_errors():
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=64))
    h = [make([1])]
    with pytest.raises(ValueError, match=r"`targets` must lie in \[0, 1\]"):
        pred.update(h, [1.5])
    with pytest.raises(ValueError, match=r"`targets` and `weights` must have one entry per history"):
        pred.update(h, [0.5, 0.5])
    with pytest.raises(ValueError, match=r"`weights` must be finite, non-negative and not all zero"):
        pred.update(h, [0.5], [0.0])
    with pytest.raises(ValueError, match=r"`successes` and `failures` must be non-negative"):
        pred.observe(h, [-1], [0])
