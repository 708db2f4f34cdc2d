"""Generation back ends behind one protocol (:mod:`.base`): vLLM and plain transformers.

The back-end modules import torch, transformers or vLLM; importing this package does not.
"""
from .base import Completion, GenerationBackend, GenerationRequest, GenerationStats, Sampling  # noqa: F401
