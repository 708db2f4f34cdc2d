"""The training loop: learning end to end, exact resume, safe stops, clear errors, two processes."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from trace_train.run.checkpoint import latest_checkpoint, load_checkpoint
from trace_train.config_loader import load_config
from trace_train.run.metrics_log import read_metrics
from trace_train.train import NonFiniteLossError, PromptSampler, TrainConfig, main

SMALL = [
    "steps=4", "device=cpu", "tensorboard=false", "checkpoint_every=2", "eval.every=0",
    "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "model.tiny_warm_steps=20",
    "task.rows={low: 1, high: 6, max_guesses: 3, shift: 0}",  # one game, nothing held out (eval.every=0)
]


def small_config(run_dir, *extra):
    return load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", *SMALL, *extra])


def _trainable_metrics(rows):
    timings = ("time", "generator_idle_share", "samples_in_flight", "generation_polls")  # scheduling, not training
    return [{k: v for k, v in r.items() if not k.endswith("seconds") and k not in timings} for r in rows]


def test_prompt_sampler_is_resumable_and_shards_by_rank():
    rows = list(range(10))
    a = PromptSampler(rows, 3, seed=1)
    first = [a.next_pool() for _ in range(5)]
    b = PromptSampler(rows, 3, seed=1)
    b.next_pool(), b.next_pool()
    c = PromptSampler(rows, 3, seed=1)
    c.load_state(b.state())
    assert [c.next_pool() for _ in range(3)] == first[2:]
    assert sorted(sum(first[:3], [])) == sorted(set(sum(first[:3], [])))  # no repeats within an epoch
    r0, r1 = PromptSampler(rows, 2, seed=1, rank=0, world_size=2), PromptSampler(rows, 2, seed=1, rank=1, world_size=2)
    p0, p1 = r0.next_pool(), r1.next_pool()
    assert not set(p0) & set(p1) and len(p0) == len(p1) == 2
    with pytest.raises(ValueError, match=r"the training set has 10 rows; a step needs 12"):
        PromptSampler(rows, 6, seed=0, world_size=2)


def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path):
    straight = main(small_config(tmp_path / "straight"))
    main(small_config(tmp_path / "resumed", "steps=2"))
    resumed = main(small_config(tmp_path / "resumed"))  # picks up the checkpoint of step 2
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "hf").state_dict()
    a = _same_run(tmp_path / "straight", tmp_path / "resumed")
    for name, tensor in a.policy.items():
        assert torch.equal(tensor, exported[name]), name  # hf/ holds the final policy
    assert straight["reward_mean"] == resumed["reward_mean"]


def _same_run(straight, resumed):
    """Assert two run directories hold the same run: metrics, final weights, optimizer moments, predictor."""
    assert _trainable_metrics(read_metrics(resumed / "metrics.jsonl")) == _trainable_metrics(
        read_metrics(straight / "metrics.jsonl"))
    a = load_checkpoint(latest_checkpoint(straight), restore_random_state=False)
    b = load_checkpoint(latest_checkpoint(resumed), restore_random_state=False)
    assert a.step == b.step == 4
    for name, tensor in a.policy.items():
        assert torch.equal(tensor, b.policy[name]), name
    moments_a, moments_b = _tensors(a.optimizer["state"]), _tensors(b.optimizer["state"])
    assert moments_a.keys() == moments_b.keys() and len(moments_a) > 0
    for name, tensor in moments_a.items():  # the whole model's moments: every rank's shard
        assert torch.equal(tensor, moments_b[name]), name
    assert np.array_equal(a.extra["predictor"]["weights"], b.extra["predictor"]["weights"])
    return a


def test_a_changed_config_does_not_resume(tmp_path):
    main(small_config(tmp_path, "steps=2"))
    with pytest.raises(ValueError, match=r"holds another run \(its config.yaml differs in optim.weight_decay\)"):
        main(small_config(tmp_path, "steps=2", "optim.weight_decay=0.5"))


def test_non_finite_loss_stops_with_a_checkpoint(tmp_path):
    # An absurd learning rate blows the weights up after the first update.
    cfg = small_config(tmp_path, "optim.lr=1e12", "optim.grad_clip=0", "algorithm.loss.kl_coef=0")
    with pytest.raises(NonFiniteLossError, match=r"stopped with a checkpoint of step \d+ at"):
        main(cfg)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None
    assert all(torch.isfinite(t).all() for t in load_checkpoint(ckpt, restore_random_state=False).policy.values())


def test_kl_to_the_reference_is_measured_and_penalised(tmp_path):
    main(small_config(tmp_path, "steps=2", "algorithm.loss.kl_coef=0.1", "optim.lr=0.01"))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert rows[1]["kl"] > 0.0


def test_bad_configuration_fails_in_one_line_before_any_model_is_loaded(tmp_path):
    run_dir = tmp_path / "never"
    out = subprocess.run([sys.executable, "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={run_dir}",
                          "rollout.polcy=grpo"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "trace-train: unknown config key 'rollout.polcy'; did you mean 'rollout.policy'?"
    assert not run_dir.exists()
    out = subprocess.run([sys.executable, "-m", "trace_train.train", "--config", "cpu_demo", "rollout.policy=best"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown allocation policy 'best'" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_trace_run_raises_held_out_success(tmp_path, backend):
    """The CPU demo: with a fixed seed, held-out success rises clearly over a short TRACE run."""
    extra = ["backend.kind=vllm", "backend.kv_cache_memory_bytes=268435456", "backend.max_model_len=1024"] if backend == "vllm" else []
    out = subprocess.run([sys.executable, "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={tmp_path}",
                          "tensorboard=false", *extra], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    evals = [r["eval_success"] for r in rows if "eval_success" in r]
    n = 64 * 2  # held-out episodes per evaluation (eval.prompts x eval.samples)
    first, last = evals[0], np.mean(evals[-2:])  # the last two evaluations, 2n episodes
    se = np.sqrt(first * (1 - first) / n + last * (1 - last) / (2 * n))
    assert last - first > 2 * se, f"held-out success {evals}"
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False)
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny_model").state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in ckpt.policy.items())  # the parameters moved


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_with_gloo_and_fsdp(tmp_path):
    """torchrun, 2 CPU processes: one allocation over the global pool, FSDP, identical weights after."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={tmp_path}", *SMALL, "steps=2",
           "checkpoint_every=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # The ranks together spend the global budget M (1 + N) = 8 (1 + 1) rollouts, allocated over both pools.
    assert all(r["rollouts"] == 16 for r in rows)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False)
    assert ckpt.step == 2 and all(torch.isfinite(t).all() for t in ckpt.policy.values())


@pytest.mark.slow
def test_a_torchrun_resume_of_a_single_process_run_is_refused_in_one_line(tmp_path):
    """The README's order: ``trace-train --config cpu_demo``, then torchrun into the same run_dir. It used
    to die in FSDP's optimizer loading (``KeyError: 'state.0.step'``, a traceback per rank)."""
    single = subprocess.run([sys.executable, "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={tmp_path}",
                             *SMALL, "steps=1", "checkpoint_every=1", "--quiet"], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert single.returncode == 0, single.stderr[-2000:]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={tmp_path}", *SMALL, "steps=2", "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode != 0
    ours = [ln for ln in out.stderr.splitlines()  # (the longer run's "resuming with steps: 1 -> 2" aside)
            if ln.startswith("trace-train: ") and not ln.startswith("trace-train: resuming with")]
    assert ours and all("was written by 1 process and this run has 2: resume it without torchrun" in ln
                        for ln in ours), out.stderr[-3000:]
    assert "KeyError" not in out.stderr


def _torchrun(run_dir, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={_free_port()}",
           "-m", "trace_train.train", "--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "quiet=true", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]


def _tensors(tree, prefix=""):
    """Every tensor of a nested state dict, by a dotted path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _tensors(sub, f"{prefix}.{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _tensors(sub, f"{prefix}.{i}").items()}
    return {}


@pytest.mark.slow
def test_two_processes_stopped_and_continued_equal_an_uninterrupted_run(tmp_path):
    """FSDP over 2 gloo ranks: every rank's optimizer shard, random state and cost estimates are restored,
    and one predictor (fitted on every rank's targets) serves the job, so a resumed run is the same run."""
    _torchrun(tmp_path / "straight", "steps=4", "checkpoint_every=2")
    _torchrun(tmp_path / "resumed", "steps=2", "checkpoint_every=2")
    _torchrun(tmp_path / "resumed", "steps=4", "checkpoint_every=2")
    _same_run(tmp_path / "straight", tmp_path / "resumed")


def test_a_training_step_on_a_tool_environment(tmp_path):
    """Search QA on the bundled demo corpus: tool schemas, tool observations and verifier rewards flow
    through the whole loop (the tiny model's searches are mostly nonsense; the loop must not care)."""
    cfg = small_config(tmp_path, "steps=1", "task.name=search_qa", "task.train=demo", "task.eval_size=2",
                       "task.rows={}", "rollout.limits.max_turns=2", "rollout.limits.max_turn_tokens=16",
                       "rollout.limits.max_context_tokens=2048", "rollout.pool_size=4",
                       "max_length_cut_share=1")  # its nonsense often runs past 16 tokens: trained anyway
    metrics = main(cfg)
    assert np.isfinite(metrics["loss"]) and metrics["rollouts"] == 16
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["step"] == 1


def test_only_policies_that_read_the_predictor_fit_it(tmp_path):
    """GRPO never reads V~, so it does not pay for fitting it, unless its calibration is asked for."""
    trace = main(small_config(tmp_path / "trace", "steps=1"))
    grpo = main(small_config(tmp_path / "grpo", "steps=1", "rollout.policy=grpo"))
    logged = main(small_config(tmp_path / "logged", "steps=1", "rollout.policy=grpo", "log_predictor=true"))
    assert trace["predictor_examples"] > 0 and logged["predictor_examples"] > 0
    assert "predictor_examples" not in grpo and "predictor_brier" not in grpo
    untouched = load_checkpoint(latest_checkpoint(tmp_path / "grpo"), restore_random_state=False).extra["predictor"]
    fitted = load_checkpoint(latest_checkpoint(tmp_path / "logged"), restore_random_state=False).extra["predictor"]
    assert not np.any(untouched["weights"]) and np.any(fitted["weights"])


def test_main_reads_on_one_screen():
    import inspect

    from trace_train import train

    assert len(inspect.getsource(train.main).splitlines()) <= 40
