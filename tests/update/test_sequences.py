"""Training sequences from real rollout trees: every generated token trained once, documented weights."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from trace_theory import compute_advantages
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.envs import EpisodeLimits, GuessNumberEnv, make_rows
from trace_train.update.loss import policy_loss
from trace_train.update.sequences import build_sequences, micro_batch_bounds


@pytest.fixture(scope="module")
def tree_batch(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    cfg = RolloutConfig(policy="uniform_tree", roots=8, continuations_per_root=2, group_size=4,
                        limits=EpisodeLimits(max_turns=3, max_turn_tokens=8, max_context_tokens=1024), seed=3)
    batch = RolloutEngine(backend, GuessNumberEnv, cfg).rollout(make_rows(4, high=6, max_guesses=3, seed=1))
    return backend, batch


def test_every_generated_token_is_trained_exactly_once(tree_batch):
    backend, batch = tree_batch
    f = batch.forest
    assert (f.n_children[f.parent != -1] > 1).any(), "the batch must contain branched prefixes"
    adv = compute_advantages(f, "trace")
    seqs = build_sequences(batch, adv, pad_token_id=backend.pad_id, shared_turn_weight="once")
    trained = int(seqs.loss_mask.sum())
    generated = sum(len(batch.nodes[n].action_ids) for n in range(len(f)))
    assert trained == generated
    # Every trained token carries the advantage of the node whose turn produced it.
    for row, leaf in enumerate(seqs.leaves):
        traj = batch.trajectory(int(leaf))
        mask = seqs.loss_mask[row, :len(traj.token_ids)].numpy().astype(bool)
        assert np.allclose(seqs.advantages[row, :len(traj.token_ids)].numpy()[mask], adv[traj.node][mask], atol=1e-6)
        assert set(f.factual_leaf[traj.node[mask]].tolist()) <= {int(leaf)}


def test_leaf_weighting_equals_flat_grpo_on_root_to_leaf_paths(tree_batch):
    """With shared_turn_weight="leaves" the token-mean loss equals the loss of the flattened trajectories
    (every root-to-leaf path a sequence, shared tokens repeated), each token with its turn's advantage."""
    backend, batch = tree_batch
    f = batch.forest
    adv = compute_advantages(f, "grpo")
    g = torch.Generator().manual_seed(0)
    fake_logp = {}  # a fixed "current policy" log-prob per (node, position) so both layouts agree

    def logp_of(node, k):
        if (node, k) not in fake_logp:
            fake_logp[(node, k)] = -float(torch.rand(1, generator=g)) - 0.1
        return fake_logp[(node, k)]

    seqs = build_sequences(batch, adv, pad_token_id=backend.pad_id, shared_turn_weight="leaves")
    ours_logp = torch.zeros_like(seqs.old_logprobs)
    for row, leaf in enumerate(seqs.leaves):
        traj = batch.trajectory(int(leaf))
        for t, node in enumerate(traj.node.tolist()):
            k = t - int(np.flatnonzero(traj.node == node)[0])
            ours_logp[row, t] = logp_of(node, k)
    ours, _ = policy_loss(ours_logp.double(), seqs.old_logprobs.double(), seqs.advantages.double(),
                          seqs.loss_mask.double(), token_weights=seqs.weights.double())
    # Flattened: every leaf's whole path, every action token trained with its node's advantage.
    rows = [batch.trajectory(int(leaf)) for leaf in f.leaves]
    width = max(len(r.token_ids) for r in rows)
    logp, old, a, mask = (torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(4))
    for i, traj in enumerate(rows):
        for t, node in enumerate(traj.node.tolist()):
            k = t - int(np.flatnonzero(traj.node == node)[0])
            logp[i, t] = logp_of(node, k)
        n = len(traj.token_ids)
        old[i, :n] = torch.from_numpy(traj.logprobs)
        a[i, :n] = torch.from_numpy(adv[traj.node])
        mask[i, :n] = torch.from_numpy(traj.loss_mask.astype(np.float64))
    flat, _ = policy_loss(logp, old, a, mask)
    assert float(ours) == pytest.approx(float(flat), rel=1e-6)  # sequences store float32


def test_sequence_errors(tree_batch):
    backend, batch = tree_batch
    with pytest.raises(ValueError, match=r"`advantages` must hold one value per node"):
        build_sequences(batch, np.zeros(3), pad_token_id=0)
    with pytest.raises(ValueError, match=r"`shared_turn_weight` must be one of \('leaves', 'once'\), got 'twice'"):
        build_sequences(batch, np.zeros(len(batch.forest)), pad_token_id=0, shared_turn_weight="twice")
    with pytest.raises(ValueError, match=r"`token_budget` must be a positive integer or None, got 0"):
        build_sequences(batch, np.zeros(len(batch.forest)), pad_token_id=0, token_budget=0)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), max_size=30), max_rows=st.integers(1, 8),
       budget=st.one_of(st.none(), st.integers(1, 200)))
def test_micro_batch_bounds_cover_the_rows_in_order_within_both_bounds(lengths, max_rows, budget):
    bounds = micro_batch_bounds(lengths, max_rows, budget)
    assert [i for a, b in bounds for i in range(a, b)] == list(range(len(lengths)))  # every row once, in order
    for j, (a, b) in enumerate(bounds):
        assert 1 <= b - a <= max_rows
        size = (b - a) * max(lengths[a:b])
        if budget is not None and b - a > 1:
            assert size <= budget
        if j + 1 < len(bounds):  # greedy: the next row would have broken a bound
            grown = (b - a + 1) * max(lengths[a:b + 1])
            assert b - a + 1 > max_rows or (budget is not None and grown > budget)


def test_leaf_micro_batches_keep_to_the_token_budget_and_train_the_same_tokens(tree_batch):
    backend, batch = tree_batch
    adv = compute_advantages(batch.forest, "trace")
    rows_only = build_sequences(batch, adv, pad_token_id=backend.pad_id, micro_batch_size=64)
    longest = int(rows_only.attention_mask.sum(1).max())
    bounded = build_sequences(batch, adv, pad_token_id=backend.pad_id, micro_batch_size=64, token_budget=2 * longest)
    parts = bounded.micro_batches()
    assert len(rows_only.micro_batches()) == 1 and len(parts) >= len(rows_only) // 2 > 1
    assert all(p.input_ids.numel() <= 2 * longest for p in parts)
    assert sum(float(p.weights.sum()) for p in parts) == pytest.approx(float(rows_only.weights.sum()))
    assert torch.equal(torch.cat([torch.as_tensor(p.leaves) for p in parts]),
                       torch.as_tensor(rows_only.leaves))
