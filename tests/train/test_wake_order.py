"""The update frees its gradients before the generator wakes: vLLM's wake-up takes back its KV cache and
weights (``backend.gpu_memory_utilization`` of the GPU), and gradients still held then (4 P / W bytes: 3.8
GiB per GPU for Qwen3-8B on 8 GPUs) were the one allocation that ``bench.memory_plan`` did not count."""

import contextlib

from trace_train import train
from trace_train.config_loader import load_config
from trace_train.train import TrainConfig, main

SMALL = ["steps=2", "device=cpu", "tensorboard=false", "checkpoint_every=10", "eval.every=0", "quiet=true",
         "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "model.tiny_warm_steps=20"]


def test_no_gradient_is_held_when_the_generator_wakes(tmp_path, monkeypatch):
    """A spy around the trainer's ``generator_asleep`` (the block vLLM sleeps through) reads the policy's
    gradients as the block ends, where vLLM's ``wake_up`` runs: none is held (before issue 51 every
    parameter's was, until after the wake-up)."""
    asleep = train.generator_asleep
    held_at_wake = []
    policies = []
    build_run = train.build_run

    def spy_build(cfg):
        run = build_run(cfg)
        policies.append(run.policy)
        return run

    @contextlib.contextmanager
    def spy(backend):
        with asleep(backend):
            yield
            held_at_wake.append(sum(p.grad is not None for p in policies[-1].parameters()))

    monkeypatch.setattr(train, "generator_asleep", spy)
    monkeypatch.setattr(train, "build_run", spy_build)
    main(load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path / 'run'}", *SMALL]))
    assert held_at_wake == [0, 0]
