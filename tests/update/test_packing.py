"""Tree packing against the per-leaf reference: the mask, the log-probabilities, the loss and the gradients.

Random trees (depths, branching, token counts, empty turns, padding, budgets that force splits) with
random payloads go through both layouts and a real (randomly initialised) Qwen3; every advantage
estimator, both shared-turn weights and every aggregation must give the same update. Then the same on
real rollouts of the warm-started tiny model, and the trainer's first step end to end.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.theory.strategies import forests
from tests.update.test_sequences import tree_batch  # noqa: F401  (real rollouts of the tiny model, with branches)
from trace_theory import ADVANTAGES, RolloutForest, compute_advantages
from trace_train.rollout.batch import NodePayload, RolloutBatch
from trace_train.run.distributed import DistInfo
from trace_train.update.loss import PolicyLossConfig, policy_loss
from trace_train.update.packing import build_training_batch, pack_trees, tree_logprobs
from trace_train.update.sequences import build_sequences, path_tokens
from trace_train.configs import AlgorithmConfig, OptimConfig, TrainConfig
from trace_train.train import _policy_update

VOCAB = 40
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


@pytest.fixture(scope="module")
def models():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        out.append(Qwen3ForCausalLM(config).eval())
    return out  # policy, reference


def with_payloads(forest, rng) -> RolloutBatch:
    """Random turns on ``forest``: prompts of 1-6 tokens, actions of 0-4, observations of 0-4 (none on
    leaves), random token ids and behaviour log-probabilities."""
    nodes = []
    for n in range(len(forest)):
        root = forest.parent[n] == -1
        n_act = 0 if root else int(rng.integers(0, 5))
        n_obs = int(rng.integers(1, 7)) if root else (0 if forest.is_leaf[n] else int(rng.integers(0, 5)))
        nodes.append(NodePayload(
            action_ids=tuple(rng.integers(2, VOCAB, n_act).tolist()),
            action_logprobs=tuple((-rng.uniform(0.05, 3.0, n_act)).tolist()), action="",
            observation_ids=tuple(rng.integers(2, VOCAB, n_obs).tolist()), observation="", messages=(),
            snapshot=None))
    return RolloutBatch(forest, tuple(nodes), rows={}, predictions=np.full(len(forest), np.nan), report=None)


@st.composite
def rollout_batches(draw, max_nodes=14):
    forest = draw(forests(max_prompts=3, max_nodes=max_nodes))
    return with_payloads(forest, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))


def fixed_batch() -> RolloutBatch:
    """Two trees: one branched twice at different depths, one a single rollout."""
    parent = np.array([-1, -1, 0, 2, 3, 2, 5, 0, 7, 3, 1, 10])
    is_leaf = np.bincount(parent[parent >= 0], minlength=len(parent)) == 0
    reward = np.where(is_leaf, np.arange(len(parent)) % 2, np.nan)
    forest = RolloutForest.from_parents(parent, reward)
    return with_payloads(forest, np.random.default_rng(7))


def longest_path(batch) -> int:
    return max(len(batch.trajectory(int(leaf)).token_ids) for leaf in batch.forest.leaves)


def budgets(batch):
    """From one path (every piece a path: the per-leaf limit) to everything in one micro-batch."""
    total = sum(len(p.token_ids) for p in batch.nodes)
    return st.integers(longest_path(batch), max(longest_path(batch), total) + 8)


def by_token(node: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, offset: np.ndarray, position) -> dict:
    """{(node, index of the token within its node): value} over the masked tokens."""
    out = {}
    for r, i in zip(*np.nonzero(mask.numpy())):
        n = int(node[r, i])
        out[(n, int(position[r, i]) - int(offset[n]))] = float(values[r, i])
    return out


def leaf_nodes(batch, seqs):
    """Node and path position of every token of the per-leaf rows (-1 / 0 on padding)."""
    node = torch.full(seqs.input_ids.shape, -1, dtype=torch.long)
    position = torch.zeros(seqs.input_ids.shape, dtype=torch.long)
    for r, leaf in enumerate(seqs.leaves):
        traj = batch.trajectory(int(leaf))
        node[r, :len(traj.node)] = torch.from_numpy(traj.node)
        position[r, :len(traj.node)] = torch.arange(len(traj.node))
    return node, position


# ---------------------------------------------------------------------------------------------------
# The layout, without a model
# ---------------------------------------------------------------------------------------------------


@given(data=st.data())
def test_every_token_sees_exactly_its_path(data):
    """For every packed token, the tokens it attends to, in order, are its root-to-token path; positions
    count along that path; its predictor is the path's previous token. Trained tokens are the per-leaf
    layout's, once each, with the same advantage, old log-probability, weight and owning leaf."""
    batch = data.draw(rollout_batches())
    budget = data.draw(budgets(batch))
    forest = batch.forest
    adv = np.arange(len(forest), dtype=float)
    packed = pack_trees(batch, adv, pad_token_id=0, token_budget=budget)
    tokens = path_tokens(batch)
    for r in range(len(packed.input_ids)):
        n_real = int(packed.lengths[r])
        for i in range(packed.input_ids.shape[1]):
            seen = [j for j in range(i + 1) if i < int(packed.visible_until[r, j])]
            if i >= n_real:  # padding sees itself only
                assert seen == [i] and packed.loss_mask[r, i] == 0
                continue
            node = int(packed.node[r, i])
            k = int(packed.position_ids[r, i]) - int(tokens.offset[node])
            path = np.asarray(batch.context_ids(node) if node >= 0 else [], dtype=np.int64)
            own_start = int(tokens.offset[node])
            expected = np.concatenate([path[:own_start], tokens.ids[node][:k + 1]])
            assert packed.input_ids[r, seen].tolist() == expected.tolist()
            assert packed.position_ids[r, seen].tolist() == list(range(len(seen)))
            assert int(packed.predictor[r, i]) == (seen[-2] if len(seen) > 1 else -1)
    for micro in packed.micro:
        assert len(micro) * int(packed.lengths[list(micro)].max()) <= budget
        assert 2 * int(packed.lengths[list(micro)].min()) >= int(packed.lengths[list(micro)].max())  # padding < 2x
    leaf = build_sequences(batch, adv, pad_token_id=0)
    ln, lp = leaf_nodes(batch, leaf)
    for field in ("advantages", "old_logprobs", "weights"):
        want = by_token(ln, getattr(leaf, field), leaf.loss_mask, tokens.offset, lp)
        got = by_token(packed.node, getattr(packed, field), packed.loss_mask, tokens.offset, packed.position_ids)
        assert got == pytest.approx(want, abs=0)
    assert int(packed.loss_mask.sum()) == int(leaf.loss_mask.sum())  # each trained token once
    owner = by_token(packed.node, packed.leaves[packed.sequence_ids.clamp_min(0)] + 0.0, packed.loss_mask,
                     tokens.offset, packed.position_ids)
    assert all(forest.factual_leaf[n] == leaf_id for (n, _), leaf_id in owner.items())
    assert packed.unique_tokens == leaf.unique_tokens <= packed.forward_tokens <= leaf.forward_tokens
    if budget >= max(sum(len(batch.nodes[n].token_ids) for n in np.flatnonzero(forest.root_of == root))
                     for root in forest.roots):
        assert packed.forward_tokens == packed.unique_tokens  # no tree was split: every token once


def test_a_path_longer_than_the_budget_is_a_clear_error():
    batch = fixed_batch()
    with pytest.raises(ValueError, match=r"has \d+ tokens, more than the token budget of a micro-batch \(2\): "
                                         r"raise algorithm.pack_tokens"):
        pack_trees(batch, np.zeros(len(batch.forest)), pad_token_id=0, token_budget=2)
    with pytest.raises(ValueError, match=r"`token_budget` must be a positive integer, got 0"):
        pack_trees(batch, np.zeros(len(batch.forest)), pad_token_id=0, token_budget=0)
    with pytest.raises(ValueError, match=r"`packing` must be one of \('tree', 'leaf'\), got 'paths'"):
        build_training_batch(batch, np.zeros(len(batch.forest)), packing="paths", pad_token_id=0)
    with pytest.raises(ValueError, match=r"`packing` must be one of \('tree', 'leaf'\), got 'paths'"):
        AlgorithmConfig(packing="paths")


def test_sequence_ids_aggregate_sequences_spread_over_rows():
    """A sequence split across rows (ids) aggregates like the same tokens in one row each."""
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(2, 6, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 0, 1, 1, 0, 0]], dtype=torch.float64)
    ids = torch.tensor([[0, 0, -1, 1, 1, 2], [2, -1, 0, 1, -1, -1]])
    rows = [[(0, 0), (0, 1), (1, 2)], [(0, 3), (0, 4), (1, 3)], [(0, 5), (1, 0), (1, 1)]]  # ids 0, 1, 2
    one_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.float64)  # (1, 1) is padding
    per_row = lambda t: torch.stack([torch.stack([t[r, i] for r, i in row]) for row in rows])  # noqa: E731
    for how in AGGREGATIONS:
        cfg = PolicyLossConfig(aggregation=how)
        want, _ = policy_loss(per_row(logp), per_row(old), per_row(adv), one_mask, cfg)
        got, _ = policy_loss(logp, old, adv, mask, cfg, sequence_ids=ids)
        assert float(got) == pytest.approx(float(want), rel=1e-12)


# ---------------------------------------------------------------------------------------------------
# With a real model: log-probabilities, loss and gradients equal the per-leaf layout's
# ---------------------------------------------------------------------------------------------------


def update(model, ref, seqs, algorithm: AlgorithmConfig, micro_batch_size: int = 4):
    """The trainer's own update with a zero learning rate: (stats, gradient of every parameter)."""
    cfg = TrainConfig(algorithm=algorithm, optim=OptimConfig(grad_clip=0.0, micro_batch_size=micro_batch_size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = _policy_update(model, optimizer, seqs, cfg, DistInfo(), ref=ref)
    return stats, {k: p.grad.clone() for k, p in model.named_parameters()}


def assert_same_update(leaf, tree):
    (s_leaf, g_leaf), (s_tree, g_tree) = leaf, tree
    # pg_loss is weighted like the loss; kl and clip_fraction are per-token means, weighted the same way,
    # so they agree exactly under token-mean aggregation and only approximately under the others.
    for k in ("loss", "grad_norm", "pg_loss"):
        assert s_tree[k] == pytest.approx(s_leaf[k], rel=2e-5, abs=1e-7), k
    for name, g in g_leaf.items():
        torch.testing.assert_close(g_tree[name], g, rtol=1e-4, atol=1e-6, msg=name)


@settings(max_examples=25)
@given(data=st.data())
def test_packed_update_equals_the_per_leaf_update(models, data):
    policy, ref = models
    batch = data.draw(rollout_batches())
    budget = data.draw(budgets(batch))
    algorithm = AlgorithmConfig(
        advantage=data.draw(st.sampled_from(sorted(ADVANTAGES.names()))),
        shared_turn_weight=data.draw(st.sampled_from(["leaves", "once"])),
        loss=PolicyLossConfig(aggregation=data.draw(st.sampled_from(AGGREGATIONS)),
                              kl_coef=data.draw(st.sampled_from([0.0, 0.1]))),
        pack_tokens=budget)
    adv = compute_advantages(batch.forest, algorithm.advantage)
    old = build_sequences(batch, adv, pad_token_id=0)
    if len(old) == 0:
        return  # nothing generated: nothing to compare
    kw = dict(pad_token_id=0, shared_turn_weight=algorithm.shared_turn_weight, micro_batch_size=3, token_budget=budget)
    leaf = build_training_batch(batch, adv, packing="leaf", **kw)
    tree = build_training_batch(batch, adv, packing="tree", **kw)
    # Per-token log-probabilities, matched by (node, token of the node).
    tokens = path_tokens(batch)
    with torch.no_grad():
        ln, lp = leaf_nodes(batch, leaf)
        want = by_token(ln, leaf.logprobs(policy), leaf.loss_mask, tokens.offset, lp)
        got = by_token(tree.node, tree.logprobs(policy), tree.loss_mask, tokens.offset, tree.position_ids)
    assert got.keys() == want.keys()
    assert np.allclose([got[k] for k in want], list(want.values()), rtol=0, atol=2e-5)
    kl_ref = ref if algorithm.loss.kl_coef > 0 else None
    assert_same_update(update(policy, kl_ref, leaf, algorithm, 3), update(policy, kl_ref, tree, algorithm, 3))


def test_eager_and_sdpa_masks_agree(models):
    """The 4-D mask is boolean for sdpa and additive for eager; both give the per-leaf log-probabilities."""
    policy, _ = models
    batch = fixed_batch()
    adv = np.ones(len(batch.forest))
    tree = pack_trees(batch, adv, pad_token_id=0)
    with torch.no_grad():
        sdpa = tree.logprobs(policy)
        policy.set_attn_implementation("eager")
        try:
            eager = tree.logprobs(policy)
        finally:
            policy.set_attn_implementation("sdpa")
    torch.testing.assert_close(eager, sdpa, rtol=0, atol=2e-5)


def test_the_reference_forward_reuses_the_policys_plan(models, monkeypatch):
    """With a KL term each micro-batch goes through the policy, then the reference: its block plan (the
    keys per query block and their masks) is built once, by the policy's forward, not once per model."""
    from trace_train.update import packing

    policy, ref = models
    batch = fixed_batch()
    tree = pack_trees(batch, np.linspace(-1.0, 1.0, len(batch.forest)), pad_token_id=0,
                      token_budget=longest_path(batch))
    assert len(tree.micro) > 1
    built = []
    real = packing.block_plan
    monkeypatch.setattr(packing, "block_plan", lambda until, *a: built.append(until.shape) or real(until, *a))
    stats, _ = update(policy, ref, tree, AlgorithmConfig(loss=PolicyLossConfig(kl_coef=0.1)))
    assert len(built) == len(tree.micro)
    assert stats["kl"] > 0  # the reference (another model) was read
    built.clear()
    with torch.no_grad():
        tree.logprobs(policy), tree.logprobs(ref)  # no layouts dict: each call builds its own
    assert len(built) == 2


@pytest.mark.slow
def test_flex_attention_block_mask_gives_the_same_logprobs(models):
    """FlexAttention (the GPU path) with the same mask function, run forward-only on CPU (PyTorch 2.13
    has no FlexAttention backward on CPU): the same log-probabilities as the dense mask."""
    policy, _ = models
    batch = fixed_batch()
    tree = pack_trees(batch, np.ones(len(batch.forest)), pad_token_id=0)
    with torch.no_grad():
        dense = tree_logprobs(policy, tree.input_ids, tree.position_ids, tree.visible_until, tree.predictor,
                              attention="dense")
        flex = tree_logprobs(policy, tree.input_ids, tree.position_ids, tree.visible_until, tree.predictor,
                             attention="flex")
    assert policy.config._attn_implementation == "sdpa"  # restored
    torch.testing.assert_close(flex, dense, rtol=0, atol=2e-5)


# ---------------------------------------------------------------------------------------------------
# Real rollouts of the tiny model, and the trainer
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_turn_weight", ["leaves", "once"])
def test_real_rollouts_of_the_tiny_qwen3(tree_batch, shared_turn_weight):
    """Warm-started tiny Qwen3, real guess-the-number trees with branches: same update, fewer tokens."""
    from transformers import AutoModelForCausalLM

    backend, batch = tree_batch
    f = batch.forest
    assert (f.n_children[f.parent != -1] > 1).any(), "the batch must contain branched prefixes"
    policy = backend.model
    ref = AutoModelForCausalLM.from_pretrained(backend.model.name_or_path).eval()
    algorithm = AlgorithmConfig(shared_turn_weight=shared_turn_weight, loss=PolicyLossConfig(kl_coef=0.05))
    adv = compute_advantages(f, "trace")
    kw = dict(pad_token_id=backend.pad_id, shared_turn_weight=shared_turn_weight, micro_batch_size=16)
    leaf = build_training_batch(batch, adv, packing="leaf", **kw)
    tree = build_training_batch(batch, adv, packing="tree", token_budget=4096, **kw)
    small = build_training_batch(batch, adv, packing="tree", token_budget=longest_path(batch), **kw)
    assert tree.forward_tokens == tree.unique_tokens < leaf.forward_tokens
    assert tree.unique_tokens < small.forward_tokens <= leaf.forward_tokens  # split trees repeat context
    reference = update(policy, ref, leaf, algorithm, 16)
    assert reference[0]["train_forward_tokens"] == leaf.forward_tokens
    assert_same_update(reference, update(policy, ref, tree, algorithm))
    assert_same_update(reference, update(policy, ref, small, algorithm))


def test_first_training_step_is_the_same_with_leaf_and_tree_packing(tmp_path):
    """``trace-train --config cpu_demo algorithm.packing=tree``: the first step's loss and gradient norm
    equal ``leaf``'s, while the update forwards each tree token once."""
    from tests.train.test_trainer import small_config
    from trace_train.train import main

    runs = {p: main(small_config(tmp_path / p, "steps=1", f"algorithm.packing={p}")) for p in ("leaf", "tree")}
    leaf, tree = runs["leaf"], runs["tree"]
    # At the first step the ratio is 1 and group-relative advantages cancel, so the loss can be 0 up to
    # float32 rounding (about 1e-9 here) while the gradient is not: compare the loss absolutely.
    assert tree["loss"] == pytest.approx(leaf["loss"], rel=1e-5, abs=1e-7)
    assert leaf["grad_norm"] > 1e-3  # a batch that teaches something, so the next line tests the update
    assert tree["grad_norm"] == pytest.approx(leaf["grad_norm"], rel=1e-5)
    assert tree["train_unique_tokens"] == leaf["train_unique_tokens"] == tree["train_forward_tokens"]
    assert leaf["train_forward_tokens"] > tree["train_forward_tokens"]
    assert AlgorithmConfig().packing == "tree"  # the default


def test_a_row_under_half_the_longest_starts_its_own_micro_batch():
    """Padding costs the layers' per-position work whatever the mask: a 30-token row is not padded to 100."""
    from trace_train.update.packing import _micro_batches

    assert _micro_batches([30, 100, 90, 50], budget=10_000) == ((1, 2, 3), (0,))
    assert _micro_batches([100, 90], budget=150) == ((0,), (1,))  # the token budget still binds
