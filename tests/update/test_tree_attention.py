"""Tree attention in query blocks (``update.tree_attention``) against the masked square it replaces: the
same attention outputs and gradients (fp32 and bf16), the same log-probabilities as the per-leaf rows, and
the rows forwarded end to end (no padding) against the padded rows, on packed rows wider than a query
block."""

import numpy as np
import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tests.update.test_packing import models  # noqa: F401  (the random Qwen3 pair)
from tests.update.test_packing import VOCAB, by_token, leaf_nodes
from trace_theory import RolloutForest
from trace_train.rollout.batch import NodePayload, RolloutBatch
from trace_train.update.packing import build_training_batch, tree_attention_mask, tree_logprobs
from trace_train.update.sequences import path_tokens
from trace_train.update.tree_attention import QUERY_BLOCK, block_plan, tree_sdpa_attention


def wide_batch(seed: int = 0):
    """Three trees, each a prompt with two levels of branching (3 x 4 paths of 4 turns), turns of 10-30
    tokens: rows of about 800 tokens, paths of about 100 (within the model's 256 positions)."""
    parent = []
    for _ in range(3):
        root = len(parent)
        parent.append(-1)
        for _ in range(3):
            mid = len(parent)
            parent.append(root)
            for _ in range(4):
                node = len(parent)
                parent += [mid, node, node + 1]  # a chain of three turns below the branch
    parent = np.array(parent)
    is_leaf = np.bincount(parent[parent >= 0], minlength=len(parent)) == 0
    reward = np.where(is_leaf, np.arange(len(parent)) % 2, np.nan)
    forest, rng = RolloutForest.from_parents(parent, reward), np.random.default_rng(seed)
    nodes = []
    for n in range(len(forest)):
        n_act = 0 if forest.parent[n] == -1 else int(rng.integers(5, 15))
        n_obs = 0 if forest.is_leaf[n] else int(rng.integers(5, 15))
        nodes.append(NodePayload(tuple(rng.integers(2, VOCAB, n_act).tolist()),
                                 tuple((-rng.uniform(0.05, 3.0, n_act)).tolist()), "",
                                 tuple(rng.integers(2, VOCAB, n_obs).tolist()), "", (), None))
    return RolloutBatch(forest, tuple(nodes), rows={}, predictions=np.full(len(forest), np.nan), report=None)


class Attention(torch.nn.Module):
    num_key_value_groups = 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_give_the_masked_square_outputs_and_gradients(dtype):
    """Several rows of unequal length (padding), wider than two blocks: every block's gathered keys, its
    mask (additive, in the inputs' dtype) and the one scatter of the key gradient are checked against the
    masked square in float32: within 1e-5 in float32, and in bfloat16 within twice the error of the
    masked square itself computed in bfloat16."""
    batch = wide_batch()
    tree = build_training_batch(batch, np.ones(len(batch.forest)), packing="tree", pad_token_id=0, token_budget=1000)
    mask = tree_attention_mask(tree.visible_until)
    rows, width = tree.input_ids.shape
    assert width > 2 * QUERY_BLOCK and rows > 1 and len(set(tree.lengths.tolist())) > 1
    torch.manual_seed(0)
    q, k, v = (torch.randn(rows, heads, width, 8) for heads in (4, 2, 2))
    module = Attention().train(False)
    weights = torch.randn(rows, width, 4, 8)

    def outputs_and_grads(inputs, **kw):
        inputs = [x.to(dtype if kw else torch.float32).requires_grad_() for x in inputs]
        if kw:
            out, _ = tree_sdpa_attention(module, *inputs, None, scaling=0.3, **kw)
        else:
            out, _ = sdpa_attention_forward(module, *inputs, mask, scaling=0.3)
        grads = torch.autograd.grad((out.float() * weights).sum(), inputs)
        return [x.detach().float() for x in (out, *grads)]

    want = outputs_and_grads((q, k, v))
    got = outputs_and_grads((q, k, v), tree_plan=block_plan(tree.visible_until))
    if dtype == torch.float32:
        tolerance = [1e-5] * 4
    else:
        square = [x.float() for x in (q, k, v)]
        low = [x.to(dtype) for x in square]
        inputs = [x.requires_grad_() for x in low]
        out, _ = sdpa_attention_forward(module, *inputs, mask.expand(rows, 1, width, width), scaling=0.3)
        own = [out, *torch.autograd.grad((out.float() * weights).sum(), inputs)]
        tolerance = [2 * float((o.detach().float() - w).abs().max()) + 1e-3 for o, w in zip(own, want)]
    for g, w, tol in zip(got, want, tolerance):
        torch.testing.assert_close(g, w, rtol=0, atol=tol)


def test_a_block_attends_to_the_columns_its_queries_see():
    until = torch.tensor([[2, 2, 4, 4], [4, 2, 4, 4]])  # row 0: pieces [0, 2), [2, 4); row 1: 0 -> (1 | 2 -> 3)
    plan = block_plan(until, 2)
    assert plan.query_sizes == [2, 2, 2, 2]
    keys = [k.tolist() for k in plan.key_index.split(plan.key_sizes)]
    assert keys == [[0, 1], [2, 3], [4, 5], [4, 6, 7]]  # flat row x 4 + column; row 1's second block: not 1, a sibling
    last = plan.visible[:, -3:].tolist()  # queries 2, 3 of row 1 see keys 0, 2, 3: (0, 2) and (0, 2, 3)
    assert last == [[True, True, False], [True, True, True]]


def test_the_plan_is_required():
    """Without the forward's ``tree_plan`` (a model that drops its forward's keywords) it says so."""
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="needs the forward's `tree_plan` keyword"):
        tree_sdpa_attention(Attention(), q, q[:, :1], q[:, :1], None)


def test_rows_end_to_end_give_the_padded_rows_logprobs_and_gradients(models):  # noqa: F811
    """The dense path forwards a micro-batch's rows end to end, without their padding (``lengths``): the
    same log-probabilities and parameter gradients (fp32, 1e-5) as the same rows forwarded padded."""
    policy, _ = models
    batch = wide_batch(2)
    tree = build_training_batch(batch, np.ones(len(batch.forest)), packing="tree", pad_token_id=0, token_budget=1000)
    assert tree.input_ids.shape[0] > 1 and int(tree.lengths.min()) < tree.input_ids.shape[1]  # padding to drop
    args = (policy, tree.input_ids, tree.position_ids, tree.visible_until, tree.predictor)
    weights = torch.rand(tree.input_ids.shape)

    def run(**kw):
        policy.zero_grad(set_to_none=True)
        logp = tree_logprobs(*args, **kw)
        (logp * weights).sum().backward()
        return logp.detach(), [p.grad.clone() for p in policy.parameters()]

    want, want_grads = run()
    got, got_grads = run(lengths=tree.lengths)
    policy.zero_grad(set_to_none=True)
    assert (want != 0).sum() > 100
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


def test_wide_packed_rows_give_the_per_leaf_logprobs(models):  # noqa: F811
    policy, _ = models
    batch = wide_batch(1)
    adv = np.ones(len(batch.forest))
    leaf = build_training_batch(batch, adv, packing="leaf", pad_token_id=0, micro_batch_size=4)
    tree = build_training_batch(batch, adv, packing="tree", pad_token_id=0, token_budget=1000)
    assert tree.input_ids.shape[1] > 2 * QUERY_BLOCK
    tokens = path_tokens(batch)
    with torch.no_grad():
        ln, lp = leaf_nodes(batch, leaf)
        want = by_token(ln, leaf.logprobs(policy), leaf.loss_mask, tokens.offset, lp)
        got = by_token(tree.node, tree.logprobs(policy), tree.loss_mask, tokens.offset, tree.position_ids)
    assert policy.config._attn_implementation == "sdpa"  # restored
    assert got.keys() == want.keys()
    assert np.allclose([got[k] for k in want], list(want.values()), rtol=0, atol=2e-5)
