"""The per-GPU memory plan of the presets (``trace_train.bench.memory_plan``), activation checkpointing,
the settings that make the presets fit, and the refusal of float16 without loss scaling."""

import pytest
import torch

from trace_train.bench.memory_plan import (GPUS, MODELS, measure_layer_activations, model_config, parameter_sizes,
                                           plan)
from trace_train.config_loader import load_config
from trace_train.configs import TrainConfig


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_parameter_count_is_the_models(name):
    """The formula counts every parameter of the model transformers builds from the config (on the meta
    device: no memory), the untied output layer included; the largest tensor is the embedding."""
    from transformers import AutoModelForCausalLM

    config = model_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    unique = {id(p): p.numel() for p in model.parameters()}
    sizes = parameter_sizes(config)
    assert sizes.total == sum(unique.values())
    assert sizes.layer == sum(p.numel() for p in model.model.layers[0].parameters())
    assert sizes.largest == max(unique.values())


def test_a_layers_saved_activations_are_per_token():
    """At Qwen3's shapes scaled down (same head dim, GQA ratio, MLP ratio) the bytes a layer saves for its
    backward are the same per token at 64 and 128 tokens (no T x T term), and at least the MLP's four
    intermediate tensors (gate, up, activation, product: 4 x I x 2 bytes per token in bf16)."""
    config = model_config("Qwen/Qwen3-0.6B")
    config.hidden_size, config.intermediate_size = 256, 768
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    measured = measure_layer_activations(config)
    a, b = measured["by_length"].values()
    assert a == b == measured["bytes_per_token"]
    assert measured["bytes_per_token"] >= 4 * 768 * 2


def _math_plan(*overrides, gpu="h200", **kwargs):
    cfg = load_config(TrainConfig, "math_qwen3_8b", list(overrides))
    return plan(cfg, world=8, gpu_bytes=GPUS[gpu], layer_bytes_per_token=210.8 * 1024, **kwargs)


def test_the_math_preset_fits_an_h200_only_with_checkpointing_and_vllm_asleep():
    """With the preset's settings (activation checkpointing, vLLM asleep in the update on CUDA) the peak is
    within 141 GB; without checkpointing the 32,768-token micro-batch alone needs 36 x 210.8 KiB per token."""
    ok = _math_plan()
    assert ok["checkpointing"] and ok["sleeps"] and ok["fits"]
    assert not _math_plan(checkpointing=False)["fits"]
    awake = _math_plan(sleeps=False)
    assert awake["update_peak"] - ok["update_peak"] == pytest.approx(0.5 * GPUS["h200"])
    rows = ok["rows"]
    p = ok["parameters"]
    assert rows["optimizer (AdamW, fp32)"] == 8 * p / 8 and rows["reference (bf16 shards)"] == 2 * p / 8


def test_the_gpu_presets_turn_on_what_they_need():
    for name in ("math_qwen3_8b", "qa_qwen3_14b", "bfcl_qwen3_8b"):
        cfg = load_config(TrainConfig, name)
        assert cfg.model.activation_checkpointing and cfg.backend.sleeps_on(cfg.device)
        assert cfg.algorithm.pack_tokens is not None
    cpu = load_config(TrainConfig, "cpu_demo")
    assert not cpu.model.activation_checkpointing and not cpu.backend.sleeps_on(cpu.device)
    assert load_config(TrainConfig, "cpu_demo", ["backend.sleep_during_update=true"]).backend.sleeps_on("cpu")
    assert not load_config(TrainConfig, "math_qwen3_8b", ["backend.sleep_during_update=false"]).backend.sleeps_on("cuda")


def test_float16_without_loss_scaling_is_refused():
    with pytest.raises(ValueError, match="float16 needs loss scaling"):
        load_config(TrainConfig, "cpu_demo", ["model.dtype=float16"])


def test_activation_checkpointing_gives_the_same_gradients():
    """The trainer's checkpointing (``_checkpoint_activations``: transformers' non-reentrant gradient
    checkpointing) recomputes each layer in the backward: the loss and every gradient are those of the
    ordinary forward, and the layers are checkpointed in training mode only."""
    from trace_train.tiny import build_model, build_tokenizer
    from trace_train.run.policy import checkpoint_activations as _checkpoint_activations

    tokenizer = build_tokenizer()
    ids = torch.randint(2, 100, (2, 24), generator=torch.Generator().manual_seed(0))

    def grads(checkpointed: bool):
        model = build_model(tokenizer, seed=3)
        if checkpointed:
            _checkpoint_activations(model)
            assert model.is_gradient_checkpointing and model.config.use_cache is False
        model.train()
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        loss = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        return float(loss.detach()), {k: p.grad.clone() for k, p in model.named_parameters()}

    (plain_loss, plain), (ckpt_loss, ckpt) = grads(False), grads(True)
    assert ckpt_loss == plain_loss
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7)


def test_the_plan_counts_the_reference_root_the_wake_order_transients_and_cuda_pools():
    """The rows issue 51 found missing: the reference's root left gathered (``reshards_reference=False``:
    P_root x 2 bytes, what ``tests/run/test_reference_root.py`` measures FSDP2 holding), gradients still
    held when vLLM wakes (4 P / W), one layer's backward transients, the CUDA context and vLLM's graph pool."""
    ok = _math_plan()
    rows, p = ok["rows"], ok["parameters"]
    root = parameter_sizes(model_config("Qwen/Qwen3-8B")).root
    assert rows["reference root left gathered"] == 0.0 and rows["gradients when vLLM wakes"] == 0.0
    assert rows["one layer's backward transients"] == 210.8 * 1024 * ok["micro_batch_tokens"]
    assert rows["CUDA context"] > 0 and rows["vLLM's CUDA graph pool"] > 0  # the preset captures CUDA graphs
    unfixed = _math_plan(reshards_reference=False, grads_freed_before_wake=False)
    assert unfixed["rows"]["reference root left gathered"] == 2 * root
    assert unfixed["update_peak"] - ok["update_peak"] == pytest.approx(2 * root)
    assert unfixed["generate_peak"] - ok["generate_peak"] == pytest.approx(4 * p / 8)


@pytest.mark.parametrize("name,gpu", [("math_qwen3_8b", "h200"), ("qa_qwen3_14b", "h200"), ("bfcl_qwen3_8b", "h200"),
                                      ("math_qwen3_8b", "h100"), ("qa_qwen3_14b", "h100"), ("bfcl_qwen3_8b", "h100")])
def test_every_gpu_preset_leaves_a_safe_margin_on_the_gpus_its_header_names(name, gpu):
    """At least SAFE_MARGIN of the GPU free at the larger peak, with every row counted, and the margin its
    YAML header states (GiB, to the tenth)."""
    from trace_train.bench.memory_plan import GIB
    from trace_train.config_loader import PRESET_DIR

    cfg = load_config(TrainConfig, name)
    result = plan(cfg, world=8, gpu_bytes=GPUS[gpu], layer_bytes_per_token=LAYER_BYTES[cfg.model.name_or_path])
    assert result["safe"], result["margin"] / GIB
    header = (PRESET_DIR / f"{name}.yaml").read_text().split("run_dir:")[0]
    assert f"{result['margin'] / GIB:.1f} GiB free on {gpu.upper()}" in header, header


LAYER_BYTES = {"Qwen/Qwen3-8B": 210.8 * 1024, "Qwen/Qwen3-14B": 276.85 * 1024}
"""A decoder layer's saved activations per token in bf16, as ``measure_layer_activations`` gives them."""
