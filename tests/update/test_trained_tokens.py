"""Which rollouts the update trains, and under which distribution: DAPO's kept groups only, no environment
faults (unless asked), and the rollouts' own temperature in the back ends' records and the trainer."""

import dataclasses

import numpy as np
import pytest
import torch

from tests.update.test_packing import fixed_batch
from tests.update.test_sequences import tree_batch  # noqa: F401  (real branched rollouts of the tiny model)
from trace_theory import compute_advantages
from trace_train.backends.base import GenerationRequest, Sampling, generator_asleep
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.envs import EpisodeLimits, GuessNumberEnv, make_rows
from trace_train.envs.base import EndReason
from trace_train.update.packing import build_training_batch

LAYOUTS = ["leaf", "tree"]
LIMITS = EpisodeLimits(max_turns=3, max_turn_tokens=8, max_context_tokens=1024)


def _trained_leaves(seqs) -> set:
    if seqs.sequence_ids is not None:  # packed trees: the sequences that own a trained token
        owners = torch.unique(seqs.sequence_ids[seqs.loss_mask > 0]).tolist()
        return {int(seqs.leaves[i]) for i in owners}
    return {int(leaf) for leaf, row in zip(seqs.leaves, seqs.loss_mask) if row.sum() > 0}


@pytest.fixture(scope="module")
def dapo_batch(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    rows = make_rows(3, high=2, max_guesses=3, seed=1) + make_rows(3, high=64, max_guesses=1, seed=2) \
        + make_rows(4, high=6, max_guesses=3, seed=3)
    cfg = RolloutConfig(policy="dapo", pool_size=len(rows), roots=32, group_size=4, dapo_target=8, limits=LIMITS,
                        seed=0)
    return backend, RolloutEngine(backend, GuessNumberEnv, cfg).rollout(rows)


@pytest.mark.parametrize("packing", LAYOUTS)
def test_dapo_trains_only_its_mixed_groups(dapo_batch, packing):
    """The driver's kept (mixed) groups reach the update; uniform groups are in neither the loss nor its
    normaliser (the simulator's rule), while the report still counts every rollout spent."""
    backend, batch = dapo_batch
    f = batch.forest
    reward_of = {int(p): f.reward[f.leaves[f.prompt[f.leaves] == p]] for p in np.unique(f.prompt)}
    mixed = {p for p, r in reward_of.items() if 0 < r.mean() < 1}
    assert batch.kept is not None and set(batch.kept.tolist()) == mixed
    assert mixed and len(mixed) < len(reward_of), "the batch must hold mixed and uniform groups"
    assert batch.report.rollouts == f.n_leaves  # budget accounting unchanged
    adv = compute_advantages(f, "grpo")
    seqs = build_training_batch(batch, adv, packing=packing, pad_token_id=backend.pad_id, token_budget=4096)
    trained = _trained_leaves(seqs)
    assert {int(f.prompt[leaf]) for leaf in trained} == mixed
    want = sum(len(batch.nodes[n].action_ids) for n in range(len(f))
               if f.parent[n] != -1 and int(f.prompt[n]) in mixed)
    assert seqs.normaliser(True) == want  # token_mean divides by the mixed groups' tokens only
    everything = dataclasses.replace(batch, kept=None)  # what the trainer did before
    assert build_training_batch(everything, adv, packing=packing, pad_token_id=backend.pad_id,
                                token_budget=4096).normaliser(True) > want


@pytest.mark.parametrize("packing", LAYOUTS)
def test_environment_faults_are_left_out_of_the_loss_unless_asked(packing):
    batch = fixed_batch()
    f = batch.forest
    failed = int(f.leaves[0])
    nodes = list(batch.nodes)
    nodes[failed] = dataclasses.replace(nodes[failed], end_reason=EndReason.ENV_TIMEOUT)
    nodes[int(f.leaves[1])] = dataclasses.replace(nodes[int(f.leaves[1])], end_reason=EndReason.DONE)
    faulty = dataclasses.replace(batch, nodes=tuple(nodes))
    adv = np.ones(len(f))
    kw = dict(packing=packing, pad_token_id=0, token_budget=4096)
    base = build_training_batch(batch, adv, **kw)
    masked = build_training_batch(faulty, adv, **kw)
    kept = build_training_batch(faulty, adv, train_env_failures=True, **kw)
    assert failed in _trained_leaves(base) and failed in _trained_leaves(kept)
    assert _trained_leaves(masked) == _trained_leaves(base) - {failed}
    own = sum(len(batch.nodes[n].action_ids) * f.leaf_count[n] for n in np.flatnonzero(f.factual_leaf == failed))
    assert own > 0 and masked.normaliser(True) == base.normaliser(True) - own == kept.normaliser(True) - own


def _faulty_batch(parent, reward, failed: list[int], kept=None):
    """A batch on ``parent`` / ``reward`` (3 action tokens per turn, 2 prompt tokens per root) whose leaves
    ``failed`` ended by an environment fault (reward 0, as the scheduler records it)."""
    from trace_theory import RolloutForest
    from trace_train.rollout.batch import NodePayload, RolloutBatch

    parent = np.asarray(parent)
    forest = RolloutForest.from_parents(parent, reward)
    nodes = []
    for n in range(len(parent)):
        root = parent[n] == -1
        end = (EndReason.ENV_ERROR if n in failed else EndReason.DONE) if forest.is_leaf[n] else None
        nodes.append(NodePayload(() if root else (5 + n, 6, 7), () if root else (-0.5, -0.5, -0.5), "",
                                 (3, 4) if root else (), "", (), None, end_reason=end))
    return RolloutBatch(forest, tuple(nodes), rows={}, predictions=np.arange(len(parent), dtype=float),
                        report="the report", kept=kept)


def _trained_token_weights(batch, seqs) -> dict:
    """{node: weights of its trained tokens} over every row of either layout."""
    if seqs.sequence_ids is not None:
        node = seqs.node
    else:
        node = torch.full(seqs.input_ids.shape, -1, dtype=torch.long)
        for r, leaf in enumerate(seqs.leaves):
            traj = batch.trajectory(int(leaf))
            node[r, :len(traj.node)] = torch.from_numpy(traj.node)
    out: dict = {}
    for n, w in zip(node[seqs.loss_mask > 0].tolist(), seqs.weights[seqs.loss_mask > 0].tolist()):
        out.setdefault(n, []).append(w)
    return out


@pytest.mark.parametrize("packing", LAYOUTS)
def test_a_faulted_bare_rollout_keeps_its_shared_trunk_in_the_loss(packing):
    """Tree 0: bare rollout 0-2-3-4 (4 faulted), continuations 3-9 and 2-5-6; tree 1's only rollout faulted.
    The fault is pruned below its last shared ancestor (3): the trunk 2, 3, owned before by the faulted
    leaf (and so masked), is now owned by a healthy rollout and trained with positive weight in both layouts;
    tree 1 goes altogether. The report (budget, env failures) is the batch's."""
    parent = [-1, -1, 0, 2, 3, 2, 5, 0, 7, 3, 1, 10]
    is_leaf = np.bincount(np.array(parent)[np.array(parent) >= 0], minlength=12) == 0
    reward = np.where(is_leaf, np.array([0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0], dtype=float), np.nan)
    batch = _faulty_batch(parent, reward, failed=[4, 11])
    kw = dict(packing=packing, pad_token_id=0, token_budget=4096)
    masked = _trained_token_weights(batch, build_training_batch(batch, np.ones(12), **kw))
    assert 2 not in masked and 3 not in masked  # what the loss did before: the trunk went with the fault
    pruned = batch.without_env_failures()
    f = pruned.forest
    kept_ids = [0, 2, 3, 5, 6, 7, 8, 9]  # old ids, in order: 1, 4, 10, 11 removed
    assert len(f) == 8 and f.n_prompts == 1 and sorted(f.reward[f.leaves].tolist()) == [0.0, 1.0, 1.0]
    assert pruned.report == "the report" and pruned.predictions.tolist() == [float(i) for i in kept_ids]
    assert [pruned.nodes[i].action_ids for i in range(8)] == [batch.nodes[i].action_ids for i in kept_ids]
    trunk = [kept_ids.index(2), kept_ids.index(3)]
    assert all(f.factual_leaf[trunk] == kept_ids.index(9))
    adv = compute_advantages(f, "trace")
    weights = _trained_token_weights(pruned, build_training_batch(pruned, adv, **kw))
    for node in trunk:
        assert len(weights[node]) == 3 and min(weights[node]) > 0, (packing, weights)
    assert set(weights) == set(range(1, 8))  # every healthy turn is trained, none twice


def test_a_faulted_rollout_is_not_sampled_for_advantages_mixed_and_dapo():
    """Group (1, 1, 1, fault): before, the fault's 0 made the group mixed, each success above its
    baseline and DAPO kept it; as not sampled the group is uniform, every advantage is 0 and DAPO drops it.
    Group (1, 0, fault) stays mixed and kept."""
    from trace_theory import mixed_anchor_ratio, root_outcomes

    parent = [-1, 0, 0, 0, 0, -1, 5, 5, 5]
    reward = [np.nan, 1, 1, 1, 0, np.nan, 1, 0, 0]
    batch = _faulty_batch(parent, reward, failed=[4, 8], kept=np.array([0, 1]))
    batch = dataclasses.replace(batch, forest=dataclasses.replace(batch.forest, prompt=np.array([0] * 5 + [1] * 4)))
    before = compute_advantages(batch.forest, "grpo")
    assert before[1] > 0 and mixed_anchor_ratio(batch.forest) == 1.0
    pruned = batch.without_env_failures()
    f = pruned.forest
    adv = compute_advantages(f, "grpo")
    assert np.allclose(adv[f.prompt == 0], 0.0) and np.sign(adv[f.leaves[f.prompt[f.leaves] == 1]]).tolist() == [1, -1]
    assert pruned.kept.tolist() == [1]
    roots, m, s = root_outcomes(f)
    assert m.tolist() == [3, 2] and s.tolist() == [3, 1]  # the predictor's root targets: healthy rollouts only
    healthy = _faulty_batch(parent, reward, [])
    assert healthy.without_env_failures() is healthy  # nothing failed: the batch itself


def test_recorded_logprobs_are_those_of_the_sampling_temperature(tiny_dir):
    """HF back end at T = 0.7: its records equal the trainer's forward at T = 0.7 on the same tokens
    (engine -> training batch -> ``logprobs(temperature=...)``), and differ from T = 1's."""
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    cfg = RolloutConfig(policy="uniform_tree", roots=4, continuations_per_root=1, group_size=2, temperature=0.7,
                        limits=LIMITS, seed=5)
    batch = RolloutEngine(backend, GuessNumberEnv, cfg).rollout(make_rows(2, high=6, max_guesses=3, seed=1))
    adv = compute_advantages(batch.forest, "trace")
    for packing in LAYOUTS:
        seqs = build_training_batch(batch, adv, packing=packing, pad_token_id=backend.pad_id, token_budget=4096)
        mask = seqs.loss_mask > 0
        with torch.no_grad():
            at_t = seqs.logprobs(backend.model, temperature=0.7, chunk_tokens=7)
            at_1 = seqs.logprobs(backend.model, temperature=1.0)
        torch.testing.assert_close(at_t[mask], seqs.old_logprobs[mask], rtol=0, atol=1e-4)
        assert (at_1[mask] - seqs.old_logprobs[mask]).abs().max() > 1e-2


def test_the_trainer_refuses_top_p_and_greedy_rollouts():
    from trace_train.configs import TrainConfig

    with pytest.raises(ValueError, match="`rollout.top_p` = 0.9 is not supported by the trainer"):
        TrainConfig(rollout=RolloutConfig(top_p=0.9))
    with pytest.raises(ValueError, match="greedy decoding"):
        TrainConfig(rollout=RolloutConfig(temperature=0.0))


def test_a_backend_without_sleep_mode_is_left_awake_during_the_update(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    with generator_asleep(backend):
        pass
    assert all(torch.equal(v, backend.model.state_dict()[k]) for k, v in before.items())


@pytest.mark.slow
def test_vllm_records_the_processed_logprobs_and_sleeps_only_where_supported(tiny_dir, block_size):
    """vLLM (``logprobs_mode="processed_logprobs"``) at T = 0.7 agrees with the trainer's forward; with
    ``sleep_mode=True`` on a CPU (no sleep mode there) the engine does not sleep and keeps generating."""
    from transformers import AutoModelForCausalLM

    from trace_train.backends.vllm_backend import VLLMBackend
    from trace_train.update.sequences import token_logprobs

    backend = VLLMBackend(tiny_dir, dtype="float32", enforce_eager=True, block_size=block_size,
                          kv_cache_memory_bytes=64 * 2**20, max_model_len=1024, seed=0, sleep_mode=True)
    from vllm.platforms import current_platform

    assert backend.sleeps == current_platform.is_sleep_mode_available()
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    prompt = tuple(backend.tokenizer.encode("Guess a number between 1 and 6."))
    with generator_asleep(backend):
        pass  # the update would run here
    [samples] = backend.generate([GenerationRequest(prompt, n=3, seed=11)], Sampling(temperature=0.7, max_new_tokens=8))
    for c in samples:
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logp = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.7)[0, len(prompt):]
            raw = token_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)[0, len(prompt):]
        np.testing.assert_allclose(c.logprobs, logp.numpy(), rtol=0, atol=2e-3)
        assert np.abs(np.asarray(c.logprobs) - raw.numpy()).max() > 1e-2


def _seq_mean_losses(batch, adv):
    """(ours, flat GRPO on root-to-leaf paths) under seq_mean_token_mean, with logp = 0.9 x old logp."""
    from trace_train.update.loss import PolicyLossConfig, policy_loss
    from trace_train.update.sequences import build_sequences

    cfg = PolicyLossConfig(aggregation="seq_mean_token_mean")
    seqs = build_sequences(batch, adv, pad_token_id=0, shared_turn_weight="leaves")
    old = seqs.old_logprobs.double()
    ours, _ = policy_loss(0.9 * old, old, seqs.advantages.double(), seqs.loss_mask.double(), cfg,
                          token_weights=seqs.weights.double())
    rows = [batch.trajectory(int(leaf)) for leaf in batch.forest.leaves]
    width = max(len(r.token_ids) for r in rows)
    old, a, mask = (torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(3))
    for i, traj in enumerate(rows):
        n = len(traj.token_ids)
        old[i, :n] = torch.from_numpy(traj.logprobs.astype(np.float32).astype(np.float64))
        a[i, :n] = torch.from_numpy(adv[traj.node].astype(np.float32).astype(np.float64))
        mask[i, :n] = torch.from_numpy(traj.loss_mask.astype(np.float64))
    flat, _ = policy_loss(0.9 * old, old, a, mask, cfg)
    return float(ours), float(flat)


def test_seq_mean_token_mean_is_grpo_on_flat_groups_and_documented_otherwise(tiny_dir, tree_batch):
    """As loss.py documents: flat groups (GRPO) give the original GRPO loss exactly; branched trees do not
    give flat GRPO on the paths (a continuation's sequence holds only its own turns)."""
    from trace_train.backends.hf_backend import HFBackend

    backend = HFBackend.from_pretrained(tiny_dir)
    cfg = RolloutConfig(policy="grpo", roots=8, group_size=4, limits=LIMITS, seed=2)
    flat_batch = RolloutEngine(backend, GuessNumberEnv, cfg).rollout(make_rows(4, high=6, max_guesses=3, seed=1))
    ours, flat = _seq_mean_losses(flat_batch, compute_advantages(flat_batch.forest, "grpo"))
    assert ours == pytest.approx(flat, rel=1e-9) and flat != 0.0
    _, branched = tree_batch
    ours, flat = _seq_mean_losses(branched, compute_advantages(branched.forest, "grpo"))
    assert ours != pytest.approx(flat, rel=1e-3)
