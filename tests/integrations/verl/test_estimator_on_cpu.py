"""The ``trace*`` estimators, called as verl's V1 trainer calls them, give ``trace_theory``'s advantages.

Random forests are laid out as verl trajectories (one per leaf, a continuation holding its prefix's tokens
with response mask 0), passed through verl's own ``compute_advantage_for_multi_trajectories`` with the tree
fields in place as the ``trace`` trainer sets them; every token of every turn must carry the advantage of
that turn's node, computed by ``trace_theory.compute_advantages`` on the original forest. The comparison
must fail on a wrong tree and on the tree-less (flat) estimate.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.theory.strategies import forests
from trace_theory import RolloutForest, compute_advantages
from trace_train.integrations.verl.trees import trajectories_from_forest

from .conftest import verl_or_skip


def verl_batch(forest, tokens):
    """The trajectories of ``forest`` as the tensors verl hands an estimator, and each turn's token span."""
    import torch

    fields, rewards, lengths, own = trajectories_from_forest(forest, tokens)
    width = max(lengths)
    mask = torch.zeros(len(fields), width)
    scores = torch.zeros(len(fields), width)
    spans = []
    for b, f in enumerate(fields):
        starts = f["trace_turn_starts"] + [lengths[b]]
        mask[b, starts[0]:lengths[b]] = 1.0  # the prefix of a continuation is not trained again
        scores[b, lengths[b] - 1] = rewards[b]  # verl puts the reward on the last response token
        spans.append([(int(n), starts[j], starts[j + 1]) for j, n in enumerate(own[b])])
    return fields, scores, mask, spans


def verl_advantages(fields, scores, mask, name="trace"):
    """verl's V1 advantage step (the function ``PPOTrainer._compute_advantage`` calls), tree fields set."""
    verl_or_skip()
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from trace_train.integrations.verl.estimator import CURRENT_TRACE_FIELDS

    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": np.array([str(f["trace_tree"]) if f else "pad" for f in fields],
                                                            dtype=object)})
    keys = [f"{f['trace_tree'] if f else 'pad'}_{b}_0" for b, f in enumerate(fields)]
    token = CURRENT_TRACE_FIELDS.set(fields)
    try:
        out = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator=name)
    finally:
        CURRENT_TRACE_FIELDS.reset(token)
    return out.batch["advantages"].numpy(), out.batch["returns"].numpy()


def mismatches(forest, spans, advantages, mask, name="trace"):
    """Tokens whose advantage differs from ``trace_theory``'s for their turn's node (a list; empty: equal)."""
    expected = compute_advantages(forest, name)
    bad = []
    for b, turns in enumerate(spans):
        for node, lo, hi in turns:
            got = advantages[b, lo:hi]
            if not np.allclose(got, expected[node] * mask[b, lo:hi].numpy(), rtol=1e-5, atol=1e-5):
                bad.append((b, node, got.tolist(), float(expected[node])))
    return bad


@pytest.fixture(autouse=True)
def _verl(verl):
    from trace_train.integrations.verl.plugin import REGISTERED

    assert "trace" in REGISTERED["estimators"]  # registered by the entry point, at `import verl`


@settings(max_examples=40)
@given(forest=forests(max_prompts=3, max_nodes=20, binary=False), seed=st.integers(0, 2**16),
       name=st.sampled_from(["trace", "trace_grpo", "trace_local", "trace_treerl", "trace_treepo"]))
def test_token_advantages_are_trace_theorys_on_random_trees(forest, seed, name):
    tokens = np.random.default_rng(seed).integers(1, 4, size=len(forest))
    fields, scores, mask, spans = verl_batch(forest, tokens)
    advantages, returns = verl_advantages(fields, scores, mask, name)
    ours = "trace" if name == "trace" else name.removeprefix("trace_")
    assert mismatches(forest, spans, advantages, mask, ours) == []
    np.testing.assert_array_equal(advantages, returns)
    assert np.all(advantages[mask.numpy() == 0] == 0)


BRANCHED = RolloutForest.from_nested([[1, [0, 1, 1], 0], [[0, [1, 0]], 1, 0]], binary_rewards=False)


def test_the_comparison_fails_on_a_wrong_tree_and_on_the_flat_estimate():
    tokens = np.arange(len(BRANCHED)) % 3 + 1
    fields, scores, mask, spans = verl_batch(BRANCHED, tokens)
    right, _ = verl_advantages(fields, scores, mask)
    assert mismatches(BRANCHED, spans, right, mask) == []
    # A wrong tree: the last continuation re-attached to the root, as a bare rollout.
    wrong = [dict(f) for f in fields]
    b = max(i for i, f in enumerate(wrong) if f["trace_parent"] != 0)
    wrong[b]["trace_parent"] = 0
    wrong_adv, _ = verl_advantages(wrong, scores, mask)
    assert mismatches(BRANCHED, spans, wrong_adv, mask) != []
    # The flat estimate (no tree fields: each trajectory a bare rollout of its uid) misses the contrasts.
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    flat, _ = get_adv_estimator_fn("trace")(token_level_rewards=scores, response_mask=mask,
                                            index=np.array([str(f["trace_tree"]) for f in fields], dtype=object))
    assert isinstance(flat, torch.Tensor) and mismatches(BRANCHED, spans, flat.numpy(), mask) != []


def test_without_tree_fields_trace_is_grpo_on_flat_groups():
    flat = RolloutForest.from_nested([[1, 0, 0, 1], [1, 1, 0]], binary_rewards=False)
    fields, scores, mask, spans = verl_batch(flat, None)
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    index = np.array([str(f["trace_tree"]) for f in fields], dtype=object)
    adv, _ = get_adv_estimator_fn("trace")(token_level_rewards=scores, response_mask=mask, index=index)
    assert mismatches(flat, spans, adv.numpy(), mask, "grpo") == []
    assert mismatches(flat, spans, adv.numpy(), mask, "trace") == []


def test_verls_padding_rows_are_left_out_of_the_trees():
    import torch

    tokens = np.arange(len(BRANCHED)) % 3 + 1
    fields, scores, mask, spans = verl_batch(BRANCHED, tokens)
    # verl pads a batch with copies of its first row, reward 0 and a one-token response (padding_utils).
    pad_scores = torch.cat([scores, torch.zeros(2, scores.shape[1])])
    pad_mask = torch.cat([mask, torch.zeros(2, mask.shape[1])])
    pad_mask[-2:, 0] = 1.0
    advantages, _ = verl_advantages(fields + [None, None], pad_scores, pad_mask)
    assert mismatches(BRANCHED, spans, advantages[:len(fields)], mask) == []
    assert np.all(advantages[len(fields):] == 0)
