"""``predictor.kind=probe``: a logistic probe on the policy's own hidden states (trace_train.predictors.probe)."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from trace_train.bench.predictor import auc
from trace_train.config_loader import load_config
from trace_train.predictors import HiddenStateProbe, PredictorConfig, build_predictor, predictor_from_state_dict
from trace_train.predictors.hidden_states import PolicyStates, hosts
from trace_train.run.checkpoint import latest_checkpoint, load_checkpoint
from trace_train.train import TrainConfig, main


@dataclass
class H:
    depth: int
    token_ids: tuple
    messages: tuple = field(default_factory=tuple)


def test_hosts_are_the_sequences_no_other_extends_and_cover_every_prefix():
    rng = np.random.default_rng(0)
    seqs = [tuple(rng.integers(0, 3, rng.integers(1, 6))) for _ in range(200)]
    forwarded, host_of = hosts(seqs)
    maximal = {i for i, s in enumerate(seqs) if not any(len(t) > len(s) and t[: len(s)] == s for t in seqs)}
    assert {seqs[i] for i in forwarded} == {seqs[i] for i in maximal}
    assert len(forwarded) == len({seqs[i] for i in forwarded})  # each host forwarded once
    for i, s in enumerate(seqs):
        host = seqs[forwarded[host_of[i]]]
        assert host[: len(s)] == s


def test_states_read_from_a_longer_forward_equal_the_sequence_forwarded_alone(tiny_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    rng = np.random.default_rng(1)
    rollout = rng.integers(5, 200, 40).tolist()
    other = rng.integers(5, 200, 17).tolist()
    sequences = [rollout[:10], rollout[:25], rollout, other, rollout[:25], other[:3]]
    states = PolicyStates(model, max_batch_tokens=50)(sequences)  # small batches: several forwards
    assert states.shape == (6, model.config.hidden_size) and states.dtype == np.float32
    base = model.model
    with torch.no_grad():
        for s, got in zip(sequences, states):
            alone = base(input_ids=torch.tensor([s])).last_hidden_state[0, -1].numpy()
            np.testing.assert_allclose(got, alone, rtol=1e-4, atol=1e-5)
    assert not model.training  # from_pretrained's eval mode, restored
    model.train()
    PolicyStates(model)(sequences[:1])
    assert model.training


def _signal(rng, n, direction):
    """Histories whose success probability is sigmoid(3 h . direction); h is what the fake encoder returns."""
    h = rng.normal(size=(n, direction.size))
    p = 1 / (1 + np.exp(-3 * h @ direction))
    ids = [tuple(rng.integers(0, 10**6, 4)) for _ in range(n)]
    return ids, h, p


def test_the_probe_learns_what_the_states_say_and_beats_a_constant():
    rng = np.random.default_rng(0)
    direction = rng.normal(size=8) / np.sqrt(8)
    probe = build_predictor(PredictorConfig(kind="probe"))
    table = {}
    probe.attach(lambda seqs: np.stack([table[tuple(s)] for s in seqs]))
    for _ in range(5):  # online: fit on a batch, then the next batch is new data
        ids, h, p = _signal(rng, 400, direction)
        table.update(zip(ids, h))
        y = (rng.random(400) < p).astype(float)
        probe.update([H(0, i) for i in ids], y)
    ids, h, p = _signal(rng, 2000, direction)
    table.update(zip(ids, h))
    y = rng.random(2000) < p
    pred = probe.model_probability([H(1, i) for i in ids])
    assert auc(pred, y) > 0.8
    assert np.mean((pred - y) ** 2) < 0.8 * y.var()
    # a probe that ignored the states could not rank: the same histories with shuffled states do not
    table.update(zip(ids, rng.permutation(h)))
    probe.attach(lambda seqs: np.stack([table[tuple(s)] for s in seqs]))
    assert abs(auc(probe.model_probability([H(1, i) for i in ids]), y) - 0.5) < 0.05


def test_states_are_cached_until_the_update_and_reported():
    calls = []

    def encoder(seqs):
        calls.append(len(seqs))
        return np.ones((len(seqs), 3)) * np.array([len(s) for s in seqs])[:, None]

    probe = HiddenStateProbe(PredictorConfig(kind="probe"))
    probe.attach(encoder)
    hs = [H(0, (1, 2)), H(1, (1, 2, 3))]
    probe(hs)
    probe.prepare(hs + [H(2, (1, 2, 3, 4))])
    assert calls == [2, 1]  # the cached two are not recomputed
    metrics = probe.update(hs + [H(2, (1, 2, 3, 4))], [1.0, 0.0, 1.0])
    assert metrics["predictor_state_seconds"] >= 0 and calls == [2, 1]
    probe(hs)
    assert calls == [2, 1, 2]  # after the update (the policy moved) they are computed again


def test_round_trip_is_exact_and_an_unattached_probe_says_what_it_needs():
    rng = np.random.default_rng(2)
    table = {}
    enc = lambda seqs: np.stack([table[tuple(s)] for s in seqs])  # noqa: E731
    probe = build_predictor(PredictorConfig(kind="probe"))
    probe.attach(enc)
    ids, h, p = _signal(rng, 100, np.ones(4) / 2)
    table.update(zip(ids, h))
    hs = [H(0, i) for i in ids]
    probe.update(hs, (rng.random(100) < p).astype(float))
    again = predictor_from_state_dict(probe.state_dict())
    with pytest.raises(RuntimeError, match="no encoder is attached"):
        again(hs)
    again.attach(enc)
    np.testing.assert_array_equal(again(hs), probe(hs))
    assert again.state_dict().keys() == probe.state_dict().keys()


@pytest.mark.slow
def test_a_run_with_the_probe_fits_on_the_policys_states_and_resumes(tmp_path):
    small = [f"run_dir={tmp_path}", "device=cpu", "tensorboard=false", "checkpoint_every=1", "eval.every=0",
             "rollout.pool_size=4", "rollout.roots=8", "model.tiny_warm_steps=20", "predictor.kind=probe"]
    metrics = main(load_config(TrainConfig, "cpu_demo", ["steps=1", *small]))
    assert metrics["predictor_examples"] > 0 and metrics["predictor_state_seconds"] > 0
    state = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False).extra["predictor"]
    assert state["config"]["kind"] == "probe" and state["weights"].size > 0
    resumed = main(load_config(TrainConfig, "cpu_demo", ["steps=2", *small]))  # resumes at step 1
    assert np.isfinite(resumed["predictor_brier"])
