"""``rollout.expansion=pipelined`` in the engine: a call's continuations grow in the next call's wave."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from trace_theory import Origin, top_up_roots
from trace_theory.pipelined import Pending
from trace_theory.step import Kind, in_rollout_order, place_continuations
from trace_train.rollout.batch import BatchBuilder
from trace_train.envs import GuessNumberEnv
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.rollout.pipeline import Carried

from .test_engine import LIMITS, POOL, UNEVEN, SlowGuessNumberEnv, TurnPredictor, make_engine

KW = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)


def _same(a, b):
    for name in ("parent", "prompt", "reward", "origin", "cost"):
        np.testing.assert_array_equal(getattr(a.forest, name), getattr(b.forest, name), err_msg=name)
    assert [n.action_ids for n in a.nodes] == [n.action_ids for n in b.nodes]
    for x, y in zip(a.nodes, b.nodes):  # up to batch composition's floating-point effects
        np.testing.assert_allclose(x.action_logprobs, y.action_logprobs, atol=1e-5)


def _grown(forest, n_old):
    """(anchor, kind) of every rollout a wave added below the first ``n_old`` nodes."""
    new = np.arange(n_old, len(forest))
    first = new[forest.starts_rollout[new]]
    return Counter((int(forest.parent[s]), "top_up" if forest.parent[forest.parent[s]] == -1 else "continuation")
                   for s in first)


def test_the_first_call_fills_and_the_second_returns_its_trees_as_the_barrier_decides(hf_backend):
    """Call 1 plants the bare rollouts and returns None; its pending holds the barrier's own decisions (the
    barrier run on the same seed grows the same bare rollouts and branches the same anchors); call 2
    returns call 1's trees whole, the new rollouts exactly the rule's continuations and top-ups on those
    bare rollouts and predictions, each extending its prefix's exact tokens."""
    engine = make_engine(hf_backend, expansion="pipelined", **KW)
    assert engine.pipelined and engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=4) is None
    pending = engine.pending
    assert isinstance(pending, Pending) and isinstance(pending.carried, Carried) and pending.rollouts == 16
    bare = pending.record.forest
    assert (bare.origin[bare.parent >= 0] == Origin.BARE).all() and bare.n_leaves == 8

    # the rule, recomputed here on the bare rollouts and the predictor's values at their prefixes
    paths = BatchBuilder()
    paths.copy_from(bare, pending.carried.nodes, pending.carried.rows)
    anchors = in_rollout_order(bare, bare.prefix_anchors())
    v = TurnPredictor()([paths.history(int(a)) for a in anchors])
    m_tree = bare.leaf_count[bare.roots]
    alloc = place_continuations(engine.policy, bare, anchors, v, 2 * m_tree)
    tops = top_up_roots(m_tree, int(alloc.unspent.sum())) - m_tree
    expected = Counter({(int(a), "continuation"): int(k) for a, k in zip(anchors, alloc.k) if k})
    expected.update({(int(r), "top_up"): int(k) for r, k in zip(bare.roots, tops) if k})
    starts = Counter({(int(n), "top_up" if k == Kind.TOP_UP else "continuation"): int(c)
                      for n, k, c in zip(pending.starts.node, pending.starts.kind, pending.starts.count)})
    assert starts == expected and sum(expected.values()) == 16

    barrier = make_engine(hf_backend, expansion="barrier", **KW).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    n = len(bare)
    np.testing.assert_array_equal(barrier.forest.parent[:n], bare.parent)  # the same bare rollouts
    assert [p.action_ids for p in barrier.nodes[:n]] == [p.action_ids for p in pending.carried.nodes]
    assert _grown(barrier.forest, n) == expected

    done = engine.rollout(POOL, predictor=TurnPredictor(), seed=5)
    f = done.forest.validate()
    assert done.report.expansion == "pipelined" and f.n_leaves == 8 * 3
    np.testing.assert_array_equal(f.parent[:n], bare.parent)  # old nodes first, unchanged
    assert [p.action_ids for p in done.nodes[:n]] == [p.action_ids for p in pending.carried.nodes]
    assert _grown(f, n) == expected
    for s in np.flatnonzero(f.starts_rollout & (np.arange(len(f)) >= n) & (f.origin == Origin.CONTINUATION)):
        anchor = int(f.parent[s])
        assert done.trajectory(int(f.factual_leaf[s])).token_ids[:len(done.context_ids(anchor))].tolist() \
            == done.context_ids(anchor)
    assert np.isfinite(done.predictions[anchors]).all()  # the record's predictions, on the grown forest
    assert 0 < done.report.stale_token_share < 1
    stale = f.cost[:n].sum() / f.cost.sum()
    assert done.report.stale_token_share == pytest.approx(stale)
    assert done.report.generated_tokens == int(f.cost.sum()) and done.report.wave_tokens > 0
    # the engine now holds call 2's trees, planted from POOL
    assert engine.pending.record.forest.n_prompts > 0 and set(engine.pending.carried.rows) <= set(range(len(POOL)))


def test_drain_finishes_the_last_trees_and_then_nothing_is_pending(hf_backend):
    engine = make_engine(hf_backend, expansion="pipelined", **KW)
    assert engine.drain(seed=1) is None
    engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    n = len(engine.pending.record.forest)
    batch = engine.drain(seed=5)
    assert batch.forest.validate().n_leaves == 24 and engine.pending is None
    assert batch.report.wave_tokens == int(batch.forest.cost[n:].sum())
    assert engine.drain(seed=6) is None


def test_a_policy_that_does_not_branch_is_trained_at_once(hf_backend):
    batch = make_engine(hf_backend, expansion="pipelined", policy="grpo", roots=8).rollout(POOL, seed=1)
    assert batch is not None and batch.forest.n_leaves == 16 and batch.report.stale_token_share == 0.0
    assert batch.report.expansion == "barrier"


def test_tokens_grown_from_the_pending_carry_the_newer_policys_log_probabilities(hf_backend):
    """Between the calls the generator's weights change (an update): the continuations grown in call 2's wave
    are sampled from, and carry the log-probabilities of, the new weights; the bare turns keep the old ones."""
    model = hf_backend.model
    old = {k: v.clone() for k, v in model.state_dict().items()}
    engine = make_engine(hf_backend, expansion="pipelined", **KW)
    engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    n = len(engine.pending.record.forest)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    new = {k: v.clone() for k, v in model.state_dict().items()}
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=5)
    f = batch.forest

    def logprobs(weights, node):
        model.load_state_dict(weights)
        ids = torch.tensor(batch.context_ids(node))
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None]).logits[0].float(), dim=-1)
        k = len(batch.nodes[node].action_ids)
        start = len(ids) - len(batch.nodes[node].observation_ids) - k
        return logp[start - 1:start - 1 + k].gather(1, ids[start:start + k, None])[:, 0].numpy()

    grown = [i for i in range(n, len(f)) if batch.nodes[i].action_ids][:6]
    kept = [i for i in range(n) if batch.nodes[i].action_ids][:6]
    assert grown and kept
    for node in grown:
        recorded = np.array(batch.nodes[node].action_logprobs)
        np.testing.assert_allclose(recorded, logprobs(new, node), atol=1e-4)
        assert np.abs(recorded - logprobs(old, node)).max() > 1e-3
    for node in kept:
        np.testing.assert_allclose(np.array(batch.nodes[node].action_logprobs), logprobs(old, node), atol=1e-4)
    model.load_state_dict(new)


def test_pipelined_decisions_do_not_depend_on_environment_timing(hf_backend):
    """Environments that answer in a shuffled order (random sleeps): the same batches, call after call, node
    for node, as the lockstep schedule's."""

    Slow = SlowGuessNumberEnv

    def run(env, **changes):
        config = RolloutConfig(group_size=4, limits=LIMITS, expansion="pipelined", **{**KW, "env_workers": 8},
                               **changes)
        engine = RolloutEngine(hf_backend, env, config)
        assert engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=9) is None
        return [engine.rollout(POOL, predictor=TurnPredictor(), seed=10), engine.drain(seed=11)]

    a, b = run(Slow), run(Slow)
    for x, y in zip(a, b):
        _same(x, y)
    assert a[0].report.continuations > 0 and a[1].report.continuations > 0
    for x, y in zip(a, run(GuessNumberEnv, schedule="lockstep")):
        _same(x, y)


@pytest.mark.parametrize("value", ["pipeline", "Pipelined", ""])
def test_expansion_names_its_values(value):
    with pytest.raises(ValueError, match=r"`expansion` must be one of \(.*'pipelined'\), got"):
        RolloutConfig(expansion=value)
    assert RolloutConfig(expansion="pipelined").expansion == "pipelined"
