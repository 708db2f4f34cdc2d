"""Per-GPU memory of a preset under torchrun, by arithmetic from the model's config (no GPU, no download).

    python -m trace_train.bench.memory_plan math_qwen3_8b qa_qwen3_14b        # 8 x H200, the presets' hardware
    python -m trace_train.bench.memory_plan math_qwen3_8b --gpu h100 --no-activation-checkpointing

The model's config is built locally from its published sizes (:data:`MODELS`: Qwen3-8B, 14B and 0.6B); the
one number not read from a config, a decoder layer's activations per token, is **measured**: one decoder
layer at the model's real widths is built on the CPU in the compute dtype, a sequence of T tokens goes
through it with autograd recording, and every tensor autograd saves for the backward is counted once (by
storage; the layer's weights left out), at T = 64 and 128. The two agree to the byte, so the size is per
token (the attention saves its output and log-sum-exp, not a T x T matrix); the CPU's kernels save what
CUDA's do for the MLP and norms, which are most of it (FlashAttention on CUDA saves the same two tensors).

The rows, per GPU, with P parameters, W ranks (FSDP2 shards everything but activations over them), L layers,
hidden size H, a micro-batch of T tokens and a the measured bytes per token of one layer:

* weights: fp32 master shards, 4 P / W;  gradients: fp32 shards, 4 P / W (freed after the step);
* optimizer: AdamW's two fp32 moments, 8 P / W;  reference (``kl_coef > 0``): bf16 shards, 2 P / W;
* FSDP gathers: the unsharded bf16 parameters FSDP2 holds while computing: the root module's (embeddings,
  output layer, final norm) and two decoder layers' (one computing, one prefetched), and in the backward
  their unsharded gradients (bf16, then fp32 for the reduce-scatter): 2 (P_root + 2 P_layer) + 6 (P_root +
  P_layer) bytes;
* activations at T tokens: without checkpointing L a T; with it (``model.activation_checkpointing``) each
  layer keeps only its input, L H 2 T, plus one layer's a T while it is recomputed; plus the chunked output
  layer, C V 6 bytes (``trace_train.update.logprobs``, C = ``algorithm.logprob_chunk_tokens``);
* vLLM: ``gpu_memory_utilization`` x the GPU's memory while it generates; during the update 0 when it
  sleeps (``backend.sleep_during_update``, level 1: weights to the CPU, KV cache freed; its CUDA context and
  graph pool stay, rows of their own), its whole share when awake;
* the sync's peak: the weights stream into vLLM one parameter at a time (``run.distributed.iter_full_tensors``),
  so beyond vLLM's share it holds one full parameter in bf16 (the largest: the embedding, V H 2 bytes), and
  vLLM's in-place reload materialises the layer being loaded beside its own tensors before copying it in
  (``vllm/model_executor/model_loader/reload/layerwise.py``): one more copy of the largest layer.

* one layer's backward transients: the gradients of the tensors the layer being back-propagated saved,
  at most its a T again;
* the reference's root: FSDP2 leaves a root module gathered after its forward (it expects a backward); the
  trainer reshards the frozen reference after each forward (``run.distributed.reshard_after_forward``), so
  the row is 0 (``reshards_reference=False``: s P_root, what ``tests/run/test_reference_root.py`` measures
  on 2 ranks);
* gradients when vLLM wakes: the trainer frees them inside the block vLLM sleeps through (``train``), so 0
  (``grads_freed_before_wake=False``: 4 P / W, held beside vLLM's whole share);
* the CUDA context (:data:`CUDA_CONTEXT_BYTES`) and vLLM's CUDA graph pool (:data:`CUDA_GRAPH_POOL_BYTES`,
  without ``enforce_eager``; sleep does not free it), in both phases.

Two phases peak: **update** = weights + gradients + optimizer + reference + gathers + activations +
transients + the reference's root + the CUDA context and graph pool (+ vLLM if awake); **generate and
sync** = weights + optimizer + reference + vLLM's share + the sync's largest parameter + gradients at the
wake-up + the CUDA context and graph pool. "Fits" compares the larger with the GPU's memory; the margin is
what is left, "safe" when at least :data:`SAFE_MARGIN` of the GPU (the caching allocator's fragmentation is
not counted). The KV line says how many tokens vLLM's share holds after its bf16 weights: the most tokens of
rollouts it can keep in flight at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

GIB = 2**30

MODELS = {
    "Qwen/Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "Qwen/Qwen3-14B": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                           num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "Qwen/Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
}
"""Published sizes (each model's ``config.json`` on the Hub), so no download is needed."""

GPUS = {"h200": 143771 * 2**20, "h100": 81559 * 2**20}
"""Memory of one GPU as ``nvidia-smi`` reports it (MiB): H200 141 GB (140.4 GiB), H100 80 GB (79.6 GiB)."""

_DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

CUDA_CONTEXT_BYTES = 1 * GIB
"""One process's CUDA context with NCCL's buffers (the trainer and its in-process vLLM engine share it):
about 0.5-1 GiB on H100/H200; counted at 1 GiB in both phases."""
CUDA_GRAPH_POOL_BYTES = 1 * GIB
"""vLLM's CUDA graph memory pool when ``backend.enforce_eager`` is false (its start-up log reports a few
hundred MB to about 1 GiB for an 8B model); sleep level 1 frees weights and KV cache, not this pool."""
SAFE_MARGIN = 0.10
"""Share of the GPU a plan must leave free to count as safe: what the rows leave out (the caching
allocator's fragmentation, NCCL's growth, the variance of a layer's transients)."""


def model_config(name: str):
    """A ``transformers.Qwen3Config`` of the published sizes of ``name`` (a key of :data:`MODELS`)."""
    from transformers import Qwen3Config

    if name not in MODELS:
        raise ValueError(f"no sizes for {name!r}; known: {', '.join(MODELS)}")
    return Qwen3Config(**MODELS[name])


@dataclass(frozen=True)
class Sizes:
    """Parameter counts of a decoder-only model: all, one decoder layer, the root module's (the rest)."""

    total: int
    layer: int
    root: int
    largest: int
    """The largest single tensor (the embedding): what the streamed sync holds at its peak."""


def parameter_sizes(config) -> Sizes:
    """Parameters of a Qwen3-style model from its config: per layer q, k, v, o projections (with q/k norms),
    the gated MLP's three matrices and two norms; the embedding, final norm and (untied) output layer."""
    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    layer = h * q + 2 * h * kv + q * h + 2 * hd + 3 * h * i + 2 * h
    embed = config.vocab_size * h
    root = embed * (1 if config.tie_word_embeddings else 2) + h
    return Sizes(total=config.num_hidden_layers * layer + root, layer=layer, root=root, largest=embed)


def measure_layer_activations(config, dtype: str = "bfloat16", tokens: tuple[int, ...] = (64, 128),
                              device: str = "cpu") -> dict:
    """Bytes per token one decoder layer saves for its backward, measured at each of ``tokens`` (see the
    module docstring): {"bytes_per_token": ..., "by_length": {T: bytes / T}}. On CUDA (``device="cuda"``)
    also ``allocated_by_length``: what the allocator holds after the forward beyond its input and weights,
    per token (the saved tensors plus the layer's output), a reading that needs no hook."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    layer = Qwen3DecoderLayer(config, 0).to(device=device, dtype=getattr(torch, dtype))
    rope = Qwen3RotaryEmbedding(config).to(device)
    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    by_length, allocated = {}, {}
    for t in tokens:
        saved: dict[int, int] = {}

        def pack(x):
            storage = x.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
            return x

        x = torch.randn(1, t, config.hidden_size, dtype=getattr(torch, dtype), device=device, requires_grad=True)
        position = torch.arange(t, device=device)[None]
        if device == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            out = layer(x, attention_mask=None, position_ids=position, position_embeddings=rope(x, position))
        if device == "cuda":
            torch.cuda.synchronize()
            allocated[t] = (torch.cuda.memory_allocated() - before) / t
        by_length[t] = sum(saved.values()) / t
        del out, x
    result = {"bytes_per_token": max(by_length.values()), "by_length": by_length, "device": device}
    if allocated:
        result["allocated_by_length"] = allocated
    return result


def plan(cfg, *, world: int, gpu_bytes: int, layer_bytes_per_token: float, checkpointing: bool | None = None,
         sleeps: bool | None = None, reshards_reference: bool = True, grads_freed_before_wake: bool = True) -> dict:
    """The per-GPU memory rows of a ``TrainConfig`` (see the module docstring), in bytes."""
    config = model_config(cfg.model.name_or_path)
    sizes = parameter_sizes(config)
    s = _DTYPE_BYTES[cfg.model.dtype]
    p, w = sizes.total, world
    checkpointing = cfg.model.activation_checkpointing if checkpointing is None else checkpointing
    sleeps = cfg.backend.sleeps_on(cfg.device) if sleeps is None else sleeps
    tokens = cfg.algorithm.pack_tokens or cfg.optim.micro_batch_size * cfg.rollout.limits.max_context_tokens
    if cfg.algorithm.packing == "leaf":  # rows of one path each: a row longer than the budget goes alone
        tokens = max(min(tokens, cfg.optim.micro_batch_size * cfg.rollout.limits.max_context_tokens),
                     cfg.rollout.limits.max_context_tokens)
    layers = config.num_hidden_layers
    if checkpointing:
        decoder = layers * config.hidden_size * s * tokens + layer_bytes_per_token * tokens
    else:
        decoder = layers * layer_bytes_per_token * tokens
    head = min(cfg.algorithm.logprob_chunk_tokens or tokens, tokens) * config.vocab_size * (s + 4)
    vllm = (cfg.backend.gpu_memory_utilization or 0.9) * gpu_bytes
    graphs = 0.0 if cfg.backend.enforce_eager else CUDA_GRAPH_POOL_BYTES
    rows = {
        "weights (fp32 shards)": 4 * p / w,
        "gradients (fp32 shards)": 4 * p / w,
        "optimizer (AdamW, fp32)": 8 * p / w,
        "reference (bf16 shards)": s * p / w if cfg.algorithm.loss.kl_coef > 0 else 0.0,
        "FSDP gathers": s * (sizes.root + 2 * sizes.layer) + (s + 4) * (sizes.root + sizes.layer),
        f"activations ({tokens} tokens{', checkpointed' if checkpointing else ''})": decoder + head,
        "one layer's backward transients": layer_bytes_per_token * tokens,
        "reference root left gathered": 0.0 if reshards_reference or not cfg.algorithm.loss.kl_coef > 0
        else s * sizes.root,
        "vLLM during the update": 0.0 if sleeps else vllm,
        "CUDA context": CUDA_CONTEXT_BYTES,
        "vLLM's CUDA graph pool": graphs,
        "vLLM while generating": vllm,
        "sync's largest parameter, twice (bf16)": s * (sizes.largest + max(sizes.largest, sizes.layer)),
        "gradients when vLLM wakes": 0.0 if grads_freed_before_wake else 4 * p / w,
    }
    update_rows = ("weights (fp32 shards)", "gradients (fp32 shards)", "optimizer (AdamW, fp32)",
                   "reference (bf16 shards)", "FSDP gathers", next(k for k in rows if k.startswith("activations")),
                   "one layer's backward transients", "reference root left gathered", "vLLM during the update",
                   "CUDA context", "vLLM's CUDA graph pool")
    generate_rows = ("weights (fp32 shards)", "optimizer (AdamW, fp32)", "reference (bf16 shards)",
                     "vLLM while generating", "sync's largest parameter, twice (bf16)", "gradients when vLLM wakes",
                     "CUDA context", "vLLM's CUDA graph pool")
    update = sum(rows[k] for k in update_rows)
    generate = sum(rows[k] for k in generate_rows)
    kv_per_token = 2 * layers * config.num_key_value_heads * config.head_dim * s
    return {"model": cfg.model.name_or_path, "parameters": p, "world": w, "gpu_bytes": gpu_bytes,
            "micro_batch_tokens": tokens, "checkpointing": bool(checkpointing), "sleeps": bool(sleeps),
            "layer_bytes_per_token": layer_bytes_per_token, "rows": rows, "update_peak": update,
            "generate_peak": generate, "peak": max(update, generate), "fits": max(update, generate) <= gpu_bytes,
            "margin": gpu_bytes - max(update, generate),
            "safe": gpu_bytes - max(update, generate) >= SAFE_MARGIN * gpu_bytes,
            "kv_cache_tokens": int(max(vllm - s * p, 0) // kv_per_token)}


def table(name: str, result: dict, gpu: str) -> str:
    """A Markdown table of :func:`plan`'s rows in GiB."""
    lines = [f"{name}: {result['model']} ({result['parameters'] / 1e9:.2f} B parameters) on {result['world']} x "
             f"{gpu.upper()} ({result['gpu_bytes'] / GIB:.1f} GiB each); decoder layer "
             f"{result['layer_bytes_per_token'] / 1024:.1f} KiB/token (measured)", "",
             "| per GPU | GiB |", "|---|---:|"]
    lines += [f"| {k} | {v / GIB:.1f} |" for k, v in result["rows"].items()]
    lines += [f"| **update peak** | **{result['update_peak'] / GIB:.1f}** |",
              f"| **generate + sync peak** | **{result['generate_peak'] / GIB:.1f}** |",
              f"| fits | {'yes' if result['fits'] else 'NO'} |",
              f"| margin | {result['margin'] / GIB:.1f} GiB ({result['margin'] / result['gpu_bytes']:.0%}; "
              f"{'safe' if result['safe'] else 'NOT safe'}: at least {SAFE_MARGIN:.0%} free) |",
              f"| vLLM's KV cache | {result['kv_cache_tokens']:,} tokens |"]
    return "\n".join(lines)


def main(argv=None) -> int:
    from trace_train.config_loader import load_config
    from trace_train.configs import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="+", help="presets or YAML files")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    parser.add_argument("--gpus", type=int, default=8, help="ranks (one GPU each)")
    parser.add_argument("--no-activation-checkpointing", action="store_true")
    parser.add_argument("--awake", action="store_true", help="vLLM stays awake during the update")
    parser.add_argument("--json", action="store_true", help="one JSON line per preset instead of tables")
    parser.add_argument("--device", default="cpu", help="where the decoder layer is measured (cuda on a GPU node)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 128], help="sequence lengths measured")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    measured: dict[str, dict] = {}
    for name in args.presets:
        cfg = load_config(TrainConfig, name)
        model = cfg.model.name_or_path
        if model not in measured:
            measured[model] = measure_layer_activations(model_config(model), cfg.model.dtype,
                                                        tuple(args.tokens), args.device)
        result = plan(cfg, world=args.gpus, gpu_bytes=GPUS[args.gpu],
                      layer_bytes_per_token=measured[model]["bytes_per_token"],
                      checkpointing=False if args.no_activation_checkpointing else None,
                      sleeps=False if args.awake else None)
        if args.json:
            print(json.dumps({"preset": name, "gpu": args.gpu, **result,
                              "measured_by_length": measured[model]["by_length"], "measured_on": args.device,
                              "allocated_by_length": measured[model].get("allocated_by_length")},
                             default=float))
        else:
            print(table(name, result, args.gpu) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
