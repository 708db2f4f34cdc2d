"""The success predictor: it learns, it is calibrated, prompt posteriors behave, checkpoints are exact."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from trace_train.predictors import (PREDICTORS, HashedSuccessPredictor, PredictorConfig, RunningMeanPredictor,
                                   build_predictor, family_of, predictor_from_state_dict, prompt_key)


@dataclass(frozen=True)
class Hist:
    """The three fields the predictor reads (trace_train.rollout.engine.History carries them too)."""

    token_ids: tuple
    depth: int = 0
    messages: tuple = field(default=())
    row: dict = field(default_factory=dict)


def make(tokens, depth=0, prompt="p", row=None):
    return Hist(tuple(tokens), depth, ({"role": "user", "content": prompt},), row or {})


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
        (dict(kind="mlp"), r"unknown predictor kind 'mlp'; known: ngram, probe, prompt_mean, running_mean"),
        (dict(fit="sgd"), r"`fit` must be one of lazy_adam, adam, got 'sgd'"),
        (dict(mean_decay=0.0), r"`mean_decay` must lie in \(0, 1\], got 0.0"),
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


def _stream(seed, n=60, vocab=400):
    rng = np.random.default_rng(seed)
    hists = [make(rng.integers(0, vocab, 10).tolist(), depth=int(rng.integers(0, 3)), prompt=str(i % 7),
                  row={"target": int(i), "high": int(2 + 60 * (i % 2)), "max_guesses": 3}) for i in range(n)]
    return hists, rng.random(n), rng.random(n) + 0.1


def test_lazy_adam_moves_only_the_features_present_and_matches_dense_adam_on_them():
    """Lazy Adam is dense Adam restricted to the batch's features: on a fresh predictor (every absent
    feature has zero weight and moments, so dense Adam leaves it at zero too) the two fits agree; after
    that, lazy Adam leaves the weights and moments of absent features exactly as they were."""
    cfg = dict(n_buckets=1024, steps_per_update=30)
    lazy, dense = (HashedSuccessPredictor(PredictorConfig(fit=fit, **cfg)) for fit in ("lazy_adam", "adam"))
    hists, y, w = _stream(0)
    lazy.update(hists, y, w)
    dense.update(hists, y, w)
    np.testing.assert_allclose(lazy.weights, dense.weights, rtol=0, atol=1e-12)
    assert lazy.bias == pytest.approx(dense.bias, abs=1e-12)
    other, y2, w2 = _stream(1, vocab=30)  # token ids 0..29 only: most buckets are absent
    absent = np.setdiff1d(np.arange(lazy._dim), lazy.features(other).indices)
    before_w, before_m = lazy.weights[absent].copy(), lazy._adam_m[absent].copy()
    lazy.update(other, y2, w2)
    dense.update(other, y2, w2)
    assert np.array_equal(lazy.weights[absent], before_w) and np.array_equal(lazy._adam_m[absent], before_m)
    assert not np.array_equal(dense.weights[absent], before_w)  # dense Adam keeps moving them (momentum, L2)


@pytest.mark.parametrize("ngram", [1, 2, 3])
def test_one_history_at_a_time_predicts_what_the_sparse_product_does_to_the_last_bit(ngram):
    """A turn boundary's prediction (one history, no sparse matrix) equals the batch path's X @ w, bit
    for bit, so a decision does not depend on how the predictions were grouped."""
    rng = np.random.default_rng(ngram)
    pred = HashedSuccessPredictor(PredictorConfig(ngram=ngram, n_buckets=64 if ngram == 3 else 2**18))
    pred.weights, pred.bias = rng.normal(size=pred.weights.size), 0.3
    histories = [make(rng.integers(0, 300, int(rng.integers(1, 300))).tolist(), depth=int(rng.integers(0, 20)))
                 for _ in range(60)]
    batch = pred._probability(pred.features(histories))
    assert (np.concatenate([pred.model_probability([h]) for h in histories]) == batch).all()
    assert (pred.model_probability(histories) == batch).all()



@pytest.mark.parametrize("ngram", [1, 2, 3])
def test_a_history_that_extends_a_known_opening_hashes_its_new_grams_only_with_the_same_result(ngram, monkeypatch):
    """Turn boundaries extend their prompt's opening: their rows come from the opening's kept gram counts plus
    the grams that end after it, bit for bit the rows of hashing them whole (the sparse product's); a history
    whose tokens do not start with the kept opening (same prompt key) is hashed whole."""
    import trace_train.predictors.ngram as ngram_module

    rng = np.random.default_rng(10 + ngram)
    pred = HashedSuccessPredictor(PredictorConfig(ngram=ngram, n_buckets=64 if ngram == 3 else 2**18))
    pred.weights, pred.bias = rng.normal(size=pred.weights.size), -0.2
    openings = [make(rng.integers(0, 300, int(rng.integers(1, 200))).tolist(), prompt=f"q{i}") for i in range(6)]
    later, expected = [], []  # and the tokens each one's hashing should see
    for i, o in enumerate(openings):
        for depth in (1, 2, 5):
            tail = rng.integers(0, 300, int(rng.integers(1, 40))).tolist()
            later.append(make(list(o.token_ids) + tail, depth=depth, prompt=f"q{i}"))
            expected.append(len(tail) + min(ngram - 1, len(o.token_ids)))  # its grams that end after the opening
        later.append(make(rng.integers(0, 300, 50).tolist(), depth=1, prompt=f"q{i}"))  # not an extension
        expected.append(50)
    hashed = []  # tokens handed to the hashing, per history
    counts = ngram_module.batch_gram_counts
    monkeypatch.setattr(ngram_module, "batch_gram_counts",
                        lambda tokens, lengths, **kw: hashed.extend(np.asarray(lengths).tolist()) or counts(tokens, lengths, **kw))
    pred.model_probability(openings)
    assert hashed == [len(o.token_ids) for o in openings] and len(pred._openings) == len(openings)
    hashed.clear()
    cached = pred.model_probability(later)
    assert hashed == expected
    assert (cached == pred._probability(pred.features(later))).all()
    fresh = HashedSuccessPredictor(pred.config)
    fresh.weights, fresh.bias = pred.weights, pred.bias
    assert (fresh.model_probability(later) == cached).all()  # nothing kept: every history hashed whole

def test_dense_adam_is_the_fit_of_before():
    """``fit: adam`` reproduces the pre-lazy update formula step by step (a transcription of it)."""
    from scipy.special import expit

    hists, y, w = _stream(2)
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=256, steps_per_update=7, fit="adam"))
    pred.update(hists, y, w)
    X, wn = pred.features(hists), w / w.sum()
    weights, bias, m, v = np.zeros(pred._dim), 0.0, np.zeros(pred._dim + 1), np.zeros(pred._dim + 1)
    for t in range(1, 8):
        p = expit(X @ weights + bias)
        r = wn * 2.0 * (p - y) * p * (1.0 - p)
        grad = np.append(X.T @ r + 2.0 * 1e-4 * weights, r.sum())
        m, v = 0.9 * m + 0.1 * grad, 0.999 * v + 0.001 * grad * grad
        step = 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        weights, bias = weights - step[:-1], bias - step[-1]
    np.testing.assert_allclose(pred.weights, weights, rtol=0, atol=1e-12)
    assert pred.bias == pytest.approx(bias, abs=1e-12)


def test_family_of_a_row():
    assert family_of(make([1], row={"target": 3, "low": 1, "high": 6, "max_guesses": 3})) == "high=6,low=1,max_guesses=3"
    assert family_of(make([1], row={"family": "algebra", "answer": "4"})) == "algebra"
    assert family_of(make([1], row={"question": "what?", "answer": "4"})) == ""  # one family: the global mean
    assert family_of(Hist((1,), 0, ())) == ""  # a history without a row


def test_running_mean_is_the_shrunk_decayed_mean_per_family_and_depth():
    pred = build_predictor(PredictorConfig(kind="running_mean", prior_strength=2.0, mean_decay=0.5))
    easy = [make([1], depth=0, prompt=str(i), row={"high": 2}) for i in range(3)]
    hard = [make([1], depth=0, prompt="h", row={"high": 64})]
    assert pred.model_probability(easy[:1]).tolist() == [0.5]
    pred.update(easy + hard, [1.0, 1.0, 0.5, 0.0])  # weights 1 each: S_easy = 2.5 of W = 3; global 2.5 / 4
    g = (2.5 + 0.5) / (4 + 1)
    assert pred.model_probability(easy[:1])[0] == pytest.approx((2.5 + 2 * g) / (3 + 2))
    assert pred.model_probability(hard)[0] == pytest.approx((0.0 + 2 * g) / (1 + 2))
    deeper = make([1], depth=1, prompt="x", row={"high": 2})
    assert pred.model_probability([deeper])[0] == pytest.approx(g)  # another depth: only the global mean
    pred.update(hard, [1.0])  # decay 0.5 first: S_hard = 0 * 0.5 + 1, W_hard = 0.5 + 1; global (1.25 + 1) / (2 + 1)
    g = (2.25 + 0.5) / (3 + 1)
    assert pred.model_probability(hard)[0] == pytest.approx((1.0 + 2 * g) / (1.5 + 2))
    pred.observe(hard, [0], [6])  # the prompt posterior sits on top, as for every kind
    p = pred.model_probability(hard)[0]
    assert pred(hard)[0] == pytest.approx(2 * p / 8)
    assert pred.concentration(hard).tolist() == [8.0]


def _toy_states(sequences):
    """A deterministic stand-in for the policy's states (kinds that read them): token statistics."""
    return np.array([[len(s), np.mean(s), np.std(s), s[-1] % 7] for s in sequences], dtype=float)


def _with_states(pred):
    if pred.needs_states:
        pred.attach(_toy_states)
    return pred


@pytest.mark.parametrize("kind", sorted(PREDICTORS))
def test_every_kind_round_trips_exactly_and_fits_deterministically(kind):
    hists, y, w = _stream(3)
    config = PredictorConfig(kind=kind, n_buckets=512, steps_per_update=5)
    a, b = _with_states(build_predictor(config)), _with_states(build_predictor(config))
    for pred in (a, b):  # two ranks given the same data hold the same predictor
        pred.update(hists, y, w)
        pred.observe(hists[:4], [1, 0, 2, 1], [0, 2, 1, 1])
        pred(hists)
    assert np.array_equal(a(hists), b(hists))
    clone = _with_states(predictor_from_state_dict(a.state_dict()))
    assert type(clone) is type(a) and np.array_equal(clone(hists), a(hists))
    assert np.array_equal(clone.concentration(hists), a.concentration(hists))
    a.update(hists[::-1], y, w)
    clone.update(hists[::-1], y, w)
    assert np.array_equal(clone(hists), a(hists))


def test_a_state_saved_before_kinds_loads_as_ngram():
    pred = HashedSuccessPredictor(PredictorConfig(n_buckets=64))
    state = pred.state_dict()
    state["config"] = {k: v for k, v in state["config"].items() if k not in ("kind", "fit", "mean_decay")}
    assert isinstance(predictor_from_state_dict(state), HashedSuccessPredictor)
    with pytest.raises(ValueError, match=r"a RunningMeanPredictor needs `kind: running_mean`, got 'ngram'"):
        RunningMeanPredictor(PredictorConfig())


def test_the_configs_name_exactly_the_registered_kinds_and_the_base_declares_capabilities():
    """``configs.PREDICTOR_KINDS`` is the one list a config is checked against; the registry holds the same
    kinds, each a ``PosteriorPredictor`` whose capabilities (``needs_states``) the base class declares."""
    from trace_train.configs import PREDICTOR_KINDS
    from trace_train.predictors import PosteriorPredictor

    assert sorted(PREDICTORS) == sorted(PREDICTOR_KINDS)
    assert "needs_states" in vars(PosteriorPredictor) and PosteriorPredictor.needs_states is False
    for kind in PREDICTORS:
        cls = PREDICTORS[kind]
        assert issubclass(cls, PosteriorPredictor) and cls.kind == kind and isinstance(cls.needs_states, bool)
    assert [k for k in PREDICTORS if PREDICTORS[k].needs_states] == ["probe"]
