"""The tree rollout engine: exact token reuse, trees that match the environment, budgets, limits."""

from __future__ import annotations

import random
import time

from functools import partial

import numpy as np
import pytest
import torch

from trace_theory import POLICIES, Origin, RolloutBudget, get_policy, top_up_roots
from trace_theory.step import in_rollout_order
from trace_train.backends import Capabilities
from trace_train.chat import ChatFormat
from trace_train.rollout.engine import History, RolloutConfig, RolloutEngine
from trace_train.envs import EndReason, EpisodeLimits, GuessNumberEnv, make_rows

POOL = make_rows(6, high=8, max_guesses=4, seed=1)
LIMITS = EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=512)


class TurnPredictor:
    """A fixed predictor: prompts get distinct values; a prefix's value falls with the guesses used."""

    def __call__(self, histories):
        return np.array([0.15 + 0.12 * (h.prompt % 6) if h.depth == 0 else 0.8 / h.depth for h in histories])

    def concentration(self, histories):
        return np.full(len(histories), 4.0)


def make_engine(backend, **changes):
    """TRACE's engine on the tiny model. Streamed unless ``expansion`` is changed: these tests pin the
    outcome-aware placement (what ``trace_theory`` places with the outcomes known); eager expansion, the
    default, has its own in ``test_engine_eager.py`` and below."""
    config = RolloutConfig(
        **{
            "policy": "trace",
            "expansion": "streamed",
            "roots": 8,
            "continuations_per_root": 1,
            "group_size": 4,
            "limits": LIMITS,
            **changes,
        }
    )
    return RolloutEngine(backend, GuessNumberEnv, config)


def branch_starts(forest):
    return np.flatnonzero(forest.starts_rollout & (forest.origin == Origin.CONTINUATION))


@pytest.fixture(scope="module")
def reference_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture
def trace_batch(backend):
    return make_engine(backend).rollout(POOL, predictor=TurnPredictor(), seed=0)


def test_continuations_extend_the_exact_tokens_of_their_prefix(trace_batch):
    batch, forest = trace_batch, trace_batch.forest
    starts = branch_starts(forest)
    assert starts.size > 0
    for b in starts:
        anchor = int(forest.parent[b])
        prefix = batch.context_ids(anchor)
        factual = batch.trajectory(int(forest.factual_leaf[anchor])).token_ids
        branch = batch.trajectory(int(forest.factual_leaf[b])).token_ids
        assert factual[: len(prefix)].tolist() == branch[: len(prefix)].tolist() == prefix
        assert forest.origin[b] == Origin.CONTINUATION and forest.origin[anchor] == Origin.BARE


def test_stored_log_probabilities_are_those_of_the_stored_tokens(trace_batch, reference_model):
    """A transformers forward pass over each leaf's stored tokens reproduces the generation log-probs:
    the stored context is exactly what the model was conditioned on, branch points included."""
    for leaf in trace_batch.forest.leaves:
        t = trace_batch.trajectory(int(leaf))
        with torch.no_grad():
            logp = torch.log_softmax(reference_model(torch.tensor(t.token_ids)[None]).logits[0], dim=-1)
        ref = logp[:-1].gather(1, torch.tensor(t.token_ids[1:])[:, None])[:, 0].numpy()
        on = t.loss_mask[1:] == 1
        np.testing.assert_allclose(t.logprobs[1:][on], ref[on], atol=1e-4)
        assert t.loss_mask[0] == 0 and np.all(t.logprobs[t.loss_mask == 0] == 0)


def test_trees_and_rewards_match_a_replay_of_the_environment(trace_batch, backend):
    batch, forest = trace_batch, trace_batch.forest
    chat = ChatFormat(backend.tokenizer)
    for leaf in forest.leaves.tolist():
        path = forest.path_to_root(leaf)[::-1].tolist()
        root, turns = path[0], path[1:]
        env = GuessNumberEnv()
        assert list(batch.nodes[root].observation_ids) == chat.prompt_ids(
            env.reset(batch.rows[int(forest.prompt[leaf])])
        )
        for node in turns:
            payload = batch.nodes[node]
            assert forest.cost[node] == len(payload.action_ids)
            result = env.step(payload.action)
            assert result.observation == payload.observation
            assert result.done == (payload.end_reason == EndReason.DONE)
        assert batch.nodes[leaf].end_reason is not None
        assert forest.depth[leaf] == len(turns) and env.verify() == forest.reward[leaf]
        assert env.snapshot() == batch.nodes[leaf].snapshot
    assert all(p.end_reason is None for i, p in enumerate(batch.nodes) if not forest.is_leaf[i])


def test_restoring_a_snapshot_replays_every_child_turn(trace_batch):
    batch, forest = trace_batch, trace_batch.forest
    for node in np.flatnonzero(~forest.is_leaf & (forest.parent != -1)).tolist():
        for child in forest.children(node).tolist():
            env = GuessNumberEnv()
            env.restore(batch.nodes[node].snapshot)
            assert env.step(batch.nodes[child].action).observation == batch.nodes[child].observation


def test_the_report_accounts_for_every_rollout_and_token(backend):
    engine = make_engine(backend)
    before = backend.stats.copy()
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=1)
    forest, report, stats = batch.forest, batch.report, backend.stats.since(before)
    assert report.rollouts == forest.n_leaves == report.planned.total == 16
    assert report.bare_rollouts + report.continuations == report.rollouts
    assert report.continuations == len(branch_starts(forest))
    assert report.generated_tokens == forest.cost.sum() == stats.generated_tokens
    assert (report.prompt_tokens, report.cached_prompt_tokens) == (
        stats.prompt_tokens,
        stats.cached_prompt_tokens,
    )
    assert sum(report.end_reasons.values()) == report.rollouts
    metrics = batch.metrics()
    assert sum(metrics["rollouts_by_anchor_depth"]) == report.rollouts
    assert sum(metrics["tokens_by_anchor_depth"]) == report.generated_tokens
    assert sum(metrics["rollouts_by_anchor_depth"][1:]) == report.continuations
    assert 0.0 <= metrics["effective_ratio"] <= 1.0
    scored = np.isfinite(batch.predictions)
    assert scored[forest.roots].all() and not scored[forest.is_leaf].any()


class RecordingBackend:
    """Delegates to a real back end and records the requests of every ``generate`` call."""

    capabilities = Capabilities()  # generate only: the engine batches its requests (BatchedStream)

    def __init__(self, backend):
        self.backend, self.calls = backend, []
        self.tokenizer, self.stats = backend.tokenizer, backend.stats

    def generate(self, requests, sampling):
        self.calls.append([(len(r.prompt_ids), r.n) for r in requests])
        return self.backend.generate(requests, sampling)

    def update_weights(self, state_dict):
        self.backend.update_weights(state_dict)


def test_generation_is_batched_across_prompts_turn_by_turn(hf_backend):
    recorder = RecordingBackend(hf_backend)
    # lockstep: the call structure below is its contract (the concurrent schedule batches what is ready)
    batch = make_engine(recorder, schedule="lockstep").rollout(POOL, predictor=TurnPredictor(), seed=0)
    forest = batch.forest
    bare_depth = int(forest.depth[forest.origin == Origin.BARE].max())
    branch = branch_starts(forest)
    anchors = in_rollout_order(forest, np.unique(forest.parent[branch]))  # the driver's order
    # Stage 1: one call per turn; the first holds one request per selected prompt with n = its group.
    assert recorder.calls[0] == [
        (len(batch.nodes[r].observation_ids), len(forest.children(r))) for r in forest.roots
    ]
    # Stage 2: one request per anchor with n = its continuations (no top-ups here), then one per rollout.
    stage2 = recorder.calls[bare_depth]
    assert stage2 == [(len(batch.context_ids(int(a))), len(forest.children(a)) - 1) for a in anchors]
    longest_branch = max(int((forest.factual_leaf == forest.factual_leaf[b]).sum()) for b in branch)
    assert len(recorder.calls) == bare_depth + longest_branch
    assert sum(n for call in recorder.calls for _, n in call) == len(forest) - forest.n_prompts


@pytest.mark.parametrize("expansion", ["streamed", "eager"])
def test_a_fixed_seed_reproduces_the_forest(backend, expansion):
    """A seed fixes the forest for engines in the same state (eager's carries its threshold from call to
    call, ``engine.eager_threshold``, so each call here is an engine's first)."""
    first = [make_engine(backend, expansion=expansion) for _ in range(3)]
    a, b = (engine.rollout(POOL, predictor=TurnPredictor(), seed=5) for engine in first[:2])
    for name in ("parent", "prompt", "reward", "origin", "cost"):
        np.testing.assert_array_equal(getattr(a.forest, name), getattr(b.forest, name))
    assert [n.action_ids for n in a.nodes] == [n.action_ids for n in b.nodes]
    c = first[2].rollout(POOL, predictor=TurnPredictor(), seed=6)
    assert [n.action_ids for n in c.nodes] != [n.action_ids for n in a.nodes]


@pytest.mark.parametrize("roots, per_root", [(8, 1), (6, 3)])
@pytest.mark.parametrize("name", POLICIES.names())
def test_every_policy_spends_its_budget_through_trace_theory(hf_backend, name, roots, per_root):
    engine = make_engine(hf_backend, policy=name, roots=roots, continuations_per_root=per_root)
    tokens_from = engine.expected_tokens(np.arange(64))  # a token-priced policy's costs, before they are learnt
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=2)
    forest, report = batch.forest, batch.report
    policy = get_policy(name, group_size=4)
    planned = RolloutBudget(*policy.split(RolloutBudget(roots, per_root)))
    assert report.planned == planned
    groups = {int(forest.prompt[r]): len(forest.children(r)) for r in forest.roots}
    if policy.dynamic_sampling:
        assert report.rollouts <= planned.total and report.rollouts % 4 == 0
        assert set(groups.values()) == {4} and sorted(groups) == list(range(len(groups)))
        return
    if policy.pilot_commits:  # its groups follow the pilots' outcomes: every rollout spent, every pilot kept
        assert report.rollouts == planned.total == sum(groups.values())
        assert min(groups.values()) >= policy.pilot and report.continuations == 0
        return
    # A token-priced policy spends m_i N rollouts' worth of tokens on continuations, which cost less.
    assert report.rollouts >= planned.total if policy.priced_in_tokens else report.rollouts == planned.total
    v = TurnPredictor()([History(i, row, 0, (), ()) for i, row in enumerate(POOL)])
    m = policy.allocate_roots(v, planned.roots, concentration=np.full(len(POOL), 4.0))
    if not policy.branches:
        assert groups == {i: int(k) for i, k in enumerate(m) if k > 0}
        assert report.continuations == 0
        return
    anchors = _stage_one_anchors(forest, m)
    predicted = np.isfinite(batch.predictions[anchors])
    assert predicted.all() if policy.predicts_prefixes else not predicted.any()
    if policy.deterministic:
        roots = forest.roots
        group = np.searchsorted(roots, forest.root_of[anchors])
        alloc = policy.allocate_prefixes(
            np.where(predicted, batch.predictions[anchors], 0.5),
            forest.reward[forest.factual_leaf[anchors]],
            group,
            m[m > 0] * planned.continuations_per_root,
            cost=tokens_from[forest.depth[anchors]] / tokens_from[0],
        )
        assert [len(forest.children(a)) - 1 for a in anchors] == alloc.k.tolist()
        expected = top_up_roots(m[m > 0], int(alloc.unspent.sum()))
        assert [groups[int(forest.prompt[r])] for r in roots] == expected.tolist()
    assert report.continuations == sum(len(forest.children(a)) - 1 for a in anchors)


@pytest.mark.parametrize("roots, per_root", [(8, 1), (6, 3)])
@pytest.mark.parametrize("name", [n for n in POLICIES.names() if get_policy(n).streams_prefixes])
def test_every_branching_policy_spends_its_budget_under_eager_expansion(hf_backend, name, roots, per_root):
    """Eager (the default) commits at turn boundaries before outcomes are known, so its placement is not the
    barrier's; what it spends is: exactly M (1 + N) rollouts (a token-priced policy at least that many, its
    continuations costing less), the same groups' roots, every continuation from a bare rollout's prefix."""
    engine = make_engine(hf_backend, policy=name, roots=roots, continuations_per_root=per_root, expansion="eager")
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=2)
    forest, report = batch.forest.validate(), batch.report
    policy = get_policy(name, group_size=4)
    planned = RolloutBudget(*policy.split(RolloutBudget(roots, per_root)))
    assert report.planned == planned
    assert report.rollouts >= planned.total if policy.priced_in_tokens else report.rollouts == planned.total
    assert report.continuations > 0 and engine.eager_threshold is not None
    starts = branch_starts(forest)
    assert report.continuations == starts.size
    assert (forest.origin[forest.parent[starts]] == Origin.BARE).all()
    v = TurnPredictor()([History(i, row, 0, (), ()) for i, row in enumerate(POOL)])
    m = policy.allocate_roots(v, planned.roots, concentration=np.full(len(POOL), 4.0))
    assert sorted(int(forest.prompt[r]) for r in forest.roots) == np.flatnonzero(m).tolist()


def _stage_one_anchors(forest, m):
    """Non-terminal prefixes of the first m_i bare rollouts of each root (top-ups come later), root by
    root, rollout by rollout, down each rollout."""
    anchors = []
    for root in forest.roots:
        for start in forest.children(root)[: m[forest.prompt[root]]].tolist():
            node = start
            while not forest.is_leaf[node]:
                anchors.append(node)
                node = int(forest.first_child[node])
    return np.asarray(anchors, dtype=np.int64)  # in rollout order, as the step driver lists them


def test_turn_limit_ends_rollouts_as_documented(hf_backend):
    batch = make_engine(
        hf_backend, policy="grpo", limits=EpisodeLimits(max_turns=1, max_turn_tokens=8)
    ).rollout(POOL)
    forest = batch.forest
    assert set(forest.depth[forest.leaves]) == {1}
    for leaf in forest.leaves:
        payload = batch.nodes[leaf]
        expected = EndReason.DONE if forest.reward[leaf] == 1 else EndReason.MAX_TURNS
        assert payload.end_reason == expected and payload.observation and payload.observation_ids == ()


def test_token_limit_cuts_a_turn_before_the_environment_sees_it(hf_backend):
    batch = make_engine(
        hf_backend, policy="grpo", limits=EpisodeLimits(max_turns=4, max_turn_tokens=1)
    ).rollout(POOL)
    forest = batch.forest
    assert set(forest.depth[forest.leaves]) == {1} and set(forest.cost[forest.leaves]) == {1.0}
    for leaf in forest.leaves:
        payload = batch.nodes[leaf]
        assert payload.end_reason == EndReason.TURN_TOKENS and payload.finish_reason == "length"
        assert payload.snapshot.guesses == () and forest.reward[leaf] == 0.0


def test_context_limit_ends_rollouts_when_no_room_is_left(hf_backend):
    prompt_len = len(ChatFormat(hf_backend.tokenizer).prompt_ids(GuessNumberEnv().reset(POOL[0])))
    limits = EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=prompt_len + 4)
    batch = make_engine(hf_backend, policy="grpo", limits=limits).rollout(POOL)
    forest = batch.forest
    for leaf in forest.leaves:
        assert batch.nodes[leaf].end_reason in (EndReason.CONTEXT, EndReason.DONE)
        assert len(batch.context_ids(int(leaf))) <= limits.max_context_tokens
    assert EndReason.CONTEXT.value in batch.report.end_reasons
    with pytest.raises(ValueError, match="`max_context_tokens` is"):
        make_engine(hf_backend, policy="grpo", limits=EpisodeLimits(max_context_tokens=prompt_len)).rollout(
            POOL
        )


def test_a_token_budget_is_turned_into_rollouts_with_running_costs(hf_backend):
    engine = make_engine(hf_backend, token_budget=480)
    # Prior: a rollout costs half of max_turns * max_turn_tokens = 16 tokens, a continuation half that.
    assert engine.plan() == RolloutBudget(20, 1)  # 480 // (16 * (1 + 0.5))
    assert make_engine(hf_backend, policy="grpo", token_budget=480).plan() == RolloutBudget(30, 0)
    # Priced in tokens, a root's continuation share is N rollouts' worth of tokens: 480 // (16 * 2).
    assert make_engine(hf_backend, policy="trace_tokens", token_budget=480).plan() == RolloutBudget(15, 1)
    batch = engine.rollout(POOL, predictor=TurnPredictor(), seed=0)
    f = batch.forest
    bare = f.starts_rollout & (f.origin == Origin.BARE)
    per_rollout = [
        sum(f.cost[n] for n in f.descendants(int(s)) if f.factual_leaf[n] == f.factual_leaf[s])
        for s in np.flatnonzero(bare)
    ]
    assert engine.tokens_per_rollout == pytest.approx(np.mean(per_rollout))
    L, c = engine.tokens_per_rollout, engine.continuation_cost_ratio
    turns = np.mean([len(f.path_to_root(int(f.factual_leaf[s]))) - 1 for s in np.flatnonzero(bare)])
    assert engine.turns_per_rollout == pytest.approx(turns)
    T = max(turns, 1.0)
    assert engine.expected_tokens([0, 1, 99]) == pytest.approx(L * np.array([T, max(T - 1, 1), 1]) / T)
    assert engine.plan() == RolloutBudget(int(480 // (L * (1 + c))), 1)
    with pytest.raises(ValueError, match="`token_budget` 30 pays for 1 rollouts of about 16 tokens"):
        make_engine(hf_backend, token_budget=30).plan()


def test_bad_arguments_fail_with_clear_messages(hf_backend):
    with pytest.raises(ValueError, match="unknown allocation policy 'tracee'; known: .*trace"):
        RolloutConfig(policy="tracee")
    with pytest.raises(ValueError, match="allocates by predicted success: pass `predictor`"):
        make_engine(hf_backend).rollout(POOL)
    with pytest.raises(ValueError, match="must return 6 probabilities in \\[0, 1\\]"):
        make_engine(hf_backend).rollout(POOL, predictor=lambda hs: np.full(len(hs), 1.5))
    with pytest.raises(ValueError, match="needs a predictor with a `concentration"):
        make_engine(hf_backend, policy="trace_beta").rollout(POOL, predictor=lambda hs: np.full(len(hs), 0.5))
    with pytest.raises(ValueError, match="policy 'dapo' reads its groups' 0/1 outcomes"):
        RolloutConfig(policy="dapo", binary_rewards=False)
    with pytest.raises(ValueError, match="`pool` must hold at least one"):
        make_engine(hf_backend).rollout([], predictor=TurnPredictor())


@pytest.mark.slow
def test_vllm_serves_continuation_prefixes_from_its_prefix_cache(vllm_backend, block_size):
    """Each continuation's prefix was computed by its factual rollout: every whole block of it is a hit."""
    rules = GuessNumberEnv().reset(POOL[0])[0]["content"]
    env = partial(GuessNumberEnv, system_prompt=" ".join([rules] * 6))  # a long system prompt, as agents have
    engine = RolloutEngine(
        vllm_backend,
        env,
        RolloutConfig(policy="uniform_tree", roots=8, continuations_per_root=2, group_size=4, limits=LIMITS),
    )
    batch = engine.rollout(POOL, seed=0)
    forest, report = batch.forest, batch.report
    starts = branch_starts(forest)
    lengths = [len(batch.context_ids(int(forest.parent[b]))) for b in starts]
    assert report.continuation_prefix_tokens == sum(lengths)
    assert report.continuation_prefix_cached == sum((n - 1) // block_size * block_size for n in lengths)
    assert report.continuation_prefix_hit_rate >= 0.9


class PartialCreditGuessing(GuessNumberEnv):
    """Guess the number with a graded verifier: 1 / (guesses used) for a solved game, else 0."""

    def verify(self) -> float:
        state = self.snapshot()
        return 1.0 / len(state.guesses) if state.solved else 0.0


def test_graded_rewards_need_binary_rewards_off(hf_backend):
    config = dict(policy="uniform_tree", limits=LIMITS)
    batch = RolloutEngine(
        hf_backend, PartialCreditGuessing, RolloutConfig(**config, binary_rewards=False)
    ).rollout(POOL)
    forest = batch.forest
    expected = [
        1.0 / forest.depth[leaf] if batch.nodes[leaf].snapshot.solved else 0.0 for leaf in forest.leaves
    ]
    assert forest.reward[forest.leaves].tolist() == expected
    assert any(0.0 < r < 1.0 for r in expected)
    with pytest.raises(ValueError, match="rewards are declared binary"):
        RolloutEngine(hf_backend, PartialCreditGuessing, RolloutConfig(**config)).rollout(POOL)


# Trees of different lengths (1 to 4 guesses per game): under the concurrent schedule they end at
# different times, and a streamed tree branches while the others still generate.
UNEVEN = [dict(row, max_guesses=1 + i % 4) for i, row in enumerate(make_rows(8, high=8, seed=3))]


def _bare_and_branches(batch):
    """Per bare rollout (root prompt, order under its root): its turns' action ids, and the
    continuations placed at each of its turns; the batch's decisions whatever its node numbering."""
    f, out = batch.forest, {}
    for root in f.roots.tolist():
        for j, start in enumerate(f.children(root).tolist()):
            if f.origin[start] != Origin.BARE:
                continue
            turns, node = [], start
            while True:
                turns.append((batch.nodes[node].action_ids, len(f.children(node)) - 1 if not f.is_leaf[node] else 0,
                              batch.predictions[node] if np.isfinite(batch.predictions[node]) else None))
                if f.is_leaf[node]:
                    break
                node = int(f.first_child[node])
            out[int(f.prompt[root]), j] = turns
    return out


@pytest.mark.parametrize("name", ["trace", "prefix_only", "trace_tokens"])
def test_streamed_expansion_places_what_the_barrier_places(backend, name):
    """Same seed, streamed against barrier: the same bare rollouts, predictions, continuations per
    anchor and group sizes; only the continuations' sampling seeds (and so their tokens) differ."""
    kw = dict(policy=name, roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)
    streamed = make_engine(backend, expansion="streamed", **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    barrier = make_engine(backend, expansion="barrier", **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    assert _bare_and_branches(streamed) == _bare_and_branches(barrier)
    for report in (streamed.report, barrier.report):
        assert report.continuations > 0
    assert streamed.report.continuations == barrier.report.continuations
    assert streamed.report.top_up_rollouts == barrier.report.top_up_rollouts
    assert streamed.forest.n_leaves == barrier.forest.n_leaves
    # The streamed batch is a valid batch: every continuation extends its anchor's exact tokens.
    f = streamed.forest.validate()
    for b in branch_starts(f):
        anchor = int(f.parent[b])
        assert streamed.trajectory(int(f.factual_leaf[b])).token_ids[: len(streamed.context_ids(anchor))].tolist() \
            == streamed.context_ids(anchor)


class SlowGuessNumberEnv(GuessNumberEnv):
    """Guess-the-number whose environment answers after a random sleep (0-20 ms): rollouts report in a
    shuffled order, as a real tool's latency would make them."""

    concurrency_safe = True

    def step(self, action):
        time.sleep(random.random() * 0.02)
        return super().step(action)


def test_streamed_expansion_does_not_depend_on_which_tree_ends_first(hf_backend):
    """Environments that answer in a shuffled order (random sleeps): the same batch, node for node."""
    Slow = SlowGuessNumberEnv

    def run():
        config = RolloutConfig(policy="trace", roots=8, continuations_per_root=2, group_size=4, limits=LIMITS,
                               env_workers=8)
        return RolloutEngine(hf_backend, Slow, config).rollout(UNEVEN, predictor=TurnPredictor(), seed=9)

    a, b = run(), run()
    for name in ("parent", "prompt", "reward", "origin", "cost"):
        np.testing.assert_array_equal(getattr(a.forest, name), getattr(b.forest, name))
    assert [n.action_ids for n in a.nodes] == [n.action_ids for n in b.nodes]
